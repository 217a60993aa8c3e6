//! Shared integration-test harness: start mock engines and a real gateway on loopback,
//! under either io driver, and talk to them with a blocking raw HTTP/1.1 client.
#![allow(dead_code)]

pub mod binary;
pub mod client;
pub mod otlp;
pub mod process;
pub mod scripted;
pub mod sdk;
pub mod seccomp;

use std::net::SocketAddr;
use std::time::Duration;

pub use client::*;
use rolter::config::{self, DriverChoice};
use rolter::Gateway;
use rolter_mock::{MockConfig, MockHandle};

/// The gateway drivers I/O tests run under: epoll always, io_uring where the kernel
/// allows it (containers often forbid it). `ROLTER_TEST_REQUIRE_URING=1` makes its absence a
/// failure instead.
pub fn drivers() -> Vec<DriverChoice> {
    if monoio::utils::detect_uring() {
        return vec![DriverChoice::IoUring, DriverChoice::Epoll];
    }
    assert!(
        std::env::var_os("ROLTER_TEST_REQUIRE_URING").is_none(),
        "io_uring is unavailable here but ROLTER_TEST_REQUIRE_URING is set"
    );
    eprintln!("warning: io_uring is unavailable here; I/O tests run under epoll only");
    vec![DriverChoice::Epoll]
}

pub fn driver_name(d: DriverChoice) -> &'static str {
    match d {
        DriverChoice::IoUring => "io_uring",
        DriverChoice::Epoll => "epoll",
        DriverChoice::Auto => "auto",
    }
}

/// Starts a mock engine serving `model` with settings adjusted by `f`.
pub fn mock(name: &str, f: impl FnOnce(&mut MockConfig)) -> MockHandle {
    let mut cfg = MockConfig {
        name: name.to_string(),
        models: vec!["m".to_string()],
        record_requests: true,
        ..MockConfig::default()
    };
    f(&mut cfg);
    rolter_mock::spawn(cfg).expect("spawn mock engine")
}

/// Short client-side limits so timeout tests finish quickly.
pub const TEST_LIMITS: &str = r#"
[server.limits]
head_timeout = "1s"
body_timeout = "1s"
keepalive_timeout = "5s"
write_timeout = "1s"
max_body_bytes = 1048576
"#;

/// Starts a gateway on 127.0.0.1:0 with one worker and `driver`, from a configuration whose
/// `[server]` section this function writes; `rest` holds targets, routes and extra tables.
pub fn gateway(driver: DriverChoice, rest: &str) -> Gateway {
    gateway_with(driver, 1, rest)
}

pub fn gateway_with(driver: DriverChoice, workers: usize, rest: &str) -> Gateway {
    gateway_with_server(driver, workers, "", rest)
}

/// As [`gateway_with`], with `server_extra` (TOML lines) added to the `[server]` table.
pub fn gateway_with_server(
    driver: DriverChoice,
    workers: usize,
    server_extra: &str,
    rest: &str,
) -> Gateway {
    // The access log stays out of the test output unless a test configures it.
    let log = if rest.contains("[log]") {
        ""
    } else {
        "[log]\naccess = \"off\"\n"
    };
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\npin_workers = false\ndriver = \"{}\"\nshutdown_grace = \"2s\"\n{server_extra}\n{TEST_LIMITS}\n{log}{rest}",
        driver_name(driver)
    );
    let cfg =
        config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("test config: {e}\n{text}"));
    Gateway::start(cfg).expect("start gateway")
}

/// A `[[targets]]` entry for a mock engine serving model "m".
pub fn target(name: &str, addr: SocketAddr, extra: &str) -> String {
    format!("[[targets]]\nname = \"{name}\"\nurl = \"http://{addr}\"\nmodels = [\"m\"]\n{extra}\n")
}

/// A gateway in front of the given mocks with one round-robin route and `route_extra`
/// (TOML lines for the route table, e.g. `retries = 0`).
pub fn gateway_for(driver: DriverChoice, mocks: &[&MockHandle], route_extra: &str) -> Gateway {
    let mut rest = String::new();
    let mut names = Vec::new();
    for (i, m) in mocks.iter().enumerate() {
        let name = format!("t{i}");
        rest.push_str(&target(
            &name,
            m.addr(),
            "[targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"2s\"\nidle = \"1s\"",
        ));
        names.push(format!("\"{name}\""));
    }
    // The route's strategy is round_robin unless `route_extra` names one.
    let strategy = if route_extra.contains("strategy") {
        ""
    } else {
        "strategy = \"round_robin\"\n"
    };
    rest.push_str(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [{}]\n{strategy}{route_extra}\n",
        names.join(", ")
    ));
    gateway(driver, &rest)
}

/// A chat completion body for model "m".
pub fn chat_body(stream: bool) -> String {
    format!(
        r#"{{"model":"m","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"Hello there"}}]}}"#
    )
}

pub const SHORT: Duration = Duration::from_secs(2);

/// The value of one series on the gateway's admin `/metrics`, written exactly as rendered
/// (name and labels, e.g. `rolter_kv_events_live{target="t0"}`); `None` when absent.
pub fn admin_series(g: &Gateway, series: &str) -> Option<f64> {
    call(
        g.admin_addr().expect("an admin listener"),
        &request("GET", "/metrics", &[], ""),
    )
    .text()
    .lines()
    .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
    .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// What the explain headers of a routed response say.
#[derive(Debug, Clone, PartialEq)]
pub struct Explained {
    pub target: String,
    /// `x-rolter-score`, when the strategy scored.
    pub score: Option<f64>,
    /// `x-rolter-fallback`, when the strategy fell back.
    pub fallback: Option<String>,
}

/// Sends a chat completion `body` through the gateway with `x-rolter-explain: 1`, asserts
/// a 200, and returns what the explain headers say.
pub fn explained(addr: SocketAddr, body: &str) -> Explained {
    let r = call(
        addr,
        &post("/v1/chat/completions", &[("x-rolter-explain", "1")], body),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    Explained {
        target: r
            .header("x-rolter-target")
            .expect("explain header")
            .to_string(),
        score: r.header("x-rolter-score").and_then(|s| s.parse().ok()),
        fallback: r.header("x-rolter-fallback").map(str::to_string),
    }
}

/// `promtool check metrics` on a `/metrics` page: `None` when promtool is not installed,
/// else what it said (empty when it found nothing wrong) and whether it exited 0.
pub fn promtool_check(page: &str) -> Option<(bool, String)> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

/// A loopback address where connections are refused, and stay refused for the test's
/// length: a privileged port nothing listens on. (A port taken from the ephemeral range and
/// freed can be handed to a mock of a test running beside, which would then answer.)
pub fn refused_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(1);
    loop {
        let port = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(port < 1024, "no refused privileged port left");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return addr,
            _ => continue,
        }
    }
}
