//! The hard caps the workers share: each target's exact admission count (`max_concurrent`
//! per gateway) and the process-wide count of client connections (`server.max_connections`).
//!
//! These are the only counters on the request path that every core touches: a target's
//! in-flight count is otherwise exchanged between the cores every signal tick, which is
//! fine for ranking but lets a burst over several cores overshoot a cap. Admission is one
//! compare-and-swap on the chosen target's counter (lock-free, one cache line per target)
//! and release is one decrement when the guard drops, however the attempt ended. Targets
//! without `max_concurrent` are not counted here at all. It must not hold locks, block, or
//! know about routes or strategies.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use rolter_config::reload::unchanged_targets;
use rolter_config::Target;

/// One target's admitted attempts, on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
pub struct Slot {
    admitted: AtomicU32,
}

/// Every target's admission counter for one configuration, shared by all workers.
pub struct TargetCaps {
    slots: Box<[Arc<Slot>]>,
    limits: Box<[Option<u32>]>,
}

impl TargetCaps {
    /// The counters for `targets`. With `previous` (a reload), an unchanged target keeps
    /// its counter, so the attempts still running on the old configuration count against
    /// the same cap; a new or changed target starts at zero.
    pub fn new(targets: &[Target], previous: Option<(&TargetCaps, &[Target])>) -> Arc<Self> {
        let kept = previous.map(|(caps, old)| (caps, unchanged_targets(old, targets)));
        let slots = (0..targets.len())
            .map(|i| {
                kept.as_ref()
                    .and_then(|(caps, map)| map[i].map(|o| caps.slots[o].clone()))
                    .unwrap_or_default()
            })
            .collect();
        Arc::new(TargetCaps {
            slots,
            limits: targets.iter().map(|t| t.max_concurrent).collect(),
        })
    }

    /// Attempts admitted to target `t` now, over every core (0 for an uncapped target).
    pub fn admitted(&self, t: usize) -> u32 {
        self.slots[t].admitted.load(Ordering::Acquire)
    }

    /// Whether target `t` is at its `max_concurrent` now.
    pub fn is_full(&self, t: usize) -> bool {
        self.limits[t].is_some_and(|m| self.admitted(t) >= m)
    }

    /// Admits one attempt to target `t`, unless it is at its cap less the `held_back`
    /// places reserved for classes ranked before the request's. The guard releases the
    /// place when dropped.
    pub fn try_admit(&self, t: usize, held_back: u32) -> Option<Admitted<'_>> {
        let Some(max) = self.limits[t] else {
            return Some(Admitted { slot: None });
        };
        let max = max.saturating_sub(held_back);
        let slot = &self.slots[t].admitted;
        let mut now = slot.load(Ordering::Acquire);
        loop {
            if now >= max {
                return None;
            }
            match slot.compare_exchange_weak(now, now + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Admitted { slot: Some(slot) }),
                Err(seen) => now = seen,
            }
        }
    }
}

/// One admitted attempt; its place is given back when it drops (answered, failed, the
/// client gone, the stream cut, or a retry elsewhere).
#[must_use = "the place is released when the guard drops"]
pub struct Admitted<'a> {
    slot: Option<&'a AtomicU32>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            s.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The process's open client connections, over every worker, against
/// `server.max_connections`.
#[derive(Default)]
pub struct ConnectionCap {
    open: AtomicUsize,
}

impl ConnectionCap {
    /// Takes a place for a new connection unless `max` are open (`None`: no cap, still
    /// counted).
    pub fn try_open(self: &Arc<Self>, max: Option<usize>) -> Option<OpenConnection> {
        let mut now = self.open.load(Ordering::Acquire);
        loop {
            if max.is_some_and(|m| now >= m) {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(OpenConnection { cap: self.clone() }),
                Err(seen) => now = seen,
            }
        }
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// An open client connection's place; given back when it drops.
pub struct OpenConnection {
    cap: Arc<ConnectionCap>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.cap.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(caps: &[Option<u32>]) -> Vec<Target> {
        let mut toml = String::new();
        for (i, c) in caps.iter().enumerate() {
            toml.push_str(&format!(
                "[[targets]]\nname = \"t{i}\"\nurl = \"http://127.0.0.1:{}\"\n",
                9000 + i
            ));
            if let Some(c) = c {
                toml.push_str(&format!("max_concurrent = {c}\n"));
            }
        }
        rolter_config::load_str(&toml, "caps.toml")
            .unwrap_or_else(|e| panic!("{e}"))
            .targets
    }

    #[test]
    fn admits_up_to_the_cap_and_releases_on_drop() {
        let caps = TargetCaps::new(&targets(&[Some(2), None]), None);
        let a = caps.try_admit(0, 0).expect("first");
        let b = caps.try_admit(0, 0).expect("second");
        assert!(caps.try_admit(0, 0).is_none());
        assert!(caps.is_full(0));
        drop(a);
        assert_eq!(caps.admitted(0), 1);
        let c = caps.try_admit(0, 0).expect("freed");
        drop((b, c));
        assert_eq!(caps.admitted(0), 0);
        // Uncapped: always admitted, never counted.
        let _u: Vec<_> = (0..100).map(|_| caps.try_admit(1, 0).unwrap()).collect();
        assert_eq!(caps.admitted(1), 0);
    }

    #[test]
    fn a_reload_keeps_the_counter_of_an_unchanged_target() {
        let old_targets = targets(&[Some(1), Some(1)]);
        let old = TargetCaps::new(&old_targets, None);
        let _a = old.try_admit(0, 0).unwrap();
        let _b = old.try_admit(1, 0).unwrap();
        let new_targets = targets(&[Some(1), Some(3)]);
        let new = TargetCaps::new(&new_targets, Some((&old, &old_targets)));
        // t0 is unchanged: the old configuration's attempt still holds its place.
        assert!(new.try_admit(0, 0).is_none());
        // t1 changed (its cap): a fresh counter.
        assert_eq!(new.admitted(1), 0);
    }

    #[test]
    fn connections_are_capped() {
        let cap = Arc::new(ConnectionCap::default());
        let a = cap.try_open(Some(1)).unwrap();
        assert!(cap.try_open(Some(1)).is_none());
        drop(a);
        assert!(cap.try_open(Some(1)).is_some());
        assert_eq!(cap.open(), 0);
    }
}
