//! The client API keys' shared counters: each key's fixed one-minute windows (requests
//! admitted, tokens used) against its `requests_per_minute` and `tokens_per_minute`, and
//! its outcome and token counts for `/metrics`.
//!
//! Like [`caps`](super::caps), these are atomics every core shares, so a key's limits are
//! exact per gateway however its requests spread over the workers: admission is one
//! compare-and-swap on the key's request window, charging tokens one on its token window,
//! each window a `u64` holding the minute's number (high half) and its count (low half).
//! A window is a fixed minute of the Unix clock (not sliding): a client sees its allowance
//! come back whole at the start of each minute, and `Retry-After` says exactly when. It
//! must not hold locks, block, or know about routes or the keys' hashes.
//!
//! With `[auth] share_limits`, each slot also holds the other replicas' counts of the
//! window, which the control thread sets from the store once per `sync_interval`
//! (`fleet::news`): admission then counts the fleet's requests and tokens, exact on this
//! gateway and behind by at most one exchange for the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rolter_config::ApiKey;

/// A request's outcome for one key, as `rolter_key_requests_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyResult {
    Served = 0,
    Forbidden = 1,
    RateLimited = 2,
}

impl KeyResult {
    pub const ALL: [KeyResult; 3] = [
        KeyResult::Served,
        KeyResult::Forbidden,
        KeyResult::RateLimited,
    ];

    pub fn label(self) -> &'static str {
        match self {
            KeyResult::Served => "served",
            KeyResult::Forbidden => "forbidden",
            KeyResult::RateLimited => "rate_limited",
        }
    }
}

/// One key's windows and counts, on cache lines of its own.
#[derive(Default)]
#[repr(align(64))]
pub struct KeySlot {
    requests: AtomicU64,
    tokens: AtomicU64,
    /// The other replicas' requests and tokens in a window (`[auth] share_limits`), as
    /// the control thread last heard them from the store; packed like the windows.
    fleet_requests: AtomicU64,
    fleet_tokens: AtomicU64,
    results: [AtomicU64; 3],
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

/// Every key's slot for one configuration, shared by all workers and the control thread.
pub struct KeyBook {
    slots: Box<[Arc<KeySlot>]>,
    limits: Box<[(Option<u32>, Option<u32>)]>,
    names: Box<[String]>,
    /// Requests with no key or an unknown one (no key to count them under).
    unauthorized: Arc<AtomicU64>,
}

/// The current minute of the Unix clock and the whole seconds left in it (1 to 60).
pub fn minute_now() -> (u32, u32) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    ((secs / 60) as u32, 60 - (secs % 60) as u32)
}

fn pack(window: u32, count: u32) -> u64 {
    (u64::from(window) << 32) | u64::from(count)
}

fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

impl KeyBook {
    /// The slots for `keys`. With `previous` (a reload), a key kept with the same name and
    /// hash keeps its slot (its windows and counts go on); a new key starts at zero, and a
    /// removed key's slot goes with the old book.
    pub fn new(keys: &[ApiKey], previous: Option<(&KeyBook, &[ApiKey])>) -> Arc<Self> {
        let slots = keys
            .iter()
            .map(|k| {
                previous
                    .and_then(|(book, old)| {
                        old.iter()
                            .position(|o| o.name == k.name && o.hash == k.hash)
                            .map(|i| book.slots[i].clone())
                    })
                    .unwrap_or_default()
            })
            .collect();
        Arc::new(KeyBook {
            slots,
            limits: keys
                .iter()
                .map(|k| (k.requests_per_minute, k.tokens_per_minute))
                .collect(),
            names: keys.iter().map(|k| k.name.clone()).collect(),
            unauthorized: previous.map_or_else(Default::default, |(b, _)| b.unauthorized.clone()),
        })
    }

    /// Admits one request of key `k` in the minute `now` (from [`minute_now`]): refused,
    /// with the seconds until the window ends, when the minute's tokens are at the key's
    /// `tokens_per_minute` or its requests at `requests_per_minute`.
    pub fn admit(&self, k: usize, (minute, left): (u32, u32)) -> Result<(), u32> {
        let (max_requests, max_tokens) = self.limits[k];
        let slot = &self.slots[k];
        let fleet = |v: &AtomicU64| match unpack(v.load(Ordering::Acquire)) {
            (w, n) if w == minute => n,
            _ => 0,
        };
        if let Some(max) = max_tokens {
            let (w, used) = unpack(slot.tokens.load(Ordering::Acquire));
            let used = if w == minute { used } else { 0 };
            if used.saturating_add(fleet(&slot.fleet_tokens)) >= max {
                return Err(left);
            }
        }
        let Some(max) = max_requests else {
            return Ok(());
        };
        let max = max.saturating_sub(fleet(&slot.fleet_requests));
        let mut now = slot.requests.load(Ordering::Acquire);
        loop {
            let (w, n) = unpack(now);
            let next = if w == minute {
                if n >= max {
                    return Err(left);
                }
                pack(minute, n + 1)
            } else {
                pack(minute, 1)
            };
            match slot.requests.compare_exchange_weak(
                now,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => now = seen,
            }
        }
    }

