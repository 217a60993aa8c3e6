//! One worker: accept loop, connection tasks, and the periodic tick (pool eviction, drain).
//!
//! Owns a worker thread's runtime and its `WorkerState`. It must not share that state with
//! any other thread: everything cross-core arrives by message.

use std::net::TcpListener as StdListener;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpListener;
use rolter_config::Config;

use crate::lifecycle::Lifecycle;
use crate::mesh::WorkerLinks;
use crate::path::conn;
use crate::path::state::WorkerState;
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

/// The signal tick: how often a worker publishes its load snapshot and records and drains
/// its inbox. A change on one core reaches every other core's view within one tick (plus the
/// time a busy worker takes to reach its tick); see docs/architecture.md.
pub const SIGNAL_TICK: Duration = Duration::from_millis(2);

/// Housekeeping (pool eviction, shutdown checks) runs every this many signal ticks (100 ms).
const HOUSEKEEPING_EVERY: u32 = 50;

/// What one worker starts with.
pub struct WorkerSetup {
    pub id: usize,
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub listener: StdListener,
    pub lifecycle: Arc<Lifecycle>,
    /// Builds this core's instance of every route's strategy.
    pub strategies: Arc<StrategyFactory>,
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
        lifecycle,
        strategies,
        links,
        workers,
    } = setup;
    let state = Rc::new(WorkerState::new(
        id,
        config,
        tls,
        &strategies,
        links,
        workers,
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
    let accept_lifecycle = lifecycle.clone();
    monoio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    monoio::spawn(conn::serve(accept_state.clone(), stream, peer));
                }
                Err(e) => {
                    if accept_lifecycle.draining() {
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
        if ticks < HOUSEKEEPING_EVERY && !lifecycle.stopped() {
            continue;
        }
        ticks = 0;
        state.upstream.pool.evict_expired(std::time::Instant::now());
        if lifecycle.stopped() {
            break;
        }
        if lifecycle.draining() {
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
    state.upstream.pool.clear();
}
