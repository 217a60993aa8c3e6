//! The state thread: the one place that talks to the shared state store.
//!
//! - Rotation asks are answered as they arrive: every ask waiting at that moment goes out in
//!   one pipeline (one round trip), each one script call that advances the route's smooth
//!   weighted cursor in the store. An ask whose picker stopped waiting is skipped, so it
//!   takes no position.
//! - Shared items are appended to the store's stream as they arrive (every item waiting at
//!   that moment in one entry), and this replica's requests in flight are published as the
//!   control thread reports a change: the other replicas' reader threads
//!   ([`super::reader`]) wait on both streams, so they see them about a round trip later.
//! - Once per `sync_interval`: the fair-catchup assignments are added to the store's books
//!   and each durable route's window read back (less what this process wrote itself), and
//!   the client API keys' use exchanged.
//! - While the store is away nothing waits on it: rotation asks fail at once (the picks use
//!   their local cursors), items beyond the rate limit are dropped and counted, assignments
//!   are kept and written when it returns (so the books reconcile), and a connection is
//!   tried every `retry_interval`. The transitions are logged once each; every failure is
//!   counted in [`StoreStats`].
//!
//! Owns the store connection and what is waiting for it. It must not touch a worker's
//! state: what it learns goes to the control thread as [`StoreNews`].

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use rolter_config::{Config, StateConfig, StateTopology};
use rolter_core::Shared;
use rolter_store::{
    Item, KeyUse, LedgerRow, RotateAsk, Store, StoreError, StoreSettings, Topology,
};
use rolter_strategy::StoreUse;

use super::inbox::NewsSender;
use super::messages::{LedgerNews, StoreNews, ToState};
use super::reader::Reader;
use super::stats::StoreStats;

/// Buckets of a fair-catchup window (the strategy's own ring has as many).
const BUCKETS: u64 = rolter_strategy::strategies::fair_catchup::BUCKETS as u64;
/// Most rotation asks sent in one pipeline.
const MAX_ASKS: usize = 256;
/// Items kept for publishing while the store is away: at most this many seconds of the
/// rate limit, and at most this many bytes.
const BACKLOG_SECONDS: f64 = 10.0;
const BACKLOG_BYTES: usize = 8 << 20;
/// Largest stream entry, about.
const ENTRY_BYTES: usize = 256 << 10;

/// What an item weighs in an entry, about (names, a key, the prefix's chunk keys).
fn item_bytes(item: &Item) -> usize {
    match item {
        Item::SessionPin { route, target, .. } => route.len() + target.len() + 16,
        Item::Prefix {
            route,
            target,
            data,
        } => route.len() + target.len() + data.len() + 16,
        Item::Assigned { route, target, .. } => route.len() + target.len() + 8,
    }
}

/// The store client's settings for `[state]` (valkey:// is redis:// to the client).
pub fn settings(c: &StateConfig) -> StoreSettings {
    let urls = c
        .urls
        .iter()
        .map(|u| {
            if let Some(rest) = u.strip_prefix("valkeys://") {
                format!("rediss://{rest}")
            } else if let Some(rest) = u.strip_prefix("valkey://") {
                format!("redis://{rest}")
            } else {
                u.clone()
            }
        })
        .collect();
    StoreSettings {
        urls,
        topology: match &c.topology {
            StateTopology::Standalone => Topology::Standalone,
            StateTopology::Sentinel { master } => Topology::Sentinel {
                master: master.clone(),
            },
            StateTopology::Cluster => Topology::Cluster,
        },
        username: c.username.clone(),
        password: c.password.clone(),
        tls_ca_file: c.tls_ca_file.clone(),
        connect_timeout: c.connect_timeout,
        command_timeout: c.command_timeout,
        key_prefix: c.key_prefix.clone(),
    }
}

/// This replica's name in the store: `replica`, else the host name and the listening port.
pub fn replica_name(c: &StateConfig, port: u16) -> String {
    c.replica.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "rolter".into());
        format!("{host}:{port}")
    })
}

/// How long another replica's load stands without a new publication.
pub fn load_ttl(c: &StateConfig) -> Duration {
    (c.sync_interval * 3).max(Duration::from_millis(300))
}

