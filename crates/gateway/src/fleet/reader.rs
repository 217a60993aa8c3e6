//! The reader thread (`rolter-items`): follows the other replicas as they route, on a store
//! connection of its own.
//!
//! One blocking `XREAD` waits on the item stream and the load stream together, so a prefix
//! or session another replica picked, or a change of its load, reaches this replica's
//! control thread about one round trip after it was written (the state thread appends as
//! it learns), not at the next periodic exchange. Each entry's time tells the peer's last
//! sync and its lag, kept in [`StoreStats`] for `/admin/state`.
//!
//! - Items go to the control thread as [`StoreNews::Items`], oldest first. The first
//!   connection replays what the stream still holds (a late replica learns the fleet's
//!   prefixes); a reconnection goes on from the last entry read.
//! - Loads are kept per peer and dropped when a peer has published nothing for the load
//!   TTL (three sync intervals, at least 300 ms); every change of the sum goes out as
//!   [`StoreNews::FleetLoad`]. While the store is away the fleet's load is forgotten (an
//!   empty sum), so load-aware routes balance on this replica's own.
//!
//! Owns its connection and the peers' last loads. It must not write to the store, nor touch
//! a worker's state.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rolter_store::{Cursor, News, Store, StoreSettings};

use super::inbox::NewsSender;
use super::messages::StoreNews;
use super::stats::StoreStats;

/// Longest wait of one read: also how long a stop may wait for the thread.
const BLOCK: Duration = Duration::from_millis(100);
/// Entries read per stream and read (the rest follow at once).
const READ_ENTRIES: usize = 64;

/// What the reader needs to run.
pub struct Reader {
    pub settings: StoreSettings,
    /// The state thread's origin: entries it wrote are this replica's own.
    pub origin: String,
    pub replica: String,
    pub load_ttl: Duration,
    pub retry_interval: Duration,
    pub news: NewsSender,
    pub stats: Arc<StoreStats>,
    pub stop: Arc<AtomicBool>,
}

/// A peer's counts and when they arrived.
struct PeerLoad {
    counts: Vec<(String, u32)>,
    at: Instant,
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Reader {
    /// Starts the thread; it ends soon after `stop` is set.
    pub fn spawn(mut self) -> std::io::Result<std::thread::JoinHandle<()>> {
        // A read may wait BLOCK on top of the command's own time.
        self.settings.command_timeout += BLOCK;
        std::thread::Builder::new()
            .name("rolter-items".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let mut store: Option<Store> = None;
        let mut cursor: Option<Cursor> = None;
        let mut loads: BTreeMap<String, PeerLoad> = BTreeMap::new();
        while !self.stop.load(Ordering::Relaxed) {
            let Some(s) = store.as_mut() else {
                store = self.connect(&mut cursor, &mut loads);
                if store.is_none() {
                    std::thread::sleep(self.retry_interval.min(BLOCK));
                }
                continue;
            };
            let c = cursor.get_or_insert_with(|| Cursor {
                items: "0".into(),
                loads: "0".into(),
            });
            match s.watch(&self.origin, &self.replica, c, READ_ENTRIES, Some(BLOCK)) {
                Ok(news) => self.take(news, &mut loads),
                Err(e) => {
                    self.stats.item_read_failed();
                    if e.is_connection() {
                        store = None;
                        if !loads.is_empty() {
                            loads.clear();
                            self.send(StoreNews::FleetLoad(Vec::new()));
                        }
                        std::thread::sleep(self.retry_interval.min(Duration::from_secs(1)));
                    }
                }
            }
            self.expire(&mut loads);
        }
    }

    /// A connection, and on the first one the load stream's start (its past is the
    /// peers' old counts; their current ones come from the load keys).
    fn connect(
        &self,
        cursor: &mut Option<Cursor>,
        loads: &mut BTreeMap<String, PeerLoad>,
    ) -> Option<Store> {
        let mut s = Store::connect(&self.settings).ok()?;
        let now = s.watch_cursor().ok()?;
        let c = cursor.get_or_insert_with(|| Cursor {
            items: "0".into(),
            loads: now.loads.clone(),
        });
        c.loads = now.loads;
        if let Ok(fleet) = s.read_load(&self.replica) {
            // The sum by target stands for the peers until each publishes again.
            let at = Instant::now();
            loads.clear();
            let counts = fleet
                .into_iter()
                .map(|(t, n)| (t, u32::try_from(n).unwrap_or(u32::MAX)))
                .collect();
            loads.insert(String::new(), PeerLoad { counts, at });
            self.send_load(loads);
        }
        Some(s)
    }

    fn take(&self, news: News, loads: &mut BTreeMap<String, PeerLoad>) {
        let now_ms = unix_millis();
        if !news.entries.is_empty() {
            let mut items = Vec::new();
            for e in news.entries {
                let peer = e.origin.split('#').next().unwrap_or(&e.origin);
                self.stats
                    .peer_synced(peer, e.unix_ms, now_ms, e.items.len() as u64);
                self.stats.received(e.items.len() as u64);
                items.extend(e.items);
            }
            if !items.is_empty() {
                self.send(StoreNews::Items(items));
            }
        }
        if !news.loads.is_empty() {
            let at = Instant::now();
            // A snapshot taken at connection time gives way to the peers' own entries.
            loads.remove("");
            for l in news.loads {
                self.stats.peer_synced(&l.replica, l.unix_ms, now_ms, 0);
                loads.insert(
                    l.replica,
                    PeerLoad {
                        counts: l.counts,
                        at,
                    },
                );
            }
            self.send_load(loads);
        }
    }

    /// Drops peers that published nothing for the load TTL.
    fn expire(&self, loads: &mut BTreeMap<String, PeerLoad>) {
        let before = loads.len();
        loads.retain(|_, l| l.at.elapsed() < self.load_ttl);
        if loads.len() != before {
            self.send_load(loads);
        }
    }

    fn send_load(&self, loads: &BTreeMap<String, PeerLoad>) {
        let mut sum: BTreeMap<&str, u64> = BTreeMap::new();
        for l in loads.values() {
            for (t, n) in &l.counts {
                *sum.entry(t).or_default() += u64::from(*n);
            }
        }
        let fleet = sum.into_iter().map(|(t, n)| (t.to_string(), n)).collect();
        self.send(StoreNews::FleetLoad(fleet));
    }

    fn send(&self, news: StoreNews) {
        if !self.news.send(news) {
            self.stats.news_dropped();
        }
    }
}
