//! Session pins: which target last served an explicit session (`x-session-id`), for how
//! long that still counts (TTL), and a bound on how many sessions a core remembers (least
//! recently used forgotten first, expired ones before that).
//!
//! Shared by the strategies that pin sessions (`cache_aware`, `pipeline`), with the options
//! they share ([`PinsAndSharing`]). Per core and synchronous: an index-linked LRU list over
//! a reused slot vector, so pinning allocates only while the map grows to its bound. It
//! must not decide routing by itself.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::key_map::KeyMap;
use crate::requirements::StoreUse;
use crate::values::OptionError;
use rolter_core::TargetId;

/// The options of the strategies that pin sessions and learn prefixes (`cache_aware`,
/// `pipeline`) beside their own `session_ttl`: how many sessions a core remembers, and
/// whether pins and prefixes go to the other gateway replicas. Flattened into their
/// options (`#[serde(flatten)]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PinsAndSharing {
    /// Sessions remembered per core.
    pub max_sessions: usize,
    /// Session pins go to the other gateway replicas through the shared state store.
    pub share_sessions: bool,
    /// Prefix insertions go to the other gateway replicas through the shared state store.
    pub share_prefixes: bool,
}

impl Default for PinsAndSharing {
    fn default() -> Self {
        PinsAndSharing {
            max_sessions: 100_000,
            share_sessions: false,
            share_prefixes: false,
        }
    }
}

impl PinsAndSharing {
    /// The help lines of the three options.
    pub const HELP: [(&'static str, &'static str); 3] = [
        (
            "max_sessions",
            "sessions remembered per core (least recently used forgotten first)",
        ),
        (
            "share_sessions",
            "publish session pins to the other gateway replicas, and apply theirs, through the shared state store ([state])",
        ),
        (
            "share_prefixes",
            "publish prefix insertions to the other gateway replicas, and apply theirs, through the shared state store ([state])",
        ),
    ];

    /// The options' checks (`max_sessions` of at least 1).
    pub fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::positive(errors, "max_sessions", self.max_sessions as u64);
    }

    /// What `strategy` keeps in the shared state store through these options, if anything.
    pub fn store_use(&self, strategy: &str) -> Option<StoreUse> {
        StoreUse::sharing(strategy, self.share_sessions, self.share_prefixes)
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct SessionEntry {
    key: u64,
    target: TargetId,
    last: Instant,
    newer: u32,
    older: u32,
    /// Learned from another gateway replica (through the store), not on this one.
    fleet: bool,
}

/// Session key → (target, last use), bounded, least recently used evicted first.
/// The target of a pin whose target left the configuration: never a candidate.
pub const GONE: TargetId = TargetId::MAX;

#[derive(Debug)]
pub struct SessionPins {
    map: KeyMap<u32>,
    entries: Vec<SessionEntry>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    max: usize,
    ttl: Duration,
}

impl SessionPins {
    pub fn new(max: usize, ttl: Duration) -> Self {
        SessionPins {
            map: KeyMap::default(),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            max: max.max(1),
            ttl,
        }
    }

    /// Whether pins are kept at all (a TTL of zero turns affinity off).
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    /// Entry slots held (live or free), for memory-bound checks.
    pub fn storage(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The target that served `key` within the TTL.
    pub fn get(&self, key: u64, now: Instant) -> Option<TargetId> {
        self.get_with_origin(key, now).map(|(t, _)| t)
    }

    /// [`get`](SessionPins::get), and whether the pin came from another gateway replica.
    pub fn get_with_origin(&self, key: u64, now: Instant) -> Option<(TargetId, bool)> {
        let e = &self.entries[*self.map.get(&key)? as usize];
        (now.saturating_duration_since(e.last) <= self.ttl).then_some((e.target, e.fleet))
    }

    fn unlink(&mut self, i: u32) {
        let SessionEntry { newer, older, .. } = self.entries[i as usize];
        if newer == NIL {
            self.head = older;
        } else {
            self.entries[newer as usize].older = older;
        }
        if older == NIL {
            self.tail = newer;
        } else {
            self.entries[older as usize].newer = newer;
        }
    }

    fn link_front(&mut self, i: u32) {
        let old = self.head;
        self.entries[i as usize].newer = NIL;
        self.entries[i as usize].older = old;
        if old == NIL {
            self.tail = i;
        } else {
            self.entries[old as usize].newer = i;
        }
        self.head = i;
    }

    fn evict_oldest(&mut self) {
        let i = self.tail;
        let key = self.entries[i as usize].key;
        self.unlink(i);
        self.map.remove(&key);
        self.free.push(i);
    }

    /// Pins `key` to `target`, as this replica routed it (or another core of it).
    /// The pins for a configuration whose targets moved (`map[new] = Some(old)`): a pin to
    /// a kept target follows it to its new id; a pin to a removed target points nowhere
    /// (no candidate has [`GONE`]), so that session is placed afresh and pinned again.
    pub fn remap(&mut self, map: &[Option<TargetId>]) {
        let mut to_new = vec![GONE; map.iter().flatten().max().map_or(0, |&m| m + 1)];
        for (new, from) in map.iter().enumerate() {
            if let Some(old) = *from {
                to_new[old] = new;
            }
        }
        for e in &mut self.entries {
            e.target = to_new.get(e.target).copied().unwrap_or(GONE);
        }
    }

    pub fn pin(&mut self, key: u64, target: TargetId, now: Instant) {
        self.pin_as(key, target, now, false);
    }

    /// [`pin`](SessionPins::pin), or (`fleet`) as another gateway replica routed it.
    pub fn pin_as(&mut self, key: u64, target: TargetId, now: Instant, fleet: bool) {
        if let Some(&i) = self.map.get(&key) {
            let e = &mut self.entries[i as usize];
            e.target = target;
            e.last = now;
            e.fleet = fleet;
            self.unlink(i);
            self.link_front(i);
            return;
        }
        while self.tail != NIL
            && now.saturating_duration_since(self.entries[self.tail as usize].last) > self.ttl
        {
            self.evict_oldest();
        }
        while self.map.len() >= self.max {
            self.evict_oldest();
        }
        let entry = SessionEntry {
            key,
            target,
            last: now,
            newer: NIL,
            older: NIL,
            fleet,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i as usize] = entry;
                i
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.map.insert(key, i);
        self.link_front(i);
    }
}
