//! The control thread: its own monoio runtime (the workers' driver) running the admin
//! listener, the control plane's periodic tasks, and the tick (2 ms; 0.5 ms when the load is
//! shared across replicas) that folds the workers' messages in and publishes the targets'
//! signals to every worker. Once no worker has sent a record for a second (an idle
//! gateway) the tick slows to 100 ms, until a worker sends again, a probe, scrape or model
//! listing delivers a result, or the gateway is nudged. On a reload it adopts the new
//! configuration's plane and mesh, and folds what the replaced one's requests still report
//! until the last of them ends.
//!
//! Owns the thread and the composition of its tasks; what they do is `control`'s and
//! `admin`'s.

use std::cell::RefCell;
use std::io;
use std::net::TcpListener as StdListener;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rolter_config::Config;
use rolter_core::Switches;
use rolter_engine::kv::reports::KvReports;

use super::driver::{self, ActiveDriver};
use crate::access_log::AccessSink;
use crate::admin;
use crate::control::loops::{self, Running};
use crate::control::thread_state::Plane;
use crate::lifecycle::Lifecycle;
use crate::mesh::{ControlLinks, Kind, ToControl, ToWorker};
use crate::notify;
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

/// Everything the control thread runs with.
pub struct ControlContext {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub links: ControlLinks,
    pub switches: Arc<Switches>,
    pub flags: Arc<Lifecycle>,
    /// The admin listener, bound before any worker starts.
    pub admin: Option<StdListener>,
    pub driver: ActiveDriver,
    pub workers: usize,
    /// The KV-event plane's reports, shown on `/metrics`.
    pub kv_reports: Option<KvReports>,
    /// Builds the routes' mirror strategies (what `/admin/targets` shows they learned).
    pub strategies: Arc<StrategyFactory>,
    /// Reloaded configurations to adopt.
    pub adopts: Receiver<Adopt>,
    /// Reload counts and the running configuration's identity, for `/metrics` and the
    /// admin API.
    pub reloads: Arc<crate::reload::ReloadStats>,
    /// The client API keys' counts, for `/metrics`.
    pub keys: Arc<crate::mesh::key_limits::KeyBook>,
    /// The access-log writer's input (`None` when the access log is off).
    pub access: Option<AccessSink>,
    /// The workers' busy-polling time.
    pub poll_stats: Arc<crate::mesh::polling::PollStats>,
    /// The trace exporter (`[tracing]`), whose counters `/metrics` shows.
    pub tracer: Option<crate::trace::Tracer>,
    /// The fleet plane's control end, when `[state]` is configured.
    pub fleet: Option<crate::fleet::news::FleetControl>,
}

/// A reloaded configuration for the control thread: its plane is built from these, and the
/// workers' records arrive on `links` from now on.
pub struct Adopt {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub links: ControlLinks,
    pub strategies: Arc<StrategyFactory>,
    pub keys: Arc<crate::mesh::key_limits::KeyBook>,
    pub kv_reports: Option<KvReports>,
    /// The trace exporter of the new configuration (`[tracing]`).
    pub tracer: Option<crate::trace::Tracer>,
    /// Told once the new plane runs.
    pub done: Sender<()>,
}

/// The control thread sleeps through quiet ticks once no worker has sent it a record for
/// this long.
const QUIET_AFTER: Duration = Duration::from_secs(1);

/// A quiet control thread's tick.
const QUIET_TICK: Duration = Duration::from_millis(100);

/// Starts the control thread.
pub fn spawn(ctx: ControlContext) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rolter-control".into())
        .spawn(move || {
            let driver = ctx.driver;
            if let Err(e) = driver::block_on(driver, run(ctx)) {
                tracing::error!("control thread runtime failed: {e}");
            }
        })
}

