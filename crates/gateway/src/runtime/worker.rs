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
use crate::mesh::admission::RouteQueues;
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
use crate::trace::Tracer;
use crate::upstream::tls::UpstreamTls;

/// The signal tick: how often a worker publishes its load snapshot and records and drains
/// its inbox. A change on one core reaches every other core's view within one tick (plus the
/// time a busy worker takes to reach its tick); see docs/architecture.md.
pub const SIGNAL_TICK: Duration = Duration::from_millis(2);

/// The signal tick of a replica that shares its load through the store (`[state]
/// share_load`): a request to a fast engine may last a couple of milliseconds, so its
/// count must leave this core well within that for the other replicas to see it while it
/// is true (and its end before the next turn of the same conversation).
pub const FLEET_TICK: Duration = Duration::from_micros(500);

/// The signal tick a configuration runs at.
pub fn signal_tick_of(config: &Config) -> Duration {
    if config.state.as_ref().is_some_and(|s| s.share_load) {
        FLEET_TICK
    } else {
        SIGNAL_TICK
    }
}

/// How many [`FLEET_TICK`]s a tick of `tick` stands for (the pace counts in them).
fn beats(tick: Duration) -> u32 {
    (tick.as_micros() / FLEET_TICK.as_micros()).max(1) as u32
}

/// Housekeeping (pool eviction, shutdown checks) runs every this many signal ticks of 2 ms
/// (100 ms, also at the fleet tick).
const HOUSEKEEPING_EVERY: u32 = 50;

/// A core with no request in flight and no note of activity for this many ticks of 2 ms
/// (100 ms)
/// is quiet: its tick slows to [`QUIET_TICK`] until the next note (a request arriving), a
/// drain, a stop or a reload. Messages from the other cores wait in its inbox meanwhile
/// (each pick drains the inbox first, so nothing is picked on an old view).
const QUIET_AFTER: u32 = 50;

/// The tick of a quiet core: every tick is then also a housekeeping one.
const QUIET_TICK: Duration = Duration::from_millis(100);

/// What every worker starts with: the process-wide state, one clone per worker.
#[derive(Clone)]
pub struct WorkerShared {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    /// Each target's admission counter, shared by every worker.
    pub caps: Arc<TargetCaps>,
    /// Each route's queue, shared by every worker.
    pub queues: Arc<RouteQueues>,
    /// Each client API key's windows and counts, shared by every worker.
    pub keys: Arc<KeyBook>,
    /// The process's client connections, shared by every worker.
    pub connections: Arc<ConnectionCap>,
    /// Time spent busy polling, summed over every worker.
    pub poll_stats: Arc<PollStats>,
    pub lifecycle: Arc<Lifecycle>,
    /// Builds this core's instance of every route's strategy.
    pub strategies: Arc<StrategyFactory>,
    /// How many workers the gateway runs.
    pub workers: usize,
    /// The state thread, when `[state]` is configured.
    pub store: Option<crate::fleet::StoreLink>,
    /// The trace exporter, when `[tracing]` is configured.
    pub tracer: Option<Tracer>,
}

/// What one worker starts with.
pub struct WorkerSetup {
    pub id: usize,
    pub shared: WorkerShared,
    pub listener: StdListener,
    pub links: WorkerLinks,
    /// Reloaded configurations, taken on the tick.
    pub handoffs: Receiver<Handoff>,
}

/// A reloaded configuration for one worker: everything its new state is built from, and
/// where to say it switched.
pub struct Handoff {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub caps: Arc<TargetCaps>,
    pub queues: Arc<RouteQueues>,
    pub keys: Arc<KeyBook>,
    pub strategies: Arc<StrategyFactory>,
    pub tracer: Option<Tracer>,
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
    let Some(mut worker) = Worker::start(setup) else {
        return;
    };
    worker.tick_loop().await;
    // Stopped without a drain tick (a grace shorter than one): the accept still ends
    // before the runtime does, so no accept is left in flight.
    worker.accept.stop().await;
    worker.generations.signal_tick();
    worker.generations.current().upstream.pool.clear();
}

