//! Running under systemd, as far as this machine allows without one: the `rolter run`
//! binary tells a service manager (here a datagram socket the test binds and names in
//! `NOTIFY_SOCKET`) `READY=1` once its port accepts connections, `RELOADING=1` then
//! `READY=1` around a reload, `MAINPID=` when an upgrade hands over, `STOPPING=1` when
//! SIGTERM starts the drain, and `WATCHDOG=1` on schedule when `WATCHDOG_USEC` asks; with
//! `io_uring_setup` denied by a seccomp filter, `driver = "auto"` falls back to epoll
//! saying why and `driver = "io_uring"` refuses to start. The shipped `config/rolter.service`
//! passes `systemd-analyze verify`, scores at most 2.5 in `systemd-analyze security`, and its
//! documented install layout lets an unprivileged uid read the configuration (each skipped,
//! saying why, where the tool or root is missing).

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{self, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rolter");
const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/rolter.service");

/// A scratch directory removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "rolter-systemd-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One notification: the datagram's `KEY=VALUE` lines, in order.
#[derive(Debug)]
struct Message(Vec<(String, String)>);

impl Message {
    /// A datagram of newline-terminated `KEY=VALUE` lines.
    fn parse(datagram: &[u8]) -> Message {
        let text = std::str::from_utf8(datagram).expect("notifications are UTF-8");
        assert!(
            text.ends_with('\n'),
            "every line ends with a newline: {text:?}"
        );
        Message(
            text.lines()
                .map(|l| {
                    let (k, v) = l
                        .split_once('=')
                        .unwrap_or_else(|| panic!("not KEY=VALUE: {l:?} in {text:?}"));
                    (k.to_string(), v.to_string())
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn is_watchdog(&self) -> bool {
        self.0.len() == 1 && self.get("WATCHDOG") == Some("1")
    }
}

/// The service manager's end: a datagram socket named by `NOTIFY_SOCKET`.
struct Manager {
    sock: UnixDatagram,
    /// What goes into `NOTIFY_SOCKET`.
    name: String,
    _dir: Option<TempDir>,
}

impl Manager {
    /// A socket at a path in a temporary directory.
    fn at_path() -> Manager {
        let dir = TempDir::new("notify");
        let path = dir.0.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        Manager::with(sock, path.to_str().unwrap().to_string(), Some(dir))
    }

    /// A socket in the abstract namespace (`@name`), as some systemd versions pass it.
    fn abstract_name() -> Manager {
        let name = format!(
            "rolter-systemd-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        );
        let addr = net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        Manager::with(sock, format!("@{name}"), None)
    }

    fn with(sock: UnixDatagram, name: String, dir: Option<TempDir>) -> Manager {
        // A guard against a hang, not a measurement.
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Manager {
            sock,
            name,
            _dir: dir,
        }
    }

    /// The next notification.
    fn next(&self) -> Message {
        let mut buf = vec![0u8; 4096];
        let n = self
            .sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification arrived: {e}"));
        Message::parse(&buf[..n])
    }

    /// The next notification that is not a watchdog ping.
    fn next_state(&self) -> Message {
        loop {
            let m = self.next();
            if !m.is_watchdog() {
                return m;
            }
        }
    }

    /// Whatever is queued now, without waiting.
    fn queued(&self) -> Vec<Message> {
        self.sock.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.sock.recv(&mut buf) {
            out.push(Message::parse(&buf[..n]));
        }
        self.sock.set_nonblocking(false).unwrap();
        out
    }
}

/// A running `rolter run` whose stderr is collected.
struct Proc {
    child: Child,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rolter");
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Proc {
            child,
            stderr: Some(stderr),
        }
    }

    fn signal(&self, sig: i32) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits for the exit (bounded, as a guard) and returns its status and stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "rolter did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default();
        (status, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A configuration file for one mock engine behind `workers` workers on a free port, with
/// its own control socket (the default one is named after the port, 0 for every test here,
/// so gateways of tests running at once would take each other for a running instance).
fn config_file(dir: &TempDir, driver: &str, workers: usize, engine: SocketAddr) -> PathBuf {
    let path = dir.0.join("rolter.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\npin_workers = false\n\
             driver = \"{driver}\"\nshutdown_grace = \"2s\"\ncontrol_socket = \"{}\"\n\n\
             [[targets]]\nname = \"a\"\nurl = \"http://{engine}\"\n",
            dir.0.join("control.sock").display()
        ),
    )
    .unwrap();
    path
}

/// `rolter run --config <config>` with `NOTIFY_SOCKET` naming `manager` and no inherited
/// watchdog or driver override.
fn rolter_run(config: &Path, manager: &Manager) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--config"])
        .arg(config)
        .env("NOTIFY_SOCKET", &manager.name)
        .env("ROLTER_LOG", "info")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    cmd
}

/// Start: the first notification is `READY=1` with a status naming the address and the
/// worker count, and at that moment the port already serves.
fn expect_ready(manager: &Manager, workers: usize, driver: &str) -> SocketAddr {
    let ready = manager.next_state();
    assert_eq!(ready.get("READY"), Some("1"), "{ready:?}");
    let status = ready.get("STATUS").expect("a STATUS line with READY=1");
    let s = if workers == 1 { "" } else { "s" };
    assert!(
        status.contains(&format!(", {workers} worker{s} ({driver})")),
        "{status}"
    );
    let addr: SocketAddr = status
        .strip_prefix("listening on ")
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {status:?}"));
    let r = common::call(
        addr,
        &common::post("/v1/completions", &[], r#"{"model":"m","prompt":"hi"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    addr
}

/// `CLOCK_MONOTONIC` in µs, the clock of `MONOTONIC_USEC=`.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Reload: SIGHUP, then `RELOADING=1` stamped with the monotonic clock at that moment (as
/// `Type=notify-reload` requires), then `READY=1` with a status that starts with `outcome`.
fn expect_reload(proc: &Proc, manager: &Manager, outcome: &str) {
    let before = monotonic_usec();
    proc.signal(libc::SIGHUP);
    let reloading = manager.next_state();
    assert_eq!(reloading.get("RELOADING"), Some("1"), "{reloading:?}");
    let stamp: u64 = reloading
        .get("MONOTONIC_USEC")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MONOTONIC_USEC with RELOADING=1: {reloading:?}"));
    let after = monotonic_usec();
    assert!(
        before <= stamp && stamp <= after,
        "{before} <= {stamp} <= {after}"
    );
    let ready = manager.next_state();
    assert_eq!(ready.get("READY"), Some("1"), "{ready:?}");
    assert!(
        ready.get("STATUS").is_some_and(|s| s.starts_with(outcome)),
        "{outcome}: {ready:?}"
    );
}

/// Stop: SIGTERM, then `STOPPING=1` (with a status and a stop-timeout extension covering
/// the grace), then exit 0 with nothing more sent.
fn expect_clean_stop(proc: Proc, manager: &Manager) -> String {
    proc.signal(libc::SIGTERM);
    let stopping = manager.next_state();
    assert_eq!(stopping.get("STOPPING"), Some("1"), "{stopping:?}");
    assert!(
        stopping
            .get("STATUS")
            .is_some_and(|s| s.contains("draining")),
        "{stopping:?}"
    );
    let extend = manager.next_state();
    let usec: u64 = extend
        .get("EXTEND_TIMEOUT_USEC")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("EXTEND_TIMEOUT_USEC after STOPPING=1: {extend:?}"));
    assert!(
        usec >= 2_000_000,
        "the extension covers the 2 s grace: {usec}"
    );
    let (status, stderr) = proc.finish();
    assert!(status.success(), "{status:?}\n{stderr}");
    let after: Vec<Message> = manager
        .queued()
        .into_iter()
        .filter(|m| !m.is_watchdog())
        .collect();
    assert!(after.is_empty(), "sent after STOPPING=1: {after:?}");
    stderr
}

/// Start, serve, reload (good, then refused), stop, as systemd sees it, under each driver
/// with a socket path.
#[test]
fn notifies_ready_then_stopping_and_exits_0() {
    let engine = common::mock("a", |_| {});
    for driver in common::drivers() {
        let name = common::driver_name(driver);
        let manager = Manager::at_path();
        let dir = TempDir::new("run");
        let config = config_file(&dir, name, 2, engine.addr());
        let proc = Proc::spawn(rolter_run(&config, &manager));
        let addr = expect_ready(&manager, 2, name);
        expect_reload(&proc, &manager, "reloaded: sha256 ");
        // A file with an error is refused, reported the same way, and the gateway serves on.
        std::fs::write(&config, "[server\n").unwrap();
        expect_reload(&proc, &manager, "reload refused");
        let r = common::call(
            addr,
            &common::post("/v1/completions", &[], r#"{"model":"m","prompt":"again"}"#),
        );
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        expect_clean_stop(proc, &manager);
    }
}

/// `NOTIFY_SOCKET=@name` is the abstract namespace, not a file named `@name`.
#[test]
fn an_abstract_notify_socket_is_reached() {
    let engine = common::mock("a", |_| {});
    let manager = Manager::abstract_name();
    let dir = TempDir::new("abstract");
    let config = config_file(&dir, "epoll", 1, engine.addr());
    let proc = Proc::spawn(rolter_run(&config, &manager));
    expect_ready(&manager, 1, "epoll");
    expect_clean_stop(proc, &manager);
}

/// `WATCHDOG_USEC` set (as `WatchdogSec=` does): `WATCHDOG=1` keeps arriving, every 40 %
/// of the timeout, from start until the stop.
#[test]
fn the_watchdog_is_pinged_while_running() {
    let engine = common::mock("a", |_| {});
    let manager = Manager::at_path();
    let dir = TempDir::new("watchdog");
    let config = config_file(&dir, "epoll", 1, engine.addr());
    let mut cmd = rolter_run(&config, &manager);
    cmd.env("WATCHDOG_USEC", "200000");
    let proc = Proc::spawn(cmd);
    // Pings may come before READY=1: the control thread starts first.
    let mut pings = 0;
    let mut ready = false;
    while pings < 2 || !ready {
        let m = manager.next();
        if m.is_watchdog() {
            pings += 1;
        } else {
            assert!(!ready, "only READY=1 before the stop: {m:?}");
            assert_eq!(m.get("READY"), Some("1"), "{m:?}");
            ready = true;
        }
    }
    // Each ping is its own datagram, with nothing else in it.
    let more = manager.next();
    assert!(more.is_watchdog(), "{more:?}");
    expect_clean_stop(proc, &manager);
}

/// A `WATCHDOG_PID` naming another process means the watchdog is not ours: no pings.
#[test]
fn a_watchdog_for_another_pid_is_not_pinged() {
    let engine = common::mock("a", |_| {});
    let manager = Manager::at_path();
    let dir = TempDir::new("watchdog-pid");
    let config = config_file(&dir, "epoll", 1, engine.addr());
    let mut cmd = rolter_run(&config, &manager);
    // PID 1 is never the gateway started here.
    cmd.env("WATCHDOG_USEC", "200000").env("WATCHDOG_PID", "1");
    let proc = Proc::spawn(cmd);
    expect_ready(&manager, 1, "epoll");
    proc.signal(libc::SIGTERM);
    let stopping = manager.next();
    assert_eq!(stopping.get("STOPPING"), Some("1"), "{stopping:?}");
    let (status, stderr) = proc.finish();
    assert!(status.success(), "{status:?}\n{stderr}");
    let rest = manager.queued();
    assert!(
        rest.iter().all(|m| !m.is_watchdog()),
        "pinged another process's watchdog: {rest:?}"
    );
    assert!(!stderr.contains("watchdog on"), "{stderr}");
}

/// A process this test did not start as its child (a binary upgrade's new gateway),
/// killed at the end if it is still there.
struct Adopted(i32);

impl Adopted {
    /// Whether the process is gone (or a zombie nobody has reaped yet).
    fn gone(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0)).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        if !self.gone() {
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// SIGUSR2 under a service manager: once the new binary serves, the old process names it
/// the main process (`MAINPID=`), drains and exits 0; the new one pings the watchdog the
/// old one was given (`WATCHDOG_PID` is inherited), serves, and stops on SIGTERM.
#[test]
fn an_upgrade_hands_the_main_pid_to_the_new_process() {
    let engine = common::mock("a", |_| {});
    let manager = Manager::at_path();
    let dir = TempDir::new("upgrade");
    let config = config_file(&dir, "epoll", 1, engine.addr());
    // As systemd starts a service with WatchdogSec=: WATCHDOG_PID is the main process.
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("export WATCHDOG_PID=$$; exec \"$0\" run --config \"$1\"")
        .arg(BIN)
        .arg(&config)
        .env("NOTIFY_SOCKET", &manager.name)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    // To a file: the new process inherits it and outlives the old one.
    let log = dir.0.join("stderr.log");
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let old = Proc {
        child: cmd.spawn().expect("run rolter"),
        stderr: None,
    };
    let old_pid = old.child.id();
    let addr = expect_ready(&manager, 1, "epoll");
    old.signal(libc::SIGUSR2);
    let new_pid: u32 = loop {
        let m = manager.next_state();
        if let Some(pid) = m.get("MAINPID") {
            break pid.parse().unwrap();
        }
        // The new process's own READY=1 may come first (systemd ignores it: not main yet).
        assert_eq!(m.get("READY"), Some("1"), "before MAINPID=: {m:?}");
    };
    let new = Adopted(new_pid as i32);
    assert_ne!(new_pid, old_pid);
    let stat = std::fs::read_to_string(format!("/proc/{new_pid}/stat")).unwrap();
    let ppid: u32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        ppid, old_pid,
        "the new main process is the one SIGUSR2 started"
    );
    let (status, _) = old.finish();
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{}", stderr());
    // The old process is gone: from here on every message is the new one's.
    let _ = manager.queued();
    for _ in 0..2 {
        let m = manager.next();
        assert!(m.is_watchdog(), "{m:?}\n{}", stderr());
    }
    let r = common::call(
        addr,
        &common::post("/v1/completions", &[], r#"{"model":"m","prompt":"new"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(unsafe { libc::kill(new.0, libc::SIGTERM) }, 0);
    let stopping = manager.next_state();
    assert_eq!(stopping.get("STOPPING"), Some("1"), "{stopping:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !new.gone() {
        assert!(Instant::now() < deadline, "the new process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------
// io_uring denied, as a seccomp filter (a container's, a unit's SystemCallFilter=) does.
// ---------------------------------------------------------------------------------------

/// `driver = "auto"` with io_uring_setup denied (EPERM): a warning naming the cause, then
/// the gateway serves on epoll.
#[test]
fn auto_falls_back_to_epoll_loudly_when_io_uring_setup_is_denied() {
    let engine = common::mock("a", |_| {});
    let manager = Manager::at_path();
    let dir = TempDir::new("seccomp-auto");
    let config = config_file(&dir, "auto", 1, engine.addr());
    let mut cmd = rolter_run(&config, &manager);
    common::seccomp::deny_io_uring_setup(&mut cmd, libc::EPERM);
    let proc = Proc::spawn(cmd);
    expect_ready(&manager, 1, "epoll");
    let stderr = expect_clean_stop(proc, &manager);
    assert!(stderr.contains("WARN"), "{stderr}");
    assert!(
        stderr.contains("io_uring_setup was denied (Operation not permitted"),
        "{stderr}"
    );
    assert!(stderr.contains("SystemCallFilter="), "{stderr}");
    assert!(stderr.contains("falling back to epoll"), "{stderr}");
}

/// `driver = "io_uring"` with io_uring_setup denied (EPERM) or missing (ENOSYS): exit 1
/// with the cause and the key to change, before READY=1.
#[test]
fn explicit_io_uring_fails_with_the_cause_when_io_uring_setup_is_denied() {
    for (errno, cause) in [
        (
            libc::EPERM,
            "io_uring_setup was denied (Operation not permitted",
        ),
        (
            libc::ENOSYS,
            "io_uring_setup is not implemented (Function not implemented",
        ),
    ] {
        let manager = Manager::at_path();
        let dir = TempDir::new("seccomp-uring");
        let config = config_file(&dir, "io_uring", 1, "127.0.0.1:9".parse().unwrap());
        let mut cmd = rolter_run(&config, &manager);
        common::seccomp::deny_io_uring_setup(&mut cmd, errno);
        let (status, stderr) = Proc::spawn(cmd).finish();
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("server.driver = \"io_uring\" but io_uring is unavailable"),
            "{stderr}"
        );
        assert!(stderr.contains(cause), "{stderr}");
        assert!(stderr.contains("driver = \"auto\""), "{stderr}");
        assert!(
            manager.queued().is_empty(),
            "notified while failing to start"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The shipped unit.
// ---------------------------------------------------------------------------------------

fn tool(name: &str) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    from_path.or_else(|| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    })
}

fn systemd_analyze() -> Option<PathBuf> {
    let t = tool("systemd-analyze");
    if t.is_none() {
        eprintln!("skipped: systemd-analyze is not installed (Debian: apt-get install systemd)");
    }
    t
}

/// The version `systemd-analyze --version` reports ("systemd 252 (252.38-1~deb12u1)").
fn systemd_version(analyze: &Path) -> u32 {
    let out = Command::new(analyze).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no version in {text:?}"))
}

fn unit_text() -> String {
    std::fs::read_to_string(UNIT).unwrap()
}

/// The shipped unit with its programs at the built binary, and its variant for systemd
/// before 253 (the commented `Type=notify` + `ExecReload=` lines in place of
/// `Type=notify-reload`), each as `rolter.service` in its own directory.
fn unit_copies() -> (TempDir, PathBuf, PathBuf) {
    let dir = TempDir::new("unit");
    let text = unit_text().replace("/usr/local/bin/rolter", BIN);
    assert!(text.contains(&format!("ExecStart={BIN} run")), "{text}");
    assert!(
        text.contains(&format!("ExecStartPre={BIN} check")),
        "{text}"
    );
    let older: String = text
        .lines()
        .filter(|l| *l != "Type=notify-reload")
        .map(|l| match l {
            "#Type=notify" => "Type=notify",
            l if l.starts_with("#ExecReload=") => &l[1..],
            l => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(older.contains("\nType=notify\n"), "{older}");
    assert!(
        older.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"),
        "{older}"
    );
    let (new_dir, old_dir) = (dir.0.join("current"), dir.0.join("before-253"));
    std::fs::create_dir_all(&new_dir).unwrap();
    std::fs::create_dir_all(&old_dir).unwrap();
    let (new, old) = (
        new_dir.join("rolter.service"),
        old_dir.join("rolter.service"),
    );
    std::fs::write(&new, text).unwrap();
    std::fs::write(&old, older).unwrap();
    (dir, new, old)
}

/// What `systemd-analyze verify` says about `unit`: its success and the lines naming the
/// unit file or the unit.
fn verify(analyze: &Path, unit: &Path) -> (bool, Vec<String>) {
    let out = Command::new(analyze)
        .arg("verify")
        .arg(unit)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let about_unit = text
        .lines()
        .filter(|l| l.contains(unit.to_str().unwrap()) || l.contains("rolter.service"))
        .map(str::to_string)
        .collect();
    (out.status.success(), about_unit)
}

#[test]
fn the_shipped_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let version = systemd_version(&analyze);
    let (_dir, current, older) = unit_copies();
    let (ok, said) = verify(&analyze, &current);
    assert!(ok, "verify failed: {said:?}");
    if version >= 253 {
        assert!(said.is_empty(), "systemd {version}: {said:?}");
    } else {
        // notify-reload is newer than this systemd: the one complaint allowed, and the
        // reason the older variant is shipped commented next to it.
        assert!(
            said.iter().all(|l| l.contains("notify-reload")),
            "systemd {version}: {said:?}"
        );
    }
    let (ok, said) = verify(&analyze, &older);
    assert!(
        ok && said.is_empty(),
        "systemd {version}, Type=notify variant: {said:?}"
    );
}

#[test]
fn the_shipped_unit_scores_at_most_2_5_in_systemd_analyze_security() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let (_dir, current, _) = unit_copies();
    let out = Command::new(&analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&current)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level for rolter.service:"))
        .unwrap_or_else(|| {
            panic!(
                "no overall score in:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let score: f64 = line
        .rsplit(':')
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"));
    eprintln!("{line}");
    assert!(score <= 2.5, "{line}\n{text}");
}

/// The hardening settings the operations reference lists, and io_uring's system calls
/// allowed next to the service set.
#[test]
fn the_shipped_unit_carries_the_hardening_list() {
    let text = unit_text();
    let settings: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .collect();
    for want in [
        "Type=notify-reload",
        "DynamicUser=yes",
        "ConfigurationDirectory=rolter",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "MemoryDenyWriteExecute=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "CapabilityBoundingSet=",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=io_uring_setup io_uring_enter io_uring_register",
        "UMask=0077",
        "LimitNOFILE=1048576",
        "LimitMEMLOCK=infinity",
        "Restart=on-failure",
    ] {
        assert!(settings.contains(&want), "{want} is missing from {UNIT}");
    }
    assert!(settings.iter().any(|l| l.starts_with("TimeoutStopSec=")));
    assert!(settings
        .iter()
        .any(|l| l.starts_with("ConfigurationDirectoryMode=")));
    assert!(settings.iter().any(|l| l.starts_with("WatchdogSec=")));
    assert!(text.contains("\n#Type=notify\n#ExecReload=/bin/kill -HUP $MAINPID\n"));
}

/// The install commands in the unit's header (`#   install ...`), with the repository's
/// files and the host's directories rewritten: `/` becomes `root`, the built binary stands
/// in for `target/release/rolter`.
fn documented_install(root: &Path) -> Vec<Vec<String>> {
    let repo = env!("CARGO_MANIFEST_DIR");
    let lines: Vec<Vec<String>> = unit_text()
        .lines()
        .filter_map(|l| l.strip_prefix("#   install "))
        // A trailing `# ...` is a comment.
        .map(|l| l.split(" #").next().unwrap())
        .map(|args| {
            args.split_whitespace()
                .map(|a| {
                    if a == "target/release/rolter" {
                        BIN.to_string()
                    } else if a == "/dev/null" {
                        a.to_string()
                    } else if let Some(p) = a.strip_prefix('/') {
                        root.join(p).to_str().unwrap().to_string()
                    } else if a.starts_with("config/") {
                        format!("{repo}/{a}")
                    } else {
                        a.to_string()
                    }
                })
                .collect()
        })
        .collect();
    assert!(lines.len() >= 4, "install lines in the unit: {lines:?}");
    lines
}

/// Every directory from `/` down to `p` can be searched by any uid.
fn traversable_by_others(p: &Path) -> bool {
    p.ancestors()
        .all(|a| std::fs::metadata(a).is_ok_and(|m| m.mode() & 0o001 != 0))
}

fn as_nobody(cmd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(tool("setpriv").unwrap())
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(cmd)
        .args(args)
        .output()
        .unwrap()
}

/// The documented layout, installed as written (modes and root ownership), with the
/// configuration directory's mode as systemd sets it from `ConfigurationDirectoryMode=`:
/// a uid that is neither root nor in any group (as a dynamic user is) can run
/// `rolter check` on it, and cannot read the secrets file.
#[test]
fn the_documented_config_layout_is_readable_by_an_unprivileged_uid() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to install files owned by root and switch to uid 65534");
        return;
    }
    if tool("setpriv").is_none() {
        eprintln!("skipped: setpriv is not installed (Debian: apt-get install util-linux)");
        return;
    }
    let dir = TempDir::new("layout");
    if !traversable_by_others(&dir.0) {
        eprintln!(
            "skipped: {} is not searchable by other users (set TMPDIR elsewhere)",
            dir.0.display()
        );
        return;
    }
    let root = dir.0.join("root");
    std::fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    for args in documented_install(&root) {
        // The binary (a debug build is large): a hard link when it already has the mode
        // the line gives (0755), else the documented copy.
        let bin_mode = std::fs::metadata(BIN).unwrap().mode() & 0o7777;
        if args.iter().any(|a| a == BIN)
            && args
                .windows(2)
                .any(|w| w[0] == "-m" && w[1] == format!("{bin_mode:04o}"))
            && std::fs::hard_link(BIN, args.last().unwrap()).is_ok()
        {
            continue;
        }
        let out = Command::new("install").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "install {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // At start systemd sets the configuration directory's mode (not its owner).
    let mode = unit_text()
        .lines()
        .find_map(|l| l.strip_prefix("ConfigurationDirectoryMode="))
        .map(|m| u32::from_str_radix(m.trim(), 8).unwrap())
        .expect("ConfigurationDirectoryMode= in the unit");
    let etc = root.join("etc/rolter");
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(mode)).unwrap();
    let config = etc.join("rolter.toml");
    let meta = std::fs::metadata(&config).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "installed root-owned");

    let bin = root.join("usr/local/bin/rolter");
    let config_arg = config.to_str().unwrap();
    let out = as_nobody(&bin, &["check", "--config", config_arg]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{:?}: {stdout}{stderr}", out.status);
    assert!(stdout.contains(": OK ("), "{stdout}");

    // The secrets file stays root's: systemd reads it for EnvironmentFile=, the service not.
    let secrets = etc.join("secrets.env");
    assert!(secrets.is_file(), "the documented secrets file");
    let out = as_nobody(&bin, &["check", "--config", secrets.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "secrets.env readable by uid 65534");
    assert!(stderr.contains("Permission denied"), "{stderr}");

    // What the issue hit: a root-owned 0640 file is not readable by such a user.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = as_nobody(&bin, &["check", "--config", config_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
}