/// The body of the control thread, run inside its runtime.
async fn run(ctx: ControlContext) {
    let mut control = Control::start(ctx);
    let mut watchdog = notify::Watchdog::from_env();
    let mut due = Instant::now() + control.tick_period();
    loop {
        if control.quiet(Instant::now()) {
            control.sleep_quietly().await;
        } else if control.wait(due).await {
            // Another replica's news: to the workers now, the rest at the tick.
            control.deliver_news();
            continue;
        }
        due = Instant::now() + control.tick_period();
        if let Ok(a) = control.adopts.try_recv() {
            control.adopt(a);
        }
        let now = Instant::now();
        if let Some(w) = watchdog.as_mut() {
            w.tick(now);
        }
        control.tick(now);
        if control.flags.stopped() {
            break;
        }
    }
    // What the workers sent last (their final records, the last access-log entries).
    control.drain(Instant::now());
}

/// The control thread's running state: the current plane and mesh, and the inboxes of
/// replaced configurations still reporting.
struct Control {
    plane: Rc<RefCell<Plane>>,
    links: ControlLinks,
    switches: Arc<Switches>,
    flags: Arc<Lifecycle>,
    workers: usize,
    adopts: Receiver<Adopt>,
    reloads: Arc<crate::reload::ReloadStats>,
    fleet: Option<Rc<RefCell<crate::fleet::news::FleetControl>>>,
    /// Rung as the store's news arrives (with `[state]`).
    doorbell: Option<crate::fleet::inbox::Doorbell>,
    /// The current probe loops.
    running: Running,
    /// Inboxes of replaced configurations whose routes and targets sit at the same indices
    /// as the current plane's, so their records fold into it.
    folding: Vec<Receiver<ToControl>>,
    /// Inboxes whose records cannot fold into the current plane (a reload moved routes or
    /// targets), each group with the plane of its own indices: its access-log lines name the
    /// old routes and targets right.
    kept: Vec<(Vec<Receiver<ToControl>>, Plane)>,
    /// When a tick last found a worker's records (or the plane was adopted). A quiet
    /// worker's heartbeat (a load snapshot every 5 s) does not keep the thread awake.
    last_news: Instant,
}

impl Control {
    /// Builds the first plane, serves the admin API and starts the probe loops.
    fn start(ctx: ControlContext) -> Control {
        let ControlContext {
            config,
            tls,
            links,
            switches,
            flags,
            admin,
            workers,
            kv_reports,
            strategies,
            adopts,
            reloads,
            keys,
            access,
            fleet,
            poll_stats,
            tracer,
            ..
        } = ctx;
        let plane = Rc::new(RefCell::new(Plane::new(
            config.clone(),
            switches.clone(),
            &strategies,
            workers,
            links.drops.clone(),
        )));
        plane.borrow_mut().kv_reports = kv_reports;
        plane.borrow_mut().keys = Some(keys);
        plane.borrow_mut().reloads = Some(reloads.clone());
        plane.borrow_mut().access = access;
        plane.borrow_mut().poll_stats = Some(poll_stats);
        plane.borrow_mut().tracer = tracer;
        let mut fleet = fleet;
        let doorbell = fleet.as_mut().and_then(|f| f.doorbell.take());
        let fleet = fleet.map(|f| Rc::new(RefCell::new(f)));
        plane.borrow_mut().fleet = fleet.clone();
        if let Some(listener) = admin {
            serve_admin(listener, &plane, &switches, &flags, &reloads);
        }
        let running = Running::new(flags.clone());
        spawn_loops(&config, &tls, &plane, &running);
        Control {
            plane,
            links,
            switches,
            flags,
            workers,
            adopts,
            reloads,
            fleet,
            doorbell,
            running,
            folding: Vec::new(),
            kept: Vec::new(),
            last_news: Instant::now(),
        }
    }

