//! The control thread: everything that is not request handling. It folds the workers'
//! load snapshots and attempt records into the gateway's metrics and the health book,
//! scrapes the engines' Prometheus endpoints, runs active health checks, serves the admin
//! listener, and publishes each target's eligibility and queue depth to every worker (and,
//! for routes that read it, each target's LoRA adapter residency, see [`lora`]).
//!
//! Runs on its own thread and runtime; workers reach it only through channels. It must not
//! touch a worker's state, and nothing on the request path waits for it: if it stalls, the
//! workers keep routing on their last view.

pub mod kv_plane;
pub mod lora;
pub mod plane;
pub mod probe;

use std::cell::RefCell;
use std::io;
use std::net::TcpListener as StdListener;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::runtime::driver::{self, ActiveDriver};
use crate::runtime::worker::Control;
use crate::signals::exchange::ControlLinks;
use crate::signals::scrape;
use crate::strategy::Switches;
use crate::upstream::tls::UpstreamTls;
use plane::Plane;

/// How often the control thread drains the workers' messages and publishes target
/// signals (the same period as the workers' signal tick).
const CONTROL_TICK: Duration = Duration::from_millis(2);

/// Everything the control thread runs with.
pub struct ControlContext {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub links: ControlLinks,
    pub switches: Arc<Switches>,
    pub flags: Arc<Control>,
    /// The admin listener, bound before any worker starts.
    pub admin: Option<StdListener>,
    pub driver: ActiveDriver,
    pub workers: usize,
    /// The KV-event plane's reports, shown on `/metrics`.
    pub kv_reports: Option<kv_plane::KvReports>,
}

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

async fn run(ctx: ControlContext) {
    let ControlContext {
        config,
        tls,
        links,
        switches,
        flags,
        admin,
        workers,
        kv_reports,
        ..
    } = ctx;
    let plane = Rc::new(RefCell::new(Plane::new(
        config.clone(),
        switches.clone(),
        workers,
    )));
    plane.borrow_mut().kv_reports = kv_reports;

    if let Some(listener) = admin {
        match monoio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                let token = config.admin.as_ref().and_then(|a| a.token.clone());
                monoio::spawn(crate::admin::serve(
                    l,
                    plane.clone(),
                    switches.clone(),
                    flags.clone(),
                    token,
                ));
            }
            Err(e) => tracing::error!("cannot register the admin listener: {e}"),
        }
    }

    for (t, target) in config.targets.iter().enumerate() {
        if config.scrape.enabled && target.scrape {
            monoio::spawn(scrape_loop(
                t,
                config.clone(),
                tls.clone(),
                plane.clone(),
                flags.clone(),
            ));
        }
        if plane.borrow().lora.wanted(t) {
            monoio::spawn(lora::models_loop(
                t,
                config.clone(),
                tls.clone(),
                plane.clone(),
                flags.clone(),
            ));
        }
        if plane.borrow().health.probed(t) {
            monoio::spawn(health_loop(
                t,
                config.clone(),
                tls.clone(),
                plane.clone(),
                flags.clone(),
            ));
        }
    }

    loop {
        monoio::time::sleep(CONTROL_TICK).await;
        let now = Instant::now();
        {
            let mut p = plane.borrow_mut();
            p.drain(&links.inbox, now);
            if let Some(signals) = p.publishable(now) {
                for w in &links.workers {
                    let _ =
                        w.try_send(crate::signals::exchange::ToWorker::Targets(signals.clone()));
                }
            }
            if let Some(table) = p.lora.publishable(now) {
                for w in &links.workers {
                    let _ = w.try_send(crate::signals::exchange::ToWorker::Lora(table.clone()));
                }
            }
        }
        if flags.stop.load(Ordering::Relaxed) {
            break;
        }
    }
}

/// Runs `probe` every `interval` (measured from the start of one run to the next) until
/// the gateway stops.
async fn every<F, Fut>(interval: Duration, flags: &Control, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    while !flags.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        probe().await;
        monoio::time::sleep(interval.saturating_sub(started.elapsed())).await;
    }
}

/// Scrapes one target's metrics on the configured interval.
async fn scrape_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    flags: Arc<Control>,
) {
    let target = &config.targets[t];
    let cfg = &config.scrape;
    let path = target.metrics_path.as_deref().unwrap_or(&cfg.path);
    let lora = plane.borrow().lora.wanted(t);
    every(cfg.interval, &flags, || async {
        let params = tls.get(t).map(|x| x.params());
        let result = match probe::get(target, params, path, cfg.timeout).await {
            Ok((status, body)) if (200..300).contains(&status) => {
                match std::str::from_utf8(&body) {
                    Ok(text) => scrape::parse_families(text).map_err(|e| e.to_string()),
                    Err(_) => Err("the metrics body is not UTF-8".to_string()),
                }
            }
            Ok((status, _)) => Err(format!("answered {status}")),
            Err(e) => Err(e.to_string()),
        };
        let now = Instant::now();
        let mut p = plane.borrow_mut();
        if let (true, Ok(families)) = (lora, &result) {
            p.lora
                .scraped(t, crate::signals::lora::lora_info(families), now);
        }
        p.scraped(t, result.map(|f| scrape::extract(&f)), now);
    })
    .await;
}

/// Probes one target's health path on the configured interval.
async fn health_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    flags: Arc<Control>,
) {
    let target = &config.targets[t];
    let cfg = &config.health;
    let path = target.health_path.as_deref().unwrap_or(&cfg.path);
    every(cfg.interval, &flags, || async {
        let params = tls.get(t).map(|x| x.params());
        let result = probe::get(target, params, path, cfg.timeout).await;
        let ok = matches!(result, Ok((s, _)) if (200..300).contains(&s));
        let detail = match &result {
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => e.to_string(),
        };
        plane.borrow_mut().probed(t, ok, &detail, Instant::now());
    })
    .await;
}
