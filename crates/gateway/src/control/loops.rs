//! The control thread's periodic tasks, one per target and kind: the metrics scrape, the
//! active health check, and (for routes that read LoRA residency) the model-list poll.
//! Each updates the plane between awaits.
//!
//! Owns the schedule only; what a result means is the plane's and the engine crate's.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_config::Config;
use rolter_engine::scrape;

use super::plane::Plane;
use super::probe;
use crate::lifecycle::Lifecycle;
use crate::upstream::tls::UpstreamTls;

/// Whether a loop should go on: until the gateway stops, or a reload replaces the set of
/// loops it belongs to (its targets or their probe settings changed).
#[derive(Clone)]
pub struct Running {
    flags: Arc<Lifecycle>,
    epoch: Rc<Cell<u64>>,
    mine: u64,
}

impl Running {
    /// Loops of the current set, ended by [`Running::replace`] or the stop flag.
    pub fn new(flags: Arc<Lifecycle>) -> Self {
        Running {
            flags,
            epoch: Rc::new(Cell::new(0)),
            mine: 0,
        }
    }

    /// Ends every loop of the current set and returns the handle for the next set.
    pub fn replace(&self) -> Running {
        let next = self.epoch.get() + 1;
        self.epoch.set(next);
        Running {
            flags: self.flags.clone(),
            epoch: self.epoch.clone(),
            mine: next,
        }
    }

    fn on(&self) -> bool {
        !self.flags.stopped() && self.epoch.get() == self.mine
    }
}

/// Runs `probe` every `interval` (measured from the start of one run to the next) until
/// the gateway stops or the loop's set is replaced.
async fn every<F, Fut>(interval: Duration, run: &Running, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    while run.on() {
        let started = Instant::now();
        probe().await;
        monoio::time::sleep(interval.saturating_sub(started.elapsed())).await;
    }
}

/// Scrapes one target's metrics on the configured interval.
pub async fn scrape_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    run: Running,
) {
    let target = &config.targets[t];
    let cfg = &config.scrape;
    let path = target.metrics_path.as_deref().unwrap_or(&cfg.path);
    let lora = plane.borrow().lora.wanted(t);
    every(cfg.interval, &run, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get_body(target, addr, params, path, cfg.timeout)
            .await
            .and_then(|body| match std::str::from_utf8(&body) {
                Ok(text) => scrape::parse_families(text).map_err(|e| e.to_string()),
                Err(_) => Err("the metrics body is not UTF-8".to_string()),
            });
        if !run.on() {
            return;
        }
        let now = Instant::now();
        let mut p = plane.borrow_mut();
        if let (true, Ok(families)) = (lora, &result) {
            p.lora
                .scraped(t, rolter_engine::lora::lora_info(families), now);
        }
        p.scraped(t, result.map(|f| scrape::extract(&f)), now);
    })
    .await;
}

/// Probes one target's health path on the configured interval.
pub async fn health_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    run: Running,
) {
    let target = &config.targets[t];
    let cfg = &config.health;
    let path = target.health_path.as_deref().unwrap_or(&cfg.path);
    every(cfg.interval, &run, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get(target, addr, params, path, cfg.timeout).await;
        let ok = matches!(result, Ok((s, _)) if (200..300).contains(&s));
        let detail = match &result {
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => e.to_string(),
        };
        if run.on() {
            plane.borrow_mut().probed(t, ok, &detail, Instant::now());
        }
    })
    .await;
}

/// Polls one target's `GET /v1/models` on the scrape interval, for its adapter list.
pub async fn models_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    run: Running,
) {
    let target = &config.targets[t];
    let cfg = &config.scrape;
    let path = format!("{}/v1/models", target.base_path);
    every(cfg.interval, &run, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get_body(target, addr, params, &path, cfg.timeout)
            .await
            .and_then(|body| rolter_engine::lora::parse_models(&body).map(|m| m.adapters));
        if run.on() {
            plane.borrow_mut().lora.listed(t, result, Instant::now());
        }
    })
    .await;
}
