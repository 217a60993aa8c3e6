//! One worker: accept loop, connection tasks, and the periodic tick (pool eviction, drain).
//!
//! Owns a worker thread's runtime and its `WorkerState`. It must not share that state with
//! any other thread: everything cross-core arrives by message.

use std::net::TcpListener as StdListener;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpListener;

use crate::config::Config;
use crate::engine_state::view::EngineView;
use crate::pricing::PriceBook;
use crate::proxy::conn;
use crate::proxy::state::WorkerState;
use crate::signals::exchange::WorkerLinks;
use crate::strategy::Switches;
use crate::upstream::tls::UpstreamTls;

/// The signal tick: how often a worker publishes its load snapshot and records and drains
/// its inbox. A change on one core reaches every other core's view within one tick (plus the
/// time a busy worker takes to reach its tick); see docs/architecture.md.
pub const SIGNAL_TICK: Duration = Duration::from_millis(2);

/// Housekeeping (pool eviction, shutdown checks) runs every this many signal ticks (100 ms).
const HOUSEKEEPING_EVERY: u32 = 50;

/// Shared flags the gateway handle uses to stop workers.
pub struct Control {
    /// Stop accepting; finish in-flight requests.
    pub drain: AtomicBool,
    /// Grace period over (or immediate stop): exit now.
    pub stop: AtomicBool,
}

/// What one worker starts with.
pub struct WorkerSetup {
    pub id: usize,
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub listener: StdListener,
    pub control: Arc<Control>,
    pub prices: Arc<PriceBook>,
    pub switches: Arc<Switches>,
    /// The engines' own state (KV index, stream liveness), shared by every core.
    pub engine: EngineView,
    pub links: WorkerLinks,
    /// How many workers the gateway runs.
    pub workers: usize,
}

/// The body of a worker thread, run inside its runtime.
pub async fn run(setup: WorkerSetup) {
    let WorkerSetup {
        id,
        config,
        tls,
        listener,
        control,
        prices,
        switches,
        engine,
        links,
        workers,
    } = setup;
    let state = Rc::new(WorkerState::new(
        id, config, tls, &prices, &switches, &engine, links, workers,
    ));
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = id, "cannot register listener: {e}");
            return;
        }
    };
    // An accept is never abandoned mid-flight (an io_uring accept completing into a dropped
    // future would leak the connection); to stop accepting, the socket is shut down, which
    // fails the pending accept.
    let listen_fd = listener.as_raw_fd();
    let accept_state = state.clone();
    let accept_control = control.clone();
    monoio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    monoio::spawn(conn::serve(accept_state.clone(), stream, peer));
                }
                Err(e) => {
                    if accept_control.drain.load(Ordering::Relaxed) {
                        break;
                    }
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(worker = id, "accept failed: {e}");
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    let mut listening = true;
    let mut ticks = 0u32;
    loop {
        monoio::time::sleep(SIGNAL_TICK).await;
        state.signal_tick();
        ticks += 1;
        if ticks < HOUSEKEEPING_EVERY && !control.stop.load(Ordering::Relaxed) {
            continue;
        }
        ticks = 0;
        state.pool.evict_expired(std::time::Instant::now());
        if control.stop.load(Ordering::Relaxed) {
            break;
        }
        if control.drain.load(Ordering::Relaxed) {
            if listening {
                // SAFETY: the fd belongs to the listener, which lives in the accept task
                // until that task sees the failed accept.
                unsafe { libc::shutdown(listen_fd, libc::SHUT_RDWR) };
                listening = false;
            }
            state.draining.set(true);
            if state.active_requests.get() == 0 {
                break;
            }
        }
    }
    state.signal_tick();
    state.pool.clear();
}
