//! The route's gateway-wide queue under overload: bounded (`queue_max`), ordered by
//! (class rank, fair-queueing finish tag, arrival), with displacement of the last waiter
//! in line for a newcomer before it; the fair-queueing clock that tags arrivals and takes
//! back what an unserved request was charged; and the per-class limits that reserve a
//! share of each engine's `max_concurrent`. Owns ordering and bookkeeping; timeouts and
//! admission to engines are the event loop's.

use std::collections::BTreeMap;

use super::workload::Class;

/// A waiter's place: served in ascending order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// The class's rank (0 for every request without admission features).
    pub rank: u8,
    /// The fair-queueing finish tag (the arrival number without admission features).
    pub tag: u64,
    /// Arrival number: ties in order of arrival (the gateway breaks them by seat).
    pub seq: u64,
}

impl Key {
    /// Its place in line as the gateway compares seats: rank, then tag.
    fn order(&self) -> (u8, u64) {
        (self.rank, self.tag)
    }
}

/// The waiting requests (by id), at most `max`.
#[derive(Debug)]
pub struct Queue {
    max: usize,
    /// Whether a full queue gives the last waiter's place to a newcomer in line before it.
    displace: bool,
    waiting: BTreeMap<Key, usize>,
}

impl Queue {
    pub fn new(max: usize, displace: bool) -> Self {
        Queue {
            max,
            displace,
            waiting: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.waiting.len() >= self.max
    }

    /// Whether a newcomer at `key` finds a place: room, or (displacing) a last waiter in
    /// line after it, of a later class or of its class with a later tag (an equal
    /// (rank, tag) is not after it).
    pub fn accepts(&self, key: &Key) -> bool {
        !self.is_full() || self.displaces(key)
    }

    /// Whether the queue is full and a newcomer at `key` takes the last waiter's place.
    pub fn displaces(&self, key: &Key) -> bool {
        self.is_full()
            && self.displace
            && self
                .waiting
                .last_key_value()
                .is_some_and(|(k, _)| k.order() > key.order())
    }

    /// Takes the last waiter out for a newcomer at `key` (when [`Queue::displaces`]).
    pub fn displace_for(&mut self, key: &Key) -> Option<(Key, usize)> {
        if self.displaces(key) {
            self.waiting.pop_last()
        } else {
            None
        }
    }

    /// Queues `id` at `key` (after [`Queue::accepts`]); returns the waiter it displaced:
    /// the last in line, by rank then tag.
    pub fn push(&mut self, key: Key, id: usize) -> Option<(Key, usize)> {
        debug_assert!(self.accepts(&key));
        let displaced = self.displace_for(&key);
        self.waiting.insert(key, id);
        displaced
    }

    /// The next waiter to admit.
    pub fn head(&self) -> Option<(Key, usize)> {
        self.waiting.first_key_value().map(|(k, v)| (*k, *v))
    }

    pub fn pop_head(&mut self) -> Option<(Key, usize)> {
        self.waiting.pop_first()
    }

    /// Takes the waiter at `key` out (its wait ended); false when it is not waiting.
    pub fn remove(&mut self, key: &Key) -> bool {
        self.waiting.remove(key).is_some()
    }
}

/// What a request's tag added to its tenant's last finish tag (given back when it leaves
/// unserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub tenant: usize,
    pub step: u64,
}

/// Weighted fair queueing by virtual finish times (self-clocked), in the gateway's integer
/// arithmetic: `v` is the finish tag of the last waiter admitted (never moving back),
/// `last[t]` tenant `t`'s last finish tag.
#[derive(Debug, Clone)]
pub struct FairClock {
    v: u64,
    last: Vec<u64>,
}

impl FairClock {
    pub fn new(tenants: usize) -> Self {
        FairClock {
            v: 0,
            last: vec![0; tenants],
        }
    }

    /// A queued request's finish tag, `max(V, F_t) + step` with `step = max(1, ⌊cost ÷
    /// share⌋)`; it becomes `F_t`. Returns the tag and the charge to give back if the
    /// request leaves unserved.
    pub fn tag(&mut self, tenant: usize, cost: u64, share: u32) -> (u64, Charge) {
        let step = (cost / u64::from(share.max(1))).max(1);
        let f = self.v.max(self.last[tenant]) + step;
        self.last[tenant] = f;
        (f, Charge { tenant, step })
    }

    /// An unserved request (refused at a full queue, displaced, timed out, past its
    /// deadline) gives its charge back: `F_t = max(V, F_t − step)`.
    pub fn refund(&mut self, c: Charge) {
        let f = &mut self.last[c.tenant];
        *f = f.saturating_sub(c.step).max(self.v);
    }

    /// A waiter with finish tag `tag` was admitted to an engine: `V` moves up to it.
    pub fn admitted(&mut self, tag: u64) {
        self.v = self.v.max(tag);
    }

    pub fn virtual_time(&self) -> u64 {
        self.v
    }

    /// Tenant `tenant`'s last finish tag.
    pub fn last(&self, tenant: usize) -> u64 {
        self.last[tenant]
    }
}

