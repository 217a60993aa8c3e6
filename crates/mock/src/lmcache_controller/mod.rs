//! An LMCache controller stand-in: [`Controller::start`] binds a ZMQ PULL socket that
//! LMCache workers (the mock engines' `lmcache` workers, or real ones sending JSON frames)
//! PUSH their messages to, and an HTTP server answering `POST /lookup` and
//! `POST /query_instance` as LMCache's API server does (`python -m lmcache.v1.api_server`).
//!
//! - PULL: every frame of every multipart message is one worker message (msgpack map, or
//!   JSON when it starts with `{`); see [`crate::lmcache_wire`]. Frames that do not decode
//!   as a worker message are counted and skipped.
//! - `POST /lookup {"tokens":[...]}` → `{"event_id":"Lookup<uuid>","layout_info":
//!   {"<instance_id>":["<location>",<matched_end>],...}}`, by LMCache's algorithm (walk
//!   the chunks, stop at the first one no one holds, each chunk crediting its first
//!   holder); `{}` when nothing matches.
//! - `POST /query_instance {"event_id","ip"}` → `{"event_id":...,"res":"<id>"|null}`.
//! - `GET /health` → 200; other paths 404, wrong methods 405, malformed JSON 400, a body
//!   without the fields 422; errors as `{"detail": "..."}`.
//!
//! Test hooks: [`Controller::set_delay`] delays every HTTP answer, [`Controller::set_failing`]
//! answers the queries with 503, [`Controller::shutdown`] closes both listeners.
//!
//! Fidelity limits: the chunk hash is the mock's own (so only the mock's workers match),
//! and there is no controller → worker channel (no Clear, Pin, Move, Compress or Health).
//!
//! Module map: `pool` (the chunk pool and registrations, pure state), `server` (HTTP).
//! This module owns the threads and the handle.

mod pool;
mod server;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use pool::LayoutEntry;

use crate::lmcache_wire::{Registration, WorkerMsg};
use pool::Pool;
use server::State;

/// Where the controller stand-in listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// HTTP listen address (port 0 picks a free port; see [`Controller::http_addr`]).
    pub http: SocketAddr,
    /// ZMQ bind endpoint of the PULL socket, e.g. `tcp://0.0.0.0:9100`; port 0 or `*`
    /// picks a free port (see [`Controller::pull_endpoint`]).
    pub pull: String,
    /// Tokens per chunk; must match the workers' (256, LMCache's default).
    pub chunk_size: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            pull: "tcp://127.0.0.1:0".to_string(),
            chunk_size: 256,
        }
    }
}

/// A running controller stand-in; stops on [`Controller::shutdown`] or drop.
pub struct Controller {
    state: Arc<State>,
    counters: Arc<PullCounters>,
    http_addr: SocketAddr,
    pull_endpoint: String,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the PULL thread counts.
#[derive(Default)]
struct PullCounters {
    messages: AtomicU64,
    rejected: AtomicU64,
}

fn zmq_err(what: &str, e: zmq::Error) -> io::Error {
    io::Error::other(format!("lmcache controller: {what}: {e}"))
}

impl Controller {
    /// Binds both listeners and starts their threads.
    pub fn start(cfg: ControllerConfig) -> io::Result<Controller> {
        let listener = TcpListener::bind(cfg.http)?;
        let http_addr = listener.local_addr()?;
        let ctx = zmq::Context::new();
        let pull = ctx.socket(zmq::PULL).map_err(|e| zmq_err("socket", e))?;
        pull.set_linger(0).map_err(|e| zmq_err("linger", e))?;
        pull.set_rcvhwm(1_000_000)
            .map_err(|e| zmq_err("rcvhwm", e))?;
        pull.bind(&cfg.pull)
            .map_err(|e| zmq_err(&format!("cannot bind {}", cfg.pull), e))?;
        let pull_endpoint = match pull.get_last_endpoint() {
            Ok(Ok(ep)) => ep,
            _ => cfg.pull.clone(),
        };
        let state = Arc::new(State::new(Pool::new(cfg.chunk_size)));
        let counters = Arc::new(PullCounters::default());
        let pull_thread = {
            let (state, counters) = (state.clone(), counters.clone());
            std::thread::Builder::new()
                .name("rolter-mock-lmcache-pull".into())
                .spawn(move || pull_loop(pull, &state, &counters))?
        };
        let accept_thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("rolter-mock-lmcache-accept".into())
                .spawn(move || server::accept_loop(listener, state))
        };
        let controller = Controller {
            state,
            counters,
            http_addr,
            pull_endpoint,
            threads: Mutex::new(vec![pull_thread]),
        };
        // On failure, dropping `controller` stops the PULL thread.
        controller.threads.lock().unwrap().push(accept_thread?);
        Ok(controller)
    }

