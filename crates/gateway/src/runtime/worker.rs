//! One worker: accept loop, connection tasks, the periodic tick (pool eviction, drain), and
//! the switch to a reloaded configuration.
//!
//! Owns a worker thread's runtime and its `WorkerState`s. It must not share that state with
//! any other thread: everything cross-core arrives by message.

use std::future::Future;
use std::net::TcpListener as StdListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use monoio::io::Canceller;
use monoio::net::TcpListener;
use rolter_config::Config;

use super::busy_poll;
use crate::lifecycle::Lifecycle;
use crate::mesh::caps::{ConnectionCap, TargetCaps};
use crate::mesh::key_limits::KeyBook;
use crate::mesh::polling::PollStats;
use crate::mesh::WorkerLinks;
use crate::path::activity::Waiter;
use crate::path::conn;
use crate::path::generation::Generations;
use crate::path::idle_timer;
use crate::path::state::{StateParts, WorkerCore, WorkerState};
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

/// The signal tick: how often a worker publishes its load snapshot and records and drains
/// its inbox. A change on one core reaches every other core's view within one tick (plus the
/// time a busy worker takes to reach its tick); see docs/architecture.md.
pub const SIGNAL_TICK: Duration = Duration::from_millis(2);

/// Housekeeping (pool eviction, shutdown checks) runs every this many signal ticks (100 ms).
const HOUSEKEEPING_EVERY: u32 = 50;

/// A core with no request in flight and no note of activity for this many ticks (100 ms)
/// is quiet: its tick slows to [`QUIET_TICK`] until the next note (a request arriving), a
/// drain, a stop or a reload. Messages from the other cores wait in its inbox meanwhile
/// (each pick drains the inbox first, so nothing is picked on an old view).
const QUIET_AFTER: u32 = 50;

/// The tick of a quiet core: every tick is then also a housekeeping one.
const QUIET_TICK: Duration = Duration::from_millis(100);

/// What one worker starts with.
pub struct WorkerSetup {
    pub id: usize,
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    /// Each target's admission counter, shared by every worker.
    pub caps: Arc<TargetCaps>,
    /// Each client API key's windows and counts, shared by every worker.
    pub keys: Arc<KeyBook>,
    /// The process's client connections, shared by every worker.
    pub connections: Arc<ConnectionCap>,
    /// Time spent busy polling, summed over every worker.
    pub poll_stats: Arc<PollStats>,
    pub listener: StdListener,
    pub lifecycle: Arc<Lifecycle>,
    /// Builds this core's instance of every route's strategy.
    pub strategies: Arc<StrategyFactory>,
    pub links: WorkerLinks,
    /// How many workers the gateway runs.
    pub workers: usize,
    /// Reloaded configurations, taken on the tick.
    pub handoffs: Receiver<Handoff>,
    /// The state thread, when `[state]` is configured.
    pub store: Option<crate::fleet::StoreLink>,
}

/// A reloaded configuration for one worker: everything its new state is built from, and
/// where to say it switched.
pub struct Handoff {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub caps: Arc<TargetCaps>,
    pub keys: Arc<KeyBook>,
    pub strategies: Arc<StrategyFactory>,
    pub links: WorkerLinks,
    /// Receives the worker's id once new requests use the new configuration.
    pub done: Sender<usize>,
}

/// Streams still running this long before the end of the drain's grace are ended with an
/// error event, so the event is written before the worker stops.
const CUT_BEFORE_STOP: Duration = Duration::from_millis(250);

/// How long a draining worker keeps idle keep-alive connections open for a request already
/// on its way (answered with `Connection: close`) before it closes them.
const DRAIN_IDLE_LINGER: Duration = Duration::from_millis(500);

