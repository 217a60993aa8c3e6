//! The gateway handle: binds the listeners, starts the workers, reloads the configuration,
//! and stops them.
//!
//! `Gateway::start` returns once every worker is listening, so callers (the CLI, tests,
//! the demo) can connect at once; it takes a validated configuration and never parses one
//! (a reload from the file does, through the supervisor).

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolter_config::prices::price_book;
use rolter_config::Config;
use rolter_core::Switches;

use super::control_thread::{self, ControlContext};
use super::discovery;
use super::driver::{self, ActiveDriver};
use super::engine_threads::EngineThreads;
use super::listener;
use super::supervisor::Supervisor;
use super::worker::{self, Handoff, WorkerSetup, WorkerShared};
use crate::access_log::AccessLog;
use crate::fleet::inbox::{Doorbell, NewsInbox};
use crate::fleet::news::FleetControl;
use crate::fleet::{StoreLink, StoreStats};
use crate::lifecycle::Lifecycle;
use crate::mesh::admission::RouteQueues;
use crate::mesh::caps::{ConnectionCap, TargetCaps};
use crate::mesh::key_limits::KeyBook;
use crate::mesh::mesh;
use crate::mesh::polling::PollStats;
use crate::mesh::WorkerLinks;
use crate::notify;
use crate::reload::{ReloadError, ReloadReport, ReloadStats};
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

pub struct Gateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    driver: ActiveDriver,
    lifecycle: Arc<Lifecycle>,
    workers: Vec<JoinHandle<()>>,
    control_thread: Option<JoinHandle<()>>,
    /// The state thread (with `[state]`): it ends once the workers and the control thread
    /// are gone, after writing what was still waiting.
    state_thread: Option<JoinHandle<()>>,
    switches: Arc<Switches>,
    /// Duplicates of the listening sockets (client, then admin), handed to a new process
    /// on a binary upgrade; closed when the drain starts.
    listen_fds: Vec<OwnedFd>,
    admin_fd: Option<OwnedFd>,
    /// The running configuration and the engine-state threads, and how to reload them.
    supervisor: Arc<Mutex<Supervisor>>,
    reloads: Arc<ReloadStats>,
    /// The access-log writer thread, unless `log.access = "off"`.
    access_log: Option<AccessLog>,
}

impl Gateway {
    /// Binds the client listener and starts `config.server.workers` pinned workers.
    pub fn start(config: Config) -> io::Result<Gateway> {
        let count = config.server.workers.max(1);
        let listeners = listener::bind_all(config.server.listen, count)?;
        let admin = match &config.admin {
            Some(a) => Some(listener::bind_admin(a.listen)?),
            None => None,
        };
        Gateway::start_on(config, listeners, admin)
    }

    /// Starts on listening sockets bound elsewhere (a binary upgrade hands over the running
    /// process's sockets): one client listener per worker, and the admin listener when
    /// `[admin]` is configured.
    pub fn start_on(
        config: Config,
        listeners: Vec<std::net::TcpListener>,
        admin: Option<std::net::TcpListener>,
    ) -> io::Result<Gateway> {
        let driver = driver::resolve(config.server.driver)?;
        // One immutable TLS client configuration per trust setting, shared by every worker.
        let tls = Arc::new(UpstreamTls::build(&config.targets).map_err(io::Error::other)?);
        let count = check_worker_count(&config, &listeners)?;
        let sockets = Sockets::duplicate(&listeners, admin.as_ref())?;
        let (access_log, access_sink) = AccessLog::start(&config.log.access)?.unzip();
        let (tracer, tracing) = config
            .tracing
            .as_ref()
            .map(crate::trace::start)
            .transpose()?
            .unzip();
        let (worker_links, control_links) = mesh(count);
        let config = Arc::new(config);
        let switches = Arc::new(Switches::new(config.adaptive.enabled));
        let (engine, kv_view) = EngineThreads::start(&config)?;
        let strategies = Arc::new(StrategyFactory::new(
            &config,
            price_book(&config),
            switches.clone(),
            kv_view.clone(),
        ));
        let reloads = Arc::new(ReloadStats::new(
            config.source.display().to_string(),
            config.digest.clone(),
        ));
        let state = StateThread::spawn(&config, sockets.addr.port())?;
        let store = state.as_ref().map(|s| s.link.clone());
        let shared = shared_for_workers(&config, tls, strategies, count, (store, tracer.clone()));
        let workers = WorkerThreads::spawn(&shared, driver, listeners, worker_links)?;
        let (fleet, state_thread) = StateThread::split(state, &config);
        let (adopt_tx, adopts) = crossbeam_channel::unbounded();
        let control_thread = control_thread::spawn(ControlContext {
            config: config.clone(),
            tls: shared.tls.clone(),
            links: control_links,
            switches: switches.clone(),
            flags: shared.lifecycle.clone(),
            admin,
            driver,
            workers: count,
            kv_reports: engine.kv_reports(),
            strategies: shared.strategies.clone(),
            adopts,
            reloads: reloads.clone(),
            keys: shared.keys.clone(),
            poll_stats: shared.poll_stats.clone(),
            access: access_sink,
            fleet,
            tracer,
        })?;
        let supervisor = Arc::new(Mutex::new(Supervisor {
            config: config.clone(),
            caps: shared.caps,
            keys: shared.keys,
            engine: Some(engine),
            kv_view,
            switches: switches.clone(),
            adopt: adopt_tx,
            handoffs: workers.handoffs,
            stats: reloads.clone(),
            lifecycle: shared.lifecycle.clone(),
            tracing,
        }));
        install_reload_hook(&config, &reloads, &supervisor);
        // Detached: it holds the supervisor weakly and ends with the gateway.
        discovery::spawn(
            Arc::downgrade(&supervisor),
            reloads.clone(),
            shared.lifecycle.clone(),
        )?;
        wait_until_listening(&workers.ready, count)?;
        announce(&config, &sockets, count, driver, workers.pinned);
        Ok(Gateway {
            addr: sockets.addr,
            admin_addr: sockets.admin_addr,
            driver,
            lifecycle: shared.lifecycle,
            workers: workers.handles,
            control_thread: Some(control_thread),
            state_thread,
            switches,
            listen_fds: sockets.listen_fds,
            admin_fd: sockets.admin_fd,
            supervisor,
            reloads,
            access_log,
        })
    }

