//! The service manager's notification protocol (sd_notify): `READY=1`, `RELOADING=1`,
//! `STOPPING=1`, `STATUS=`, `EXTEND_TIMEOUT_USEC=` and the watchdog's `WATCHDOG=1`, each a
//! datagram to the UNIX socket `$NOTIFY_SOCKET` names (a leading `@` is the abstract
//! namespace).
//!
//! Owns the messages and their transport; it must not decide when they are sent (the
//! gateway handle, the control thread and the reload path do). Every call is a no-op
//! without `$NOTIFY_SOCKET`. Failures are logged, never returned: a service manager that
//! went away must not stop the gateway. The `sd-notify` crate formats the messages and
//! reads `CLOCK_MONOTONIC`; its own `notify` only connects to a path (an `@` name would be
//! a file named `@…`), so the datagram is sent here.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Startup is finished: every worker listens. `status` shows in `systemctl status`.
pub fn ready(status: &str) {
    let status = one_line(status);
    notify(
        "READY=1",
        &[NotifyState::Ready, NotifyState::Status(&status)],
    );
}

/// A configuration reload starts: `RELOADING=1` with `MONOTONIC_USEC` (systemd 253 and
/// later fail a `Type=notify-reload` reload without it). Follow with [`reloaded`].
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify("RELOADING=1", &[NotifyState::Reloading, now]),
        Err(e) => {
            tracing::warn!("cannot read CLOCK_MONOTONIC for the reload notification: {e}");
            notify("RELOADING=1", &[NotifyState::Reloading]);
        }
    }
}

/// The reload is over (applied or refused): the service is ready again.
pub fn reloaded(status: &str) {
    ready(status);
}

/// Draining has started; the service manager shows `deactivating`.
pub fn stopping(status: &str) {
    let status = one_line(status);
    notify(
        "STOPPING=1",
        &[NotifyState::Stopping, NotifyState::Status(&status)],
    );
}

/// After a binary upgrade's handover: `pid`, the new process, is the service's main
/// process from now on (sent by the old one, which systemd still accepts messages from).
pub fn main_pid(pid: u32) {
    notify("MAINPID", &[NotifyState::MainPid(pid)]);
}

/// A free-form status line for `systemctl status`.
pub fn status(text: &str) {
    let text = one_line(text);
    notify("STATUS", &[NotifyState::Status(&text)]);
}

/// Asks for `by` more before the current state's timeout (here: `TimeoutStopSec=` while
/// draining) fires. It never shortens a timeout; values past u32 µs (71 min) are capped.
pub fn extend_timeout(by: Duration) {
    let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
    notify(
        "EXTEND_TIMEOUT_USEC",
        &[NotifyState::ExtendTimeoutUsec(usec)],
    );
}

/// `WATCHDOG=1` on a schedule, when the service manager asked for it (`WatchdogSec=` sets
/// `$WATCHDOG_USEC`, and `$WATCHDOG_PID`, when set, is this process). The control thread
/// calls [`Watchdog::tick`] on every tick, so a stuck control thread stops the pings and
/// the service manager restarts the gateway.
#[derive(Debug)]
pub struct Watchdog {
    socket: OsString,
    every: Duration,
    next: Option<Instant>,
    failing: bool,
}

impl Watchdog {
    /// The watchdog the environment asks for, or `None` (no `$NOTIFY_SOCKET`, no or zero
    /// `$WATCHDOG_USEC`, or a `$WATCHDOG_PID` that is neither this process nor its parent).
    /// The parent counts because a binary upgrade's new process inherits the old one's
    /// environment and becomes the main process ([`main_pid`]) when the old one leaves.
    pub fn from_env() -> Option<Watchdog> {
        let socket = std::env::var_os(NOTIFY_SOCKET)?;
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        let pid = std::env::var("WATCHDOG_PID").ok();
        let ours = |p: u32| p == std::process::id() || p == std::os::unix::process::parent_id();
        if usec == 0 || pid.is_some_and(|p| !p.parse().is_ok_and(ours)) {
            return None;
        }
        let timeout = Duration::from_micros(usec);
        let w = Watchdog::new(socket, timeout);
        tracing::info!(
            timeout_ms = timeout.as_millis() as u64,
            every_ms = w.every.as_millis() as u64,
            "service manager watchdog on"
        );
        Some(w)
    }