/// Starts the state thread and its reader. They end once every sender of `rx` is gone.
pub fn spawn(
    cfg: StateConfig,
    replica: String,
    config: Arc<Config>,
    rx: Receiver<ToState>,
    news: NewsSender,
    stats: Arc<StoreStats>,
) -> io::Result<JoinHandle<()>> {
    // The process id and a random word: replicas given one name by a shared file (or run
    // as pid 1 in containers) still tell their entries apart.
    let origin = format!("{replica}#{}-{:08x}", std::process::id(), fastrand::u32(..));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = Reader {
        settings: settings(&cfg),
        origin: origin.clone(),
        replica: replica.clone(),
        load_ttl: load_ttl(&cfg),
        retry_interval: cfg.retry_interval,
        news: news.clone(),
        stats: stats.clone(),
        stop: stop.clone(),
    }
    .spawn()?;
    let t = StateThread::new(cfg, replica, origin, config, news, stats);
    std::thread::Builder::new()
        .name("rolter-state".into())
        .spawn(move || {
            t.run(rx);
            stop.store(true, Ordering::Relaxed);
            let _ = reader.join();
        })
}

/// A rotation ask by name: the route, its members with their weights, the lease.
type NamedAsk = (String, Vec<(String, f64)>, u32);

/// Picks and assignments of one route in one wall-clock bucket.
#[derive(Debug, Default, Clone)]
struct Tally {
    picks: u64,
    received: BTreeMap<String, u64>,
}

impl Tally {
    fn add(&mut self, target: &str, n: u64) {
        self.picks += n;
        *self.received.entry(target.to_string()).or_default() += n;
    }
}

struct StateThread {
    cfg: StateConfig,
    settings: StoreSettings,
    replica: String,
    /// Names this process's stream entries (the replica name and the process id), so a
    /// restarted replica reads what its earlier run shared.
    origin: String,
    config: Arc<Config>,
    /// Each route's use of the store in `config`.
    uses: Vec<Option<StoreUse>>,
    store: Option<Store>,
    next_retry: Instant,
    items: Vec<Item>,
    /// What `items` weighs, about.
    items_bytes: usize,
    tokens: f64,
    refilled: Instant,
    /// Assignments not yet in the store, and those this process wrote, by (route, bucket).
    pending: BTreeMap<(String, u64), Tally>,
    own: BTreeMap<(String, u64), Tally>,
    /// This replica's requests in flight per target, as last reported, and whether the
    /// store has it yet.
    load: Option<Vec<(String, u32)>>,
    load_sent: bool,
    /// When the load's keys are written again (`None`: at the next publication).
    load_keys_due: Option<Instant>,
    /// The client API keys' counts not yet in the store, by minute then key; and what this
    /// process added, by (minute, key), to tell the other replicas' share.
    key_pending: BTreeMap<u64, BTreeMap<String, (u64, u64)>>,
    key_own: BTreeMap<(u64, String), (u64, u64)>,
    news: NewsSender,
    stats: Arc<StoreStats>,
    last_command_error: Option<Instant>,
}

