//! A real `redis-server` on a free loopback port, for tests (this crate's and the
//! gateway's): started without persistence, waited for until it answers, killed and
//! restarted on the same port, paused (SIGSTOP) to play a server that stops answering, and
//! killed on drop.
//!
//! Owns the child process and its scratch directory; it must not be used outside tests.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::settings::StoreSettings;

/// How long a starting server may take to answer before the test gives up.
const START_BOUND: Duration = Duration::from_secs(20);

/// A `redis-server` child process on `127.0.0.1:<port>`.
pub struct RedisServer {
    port: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
    /// Run as a sentinel, from `sentinel.conf` in the scratch directory.
    sentinel: bool,
}

impl RedisServer {
    /// Whether `redis-server` can be run here (tests and benches that need it say they skip
    /// when it cannot).
    pub fn available() -> bool {
        Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A server without a password.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server that wants `password` (`--requirepass`).
    pub fn with_password(password: &str) -> RedisServer {
        RedisServer::start_with(&["--requirepass", password])
    }

    /// A server with extra configuration arguments (`--name value …`), relative paths in
    /// them resolving in the server's own scratch directory.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let dir = scratch_dir();
        let mut server = RedisServer {
            port: 0,
            args: args.iter().map(|a| a.to_string()).collect(),
            dir,
            child: None,
            sentinel: false,
        };
        server.launch();
        server
    }

    /// A sentinel watching the master on `127.0.0.1:<master_port>` under `name` (quorum 1).
    pub fn sentinel(master_port: u16, name: &str) -> RedisServer {
        let dir = scratch_dir();
        std::fs::write(
            dir.join("sentinel.conf"),
            format!("sentinel monitor {name} 127.0.0.1 {master_port} 1\n"),
        )
        .expect("sentinel.conf");
        let mut server = RedisServer {
            port: 0,
            args: Vec::new(),
            dir,
            child: None,
            sentinel: true,
        };
        server.launch();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Standalone settings for this server under `prefix`, with short timeouts (1 s to
    /// connect, 500 ms per command) that still leave a loaded test machine room.
    pub fn settings(&self, prefix: &str) -> StoreSettings {
        let mut s = StoreSettings::standalone(self.url());
        s.key_prefix = prefix.into();
        s.connect_timeout = Duration::from_secs(1);
        s.command_timeout = Duration::from_millis(500);
        s
    }

    /// The server's scratch directory (its log is `redis.log` there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's process id while it runs (to read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to be gone; the port is left free.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        // The old socket may linger for a moment; the server itself sets SO_REUSEADDR, so a
        // failed bind is another process on the port, retried briefly.
        let start = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if start.elapsed() > START_BOUND => {
                    panic!("redis-server did not restart on port {}: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Stops the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("redis-server is running");
        let ok = Command::new("kill")
            .arg(sig)
            .arg(child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {} failed", child.id());
    }

    /// Starts on a free port. Another process may take the port between the probe and the
    /// server's bind: a few ports are tried.
    fn launch(&mut self) {
        let mut last = String::new();
        for _ in 0..5 {
            self.port = free_port();
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start: {last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        if self.sentinel {
            cmd.arg(self.dir.join("sentinel.conf")).arg("--sentinel");
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"]);
        if !self.sentinel {
            cmd.args(["--save", "", "--appendonly", "no"]);
        }
        cmd.arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run redis-server (apt-get install redis-server): {e}"))?;
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("exited with {status}; log: {}", self.log_tail()));
            }
            if answers(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if start.elapsed() > START_BOUND {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "not answering on port {}; log: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server must run again to die cleanly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new, empty directory for one server's files.
fn scratch_dir() -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rolter-redis-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory for redis-server");
    dir
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Whether a server on `port` answers `PING` (with `PONG`, or by asking for a password).
fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) => buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"),
        Err(_) => false,
    }
}