/// A running worker: its state, its accept loop and the pace of its tick.
struct Worker {
    id: usize,
    core: Rc<WorkerCore>,
    /// The current configuration's state and the replaced ones still serving requests.
    generations: Rc<Generations>,
    lifecycle: Arc<Lifecycle>,
    handoffs: Receiver<Handoff>,
    workers: usize,
    accept: AcceptLoop,
    pace: Pace,
    /// When this worker first saw the drain.
    drain_started: Option<std::time::Instant>,
}

impl Worker {
    /// Builds the first state, registers the listener and starts accepting and busy
    /// polling; `None` (logged) when the listener cannot be registered.
    fn start(setup: WorkerSetup) -> Option<Worker> {
        let WorkerSetup {
            id,
            shared,
            listener,
            links,
            handoffs,
        } = setup;
        let core = Rc::new(WorkerCore::new(id, shared.store, shared.connections));
        let parts = StateParts {
            config: shared.config,
            tls: shared.tls,
            caps: shared.caps,
            queues: shared.queues,
            keys: shared.keys,
            strategies: &shared.strategies,
            tracer: shared.tracer,
            links,
        };
        let first = WorkerState::new(core.clone(), parts, shared.workers, None);
        let generations = Rc::new(Generations::new(first));
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(worker = id, "cannot register listener: {e}");
                return None;
            }
        };
        let accept = AcceptLoop::spawn(id, listener, &generations, &shared.lifecycle);
        let poller = generations.clone();
        busy_poll::start(core.clone(), shared.poll_stats, move || {
            poller.current().config.server.busy_poll
        });
        Some(Worker {
            id,
            pace: Pace::new(&core, signal_tick_of(&generations.current().config)),
            core,
            generations,
            lifecycle: shared.lifecycle,
            handoffs,
            workers: shared.workers,
            accept,
            drain_started: None,
        })
    }

    /// Ticks until the gateway stops, or the drain has nothing left to wait for.
    async fn tick_loop(&mut self) {
        loop {
            self.pace.tick = signal_tick_of(&self.generations.current().config);
            self.pace.wait(&self.core, &self.lifecycle, self.id).await;
            self.take_handoff();
            self.signal_tick();
            if !self
                .pace
                .housekeeping_due(&self.core, &self.generations, &self.lifecycle)
            {
                continue;
            }
            self.generations
                .current()
                .upstream
                .pool
                .evict_expired(std::time::Instant::now());
            if self.lifecycle.stopped() {
                break;
            }
            if self.lifecycle.draining() && self.drain_tick().await {
                break;
            }
        }
    }

    /// Switches to a reloaded configuration, when one is waiting.
    fn take_handoff(&self) {
        let Ok(h) = self.handoffs.try_recv() else {
            return;
        };
        let parts = StateParts {
            config: h.config,
            tls: h.tls,
            caps: h.caps,
            queues: h.queues,
            keys: h.keys,
            strategies: &h.strategies,
            tracer: h.tracer,
            links: h.links,
        };
        let next = WorkerState::new(
            self.core.clone(),
            parts,
            self.workers,
            Some(&self.generations.current()),
        );
        self.generations.switch(next);
        let _ = h.done.send(self.id);
    }

    /// The signal tick's work: messages in and out, timers that passed, queued requests.
    fn signal_tick(&self) {
        self.generations.signal_tick();
        // Keep-alive timeouts and idle reads' park delays that have passed.
        idle_timer::sweep(std::time::Instant::now());
        // Places freed on other cores: this core's queued requests try again.
        self.core.waiters.wake_all();
    }

    /// One housekeeping tick of the drain: stops accepting, sets when streams are cut, and
    /// says whether the worker is done (no request in flight, idle connections closed or
    /// lingered long enough).
    async fn drain_tick(&mut self) -> bool {
        // The accept ends now; a connection it completed with is being served and counts
        // for the drain from here on.
        self.accept.stop().await;
        let core = &self.core;
        core.draining.set(true);
        if core.cut_at.get().is_none() {
            let cut = self
                .lifecycle
                .deadline()
                .map(|d| d.checked_sub(CUT_BEFORE_STOP).unwrap_or(d));
            core.cut_at.set(cut);
        }
        let since = *self
            .drain_started
            .get_or_insert_with(std::time::Instant::now);
        let idle_done = core.connections.get() == 0 || since.elapsed() >= DRAIN_IDLE_LINGER;
        core.active_requests.get() == 0 && idle_done
    }
}

