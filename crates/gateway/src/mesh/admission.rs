//! The routes' queues, shared by every worker: who gets the next place when a route's
//! targets are full. Exact per gateway, like the `max_concurrent` counters (`mesh::caps`):
//! one queue per route with `queue_max` seats, whichever core its waiters run on.
//!
//! A waiter holds a seat: one atomic word with its class's rank and its virtual finish
//! tag. Waiters are admitted in (rank, tag) order: every class before the classes ranked
//! after it, and within a class by weighted fair queueing over tenants (self-clocked fair
//! queueing: a tenant's next request finishes at `max(V, its last finish) + cost / share`,
//! its cost the request's estimated tokens, and `V` the tag of the last waiter admitted), so
//! a tenant that floods the queue is served its share and the others theirs. Only the
//! first waiter (of its model) tries admission; the others wait for their turn.
//!
//! When every seat is taken, a newcomer of a class ranked before some waiter's takes the
//! seat of the last-ranked, latest-finishing waiter, which is displaced (it finds its seat
//! no longer its own and answers 503). Nothing admitted is ever displaced.
//!
//! Owns the seats, the virtual time and the tenants' finish tags. It takes no lock and
//! never blocks: a seat is taken and given back by compare-and-swap. It must not admit a
//! target itself (that is `path::pick`) nor know about connections or time.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rolter_config::Config;

/// Tenants a route tells apart by a header (hashed into this many finish tags, after one
/// per key and one for callers without a key).
pub const HEADER_TENANTS: usize = 1024;

const OCCUPIED: u64 = 1 << 63;
const RANK_SHIFT: u32 = 60;
const GEN_SHIFT: u32 = 48;
const TAG_MASK: u64 = (1 << GEN_SHIFT) - 1;
const GEN_MASK: u64 = 0xfff;

/// One waiter's place: its word (0 when free) and its model's hash.
#[derive(Default)]
#[repr(align(64))]
struct Seat {
    word: AtomicU64,
    model: AtomicU32,
}

/// One route's queue.
pub struct SharedQueue {
    seats: Box<[Seat]>,
    /// Seats taken or being taken (never more than `seats.len()`).
    taken: AtomicUsize,
    /// The tag of the last waiter admitted (fair queueing's virtual time).
    vtime: AtomicU64,
    /// Each tenant's last finish tag.
    finish: Box<[AtomicU64]>,
    generation: AtomicU32,
}

/// How joining the queue went.
pub enum Joined<'q> {
    /// A seat of its own.
    Seated(Ticket<'q>),
    /// A seat taken from a later-ranked waiter, who is displaced.
    Displaced(Ticket<'q>),
    /// Every seat is taken by a waiter ranked the same or before.
    Full,
}

/// A waiter's seat, given back when it drops (unless another waiter took it over).
pub struct Ticket<'q> {
    queue: &'q SharedQueue,
    seat: usize,
    word: u64,
    admitted: bool,
}

impl SharedQueue {
    /// A queue of `max` seats over `tenants` tenants.
    pub fn new(max: usize, tenants: usize) -> Self {
        SharedQueue {
            seats: (0..max.max(1)).map(|_| Seat::default()).collect(),
            taken: AtomicUsize::new(0),
            vtime: AtomicU64::new(0),
            finish: (0..tenants.max(1)).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU32::new(0),
        }
    }

    /// Whether any request waits (one load: the path's only cost when none does).
    #[inline]
    pub fn busy(&self) -> bool {
        self.taken.load(Ordering::Acquire) > 0
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }

    /// The finish tag of `tenant`'s next request, costed `cost` tokens at weight `share`:
    /// `max(V, the tenant's last) + cost / share`, and the tenant's last is then that.
    pub fn tag(&self, tenant: usize, cost: u64, share: u32) -> u64 {
        let step = (cost / u64::from(share.max(1))).max(1);
        let v = self.vtime.load(Ordering::Acquire);
        let slot = &self.finish[tenant % self.finish.len()];
        let mut last = slot.load(Ordering::Acquire);
        loop {
            let next = (last.max(v) + step).min(TAG_MASK);
            match slot.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// Joins the queue with class rank `rank`, finish tag `tag`, for model hash `model`.
    pub fn join(&self, rank: u8, tag: u64, model: u32) -> Joined<'_> {
        let gen = u64::from(self.generation.fetch_add(1, Ordering::Relaxed)) & GEN_MASK;
        let word =
            OCCUPIED | (u64::from(rank & 7) << RANK_SHIFT) | (gen << GEN_SHIFT) | (tag & TAG_MASK);
        loop {
            let n = self.taken.load(Ordering::Acquire);
            if n < self.seats.len() {
                if self
                    .taken
                    .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Joined::Seated(self.sit(word, model));
                }
                continue;
            }
            match self.worst_after(rank) {
                None => return Joined::Full,
                Some((seat, old)) => {
                    let s = &self.seats[seat];
                    if s.word
                        .compare_exchange(old, word, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        s.model.store(model, Ordering::Release);
                        return Joined::Displaced(self.ticket(seat, word));
                    }
                }
            }
        }
    }

    /// Takes a free seat (one is, or is about to be: `taken` was counted first).
    fn sit(&self, word: u64, model: u32) -> Ticket<'_> {
        loop {
            for (i, s) in self.seats.iter().enumerate() {
                if s.word.load(Ordering::Relaxed) != 0 {
                    continue;
                }
                if s.word
                    .compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    // Until this store, the seat may show its last waiter's model: another
                    // waiter's `is_first` can then misjudge it once, until its next wake.
                    s.model.store(model, Ordering::Release);
                    return self.ticket(i, word);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn ticket(&self, seat: usize, word: u64) -> Ticket<'_> {
        Ticket {
            queue: self,
            seat,
            word,
            admitted: false,
        }
    }

    /// The last-ranked, latest-finishing waiter ranked after `rank`: its seat and word.
    fn worst_after(&self, rank: u8) -> Option<(usize, u64)> {
        let mut worst: Option<(usize, u64)> = None;
        for (i, s) in self.seats.iter().enumerate() {
            let w = s.word.load(Ordering::Acquire);
            if w == 0 || rank_of(w) <= rank {
                continue;
            }
            if worst.is_none_or(|(_, b)| order(w) > order(b)) {
                worst = Some((i, w));
            }
        }
        worst
    }
}

impl Ticket<'_> {
    /// Whether the seat is still this waiter's (not taken over by a displacing one).
    pub fn is_seated(&self) -> bool {
        self.queue.seats[self.seat].word.load(Ordering::Acquire) == self.word
    }

    /// Whether no waiter for the same model goes before this one.
    pub fn is_first(&self) -> bool {
        let me = (order(self.word), self.seat);
        let model = self.queue.seats[self.seat].model.load(Ordering::Acquire);
        self.queue.seats.iter().enumerate().all(|(i, s)| {
            let w = s.word.load(Ordering::Acquire);
            w == 0
                || i == self.seat
                || s.model.load(Ordering::Acquire) != model
                || (order(w), i) > me
        })
    }

    /// The waiter got its place: the virtual time moves to its tag as it leaves.
    pub fn admitted(&mut self) {
        self.admitted = true;
    }

