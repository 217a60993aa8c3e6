//! The simulated store between gateway replicas (`--replicas`): what a replica publishes at
//! its signal tick (its strategies' shared items, its requests in flight per target)
//! reaches every other replica `--store-delay-ms` later, at that replica's next tick, in
//! the order it was published, as a stream every replica appends to and reads from would
//! deliver it. Owns the messages in transit and which kinds of state are shared; it does
//! not apply them (the event loop does) and never reorders or drops them.

use std::collections::VecDeque;
use std::time::Duration;

use rolter::strategy::{ShareBatch, Shared};
use serde::{Serialize, Serializer};

/// What gateway replicas share through the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Share {
    /// `Shared::SessionPin`: the target that last served a session.
    pub sessions: bool,
    /// `Shared::Prefix`: a prompt prefix is warm on a target.
    pub prefixes: bool,
    /// Each replica's requests in flight per target, added to the load the other replicas
    /// see (as of the store delay).
    pub load: bool,
}

impl Share {
    pub const NONE: Share = Share {
        sessions: false,
        prefixes: false,
        load: false,
    };
    pub const ALL: Share = Share {
        sessions: true,
        prefixes: true,
        load: true,
    };

    /// `none`, `all`, or a comma-separated list of `sessions`, `prefixes`, `load`.
    pub fn parse(s: &str) -> Result<Share, String> {
        let mut share = Share::NONE;
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "none" => {}
                "all" => share = Share::ALL,
                "sessions" => share.sessions = true,
                "prefixes" => share.prefixes = true,
                "load" => share.load = true,
                _ => {
                    return Err(format!(
                        "--share: unknown kind `{word}`; valid: none, all, or a list of sessions, prefixes, load"
                    ))
                }
            }
        }
        Ok(share)
    }

    /// Whether any strategy item (session pin, prefix) is shared.
    pub fn any_items(&self) -> bool {
        self.sessions || self.prefixes
    }

    /// Whether `item` is of a kind shared.
    pub fn carries(&self, item: &Shared<'_>) -> bool {
        match item {
            Shared::SessionPin { .. } => self.sessions,
            Shared::Prefix { .. } => self.prefixes,
            // fair_catchup's durable books are not simulated.
            Shared::Assigned { .. } => false,
        }
    }

    pub fn label(&self) -> String {
        let kinds: Vec<&str> = [
            (self.sessions, "sessions"),
            (self.prefixes, "prefixes"),
            (self.load, "load"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(",")
        }
    }
}

impl std::str::FromStr for Share {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Share::parse(s)
    }
}

impl Serialize for Share {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

/// What one replica published at one tick.
#[derive(Debug)]
pub enum Payload {
    /// Its cores' shared items of the tick (one core's batch).
    Items(ShareBatch),
    /// Its requests in flight per target.
    Load(Vec<u64>),
}

/// When a replica's publications reach the store and the others read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SyncPeriods {
    /// Zero: a core's items go to the store at its exchange tick and the others read them
    /// at their first exchange tick after the delay (a blocking read of the item stream).
    /// Otherwise each replica publishes the items gathered since its last sync tick at its
    /// next one, and reads the others' at its own (each replica's ticks at its own phase).
    #[serde(serialize_with = "ser_ms")]
    pub items: Duration,
    /// The same for the requests in flight per target (`Share::load`): zero, every
    /// exchange tick; otherwise a replica's count as of its sync tick.
    #[serde(serialize_with = "ser_ms")]
    pub load: Duration,
}

fn ser_ms<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A publication on its way to one replica.
#[derive(Debug)]
pub struct Message {
    /// When the receiver applies it: its first tick at or after publication + delay.
    pub at_ns: u64,
    /// The publishing replica.
    pub from: usize,
    pub payload: std::rc::Rc<Payload>,
}

/// A replica's tick schedule: every `period_ns` from `phase_ns`.
#[derive(Debug, Clone, Copy)]
struct Ticks {
    period_ns: u64,
    phase_ns: u64,
}