/// The accept loop, and how to end it.
///
/// An accept is never abandoned mid-flight (an io_uring accept completing into a dropped
/// future would leak the connection): to stop accepting, the pending accept is cancelled
/// and awaited, and a connection it completed with is still served. The socket itself is
/// left alone (a binary upgrade hands the same socket to the new process).
struct AcceptLoop {
    canceller: Option<Canceller>,
    task: Option<monoio::task::JoinHandle<()>>,
}

impl AcceptLoop {
    /// Starts accepting on `listener`, each connection served on its own task, until the
    /// drain.
    fn spawn(
        id: usize,
        listener: TcpListener,
        generations: &Rc<Generations>,
        lifecycle: &Arc<Lifecycle>,
    ) -> AcceptLoop {
        let canceller = Canceller::new();
        let cancel = canceller.handle();
        let generations = generations.clone();
        let lifecycle = lifecycle.clone();
        let task = monoio::spawn(async move {
            loop {
                if lifecycle.draining() {
                    break;
                }
                match listener.cancelable_accept(cancel.clone()).await {
                    Ok((stream, peer)) => {
                        monoio::spawn(conn::serve(generations.clone(), stream, peer));
                    }
                    Err(e) => {
                        if lifecycle.draining() {
                            break;
                        }
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(worker = id, "accept failed: {e}");
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        AcceptLoop {
            canceller: Some(canceller),
            task: Some(task),
        }
    }

    /// Cancels the pending accept and waits for the loop to end; a no-op once it has.
    async fn stop(&mut self) {
        if let Some(c) = self.canceller.take() {
            c.cancel();
        }
        if let Some(task) = self.task.take() {
            task.await;
        }
    }
}

/// The pace of a worker's tick: a housekeeping tick every [`HOUSEKEEPING_EVERY`] ticks of
/// 2 ms, and the slower [`QUIET_TICK`] once the core has been quiet for [`QUIET_AFTER`]
/// of them. It counts in [`FLEET_TICK`]s, so both keep their time at either tick.
struct Pace {
    /// Beats since the last housekeeping tick.
    ticks: u32,
    /// Beats the core has been quiet for.
    quiet_for: u32,
    /// The core's activity count at the last tick.
    notes: u64,
    /// The signal tick of the current configuration.
    tick: Duration,
}

impl Pace {
    fn new(core: &WorkerCore, tick: Duration) -> Pace {
        Pace {
            ticks: 0,
            quiet_for: 0,
            notes: core.activity.count(),
            tick,
        }
    }

    /// Beats of a 2 ms tick: the unit of the thresholds.
    fn per_tick() -> u32 {
        beats(SIGNAL_TICK)
    }

    /// Waits for the next tick: the signal tick, or a quiet core's.
    async fn wait(&self, core: &WorkerCore, lifecycle: &Lifecycle, id: usize) {
        if self.quiet_for >= QUIET_AFTER * Self::per_tick() {
            quiet_tick(core, lifecycle, id).await;
        } else {
            monoio::time::sleep(self.tick).await;
        }
    }

    /// Counts this tick (quiet or not) and says whether it is a housekeeping one: every
    /// [`HOUSEKEEPING_EVERY`] ticks, every quiet tick, and every tick once stopped.
    fn housekeeping_due(
        &mut self,
        core: &WorkerCore,
        generations: &Generations,
        lifecycle: &Lifecycle,
    ) -> bool {
        let seen = core.activity.count();
        let idle = seen == self.notes
            && core.active_requests.get() == 0
            && generations.retired() == 0
            && !lifecycle.draining();
        self.notes = seen;
        let step = beats(self.tick);
        self.quiet_for = if idle {
            self.quiet_for.saturating_add(step)
        } else {
            0
        };
        self.ticks += step;
        let every = HOUSEKEEPING_EVERY * Self::per_tick();
        if self.quiet_for > QUIET_AFTER * Self::per_tick() {
            self.ticks = every;
        }
        if self.ticks < every && !lifecycle.stopped() {
            return false;
        }
        self.ticks = 0;
        true
    }
}
