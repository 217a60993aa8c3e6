//! The control thread's periodic tasks, one per target and kind: the metrics scrape, the
//! active health check, and (for routes that read LoRA residency) the model-list poll.
//! Each updates the plane between awaits.
//!
//! Owns the schedule only; what a result means is the plane's and the engine crate's.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_config::Config;
use rolter_engine::scrape;

use super::plane::Plane;
use super::probe;
use crate::lifecycle::Lifecycle;
use crate::upstream::tls::UpstreamTls;

/// Runs `probe` every `interval` (measured from the start of one run to the next) until
/// the gateway stops.
async fn every<F, Fut>(interval: Duration, flags: &Lifecycle, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    while !flags.stopped() {
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
    flags: Arc<Lifecycle>,
) {
    let target = &config.targets[t];
    let cfg = &config.scrape;
    let path = target.metrics_path.as_deref().unwrap_or(&cfg.path);
    let lora = plane.borrow().lora.wanted(t);
    every(cfg.interval, &flags, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get_body(target, addr, params, path, cfg.timeout)
            .await
            .and_then(|body| match std::str::from_utf8(&body) {
                Ok(text) => scrape::parse_families(text).map_err(|e| e.to_string()),
                Err(_) => Err("the metrics body is not UTF-8".to_string()),
            });
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
    flags: Arc<Lifecycle>,
) {
    let target = &config.targets[t];
    let cfg = &config.health;
    let path = target.health_path.as_deref().unwrap_or(&cfg.path);
    every(cfg.interval, &flags, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get(target, addr, params, path, cfg.timeout).await;
        let ok = matches!(result, Ok((s, _)) if (200..300).contains(&s));
        let detail = match &result {
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => e.to_string(),
        };
        plane.borrow_mut().probed(t, ok, &detail, Instant::now());
    })
    .await;
}

/// Polls one target's `GET /v1/models` on the scrape interval, for its adapter list.
pub async fn models_loop(
    t: usize,
    config: Arc<Config>,
    tls: Arc<UpstreamTls>,
    plane: Rc<RefCell<Plane>>,
    flags: Arc<Lifecycle>,
) {
    let target = &config.targets[t];
    let cfg = &config.scrape;
    let path = format!("{}/v1/models", target.base_path);
    every(cfg.interval, &flags, || async {
        let params = tls.get(t).map(|x| x.params());
        let addr = plane.borrow().dns.addr(t);
        let result = probe::get_body(target, addr, params, &path, cfg.timeout)
            .await
            .and_then(|body| rolter_engine::lora::parse_models(&body).map(|m| m.adapters));
        plane.borrow_mut().lora.listed(t, result, Instant::now());
    })
    .await;
}