    /// Duplicates of the listening sockets (one per worker, and the admin listener), for a
    /// new process taking over (`rolter run --upgrade`).
    pub fn listening_sockets(&self) -> io::Result<(Vec<OwnedFd>, Option<OwnedFd>)> {
        let clients = self
            .listen_fds
            .iter()
            .map(|f| f.try_clone())
            .collect::<io::Result<Vec<_>>>()?;
        let admin = self.admin_fd.as_ref().map(|f| f.try_clone()).transpose()?;
        Ok((clients, admin))
    }

    /// Reloads the configuration file the gateway was started with (SIGHUP, `rolter
    /// reload`, `POST /admin/reload`): applied when it loads and needs no restart; refused,
    /// with every error and nothing changed, otherwise.
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        self.reloads.trigger()
    }

    /// Applies an already loaded configuration, as [`Gateway::reload`] does.
    pub fn reload_with(&self, config: Config) -> Result<ReloadReport, ReloadError> {
        self.supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reload_with(config)
    }

    /// Reload counts and the running configuration's identity.
    pub fn reloads(&self) -> &Arc<ReloadStats> {
        &self.reloads
    }

    /// Makes the access-log writer reopen its file before its next line (after logrotate
    /// moved it away). Never waits; a no-op when the log goes to stdout or is off.
    pub fn reopen_logs(&self) {
        if let Some(log) = &self.access_log {
            log.reopen();
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address, when `[admin]` is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Run-time switches (the adaptive kill switch), as the admin API flips them.
    pub fn switches(&self) -> &Arc<Switches> {
        &self.switches
    }

    pub fn driver(&self) -> ActiveDriver {
        self.driver
    }

    /// Stops accepting, lets in-flight requests finish for up to `grace`, then stops.
    pub fn shutdown(mut self, grace: Duration) {
        self.stop_workers(grace);
    }

    fn stop_workers(&mut self, grace: Duration) {
        // The workers stop accepting; this handle's copies must not keep the sockets open.
        self.listen_fds.clear();
        self.admin_fd = None;
        let deadline = Instant::now() + grace;
        self.lifecycle.start_drain(deadline);
        notify::stopping(&format!(
            "draining for up to {}",
            humantime::format_duration(grace)
        ));
        // Room for the drain and the threads' exit past a shorter TimeoutStopSec=.
        notify::extend_timeout(grace + Duration::from_secs(10));
        while self.workers.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.lifecycle.stop();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(c) = self.control_thread.take() {
            let _ = c.join();
        }
        // Every sender is gone: the state thread writes what was waiting (bounded by its
        // command timeouts) and ends; a store that does not answer does not hold the exit.
        if let Some(s) = self.state_thread.take() {
            let until = Instant::now() + Duration::from_secs(2);
            while !s.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            if s.is_finished() {
                let _ = s.join();
            }
        }
        let (engine, tracing) = {
            let mut s = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
            (s.engine.take(), s.tracing.take())
        };
        if let Some(e) = engine {
            e.stop();
        }
        // Every worker is gone: the exporter sends what they recorded (within its timeout).
        if let Some(t) = tracing {
            t.shutdown();
        }
        // The control thread (the only sender) is gone: the writer ends after the last line.
        if let Some(log) = self.access_log.take() {
            log.stop();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.stop_workers(Duration::ZERO);
        }
    }
}

/// Checks there is one client listener per configured worker; the worker count.
fn check_worker_count(config: &Config, listeners: &[std::net::TcpListener]) -> io::Result<usize> {
    let count = listeners.len();
    if count != config.server.workers.max(1) {
        return Err(io::Error::other(format!(
            "{} listening sockets for {} workers",
            count,
            config.server.workers.max(1)
        )));
    }
    Ok(count)
}

/// What every worker shares on the first configuration: fresh admission counters, key
/// windows, connection count and polling time, and one lifecycle.
fn shared_for_workers(
    config: &Arc<Config>,
    tls: Arc<UpstreamTls>,
    strategies: Arc<StrategyFactory>,
    workers: usize,
    (store, tracer): (Option<StoreLink>, Option<crate::trace::Tracer>),
) -> WorkerShared {
    WorkerShared {
        config: config.clone(),
        tls,
        caps: TargetCaps::new(&config.targets, None),
        queues: RouteQueues::new(config),
        keys: KeyBook::new(&config.keys.keys, None),
        connections: Arc::new(ConnectionCap::default()),
        poll_stats: Arc::new(PollStats::default()),
        lifecycle: Arc::new(Lifecycle::default()),
        strategies,
        workers,
        store,
        tracer,
    }
}

/// The listening sockets' addresses, and the handle's duplicates of them.
struct Sockets {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    listen_fds: Vec<OwnedFd>,
    admin_fd: Option<OwnedFd>,
}

impl Sockets {
    /// Reads the addresses and duplicates the client listeners and the admin one.
    fn duplicate(
        listeners: &[std::net::TcpListener],
        admin: Option<&std::net::TcpListener>,
    ) -> io::Result<Sockets> {
        let addr = listeners[0].local_addr()?;
        let listen_fds = listeners
            .iter()
            .map(|l| l.try_clone().map(OwnedFd::from))
            .collect::<io::Result<Vec<_>>>()?;
        let admin_fd = admin
            .map(|l| l.try_clone().map(OwnedFd::from))
            .transpose()?;
        let admin_addr = admin.map(|l| l.local_addr()).transpose()?;
        Ok(Sockets {
            addr,
            admin_addr,
            listen_fds,
            admin_fd,
        })
    }
}

/// The state thread, when a `[state]` store is configured: the workers reach it through
/// `link`, the control thread sends it the load and receives its news.
struct StateThread {
    link: StoreLink,
    news: (NewsInbox, Doorbell),
    stats: Arc<StoreStats>,
    handle: JoinHandle<()>,
}

impl StateThread {
    /// Starts the state thread when `config` has a `[state]` store; `port` names the
    /// replica when the store settings do not.
    fn spawn(config: &Arc<Config>, port: u16) -> io::Result<Option<StateThread>> {
        let Some(state) = &config.state else {
            return Ok(None);
        };
        let replica = crate::fleet::thread::replica_name(state, port);
        let stats = Arc::new(StoreStats::new(
            "redis",
            match &state.topology {
                rolter_config::StateTopology::Standalone => "standalone",
                rolter_config::StateTopology::Sentinel { .. } => "sentinel",
                rolter_config::StateTopology::Cluster => "cluster",
            },
            state.urls.clone(),
            &state.key_prefix,
            &replica,
        ));
        let (tx, rx) = crossbeam_channel::bounded(crate::fleet::link::QUEUE);
        let (news_tx, inbox, doorbell) = crate::fleet::inbox::inbox();
        let handle = crate::fleet::thread::spawn(
            state.clone(),
            replica,
            config.clone(),
            rx,
            news_tx,
            stats.clone(),
        )?;
        let link = StoreLink::new(tx, state.pick_timeout, stats.clone());
        Ok(Some(StateThread {
            link,
            news: (inbox, doorbell),
            stats,
            handle,
        }))
    }

    /// Splits the state thread into the control thread's end of the fleet plane and the
    /// thread to join on the stop.
    fn split(
        state: Option<StateThread>,
        config: &Arc<Config>,
    ) -> (Option<FleetControl>, Option<JoinHandle<()>>) {
        match state {
            Some(s) => (
                Some(FleetControl::new(s.link, s.news, s.stats, config)),
                Some(s.handle),
            ),
            None => (None, None),
        }
    }
}

/// The worker threads, started, with what the rest of the start needs from them.
struct WorkerThreads {
    handles: Vec<JoinHandle<()>>,
    /// Each worker's end for reloaded configurations, for the supervisor.
    handoffs: Vec<crossbeam_channel::Sender<Handoff>>,
    /// One message per worker: its runtime started, or the error it failed with.
    ready: mpsc::Receiver<io::Result<()>>,
    /// Whether the workers are pinned to cores.
    pinned: bool,
}

impl WorkerThreads {
    /// Starts one worker thread per listener, each pinned to a core when
    /// `server.pin_workers` is set.
    fn spawn(
        shared: &WorkerShared,
        driver: ActiveDriver,
        listeners: Vec<std::net::TcpListener>,
        links: Vec<WorkerLinks>,
    ) -> io::Result<WorkerThreads> {
        let count = listeners.len();
        // Local tokenizers run off the workers' event loops, on one pool the workers share.
        #[cfg(feature = "local-tokenizer")]
        let local_tokenizers = shared.config.routes.iter().any(|r| r.tokenizer.is_some());
        #[cfg(not(feature = "local-tokenizer"))]
        let local_tokenizers = false;
        let blocking = local_tokenizers.then(|| monoio::blocking::DefaultThreadPool::new(count));
        let cores = if shared.config.server.pin_workers {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let (ready_tx, ready) = mpsc::channel::<io::Result<()>>();
        let mut threads = WorkerThreads {
            handles: Vec::with_capacity(count),
            handoffs: Vec::with_capacity(count),
            ready,
            pinned: !cores.is_empty(),
        };
        for ((id, listener), links) in listeners.into_iter().enumerate().zip(links) {
            let (handoff_tx, handoffs) = crossbeam_channel::unbounded();
            threads.handoffs.push(handoff_tx);
            let launch = WorkerLaunch {
                driver,
                blocking: blocking.clone(),
                core: (!cores.is_empty()).then(|| cores[id % cores.len()]),
                ready: ready_tx.clone(),
            };
            threads.handles.push(launch.spawn(WorkerSetup {
                id,
                shared: shared.clone(),
                listener,
                links,
                handoffs,
            })?);
        }
        Ok(threads)
    }
}

/// How one worker thread runs: its runtime's driver and blocking pool, its core, and where
/// it says its runtime started.
struct WorkerLaunch {
    driver: ActiveDriver,
    blocking: Option<monoio::blocking::DefaultThreadPool>,
    core: Option<core_affinity::CoreId>,
    ready: mpsc::Sender<io::Result<()>>,
}

impl WorkerLaunch {
    /// Starts the worker's thread: pinned, then its runtime, then the worker.
    fn spawn(self, setup: WorkerSetup) -> io::Result<JoinHandle<()>> {
        let WorkerLaunch {
            driver,
            blocking,
            core,
            ready,
        } = self;
        std::thread::Builder::new()
            .name(format!("rolter-w{}", setup.id))
            .spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                let started = ready.clone();
                let result = driver::block_on_with(driver, blocking, async move {
                    let _ = started.send(Ok(()));
                    worker::run(setup).await;
                });
                if let Err(e) = result {
                    let _ = ready.send(Err(e));
                }
            })
    }
}

