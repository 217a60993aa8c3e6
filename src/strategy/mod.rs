//! Load-balancing strategies: the interface every strategy implements, the registry of
//! names and aliases, and one file per strategy.
//!
//! A strategy is small, synchronous and per core: each worker builds its own instance per
//! route, signals come in as values ([`Candidate`], [`PickRequest`]) and time comes in as an
//! argument. It must never block, do I/O, take a lock or log per request. Strategies that
//! need an asynchronous input (token ids, a cache-controller lookup, a shared cursor)
//! declare it through [`Strategy::needs`]; the request pipeline resolves it before calling
//! `pick` and passes the result in [`AsyncInputs`], leaving a field `None` when the input
//! could not be had in time, in which case the strategy falls back as the spec says.

pub mod failover;
pub mod least_loaded;
pub mod power_of_two;
pub mod random;
pub mod random_weighted;
pub mod registry;
pub mod round_robin;

use std::rc::Rc;
use std::time::Instant;

use crate::config::TargetId;

/// One eligible target, as a strategy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub target: TargetId,
    /// Effective weight (> 0).
    pub weight: f64,
    /// Requests in flight to this target plus its engine queue depth when known.
    pub load: u64,
    /// Failover tier (0 = primary).
    pub tier: u32,
}

/// Asynchronous inputs a strategy may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs(u8);

impl Needs {
    pub const NONE: Needs = Needs(0);
    /// The prompt as token ids (local tokenizer or the engine's tokenize endpoint).
    pub const TOKEN_IDS: Needs = Needs(1);
    /// A prefix lookup at a cache controller (LMCache).
    pub const CACHE_LOOKUP: Needs = Needs(2);
    /// A value from the shared state store (a cursor, a ledger).
    pub const SHARED_STATE: Needs = Needs(4);

    pub const fn union(self, other: Needs) -> Needs {
        Needs(self.0 | other.0)
    }
    pub const fn contains(self, other: Needs) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Results of the asynchronous inputs, resolved before `pick`. `None` means not asked for,
/// or not available in time.
#[derive(Debug, Clone, Default)]
pub struct AsyncInputs {
    pub token_ids: Option<Rc<[u32]>>,
    /// Per target: prompt tokens the cache controller reports as held there.
    pub cached_tokens: Option<Rc<[(TargetId, u32)]>>,
    /// A value read from (or advanced in) the shared state store.
    pub shared_counter: Option<u64>,
}

/// What a strategy knows about the request being routed.
#[derive(Debug, Clone, Copy)]
pub struct PickRequest<'a> {
    pub model: &'a str,
    /// The session this request belongs to; hashed only by strategies that read it.
    pub session: SessionKey<'a>,
    /// Raw prompt bytes (messages, prompt or input JSON).
    pub prompt: &'a [u8],
    pub prompt_tokens: u32,
    pub max_tokens: Option<u64>,
    pub inputs: &'a AsyncInputs,
}

/// What identifies a request's session: the `x-session-id` header when present, else the
/// conversation itself. The hash is computed on demand, so strategies that ignore sessions
/// pay nothing for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionKey<'a> {
    /// The `x-session-id` header value, when the client sent a non-empty one.
    pub header: Option<&'a [u8]>,
    /// The prompt bytes the key falls back to.
    pub prompt: &'a [u8],
}

impl SessionKey<'_> {
    /// A stable 64-bit key: the header's hash, else the prompt's.
    pub fn hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self.header.unwrap_or(self.prompt))
    }

    /// Whether the client named the session explicitly.
    pub fn is_explicit(&self) -> bool {
        self.header.is_some()
    }
}

/// A strategy's choice: an index into the candidate slice, and the score that won when the
/// strategy scores (for the explain headers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub index: usize,
    pub score: Option<f64>,
}

impl Pick {
    pub fn at(index: usize) -> Pick {
        Pick { index, score: None }
    }
}

/// The interface every load-balancing strategy implements.
pub trait Strategy {
    /// Canonical name.
    fn name(&self) -> &'static str;

    /// Asynchronous inputs this strategy wants before `pick`.
    fn needs(&self) -> Needs {
        Needs::NONE
    }

    /// Chooses one of `candidates` (never empty when called), or `None` when none is
    /// acceptable (the gateway answers 503).
    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick>;
}

/// Test helpers: candidates and a request built from plain values.
#[cfg(test)]
pub(crate) mod testing {
    use super::{AsyncInputs, Candidate, PickRequest};

    /// Candidates with target ids 0.. and the given (weight, load) pairs.
    pub fn cands(spec: &[(f64, u64)]) -> Vec<Candidate> {
        spec.iter()
            .enumerate()
            .map(|(i, &(weight, load))| Candidate {
                target: i,
                weight,
                load,
                tier: 0,
            })
            .collect()
    }

    /// A request with no prompt and no asynchronous inputs.
    pub fn req() -> PickRequest<'static> {
        let inputs: &'static AsyncInputs = Box::leak(Box::default());
        PickRequest {
            model: "m",
            session: Default::default(),
            prompt: b"",
            prompt_tokens: 0,
            max_tokens: None,
            inputs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SessionKey;

    #[test]
    fn session_key_prefers_the_header() {
        let a = SessionKey {
            header: Some(b"user-1"),
            prompt: b"[{\"role\":\"user\",\"content\":\"hi\"}]",
        };
        let b = SessionKey {
            header: Some(b"user-1"),
            prompt: b"[]",
        };
        assert_eq!(a.hash(), b.hash(), "the header decides, not the prompt");
        assert!(a.is_explicit());
        let c = SessionKey {
            header: None,
            prompt: b"[]",
        };
        let d = SessionKey {
            header: None,
            prompt: b"[1]",
        };
        assert_ne!(c.hash(), d.hash());
        assert!(!c.is_explicit());
    }
}