    /// Switches to a reloaded configuration's plane and mesh; the replaced plane's inbox
    /// folds on, and the probe loops restart when what they probe changed.
    fn adopt(&mut self, a: Adopt) {
        let old_config = self.plane.borrow().config.clone();
        let old_wanted = lora_wanted(&self.plane.borrow());
        let mut next = Plane::new(
            a.config.clone(),
            self.switches.clone(),
            &a.strategies,
            self.workers,
            a.links.drops.clone(),
        );
        next.kv_reports = a.kv_reports;
        next.keys = Some(a.keys);
        next.reloads = Some(self.reloads.clone());
        next.access = self.plane.borrow().access.clone();
        next.poll_stats = self.plane.borrow().poll_stats.clone();
        next.tracer = a.tracer;
        next.fleet = self.fleet.clone();
        if let Some(f) = &self.fleet {
            f.borrow_mut().adopt(&a.config);
        }
        let fold = next.same_indices(&old_config);
        self.last_news = Instant::now();
        let mut old = std::mem::replace(&mut *self.plane.borrow_mut(), next);
        self.plane.borrow_mut().inherit(&mut old);
        let old_links = std::mem::replace(&mut self.links, a.links);
        self.folding.push(old_links.inbox);
        if !fold {
            // Every inbox that folded into the replaced plane still does.
            self.kept.push((std::mem::take(&mut self.folding), old));
        }
        // Probe loops hold their target's index and settings: a new set runs unless
        // the targets and every probe setting are what they were.
        let same_probes = rolter_config::reload::same_targets(&old_config, &a.config)
            && rolter_config::reload::same(&old_config.health, &a.config.health)
            && rolter_config::reload::same(&old_config.scrape, &a.config.scrape)
            && lora_wanted(&self.plane.borrow()) == old_wanted;
        if !same_probes {
            self.running = self.running.replace();
            spawn_loops(&a.config, &a.tls, &self.plane, &self.running);
        }
        let _ = a.done.send(());
    }

    /// One control tick: folds the workers' records in and publishes what changed (target
    /// signals, LoRA residency, resolved addresses) to every worker, and ticks the fleet
    /// plane.
    fn tick(&mut self, now: Instant) {
        let mut p = self.plane.borrow_mut();
        drain_retired(&mut p, &mut self.folding, &mut self.kept, now);
        if p.drain(&self.links.inbox, now) > 0 {
            self.last_news = now;
        }
        p.log_mesh_drops(now);
        let links = &self.links;
        if let Some(signals) = p.publishable(now) {
            links.broadcast(Kind::Targets, || ToWorker::Targets(signals.clone()));
        }
        if let Some(table) = p.lora.publishable(now) {
            links.broadcast(Kind::Lora, || ToWorker::Lora(table.clone()));
        }
        if let Some(addrs) = p.dns.tick(now) {
            links.broadcast(Kind::Targets, || ToWorker::Addrs(addrs.clone()));
        }
        if let Some(f) = &self.fleet {
            let keys = p.keys.clone();
            f.borrow_mut()
                .tick(now, |t| p.in_flight(t), keys.as_deref(), links);
        }
    }

    /// How often the control thread drains the workers' messages and publishes target
    /// signals: the workers' signal tick (2 ms, or the fleet tick of a replica that shares
    /// its load, whose counts then leave for the store within about a millisecond).
    fn tick_period(&self) -> Duration {
        super::worker::signal_tick_of(&self.plane.borrow().config)
    }

    /// Whether the control thread may sleep through a quiet tick: no worker has sent a
    /// record for [`QUIET_AFTER`], no replaced configuration still reports, the fleet
    /// plane (which ticks its store) is off, and the gateway is neither draining nor
    /// stopping.
    fn quiet(&self, now: Instant) -> bool {
        self.fleet.is_none()
            && self.folding.is_empty()
            && self.kept.is_empty()
            && !self.flags.draining()
            && !self.flags.stopped()
            && now.saturating_duration_since(self.last_news) >= QUIET_AFTER
    }

