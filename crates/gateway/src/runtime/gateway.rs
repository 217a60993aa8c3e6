//! The gateway handle: binds the listeners, starts the workers, and stops them.
//!
//! `Gateway::start` returns once every worker is listening, so callers (the CLI, tests,
//! the demo) can connect at once; it takes a validated configuration and never parses one.

use std::io;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolter_config::prices::price_book;
use rolter_config::Config;
use rolter_core::Switches;

use super::control_thread::{self, ControlContext};
use super::driver::{self, ActiveDriver};
use super::engine_threads::EngineThreads;
use super::listener;
use super::worker::{self, WorkerSetup};
use crate::access_log::AccessLog;
use crate::lifecycle::Lifecycle;
use crate::mesh::mesh;
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

pub struct Gateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    driver: ActiveDriver,
    lifecycle: Arc<Lifecycle>,
    workers: Vec<JoinHandle<()>>,
    control_thread: Option<JoinHandle<()>>,
    switches: Arc<Switches>,
    /// The engine-state threads (KV events), when some target publishes.
    engine: Option<EngineThreads>,
    /// The access-log writer thread, unless `log.access = "off"`.
    access_log: Option<AccessLog>,
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
        let (access_log, access_sink) = AccessLog::start(&config.log.access)?.unzip();
        let (mut worker_links, control_links) = mesh(count);
        let config = Arc::new(config);
        let switches = Arc::new(Switches::new(config.adaptive.enabled));
        let (engine, kv_view) = EngineThreads::start(&config)?;
        let strategies = Arc::new(StrategyFactory::new(
            &config,
            price_book(&config),
            switches.clone(),
            kv_view,
        ));
        // Local tokenizers run off the workers' event loops, on one pool the workers share.
        #[cfg(feature = "local-tokenizer")]
        let local_tokenizers = config.routes.iter().any(|r| r.tokenizer.is_some());
        #[cfg(not(feature = "local-tokenizer"))]
        let local_tokenizers = false;
        let blocking = local_tokenizers.then(|| monoio::blocking::DefaultThreadPool::new(count));
        let lifecycle = Arc::new(Lifecycle::default());
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
            let lifecycle = lifecycle.clone();
            let strategies = strategies.clone();
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
                            lifecycle,
                            strategies,
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
        let control_thread = control_thread::spawn(ControlContext {
            config: config.clone(),
            tls: tls.clone(),
            links: control_links,
            switches: switches.clone(),
            flags: lifecycle.clone(),
            admin,
            driver,
            workers: count,
            kv_reports: engine.kv_reports(),
            strategies,
            access: access_sink,
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
            lifecycle,
            workers,
            control_thread: Some(control_thread),
            switches,
            engine: Some(engine),
            access_log,
        })
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
        self.lifecycle.start_drain();
        let deadline = Instant::now() + grace;
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
        if let Some(e) = self.engine.take() {
            e.stop();
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