/// With a configuration file, makes a reload (SIGHUP, `rolter reload`, the admin API) load
/// it and apply it through the supervisor, telling the service manager.
fn install_reload_hook(
    config: &Config,
    reloads: &ReloadStats,
    supervisor: &Arc<Mutex<Supervisor>>,
) {
    if !config.source.is_file() {
        return;
    }
    let sup = supervisor.clone();
    reloads.set_hook(Arc::new(move || {
        notify::reloading();
        let result = sup.lock().unwrap_or_else(|e| e.into_inner()).reload_file();
        notify::reloaded(&match &result {
            Ok(report) => report.to_string(),
            Err(e) => format!("reload refused, the running configuration serves: {e}"),
        });
        result
    }));
}

/// Waits until each of the `count` workers has started its runtime (up to 10 s each).
fn wait_until_listening(ready: &mpsc::Receiver<io::Result<()>>, count: usize) -> io::Result<()> {
    for _ in 0..count {
        match ready.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(io::Error::other("a worker failed to start its runtime"));
            }
        }
    }
    Ok(())
}

/// Logs where the gateway listens and whether clients need an API key, and tells the
/// service manager it is ready.
fn announce(config: &Config, sockets: &Sockets, count: usize, driver: ActiveDriver, pinned: bool) {
    let addr = sockets.addr;
    tracing::info!(
        %addr,
        workers = count,
        driver = driver.label(),
        pinned,
        "rolter listening"
    );
    if let Some(a) = sockets.admin_addr {
        tracing::info!(%a, "admin listening");
    }
    if config.keys.is_empty() {
        tracing::warn!(
            "no [[keys]] are configured: the gateway is open, every client is served \
             without an API key (see \"API keys\" in docs/operations.md)"
        );
    } else {
        tracing::info!(
            keys = config.keys.keys.len(),
            "client API keys required (Authorization: Bearer or x-api-key)"
        );
    }
    let (label, s) = (driver.label(), if count == 1 { "" } else { "s" });
    notify::ready(&format!("listening on {addr}, {count} worker{s} ({label})"));
}
