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
use crate::pricing::PriceBook;
use crate::proxy::conn;
use crate::proxy::state::WorkerState;
use crate::strategy::Switches;
use crate::upstream::tls::UpstreamTls;

/// How often a worker checks for shutdown and evicts stale pooled connections.
const TICK: Duration = Duration::from_millis(100);

/// Shared flags the gateway handle uses to stop workers.
pub struct Control {
    /// Stop accepting; finish in-flight requests.
    pub drain: AtomicBool,
    /// Grace period over (or immediate stop): exit now.
    pub stop: AtomicBool,
}

/// The body of a worker thread, run inside its runtime.
pub async fn run(
    id: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    listener: StdListener,
    control: Arc<Control>,
    prices: Arc<PriceBook>,
    switches: Arc<Switches>,
) {
    let state = Rc::new(WorkerState::new(id, config, tls, &prices, &switches));
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
    loop {
        monoio::time::sleep(TICK).await;
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
    state.pool.clear();
}
