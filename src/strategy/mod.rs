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

pub mod adaptive;
pub mod cache_aware;
pub mod cheapest;
pub mod consistent_hash;
pub mod failover;
pub mod fair_catchup;
pub mod fastest;
pub mod least_loaded;
pub mod lmcache_aware;
pub mod lora_aware;
pub mod pipeline;
pub mod power_of_two;
pub mod precise_cache_aware;
pub mod predicted_latency;
pub mod prefix_index;
pub mod random;
pub mod random_weighted;
pub mod registry;
pub mod round_robin;
pub mod sessions;

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::config::TargetId;

/// One eligible target, as a strategy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Candidate {
    pub target: TargetId,
    /// Effective weight (> 0).
    pub weight: f64,
    /// Requests in flight to this target (every core) plus its engine queue depth when known.
    pub load: u64,
    /// Failover tier (0 = primary).
    pub tier: u32,
    /// The engine's own waiting queue from a fresh scrape (0 when unknown; part of `load`).
    pub queue_depth: u64,
    /// The engine's KV-cache use in [0, 1] from a fresh scrape, when known.
    pub kv_usage: Option<f32>,
    /// What this target holds of the requested LoRA adapter; filled in only for strategies
    /// that ask for [`Needs::LORA_RESIDENCY`], else unknown.
    pub lora: lora_aware::Residency,
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
    /// `PickRequest::prompt` in canonical form (whitespace-free JSON, see
    /// `openai::canonical`), for prefix matching and conversation keys.
    pub const CANONICAL_PROMPT: Needs = Needs(8);
    /// [`Candidate::lora`]: each target's residency of the requested model's LoRA adapter.
    pub const LORA_RESIDENCY: Needs = Needs(64);

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
    /// The prompt (messages, prompt or input JSON): canonical (whitespace-free) when the
    /// strategy asked for [`Needs::CANONICAL_PROMPT`], else as the client sent it.
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
    /// Set when the strategy could not use its own signal and fell back (cold targets, a
    /// kill switch, a missing input): a short static reason, counted in the gateway's
    /// metrics (`rolter_strategy_fallbacks_total{route,reason}`).
    pub fallback: Option<&'static str>,
}

impl Pick {
    pub fn at(index: usize) -> Pick {
        Pick {
            index,
            score: None,
            fallback: None,
        }
    }

    /// A pick made by a fallback path, with its reason.
    pub fn fallback(index: usize, reason: &'static str) -> Pick {
        Pick {
            index,
            score: None,
            fallback: Some(reason),
        }
    }
}

/// What one finished upstream attempt teaches. Every core's strategies see every sample:
/// their own core's at once, the other cores' within one signal exchange period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub target: TargetId,
    /// Response status; 0 when no response head arrived (connect error, timeout, reset).
    pub status: u16,
    /// A 2xx response relayed to its end. Only successes teach latency.
    pub success: bool,
    /// From the request being sent upstream to the first response body byte.
    pub ttft: Option<Duration>,
    /// From the request being sent upstream to the end of the response.
    pub duration: Duration,
    /// The load the gateway saw for this target when it sent the request.
    pub load_at_send: u64,
    /// The request's estimated prompt tokens (what the strategy saw at pick time).
    pub prompt_tokens: u32,
    /// Token usage as the response reported it, when it did.
    pub usage: Option<Usage>,
    /// When the attempt ended.
    pub finished: Instant,
}

/// Token usage reported by the engine (`usage` in the body or the last stream event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// Learned routing state one core passes to the same route's strategy on every other core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared<'a> {
    /// A prompt prefix is now warm on `target`; `data` is in the strategy's own encoding
    /// (canonical prompt bytes, or block hashes).
    Prefix { target: TargetId, data: &'a [u8] },
    /// Session `key` was last served by `target`.
    SessionPin { key: u64, target: TargetId },
}

#[derive(Debug, Clone, Copy)]
enum SharedKind {
    Prefix,
    SessionPin,
}

#[derive(Debug, Clone, Copy)]
struct SharedEntry {
    route: u16,
    kind: SharedKind,
    target: TargetId,
    key: u64,
    start: u32,
    end: u32,
}

