//! The control socket: a UNIX stream socket beside a running gateway, through which
//! `rolter reload` asks it to reload its configuration, `rolter run --upgrade` (a new
//! binary) takes its listening sockets over, and a second `rolter run` finds it is running.
//!
//! The protocol is one line per request (`reload`, `upgrade`, `status`) and a text answer.
//! For `upgrade` the answer carries the listening sockets themselves (SCM_RIGHTS): the new
//! process accepts from the very sockets the old one did, so no connection waiting in their
//! accept queues is lost; once the new process says `ready`, the old one drains and exits.
//!
//! Owns the socket file, its thread, and both ends of the protocol. The server thread only
//! blocks on this socket; it never touches a worker.

use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use rolter_config::Config;

use crate::reload::ReloadStats;

/// How long a request line may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new process may take between receiving the sockets and saying `ready`.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(120);
/// Most listening sockets one handover carries.
const MAX_FDS: usize = 4097;

/// The shipped unit's `RuntimeDirectory=rolter`.
const SERVICE_RUNTIME_DIR: &str = "/run/rolter";

/// Where the control socket of a gateway running `config` lives: `server.control_socket`
/// when set; else `rolter-<port>.sock` in `$RUNTIME_DIRECTORY` (systemd's
/// `RuntimeDirectory=`), in `/run/rolter` when the service made it there (so a shell finds
/// it), in `$XDG_RUNTIME_DIR`, or in `/tmp/rolter-<uid>` (created 0700).
pub fn path_for(config: &Config) -> PathBuf {
    path_from(
        config.server.listen.port(),
        config.server.control_socket.as_deref(),
    )
}

/// [`path_for`] from the listen port and `server.control_socket`.
pub fn path_from(port: u16, explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    let name = format!("rolter-{port}.sock");
    let runtime = std::env::var_os("RUNTIME_DIRECTORY").filter(|d| !d.is_empty());
    // From a shell (no `$RUNTIME_DIRECTORY`), a socket the systemd service made in its
    // `RuntimeDirectory=rolter` is the one to talk to.
    let service = Path::new(SERVICE_RUNTIME_DIR).join(&name);
    if runtime.is_none()
        && std::fs::symlink_metadata(&service).is_ok_and(|m| m.file_type().is_socket())
    {
        return service;
    }
    for var in ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"] {
        if let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            // RUNTIME_DIRECTORY may list several directories, separated by colons.
            let first = dir
                .to_string_lossy()
                .split(':')
                .next()
                .unwrap_or("")
                .to_string();
            if !first.is_empty() {
                return Path::new(&first).join(name);
            }
        }
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir()
        .join(format!("rolter-{uid}"))
        .join(name)
}

/// What the server hands out and runs.
pub struct Serving {
    /// The client listening sockets, one per worker, in worker order.
    pub listeners: Vec<OwnedFd>,
    pub admin: Option<OwnedFd>,
    pub reloads: Arc<ReloadStats>,
    /// Called once a new process took the sockets over: the owner drains and exits (and
    /// leaves the socket file, which is the new process's now).
    pub on_upgraded: Box<dyn Fn() + Send>,
    /// What `status` says (listen address, workers).
    pub describe: String,
}