    /// Sleeps through a quiet tick: [`QUIET_TICK`], or less when a worker sends (it rings
    /// the mesh's bell while this sleeps), one of the control thread's own tasks delivers
    /// a result (a probe, a scrape, a model listing), or the gateway nudges (a reload, a
    /// drain, a stop).
    async fn sleep_quietly(&mut self) {
        // Counts the nudges from here: one that comes before the wait starts ends it.
        let nudged = self.flags.nudged(Lifecycle::CONTROL);
        let door = &mut self.links.bell;
        door.sleep();
        // Sent before the bell could ring: seen here instead.
        if !self.links.inbox.is_empty() || !self.adopts.is_empty() {
            door.wake();
            return;
        }
        {
            let stir = self.plane.borrow().stir.clone();
            let sleep = std::pin::pin!(monoio::time::sleep(QUIET_TICK));
            let rung = std::pin::pin!(door.rung());
            let nudged = std::pin::pin!(nudged);
            let stirred = std::pin::pin!(stir.stirred());
            let mut parts = (sleep, rung, nudged, stirred);
            std::future::poll_fn(|cx| {
                use std::future::Future;
                let (sleep, rung, nudged, stirred) = &mut parts;
                if sleep.as_mut().poll(cx).is_ready()
                    || rung.as_mut().poll(cx).is_ready()
                    || nudged.as_mut().poll(cx).is_ready()
                    || stirred.as_mut().poll(cx).is_ready()
                {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await;
        }
        self.links.bell.wake();
    }

    /// Waits until `due` (false) or, sooner, for the store's news (true).
    async fn wait(&mut self, due: Instant) -> bool {
        use std::future::Future;
        let Some(bell) = self.doorbell.as_mut() else {
            monoio::time::sleep_until(due.into()).await;
            return false;
        };
        let mut sleep = std::pin::pin!(monoio::time::sleep_until(due.into()));
        let mut rung = std::pin::pin!(bell.rung());
        std::future::poll_fn(|cx| {
            if sleep.as_mut().poll(cx).is_ready() {
                std::task::Poll::Ready(false)
            } else if rung.as_mut().poll(cx).is_ready() {
                std::task::Poll::Ready(true)
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// Hands the store's news to the workers between ticks.
    fn deliver_news(&self) {
        if let Some(f) = &self.fleet {
            let keys = self.plane.borrow().keys.clone();
            f.borrow().deliver_news(keys.as_deref(), &self.links);
        }
    }

    /// Folds in what every inbox still holds.
    fn drain(&mut self, now: Instant) {
        let mut p = self.plane.borrow_mut();
        drain_retired(&mut p, &mut self.folding, &mut self.kept, now);
        p.drain(&self.links.inbox, now);
    }
}

/// Serves the admin API on `listener` (logged when it cannot be registered).
fn serve_admin(
    listener: StdListener,
    plane: &Rc<RefCell<Plane>>,
    switches: &Arc<Switches>,
    flags: &Arc<Lifecycle>,
    reloads: &Arc<crate::reload::ReloadStats>,
) {
    match monoio::net::TcpListener::from_std(listener) {
        Ok(l) => {
            monoio::spawn(admin::serve(
                l,
                plane.clone(),
                switches.clone(),
                flags.clone(),
                reloads.clone(),
            ));
        }
        Err(e) => tracing::error!("cannot register the admin listener: {e}"),
    }
}

/// Folds what replaced configurations' requests still report, and forgets an inbox once
/// every worker has dropped its configuration.
fn drain_retired(
    current: &mut Plane,
    folding: &mut Vec<Receiver<ToControl>>,
    kept: &mut Vec<(Vec<Receiver<ToControl>>, Plane)>,
    now: Instant,
) {
    folding.retain(|inbox| !current.drain_retired(inbox, now));
    kept.retain_mut(|(inboxes, plane)| {
        inboxes.retain(|inbox| !plane.drain_retired(inbox, now));
        !inboxes.is_empty()
    });
}

/// Per target: whether its model list is polled (some route reads LoRA residency).
fn lora_wanted(plane: &Plane) -> Vec<bool> {
    (0..plane.config.targets.len())
        .map(|t| plane.lora.wanted(t))
        .collect()
}

/// Starts the probe loops of `config`'s targets (scrape, model list, health), ended by
/// `running`'s replacement or the stop.
fn spawn_loops(
    config: &Arc<Config>,
    tls: &Arc<UpstreamTls>,
    plane: &Rc<RefCell<Plane>>,
    running: &Running,
) {
    for (t, target) in config.targets.iter().enumerate() {
        let target_loop = || loops::TargetLoop {
            t,
            config: config.clone(),
            tls: tls.clone(),
            plane: plane.clone(),
            run: running.clone(),
        };
        if config.scrape.enabled && target.scrape {
            monoio::spawn(loops::scrape_loop(target_loop()));
        }
        if plane.borrow().lora.wanted(t) {
            monoio::spawn(loops::models_loop(target_loop()));
        }
        if plane.borrow().health.probed(t) {
            monoio::spawn(loops::health_loop(target_loop()));
        }
    }
}