    /// The bound HTTP address (with the real port when 0 was asked).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The bound PULL endpoint (with the real port when 0 was asked), for the workers'
    /// `controller` setting.
    pub fn pull_endpoint(&self) -> &str {
        &self.pull_endpoint
    }

    /// `POST /lookup` requests received (failed ones included).
    pub fn lookups(&self) -> u64 {
        self.state.lookups.load(Relaxed)
    }

    /// Delays every HTTP answer by `d` (zero turns the delay off).
    pub fn set_delay(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.state.delay_us.store(us, Relaxed);
    }

    /// While failing, `/lookup` and `/query_instance` answer 503 with a JSON error.
    pub fn set_failing(&self, failing: bool) {
        self.state.failing.store(failing, Relaxed);
    }

    /// The lookup `/lookup` would answer for these tokens (not counted in
    /// [`Controller::lookups`]).
    pub fn lookup(&self, tokens: &[u32]) -> Vec<LayoutEntry> {
        let tokens: Vec<i64> = tokens.iter().map(|&t| t.into()).collect();
        self.state.pool.lock().unwrap().lookup(&tokens)
    }

    /// The instance `/query_instance` would answer for `ip` (or `ip:port`).
    pub fn query_instance(&self, ip: &str) -> Option<String> {
        self.state.pool.lock().unwrap().query_instance(ip)
    }

    /// Registered workers (registered or heard a heartbeat from, not deregistered).
    pub fn workers(&self) -> Vec<Registration> {
        self.state.pool.lock().unwrap().workers()
    }

    /// Chunk keys held by at least one instance.
    pub fn keys(&self) -> usize {
        self.state.pool.lock().unwrap().keys()
    }

    /// Worker messages applied so far; compare with the engines'
    /// `LmcacheStats::sent_messages` to know the controller has caught up.
    pub fn messages(&self) -> u64 {
        self.counters.messages.load(Relaxed)
    }

    /// PULL frames that were not a worker message.
    pub fn rejected_frames(&self) -> u64 {
        self.counters.rejected.load(Relaxed)
    }

    /// Closes both listeners (new connections are refused; the PULL socket is gone) and
    /// the open HTTP connections, and joins the threads. Idempotent.
    pub fn shutdown(&self) {
        self.state.stop.store(true, Ordering::Release);
        let threads: Vec<_> = self.threads.lock().unwrap().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        self.state.close_connections();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The PULL thread: applies every frame until stop; the socket closes when it returns.
fn pull_loop(pull: zmq::Socket, state: &State, counters: &PullCounters) {
    while !state.stop.load(Ordering::Acquire) {
        match pull.poll(zmq::POLLIN, 20) {
            Ok(n) if n > 0 => {}
            Ok(_) | Err(zmq::Error::EINTR) => continue,
            Err(_) => return,
        }
        let Ok(frames) = pull.recv_multipart(zmq::DONTWAIT) else {
            continue;
        };
        let msgs: Vec<Option<WorkerMsg>> =
            frames.iter().map(|f| WorkerMsg::decode(f).ok()).collect();
        let mut pool = state.pool.lock().unwrap();
        for msg in msgs {
            match msg {
                Some(m) => {
                    pool.apply(m);
                    counters.messages.fetch_add(1, Relaxed);
                }
                None => {
                    counters.rejected.fetch_add(1, Relaxed);
                }
            }
        }
    }
}
