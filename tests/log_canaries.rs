//! No secret and no prompt in any log at any level: `rolter run` with `ROLTER_LOG=trace`
//! serves requests carrying canaries in `Authorization`, `x-api-key`, the query and the
//! prompt (successes, a stream cut by its engine, a dead target, a malformed request), and
//! neither its stdout, its stderr nor its access log holds one. The operational log has no
//! ANSI codes when stderr is not a terminal, and `[log] format = "json"` makes it JSON.

mod common;

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::process::Kill;
use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_rolter");
const CHAT: &str = "/v1/chat/completions";
const CANARIES: [&str; 4] = [
    "sk-CANARY-AUTH-4d1f",
    "CANARY-XKEY-77b2",
    "CANARY-PROMPT-a9c3",
    "CANARY-QUERY-5e06",
];

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Runs the gateway with `log` as its `[log]` table, sends the canary requests, and
/// returns (stdout, stderr, access-log file) once the access log shows `expect` lines.
fn run(name: &str, log: &str, expect: usize) -> (String, String, String) {
    let dir = std::env::temp_dir().join(format!("rolter-canary-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let access = dir.join("access.log");
    let m = mock("a", |c| c.tokens = 5);
    let dead = free_addr();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\n\
         [log]\n{}\n\
         [[targets]]\nname = \"live\"\nurl = \"http://{}\"\nmodels = [\"m\"]\n\
         [[targets]]\nname = \"dead\"\nurl = \"http://{dead}\"\nmodels = [\"d\"]\n",
        log.replace("{access}", &access.display().to_string()),
        m.addr()
    );
    let path = dir.join("rolter.toml");
    std::fs::write(&path, config).unwrap();
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .env("ROLTER_LOG", "trace")
        .stdout(Stdio::from(File::create(&out).unwrap()))
        .stderr(Stdio::from(File::create(&err).unwrap()))
        .spawn()
        .expect("run rolter");
    let child = Kill(child);
    // The address it bound, from its start line (text: `addr=…`, JSON: `"addr":"…"`).
    let mut listen: Option<SocketAddr> = None;
    wait_for("the gateway to listen", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        listen = text
            .lines()
            .find(|l| l.contains("rolter listening"))
            .and_then(|l| {
                let at = l.find("127.0.0.1:")?;
                let rest = &l[at..];
                let end = rest.find(|c: char| c != '.' && c != ':' && !c.is_ascii_digit())?;
                rest[..end].parse().ok()
            });
        listen.is_some()
    });
    let listen = listen.unwrap();

    let secret_headers = [
        ("authorization", "Bearer sk-CANARY-AUTH-4d1f"),
        ("x-api-key", "CANARY-XKEY-77b2"),
    ];
    let prompt = |model: &str, stream: bool| {
        format!(
            r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"CANARY-PROMPT-a9c3"}}]}}"#
        )
    };
    let query = format!("{CHAT}?key=CANARY-QUERY-5e06");
    let mut sent = 0;
    for stream in [false, true] {
        let r = call(listen, &post(&query, &secret_headers, &prompt("m", stream)));
        assert_eq!(r.status, 200, "{}", r.text());
        sent += 1;
    }
    // Cut by the engine mid-stream, a dead target, an unknown model.
    let mut cut = secret_headers.to_vec();
    cut.push(("x-mock-reset-after", "2"));
    let mut c = rolter_mock::client::Client::connect(listen);
    c.send(&post(CHAT, &cut, &prompt("m", true)));
    assert_eq!(c.head().unwrap().0, 200);
    while let Ok(Some(_)) = c.chunk() {}
    drop(c);
    let r = call(listen, &post(CHAT, &secret_headers, &prompt("d", false)));
    assert!(r.status >= 500, "{}", r.status);
    let r = call(
        listen,
        &post(CHAT, &secret_headers, &prompt("CANARY-none", false)),
    );
    assert_eq!(r.status, 404);
    sent += 3;
    // A malformed request (two Content-Lengths) carrying the secrets.
    let mut c = rolter_mock::client::Client::connect(listen);
    c.send(&format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-CANARY-AUTH-4d1f\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{{}}"
    ));
    assert_eq!(c.head().unwrap().0, 400);
    drop(c);
    sent += 1;
    assert_eq!(sent, expect);

    let counted = |text: &str| {
        text.lines()
            .filter(|l| l.contains("\"request_id\""))
            .count()
    };
    wait_for("the access-log lines", Duration::from_secs(10), || {
        let file = std::fs::read_to_string(&access).unwrap_or_default();
        let stdout = std::fs::read_to_string(&out).unwrap_or_default();
        counted(&file) + counted(&stdout) >= expect
    });
    drop(child);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (read(&out), read(&err), read(&access))
}

fn assert_no_canary(what: &str, text: &str) {
    for c in CANARIES {
        assert!(
            !text.contains(c),
            "{what} holds the canary {c}:\n{}",
            text.lines()
                .filter(|l| l.contains(c))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Both runs in one test, one after the other: neither may take the other's ports.
#[test]
fn no_secret_or_prompt_in_any_log() {
    with_text_logs_and_a_file();
    with_json_logs_and_stdout();
}

fn with_text_logs_and_a_file() {
    let (stdout, stderr, access) = run("text", "access = \"{access}\"\nformat = \"text\"", 6);
    assert_no_canary("stdout", &stdout);
    assert_no_canary("stderr", &stderr);
    assert_no_canary("the access log", &access);
    // Non-vacuous: the log ran (every level enabled), the requests were logged, and the
    // failures were reported.
    assert!(stderr.contains("rolter listening"), "{stderr}");
    assert!(stderr.contains("cause=\"upstream_reset\""), "{stderr}");
    assert!(
        stderr.contains("cause=\"upstream_connect_failed\""),
        "{stderr}"
    );
    assert_eq!(access.lines().count(), 6, "{access}");
    assert!(access.contains("\"error\":\"bad_request\""), "{access}");
    assert!(access.contains("\"flags\":\"UC\""), "{access}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI codes in a log that is not a terminal"
    );
}

fn with_json_logs_and_stdout() {
    let (stdout, stderr, _) = run("json", "access = \"stdout\"\nformat = \"json\"", 6);
    assert_no_canary("stdout", &stdout);
    assert_no_canary("stderr", &stderr);
    let access: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(access.len(), 6, "{stdout}");
    assert!(access.iter().any(|l| l["flags"] == "NR"), "{stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty());
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string(), "{l}");
    }
}