    /// Charges a finished request's tokens to key `k`: counted for the metrics, and added
    /// to the window of `minute` (the minute the usage became known) when the key has a
    /// `tokens_per_minute`.
    pub fn charge(&self, k: usize, minute: u32, prompt: u32, completion: u32) {
        if prompt == 0 && completion == 0 {
            return;
        }
        let slot = &self.slots[k];
        slot.prompt_tokens
            .fetch_add(u64::from(prompt), Ordering::Relaxed);
        slot.completion_tokens
            .fetch_add(u64::from(completion), Ordering::Relaxed);
        if self.limits[k].1.is_none() {
            return;
        }
        let add = prompt.saturating_add(completion);
        let mut now = slot.tokens.load(Ordering::Acquire);
        loop {
            let (w, n) = unpack(now);
            let next = if w == minute {
                pack(minute, n.saturating_add(add))
            } else {
                pack(minute, add)
            };
            match slot
                .tokens
                .compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(seen) => now = seen,
            }
        }
    }

    /// Key `k`'s own requests and tokens in `minute` on this gateway (zero for a minute
    /// its windows have left), for the store (`[auth] share_limits`).
    pub fn local(&self, k: usize, minute: u32) -> (u32, u32) {
        let slot = &self.slots[k];
        let of = |v: &AtomicU64| match unpack(v.load(Ordering::Acquire)) {
            (w, n) if w == minute => n,
            _ => 0,
        };
        (of(&slot.requests), of(&slot.tokens))
    }

    /// The other replicas' requests and tokens of key `k` in `minute`, as the store said.
    pub fn set_fleet(&self, k: usize, minute: u32, requests: u32, tokens: u32) {
        let slot = &self.slots[k];
        slot.fleet_requests
            .store(pack(minute, requests), Ordering::Release);
        slot.fleet_tokens
            .store(pack(minute, tokens), Ordering::Release);
    }

    /// The keys' names, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Counts a request's outcome for key `k`.
    pub fn count(&self, k: usize, result: KeyResult) {
        self.slots[k].results[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that came with no key or an unknown one.
    pub fn count_unauthorized(&self) {
        self.unauthorized.fetch_add(1, Ordering::Relaxed);
    }

    /// What `/metrics` shows: each key's name, its counts by result, and its prompt and
    /// completion tokens.
    pub fn snapshot(&self) -> Vec<(&str, [u64; 3], u64, u64)> {
        self.names
            .iter()
            .zip(self.slots.iter())
            .map(|(n, s)| {
                (
                    n.as_str(),
                    [0, 1, 2].map(|i| s.results[i].load(Ordering::Relaxed)),
                    s.prompt_tokens.load(Ordering::Relaxed),
                    s.completion_tokens.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Requests refused for want of a known key, since the start.
    pub fn unauthorized(&self) -> u64 {
        self.unauthorized.load(Ordering::Relaxed)
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, rpm: Option<u32>, tpm: Option<u32>) -> ApiKey {
        ApiKey {
            name: name.into(),
            hash: [name.len() as u8; 32],
            routes: None,
            models: None,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            priority: None,
            set_priority: false,
            share: 1,
        }
    }

    #[test]
    fn requests_are_limited_per_window_and_the_next_window_starts_over() {
        let book = KeyBook::new(&[key("a", Some(2), None)], None);
        assert_eq!(book.admit(0, (100, 30)), Ok(()));
        assert_eq!(book.admit(0, (100, 29)), Ok(()));
        assert_eq!(book.admit(0, (100, 12)), Err(12));
        assert_eq!(book.admit(0, (101, 60)), Ok(()));
    }

    #[test]
    fn a_window_at_its_token_limit_refuses_until_the_next() {
        let book = KeyBook::new(&[key("a", None, Some(100))], None);
        assert_eq!(book.admit(0, (7, 50)), Ok(()));
        book.charge(0, 7, 60, 30);
        assert_eq!(book.admit(0, (7, 40)), Ok(()));
        book.charge(0, 7, 5, 5);
        assert_eq!(book.admit(0, (7, 39)), Err(39));
        assert_eq!(book.admit(0, (8, 60)), Ok(()));
        let snap = book.snapshot();
        assert_eq!((snap[0].2, snap[0].3), (65, 35));
    }

    #[test]
    fn the_other_replicas_counts_join_the_windows_of_their_minute() {
        let book = KeyBook::new(&[key("a", Some(5), Some(100))], None);
        book.set_fleet(0, 9, 4, 0);
        assert_eq!(book.admit(0, (9, 30)), Ok(()));
        assert_eq!(book.admit(0, (9, 30)), Err(30), "4 elsewhere + 1 here");
        assert_eq!(book.local(0, 9), (1, 0));
        // A count heard for another minute does not hold this one back.
        assert_eq!(book.admit(0, (10, 60)), Ok(()));
        book.set_fleet(0, 10, 0, 100);
        assert_eq!(
            book.admit(0, (10, 59)),
            Err(59),
            "the fleet's tokens are at the limit"
        );
        assert_eq!(book.local(0, 10), (1, 0));
        assert_eq!(book.local(0, 9), (0, 0), "the window moved on");
    }

    #[test]
    fn a_reload_keeps_the_slots_of_unchanged_keys_only() {
        let old_keys = [key("a", Some(1), None), key("bb", Some(1), None)];
        let old = KeyBook::new(&old_keys, None);
        assert_eq!(old.admit(0, (1, 10)), Ok(()));
        assert_eq!(old.admit(1, (1, 10)), Ok(()));
        old.count_unauthorized();
        let new_keys = [key("bb", Some(1), None), key("c", Some(1), None)];
        let new = KeyBook::new(&new_keys, Some((&old, &old_keys)));
        assert_eq!(new.admit(0, (1, 10)), Err(10), "bb kept its window");
        assert_eq!(new.admit(1, (1, 10)), Ok(()), "c is new");
        assert_eq!(new.unauthorized(), 1);
        let names: Vec<&str> = new.snapshot().iter().map(|s| s.0).collect();
        assert_eq!(names, ["bb", "c"]);
    }
}
