//! The LoRA residency signal, as the gateway builds it: every scrape period each engine's
//! `vllm:lora_requests_info` (running and waiting adapters, `max_lora`) and its
//! `GET /v1/models` adapter list go into the control thread's own [`LoraBook`], whose
//! published [`LoraTable`](rolter::engine::lora::LoraTable) a worker's [`LoraView`]
//! answers per candidate, exactly as the gateway's candidate filter fills `Candidate::lora`. Between
//! scrapes the signal is as stale as the gateway's.
//!
//! Owns the book, the view and the scrape schedule; it must not change an engine or pick a
//! target.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter::core::Residency;
use rolter::engine::lora::{LoraInfo, LoraView};
use rolter::engine::lora_book::LoraBook;
use rolter::strategy::Strategy;

use crate::engine::Engine;

/// The gateway's LoRA signal over a simulated fleet.
pub struct LoraFeed {
    book: LoraBook,
    view: LoraView,
    /// Adapter names by index (what the engines report and requests name).
    names: Arc<[String]>,
    period_ns: u64,
    next_ns: u64,
}

/// A configuration with `[metrics_scrape]` on every one of `n` targets at `period` and a
/// `lora_aware` route, parsed by the gateway's own loader.
fn scrape_config(n: usize, period: Duration) -> rolter::config::Config {
    let ms = (period.as_millis() as u64).max(1);
    let head = format!("[metrics_scrape]\ninterval = \"{ms}ms\"\ntimeout = \"{ms}ms\"\n\n");
    crate::fleet::fleet_config(n, &head, "lora_aware")
}

impl LoraFeed {
    /// A feed for `n` targets scraped every `period`, for the route strategy `route`
    /// (the book tracks targets only for strategies that read residency).
    pub fn new(
        n: usize,
        period: Duration,
        route: &[Box<dyn Strategy>],
        names: Arc<[String]>,
    ) -> Self {
        let config = scrape_config(n, period);
        let period = config.scrape.interval;
        LoraFeed {
            book: LoraBook::new(
                &rolter::gateway::control::thread_state::engine_fleet(&config),
                &[route[0].needs()],
            ),
            view: LoraView::default(),
            names,
            period_ns: (period.as_nanos() as u64).max(1),
            next_ns: 0,
        }
    }

    /// Scrapes every engine when a scrape period began at or before `now_ns` since the
    /// last one, and publishes the table to the view. Engines change only at events, so
    /// their state now is their state at the scrape instant.
    pub fn scrape_due(&mut self, now_ns: u64, engines: &[Engine], base: Instant) {
        if now_ns < self.next_ns {
            return;
        }
        let tick = now_ns / self.period_ns * self.period_ns;
        self.next_ns = tick + self.period_ns;
        let at = base + Duration::from_nanos(tick);
        let name = |a: u32| self.names[a as usize].clone();
        for (t, e) in engines.iter().enumerate() {
            let info = e.adapters.as_ref().map(|s| LoraInfo {
                max_lora: Some(s.params().max_loras as u32),
                running: s.running().map(name).collect(),
                waiting: s.waiting().into_iter().map(name).collect(),
            });
            self.book.scraped(t, info, at);
            // Every engine registers every adapter.
            self.book.listed(t, Ok(self.names.to_vec()), at);
        }
        if let Some(table) = self.book.publishable(at) {
            self.view.apply(table);
        }
    }

    /// Fills `residency` with each target's residency of `model` (indexed by target).
    pub fn residency(&self, model: &str, residency: &mut [Residency]) {
        let lookup = self.view.lookup(model);
        for (t, r) in residency.iter_mut().enumerate() {
            *r = lookup.residency(t);
        }
    }
}
