//! Running an official SDK's check script (tests/sdk/*.py) against a gateway: the script's
//! exit code and what it printed, with a bound on how long it may take.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `python3 tests/sdk/<script> <args…>`; its exit code and its stdout and stderr.
/// Panics (naming `setup`) when python3 cannot run, or when the script runs over 60 s.
pub fn run_script(script: &str, args: &[&str], setup: &str) -> (Option<i32>, String) {
    let path = format!("{}/tests/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new("python3")
        .arg(&path)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {setup}"));
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{script} hung for 60 s\n--- stdout\n{}\n--- stderr\n{}",
                out.join().unwrap(),
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        out.join().unwrap(),
        err.join().unwrap()
    );
    (status.code(), text)
}