    /// The waiter's class rank.
    pub fn rank(&self) -> u8 {
        rank_of(self.word)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let q = self.queue;
        if self.admitted {
            q.vtime.fetch_max(self.word & TAG_MASK, Ordering::AcqRel);
        }
        let seat = &q.seats[self.seat].word;
        if seat
            .compare_exchange(self.word, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            q.taken.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn rank_of(word: u64) -> u8 {
    ((word >> RANK_SHIFT) & 7) as u8
}

/// A word's place in line: its rank, then its tag.
fn order(word: u64) -> (u8, u64) {
    (rank_of(word), word & TAG_MASK)
}

/// Every route's queue for one configuration (`None` for a route without `queue_max`).
pub struct RouteQueues {
    routes: Box<[Option<SharedQueue>]>,
}

impl RouteQueues {
    /// Fresh queues for `config`'s routes; tenants are the keys, the callers without one and
    /// the header-named tenants.
    pub fn new(config: &Config) -> Arc<Self> {
        let tenants = config.keys.keys.len() + 1 + HEADER_TENANTS;
        Arc::new(RouteQueues {
            routes: config
                .routes
                .iter()
                .map(|r| r.queue.map(|q| SharedQueue::new(q.max, tenants)))
                .collect(),
        })
    }

    /// Route `route`'s queue, when it has one.
    #[inline]
    pub fn route(&self, route: usize) -> Option<&SharedQueue> {
        self.routes.get(route)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seated(j: Joined<'_>) -> Ticket<'_> {
        match j {
            Joined::Seated(t) => t,
            _ => panic!("not seated"),
        }
    }

    #[test]
    fn the_first_in_line_is_the_best_rank_then_the_earliest_tag() {
        let q = SharedQueue::new(4, 4);
        let batch = seated(q.join(1, 10, 7));
        let late = seated(q.join(0, 50, 7));
        let early = seated(q.join(0, 20, 7));
        assert!(early.is_first());
        assert!(!late.is_first() && !batch.is_first());
        drop(early);
        assert!(late.is_first());
        drop(late);
        assert!(batch.is_first());
        drop(batch);
        assert!(!q.busy());
    }

    #[test]
    fn other_models_waiters_never_block_the_first_of_a_model() {
        let q = SharedQueue::new(4, 4);
        let a = seated(q.join(0, 1, 1));
        let b = seated(q.join(1, 9, 2));
        assert!(a.is_first() && b.is_first());
    }

    #[test]
    fn a_full_queue_displaces_only_a_later_class_and_its_latest_waiter() {
        let q = SharedQueue::new(2, 4);
        let b1 = seated(q.join(1, 5, 0));
        let b2 = seated(q.join(1, 9, 0));
        // The same class finds the queue full.
        assert!(matches!(q.join(1, 1, 0), Joined::Full));
        let i = match q.join(0, 3, 0) {
            Joined::Displaced(t) => t,
            _ => panic!("an earlier class displaces"),
        };
        assert!(b1.is_seated() && !b2.is_seated() && i.is_seated());
        assert!(i.is_first());
        // The displaced waiter leaving does not free the seat it lost.
        drop(b2);
        assert_eq!(q.waiting(), 2);
        let i2 = match q.join(0, 4, 0) {
            Joined::Displaced(t) => t,
            _ => panic!("the last batch waiter is displaced too"),
        };
        assert!(!b1.is_seated());
        assert_eq!(q.waiting(), 2);
        drop((i, i2, b1));
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_flooding_tenant_finishes_later_and_the_virtual_time_follows_admissions() {
        let q = SharedQueue::new(64, 3);
        let heavy: Vec<u64> = (0..10).map(|_| q.tag(0, 100, 1)).collect();
        let light = q.tag(1, 100, 1);
        assert_eq!(heavy[9], 1000);
        assert_eq!(
            light, 100,
            "a tenant that just arrived is not behind the flood"
        );
        // Twice the share, half the step.
        assert_eq!(q.tag(2, 100, 2), 50);
        let mut t = seated(q.join(0, heavy[4], 0));
        t.admitted();
        drop(t);
        assert_eq!(
            q.tag(1, 100, 1),
            600,
            "an idle tenant restarts at the virtual time"
        );
    }

    #[test]
    fn seats_are_exact_over_threads() {
        let q = Arc::new(SharedQueue::new(8, 1));
        let seated = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (q, seated, peak) = (q.clone(), seated.clone(), peak.clone());
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        if let Joined::Seated(t) = q.join(0, i, 0) {
                            let n = seated.fetch_add(1, Ordering::AcqRel) + 1;
                            peak.fetch_max(n, Ordering::AcqRel);
                            seated.fetch_sub(1, Ordering::AcqRel);
                            drop(t);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::Acquire) <= 8);
        assert_eq!(q.waiting(), 0);
    }
}