impl Ticks {
    /// The first tick at or after `t_ns`.
    fn at_or_after(self, t_ns: u64) -> u64 {
        if t_ns <= self.phase_ns {
            return self.phase_ns;
        }
        let k = (t_ns - self.phase_ns).div_ceil(self.period_ns);
        self.phase_ns
            .saturating_add(k.saturating_mul(self.period_ns))
    }
}

/// The messages in transit, per receiving replica in delivery order.
#[derive(Debug)]
pub struct Store {
    delay_ns: u64,
    /// Per replica: its item and load sync ticks (the exchange ticks when not synced).
    items: Vec<Ticks>,
    load: Vec<Ticks>,
    synced_load: bool,
    /// Per replica: its load count waiting for its next sync tick (when synced).
    pending_load: Vec<Option<(u64, Vec<u64>)>>,
    queues: Vec<VecDeque<Message>>,
}

impl Store {
    /// A store between `replicas` that delivers `delay` after publication, at the
    /// receivers' next tick: every `exchange`, or every `sync` period at each replica's own
    /// phase (drawn from `seed`).
    pub fn new(
        replicas: usize,
        delay: Duration,
        exchange: Duration,
        sync: SyncPeriods,
        seed: u64,
    ) -> Self {
        let ns = |d: Duration| d.as_nanos() as u64;
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x0057_012e);
        let phases: Vec<f64> = (0..replicas).map(|_| rng.f64()).collect();
        let ticks = |period: Duration| -> Vec<Ticks> {
            phases
                .iter()
                .map(|&f| match ns(period) {
                    0 => Ticks {
                        period_ns: ns(exchange).max(1),
                        phase_ns: 0,
                    },
                    p => Ticks {
                        period_ns: p,
                        phase_ns: (f * p as f64) as u64,
                    },
                })
                .collect()
        };
        Store {
            delay_ns: ns(delay),
            items: ticks(sync.items),
            load: ticks(sync.load),
            synced_load: !sync.load.is_zero(),
            pending_load: vec![None; replicas],
            queues: (0..replicas).map(|_| VecDeque::new()).collect(),
        }
    }

    /// Replica `from` publishes `payload` at its exchange tick `tick_ns` (it reaches the
    /// store then, or at `from`'s next sync tick).
    pub fn publish(&mut self, from: usize, tick_ns: u64, payload: Payload) {
        match payload {
            Payload::Load(load) if self.synced_load => {
                let sync_ns = self.load[from].at_or_after(tick_ns);
                match &mut self.pending_load[from] {
                    // A later count for the same sync tick replaces the earlier one.
                    Some((at, pending)) if *at == sync_ns => *pending = load,
                    slot => {
                        if let Some((at, old)) = slot.replace((sync_ns, load)) {
                            self.send(from, at, Payload::Load(old));
                        }
                    }
                }
            }
            Payload::Load(_) => self.send(from, tick_ns, payload),
            Payload::Items(_) => {
                let sent_ns = self.items[from].at_or_after(tick_ns);
                self.send(from, sent_ns, payload);
            }
        }
    }

    /// `payload` reaches the store at `sent_ns`: queued for every other replica.
    fn send(&mut self, from: usize, sent_ns: u64, payload: Payload) {
        let due = sent_ns.saturating_add(self.delay_ns);
        let payload = std::rc::Rc::new(payload);
        for (to, queue) in self.queues.iter_mut().enumerate() {
            if to == from {
                continue;
            }
            let ticks = match *payload {
                Payload::Items(_) => self.items[to],
                Payload::Load(_) => self.load[to],
            };
            let at_ns = ticks.at_or_after(due);
            // In stream order: after every message due at the same tick or earlier.
            let i = queue.partition_point(|m| m.at_ns <= at_ns);
            queue.insert(
                i,
                Message {
                    at_ns,
                    from,
                    payload: payload.clone(),
                },
            );
        }
    }

    /// The next message due for some replica at or before `now_ns`, with that replica.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<(usize, Message)> {
        for from in 0..self.pending_load.len() {
            if let Some((at, load)) = self.pending_load[from].take_if(|(at, _)| *at <= now_ns) {
                self.send(from, at, Payload::Load(load));
            }
        }
        for (to, queue) in self.queues.iter_mut().enumerate() {
            if queue.front().is_some_and(|m| m.at_ns <= now_ns) {
                return queue.pop_front().map(|m| (to, m));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_lists_parse() {
        assert_eq!(Share::parse("none").unwrap(), Share::NONE);
        assert_eq!(Share::parse("all").unwrap(), Share::ALL);
        let s = Share::parse("sessions, load").unwrap();
        assert!(s.sessions && s.load && !s.prefixes);
        assert_eq!(s.label(), "sessions,load");
        assert_eq!(Share::NONE.label(), "none");
        let err = Share::parse("pins").unwrap_err();
        assert!(err.contains("--share") && err.contains("pins"), "{err}");
    }

    fn new_store(delay: u64, sync: SyncPeriods) -> Store {
        Store::new(
            3,
            Duration::from_millis(delay),
            Duration::from_millis(2),
            sync,
            1,
        )
    }

    fn ms(v: u64) -> u64 {
        v * 1_000_000
    }

    #[test]
    fn messages_arrive_at_the_first_tick_after_the_delay_in_order() {
        let mut store = new_store(5, SyncPeriods::default());
        store.publish(0, ms(2), Payload::Load(vec![1]));
        store.publish(1, ms(4), Payload::Load(vec![2]));
        // Published at 2 ms, due at 7 ms: applied at the 8 ms tick, by replicas 1 and 2.
        assert!(store.pop_due(ms(7)).is_none());
        let got: Vec<(usize, u64, usize)> = std::iter::from_fn(|| store.pop_due(ms(8)))
            .map(|(to, m)| (to, m.at_ns, m.from))
            .collect();
        assert_eq!(got, vec![(1, ms(8), 0), (2, ms(8), 0)]);
        let later: Vec<(usize, usize)> = std::iter::from_fn(|| store.pop_due(ms(20)))
            .map(|(to, m)| (to, m.from))
            .collect();
        assert_eq!(later, vec![(0, 1), (2, 1)]);
        // No delay: the publishing tick itself.
        let mut now = new_store(0, SyncPeriods::default());
        now.publish(2, ms(6), Payload::Load(vec![]));
        assert_eq!(now.pop_due(ms(6)).unwrap().1.at_ns, ms(6));
    }

    #[test]
    fn synced_items_leave_and_arrive_at_each_replicas_own_ticks() {
        let sync = SyncPeriods {
            items: Duration::from_millis(100),
            load: Duration::from_millis(100),
        };
        let mut s = new_store(1, sync);
        let phase: Vec<u64> = s.items.iter().map(|t| t.phase_ns).collect();
        assert!(phase.iter().all(|&p| p < ms(100)));
        s.publish(0, ms(1000), Payload::Items(ShareBatch::default()));
        let sent = s.items[0].at_or_after(ms(1000));
        assert!(sent >= ms(1000) && sent < ms(1100));
        let got: Vec<(usize, Message)> = std::iter::from_fn(|| s.pop_due(u64::MAX)).collect();
        assert_eq!(got.len(), 2);
        for (to, m) in &got {
            assert_ne!(*to, 0);
            // Read at the receiver's first own tick after the store has it.
            assert_eq!(m.at_ns, s.items[*to].at_or_after(sent + ms(1)));
            assert!(m.at_ns - ms(1000) <= ms(201));
        }
        assert!(s.pop_due(u64::MAX).is_none());
    }

    #[test]
    fn a_synced_load_is_the_count_as_of_the_senders_tick() {
        let sync = SyncPeriods {
            items: Duration::ZERO,
            load: Duration::from_millis(100),
        };
        let mut s = new_store(0, sync);
        let tick = s.load[0].at_or_after(ms(1000));
        // Two counts before the sync tick: only the last one is sent.
        s.publish(0, tick - ms(4), Payload::Load(vec![1]));
        s.publish(0, tick - ms(2), Payload::Load(vec![2]));
        assert!(s.pop_due(tick - ms(1)).is_none());
        let got: Vec<Vec<u64>> = std::iter::from_fn(|| s.pop_due(u64::MAX))
            .map(|(_, m)| match &*m.payload {
                Payload::Load(l) => l.clone(),
                Payload::Items(_) => unreachable!(),
            })
            .collect();
        assert_eq!(got, vec![vec![2], vec![2]]);
    }
}
