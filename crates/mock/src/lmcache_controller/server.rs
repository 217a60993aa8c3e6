//! The controller stand-in's HTTP/1.1 front-end (LMCache's `lmcache.v1.api_server`):
//! the accept loop, one thread per connection (keep-alive, pipelining, `Connection:
//! close`), the routes and their JSON bodies, and the test hooks that delay every answer
//! or fail the queries.
//!
//! Errors use FastAPI's body shape, `{"detail": "..."}`. Request parsing reuses the
//! engine's HTTP parser (`crate::http`), so bodies may have a Content-Length or be chunked.
//! This module reads the state state; it never changes the chunk pool.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use super::pool::{LayoutEntry, Pool};
use crate::http::{self, Body, Length, Parse};

/// How often blocked loops look at the stop flag.
const TICK: Duration = Duration::from_millis(20);

/// What the HTTP side shares with the handle and the PULL thread.
pub(crate) struct State {
    pub pool: Mutex<Pool>,
    pub lookups: AtomicU64,
    /// Delay of every answer, in microseconds.
    pub delay_us: AtomicU64,
    pub failing: AtomicBool,
    pub stop: AtomicBool,
    /// Open connections: a clone of each socket (to shut it down on stop) and its thread.
    conns: Mutex<HashMap<u64, (TcpStream, JoinHandle<()>)>>,
}

impl State {
    pub fn new(pool: Pool) -> State {
        State {
            pool: Mutex::new(pool),
            lookups: AtomicU64::new(0),
            delay_us: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// Shuts every open connection down and waits for their threads (call after the
    /// accept loop has ended, so no new one comes).
    pub fn close_connections(&self) {
        let conns: Vec<_> = self.conns.lock().unwrap().drain().collect();
        for (_, (stream, thread)) in conns {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = thread.join();
        }
    }
}

/// Accepts connections until `stop`; the listener closes when this returns.
pub(crate) fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut next_id = 0u64;
    while !state.stop.load(Ordering::Acquire) {
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
            // Out of descriptors, say: do not spin.
            std::thread::sleep(TICK);
            continue;
        };
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let id = next_id;
        next_id += 1;
        // The entry goes in before the thread can finish and remove it.
        let mut conns = state.conns.lock().unwrap();
        let conn_state = state.clone();
        let spawned = std::thread::Builder::new()
            .name("rolter-mock-lmcache-http".into())
            .spawn(move || {
                serve(stream, &conn_state);
                // Dropping the entry detaches this thread's own handle.
                conn_state.conns.lock().unwrap().remove(&id);
            });
        if let Ok(thread) = spawned {
            conns.insert(id, (clone, thread));
        }
    }
}

/// One response to write.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    fn json(status: u16, body: &Json) -> Answer {
        Answer {
            status,
            body: body.to_string().into_bytes(),
        }
    }

    fn detail(status: u16, detail: &str) -> Answer {
        Answer::json(status, &serde_json::json!({ "detail": detail }))
    }
}

/// Serves one connection until the client closes it, asks to, or the server stops.
fn serve(mut stream: TcpStream, state: &State) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    let mut sent_continue = false;
    loop {
        match http::parse(&buf, true) {
            Parse::Done(mut head, body, consumed) => {
                sent_continue = false;
                let rec = head.record.take().expect("parse records when asked to");
                let body: &[u8] = match &body {
                    Body::Range(a, b) => &buf[*a..*b],
                    Body::Owned(v) => v,
                };
                let answer = route(state, &rec.method, &rec.path, body);
                buf.drain(..consumed);
                if !delay(state) || !respond(&mut stream, answer, head.close) || head.close {
                    return;
                }
            }
            Parse::Partial(expect) => {
                if expect && !sent_continue {
                    sent_continue = true;
                    if stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
                        return;
                    }
                }
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            Parse::Error(status, msg) => {
                respond(&mut stream, Answer::detail(status, msg), true);
                return;
            }
        }
        if state.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Sleeps the configured delay (in steps, so a stop cuts it short); false on stop.
fn delay(state: &State) -> bool {
    let total = Duration::from_micros(state.delay_us.load(Relaxed));
    let end = Instant::now() + total;
    loop {
        if state.stop.load(Ordering::Acquire) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(TICK));
    }
}

fn respond(stream: &mut TcpStream, a: Answer, close: bool) -> bool {
    let mut out = Vec::with_capacity(160 + a.body.len());
    http::write_head(
        &mut out,
        a.status,
        "application/json",
        Length::Fixed(a.body.len()),
        close,
        b"",
        None,
    );
    out.extend_from_slice(&a.body);
    stream.write_all(&out).is_ok()
}

