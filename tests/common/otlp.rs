//! A real OTLP/HTTP trace receiver for tests: `tests/py/otlp_receiver.py`, which decodes
//! what it receives with OpenTelemetry's own protobuf definitions (`opentelemetry-proto`)
//! and writes each span as a JSON line.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The receiver process, killed when dropped.
pub struct Receiver {
    child: Child,
    pub addr: SocketAddr,
    out: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

impl Receiver {
    /// Starts one on a free port; `stall`: it accepts and never answers.
    pub fn start(name: &str, stall: bool) -> Receiver {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/otlp_receiver.py");
        let out =
            std::env::temp_dir().join(format!("rolter-otlp-{}-{name}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&out);
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg("0").arg(&out);
        if stall {
            cmd.arg("--stall");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs tests/py/otlp_receiver.py (install python3)");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let port: u16 = line
            .strip_prefix("listening ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!(
                    "the OTLP receiver did not start (said {line:?}); run the README's test \
                     command, which installs opentelemetry-proto"
                )
            });
        Receiver {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            out,
        }
    }

    /// The `[tracing]` section sending to this receiver, with `extra` lines.
    pub fn section(&self, extra: &str) -> String {
        format!(
            "[tracing]\nendpoint = \"http://{}/v1/traces\"\nflush_interval = \"50ms\"\nbatch = 16\n{extra}\n",
            self.addr
        )
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// The spans of trace `trace_id`, once `n` have arrived (or 10 s passed).
    pub fn trace(&self, trace_id: &str, n: usize) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let got: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["trace_id"] == trace_id)
                .collect();
            if got.len() >= n || Instant::now() > until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
