//! The state thread's counters and status: written by the state thread (and, for queue drops
//! and pick timeouts, by the workers, one relaxed add each), read when `/metrics` or
//! `/admin/state` is rendered.
//!
//! Owns the `rolter_state_*` series and the `/admin/state` document. It keeps no history.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The state thread's counters.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Where the store is and who this replica is, for `/admin/state`.
    pub backend: String,
    pub topology: String,
    pub urls: Vec<String>,
    pub key_prefix: String,
    pub replica: String,
    up: AtomicBool,
    connects: AtomicU64,
    connect_failures: AtomicU64,
    disconnects: AtomicU64,
    /// Rotation asks answered by the store, the positions they took, and their round trips.
    rotations: AtomicU64,
    rotation_positions: AtomicU64,
    rotation_micros: AtomicU64,
    /// Rotation asks the store could not answer (away, or a command failed).
    rotation_failures: AtomicU64,
    /// Picks that stopped waiting for the store (`pick_timeout`).
    pick_timeouts: AtomicU64,
    /// Messages the state thread's queue had no room for.
    queue_full: AtomicU64,
    /// News the control thread's queue had no room for.
    news_dropped: AtomicU64,
    items_published: AtomicU64,
    items_received: AtomicU64,
    items_dropped: AtomicU64,
    ledger_assignments: AtomicU64,
    syncs: AtomicU64,
    sync_failures: AtomicU64,
    last_round_trip_micros: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Reads of the reader thread that failed.
    item_read_failures: AtomicU64,
    /// Each peer replica's last entry read (items or load), by replica name.
    peers: Mutex<BTreeMap<String, PeerSync>>,
}

