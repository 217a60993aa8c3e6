//! The control thread: its own monoio runtime (the workers' driver) running the admin
//! listener, the control plane's periodic tasks, and the 2 ms tick that folds the workers'
//! messages in and publishes the targets' signals to every worker.
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

use rolter_config::Config;
use rolter_core::Switches;
use rolter_engine::kv::reports::KvReports;

use super::driver::{self, ActiveDriver};
use crate::access_log::AccessSink;
use crate::admin;
use crate::control::loops;
use crate::control::plane::Plane;
use crate::lifecycle::Lifecycle;
use crate::mesh::{ControlLinks, Kind, ToWorker};
use crate::strategies::StrategyFactory;
use crate::upstream::tls::UpstreamTls;

/// How often the control thread drains the workers' messages and publishes target
/// signals (the same period as the workers' signal tick).
const CONTROL_TICK: Duration = Duration::from_millis(2);

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
    /// The access-log writer's input (`None` when the access log is off).
    pub access: Option<AccessSink>,
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
        strategies,
        access,
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
    plane.borrow_mut().access = access;

    if let Some(listener) = admin {
        match monoio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                let token = config.admin.as_ref().and_then(|a| a.token.clone());
                monoio::spawn(admin::serve(
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
            monoio::spawn(loops::scrape_loop(
                t,
                config.clone(),
                tls.clone(),
                plane.clone(),
                flags.clone(),
            ));
        }
        if plane.borrow().lora.wanted(t) {
            monoio::spawn(loops::models_loop(
                t,
                config.clone(),
                tls.clone(),
                plane.clone(),
                flags.clone(),
            ));
        }
        if plane.borrow().health.probed(t) {
            monoio::spawn(loops::health_loop(
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
            p.log_mesh_drops(now);
            if let Some(signals) = p.publishable(now) {
                links.broadcast(Kind::Targets, || ToWorker::Targets(signals.clone()));
            }
            if let Some(table) = p.lora.publishable(now) {
                links.broadcast(Kind::Lora, || ToWorker::Lora(table.clone()));
            }
        }
        if flags.stopped() {
            break;
        }
    }
    // What the workers sent last (their final records, the last access-log entries).
    plane.borrow_mut().drain(&links.inbox, Instant::now());
}
