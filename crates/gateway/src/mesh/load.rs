//! A worker's view of every target's load: `in_flight` (this core's exact count plus the
//! other cores' latest snapshots) and `queue_depth` (the engine's own waiting queue, from the
//! control thread's scrape), whether the target is eligible (healthy, not ejected), and
//! until when it cools after asking to be left alone (a 429 with `Retry-After`).
//!
//! Owned by one worker (`Cell`s, no atomics). It must not block or allocate per request:
//! counting is a cell update, and snapshots are built only on the signal tick.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_core::TargetId;
use rolter_engine::lora::LoraView;

/// Per-target load as one worker sees it.
pub struct LoadView {
    /// Requests this core is proxying, per target (exact).
    local: Box<[Cell<u32>]>,
    /// Sum over the other cores' latest snapshots, per target.
    remote: Box<[Cell<u32>]>,
    /// The latest snapshot received from each other core (indexed by worker id).
    peers: RefCell<Vec<Option<Arc<[u32]>>>>,
    /// Engine queue depth from the scrape (0 when off or stale).
    queue: Box<[Cell<u32>]>,
    /// Engine KV-cache use from the scrape (NaN when unknown).
    kv: Box<[Cell<f32>]>,
    /// Healthy and not ejected.
    eligible: Box<[Cell<bool>]>,
    /// Until when the target cools after a 429 or a 503 with `Retry-After` (seen on this
    /// core, or on another and sent by the control thread).
    cooling: Box<[Cell<Option<Instant>>]>,
    /// Slow start's share factor (1 outside a ramp).
    ramp: Box<[Cell<f32>]>,
    /// The other gateway replicas' requests in flight, per target, from the shared state
    /// store (as fresh as its `sync_interval`; zero without a store).
    fleet: Box<[Cell<u32>]>,
    /// The local counts changed since the last snapshot was published.
    dirty: Cell<bool>,
    /// LoRA adapter residency per target, as the control thread last published it.
    pub lora: LoraView,
}

impl LoadView {
    pub fn new(targets: usize, workers: usize) -> Self {
        let cells = |v: u32| (0..targets).map(|_| Cell::new(v)).collect();
        LoadView {
            local: cells(0),
            remote: cells(0),
            peers: RefCell::new(vec![None; workers]),
            queue: cells(0),
            kv: (0..targets).map(|_| Cell::new(f32::NAN)).collect(),
            eligible: (0..targets).map(|_| Cell::new(true)).collect(),
            cooling: (0..targets).map(|_| Cell::new(None)).collect(),
            ramp: (0..targets).map(|_| Cell::new(1.0)).collect(),
            fleet: cells(0),
            dirty: Cell::new(false),
            lora: Default::default(),
        }
    }

    /// Requests to `t` in flight on every core (this core's exact count plus the others'
    /// latest snapshots).
    #[inline]
    pub fn in_flight(&self, t: TargetId) -> u64 {
        u64::from(self.local[t].get()) + u64::from(self.remote[t].get())
    }

    /// Requests to `t` in flight on this core only.
    #[inline]
    pub fn local_in_flight(&self, t: TargetId) -> u64 {
        u64::from(self.local[t].get())
    }

    /// Requests to `t` in flight on the other gateway replicas, as the store last said.
    #[inline]
    pub fn fleet_in_flight(&self, t: TargetId) -> u64 {
        u64::from(self.fleet[t].get())
    }

    /// Applies the other replicas' counts from the store.
    pub fn apply_fleet(&self, counts: &[u32]) {
        for (cell, &n) in self.fleet.iter().zip(counts) {
            cell.set(n);
        }
    }

    /// What a strategy sees: in flight everywhere plus the engine's waiting queue.
    #[inline]
    pub fn load(&self, t: TargetId) -> u64 {
        self.in_flight(t) + u64::from(self.queue[t].get())
    }