    /// Pings `socket` often enough for a watchdog `timeout`: every 40 % of it, which keeps
    /// the gap under the half systemd asks for even when a tick runs late.
    pub fn new(socket: OsString, timeout: Duration) -> Watchdog {
        Watchdog {
            socket,
            every: timeout * 2 / 5,
            next: None,
            failing: false,
        }
    }

    /// The period between pings.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Sends `WATCHDOG=1` when one is due (the first at once); otherwise only compares
    /// `now` with the next due time.
    pub fn tick(&mut self, now: Instant) {
        if self.next.is_some_and(|next| now < next) {
            return;
        }
        self.next = Some(now + self.every);
        match send_to(&self.socket, &[NotifyState::Watchdog]) {
            Ok(()) => self.failing = false,
            // Once per run of failures: a ping is due every few seconds.
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(
                    "cannot send WATCHDOG=1 to the service manager at {}: {e}",
                    self.socket.to_string_lossy()
                );
            }
            Err(_) => {}
        }
    }
}

/// Sends `states` to `$NOTIFY_SOCKET` when it is set, logging a failure.
fn notify(what: &str, states: &[NotifyState]) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    if let Err(e) = send_to(&socket, states) {
        tracing::warn!(
            "cannot send {what} to the service manager at {}: {e}",
            socket.to_string_lossy()
        );
    }
}

/// One datagram of newline-terminated `KEY=VALUE` lines to a socket path, or to an
/// abstract-namespace name when `socket` starts with `@`.
pub fn send_to(socket: &OsStr, states: &[NotifyState]) -> io::Result<()> {
    let mut msg = String::new();
    for s in states {
        let _ = writeln!(msg, "{s}");
    }
    let addr = match socket.as_bytes() {
        [b'@', name @ ..] => SocketAddr::from_abstract_name(name)?,
        [b'/', ..] => SocketAddr::from_pathname(socket)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither an absolute path nor an @abstract name",
            ))
        }
    };
    let sent = UnixDatagram::unbound()?.send_to_addr(msg.as_bytes(), &addr)?;
    if sent != msg.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "datagram cut short",
        ));
    }
    Ok(())
}

/// A status text on one line: a newline would start another `KEY=VALUE` pair.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    fn bound() -> (tempdir::Dir, UnixDatagram, OsString) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (dir, sock, path.into_os_string())
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "rolter-notify-{}-{}",
                    std::process::id(),
                    fastrand::u64(..)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_path_socket_gets_one_datagram_of_lines() {
        let (_dir, sock, path) = bound();
        send_to(
            &path,
            &[NotifyState::Ready, NotifyState::Status("listening on x")],
        )
        .unwrap();
        assert_eq!(receive(&sock), "READY=1\nSTATUS=listening on x\n");
    }

    #[test]
    fn an_at_name_is_the_abstract_namespace() {
        let name = format!(
            "rolter-notify-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        );
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        send_to(OsStr::new(&format!("@{name}")), &[NotifyState::Stopping]).unwrap();
        assert_eq!(receive(&sock), "STOPPING=1\n");
    }

    #[test]
    fn a_relative_name_is_refused() {
        let e = send_to(OsStr::new("notify.sock"), &[NotifyState::Ready]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_watchdog_pings_at_once_then_when_due() {
        let (_dir, sock, path) = bound();
        sock.set_nonblocking(true).unwrap();
        let mut w = Watchdog::new(path, Duration::from_millis(1000));
        assert_eq!(w.every(), Duration::from_millis(400));
        let t0 = Instant::now();
        w.tick(t0);
        assert_eq!(receive(&sock), "WATCHDOG=1\n");
        // Not yet due: nothing is sent.
        w.tick(t0 + Duration::from_millis(399));
        let mut buf = [0u8; 64];
        assert_eq!(
            sock.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        w.tick(t0 + Duration::from_millis(400));
        assert_eq!(receive(&sock), "WATCHDOG=1\n");
    }

    #[test]
    fn status_text_stays_on_one_line() {
        assert_eq!(one_line("a\nREADY=1\r\nb"), "a READY=1  b");
    }
}