fn route(state: &State, method: &str, path: &str, body: &[u8]) -> Answer {
    let path = path.split('?').next().unwrap_or("");
    let want_post = match path {
        "/lookup" | "/query_instance" => true,
        "/health" => false,
        _ => return Answer::detail(404, "Not Found"),
    };
    if (method == "POST") != want_post {
        return Answer::detail(405, "Method Not Allowed");
    }
    match path {
        "/lookup" => {
            state.lookups.fetch_add(1, Relaxed);
            if state.failing.load(Relaxed) {
                return failing();
            }
            lookup(state, body)
        }
        "/query_instance" => {
            if state.failing.load(Relaxed) {
                return failing();
            }
            query_instance(state, body)
        }
        _ => Answer::json(200, &serde_json::json!({ "status": "healthy" })),
    }
}

fn failing() -> Answer {
    Answer::detail(503, "lmcache controller is failing (set_failing)")
}

/// Parses a JSON object body: 400 when it is not JSON, 422 when it is not an object.
fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Json>, Answer> {
    match serde_json::from_slice::<Json>(body) {
        Ok(Json::Object(m)) => Ok(m),
        Ok(_) => Err(Answer::detail(422, "the body must be a JSON object")),
        Err(e) => Err(Answer::detail(400, &format!("invalid JSON body: {e}"))),
    }
}

/// `POST /lookup {"tokens": [...]}`.
fn lookup(state: &State, body: &[u8]) -> Answer {
    let obj = match json_object(body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    let Some(Json::Array(items)) = obj.get("tokens") else {
        return Answer::detail(422, "field \"tokens\" (a list of integers) is required");
    };
    let mut tokens = Vec::with_capacity(items.len());
    for t in items {
        match t.as_i64() {
            Some(v) => tokens.push(v),
            None => return Answer::detail(422, "\"tokens\" must hold integers"),
        }
    }
    let layout = state.pool.lock().unwrap().lookup(&tokens);
    Answer {
        status: 200,
        body: lookup_body(&event_id("Lookup"), &layout),
    }
}

/// `{"event_id": ..., "layout_info": {instance: [location, end], ...}}`, instances in the
/// order the lookup met them (a JSON object keeps that order on the wire).
fn lookup_body(event_id: &str, layout: &[LayoutEntry]) -> Vec<u8> {
    let entries: Vec<String> = layout
        .iter()
        .map(|e| {
            format!(
                "{}:[{},{}]",
                Json::from(e.instance_id.as_str()),
                Json::from(e.location.as_str()),
                e.matched_end
            )
        })
        .collect();
    format!(
        "{{\"event_id\":{},\"layout_info\":{{{}}}}}",
        Json::from(event_id),
        entries.join(",")
    )
    .into_bytes()
}

/// `POST /query_instance {"event_id": ..., "ip": ...}`.
fn query_instance(state: &State, body: &[u8]) -> Answer {
    let obj = match json_object(body) {
        Ok(o) => o,
        Err(a) => return a,
    };
    let (Some(Json::String(event_id)), Some(Json::String(ip))) =
        (obj.get("event_id"), obj.get("ip"))
    else {
        return Answer::detail(422, "fields \"event_id\" and \"ip\" (strings) are required");
    };
    let res = state.pool.lock().unwrap().query_instance(ip);
    Answer::json(
        200,
        &serde_json::json!({ "event_id": event_id, "res": res }),
    )
}

/// `<prefix><uuid4>`, as the API server names its events.
fn event_id(prefix: &str) -> String {
    let a = fastrand::u64(..);
    let b = fastrand::u64(..);
    format!(
        "{prefix}{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_look_like_the_api_servers() {
        let id = event_id("Lookup");
        let uuid = id.strip_prefix("Lookup").unwrap();
        let parts: Vec<&str> = uuid.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!("89ab".contains(&parts[3][..1]));
        assert!(uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn layout_keeps_the_lookup_order() {
        let layout = [
            LayoutEntry {
                instance_id: "z".into(),
                location: "LocalCPUBackend".into(),
                matched_end: 256,
            },
            LayoutEntry {
                instance_id: "a".into(),
                location: "LocalCPUBackend".into(),
                matched_end: 600,
            },
        ];
        assert_eq!(
            String::from_utf8(lookup_body("L1", &layout)).unwrap(),
            r#"{"event_id":"L1","layout_info":{"z":["LocalCPUBackend",256],"a":["LocalCPUBackend",600]}}"#
        );
        assert_eq!(
            String::from_utf8(lookup_body("L2", &[])).unwrap(),
            r#"{"event_id":"L2","layout_info":{}}"#
        );
    }
}