    /// The engine's waiting queue from a fresh scrape (0 when unknown).
    #[inline]
    pub fn queue_depth(&self, t: TargetId) -> u64 {
        u64::from(self.queue[t].get())
    }

    /// The engine's KV-cache use in [0, 1] from a fresh scrape.
    #[inline]
    pub fn kv_usage(&self, t: TargetId) -> Option<f32> {
        let v = self.kv[t].get();
        (!v.is_nan()).then_some(v)
    }

    #[inline]
    pub fn eligible(&self, t: TargetId) -> bool {
        self.eligible[t].get()
    }

    /// Counts a request to `t` until the guard drops.
    #[inline]
    pub fn enter(&self, t: TargetId) -> InFlight<'_> {
        let c = &self.local[t];
        c.set(c.get().saturating_add(1));
        self.dirty.set(true);
        InFlight { view: self, t }
    }

    /// This core's counts, when they changed since the last call or `always`.
    pub fn take_snapshot(&self, always: bool) -> Option<Arc<[u32]>> {
        if !self.dirty.replace(false) && !always {
            return None;
        }
        Some(self.local.iter().map(Cell::get).collect())
    }

    /// Replaces core `from`'s contribution with its new snapshot.
    pub fn apply_peer(&self, from: usize, snapshot: Arc<[u32]>) {
        let mut peers = self.peers.borrow_mut();
        let Some(slot) = peers.get_mut(from) else {
            return;
        };
        for (t, r) in self.remote.iter().enumerate() {
            let old = slot.as_ref().and_then(|s| s.get(t)).copied().unwrap_or(0);
            let new = snapshot.get(t).copied().unwrap_or(0);
            r.set(r.get().saturating_sub(old).saturating_add(new));
        }
        *slot = Some(snapshot);
    }

    /// Applies the control thread's view: eligibility, queue depth and cooling per target.
    pub fn apply_targets(&self, targets: &[TargetSignal]) {
        for (t, s) in targets.iter().enumerate().take(self.queue.len()) {
            self.queue[t].set(s.queue_depth);
            self.kv[t].set(s.kv_usage.unwrap_or(f32::NAN));
            self.eligible[t].set(s.eligible);
            if let Some(until) = s.cooling_until {
                self.cool(t, until);
            }
            self.ramp[t].set(s.ramp);
        }
    }

    /// `t` cools until `until` (a later time already noted stands).
    pub fn cool(&self, t: TargetId, until: Instant) {
        let cell = &self.cooling[t];
        if cell.get().is_none_or(|u| u < until) {
            cell.set(Some(until));
        }
    }

    /// How long `t` still cools at `now`, if it does.
    #[inline]
    pub fn cooling_left(&self, t: TargetId, now: Instant) -> Option<Duration> {
        let until = self.cooling[t].get()?;
        if until <= now {
            self.cooling[t].set(None);
            return None;
        }
        Some(until - now)
    }

    /// Slow start's share factor for `t`, in (0, 1].
    #[inline]
    pub fn ramp(&self, t: TargetId) -> f32 {
        self.ramp[t].get()
    }
}

/// The control thread's word on one target, as every worker receives it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetSignal {
    /// Healthy and not ejected.
    pub eligible: bool,
    /// The engine's waiting queue from a fresh scrape; 0 when scraping is off or stale.
    pub queue_depth: u32,
    /// Until when the target cools after a 429 (or a 503 with `Retry-After`) some core saw.
    pub cooling_until: Option<Instant>,
    /// The engine's KV-cache use in [0, 1] from a fresh scrape.
    pub kv_usage: Option<f32>,
    /// Slow start: the share factor of a target that joined recently, in (0, 1]; 1 outside
    /// a ramp.
    pub ramp: f32,
}

