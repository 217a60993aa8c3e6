//! The control thread's side of the fleet plane: the store's news, by name, mapped onto the
//! running configuration's route and target indices and sent to every worker; and this
//! replica's load, sent to the state thread once per `sync_interval`.
//!
//! Owns the name maps of one configuration. Items for a route that does not share that kind
//! (or does not exist here) and targets unknown here are skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rolter_config::Config;
use rolter_core::{RouteLedger, ShareSink};
use rolter_store::Item;
use rolter_strategy::StoreUse;

use super::link::StoreLink;
use super::messages::{StoreNews, ToState};
use super::stats::StoreStats;
use crate::mesh::{ControlLinks, Kind, ToWorker};

/// The control thread's end of the fleet plane.
pub struct FleetControl {
    pub link: StoreLink,
    pub news: Receiver<StoreNews>,
    pub stats: Arc<StoreStats>,
    interval: Duration,
    share_load: bool,
    next_load: Instant,
    names: Names,
}

/// Route and target indices by name, and each route's use of the store.
struct Names {
    config: Arc<Config>,
    routes: HashMap<String, usize>,
    targets: HashMap<String, usize>,
    uses: Vec<Option<StoreUse>>,
}

impl Names {
    fn new(config: &Arc<Config>) -> Names {
        Names {
            config: config.clone(),
            routes: config
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.clone(), i))
                .collect(),
            targets: config
                .targets
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            uses: config
                .routes
                .iter()
                .map(|r| r.strategy.requirements().store)
                .collect(),
        }
    }
}

impl FleetControl {
    pub fn new(
        link: StoreLink,
        news: Receiver<StoreNews>,
        stats: Arc<StoreStats>,
        config: &Arc<Config>,
    ) -> Self {
        let state = config.state.as_ref();
        FleetControl {
            link,
            news,
            stats,
            interval: state.map_or(Duration::from_millis(100), |s| s.sync_interval),
            share_load: state.is_some_and(|s| s.share_load),
            next_load: Instant::now(),
            names: Names::new(config),
        }
    }

    /// A reload: the state thread and the name maps follow the new configuration.
    pub fn adopt(&mut self, config: &Arc<Config>) {
        self.names = Names::new(config);
        self.link.send(ToState::Config(config.clone()));
    }

    /// Each route's use of the store, for `/admin/state`.
    pub fn routes_json(&self) -> serde_json::Value {
        let routes: Vec<serde_json::Value> = self
            .names
            .config
            .routes
            .iter()
            .zip(&self.names.uses)
            .filter_map(|(r, u)| {
                let u = u.as_ref()?;
                Some(serde_json::json!({
                    "route": r.name,
                    "strategy": r.strategy.name(),
                    "rotation_lease": u.rotation,
                    "durable_books_window_s": u.ledger.map(|w| w.as_secs_f64()),
                    "share_sessions": u.sessions,
                    "share_prefixes": u.prefixes,
                    "fleet_load": u.fleet_load,
                    "by": u.by,
                }))
            })
            .collect();
        serde_json::Value::Array(routes)
    }

    /// The tick: this replica's load to the state thread when due, and the store's news to
    /// the workers.
    pub fn tick(&mut self, now: Instant, in_flight: impl Fn(usize) -> u64, links: &ControlLinks) {
        if self.share_load && now >= self.next_load {
            self.next_load = now + self.interval;
            let counts = (0..self.names.config.targets.len())
                .map(|t| u32::try_from(in_flight(t)).unwrap_or(u32::MAX))
                .collect();
            self.link.send(ToState::Load {
                config: self.names.config.clone(),
                in_flight: counts,
            });
        }
        while let Ok(news) = self.news.try_recv() {
            self.deliver(news, links);
        }
    }

    fn deliver(&self, news: StoreNews, links: &ControlLinks) {
        let n = &self.names;
        match news {
            StoreNews::Items(items) => {
                let mut sink = ShareSink::default();
                for item in &items {
                    match item {
                        Item::SessionPin { route, key, target } => {
                            if let Some((r, t)) = self.place(route, target, |u| u.sessions) {
                                sink.for_route(r).session_pin(*key, t);
                            }
                        }
                        Item::Prefix {
                            route,
                            target,
                            data,
                        } => {
                            if let Some((r, t)) = self.place(route, target, |u| u.prefixes) {
                                sink.for_route(r).prefix(t, data);
                            }
                        }
                        // Assignments travel as books, never as items.
                        Item::Assigned { .. } => {}
                    }
                }
                if !sink.is_empty() {
                    let batch = Arc::new(sink.take_batch());
                    links.broadcast(Kind::Shared, || ToWorker::Shared(batch.clone()));
                }
            }
            StoreNews::Ledgers(ledgers) => {
                let mapped: Arc<[(usize, RouteLedger)]> = ledgers
                    .into_iter()
                    .filter_map(|l| {
                        let r = *n.routes.get(&l.route)?;
                        n.uses.get(r)?.as_ref()?.ledger?;
                        let received = l
                            .received
                            .iter()
                            .filter_map(|(t, c)| Some((*n.targets.get(t)?, *c)))
                            .collect();
                        Some((
                            r,
                            RouteLedger {
                                picks: l.picks,
                                received,
                            },
                        ))
                    })
                    .collect();
                if !mapped.is_empty() {
                    links.broadcast(Kind::Targets, || ToWorker::Ledger(mapped.clone()));
                }
            }
            StoreNews::FleetLoad(load) => {
                let mut fleet = vec![0u32; n.config.targets.len()];
                for (t, c) in load {
                    if let Some(&i) = n.targets.get(&t) {
                        fleet[i] = u32::try_from(c).unwrap_or(u32::MAX);
                    }
                }
                let fleet: Arc<[u32]> = fleet.into();
                links.broadcast(Kind::Targets, || ToWorker::FleetLoad(fleet.clone()));
            }
        }
    }

    /// The route and target indices of an item, when the route shares its kind.
    fn place(
        &self,
        route: &str,
        target: &str,
        shares: impl Fn(&StoreUse) -> bool,
    ) -> Option<(usize, usize)> {
        let n = &self.names;
        let r = *n.routes.get(route)?;
        if !shares(n.uses.get(r)?.as_ref()?) {
            return None;
        }
        Some((r, *n.targets.get(target)?))
    }
}
