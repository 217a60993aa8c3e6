//! The `rolter` binary as an operator runs it: a second instance on a port in use is
//! refused (exit 1), `rolter run --upgrade` takes the listening sockets over from the running
//! process under load with no failed request, SIGHUP and `rolter reload` reload the file and
//! `rolter reload` reports a refused file with its errors (exit 1).

mod common;
use common::process::{free_port, signal, wait_exit, wait_listening, Kill};
use common::*;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rolter");

fn config(port: u16, socket: &Path, driver: &str, targets: &[SocketAddr], extra: &str) -> String {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 2\npin_workers = false\n\
         driver = \"{driver}\"\nshutdown_grace = \"5s\"\ncontrol_socket = \"{}\"\n{extra}\n",
        socket.display()
    );
    for (i, a) in targets.iter().enumerate() {
        text.push_str(&target(&format!("e{i}"), *a, ""));
    }
    text
}

fn spawn(path: &Path, upgrade: bool) -> Kill {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--config"]).arg(path);
    if upgrade {
        cmd.arg("--upgrade");
    }
    Kill(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Runs `rolter <args>` to its end: (exit code, stdout, stderr).
fn rolter(args: &[&str], config: &Path) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// A client looping until `stop`: keep-alive (reconnecting after `connection: close`) or a
/// fresh connection per request, plain or streamed.
fn load(addr: SocketAddr, stream: bool, fresh: bool, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut c = Client::connect(addr);
    while !stop.load(Ordering::Relaxed) {
        if fresh {
            c = Client::connect(addr);
        }
        c.send(&post("/v1/chat/completions", &[], &chat_body(stream)));
        let fail = match c.response() {
            Ok(r) if r.status == 200 => {
                let done =
                    !stream || sse_events(&r.body).last().map(|e| e.1.as_str()) == Some("[DONE]");
                if r.header("connection") == Some("close") {
                    c = Client::connect(addr);
                }
                (!done).then(|| "a stream ended without [DONE]".to_string())
            }
            Ok(r) => Some(format!("status {}: {}", r.status, r.text())),
            Err(e) => Some(format!("i/o error: {e}")),
        };
        match fail {
            None => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Some(f) => {
                let kind = match (stream, fresh) {
                    (true, true) => "stream, fresh connection",
                    (true, false) => "stream, keep-alive",
                    (false, true) => "plain, fresh connection",
                    (false, false) => "plain, keep-alive",
                };
                tally.failures.lock().unwrap().push(format!("{kind}: {f}"));
                c = Client::connect(addr);
            }
        }
    }
}

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("rolter-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_second_instance_is_refused_and_an_upgrade_under_load_loses_nothing() {
    for d in drivers() {
        let driver = driver_name(d);
        let mocks: Vec<_> = (0..2)
            .map(|i| {
                mock(&format!("e{i}"), |c| {
                    c.itl = Duration::from_millis(2);
                    c.tokens = 30;
                })
            })
            .collect();
        let addrs: Vec<SocketAddr> = mocks.iter().map(|m| m.addr()).collect();
        let dir = Dir::new(&format!("upgrade-{driver}"));
        let port = free_port();
        let socket = dir.0.join("rolter.sock");
        let path = dir.0.join("rolter.toml");
        std::fs::write(&path, config(port, &socket, driver, &addrs, "")).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut old = spawn(&path, false);
        wait_listening(addr);
        wait_for("the control socket", Duration::from_secs(10), || {
            socket.exists()
        });

        // The same configuration again: the control socket answers.
        let (code, _, err) = rolter(&["run"], &path);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("another gateway runs"), "{err}");
        assert!(err.contains("--upgrade"), "{err}");
        // Another control socket, the same port: the port is in use.
        let other = dir.0.join("other.toml");
        std::fs::write(
            &other,
            config(port, &dir.0.join("other.sock"), driver, &addrs, ""),
        )
        .unwrap();
        let (code, _, err) = rolter(&["run"], &other);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("already in use"), "{err}");

        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (stop, tally) = (stop.clone(), tally.clone());
                std::thread::spawn(move || load(addr, i % 2 == 0, i >= 4, stop, tally))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let before = tally.ok.load(Ordering::Relaxed);
        let mut new = spawn(&path, true);
        let status = wait_exit(&mut old, Duration::from_secs(20));
        assert!(
            status.success(),
            "{driver}: the old process drains and exits 0: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let failures = tally.failures.lock().unwrap();
        assert!(failures.is_empty(), "{driver}: {failures:#?}");
        assert!(
            tally.ok.load(Ordering::Relaxed) > before,
            "the load ran through the upgrade"
        );
        // The new process serves and answers on the control socket.
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
        assert_eq!(r.status, 200);
        assert!(new.0.try_wait().unwrap().is_none(), "the new process runs");
        signal(&new.0, libc::SIGTERM);
        assert!(wait_exit(&mut new, Duration::from_secs(10)).success());
        assert!(!socket.exists(), "the control socket is removed at exit");
    }
}

#[test]
fn sighup_and_rolter_reload_apply_the_file_and_refuse_a_bad_one() {
    let d = drivers()[0];
    let driver = driver_name(d);
    let a = mock("e0", |_| {});
    let b = mock("e1", |_| {});
    let dir = Dir::new("reload-cli");
    let port = free_port();
    let socket = dir.0.join("rolter.sock");
    let path = dir.0.join("rolter.toml");
    // The access log goes to a file from the start (where it goes needs a restart).
    let log = dir.0.join("access.log");
    let cfg = |targets: &[SocketAddr]| {
        config(port, &socket, driver, targets, "")
            + &format!("\n[log]\naccess = \"{}\"\n", log.display())
    };
    std::fs::write(&path, cfg(&[a.addr()])).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut g = spawn(&path, false);
    wait_listening(addr);
    wait_for("the control socket", Duration::from_secs(10), || {
        socket.exists()
    });
    let engine = || {
        let r = call(addr, &post("/v1/chat/completions", &[], &chat_body(false)));
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("x-mock-engine").unwrap().to_string()
    };
    assert_eq!(engine(), "e0");

    // SIGHUP: the gateway reloads its file (and keeps running).
    std::fs::write(&path, cfg(&[b.addr()])).unwrap();
    signal(&g.0, libc::SIGHUP);
    wait_for("e1 serving after SIGHUP", Duration::from_secs(10), || {
        engine() == "e1"
    });
    assert!(
        g.0.try_wait().unwrap().is_none(),
        "SIGHUP does not stop the gateway"
    );

    // A file with an error: refused with it, exit 1, the running configuration serves on.
    let bad = cfg(&[a.addr()]).replace("workers = 2", "workers = -1");
    std::fs::write(&path, bad).unwrap();
    let (code, out, err) = rolter(&["reload"], &path);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("server.workers"), "{err}");
    assert!(err.contains("keeps serving"), "{err}");
    assert_eq!(engine(), "e1");

    // A setting only a restart can change: refused, naming it.
    let moved = cfg(&[a.addr()]).replace("workers = 2", "workers = 3");
    std::fs::write(&path, moved).unwrap();
    let (code, _, err) = rolter(&["reload"], &path);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("server.workers: changed from 2 to 3"), "{err}");

    // A good file: applied, exit 0, with what changed.
    std::fs::write(&path, cfg(&[a.addr()])).unwrap();
    let (code, out, err) = rolter(&["reload"], &path);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("reloaded: sha256 "), "{out}");
    assert_eq!(engine(), "e0");

    // Nothing runs with this file: `rolter reload` says so.
    let none = dir.0.join("none.toml");
    std::fs::write(
        &none,
        config(
            free_port(),
            &dir.0.join("none.sock"),
            driver,
            &[a.addr()],
            "",
        ),
    )
    .unwrap();
    let (code, _, err) = rolter(&["reload"], &none);
    assert_eq!(code, 1);
    assert!(err.contains("no gateway answers"), "{err}");

    // SIGUSR1 reopens the access log (logrotate moved it away).
    wait_for("access-log lines", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 1)
    });
    let rotated = dir.0.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    signal(&g.0, libc::SIGUSR1);
    wait_for(
        "a line in the reopened file",
        Duration::from_secs(5),
        || {
            engine();
            std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 1)
        },
    );
    // Lines written before the signal was handled may still be in the rotated file; none
    // after the reopen.
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
    let kept = lines(&rotated);
    let before = lines(&log);
    for _ in 0..3 {
        engine();
    }
    wait_for("three more lines", Duration::from_secs(5), || {
        lines(&log) >= before + 3
    });
    assert_eq!(lines(&rotated), kept, "the rotated file gets no more lines");
    signal(&g.0, libc::SIGTERM);
    assert!(wait_exit(&mut g, Duration::from_secs(10)).success());
}
