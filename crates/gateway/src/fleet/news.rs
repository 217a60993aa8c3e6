//! The control thread's side of the fleet plane: the store's news, by name, mapped onto the
//! running configuration's route and target indices and sent to every worker; this
//! replica's load, sent to the state thread as it changes (at most every [`LOAD_GAP`], and
//! once per `sync_interval` regardless); and its client API keys' use (`[auth]
//! share_limits`), sent once per `sync_interval`; the other replicas' key use goes into the key book.
//!
//! Owns the name maps of one configuration. Items for a route that does not share that kind
//! (or does not exist here) and targets unknown here are skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_config::Config;
use rolter_core::{RouteLedger, ShareSink};
use rolter_store::Item;
use rolter_strategy::StoreUse;

use super::inbox::{Doorbell, NewsInbox};
use super::link::StoreLink;
use super::messages::{StoreNews, ToState};
use super::stats::StoreStats;
use crate::mesh::key_limits::{minute_now, KeyBook};
use crate::mesh::{ControlLinks, Kind, ToWorker};

/// The shortest time between two publications of this replica's load: a burst of
/// requests is one publication, not one per request, and a request of a millisecond or two
/// is still seen ending soon after it ends.
pub const LOAD_GAP: Duration = Duration::from_millis(1);

/// The control thread's end of the fleet plane.
pub struct FleetControl {
    pub link: StoreLink,
    pub news: NewsInbox,
    /// Rung as news arrives; taken by the control thread's event loop.
    pub doorbell: Option<Doorbell>,
    pub stats: Arc<StoreStats>,
    interval: Duration,
    share_load: bool,
    /// This replica's load as last sent, and when it must go again at the latest.
    sent_load: Vec<u32>,
    last_load: Instant,
    next_load: Instant,
    /// When this replica's key use next goes to the store, and what of the current minute
    /// went already, by key name (`[auth] share_limits`).
    next_keys: Instant,
    keys_sent: HashMap<String, (u32, u32, u32)>,
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
        (news, doorbell): (NewsInbox, Doorbell),
        stats: Arc<StoreStats>,
        config: &Arc<Config>,
    ) -> Self {
        let state = config.state.as_ref();
        FleetControl {
            link,
            news,
            doorbell: Some(doorbell),
            stats,
            interval: state.map_or(Duration::from_millis(100), |s| s.sync_interval),
            share_load: state.is_some_and(|s| s.share_load),
            sent_load: Vec::new(),
            last_load: Instant::now(),
            next_load: Instant::now(),
            next_keys: Instant::now(),
            keys_sent: HashMap::new(),
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
    pub fn tick(
        &mut self,
        now: Instant,
        in_flight: impl Fn(usize) -> u64,
        keys: Option<&KeyBook>,
        links: &ControlLinks,
    ) {
        if self.share_load && now.saturating_duration_since(self.last_load) >= LOAD_GAP {
            let counts: Vec<u32> = (0..self.names.config.targets.len())
                .map(|t| u32::try_from(in_flight(t)).unwrap_or(u32::MAX))
                .collect();
            // Sent as it changes (at most every LOAD_GAP) and once per interval regardless,
            // which keeps it alive in the store.
            if counts != self.sent_load || now >= self.next_load {
                self.next_load = now + self.interval;
                self.last_load = now;
                self.sent_load.clone_from(&counts);
                self.link.send(ToState::Load {
                    config: self.names.config.clone(),
                    in_flight: counts,
                });
            }
        }
        if let Some(book) = keys.filter(|_| self.names.config.keys.share_limits) {
            if now >= self.next_keys {
                self.next_keys = now + self.interval;
                self.send_key_use(book);
            }
        }
        self.deliver_news(keys, links);
    }

    /// Hands the store's news that arrived to the workers.
    pub fn deliver_news(&self, keys: Option<&KeyBook>, links: &ControlLinks) {
        while let Ok(news) = self.news.try_recv() {
            self.deliver(news, keys, links);
        }
    }

    /// What each key used on this gateway since the last report, for the store.
    fn send_key_use(&mut self, book: &KeyBook) {
        let (minute, _) = minute_now();
        let mut rows = Vec::new();
        for (k, name) in book.names().iter().enumerate() {
            let (requests, tokens) = book.local(k, minute);
            let sent = self.keys_sent.entry(name.clone()).or_insert((minute, 0, 0));
            if sent.0 != minute {
                *sent = (minute, 0, 0);
            }
            let (dr, dt) = (
                requests.saturating_sub(sent.1),
                tokens.saturating_sub(sent.2),
            );
            if dr > 0 || dt > 0 {
                rows.push(rolter_store::KeyUse {
                    key: name.clone(),
                    requests: u64::from(dr),
                    tokens: u64::from(dt),
                });
            }
            sent.1 = sent.1.max(requests);
            sent.2 = sent.2.max(tokens);
        }
        self.keys_sent.retain(|_, s| s.0 == minute);
        // Sent even when empty: the exchange then only reads the others' counts.
        self.link.send(ToState::KeyUse {
            minute: u64::from(minute),
            rows,
        });
    }

    fn deliver(&self, news: StoreNews, keys: Option<&KeyBook>, links: &ControlLinks) {
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
                    links.broadcast(Kind::Shared, || ToWorker::FleetShared(batch.clone()));
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
            StoreNews::KeyUse { minute, others } => {
                // The book is shared with the workers: its fleet counts are atomics.
                let Some(book) = keys else { return };
                let minute = u32::try_from(minute).unwrap_or(u32::MAX);
                for (k, name) in book.names().iter().enumerate() {
                    let (r, t) = others
                        .iter()
                        .find(|u| &u.key == name)
                        .map_or((0, 0), |u| (u.requests, u.tokens));
                    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                    book.set_fleet(k, minute, clamp(r), clamp(t));
                }
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