/// Decrements a target's in-flight count when dropped.
pub struct InFlight<'a> {
    view: &'a LoadView,
    t: TargetId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let c = &self.view.local[self.t];
        c.set(c.get().saturating_sub(1));
        self.view.dirty.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_counts_are_exact_and_mark_the_view_dirty() {
        let v = LoadView::new(2, 2);
        assert!(v.take_snapshot(false).is_none(), "nothing changed yet");
        let a = v.enter(0);
        let b = v.enter(0);
        assert_eq!(v.in_flight(0), 2);
        assert_eq!(v.local_in_flight(0), 2);
        assert_eq!(&*v.take_snapshot(false).unwrap(), &[2, 0]);
        assert!(
            v.take_snapshot(false).is_none(),
            "published once per change"
        );
        drop(a);
        drop(b);
        assert_eq!(v.in_flight(0), 0);
        assert_eq!(&*v.take_snapshot(false).unwrap(), &[0, 0]);
        // On the heartbeat a snapshot goes out unchanged.
        assert!(v.take_snapshot(false).is_none());
        assert_eq!(&*v.take_snapshot(true).unwrap(), &[0, 0]);
    }

    #[test]
    fn peer_snapshots_replace_rather_than_accumulate() {
        let v = LoadView::new(2, 3);
        v.apply_peer(1, Arc::from([3u32, 1]));
        v.apply_peer(2, Arc::from([2u32, 0]));
        assert_eq!((v.in_flight(0), v.in_flight(1)), (5, 1));
        v.apply_peer(1, Arc::from([0u32, 4]));
        assert_eq!((v.in_flight(0), v.in_flight(1)), (2, 4));
        let _g = v.enter(1);
        assert_eq!(v.in_flight(1), 5);
        // A snapshot from an unknown core is ignored.
        v.apply_peer(9, Arc::from([100u32, 100]));
        assert_eq!(v.in_flight(0), 2);
    }

    #[test]
    fn queue_depth_adds_to_load_and_eligibility_follows_control() {
        let v = LoadView::new(2, 1);
        let _g = v.enter(0);
        v.apply_targets(&[
            TargetSignal {
                eligible: true,
                queue_depth: 7,
                kv_usage: Some(0.5),
                cooling_until: None,
                ramp: 1.0,
            },
            TargetSignal {
                eligible: false,
                queue_depth: 0,
                kv_usage: None,
                cooling_until: None,
                ramp: 0.5,
            },
        ]);
        assert_eq!(v.load(0), 8);
        assert_eq!(v.in_flight(0), 1);
        assert!(v.eligible(0));
        assert!(!v.eligible(1));
        assert_eq!(v.queue_depth(0), 7);
        assert_eq!((v.kv_usage(0), v.kv_usage(1)), (Some(0.5), None));
    }

    #[test]
    fn a_cooling_target_returns_when_its_time_is_up() {
        let v = LoadView::new(2, 1);
        let t0 = Instant::now();
        assert_eq!(v.cooling_left(0, t0), None);
        v.cool(0, t0 + Duration::from_secs(2));
        // An earlier time does not shorten it.
        v.cool(0, t0 + Duration::from_secs(1));
        assert_eq!(v.cooling_left(0, t0), Some(Duration::from_secs(2)));
        assert_eq!(v.cooling_left(1, t0), None);
        // Another core's cooling arrives with the control thread's signals.
        v.apply_targets(&[
            TargetSignal {
                eligible: true,
                queue_depth: 0,
                kv_usage: None,
                cooling_until: None,
                ramp: 1.0,
            },
            TargetSignal {
                eligible: true,
                queue_depth: 0,
                kv_usage: None,
                cooling_until: Some(t0 + Duration::from_secs(3)),
                ramp: 1.0,
            },
        ]);
        assert_eq!(v.cooling_left(0, t0), Some(Duration::from_secs(2)));
        assert_eq!(v.cooling_left(1, t0), Some(Duration::from_secs(3)));
        assert_eq!(v.cooling_left(0, t0 + Duration::from_secs(2)), None);
        assert_eq!(v.cooling_left(0, t0), None, "cleared once over");
    }
}