/// What the reader last saw of one peer replica.
#[derive(Debug, Default, Clone, Copy)]
struct PeerSync {
    /// When the peer's last entry was appended (the store's clock), Unix ms.
    last_entry_ms: u64,
    /// When this replica read it (this host's clock), Unix ms.
    read_ms: u64,
    /// Items received from it so far.
    items: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Result_ {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Direction {
    direction: &'static str,
}

type IntGauge = Gauge<u64, AtomicU64>;

impl StoreStats {
    pub fn new(
        backend: &str,
        topology: &str,
        urls: Vec<String>,
        key_prefix: &str,
        replica: &str,
    ) -> Self {
        StoreStats {
            backend: backend.into(),
            topology: topology.into(),
            urls,
            key_prefix: key_prefix.into(),
            replica: replica.into(),
            ..StoreStats::default()
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    pub(crate) fn connected(&self, round_trip_micros: u64) {
        self.up.store(true, Relaxed);
        self.connects.fetch_add(1, Relaxed);
        self.last_round_trip_micros
            .store(round_trip_micros, Relaxed);
    }

    pub(crate) fn connect_failed(&self, error: String) {
        self.connect_failures.fetch_add(1, Relaxed);
        self.set_error(error);
    }

    pub(crate) fn disconnected(&self, error: String) {
        if self.up.swap(false, Relaxed) {
            self.disconnects.fetch_add(1, Relaxed);
        }
        self.set_error(error);
    }

    /// A command failed on a connection that still works.
    pub(crate) fn disconnected_soft(&self, error: String) {
        self.set_error(error);
    }

    fn set_error(&self, error: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn rotated(&self, asks: u64, positions: u64, micros: u64) {
        self.rotations.fetch_add(asks, Relaxed);
        self.rotation_positions.fetch_add(positions, Relaxed);
        self.rotation_micros.fetch_add(micros * asks, Relaxed);
        self.last_round_trip_micros.store(micros, Relaxed);
    }

    pub(crate) fn rotation_failed(&self, asks: u64) {
        self.rotation_failures.fetch_add(asks, Relaxed);
    }

    pub(crate) fn pick_timed_out(&self) {
        self.pick_timeouts.fetch_add(1, Relaxed);
    }

    pub(crate) fn queue_full(&self) {
        self.queue_full.fetch_add(1, Relaxed);
    }

    pub(crate) fn news_dropped(&self) {
        self.news_dropped.fetch_add(1, Relaxed);
    }

    pub(crate) fn published(&self, n: u64) {
        self.items_published.fetch_add(n, Relaxed);
    }

    pub(crate) fn received(&self, n: u64) {
        self.items_received.fetch_add(n, Relaxed);
    }

    pub(crate) fn item_read_failed(&self) {
        self.item_read_failures.fetch_add(1, Relaxed);
    }

    /// The reader read an entry of `peer` appended at `entry_ms`, at `read_ms`, with
    /// `items` items.
    pub(crate) fn peer_synced(&self, peer: &str, entry_ms: u64, read_ms: u64, items: u64) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let p = match peers.get_mut(peer) {
            Some(p) => p,
            None => peers.entry(peer.to_string()).or_default(),
        };
        p.last_entry_ms = p.last_entry_ms.max(entry_ms);
        p.read_ms = read_ms;
        p.items += items;
    }

    /// Each peer's last sync: when its last entry was written and read, the lag between
    /// the two, and the items received from it.
    fn peers_json(&self) -> serde_json::Value {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let list: Vec<serde_json::Value> = peers
            .iter()
            .map(|(name, p)| {
                serde_json::json!({
                    "replica": name,
                    "last_entry_unix_ms": p.last_entry_ms,
                    "last_read_unix_ms": p.read_ms,
                    "lag_ms": p.read_ms.saturating_sub(p.last_entry_ms),
                    "items_received": p.items,
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }

    pub(crate) fn dropped(&self, n: u64) {
        self.items_dropped.fetch_add(n, Relaxed);
    }

    pub(crate) fn assignments(&self, n: u64) {
        self.ledger_assignments.fetch_add(n, Relaxed);
    }

    pub(crate) fn synced(&self, ok: bool, micros: u64) {
        if ok {
            self.syncs.fetch_add(1, Relaxed);
            self.last_round_trip_micros.store(micros, Relaxed);
        } else {
            self.sync_failures.fetch_add(1, Relaxed);
        }
    }

    /// The `rolter_state_*` series.
    pub fn render(&self, out: &mut String) {
        let mut r = Registry::default();
        self.register_link(&mut r);
        self.register_rotations(&mut r);
        self.register_sharing(&mut r);
        self.register_drops(&mut r);
        let rtt = Gauge::<f64, AtomicU64>::default();
        rtt.set(self.last_round_trip_micros.load(Relaxed) as f64 / 1e6);
        r.register(
            "rolter_state_round_trip_seconds",
            "The last store round trip",
            rtt,
        );
        crate::metrics::text::append(out, &r);
    }

    /// Registers the store connection's series: `rolter_state_up`, `_connects` and
    /// `_disconnects`.
    fn register_link(&self, r: &mut Registry) {
        let up = IntGauge::default();
        up.set(u64::from(self.is_up()));
        r.register(
            "rolter_state_up",
            "1 while the shared state store answers, 0 while the replica routes on local state",
            up,
        );
        register_by_result(
            r,
            "rolter_state_connects",
            "Connections to the shared state store by result",
            [
                ("ok", self.connects.load(Relaxed)),
                ("failed", self.connect_failures.load(Relaxed)),
            ],
        );
        register_count(
            r,
            "rolter_state_disconnects",
            "Times the shared state store stopped answering",
            self.disconnects.load(Relaxed),
        );
    }

    /// Registers the shared rotation's series: `rolter_state_rotations`,
    /// `_rotation_positions` and `_rotation_wait_seconds`.
    fn register_rotations(&self, r: &mut Registry) {
        register_by_result(
            r,
            "rolter_state_rotations",
            "Shared-rotation asks (atomic round_robin) by result; store_error and timeout picks used the local cursor",
            [
                ("ok", self.rotations.load(Relaxed)),
                ("store_error", self.rotation_failures.load(Relaxed)),
                ("timeout", self.pick_timeouts.load(Relaxed)),
            ],
        );
        register_count(
            r,
            "rolter_state_rotation_positions",
            "Rotation positions taken from the store (asks times lease)",
            self.rotation_positions.load(Relaxed),
        );
        let wait = Counter::<f64, AtomicU64>::default();
        wait.inc_by(self.rotation_micros.load(Relaxed) as f64 / 1e6);
        r.register(
            "rolter_state_rotation_wait_seconds",
            "Store round trips of answered rotation asks, summed (divide by rolter_state_rotations_total{result=\"ok\"})",
            wait,
        );
    }

    /// Registers what is shared through the store: `rolter_state_items`,
    /// `_ledger_assignments` and `_syncs`.
    fn register_sharing(&self, r: &mut Registry) {
        let items = Family::<Direction, Counter>::default();
        for (direction, n) in [
            ("published", self.items_published.load(Relaxed)),
            ("received", self.items_received.load(Relaxed)),
            ("dropped", self.items_dropped.load(Relaxed)),
        ] {
            items.get_or_create(&Direction { direction }).inc_by(n);
        }
        r.register(
            "rolter_state_items",
            "Shared routing items (session pins, prefixes): published to the other replicas, received from them, dropped (rate limit or store away too long)",
            items,
        );
        register_count(
            r,
            "rolter_state_ledger_assignments",
            "fair_catchup assignments written to the store's books",
            self.ledger_assignments.load(Relaxed),
        );
        register_by_result(
            r,
            "rolter_state_syncs",
            "Periodic exchanges with the store (items, books, load) by result",
            [
                ("ok", self.syncs.load(Relaxed)),
                ("failed", self.sync_failures.load(Relaxed)),
            ],
        );
    }

    /// Registers the messages dropped on full queues: `rolter_state_queue_full` and
    /// `_news_dropped`.
    fn register_drops(&self, r: &mut Registry) {
        register_count(
            r,
            "rolter_state_queue_full",
            "Messages for the state thread dropped because its queue was full",
            self.queue_full.load(Relaxed),
        );
        register_count(
            r,
            "rolter_state_news_dropped",
            "What the store said about the other replicas, dropped because the control thread's queue was full",
            self.news_dropped.load(Relaxed),
        );
        register_count(
            r,
            "rolter_state_item_read_failures",
            "Reads of the other replicas' items and load that failed (the reader retries)",
            self.item_read_failures.load(Relaxed),
        );
    }

    /// The `/admin/state` document (routes' uses are added by the caller).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": self.backend,
            "topology": self.topology,
            "urls": self.urls,
            "key_prefix": self.key_prefix,
            "replica": self.replica,
            "up": self.is_up(),
            "mode": if self.is_up() { "shared" } else { "local_fallback" },
            "last_error": self.last_error(),
            "round_trip_us": self.last_round_trip_micros.load(Relaxed),
            "connects": self.connects.load(Relaxed),
            "connect_failures": self.connect_failures.load(Relaxed),
            "disconnects": self.disconnects.load(Relaxed),
            "rotations": {
                "ok": self.rotations.load(Relaxed),
                "store_error": self.rotation_failures.load(Relaxed),
                "timeout": self.pick_timeouts.load(Relaxed),
                "positions": self.rotation_positions.load(Relaxed),
            },
            "items": {
                "published": self.items_published.load(Relaxed),
                "received": self.items_received.load(Relaxed),
                "dropped": self.items_dropped.load(Relaxed),
            },
            "ledger_assignments": self.ledger_assignments.load(Relaxed),
            "syncs": {
                "ok": self.syncs.load(Relaxed),
                "failed": self.sync_failures.load(Relaxed),
            },
            "queue_full": self.queue_full.load(Relaxed),
            "news_dropped": self.news_dropped.load(Relaxed),
            "item_read_failures": self.item_read_failures.load(Relaxed),
            "peers": self.peers_json(),
        })
    }
}

/// Registers a counter `name` holding `n`.
fn register_count(r: &mut Registry, name: &str, help: &str, n: u64) {
    let counter = Counter::<u64>::default();
    counter.inc_by(n);
    r.register(name, help, counter);
}

/// Registers a counter family `name` with a series per `(result, n)`.
fn register_by_result<const N: usize>(
    r: &mut Registry,
    name: &str,
    help: &str,
    counts: [(&'static str, u64); N],
) {
    let family = Family::<Result_, Counter>::default();
    for (result, n) in counts {
        family.get_or_create(&Result_ { result }).inc_by(n);
    }
    r.register(name, help, family);
}
