//! The gateway handle: binds the listeners, starts the workers, and stops them.
//!
//! `Gateway::start` returns once every worker is listening, so callers (the CLI, tests,
//! the demo) can connect at once; it takes a validated configuration and never parses one.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::driver::{self, ActiveDriver};
use super::listener;
use super::worker::{self, Control, WorkerSetup};
use crate::config::Config;
use crate::control::kv_plane::{KvPlane, KvPlaneOptions, KvRepair};
use crate::control::ControlContext;
use crate::engine_state::kv_index::{KvIndex, KvIndexConfig};
use crate::engine_state::kv_transport::{KvEventsEndpoint, KvTransport, KvTransportOptions};
use crate::engine_state::view::EngineView;
use crate::pricing::PriceBook;
use crate::signals::exchange::mesh;
use crate::strategy::Switches;
use crate::upstream::tls::UpstreamTls;

pub struct Gateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    driver: ActiveDriver,
    control: Arc<Control>,
    workers: Vec<JoinHandle<()>>,
    control_thread: Option<JoinHandle<()>>,
    switches: Arc<Switches>,
    /// The KV-event subscriber and index threads, when some target publishes.
    kv_plane: Option<KvPlane>,
}

/// Starts the KV-event plane when some target has `[targets.kv_events]`: the view the
/// strategies read, and the running plane. Fails before any port is bound.
fn start_kv_plane(config: &Config) -> io::Result<(EngineView, Option<KvPlane>)> {
    let subscriptions: Vec<(usize, KvEventsEndpoint)> = config
        .targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            t.kv_events.as_ref().map(|k| {
                (
                    i,
                    KvEventsEndpoint {
                        endpoint: k.endpoint.clone(),
                        replay_endpoint: k.replay_endpoint.clone(),
                        topic: k.topic.clone(),
                    },
                )
            })
        })
        .collect();
    if subscriptions.is_empty() {
        return Ok((EngineView::default(), None));
    }
    let cfg = &config.kv_events;
    let index = KvIndex::new(KvIndexConfig {
        block_size: cfg.block_size as usize,
        max_blocks_per_target: cfg.max_blocks_per_target as usize,
    })
    .map_err(io::Error::other)?;
    let view = EngineView::with_kv(index.reader(), config.targets.len());
    let can_replay = config
        .targets
        .iter()
        .map(|t| {
            t.kv_events
                .as_ref()
                .is_some_and(|k| k.replay_endpoint.is_some())
        })
        .collect();
    let (transport, frames) = KvTransport::start(subscriptions, KvTransportOptions::default())
        .map_err(|e| io::Error::other(format!("KV events: {e}")))?;
    let repair_timeout = Duration::from_secs(2);
    let repair = KvRepair::new(index, view.clone(), can_replay, repair_timeout);
    let plane = KvPlane::start(
        transport,
        frames,
        repair,
        KvPlaneOptions {
            stale_after: cfg.stale_after,
            repair_timeout,
        },
    )?;
    Ok((view, Some(plane)))
}

impl Gateway {
    /// Binds the client listener and starts `config.server.workers` pinned workers.
    pub fn start(config: Config) -> io::Result<Gateway> {
        let driver = driver::resolve(config.server.driver)?;
        // One immutable TLS client configuration per trust setting, shared by every worker.
        let tls = Arc::new(UpstreamTls::build(&config.targets).map_err(io::Error::other)?);
        let count = config.server.workers.max(1);
        let listeners = listener::bind_all(config.server.listen, count)?;
        let addr = listeners[0].local_addr()?;
        let admin = match &config.admin {
            Some(a) => {
                let l = std::net::TcpListener::bind(a.listen).map_err(|e| {
                    io::Error::new(e.kind(), format!("admin listener {}: {e}", a.listen))
                })?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;
        let (mut worker_links, control_links) = mesh(count);
        let config = Arc::new(config);
        let prices = Arc::new(PriceBook::new(&config));
        let switches = Arc::new(Switches::new(config.adaptive.enabled));
        let (engine, kv_plane) = start_kv_plane(&config)?;
        // Local tokenizers run off the workers' event loops, on one pool the workers share.
        let blocking = config
            .routes
            .iter()
            .any(|r| r.tokenizer.is_some())
            .then(|| monoio::blocking::DefaultThreadPool::new(count));
        let control = Arc::new(Control {
            drain: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let cores = if config.server.pin_workers {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let mut workers = Vec::with_capacity(count);
        for (id, l) in listeners.into_iter().enumerate() {
            let config = config.clone();
            let tls = tls.clone();
            let control = control.clone();
            let (prices, switches, engine) = (prices.clone(), switches.clone(), engine.clone());
            let blocking = blocking.clone();
            let links = worker_links.remove(0);
            let core = (!cores.is_empty()).then(|| cores[id % cores.len()]);
            let ready = ready_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("rolter-w{id}"))
                .spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    let started = ready.clone();
                    let result = driver::block_on_with(driver, blocking, async move {
                        let _ = started.send(Ok(()));
                        worker::run(WorkerSetup {
                            id,
                            config,
                            tls,
                            listener: l,
                            control,
                            prices,
                            switches,
                            engine,
                            links,
                            workers: count,
                        })
                        .await;
                    });
                    if let Err(e) = result {
                        let _ = ready.send(Err(e));
                    }
                })?;
            workers.push(handle);
        }
        drop(ready_tx);
        let control_thread = crate::control::spawn(ControlContext {
            config: config.clone(),
            tls: tls.clone(),
            links: control_links,
            switches: switches.clone(),
            flags: control.clone(),
            admin,
            driver,
            workers: count,
            kv_reports: kv_plane.as_ref().map(KvPlane::reports),
        })?;
        for _ in 0..count {
            match ready_rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(io::Error::other("a worker failed to start its runtime"));
                }
            }
        }
        tracing::info!(
            %addr,
            workers = count,
            driver = driver.label(),
            pinned = !cores.is_empty(),
            "rolter listening"
        );
        if let Some(a) = admin_addr {
            tracing::info!(%a, "admin listening");
        }
        Ok(Gateway {
            addr,
            admin_addr,
            driver,
            control,
            workers,
            control_thread: Some(control_thread),
            switches,
            kv_plane,
        })
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
        self.control.drain.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + grace;
        while self.workers.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.control.stop.store(true, Ordering::Relaxed);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(c) = self.control_thread.take() {
            let _ = c.join();
        }
        if let Some(p) = self.kv_plane.take() {
            p.stop();
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