/// The running control socket; removed (when still ours) on drop.
pub struct ControlServer {
    path: PathBuf,
    ino: u64,
    stop: Arc<AtomicBool>,
    handed_over: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds the control socket at `path` (replacing a stale file: callers check first
    /// that no gateway answers there) and starts its thread.
    pub fn start(path: &Path, serving: Serving) -> io::Result<ControlServer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir)?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; set server.control_socket to another path",
                        path.display()
                    ),
                ))
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let ino = std::fs::metadata(path)?.ino();
        let stop = Arc::new(AtomicBool::new(false));
        let handed_over = Arc::new(AtomicBool::new(false));
        let (stop2, handed2) = (stop.clone(), handed_over.clone());
        let thread = std::thread::Builder::new()
            .name("rolter-ctl".into())
            .spawn(move || accept_loop(listener, serving, &stop2, &handed2))?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            ino,
            stop,
            handed_over,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // After a handover the file is the new process's (it bound its own at this path).
        let ours = std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino);
        if ours && !self.handed_over.load(Ordering::Relaxed) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(listener: UnixListener, serving: Serving, stop: &AtomicBool, handed: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = handle(stream, &serving, handed, stop) {
                    tracing::warn!("control socket request failed: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn read_line(stream: &UnixStream, timeout: Duration) -> io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    let mut line = String::new();
    BufReader::new(stream).take(256).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

fn handle(
    mut stream: UnixStream,
    serving: &Serving,
    handed: &AtomicBool,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let request = read_line(&stream, REQUEST_TIMEOUT)?;
    match request.as_str() {
        "status" => writeln!(
            stream,
            "rolter pid {} {}",
            std::process::id(),
            serving.describe
        ),
        "reload" => {
            // The reload waits for every worker to switch; the answer says how it went.
            match serving.reloads.trigger() {
                Ok(r) => write!(stream, "ok\n{r}\n"),
                Err(e) => write!(stream, "error {}\n{e}\n", e.label()),
            }
        }
        "upgrade" => {
            if handed.load(Ordering::Relaxed) {
                return writeln!(stream, "error this gateway has already been handed over");
            }
            let mut fds: Vec<RawFd> = serving.listeners.iter().map(|f| f.as_raw_fd()).collect();
            if let Some(a) = &serving.admin {
                fds.push(a.as_raw_fd());
            }
            let head = format!(
                "fds {} {}\n",
                serving.listeners.len(),
                u8::from(serving.admin.is_some())
            );
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(head.as_bytes())],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .map_err(io::Error::from)?;
            tracing::info!("upgrade: listening sockets sent to the new process; waiting for it");
            match wait_ready(&stream, stop) {
                Ok(l) if l == "ready" => {
                    handed.store(true, Ordering::Relaxed);
                    writeln!(stream, "draining")?;
                    tracing::info!("upgrade: the new process serves; draining this one");
                    (serving.on_upgraded)();
                    Ok(())
                }
                other => {
                    tracing::warn!(
                        "upgrade abandoned by the new process ({other:?}); this process keeps serving"
                    );
                    Ok(())
                }
            }
        }
        other => writeln!(
            stream,
            "error unknown request `{other}`: send reload, upgrade or status"
        ),
    }
}

/// The new process's answer after the sockets were sent, waited for up to
/// [`UPGRADE_TIMEOUT`] in short reads, so a stop of this process is not held up by it.
fn wait_ready(stream: &UnixStream, stop: &AtomicBool) -> io::Result<String> {
    let deadline = std::time::Instant::now() + UPGRADE_TIMEOUT;
    while std::time::Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        match read_line(stream, Duration::from_millis(250)) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            other => return other,
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "no answer from the new process",
    ))
}

/// Asks the gateway at `path` what it is (`None`: nothing answers there).
pub fn status(path: &Path) -> Option<String> {
    let mut s = UnixStream::connect(path).ok()?;
    s.write_all(b"status\n").ok()?;
    let line = read_line(&s, REQUEST_TIMEOUT).ok()?;
    (!line.is_empty()).then_some(line)
}

/// Asks the gateway at `path` to reload: `Ok(report)` when it applied the new file,
/// `Err(message)` with every error when it refused (or cannot be reached).
pub fn request_reload(path: &Path) -> Result<String, String> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        format!(
            "no gateway answers on the control socket {}: {e} (is it running with this configuration?)",
            path.display()
        )
    })?;
    s.write_all(b"reload\n").map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    match answer.split_once('\n') {
        Some(("ok", rest)) => Ok(rest.trim_end().to_string()),
        Some((_, rest)) => Err(rest.trim_end().to_string()),
        None => Err(format!("unexpected answer from the gateway: {answer:?}")),
    }
}

/// The listening sockets taken over from a running gateway, and the connection on which
/// to tell it to drain.
pub struct Handover {
    pub listeners: Vec<TcpListener>,
    pub admin: Option<TcpListener>,
    stream: UnixStream,
}

/// Asks the gateway at `path` for its listening sockets.
pub fn take_over(path: &Path) -> io::Result<Handover> {
    let mut stream = UnixStream::connect(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "--upgrade: no running gateway answers on {}: {e}; start without --upgrade",
                path.display()
            ),
        )
    })?;
    stream.write_all(b"upgrade\n")?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = [0u8; 64];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel installed these descriptors in this process for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    let text = String::from_utf8_lossy(&head[..n]).to_string();
    let mut words = text.split_whitespace();
    let (clients, admin) = match (words.next(), words.next(), words.next()) {
        (Some("fds"), Some(c), Some(a)) => (c.parse::<usize>().unwrap_or(0), a == "1"),
        _ => {
            return Err(io::Error::other(format!(
                "--upgrade: the running gateway answered {:?}",
                text.trim()
            )))
        }
    };
    if fds.len() != clients + usize::from(admin) || clients == 0 {
        return Err(io::Error::other(format!(
            "--upgrade: expected {} sockets, received {}",
            clients + usize::from(admin),
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let listeners: Vec<TcpListener> = fds.by_ref().take(clients).map(TcpListener::from).collect();
    let admin = fds.next().map(TcpListener::from);
    for l in listeners.iter().chain(admin.iter()) {
        l.set_nonblocking(true)?;
    }
    Ok(Handover {
        listeners,
        admin,
        stream,
    })
}

impl Handover {
    /// Tells the old gateway this process serves; it drains and exits.
    pub fn ready(mut self) -> io::Result<()> {
        self.stream.write_all(b"ready\n")?;
        let line = read_line(&self.stream, REQUEST_TIMEOUT)?;
        if line == "draining" {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "the old gateway answered {line:?} instead of draining"
            )))
        }
    }
}
