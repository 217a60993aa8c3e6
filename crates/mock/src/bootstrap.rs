//! An SGLang prefill's bootstrap server: a separate HTTP listener (`bootstrap_port`) the
//! decode of each room calls, `POST /mock/bootstrap {"room": N}` or `GET
//! /mock/bootstrap?room=N`. It answers 200 once a prefill request holds the room (waiting
//! up to `handshake_timeout` for one to come, so either leg may arrive first), which wakes
//! that prefill, and 404 past the time limit. `GET /health` answers 200.
//!
//! One thread accepts, one thread serves each connection (keep-alive); request parsing
//! reuses the engine's HTTP parser. Owns the listener only; rooms live in the `pd`
//! module's state.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Body, Length, Parse};
use crate::pd::{self, Pd, POLL};

/// How often blocked loops look at the stop flag.
const TICK: Duration = Duration::from_millis(20);

/// The running bootstrap server; stopped by [`Bootstrap::shutdown`].
pub(crate) struct Bootstrap {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Bootstrap {
    /// Binds `addr` (port 0 picks one) and serves the rooms of `pd`.
    pub fn start(addr: SocketAddr, pd: Arc<Pd>) -> std::io::Result<Bootstrap> {
        let listener = TcpListener::bind(addr)?;
        let addr = pd::advertised(listener.local_addr()?);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rolter-mock-bootstrap".into())
            .spawn(move || accept_loop(listener, pd, flag))?;
        Ok(Bootstrap {
            addr,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The bound address (loopback when bound to any address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; open connections end at their next request or tick.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, pd: Arc<Pd>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the listener's live fd.
        let n = unsafe { libc::poll(&mut pfd, 1, TICK.as_millis() as libc::c_int) };
        if n <= 0 {
            continue;
        }
        let Ok((stream, _)) = listener.accept() else {
            std::thread::sleep(TICK);
            continue;
        };
        let (pd, stop) = (pd.clone(), stop.clone());
        let _ = std::thread::Builder::new()
            .name("rolter-mock-bootstrap-conn".into())
            .spawn(move || serve(stream, &pd, &stop));
    }
}

/// Serves one connection until the client closes it, asks to, or the server stops.
fn serve(mut stream: TcpStream, pd: &Pd, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(TICK));
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Acquire) {
        match http::parse(&buf, true) {
            Parse::Done(mut head, body, consumed) => {
                let rec = head.record.take().expect("parse records when asked to");
                let body: &[u8] = match &body {
                    Body::Range(a, b) => &buf[*a..*b],
                    Body::Owned(v) => v,
                };
                let (status, answer) = route(pd, &rec.method, &rec.path, body, stop);
                buf.drain(..consumed);
                if !respond(&mut stream, status, &answer, head.close) || head.close {
                    return;
                }
            }
            Parse::Partial(_) => match stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if is_timeout(&e) => {}
                Err(_) => return,
            },
            Parse::Error(status, msg) => {
                respond(
                    &mut stream,
                    status,
                    &crate::api::error_body(status, msg),
                    true,
                );
                return;
            }
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn respond(stream: &mut TcpStream, status: u16, body: &[u8], close: bool) -> bool {
    let mut out = Vec::with_capacity(160 + body.len());
    let len = Length::Fixed(body.len());
    http::write_head(&mut out, status, "application/json", len, close, b"", None);
    out.extend_from_slice(body);
    stream.write_all(&out).is_ok()
}

/// The room a handshake names: `?room=N` or a JSON body `{"room": N}`.
fn room_of(path: &str, body: &[u8]) -> Option<u64> {
    let query = path.split_once('?').map(|(_, q)| q).unwrap_or("");
    let from_query = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("room="))
        .and_then(|v| v.parse().ok());
    from_query.or_else(|| {
        let v: Value = serde_json::from_slice(body).ok()?;
        v.get("room")?.as_u64()
    })
}

fn route(pd: &Pd, method: &str, path: &str, body: &[u8], stop: &AtomicBool) -> (u16, Vec<u8>) {
    let bare = path.split('?').next().unwrap_or("");
    match (method, bare) {
        ("GET", "/health") => (200, Vec::new()),
        ("GET" | "POST", "/mock/bootstrap") => match room_of(path, body) {
            Some(room) => handshake(pd, room, stop),
            None => {
                let msg = "the handshake needs a room: {\"room\": N} or ?room=N";
                (400, crate::api::error_body(400, msg))
            }
        },
        (_, "/mock/bootstrap" | "/health") => {
            (405, crate::api::error_body(405, "Method Not Allowed"))
        }
        _ => (404, crate::api::error_body(404, "Not Found")),
    }
}

/// Waits (up to the handshake timeout) for a prefill request to hold `room`.
fn handshake(pd: &Pd, room: u64, stop: &AtomicBool) -> (u16, Vec<u8>) {
    let deadline = Instant::now() + pd.cfg.handshake_timeout;
    loop {
        if pd.connect_room(room) {
            let body = serde_json::json!({"room": room, "engine_id": pd.engine_id});
            return (200, body.to_string().into_bytes());
        }
        if Instant::now() >= deadline || stop.load(Ordering::Acquire) {
            let msg = format!("no prefill request holds bootstrap_room {room}");
            return (404, crate::api::error_body(404, &msg));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_comes_from_the_query_or_the_body() {
        assert_eq!(room_of("/mock/bootstrap?x=1&room=42", b""), Some(42));
        assert_eq!(room_of("/mock/bootstrap", br#"{"room":7}"#), Some(7));
        assert_eq!(room_of("/mock/bootstrap", b""), None);
    }
}
