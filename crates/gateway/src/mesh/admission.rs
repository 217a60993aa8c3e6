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
//! When every seat is taken, a newcomer in line before the last-ranked, latest-finishing
//! waiter (of an earlier class, or of the same class with an earlier tag: a tenant within
//! its share against one flooding the queue) takes that waiter's seat; the waiter is
//! displaced (it finds its seat no longer its own and answers 503). Nothing admitted is
//! ever displaced.
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
    /// A seat taken from a waiter in line after it, who is displaced.
    Displaced(Ticket<'q>),
    /// Every seat is taken by a waiter in line before it.
    Full,
}

/// A waiter's seat, given back when it drops (unless another waiter took it over).
pub struct Ticket<'q> {
    queue: &'q SharedQueue,
    seat: usize,
    word: u64,
    admitted: bool,
    /// The tenant's tag slot and the cost it was charged, given back when the waiter
    /// leaves unserved.
    charge: Charge,
}

/// What a request's tag added to its tenant's last finish tag.
#[derive(Clone, Copy)]
pub struct Charge {
    tenant: usize,
    step: u64,
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
    fn tag(&self, tenant: usize, cost: u64, share: u32) -> (u64, Charge) {
        let step = (cost / u64::from(share.max(1))).max(1);
        let tenant = tenant % self.finish.len();
        let v = self.vtime.load(Ordering::Acquire);
        let slot = &self.finish[tenant];
        let mut last = slot.load(Ordering::Acquire);
        loop {
            let next = (last.max(v) + step).min(TAG_MASK);
            match slot.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (next, Charge { tenant, step }),
                Err(seen) => last = seen,
            }
        }
    }

    /// Gives back what an unserved request added to its tenant's finish tag (never below
    /// the virtual time), so a tenant whose requests time out, are displaced or are refused
    /// is not pushed back for work it was never served.
    fn refund(&self, c: Charge) {
        let v = self.vtime.load(Ordering::Acquire);
        let _ = self.finish[c.tenant].fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
            Some(f.saturating_sub(c.step).max(v))
        });
    }

    /// Joins the queue with class rank `rank` as a request of `tenant` (weight `share`)
    /// costed `cost` tokens, for model hash `model`.
    pub fn join(
        &self,
        rank: u8,
        (tenant, share): (usize, u32),
        cost: u64,
        model: u32,
    ) -> Joined<'_> {
        let (tag, charge) = self.tag(tenant, cost, share);
        let joined = self.seat(rank, tag, model, charge);
        if matches!(joined, Joined::Full) {
            self.refund(charge);
        }
        joined
    }

    fn seat(&self, rank: u8, tag: u64, model: u32, charge: Charge) -> Joined<'_> {
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
                    return Joined::Seated(self.sit(word, model, charge));
                }
                continue;
            }
            match self.worst_after(order(word)) {
                None => return Joined::Full,
                Some((seat, old)) => {
                    let s = &self.seats[seat];
                    if s.word
                        .compare_exchange(old, word, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        s.model.store(model, Ordering::Release);
                        return Joined::Displaced(self.ticket(seat, word, charge));
                    }
                }
            }
        }
    }

    /// Takes a free seat (one is, or is about to be: `taken` was counted first).
    fn sit(&self, word: u64, model: u32, charge: Charge) -> Ticket<'_> {
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
                    return self.ticket(i, word, charge);
                }
            }
            std::hint::spin_loop();
        }
    }

    fn ticket(&self, seat: usize, word: u64, charge: Charge) -> Ticket<'_> {
        Ticket {
            queue: self,
            seat,
            word,
            admitted: false,
            charge,
        }
    }

    /// The last-ranked, latest-finishing waiter, when it is in line after `me` (a later
    /// class, or the same class and a later tag): its seat and word.
    fn worst_after(&self, me: (u8, u64)) -> Option<(usize, u64)> {
        let mut worst: Option<(usize, u64)> = None;
        for (i, s) in self.seats.iter().enumerate() {
            let w = s.word.load(Ordering::Acquire);
            if w == 0 || order(w) <= me {
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
        } else {
            q.refund(self.charge);
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

    /// Joins as a fresh tenant (so the tag is `tag`, the virtual time being 0).
    fn at(q: &SharedQueue, rank: u8, tag: u64, model: u32) -> Joined<'_> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let tenant = NEXT.fetch_add(1, Ordering::Relaxed) % 4096;
        q.finish[tenant % q.finish.len()].store(0, Ordering::Release);
        q.join(rank, (tenant, 1), tag, model)
    }

    fn seated(j: Joined<'_>) -> Ticket<'_> {
        match j {
            Joined::Seated(t) => t,
            _ => panic!("not seated"),
        }
    }

    #[test]
    fn the_first_in_line_is_the_best_rank_then_the_earliest_tag() {
        let q = SharedQueue::new(4, 4096);
        let batch = seated(at(&q, 1, 10, 7));
        let late = seated(at(&q, 0, 50, 7));
        let early = seated(at(&q, 0, 20, 7));
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
        let q = SharedQueue::new(4, 4096);
        let a = seated(at(&q, 0, 1, 1));
        let b = seated(at(&q, 1, 9, 2));
        assert!(a.is_first() && b.is_first());
    }

    #[test]
    fn a_full_queue_displaces_only_a_later_class_and_its_latest_waiter() {
        let q = SharedQueue::new(2, 4096);
        let b1 = seated(at(&q, 1, 5, 0));
        let b2 = seated(at(&q, 1, 9, 0));
        // The same class with a later tag finds the queue full.
        assert!(matches!(at(&q, 1, 20, 0), Joined::Full));
        let i = match at(&q, 0, 3, 0) {
            Joined::Displaced(t) => t,
            _ => panic!("an earlier class displaces"),
        };
        assert!(b1.is_seated() && !b2.is_seated() && i.is_seated());
        assert!(i.is_first());
        // The displaced waiter leaving does not free the seat it lost.
        drop(b2);
        assert_eq!(q.waiting(), 2);
        let i2 = match at(&q, 0, 4, 0) {
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
        let heavy: Vec<Ticket<'_>> = (0..10).map(|_| seated(q.join(0, (0, 1), 100, 0))).collect();
        let light = seated(q.join(0, (1, 1), 100, 0));
        assert_eq!(heavy[9].word & TAG_MASK, 1000);
        assert_eq!(
            light.word & TAG_MASK,
            100,
            "a tenant that just arrived is not behind the flood"
        );
        assert!(light.is_first() || heavy[0].is_first());
        assert!(
            !heavy[1].is_first(),
            "the light tenant goes before the flood's second"
        );
        // Twice the share, half the step.
        assert_eq!(seated(q.join(0, (2, 2), 100, 0)).word & TAG_MASK, 50);
        let mut heavy = heavy.into_iter();
        let mut first = heavy.next().unwrap();
        first.admitted();
        drop(first);
        assert_eq!(q.vtime.load(Ordering::Acquire), 100);
        drop(light);
        // The light tenant left unserved: its charge is given back, down to the virtual time.
        assert_eq!(seated(q.join(0, (1, 1), 100, 0)).word & TAG_MASK, 200);
        // The flood's nine unserved waiters leave: the tenant is charged for none of them.
        drop(heavy);
        assert_eq!(q.finish[0].load(Ordering::Acquire), 100);
    }

    #[test]
    fn a_full_queue_of_one_class_gives_the_seat_of_the_latest_tag_to_an_earlier_one() {
        let q = SharedQueue::new(2, 8);
        let flood: Vec<Ticket<'_>> = (0..2).map(|_| seated(q.join(0, (0, 1), 100, 0))).collect();
        match q.join(0, (1, 1), 100, 0) {
            Joined::Displaced(t) => assert!(t.is_seated()),
            _ => panic!("a tenant within its share displaces the flood's latest"),
        }
        assert!(flood[0].is_seated() && !flood[1].is_seated());
    }

    #[test]
    fn a_request_refused_at_a_full_queue_costs_its_tenant_nothing() {
        let q = SharedQueue::new(1, 2);
        let _w = seated(q.join(0, (0, 1), 10, 0));
        assert!(matches!(q.join(0, (1, 1), 500, 0), Joined::Full));
        assert_eq!(q.finish[1].load(Ordering::Acquire), 0);
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
                        if let Joined::Seated(t) = q.join(0, (0, 1), i, 0) {
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
