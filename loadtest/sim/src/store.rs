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

/// A publication on its way to the other replicas.
#[derive(Debug)]
pub struct Message {
    /// When the other replicas apply it: their first tick at or after publication + delay.
    pub at_ns: u64,
    /// The publishing replica.
    pub from: usize,
    pub payload: Payload,
}

/// The messages in transit, in publication order.
#[derive(Debug)]
pub struct Store {
    delay_ns: u64,
    period_ns: u64,
    queue: VecDeque<Message>,
}

impl Store {
    /// A store that delivers `delay` after publication, at the receivers' next tick of
    /// `period`.
    pub fn new(delay: Duration, period: Duration) -> Self {
        Store {
            delay_ns: delay.as_nanos() as u64,
            period_ns: (period.as_nanos() as u64).max(1),
            queue: VecDeque::new(),
        }
    }

    /// Replica `from` publishes `payload` at its tick `tick_ns`.
    pub fn publish(&mut self, from: usize, tick_ns: u64, payload: Payload) {
        let due = tick_ns.saturating_add(self.delay_ns);
        let at_ns = due.div_ceil(self.period_ns).saturating_mul(self.period_ns);
        // Ticks and the delay only grow, so the queue stays in delivery order.
        debug_assert!(self.queue.back().is_none_or(|m| m.at_ns <= at_ns));
        self.queue.push_back(Message {
            at_ns,
            from,
            payload,
        });
    }

    /// The next message due at or before `now_ns`, if any.
    pub fn pop_due(&mut self, now_ns: u64) -> Option<Message> {
        if self.queue.front()?.at_ns <= now_ns {
            self.queue.pop_front()
        } else {
            None
        }
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

    #[test]
    fn messages_arrive_at_the_first_tick_after_the_delay_in_order() {
        let ms = |v: u64| v * 1_000_000;
        let mut store = Store::new(Duration::from_millis(5), Duration::from_millis(2));
        store.publish(0, ms(2), Payload::Load(vec![1]));
        store.publish(1, ms(4), Payload::Load(vec![2]));
        // Published at 2 ms, due at 7 ms: applied at the 8 ms tick.
        assert!(store.pop_due(ms(7)).is_none());
        let m = store.pop_due(ms(8)).unwrap();
        assert_eq!((m.at_ns, m.from), (ms(8), 0));
        assert!(store.pop_due(ms(8)).is_none());
        assert_eq!(store.pop_due(ms(20)).unwrap().from, 1);
        // No delay: the publishing tick itself.
        let mut now = Store::new(Duration::ZERO, Duration::from_millis(2));
        now.publish(2, ms(6), Payload::Load(vec![]));
        assert_eq!(now.pop_due(ms(6)).unwrap().at_ns, ms(6));
    }
}