/// Waits out a quiet core's tick: [`QUIET_TICK`], or less when a request arrives or the
/// gateway nudges its workers (a drain, a stop, a reload).
async fn quiet_tick(core: &WorkerCore, lifecycle: &Lifecycle, id: usize) {
    let sleep = std::pin::pin!(monoio::time::sleep(QUIET_TICK));
    let note = std::pin::pin!(core.activity.next(Waiter::Tick));
    let nudge = std::pin::pin!(lifecycle.nudged(id));
    let mut parts = (sleep, note, nudge);
    std::future::poll_fn(|cx| {
        let (sleep, note, nudge) = &mut parts;
        if sleep.as_mut().poll(cx).is_ready()
            || note.as_mut().poll(cx).is_ready()
            || nudge.as_mut().poll(cx).is_ready()
        {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// The body of a worker thread, run inside its runtime.
pub async fn run(setup: WorkerSetup) {
    let WorkerSetup {
        id,
        config,
        tls,
        caps,
        keys,
        connections,
        poll_stats,
        listener,
        lifecycle,
        strategies,
        links,
        workers,
        handoffs,
        store,
    } = setup;
    let core = Rc::new(WorkerCore::new(id, store, connections));
    let parts = StateParts {
        config,
        tls,
        caps,
        keys,
        strategies: &strategies,
        links,
    };
    let first = WorkerState::new(core.clone(), parts, workers, None);
    let worker = Rc::new(Generations::new(first));
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = id, "cannot register listener: {e}");
            return;
        }
    };
    // An accept is never abandoned mid-flight (an io_uring accept completing into a dropped
    // future would leak the connection): to stop accepting, the pending accept is cancelled
    // and awaited, and a connection it completed with is still served. The socket itself is
    // left alone (a binary upgrade hands the same socket to the new process).
    let canceller = Canceller::new();
    let cancel = canceller.handle();
    let accept_worker = worker.clone();
    let accept_lifecycle = lifecycle.clone();
    let mut accept = Some(monoio::spawn(async move {
        loop {
            if accept_lifecycle.draining() {
                break;
            }
            match listener.cancelable_accept(cancel.clone()).await {
                Ok((stream, peer)) => {
                    monoio::spawn(conn::serve(accept_worker.clone(), stream, peer));
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
    }));
    let poller_worker = worker.clone();
    busy_poll::start(core.clone(), poll_stats, move || {
        poller_worker.current().config.server.busy_poll
    });
    let mut canceller = Some(canceller);
    let mut drain_started: Option<std::time::Instant> = None;
    let mut ticks = 0u32;
    let mut quiet_for = 0u32;
    let mut notes = core.activity.count();
    loop {
        if quiet_for >= QUIET_AFTER {
            quiet_tick(&core, &lifecycle, id).await;
        } else {
            monoio::time::sleep(SIGNAL_TICK).await;
        }
        if let Ok(h) = handoffs.try_recv() {
            let parts = StateParts {
                config: h.config,
                tls: h.tls,
                caps: h.caps,
                keys: h.keys,
                strategies: &h.strategies,
                links: h.links,
            };
            let next = WorkerState::new(core.clone(), parts, workers, Some(&worker.current()));
            worker.switch(next);
            let _ = h.done.send(id);
        }
        worker.signal_tick();
        // Keep-alive timeouts and idle reads' park delays that have passed.
        idle_timer::sweep(std::time::Instant::now());
        // Places freed on other cores: this core's queued requests try again.
        core.waiters.wake_all();
        let seen = core.activity.count();
        let idle = seen == notes
            && core.active_requests.get() == 0
            && worker.retired() == 0
            && !lifecycle.draining();
        notes = seen;
        quiet_for = if idle { quiet_for.saturating_add(1) } else { 0 };
        ticks += 1;
        if quiet_for > QUIET_AFTER {
            ticks = HOUSEKEEPING_EVERY;
        }
        if ticks < HOUSEKEEPING_EVERY && !lifecycle.stopped() {
            continue;
        }
        ticks = 0;
        worker
            .current()
            .upstream
            .pool
            .evict_expired(std::time::Instant::now());
        if lifecycle.stopped() {
            break;
        }
        if lifecycle.draining() {
            if let Some(c) = canceller.take() {
                c.cancel();
                // The accept ends now; a connection it completed with is being served and
                // counts for the drain from here on.
                if let Some(task) = accept.take() {
                    task.await;
                }
            }
            core.draining.set(true);
            if core.cut_at.get().is_none() {
                let cut = lifecycle
                    .deadline()
                    .map(|d| d.checked_sub(CUT_BEFORE_STOP).unwrap_or(d));
                core.cut_at.set(cut);
            }
            let since = *drain_started.get_or_insert_with(std::time::Instant::now);
            let idle_done = core.connections.get() == 0 || since.elapsed() >= DRAIN_IDLE_LINGER;
            if core.active_requests.get() == 0 && idle_done {
                break;
            }
        }
    }
    // Stopped without a drain tick (a grace shorter than one): the accept still ends
    // before the runtime does, so no accept is left in flight.
    if let Some(c) = canceller.take() {
        c.cancel();
    }
    if let Some(task) = accept.take() {
        task.await;
    }
    worker.signal_tick();
    worker.current().upstream.pool.clear();
}