/// Collects what a core's strategies share during one signal tick, in reused buffers.
#[derive(Debug, Default)]
pub struct ShareSink {
    route: u16,
    entries: Vec<SharedEntry>,
    bytes: Vec<u8>,
}

impl ShareSink {
    /// Sets the route whose strategy writes next (done by the worker).
    pub fn for_route(&mut self, route: usize) -> &mut Self {
        self.route = route as u16;
        self
    }

    pub fn prefix(&mut self, target: TargetId, data: &[u8]) {
        let start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(data);
        self.entries.push(SharedEntry {
            route: self.route,
            kind: SharedKind::Prefix,
            target,
            key: 0,
            start,
            end: self.bytes.len() as u32,
        });
    }

    pub fn session_pin(&mut self, key: u64, target: TargetId) {
        self.entries.push(SharedEntry {
            route: self.route,
            kind: SharedKind::SessionPin,
            target,
            key,
            start: 0,
            end: 0,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tick's batch, leaving the sink empty with its capacity kept.
    pub fn take_batch(&mut self) -> ShareBatch {
        let (ne, nb) = (self.entries.capacity(), self.bytes.capacity());
        let entries = std::mem::replace(&mut self.entries, Vec::with_capacity(ne));
        let bytes = std::mem::replace(&mut self.bytes, Vec::with_capacity(nb));
        ShareBatch { entries, bytes }
    }
}

/// One core's shared items of one tick, sent to every other core.
#[derive(Debug, Default)]
pub struct ShareBatch {
    entries: Vec<SharedEntry>,
    bytes: Vec<u8>,
}

impl ShareBatch {
    /// Every item with the index of the route whose strategy shared it.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Shared<'_>)> {
        self.entries.iter().map(|e| {
            let item = match e.kind {
                SharedKind::Prefix => Shared::Prefix {
                    target: e.target,
                    data: &self.bytes[e.start as usize..e.end as usize],
                },
                SharedKind::SessionPin => Shared::SessionPin {
                    key: e.key,
                    target: e.target,
                },
            };
            (e.route as usize, item)
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Run-time switches the control plane flips for every core at once (admin API).
#[derive(Debug)]
pub struct Switches {
    /// The `adaptive` blend; off sends every adaptive route to its fallback strategy.
    adaptive: AtomicBool,
}

impl Switches {
    pub fn new(adaptive: bool) -> Self {
        Switches {
            adaptive: AtomicBool::new(adaptive),
        }
    }

    /// Whether adaptive routes blend (read on every adaptive pick; a relaxed load).
    #[inline]
    pub fn adaptive(&self) -> bool {
        self.adaptive.load(Ordering::Relaxed)
    }

    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Ordering::Relaxed);
    }
}

impl Default for Switches {
    fn default() -> Self {
        Switches::new(true)
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

    /// Learns from a finished attempt on any core (latency, failures). Samples for targets
    /// outside the strategy's route arrive too and must be ignored cheaply.
    fn observe(&mut self, _sample: &Sample) {}

    /// Called after the request was sent to `target` (each attempt, so a retry elsewhere is
    /// recorded where it went): the place to learn from the routing itself (a prefix now
    /// warm on `target`, a session now served there) and to pass that on to the other
    /// cores through `share`.
    fn routed(
        &mut self,
        _req: &PickRequest<'_>,
        _target: TargetId,
        _share: &mut ShareSink,
        _now: Instant,
    ) {
    }

    /// Applies what another core's instance of this route's strategy shared.
    fn apply_shared(&mut self, _item: &Shared<'_>, _now: Instant) {}

    /// What the strategy has learned about `target`, as named numbers (a TTFT average,
    /// model coefficients), for the admin API. Never called on the request path.
    fn learned(&self, _target: TargetId) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

/// A uniform choice among the indices `0..len` that `eligible` accepts, in one pass and
/// without a second array (reservoir sampling); `None` when it accepts none. Every
/// strategy's random tie-break goes through here.
#[inline]
pub(crate) fn choose_uniform(
    rng: &mut fastrand::Rng,
    len: usize,
    mut eligible: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let mut chosen = None;
    let mut seen = 0u32;
    for i in 0..len {
        if eligible(i) {
            seen += 1;
            if seen == 1 || rng.u32(..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

/// The least-loaded candidate, ties at random: the load fallback of every strategy that
/// has one.
#[inline]
pub(crate) fn choose_least_loaded(
    rng: &mut fastrand::Rng,
    candidates: &[Candidate],
) -> Option<usize> {
    let min = candidates.iter().map(|c| c.load).min()?;
    choose_uniform(rng, candidates.len(), |i| candidates[i].load == min)
}

/// The hot-spot guard of the prefix strategies (`cache_aware`, `precise_cache_aware`): the
/// candidates are imbalanced when the highest and lowest loads differ by more than `abs`
/// **and** the highest exceeds `rel` times the lowest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceGuard {
    pub abs: u64,
    pub rel: f64,
}

impl BalanceGuard {
    /// When the candidates are imbalanced, the least-loaded one (ties at random).
    #[inline]
    pub(crate) fn check(&self, rng: &mut fastrand::Rng, candidates: &[Candidate]) -> Option<usize> {
        let (mut min, mut max) = (u64::MAX, 0);
        for c in candidates {
            min = min.min(c.load);
            max = max.max(c.load);
        }
        if candidates.is_empty() || max - min <= self.abs || max as f64 <= self.rel * min as f64 {
            return None;
        }
        choose_uniform(rng, candidates.len(), |i| candidates[i].load == min)
    }
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
                ..Candidate::default()
            })
            .collect()
    }

    /// A successful sample for `target` with the given TTFT (ms), load and prompt tokens.
    pub fn sample(target: usize, ttft_ms: u64, load: u64, prompt_tokens: u32) -> super::Sample {
        super::Sample {
            target,
            status: 200,
            success: true,
            ttft: Some(std::time::Duration::from_millis(ttft_ms)),
            duration: std::time::Duration::from_millis(ttft_ms * 2),
            load_at_send: load,
            prompt_tokens,
            usage: None,
            finished: std::time::Instant::now(),
        }
    }

    /// A build context for a route over targets 0..`weights.len()` with those weights,
    /// the given fixed prices (or none) and default switches. Leaked: tests only.
    pub fn context(
        weights: &[f64],
        prices: &[Option<crate::config::Price>],
    ) -> super::registry::BuildContext<'static> {
        let mut text = String::new();
        for (i, w) in weights.iter().enumerate() {
            text.push_str(&format!(
                "[[targets]]\nname = \"t{i}\"\nurl = \"http://127.0.0.1:{}\"\nweight = {w}\n\n",
                9000 + i
            ));
        }
        let names: Vec<String> = (0..weights.len()).map(|i| format!("\"t{i}\"")).collect();
        text.push_str(&format!(
            "[[routes]]\nname = \"r\"\ntargets = [{}]\n[routes.strategy]\nname = \"round_robin\"\n",
            names.join(",")
        ));
        let config = crate::config::load_str(&text, "test.toml").expect("test config");
        let targets: &'static [crate::config::Target] =
            Box::leak(config.targets.into_boxed_slice());
        let route_targets: &'static [usize] =
            Box::leak((0..weights.len()).collect::<Vec<_>>().into_boxed_slice());
        let mut all_prices = prices.to_vec();
        all_prices.resize(weights.len(), None);
        super::registry::BuildContext {
            target_count: weights.len(),
            seed: 7,
            targets,
            route_targets,
            prices: Box::leak(Box::new(crate::pricing::PriceBook::fixed(&all_prices))),
            switches: Box::leak(Box::new(std::sync::Arc::new(super::Switches::default()))),
            engine: Box::leak(Box::default()),
        }
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

#[cfg(test)]
mod testing_tests {
    use super::testing::{context, sample};

    #[test]
    fn test_context_carries_weights_and_prices() {
        let p = crate::config::Price {
            input_per_mtok: 1.0,
            output_per_mtok: 3.0,
        };
        let ctx = context(&[2.0, 1.0], &[Some(p)]);
        assert_eq!(ctx.targets.len(), 2);
        assert_eq!(ctx.targets[0].weight, 2.0);
        assert_eq!(ctx.route_targets, &[0, 1]);
        assert_eq!(ctx.prices.price(0, "m"), Some(p));
        assert_eq!(ctx.prices.price(1, "m"), None);
        assert!(ctx.switches.adaptive());
        let s = sample(1, 40, 3, 100);
        assert!(s.success && s.target == 1 && s.load_at_send == 3);
    }
}
