//! [`Store`]: one connection to the shared state and the calls the gateway makes on it.
//!
//! Owns the connection's life: connect (AUTH, then `SCRIPT LOAD` of every script, so the
//! first pick is not the one that pays for it), the calls, each delegated to the module that
//! owns its keys, and the rule that after a connection error every later call fails at once
//! with the same error (a late reply would otherwise answer the next command). It must not
//! reconnect by itself, retry or log: the state thread does, on its own schedule.

use std::time::{Duration, Instant};

use crate::connect::{self, Conn};
use crate::error::StoreError;
use crate::items::{self, Item};
use crate::key_layout::Keys;
use crate::key_use::{self, KeyUse};
use crate::ledger::{self, LedgerBucket, LedgerRow};
use crate::load;
use crate::rotation::{self, RotateAsk};
use crate::settings::StoreSettings;
use crate::watch::{self, Cursor, News};

/// One connection: to a standalone server, to the master a sentinel names, or to a cluster.
/// Blocking; it belongs on one dedicated thread, never on a worker.
pub struct Store {
    conn: Conn,
    keys: Keys,
    /// The connection error that ended this connection, returned by every later call.
    broken: Option<StoreError>,
}

impl Store {
    /// Connects, authenticates and loads the scripts, each step bounded by the settings'
    /// timeouts.
    pub fn connect(s: &StoreSettings) -> Result<Store, StoreError> {
        let mut conn = connect::open(s)?;
        rotation::SCRIPT.load(conn.link())?;
        load::READ_SCRIPT.load(conn.link())?;
        Ok(Store {
            conn,
            keys: Keys::new(&s.key_prefix),
            broken: None,
        })
    }

    /// One `PING`, and how long its round trip took.
    pub fn ping(&mut self) -> Result<Duration, StoreError> {
        self.run(|link, _| {
            let start = Instant::now();
            redis::cmd("PING").exec(link)?;
            Ok(start.elapsed())
        })
    }

    /// Advances `route`'s shared smooth weighted rotation by `lease` positions over
    /// `members` (name, weight) in one script call; returns the picked member indices in
    /// order. Members not listed keep their stored current weight.
    pub fn rotate(
        &mut self,
        route: &str,
        members: &[(&str, f64)],
        lease: u32,
    ) -> Result<Vec<u16>, StoreError> {
        let ask = RotateAsk {
            route,
            members,
            lease,
        };
        Ok(self.rotate_many(&[ask])?.pop().unwrap_or_default())
    }

    /// Several rotations in one pipeline (one round trip); one pick list per ask.
    pub fn rotate_many(&mut self, asks: &[RotateAsk<'_>]) -> Result<Vec<Vec<u16>>, StoreError> {
        self.run(|link, keys| rotation::rotate_many(link, keys, asks))
    }

    /// Adds picks and received counts to the fair_catchup ledger, every row in one pipeline;
    /// the buckets written to expire `ttl` after this write.
    pub fn add_ledger(&mut self, rows: &[LedgerRow<'_>], ttl: Duration) -> Result<(), StoreError> {
        self.run(|link, keys| ledger::add(link, keys, rows, ttl))
    }

    /// Adds this replica's new counts of the client API keys to `minute` and reads the
    /// minute's fleet totals back, sorted by key name.
    pub fn exchange_key_use(
        &mut self,
        minute: u64,
        rows: &[KeyUse],
        ttl: Duration,
    ) -> Result<Vec<KeyUse>, StoreError> {
        self.run(|link, keys| key_use::add_and_read(link, keys, minute, rows, ttl))
    }

    /// The buckets `first..=last` of `route` the store holds, in bucket order.
    pub fn read_ledger(
        &mut self,
        route: &str,
        first: u64,
        last: u64,
    ) -> Result<Vec<LedgerBucket>, StoreError> {
        self.run(|link, keys| ledger::read(link, keys, route, first, last))
    }

    /// Appends `items` as one stream entry from `origin`, the stream trimmed to about
    /// `maxlen` entries; returns the entry's id.
    pub fn append_items(
        &mut self,
        origin: &str,
        items: &[Item],
        maxlen: usize,
    ) -> Result<String, StoreError> {
        self.run(|link, keys| items::append(link, keys, origin, items, maxlen))
    }

    /// Up to `count` entries after `last_id` (`"0"` replays the stream; [`Store::last_item_id`]
    /// starts from now), without blocking: the new last id and the items of other origins.
    pub fn read_items(
        &mut self,
        origin: &str,
        last_id: &str,
        count: usize,
    ) -> Result<(String, Vec<Item>), StoreError> {
        self.run(|link, keys| items::read(link, keys, origin, last_id, count))
    }

    /// The id to start reading items after: the newest entry's, `0-0` when there is none.
    pub fn last_item_id(&mut self) -> Result<String, StoreError> {
        self.run(items::last_id)
    }

    /// Waits at most `block` (`None`: not at all) for entries after `cursor` on the item and
    /// load streams, and returns those of other origins (`origin` for items, `replica` for
    /// load), moving the cursor past all it read.
    pub fn watch(
        &mut self,
        origin: &str,
        replica: &str,
        cursor: &mut Cursor,
        count: usize,
        block: Option<Duration>,
    ) -> Result<News, StoreError> {
        self.run(|link, keys| watch::watch(link, keys, origin, replica, cursor, count, block))
    }

    /// Where to start watching so that only what is appended from now on is read.
    pub fn watch_cursor(&mut self) -> Result<Cursor, StoreError> {
        self.run(watch::cursor_now)
    }

    /// Publishes `replica`'s in-flight count per target, live for `ttl`, and appends it to
    /// the load stream.
    pub fn publish_load(
        &mut self,
        replica: &str,
        counts: &[(&str, u32)],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.run(|link, keys| load::publish(link, keys, replica, counts, ttl))
    }

    /// Appends `replica`'s in-flight counts to the load stream alone (one command): a change
    /// between two [`Store::publish_load`]s, for the replicas that follow the stream.
    pub fn append_load(&mut self, replica: &str, counts: &[(&str, u32)]) -> Result<(), StoreError> {
        self.run(|link, keys| load::append(link, keys, replica, counts))
    }

    /// The other live replicas' in-flight counts, summed per target name (sorted by name).
    pub fn read_load(&mut self, replica: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.run(|link, keys| load::read(link, keys, replica))
    }

    /// Runs `f` unless the connection already broke, and remembers if it breaks now.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut dyn redis::ConnectionLike, &Keys) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let out = f(self.conn.link(), &self.keys).map_err(|e| match e {
            StoreError::Connect(m) => StoreError::Connect(format!("connection lost: {m}")),
            e => e,
        });
        if let Err(e) = &out {
            if e.is_connection() {
                self.broken = Some(e.clone());
            }
        }
        out
    }
}