fn uses(config: &Config) -> Vec<Option<StoreUse>> {
    config
        .routes
        .iter()
        .map(|r| r.strategy.requirements().store)
        .collect()
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wall-clock bucket of `window` that `unix_ms` falls in, and the bucket's length.
fn bucket_of(window: Duration, unix_ms: u64) -> (u64, u64) {
    let len = (window.as_millis() as u64 / BUCKETS).max(1);
    (unix_ms / len, len)
}

impl StateThread {
    fn new(
        cfg: StateConfig,
        replica: String,
        origin: String,
        config: Arc<Config>,
        news: NewsSender,
        stats: Arc<StoreStats>,
    ) -> Self {
        StateThread {
            settings: settings(&cfg),
            tokens: f64::from(cfg.max_items_per_second),
            cfg,
            replica,
            origin,
            uses: uses(&config),
            config,
            store: None,
            next_retry: Instant::now(),
            items: Vec::new(),
            items_bytes: 0,
            refilled: Instant::now(),
            pending: BTreeMap::new(),
            own: BTreeMap::new(),
            load: None,
            load_sent: true,
            load_keys_due: None,
            key_pending: BTreeMap::new(),
            key_own: BTreeMap::new(),
            news,
            stats,
            last_command_error: None,
        }
    }

    fn run(mut self, rx: Receiver<ToState>) {
        self.connect();
        let mut next_sync = Instant::now();
        let mut asks = Vec::new();
        loop {
            let wait = next_sync.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(m) => {
                    self.take(m, &mut asks);
                    while asks.len() < MAX_ASKS {
                        match rx.try_recv() {
                            Ok(m) => self.take(m, &mut asks),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if !asks.is_empty() {
                self.rotate(&mut asks);
            }
            self.flush();
            let now = Instant::now();
            if now >= next_sync {
                self.sync(now);
                next_sync = Instant::now() + self.cfg.sync_interval;
            }
        }
        // What is still waiting goes out once if the store answers.
        let now = Instant::now();
        if self.store.is_some() {
            self.sync(now);
        }
    }

    fn take(&mut self, m: ToState, asks: &mut Vec<ToState>) {
        match m {
            ToState::Rotate { .. } => asks.push(m),
            ToState::Share { config, batch } => {
                let fresh;
                let uses = if Arc::ptr_eq(&config, &self.config) {
                    &self.uses
                } else {
                    fresh = uses(&config);
                    &fresh
                };
                let mut published = Vec::new();
                let mut assigned = Vec::new();
                for (r, item) in batch.iter() {
                    let (Some(route), Some(Some(use_))) = (config.routes.get(r), uses.get(r))
                    else {
                        continue;
                    };
                    let name = |t: usize| config.targets.get(t).map(|t| t.name.clone());
                    match item {
                        Shared::SessionPin { key, target } if use_.sessions => {
                            if let Some(target) = name(target) {
                                published.push(Item::SessionPin {
                                    route: route.name.clone(),
                                    key,
                                    target,
                                });
                            }
                        }
                        Shared::Prefix { target, data } if use_.prefixes => {
                            if let Some(target) = name(target) {
                                published.push(Item::Prefix {
                                    route: route.name.clone(),
                                    target,
                                    data: data.to_vec(),
                                });
                            }
                        }
                        Shared::Assigned { target, count } => {
                            if let (Some(window), Some(target)) = (use_.ledger, name(target)) {
                                assigned.push((route.name.clone(), window, target, count));
                            }
                        }
                        _ => {}
                    }
                }
                for item in published {
                    self.publish(item);
                }
                let now = unix_millis();
                for (route, window, target, count) in assigned {
                    let (bucket, _) = bucket_of(window, now);
                    self.pending
                        .entry((route, bucket))
                        .or_default()
                        .add(&target, u64::from(count));
                }
            }
            ToState::Load { config, in_flight } => {
                self.load_sent = false;
                self.load = Some(
                    config
                        .targets
                        .iter()
                        .zip(in_flight)
                        .map(|(t, n)| (t.name.clone(), n))
                        .collect(),
                );
            }
            ToState::KeyUse { minute, rows } => {
                let pending = self.key_pending.entry(minute).or_default();
                for r in rows {
                    let e = pending.entry(r.key).or_default();
                    e.0 += r.requests;
                    e.1 += r.tokens;
                }
            }
            ToState::Config(c) => {
                self.uses = uses(&c);
                self.config = c;
            }
        }
    }

    /// Queues an item for the next exchange, within the rate limit and the backlog bound.
    fn publish(&mut self, item: Item) {
        let rate = f64::from(self.cfg.max_items_per_second);
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        if self.tokens < 1.0
            || self.items.len() as f64 >= rate * BACKLOG_SECONDS
            || self.items_bytes >= BACKLOG_BYTES
        {
            self.stats.dropped(1);
            return;
        }
        self.tokens -= 1.0;
        self.items_bytes += item_bytes(&item);
        self.items.push(item);
    }

    fn connect(&mut self) {
        self.next_retry = Instant::now() + self.cfg.retry_interval;
        match Store::connect(&self.settings).and_then(|mut s| s.ping().map(|rtt| (s, rtt))) {
            Ok((store, rtt)) => {
                let again = self.stats.last_error().is_some();
                self.stats.connected(rtt.as_micros() as u64);
                if again {
                    tracing::warn!(
                        replica = %self.replica,
                        "the shared state store answers again: shared routing state resumes"
                    );
                } else {
                    tracing::info!(
                        urls = ?self.cfg.urls,
                        replica = %self.replica,
                        round_trip_us = rtt.as_micros() as u64,
                        "connected to the shared state store"
                    );
                }
                self.store = Some(store);
                // The load is published again, keys and all: it may have expired meanwhile.
                self.load_sent = false;
                self.load_keys_due = None;
            }
            Err(e) => {
                let first = self.stats.last_error().is_none() || self.stats.is_up();
                self.stats.connect_failed(e.to_string());
                if first {
                    tracing::warn!(
                        urls = ?self.cfg.urls,
                        error = %e,
                        "the shared state store is unreachable: routes that use it fall back to this replica's own state until it answers (tried every {})",
                        humantime::format_duration(self.cfg.retry_interval)
                    );
                }
            }
        }
    }

    /// A failed command: a broken connection is dropped (and retried later); any other
    /// error is counted and logged at most every ten seconds.
    fn failed(&mut self, e: StoreError) {
        if e.is_connection() {
            self.store = None;
            self.next_retry = Instant::now() + self.cfg.retry_interval;
            if self.stats.is_up() {
                tracing::warn!(
                    error = %e,
                    "the shared state store stopped answering: routes that use it fall back to this replica's own state until it answers"
                );
            }
            self.stats.disconnected(e.to_string());
            self.forget_fleet();
        } else {
            let now = Instant::now();
            let quiet = self
                .last_command_error
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(10));
            if !quiet {
                tracing::warn!(error = %e, "a shared state store command failed");
                self.last_command_error = Some(now);
            }
            self.stats.disconnected_soft(e.to_string());
        }
    }

    /// While the store is away what it said about the other replicas is no longer known:
    /// the workers drop the fleet's load and the other replicas' books, and route on this
    /// replica's own until the store answers again.
    fn forget_fleet(&mut self) {
        self.send_news(StoreNews::FleetLoad(Vec::new()));
        if self.config.keys.share_limits {
            // The keys' limits count this replica's use alone meanwhile.
            self.send_news(StoreNews::KeyUse {
                minute: unix_millis() / 60_000,
                others: Vec::new(),
            });
        }
        let empty: Vec<LedgerNews> = self
            .config
            .routes
            .iter()
            .zip(&self.uses)
            .filter(|(_, u)| u.as_ref().is_some_and(|u| u.ledger.is_some()))
            .map(|(r, _)| LedgerNews {
                route: r.name.clone(),
                picks: 0,
                received: Vec::new(),
            })
            .collect();
        if !empty.is_empty() {
            self.send_news(StoreNews::Ledgers(empty));
        }
    }

    /// Hands news to the control thread; a full queue drops it (counted).
    fn send_news(&self, news: StoreNews) {
        if !self.news.send(news) {
            self.stats.news_dropped();
        }
    }

    fn rotate(&mut self, asks: &mut Vec<ToState>) {
        // Picks that stopped waiting take no position.
        asks.retain(|a| matches!(a, ToState::Rotate { reply, .. } if !reply.is_canceled()));
        if asks.is_empty() {
            return;
        }
        let n = asks.len() as u64;
        if self.store.is_none() {
            self.stats.rotation_failed(n);
            asks.clear();
            return;
        }
        let mut owned: Vec<NamedAsk> = Vec::with_capacity(asks.len());
        for a in asks.iter() {
            if let ToState::Rotate {
                config,
                route,
                members,
                lease,
                ..
            } = a
            {
                let route = config
                    .routes
                    .get(usize::from(*route))
                    .map_or_else(String::new, |r| r.name.clone());
                let members = members
                    .iter()
                    .map(|&(t, w)| {
                        let name = config
                            .targets
                            .get(usize::from(t))
                            .map_or_else(String::new, |t| t.name.clone());
                        (name, w)
                    })
                    .collect();
                owned.push((route, members, *lease));
            }
        }
        let member_refs: Vec<Vec<(&str, f64)>> = owned
            .iter()
            .map(|(_, m, _)| m.iter().map(|(n, w)| (n.as_str(), *w)).collect())
            .collect();
        let requests: Vec<RotateAsk<'_>> = owned
            .iter()
            .zip(&member_refs)
            .map(|((route, _, lease), members)| RotateAsk {
                route,
                members,
                lease: *lease,
            })
            .collect();
        let started = Instant::now();
        let result = self.store.as_mut().map(|s| s.rotate_many(&requests));
        let micros = started.elapsed().as_micros() as u64;
        match result {
            Some(Ok(answers)) => {
                // Counted before the answers go out, so whoever reads the counters after
                // an answer sees it counted.
                let positions = answers.iter().map(|p| p.len() as u64).sum();
                self.stats.rotated(n, positions, micros);
                for (a, picked) in asks.drain(..).zip(answers) {
                    if let ToState::Rotate { members, reply, .. } = a {
                        let targets: Vec<u16> = picked
                            .iter()
                            .filter_map(|&i| members.get(usize::from(i)).map(|m| m.0))
                            .collect();
                        let _ = reply.send(targets);
                    }
                }
            }
            Some(Err(e)) => {
                self.stats.rotation_failed(n);
                asks.clear();
                self.failed(e);
            }
            None => asks.clear(),
        }
    }

    /// The periodic exchange: items, books, load. Connects first when the store is away and
    /// its retry is due.
    fn sync(&mut self, now: Instant) {
        if self.store.is_none() && now >= self.next_retry {
            self.connect();
        }
        let unix = unix_millis();
        if self.store.is_none() {
            self.forget_old(unix);
            // Counts of minutes that are over can no longer limit anything.
            let current = unix / 60_000;
            self.key_pending.retain(|m, _| *m + 2 > current);
            return;
        }
        let started = Instant::now();
        let ok = self.exchange(unix).is_ok();
        self.stats.synced(ok, started.elapsed().as_micros() as u64);
        self.forget_old(unix);
    }

    /// What waits to go out as it happens: the items and this replica's load.
    fn flush(&mut self) {
        if self.store.is_none() {
            return;
        }
        if !self.items.is_empty() {
            let r = self.exchange_items();
            let _ = self.check(r);
        }
        if !self.load_sent {
            let r = self.exchange_load();
            let _ = self.check(r);
        }
    }

    /// The steps, each on its own: a step that fails (a large backlog of items that
    /// times out, say) does not keep the others from running while the connection holds.
    fn exchange(&mut self, unix: u64) -> Result<(), ()> {
        let items = self.exchange_items();
        let items = self.check(items);
        let books = self.exchange_books(unix);
        let books = self.check(books);
        let keys = self.exchange_key_use(unix);
        let keys = self.check(keys);
        items.and(books).and(keys)
    }

    /// The client API keys' counts (`[auth] share_limits`): what this replica added since
    /// the last exchange goes to each minute it counted in, and the current minute's fleet
    /// totals come back, less this process's own share, as news for the control thread.
    fn exchange_key_use(&mut self, unix: u64) -> Result<(), StoreError> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        if !self.config.keys.share_limits {
            self.key_pending.clear();
            return Ok(());
        }
        let current = unix / 60_000;
        // Two minutes: a minute's counts outlive it long enough to be read at its end.
        let ttl = Duration::from_secs(120);
        let mut totals = None;
        for (minute, rows) in std::mem::take(&mut self.key_pending) {
            let list: Vec<KeyUse> = rows
                .iter()
                .map(|(k, &(requests, tokens))| KeyUse {
                    key: k.clone(),
                    requests,
                    tokens,
                })
                .collect();
            let read = store.exchange_key_use(minute, &list, ttl)?;
            for (k, (r, t)) in rows {
                let own = self.key_own.entry((minute, k)).or_default();
                own.0 += r;
                own.1 += t;
            }
            if minute == current {
                totals = Some(read);
            }
        }
        let totals = match totals {
            Some(t) => t,
            None => store.exchange_key_use(current, &[], ttl)?,
        };
        let others = totals
            .into_iter()
            .map(|u| {
                let (r, t) = self
                    .key_own
                    .get(&(current, u.key.clone()))
                    .copied()
                    .unwrap_or_default();
                KeyUse {
                    requests: u.requests.saturating_sub(r),
                    tokens: u.tokens.saturating_sub(t),
                    key: u.key,
                }
            })
            .collect();
        self.key_own.retain(|(m, _), _| *m + 2 > current);
        self.send_news(StoreNews::KeyUse {
            minute: current,
            others,
        });
        Ok(())
    }

    fn check(&mut self, r: Result<(), StoreError>) -> Result<(), ()> {
        r.map_err(|e| self.failed(e))
    }

    fn exchange_items(&mut self) -> Result<(), StoreError> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        // One entry per ENTRY_BYTES of items at most, so no command carries a backlog whole.
        while !self.items.is_empty() {
            let mut bytes = 0;
            let n = self
                .items
                .iter()
                .take_while(|i| {
                    bytes += item_bytes(i);
                    bytes <= ENTRY_BYTES
                })
                .count()
                .max(1);
            store.append_items(
                &self.origin,
                &self.items[..n],
                self.cfg.stream_maxlen as usize,
            )?;
            self.stats.published(n as u64);
            let sent: usize = self.items.drain(..n).map(|i| item_bytes(&i)).sum();
            self.items_bytes = self.items_bytes.saturating_sub(sent);
        }
        Ok(())
    }

    fn exchange_books(&mut self, unix: u64) -> Result<(), StoreError> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        if !self.pending.is_empty() {
            let received: Vec<Vec<(&str, u64)>> = self
                .pending
                .values()
                .map(|t| t.received.iter().map(|(k, v)| (k.as_str(), *v)).collect())
                .collect();
            let rows: Vec<LedgerRow<'_>> = self
                .pending
                .iter()
                .zip(&received)
                .map(|(((route, bucket), tally), received)| LedgerRow {
                    route,
                    bucket: *bucket,
                    picks: tally.picks,
                    received,
                })
                .collect();
            let longest = self
                .uses
                .iter()
                .flatten()
                .filter_map(|u| u.ledger)
                .max()
                .unwrap_or(Duration::from_secs(60));
            store.add_ledger(&rows, longest + longest / BUCKETS as u32)?;
            let written: u64 = self.pending.values().map(|t| t.picks).sum();
            self.stats.assignments(written);
            for (key, tally) in std::mem::take(&mut self.pending) {
                let own = self.own.entry(key).or_default();
                own.picks += tally.picks;
                for (t, n) in tally.received {
                    *own.received.entry(t).or_default() += n;
                }
            }
        }
        let mut ledgers = Vec::new();
        for (route, use_) in self.config.routes.iter().zip(&self.uses) {
            let Some(window) = use_.as_ref().and_then(|u| u.ledger) else {
                continue;
            };
            let (current, _) = bucket_of(window, unix);
            let first = current.saturating_sub(BUCKETS - 1);
            let buckets = store.read_ledger(&route.name, first, current)?;
            let mut news = LedgerNews {
                route: route.name.clone(),
                picks: 0,
                received: Vec::new(),
            };
            let mut received: BTreeMap<String, u64> = BTreeMap::new();
            for b in buckets {
                let own = self.own.get(&(route.name.clone(), b.bucket));
                news.picks += b.picks.saturating_sub(own.map_or(0, |o| o.picks));
                for (t, n) in b.received {
                    let mine = own.and_then(|o| o.received.get(&t)).copied().unwrap_or(0);
                    *received.entry(t).or_default() += n.saturating_sub(mine);
                }
            }
            news.received = received.into_iter().collect();
            ledgers.push(news);
        }
        if !ledgers.is_empty() {
            self.send_news(StoreNews::Ledgers(ledgers));
        }
        Ok(())
    }

    /// Publishes this replica's requests in flight (the other replicas read them as they
    /// change, through their readers).
    fn exchange_load(&mut self) -> Result<(), StoreError> {
        let (Some(store), true) = (self.store.as_mut(), self.cfg.share_load) else {
            self.load_sent = true;
            return Ok(());
        };
        if let Some(load) = &self.load {
            let counts: Vec<(&str, u32)> = load.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            // The keys (where a reader starts) once per interval; a change in between goes
            // to the stream alone, which is all that readers following it need.
            let now = Instant::now();
            if self.load_keys_due.is_none_or(|due| now >= due) {
                store.publish_load(&self.replica, &counts, load_ttl(&self.cfg))?;
                self.load_keys_due = Some(now + self.cfg.sync_interval);
            } else {
                store.append_load(&self.replica, &counts)?;
            }
        }
        self.load_sent = true;
        Ok(())
    }

    /// Drops books older than every durable route's window (written or not: a window the
    /// store was away for all of is gone for the strategy too).
    fn forget_old(&mut self, unix: u64) {
        let windows: BTreeMap<String, Duration> = self
            .config
            .routes
            .iter()
            .zip(&self.uses)
            .filter_map(|(r, u)| Some((r.name.clone(), u.as_ref()?.ledger?)))
            .collect();
        let keep = |(route, bucket): &(String, u64)| {
            windows.get(route).is_some_and(|w| {
                let (current, _) = bucket_of(*w, unix);
                *bucket + BUCKETS > current
            })
        };
        self.pending.retain(|k, _| keep(k));
        self.own.retain(|k, _| keep(k));
    }
}
