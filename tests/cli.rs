//! The `rolter` binary as a user runs it: `check` reports every configuration error and
//! exits non-zero before binding anything, `strategies` lists the registry, and `keys hash`
//! / `keys new` make `[[keys]]` tables that `check` accepts (`rolter demo`: `tests/demo.rs`).

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rolter");

/// `rolter check --config <path>`.
fn check(path: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap()
}

use common::process::Kill;

#[test]
fn check_reports_every_error_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("rolter-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        r#"
[server]
listen = "127.0.0.1:1"
workerz = 2

[[targets]]
name = "a"
url = "ftp://x"
headers = { "X-Key" = "bad\r\nvalue" }

[[targets]]
name = "b"
url = "http://127.0.0.1:2"
weight = "2"

[[routes]]
name = "r"
targets = ["a", "ghost"]
strategy = "fastestt"
"#,
    )
    .unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "workerz",
        "targets[0].url",
        "targets[0].headers",
        "ghost",
        "fastestt",
        "targets[1].weight",
        "write a number",
    ] {
        assert!(err.contains(needle), "missing {needle} in:\n{err}");
    }
    assert!(err.contains("bad.toml"), "errors name the file:\n{err}");

    // `run` with the same file also exits 2 and binds nothing.
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_accepts_the_shipped_examples() {
    // config/managed-api.toml needs its provider's host name to resolve, which a sandbox
    // without DNS cannot do; the config unit tests load it with a fake resolver.
    for example in ["config/vllm-fleet.toml", "config/replicas.toml"] {
        let out = Command::new(BIN)
            .args(["check", "--config", example])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A strategy option that keeps state in the shared store is refused without `[state]`,
/// with the section to add; with it, the file checks.
#[test]
fn check_refuses_atomic_without_a_state_store_and_says_how_to_add_one() {
    let dir = std::env::temp_dir().join(format!("rolter-check-atomic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("atomic.toml");
    let text = r#"
[[targets]]
name = "a"
url = "http://127.0.0.1:9"

[[routes]]
name = "r"
targets = ["a"]
strategy = { name = "round_robin", atomic = true }
"#;
    std::fs::write(&path, text).unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "routes[0].strategy",
        "`round_robin` with atomic = true",
        "no [state] is configured",
        "backend = \"redis\"",
    ] {
        assert!(err.contains(needle), "missing {needle} in:\n{err}");
    }
    std::fs::write(
        &path,
        format!("{text}\n[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n"),
    )
    .unwrap();
    let out = check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn strategies_lists_names_and_aliases() {
    let out = Command::new(BIN).arg("strategies").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for n in ["round_robin", "weighted_round_robin", "random"] {
        assert!(text.contains(n), "{text}");
    }
}

/// `check` names each route's strategy with the options that differ from its defaults,
/// inner strategies included, in the form the file would write them.
#[test]
fn check_shows_each_routes_strategy_and_its_options() {
    let dir = std::env::temp_dir().join(format!("rolter-check-opts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rolter.toml");
    std::fs::write(
        &path,
        "[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8000\"\n\
         [[routes]]\nname = \"plain\"\ntargets = [\"a\"]\n\
         [[routes]]\nname = \"tiered\"\ntargets = [\"a\"]\n[routes.strategy]\n\
         name = \"active_passive\"\nwithin_tier = { name = \"cache_aware\", threshold = 0.7 }\n",
    )
    .unwrap();
    let out = check(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("  route plain: strategy round_robin\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "  route tiered: strategy failover (within_tier = { name = \"cache_aware\", threshold = 0.7 })\n"
        ),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every default `rolter strategies` prints is the strategy's options type's `Default`, as
/// it would be written in the configuration; an option without a default says `none`.
#[test]
fn strategies_prints_the_defaults_of_each_options_type() {
    let out = Command::new(BIN).arg("strategies").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut current: Option<&'static rolter::strategy::StrategyInfo> = None;
    let mut checked = 0;
    for line in text.lines() {
        if !line.starts_with(' ') {
            current = Some(rolter::strategy::registry::lookup(line).expect(line));
            continue;
        }
        let Some(rest) = line.strip_prefix("  option ") else {
            continue;
        };
        let info = current.expect("an option line follows a strategy");
        let (key, rest) = rest.split_once(" (default ").unwrap();
        let printed = rest.split_once("): ").unwrap().0;
        let defaults = rolter::strategy::StrategySpec::with_defaults(info.name)
            .unwrap()
            .to_table();
        let expected = defaults
            .get(key)
            .map_or("none".to_string(), rolter::strategy::options::render);
        assert_eq!(printed, expected, "{}.{key}", info.name);
        checked += 1;
    }
    let total: usize = rolter::strategy::registry::all()
        .iter()
        .map(|i| i.options().len())
        .sum();
    assert_eq!(checked, total, "every option is listed");
    assert!(checked > 50);
}

/// `rolter strategies | head -1`: a reader that goes away early ends the command quietly.
#[test]
fn strategies_to_a_closed_pipe_exits_quietly() {
    use std::process::Stdio;
    let mut child = Command::new(BIN)
        .arg("strategies")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the command writes (like `head` exiting).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn run_serves_and_stops_on_sigterm() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let m = common::mock("a", |_| {});
    let dir = std::env::temp_dir().join(format!("rolter-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ok.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 1\nshutdown_grace = \"2s\"\n\n[[targets]]\nname = \"a\"\nurl = \"http://{}\"\n",
            m.addr()
        ),
    )
    .unwrap();
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Kill(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = common::call(
        addr,
        &common::post("/v1/completions", &[], r#"{"model":"m","prompt":"hi"}"#),
    );
    assert_eq!(r.status, 200);
    // SIGTERM: drains and exits 0.
    common::process::signal(&child.0, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rolter keys <args>` with `stdin`.
fn keys(args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .arg("keys")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A configuration with one target and `keys` appended, checked by `rolter check`.
fn check_with_keys(name: &str, keys: &str) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("rolter-cli-keys-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rolter.toml");
    std::fs::write(
        &path,
        format!("[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8000\"\n{keys}"),
    )
    .unwrap();
    let out = check(&path);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn keys_hash_prints_the_sha256_line_of_the_key_on_stdin() {
    let out = keys(&["hash"], "foo\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hash = \"sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"\n"
    );
    let out = keys(&["hash"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stdin"));
}

#[test]
fn keys_new_prints_a_key_once_and_a_table_that_checks() {
    let out = keys(&["new", "--name", "team-a"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (key, table) = text.split_once("\n\n").unwrap();
    assert!(key.starts_with("rolter_") && key.len() == 7 + 64, "{key}");
    assert!(
        !table.contains(key),
        "the table holds the hash only:\n{table}"
    );
    // The table is the hash of the key printed.
    let hashed = keys(&["hash"], key);
    let hash_line = String::from_utf8(hashed.stdout).unwrap();
    assert!(table.contains(hash_line.trim()), "{table}\n{hash_line}");
    let out = check_with_keys("new", table);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Two keys are never the same.
    let again = String::from_utf8(keys(&["new", "--name", "b"], "").stdout).unwrap();
    assert_ne!(again.lines().next(), Some(key));

    let out = keys(&["new", "--name", "bad name"], "");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_refuses_a_key_written_instead_of_its_hash_and_says_how_to_hash_it() {
    let out = check_with_keys(
        "plain",
        "[[keys]]\nname = \"a\"\nhash = \"rolter_secret\"\n",
    );
    assert_eq!(out.status.code(), Some(2));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("keys[0].hash") && said.contains("rolter keys hash"),
        "{said}"
    );
}