/// Per class, the in-flight count below which a request of that class is admitted to an
/// engine of `max_concurrent` places: `max_concurrent` less `floor(reserve × max_concurrent)`
/// of every more important class (lower rank), and at least one place, as the gateway
/// holds places back.
pub fn class_limits(classes: &[Class], max_concurrent: usize) -> Vec<usize> {
    classes
        .iter()
        .map(|c| {
            let held: usize = classes
                .iter()
                .filter(|o| o.rank < c.rank)
                .map(|o| (o.reserve.clamp(0.0, 1.0) * max_concurrent as f64).floor() as usize)
                .sum();
            max_concurrent - held.min(max_concurrent.saturating_sub(1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rank: u8, tag: u64, seq: u64) -> Key {
        Key { rank, tag, seq }
    }

    #[test]
    fn waiters_go_by_class_then_finish_tag() {
        let mut q = Queue::new(8, true);
        q.push(key(1, 10, 0), 10);
        q.push(key(0, 50, 1), 11);
        q.push(key(0, 20, 2), 12);
        q.push(key(1, 5, 3), 13);
        let order: Vec<usize> = std::iter::from_fn(|| q.pop_head().map(|(_, id)| id)).collect();
        assert_eq!(order, [12, 11, 13, 10]);
    }

    #[test]
    fn a_full_queue_displaces_its_last_waiter_for_a_newcomer_before_it() {
        let mut q = Queue::new(2, true);
        q.push(key(1, 10, 0), 1);
        q.push(key(1, 30, 1), 2);
        // The same class with a later or an equal tag is refused; an earlier tag or an
        // earlier class takes the place of the last waiter in line.
        assert!(!q.accepts(&key(1, 40, 2)) && !q.accepts(&key(1, 30, 2)));
        assert!(q.accepts(&key(1, 29, 2)) && q.accepts(&key(0, 90, 2)));
        assert_eq!(q.push(key(1, 20, 2), 3).map(|(_, id)| id), Some(2));
        assert_eq!(q.push(key(0, 90, 3), 4).map(|(_, id)| id), Some(3));
        assert_eq!(q.len(), 2);
        assert_eq!(q.head().map(|(_, id)| id), Some(4));
        // Without admission features a full queue refuses everyone.
        let fifo = Queue::new(0, false);
        assert!(!fifo.accepts(&key(0, 0, 0)));
        let mut plain = Queue::new(1, false);
        plain.push(key(0, 5, 0), 1);
        assert!(!plain.accepts(&key(0, 0, 1)));
        assert!(plain.remove(&key(0, 5, 0)) && plain.is_empty());
    }

    #[test]
    fn finish_tags_share_by_weight() {
        let mut c = FairClock::new(3);
        // Tenant 0 sends three requests at once, tenant 1 one: tenant 1's comes second.
        let a: Vec<u64> = (0..3).map(|_| c.tag(0, 100, 1).0).collect();
        let (b, charge) = c.tag(1, 100, 1);
        assert_eq!(a, [100, 200, 300]);
        assert_eq!(
            (b, charge),
            (
                100,
                Charge {
                    tenant: 1,
                    step: 100
                }
            )
        );
        // A share of 2 halves the tag's step; V moves up with admissions, never back.
        c.admitted(200);
        c.admitted(100);
        assert_eq!(c.tag(1, 100, 2).0, 250);
        assert_eq!(c.virtual_time(), 200);
        // The step is whole tokens, at least one.
        assert_eq!(c.tag(2, 1, 3), (201, Charge { tenant: 2, step: 1 }));
    }

    #[test]
    fn an_unserved_request_gives_its_step_back_down_to_the_virtual_time() {
        let mut c = FairClock::new(2);
        let charges: Vec<Charge> = (0..3).map(|_| c.tag(0, 100, 1).1).collect();
        assert_eq!(c.last(0), 300);
        c.admitted(100);
        // Two of the flood's requests leave unserved: its tag goes back to the virtual time.
        c.refund(charges[2]);
        assert_eq!(c.last(0), 200);
        c.refund(charges[1]);
        assert_eq!(c.last(0), 100);
        c.refund(charges[0]);
        assert_eq!(c.last(0), 100, "never below the virtual time");
        assert_eq!(c.tag(0, 100, 1).0, 200);
        // Refused at once: the tenant's tag is as if it had not asked.
        let (_, refused) = c.tag(1, 500, 1);
        c.refund(refused);
        assert_eq!(c.last(1), 100);
    }

    #[test]
    fn reserves_lower_the_limits_of_less_important_classes() {
        let class = |rank, reserve| Class {
            name: String::new(),
            rank,
            reserve,
            deadline: None,
        };
        let classes = [class(0, 0.25), class(1, 0.1), class(2, 0.0)];
        // 16 places: floor(0.25 × 16) = 4 held for rank 0, and floor(0.1 × 16) = 1 more
        // for rank 1.
        assert_eq!(class_limits(&classes, 16), [16, 12, 11]);
        assert_eq!(class_limits(&classes[..1], 16), [16]);
        // A less important class always keeps one place.
        assert_eq!(class_limits(&[class(0, 0.9), class(1, 0.0)], 4), [4, 1]);
    }
}
