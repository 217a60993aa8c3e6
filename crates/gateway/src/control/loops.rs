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

use super::probe::{self, ProbeError};
use super::thread_state::Plane;
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

/// What one target's periodic task holds: the target, the TLS settings and the plane it
/// reports to, and whether it should go on.
pub struct TargetLoop {
    pub t: usize,
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub plane: Rc<RefCell<Plane>>,
    pub run: Running,
}

impl TargetLoop {
    /// `GET path` on the target, with its TLS settings, at its current address.
    async fn get(&self, path: &str, timeout: Duration) -> Result<(u16, Vec<u8>), ProbeError> {
        let params = self.tls.get(self.t).map(|x| x.params());
        let addr = self.plane.borrow().dns.addr(self.t);
        probe::get(&self.config.targets[self.t], addr, params, path, timeout).await
    }

    /// As [`TargetLoop::get`], the body of a 2xx answer.
    async fn get_body(&self, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        probe::ok_body(self.get(path, timeout).await)
    }
}

/// Scrapes one target's metrics on the configured interval.
pub async fn scrape_loop(l: TargetLoop) {
    let (t, cfg) = (l.t, &l.config.scrape);
    let path = l.config.targets[t]
        .metrics_path
        .as_deref()
        .unwrap_or(&cfg.path);
    let lora = l.plane.borrow().lora.wanted(t);
    every(cfg.interval, &l.run, || async {
        let result =
            l.get_body(path, cfg.timeout)
                .await
                .and_then(|body| match std::str::from_utf8(&body) {
                    Ok(text) => scrape::parse_families(text).map_err(|e| e.to_string()),
                    Err(_) => Err("the metrics body is not UTF-8".to_string()),
                });
        if !l.run.on() {
            return;
        }
        let now = Instant::now();
        let mut p = l.plane.borrow_mut();
        if let (true, Ok(families)) = (lora, &result) {
            p.lora
                .scraped(t, rolter_engine::lora::lora_info(families), now);
        }
        // A data-parallel rank reads its own series of the engine's exposition.
        let rank = l.config.targets[t].dp.as_ref().map(|d| d.rank);
        p.scraped(
            t,
            result.map(|f| match rank {
                Some(r) => scrape::extract_rank(&f, r),
                None => scrape::extract(&f),
            }),
            now,
        );
        p.stir.poke();
    })
    .await;
}

/// Probes one target's health path on the configured interval.
pub async fn health_loop(l: TargetLoop) {
    let (t, cfg) = (l.t, &l.config.health);
    let path = l.config.targets[t]
        .health_path
        .as_deref()
        .unwrap_or(&cfg.path);
    every(cfg.interval, &l.run, || async {
        let result = l.get(path, cfg.timeout).await;
        let ok = matches!(result, Ok((s, _)) if (200..300).contains(&s));
        let detail = match &result {
            Ok((s, _)) => format!("answered {s}"),
            Err(e) => e.to_string(),
        };
        if l.run.on() {
            let mut p = l.plane.borrow_mut();
            p.probed(t, ok, &detail, Instant::now());
            p.stir.poke();
        }
    })
    .await;
}

/// Polls one target's `GET /v1/models` on the scrape interval, for its adapter list.
pub async fn models_loop(l: TargetLoop) {
    let (t, cfg) = (l.t, &l.config.scrape);
    let path = format!("{}/v1/models", l.config.targets[t].base_path);
    every(cfg.interval, &l.run, || async {
        let result = l
            .get_body(&path, cfg.timeout)
            .await
            .and_then(|body| rolter_engine::lora::parse_models(&body).map(|m| m.adapters));
        if l.run.on() {
            let mut p = l.plane.borrow_mut();
            p.lora.listed(t, result, Instant::now());
            p.stir.poke();
        }
    })
    .await;
}
