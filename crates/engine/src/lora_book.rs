//! The control thread's LoRA book: per target, the latest `vllm:lora_requests_info` (from
//! the metrics scrape) and the adapters `GET /v1/models` lists (polled on the scrape
//! interval), each with its time; turned into the [`LoraTable`] the workers route on.
//!
//! Only targets of routes whose strategy reads residency ([`Needs::LORA_RESIDENCY`]) are
//! tracked, and only while `[metrics_scrape]` covers them. Either source older than
//! `[metrics_scrape].stale_after` counts as unknown. Owned by the control thread; it must
//! not block (the poll is its own task) nor reach a worker but through the published table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_core::Needs;

use crate::fleet::Fleet;
use crate::lora::{adapter_key, LoraInfo, LoraTable, Slots, TargetLora};

/// The table is re-sent at least this often even when unchanged.
const REPUBLISH: Duration = Duration::from_secs(1);

/// One target's sources.
#[derive(Debug, Default)]
struct TargetBook {
    /// The latest `lora_requests_info` series and when it was scraped.
    info: Option<(LoraInfo, Instant)>,
    /// The adapters of the latest good model list, and when it was read.
    listed: Option<(Vec<String>, Instant)>,
    /// The latest model-list error (cleared by a good read), for the admin API.
    list_error: Option<String>,
    /// Whether the last check found the sources fresh (to log transitions once).
    fresh: bool,
    /// Adapters the gateway loaded on this target (keys, with when), counted as listed for
    /// [`GATEWAY_LOAD_GRACE`] whatever the model lists say meanwhile.
    gateway_loaded: Vec<(u64, Instant)>,
}

/// How long an adapter the gateway loaded counts as listed on its target without the
/// target's model list showing it.
const GATEWAY_LOAD_GRACE: Duration = Duration::from_secs(10);

pub struct LoraBook {
    /// Per target: some route reads its residency and it is scraped.
    wanted: Vec<bool>,
    names: Vec<String>,
    stale_after: Duration,
    targets: Vec<TargetBook>,
    published: Option<Arc<LoraTable>>,
    last_publish: Option<Instant>,
}

impl LoraBook {
    /// A book for `fleet`, tracking the targets of every route whose strategy asks for
    /// residency (`route_needs`: what each route's strategy needs, in route order).
    pub fn new(fleet: &Fleet, route_needs: &[Needs]) -> Self {
        let n = fleet.targets.len();
        let mut wanted = vec![false; n];
        for (route, needs) in fleet.routes.iter().zip(route_needs) {
            if needs.contains(Needs::LORA_RESIDENCY) {
                for &t in &route.targets {
                    wanted[t] = fleet.scrape_enabled && fleet.targets[t].scrape;
                }
            }
        }
        LoraBook {
            wanted,
            names: fleet.targets.iter().map(|t| t.name.clone()).collect(),
            stale_after: fleet.scrape_stale_after,
            targets: (0..n).map(|_| TargetBook::default()).collect(),
            published: None,
            last_publish: None,
        }
    }

    /// Whether target `t`'s residency is tracked (its model list polled).
    pub fn wanted(&self, t: usize) -> bool {
        self.wanted.get(t).copied().unwrap_or(false)
    }

    fn any_wanted(&self) -> bool {
        self.wanted.iter().any(|&w| w)
    }

    /// A good metrics scrape of `t`: its `lora_requests_info`, or `None` when it exposes
    /// none (LoRA off, or not vLLM).
    pub fn scraped(&mut self, t: usize, info: Option<LoraInfo>, now: Instant) {
        if let Some(b) = self.targets.get_mut(t) {
            b.info = info.map(|i| (i, now));
        }
    }

    /// A model-list poll of `t`: the adapters listed, or why the poll failed.
    pub fn listed(&mut self, t: usize, result: Result<Vec<String>, String>, now: Instant) {
        let Some(b) = self.targets.get_mut(t) else {
            return;
        };
        match result {
            Ok(adapters) => {
                // A poll may have started before a load it does not show yet: loads are
                // kept for a grace period rather than dropped by the first list after them.
                b.gateway_loaded
                    .retain(|&(_, at)| now.saturating_duration_since(at) < GATEWAY_LOAD_GRACE);
                if b.list_error.is_some() {
                    tracing::info!(target = %self.names[t], "model list poll succeeds again");
                }
                b.listed = Some((adapters, now));
                b.list_error = None;
            }
            Err(e) => {
                if b.list_error.is_none() {
                    tracing::warn!(target = %self.names[t], error = %e, "model list poll failed; LoRA residency of this target relies on its metrics");
                }
                b.list_error = Some(e);
            }
        }
    }

    /// The gateway loaded the adapter with key `adapter` on `t` (`lora_aware`'s
    /// `load_from`): it counts as listed there for [`GATEWAY_LOAD_GRACE`].
    pub fn loaded_by_gateway(&mut self, t: usize, adapter: u64, now: Instant) {
        if let Some(b) = self.targets.get_mut(t) {
            b.gateway_loaded.retain(|&(k, _)| k != adapter);
            b.gateway_loaded.push((adapter, now));
        }
    }

    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) <= self.stale_after
    }

    /// What the workers should know about `t` now.
    pub fn target(&self, t: usize, now: Instant) -> TargetLora {
        let Some(b) = self.targets.get(t).filter(|_| self.wanted(t)) else {
            return TargetLora::default();
        };
        TargetLora {
            slots: b
                .info
                .as_ref()
                .filter(|(_, at)| self.fresh(*at, now))
                .map(|(i, _)| Slots::from_info(i)),
            loaded: b
                .listed
                .as_ref()
                .filter(|(_, at)| self.fresh(*at, now))
                .map(|(names, _)| {
                    let mut keys: Vec<u64> = names
                        .iter()
                        .map(|n| adapter_key(n))
                        .chain(b.gateway_loaded.iter().map(|&(k, _)| k))
                        .collect();
                    keys.sort_unstable();
                    keys.dedup();
                    keys
                }),
        }
    }

    /// The table, when it changed (or is due for a periodic resend); never while no route
    /// reads it.
    pub fn publishable(&mut self, now: Instant) -> Option<Arc<LoraTable>> {
        if !self.any_wanted() {
            return None;
        }
        let targets: Vec<TargetLora> = (0..self.targets.len())
            .map(|t| self.target(t, now))
            .collect();
        for (t, tl) in targets.iter().enumerate() {
            let fresh = tl.slots.is_some() || tl.loaded.is_some();
            let b = &mut self.targets[t];
            if b.fresh && !fresh {
                tracing::warn!(
                    target = %self.names[t],
                    "LoRA residency is stale; lora_aware routes treat this target as unknown"
                );
            }
            b.fresh = fresh;
        }
        let table = LoraTable::new(targets);
        let due = self
            .last_publish
            .is_none_or(|at| now.saturating_duration_since(at) >= REPUBLISH);
        if !due && self.published.as_deref() == Some(&table) {
            return None;
        }
        let table = Arc::new(table);
        self.published = Some(table.clone());
        self.last_publish = Some(now);
        Some(table)
    }

    /// `lora` of one target in `GET /admin/targets` (null when not tracked).
    pub fn target_json(&self, t: usize, now: Instant) -> serde_json::Value {
        let Some(b) = self.targets.get(t).filter(|_| self.wanted(t)) else {
            return serde_json::Value::Null;
        };
        let info = b.info.as_ref().filter(|(_, at)| self.fresh(*at, now));
        let listed = b.listed.as_ref().filter(|(_, at)| self.fresh(*at, now));
        serde_json::json!({
            "metrics": info.is_some(),
            "max_lora": info.and_then(|(i, _)| i.max_lora),
            "running": info.map(|(i, _)| i.running.clone()),
            "waiting": info.map(|(i, _)| i.waiting.clone()),
            "loaded": listed.map(|(l, _)| l.clone()),
            "list_error": b.list_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{FleetRoute, FleetTarget};
    use rolter_core::Level;

    /// Targets a, b and c (c not scraped) on one route with `strategy`; scraped with a
    /// 300ms `stale_after` when `scrape`.
    fn config(strategy: &str, scrape: bool) -> (Fleet, &str) {
        let target = |name: &str, scrape: bool| FleetTarget {
            name: name.into(),
            scrape,
            health_path: None,
        };
        let fleet = Fleet {
            targets: vec![target("a", true), target("b", true), target("c", false)],
            routes: vec![FleetRoute {
                targets: vec![0, 1, 2],
            }],
            scrape_enabled: scrape,
            scrape_stale_after: Duration::from_millis(300),
        };
        (fleet, strategy)
    }

    fn book((fleet, strategy): &(Fleet, &str)) -> LoraBook {
        let ctx = rolter_strategy::testing::context(&vec![1.0; fleet.targets.len()], &[]);
        let spec = rolter_strategy::StrategySpec::with_defaults(strategy).unwrap();
        let needs: Vec<Needs> = fleet
            .routes
            .iter()
            .map(|_| spec.build(&ctx).needs())
            .collect();
        LoraBook::new(fleet, &needs)
    }

    fn info(max: u32, running: &[&str], waiting: &[&str]) -> LoraInfo {
        LoraInfo {
            max_lora: Some(max),
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_routes_that_read_residency_are_tracked() {
        let mut b = book(&config("least_loaded", true));
        assert!(!(0..3).any(|t| b.wanted(t)));
        assert_eq!(b.publishable(Instant::now()), None);
        // Scraping off: nothing to track either.
        let b = book(&config("lora_aware", false));
        assert!(!(0..3).any(|t| b.wanted(t)));
        // The scraped targets of a lora_aware route (c has scrape = false).
        let b = book(&config("lora_aware", true));
        assert_eq!(
            (0..3).map(|t| b.wanted(t)).collect::<Vec<_>>(),
            [true, true, false]
        );
    }

    #[test]
    fn sources_publish_and_go_stale() {
        let t0 = Instant::now();
        let mut b = book(&config("lora_aware", true));
        let first = b.publishable(t0).expect("a first table");
        assert!(first.targets.iter().all(|t| *t == TargetLora::default()));
        b.scraped(0, Some(info(2, &["sql"], &[])), t0);
        b.listed(1, Ok(vec!["sql".into(), "chat".into()]), t0);
        b.listed(2, Ok(vec!["sql".into()]), t0);
        let table = b.publishable(t0).expect("changed");
        let key = adapter_key("sql");
        assert!(table.is_adapter(key) && table.is_adapter(adapter_key("chat")));
        assert_eq!(table.residency(0, key, true).level(), Level::Running);
        assert_eq!(table.residency(1, key, true).level(), Level::FreeSlot);
        assert_eq!(
            table.residency(2, key, true).level(),
            Level::Unknown,
            "untracked target"
        );
        // Unchanged: not re-sent until due.
        assert_eq!(b.publishable(t0 + Duration::from_millis(10)), None);
        // A failed poll keeps the last good list until it is stale.
        b.listed(
            1,
            Err("answered 500".into()),
            t0 + Duration::from_millis(100),
        );
        assert_eq!(
            b.target(1, t0 + Duration::from_millis(200))
                .loaded
                .unwrap()
                .len(),
            2
        );
        assert_eq!(b.target_json(1, t0)["list_error"], "answered 500");
        // Past stale_after (300ms) both sources are unknown.
        let later = t0 + Duration::from_millis(400);
        let table = b.publishable(later).expect("changed: stale");
        assert_eq!(table.targets[0], TargetLora::default());
        assert_eq!(table.targets[1], TargetLora::default());
        assert!(table.adapters.is_empty());
        // A scrape without the series leaves the slots unknown.
        b.scraped(0, None, later);
        assert_eq!(b.target(0, later).slots, None);
        let j = b.target_json(0, t0);
        assert_eq!(j["metrics"], false);
        assert_eq!(b.target_json(2, t0), serde_json::Value::Null);
    }
}
