//! `cache_aware`: send a request where its prompt prefix is already warm.
//!
//! Per target, a [`PrefixIndex`] of the canonical prompt bytes this route sent there (on
//! every core: each insertion is shared). A pick, in order:
//!
//! 1. **Balance guard.** With `min`/`max` the lowest/highest load among the candidates, the
//!    route is imbalanced when `max - min > balance_abs_threshold` (default 32) **and**
//!    `max > balance_rel_threshold × min` (default 1.5). Then the least-loaded candidate
//!    wins (ties at random), marked as fallback `imbalance`. The guard overrides session
//!    pins and prefix scores alike: a hot-spot guard that a pinned session could bypass
//!    would not guard anything.
//! 2. **Session pin.** A request with an explicit `x-session-id` goes to the target that
//!    last served that session if the last use is within `session_ttl` (default 10m) and
//!    the target is a candidate. At most `max_sessions` (default 100 000) sessions are
//!    remembered; the least recently used go first, expired ones on the way.
//! 3. **Prefix score.** Score = matched leading bytes / prompt length. When the best score
//!    is above 0 and at least `threshold` (default 0.5), the best-scoring candidate wins;
//!    ties by load, then at random.
//! 4. **Least warmed.** Otherwise the candidate whose index holds the fewest bytes; every
//!    candidate within half the prompt's length or 1/64 of `max_bytes_per_target` (the
//!    smaller) of that minimum ties (so targets whose trees are all full tie instead of a
//!    few bytes deciding, while a fleet's first few prefixes still land on distinct
//!    targets), and load breaks the tie, then a random choice. This is the normal path for
//!    new prefixes, not a fallback.
//!
//! A request with no prompt (a passthrough path, or an endpoint such as `/rerank` whose
//! body carries none) has nothing to score or warm: after the guard and the session pin,
//! the least-loaded candidate wins, marked as fallback `no_prompt`.
//!
//! `routed` inserts the prompt into the chosen target's index and shares it as chained
//! chunk keys ([`PromptKeys::encode`]: one eighth of the prompt's size, no rehash on the
//! receiving core); explicit sessions are pinned and the pin shared. `apply_shared` applies
//! both to this core's state.
//!
//! Owns the index, the session map, a generator and scratch buffers that grow to the
//! largest prompt and candidate set seen. It must not block, lock, log, do I/O or allocate
//! per pick once warm; it reads time only from its `now` arguments.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::{help_lines, StrategyOptions};
use crate::shared::balance::BalanceGuard;
use crate::shared::balance::IMBALANCE;
use crate::shared::choose::{choose_least_loaded, choose_least_loaded_among};
use crate::shared::prefix_index::{PrefixIndex, PromptKeys, CHUNK};
use crate::shared::sessions::{PinsAndSharing, SessionPins};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Basis, Candidate, Needs, Pick, PickRequest, ShareSink, Shared, TargetId};

/// Fallback reason of a pick for a request with no prompt to compare.
pub const NO_PROMPT: &str = "no_prompt";

/// The options of `cache_aware`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Smallest matched fraction of the prompt that sends it to the best-matching target.
    pub threshold: f64,
    /// Prompt bytes remembered per target: 4 MiB of prompt text by default, about a million
    /// tokens, more than the KV cache of most single engines holds. Costs about as much
    /// memory per target per core once full.
    pub max_bytes_per_target: usize,
    /// `balance_abs_threshold`, `balance_rel_threshold`.
    #[serde(flatten)]
    pub balance: BalanceGuard,
    /// How long an explicit session keeps going to the target that last served it.
    #[serde(with = "crate::values::duration")]
    pub session_ttl: Duration,
    /// `max_sessions`, `share_sessions`, `share_prefixes`.
    #[serde(flatten)]
    pub pins: PinsAndSharing,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold: 0.5,
            max_bytes_per_target: 4 << 20,
            balance: BalanceGuard::default(),
            session_ttl: Duration::from_secs(600),
            pins: PinsAndSharing::default(),
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "cache_aware";
    const SUMMARY: &'static str = "The candidate whose prefix tree holds most of the prompt; the least warmed below the threshold; session pins; balance guard";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &help_lines::<8>(&[
        &[
            (
                "threshold",
                "smallest matched fraction of the prompt that sends it to the best-matching target, in [0, 1]; below it the least warmed target wins",
            ),
            (
                "max_bytes_per_target",
                "prompt bytes remembered per target (least recently used evicted first); the index costs about as much memory per target per core",
            ),
        ],
        &BalanceGuard::HELP,
        &[(
            "session_ttl",
            "how long a request with x-session-id keeps going to the target that last served its session",
        )],
        &PinsAndSharing::HELP,
    ]);

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::fraction(errors, "threshold", self.threshold);
        crate::values::require(
            errors,
            self.max_bytes_per_target >= 64,
            "max_bytes_per_target",
            "must be an integer of at least 64 (bytes), such as 4194304",
        );
        self.balance.check_options(errors);
        crate::values::positive_duration(errors, "session_ttl", self.session_ttl);
        self.pins.check(errors);
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(CacheAware::new(*self, ctx.target_count, ctx.seed))
    }

    fn requirements(&self) -> crate::requirements::Requirements {
        crate::requirements::Requirements {
            store: self.pins.store_use(Self::NAME),
            ..crate::requirements::Requirements::default()
        }
    }
}

pub struct CacheAware {
    rng: fastrand::Rng,
    index: PrefixIndex,
    sessions: SessionPins,
    threshold: f64,
    guard: BalanceGuard,
    /// Candidates holding at most this many bytes more than the least warm one tie.
    warm_step: usize,
    /// Scratch: the request's chunk keys (also decoding shared items).
    keys: PromptKeys,
    /// Scratch: matched bytes per candidate, and whether the match is known only from
    /// another gateway replica.
    matched: Vec<(usize, bool)>,
    /// What decided the last pick.
    basis: Basis,
    /// The route shares pins or prefixes with the other replicas: only then is a match's
    /// origin read.
    shares: bool,
    /// Scratch: the encoding shared with other cores.
    share_buf: Vec<u8>,
}

impl CacheAware {
    /// Applies a prefix or pin another core (or, `fleet`, another replica) shared.
    fn learn(&mut self, item: &Shared<'_>, now: Instant, fleet: bool) {
        match *item {
            Shared::Prefix { target, data } => {
                if self.keys.decode(data) && self.keys.prompt_len() > 0 {
                    self.index.insert_keys_as(target, &self.keys, now, fleet);
                }
            }
            Shared::SessionPin { key, target } => self.sessions.pin_as(key, target, now, fleet),
            Shared::Assigned { .. } => {}
        }
    }

    /// An instance for targets `0..target_count`.
    pub fn new(opts: Options, target_count: usize, seed: u64) -> Self {
        CacheAware {
            rng: fastrand::Rng::with_seed(seed),
            index: PrefixIndex::new(target_count, opts.max_bytes_per_target),
            sessions: SessionPins::new(opts.pins.max_sessions, opts.session_ttl),
            threshold: opts.threshold.clamp(0.0, 1.0),
            guard: opts.balance,
            warm_step: (opts.max_bytes_per_target / 64).max(CHUNK),
            keys: PromptKeys::default(),
            matched: Vec::with_capacity(target_count),
            basis: Basis::Local,
            shares: opts.pins.share_sessions || opts.pins.share_prefixes,
            share_buf: Vec::new(),
        }
    }

    /// The prefix index (read-only), for tests and diagnostics.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }
}

impl Strategy for CacheAware {
    fn needs(&self) -> Needs {
        Needs::CANONICAL_PROMPT
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        self.basis = Basis::Local;
        if candidates.len() == 1 {
            return Some(Pick::at(0));
        }
        if let Some(i) = self.guard.check(&mut self.rng, candidates) {
            return Some(Pick::fallback(i, IMBALANCE));
        }
        if req.session.is_explicit() {
            if let Some((t, fleet)) = self.sessions.get_with_origin(req.session.hash(), now) {
                if let Some(i) = candidates.iter().position(|c| c.target == t) {
                    if fleet {
                        self.basis = Basis::SharedPin;
                    }
                    return Some(Pick::at(i));
                }
            }
        }
        let prompt = req.prompt;
        if prompt.is_empty() {
            let i = choose_least_loaded(&mut self.rng, candidates)?;
            return Some(Pick::fallback(i, NO_PROMPT));
        }
        let mut best = 0;
        self.matched.clear();
        self.keys.compute(prompt);
        for c in candidates {
            let m = if self.shares {
                self.index
                    .matched_keys_with_origin(c.target, &self.keys, prompt)
            } else {
                (self.index.matched_keys(c.target, &self.keys, prompt), false)
            };
            best = best.max(m.0);
            self.matched.push(m);
        }
        let score = best as f64 / prompt.len() as f64;
        let matched = &self.matched;
        let chosen = if best > 0 && score >= self.threshold {
            let i = choose_least_loaded_among(&mut self.rng, candidates, |i| matched[i].0 == best)?;
            if matched[i].1 {
                self.basis = Basis::SharedPrefix;
            }
            i
        } else {
            let index = &self.index;
            let coolest = candidates.iter().map(|c| index.held(c.target)).min()?;
            // A target short of the coolest by half this prompt or more is cooler in a way
            // that matters for this request; closer than that (or than 1/64 of the bound,
            // whichever is smaller) is a tie.
            let step = self.warm_step.min(prompt.len() / 2).max(CHUNK);
            let cool = |i: usize| index.held(candidates[i].target) <= coolest + step;
            choose_least_loaded_among(&mut self.rng, candidates, cool)?
        };
        Some(Pick {
            index: chosen,
            score: Some(score),
            fallback: None,
        })
    }

    fn routed(
        &mut self,
        req: &PickRequest<'_>,
        target: TargetId,
        share: &mut ShareSink,
        now: Instant,
    ) {
        if !req.prompt.is_empty() {
            self.keys.compute(req.prompt);
            self.index.insert_keys(target, &self.keys, now);
            self.share_buf.clear();
            self.keys.encode(&mut self.share_buf);
            share.prefix(target, &self.share_buf);
        }
        if req.session.is_explicit() {
            let key = req.session.hash();
            self.sessions.pin(key, target, now);
            share.session_pin(key, target);
        }
    }

    fn remap_targets(&mut self, map: &[Option<TargetId>]) -> bool {
        self.index.remap(map);
        self.sessions.remap(map);
        true
    }

    fn apply_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.learn(item, now, false);
    }

    fn apply_fleet_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.learn(item, now, true);
    }

    fn basis(&self) -> Basis {
        self.basis
    }

    fn learned(&self, target: TargetId) -> Vec<(&'static str, f64)> {
        vec![
            ("prefix_bytes", self.index.held(target) as f64),
            ("prefix_nodes", self.index.nodes(target) as f64),
            ("sessions", self.sessions.len() as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{cands, req};
    use rolter_core::SessionKey;

    fn rq<'a>(prompt: &'a [u8], session: Option<&'a [u8]>) -> PickRequest<'a> {
        PickRequest {
            prompt,
            session: SessionKey {
                header: session,
                prompt,
            },
            ..req()
        }
    }

    fn text(seed: u64, len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.alphanumeric() as u8).collect()
    }

    /// A canonical chat prompt: a system prompt, then one user message.
    fn chat(system: &[u8], user: &[u8]) -> Vec<u8> {
        let mut v = b"[{\"role\":\"system\",\"content\":\"".to_vec();
        v.extend_from_slice(system);
        v.extend_from_slice(b"\"},{\"role\":\"user\",\"content\":\"");
        v.extend_from_slice(user);
        v.extend_from_slice(b"\"}]");
        v
    }

    /// 64 KiB per target: candidates within 1 KiB of the least warm tie.
    fn test_options() -> Options {
        Options {
            max_bytes_per_target: 64 * 1024,
            ..Options::default()
        }
    }

    fn strategy(n: usize) -> CacheAware {
        CacheAware::new(test_options(), n, 3)
    }

    /// Picks and routes like the gateway does; returns the chosen target.
    fn route(
        s: &mut CacheAware,
        r: &PickRequest<'_>,
        c: &[Candidate],
        sink: &mut ShareSink,
        now: Instant,
    ) -> (TargetId, Pick) {
        let p = s.pick(r, c, now).expect("a pick");
        let t = c[p.index].target;
        s.routed(r, t, sink, now);
        (t, p)
    }

    #[test]
    fn scores_exact_partial_and_none() {
        let now = Instant::now();
        let mut s = strategy(4);
        let mut sink = ShareSink::default();
        let p = text(1, 2000);
        s.routed(&rq(&p, None), 2, &mut sink, now);
        let c = cands(&[(1.0, 0); 4]);
        // Exact.
        let pick = s.pick(&rq(&p, None), &c, now).unwrap();
        assert_eq!(
            (pick.index, pick.score, pick.fallback),
            (2, Some(1.0), None)
        );
        // Partial, above the threshold: the first 1500 bytes, then something else.
        let mut partial = p[..1500].to_vec();
        partial.extend_from_slice(&text(2, 500));
        let pick = s.pick(&rq(&partial, None), &c, now).unwrap();
        assert_eq!(pick.index, 2);
        let score = pick.score.unwrap();
        assert!((0.7..=0.75).contains(&score), "{score}");
        // Below the threshold (800 of 2000 bytes): least warmed, so not target 2.
        let mut low = p[..800].to_vec();
        low.extend_from_slice(&text(3, 1200));
        for _ in 0..50 {
            let pick = s.pick(&rq(&low, None), &c, now).unwrap();
            assert_ne!(pick.index, 2);
            assert!(pick.score.unwrap() < 0.5 && pick.score.unwrap() > 0.3);
            assert_eq!(pick.fallback, None, "the cold path is not a fallback");
        }
        // Nothing in common.
        let pick = s.pick(&rq(&text(4, 2000), None), &c, now).unwrap();
        assert_ne!(pick.index, 2);
        assert_eq!(pick.score, Some(0.0));
    }

    #[test]
    fn threshold_decides_between_the_prefix_and_the_coldest() {
        let now = Instant::now();
        let mut sink = ShareSink::default();
        let p = text(5, 3000);
        let mut q = p[..1920].to_vec();
        q.extend_from_slice(&text(6, 1080)); // 64 % match
        let c = cands(&[(1.0, 0); 3]);
        let mut lax = strategy(3);
        lax.routed(&rq(&p, None), 1, &mut sink, now);
        assert_eq!(lax.pick(&rq(&q, None), &c, now).unwrap().index, 1);
        let opts = Options {
            threshold: 0.9,
            ..test_options()
        };
        let mut strict = CacheAware::new(opts, 3, 3);
        strict.routed(&rq(&p, None), 1, &mut sink, now);
        for _ in 0..50 {
            assert_ne!(strict.pick(&rq(&q, None), &c, now).unwrap().index, 1);
        }
    }

    #[test]
    fn least_warmed_wins_below_the_threshold_and_load_breaks_ties() {
        let now = Instant::now();
        let mut s = CacheAware::new(Options::default(), 3, 3);
        let mut sink = ShareSink::default();
        s.routed(&rq(&text(7, 100_000), None), 0, &mut sink, now);
        s.routed(&rq(&text(8, 300_000), None), 1, &mut sink, now);
        let fresh = text(9, 500);
        let c = cands(&[(1.0, 0), (1.0, 0), (1.0, 0)]);
        assert_eq!(s.pick(&rq(&fresh, None), &c, now).unwrap().index, 2);
        // Targets 1 and 2 have never seen anything: the less loaded of them.
        let mut s = CacheAware::new(Options::default(), 3, 3);
        s.routed(&rq(&text(7, 100_000), None), 0, &mut sink, now);
        let c = cands(&[(1.0, 0), (1.0, 5), (1.0, 3)]);
        assert_eq!(s.pick(&rq(&fresh, None), &c, now).unwrap().index, 2);
        // Warmth within 1/64 of the bound of the least warm ties: two full trees tie.
        let opts = Options {
            max_bytes_per_target: 64 * 1024,
            ..Options::default()
        };
        let mut s = CacheAware::new(opts, 2, 1);
        s.routed(&rq(&text(10, 200_000), None), 0, &mut sink, now);
        s.routed(&rq(&text(11, 200_000), None), 1, &mut sink, now);
        s.routed(&rq(&text(12, 100), None), 1, &mut sink, now);
        assert_ne!(s.index().held(0), s.index().held(1));
        let c = cands(&[(1.0, 4), (1.0, 1)]);
        assert_eq!(s.pick(&rq(&fresh, None), &c, now).unwrap().index, 1);
        let c = cands(&[(1.0, 1), (1.0, 4)]);
        assert_eq!(s.pick(&rq(&fresh, None), &c, now).unwrap().index, 0);
    }

    #[test]
    fn a_fleets_first_prefixes_land_on_distinct_targets() {
        // Four groups (distinct system prompts), each first seen with the fleet idle: one
        // target each, whatever the random tie-breaks, and later requests follow them.
        let now = Instant::now();
        let mut sink = ShareSink::default();
        let c = cands(&[(1.0, 0), (1.0, 0), (1.0, 0), (1.0, 0)]);
        for round in 0..50 {
            let mut s = CacheAware::new(Options::default(), 4, round);
            let mut owner = Vec::new();
            for g in 0..4 {
                let mut p = text(40 + g, 1600);
                p.extend_from_slice(&text(round, 400));
                let t = c[s.pick(&rq(&p, None), &c, now).unwrap().index].target;
                s.routed(&rq(&p, None), t, &mut sink, now);
                owner.push(t);
            }
            let mut distinct = owner.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), 4, "round {round}: {owner:?}");
            let mut again = text(42, 1600);
            again.extend_from_slice(&text(99, 300));
            assert_eq!(
                c[s.pick(&rq(&again, None), &c, now).unwrap().index].target,
                owner[2]
            );
        }
    }

    #[test]
    fn ties_by_load_then_at_random() {
        let now = Instant::now();
        let mut s = strategy(4);
        let mut sink = ShareSink::default();
        let p = text(13, 3000);
        for t in [0, 2, 3] {
            s.routed(&rq(&p, None), t, &mut sink, now);
        }
        let c = cands(&[(1.0, 1), (1.0, 0), (1.0, 4), (1.0, 1)]);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[s.pick(&rq(&p, None), &c, now).unwrap().index] += 1;
        }
        // 0 and 3 hold the prompt with the lowest load among holders; 1 is idle but cold.
        assert_eq!((counts[1], counts[2]), (0, 0), "{counts:?}");
        assert!((1700..=2300).contains(&counts[0]), "{counts:?}");
        // Empty prompt (a passthrough request): nothing to score or warm, so the coldest
        // target would take every such request; load decides instead, said as a fallback.
        let c = cands(&[(1.0, 2), (1.0, 9), (1.0, 1), (1.0, 2)]);
        let pick = s.pick(&rq(b"", None), &c, now).unwrap();
        assert_eq!(
            (pick.index, pick.score, pick.fallback),
            (2, None, Some(NO_PROMPT))
        );
    }

    #[test]
    fn balance_guard_picks_by_load() {
        let now = Instant::now();
        let mut s = strategy(3);
        let mut sink = ShareSink::default();
        let p = text(14, 2000);
        s.routed(&rq(&p, None), 0, &mut sink, now);
        // 40 - 5 > 32 and 40 > 1.5 × 5: imbalanced.
        let c = cands(&[(1.0, 40), (1.0, 5), (1.0, 6)]);
        let pick = s.pick(&rq(&p, None), &c, now).unwrap();
        assert_eq!((pick.index, pick.fallback), (1, Some(IMBALANCE)));
        // 40 - 10 = 30: within the absolute threshold, the prefix wins.
        let c = cands(&[(1.0, 40), (1.0, 10), (1.0, 12)]);
        let pick = s.pick(&rq(&p, None), &c, now).unwrap();
        assert_eq!((pick.index, pick.fallback), (0, None));
        // 130 - 90 = 40 but 130 < 1.5 × 90: relatively balanced, the prefix wins.
        let c = cands(&[(1.0, 130), (1.0, 90), (1.0, 100)]);
        assert_eq!(s.pick(&rq(&p, None), &c, now).unwrap().index, 0);
        // 150 - 90 = 60 and 150 > 1.5 × 90: imbalanced.
        let c = cands(&[(1.0, 150), (1.0, 90), (1.0, 100)]);
        assert_eq!(
            s.pick(&rq(&p, None), &c, now).unwrap().fallback,
            Some(IMBALANCE)
        );
        // The guard overrides a session pin too.
        s.routed(&rq(&p, Some(b"s")), 0, &mut sink, now);
        let c = cands(&[(1.0, 40), (1.0, 5), (1.0, 6)]);
        assert_eq!(s.pick(&rq(&p, Some(b"s")), &c, now).unwrap().index, 1);
    }

    #[test]
    fn explicit_sessions_stick_within_the_ttl() {
        let t0 = Instant::now();
        let mut s = strategy(3);
        let mut sink = ShareSink::default();
        let p = text(15, 2000);
        // Target 0 holds the prompt; the session was last served by target 2.
        s.routed(&rq(&p, None), 0, &mut sink, t0);
        s.routed(&rq(b"earlier turn", Some(b"user-7")), 2, &mut sink, t0);
        let c = cands(&[(1.0, 0); 3]);
        let r = rq(&p, Some(b"user-7"));
        assert_eq!(
            s.pick(&r, &c, t0 + Duration::from_secs(599)).unwrap().index,
            2
        );
        // After the TTL, prefix scoring decides.
        assert_eq!(
            s.pick(&r, &c, t0 + Duration::from_secs(601)).unwrap().index,
            0
        );
        // The pinned target is not a candidate: prefix scoring decides.
        let without_2 = &c[..2];
        assert_eq!(s.pick(&r, without_2, t0).unwrap().index, 0);
        // Without a header the conversation hash is not pinned.
        let mut s = strategy(3);
        s.routed(&rq(&p, None), 0, &mut sink, t0);
        s.routed(&rq(b"x", None), 2, &mut sink, t0);
        assert_eq!(s.sessions.len(), 0);
        assert_eq!(s.pick(&rq(&p, None), &c, t0).unwrap().index, 0);
    }

    #[test]
    fn session_memory_is_bounded() {
        let t0 = Instant::now();
        let opts = Options {
            pins: PinsAndSharing {
                max_sessions: 100,
                ..PinsAndSharing::default()
            },
            session_ttl: Duration::from_secs(60),
            ..Options::default()
        };
        let mut s = CacheAware::new(opts, 2, 1);
        let mut sink = ShareSink::default();
        for i in 0..10_000u32 {
            let id = i.to_le_bytes();
            s.routed(&rq(b"", Some(&id)), (i % 2) as usize, &mut sink, t0);
            assert!(s.sessions.len() <= 100);
        }
        assert!(s.sessions.storage() <= 100);
        let c = cands(&[(1.0, 0); 2]);
        // The newest survive, the oldest are gone.
        let newest = 9_999u32.to_le_bytes();
        let key = SessionKey {
            header: Some(&newest),
            prompt: b"",
        };
        assert_eq!(s.sessions.get(key.hash(), t0), Some(1));
        let oldest = 0u32.to_le_bytes();
        let key = SessionKey {
            header: Some(&oldest),
            prompt: b"",
        };
        assert_eq!(s.sessions.get(key.hash(), t0), None);
        // Expired entries make way first.
        s.routed(
            &rq(b"", Some(b"late")),
            0,
            &mut sink,
            t0 + Duration::from_secs(61),
        );
        assert_eq!(s.sessions.len(), 1);
        let r = rq(b"", Some(b"late"));
        assert_eq!(
            s.pick(&r, &c, t0 + Duration::from_secs(62)).unwrap().index,
            0
        );
    }

    #[test]
    fn two_cores_converge_through_shared_items() {
        let now = Instant::now();
        let mut a = strategy(4);
        let mut b = CacheAware::new(Options::default(), 4, 99);
        let c = cands(&[(1.0, 0); 4]);
        let mut sink = ShareSink::default();
        sink.for_route(0);
        let system = text(16, 4000);
        let first = chat(&system, b"hello");
        let (ta, _) = route(&mut a, &rq(&first, Some(b"sess")), &c, &mut sink, now);
        let batch = sink.take_batch();
        assert_eq!(batch.len(), 2, "one prefix, one session pin");
        for (route, item) in batch.iter() {
            assert_eq!(route, 0);
            if let Shared::Prefix { data, .. } = item {
                assert!(data.len() < first.len() / 7, "compact encoding");
            }
            b.apply_shared(&item, now);
        }
        assert_eq!(b.index().held(ta), first.len());
        assert!(sink.is_empty());
        // The same prefix lands on the same target on either core.
        let next = chat(&system, b"a different question");
        for s in [&mut a, &mut b] {
            for _ in 0..20 {
                let p = s.pick(&rq(&next, None), &c, now).unwrap();
                assert_eq!(p.index, ta);
            }
        }
        // The session pin reached core b too: even an unrelated prompt follows it.
        let other = text(17, 3000);
        assert_eq!(
            b.pick(&rq(&other, Some(b"sess")), &c, now).unwrap().index,
            ta
        );
        // Malformed shared data is ignored.
        b.apply_shared(
            &Shared::Prefix {
                target: 1,
                data: &[200, 1, 2],
            },
            now,
        );
        assert_eq!(b.index().held(1), 0);
    }

    #[test]
    fn a_pick_on_another_replicas_prefix_or_pin_says_so_until_this_replica_routes_it() {
        let now = Instant::now();
        let mut a = strategy(4);
        // The origin of a match is read on routes that share with the other replicas.
        let mut sharing = Options::default();
        sharing.pins.share_prefixes = true;
        sharing.pins.share_sessions = true;
        let mut b = CacheAware::new(sharing, 4, 7);
        let c = cands(&[(1.0, 0); 4]);
        let mut sink = ShareSink::default();
        sink.for_route(0);
        let system = text(21, 4000);
        let first = chat(&system, b"hello");
        let (ta, _) = route(&mut a, &rq(&first, Some(b"s1")), &c, &mut sink, now);
        let batch = sink.take_batch();
        for (_, item) in batch.iter() {
            b.apply_fleet_shared(&item, now);
        }
        // The pin came from the fleet.
        assert_eq!(b.pick(&rq(&first, Some(b"s1")), &c, now).unwrap().index, ta);
        assert_eq!(b.basis(), Basis::SharedPin);
        // So did the prefix: the longest match is known only from the other replica.
        let next = chat(&system, b"a second question");
        assert_eq!(b.pick(&rq(&next, None), &c, now).unwrap().index, ta);
        assert_eq!(b.basis(), Basis::SharedPrefix);
        // A cold prompt goes by this replica's own view.
        b.pick(&rq(&text(22, 3000), None), &c, now).unwrap();
        assert_eq!(b.basis(), Basis::Local);
        // Once this replica routed the prefix itself, the match is its own.
        let mut own = ShareSink::default();
        route(&mut b, &rq(&next, None), &c, &mut own, now);
        let third = chat(&system, b"a second question and more");
        assert_eq!(b.pick(&rq(&third, None), &c, now).unwrap().index, ta);
        assert_eq!(b.basis(), Basis::Local);
        // Items from this replica's other cores are its own information too.
        let mut d = CacheAware::new(sharing, 4, 8);
        for (_, item) in batch.iter() {
            d.apply_shared(&item, now);
        }
        d.pick(&rq(&next, None), &c, now).unwrap();
        assert_eq!(d.basis(), Basis::Local);
        // A route that shares nothing does not read the origin.
        let mut e = CacheAware::new(Options::default(), 4, 9);
        for (_, item) in batch.iter() {
            e.apply_fleet_shared(&item, now);
        }
        e.pick(&rq(&next, None), &c, now).unwrap();
        assert_eq!(e.basis(), Basis::Local);
    }

    #[test]
    fn shared_system_prompt_workload_sticks_to_the_target_that_saw_it() {
        let now = Instant::now();
        let mut s = strategy(4);
        let mut sink = ShareSink::default();
        let c = cands(&[(1.0, 0); 4]);
        let sys_a = text(18, 6000);
        let sys_b = text(19, 6000);
        let (home_a, _) = route(&mut s, &rq(&chat(&sys_a, b"q0"), None), &c, &mut sink, now);
        let (home_b, _) = route(&mut s, &rq(&chat(&sys_b, b"q0"), None), &c, &mut sink, now);
        assert_ne!(home_a, home_b, "a new system prompt goes to a cold target");
        for i in 0..200u32 {
            let user = format!("question {i}: {}", "z".repeat((i % 50) as usize));
            let ra = chat(&sys_a, user.as_bytes());
            let rb = chat(&sys_b, user.as_bytes());
            let (ta, pa) = route(&mut s, &rq(&ra, None), &c, &mut sink, now);
            assert_eq!(ta, home_a);
            assert!(pa.score.unwrap() > 0.9);
            let (tb, _) = route(&mut s, &rq(&rb, None), &c, &mut sink, now);
            assert_eq!(tb, home_b);
            // Different keys for requests sharing the system prompt.
            assert_ne!(
                rq(&ra, None).session.hash(),
                rq(&chat(&sys_a, b"q0"), None).session.hash()
            );
        }
    }

    #[test]
    fn one_and_removed_candidates() {
        let now = Instant::now();
        let mut s = strategy(3);
        let mut sink = ShareSink::default();
        let p = text(20, 1000);
        let one = cands(&[(1.0, 1000)]);
        assert_eq!(s.pick(&rq(&p, None), &one, now).unwrap().index, 0);
        s.routed(&rq(&p, None), 1, &mut sink, now);
        let all = cands(&[(1.0, 0); 3]);
        assert_eq!(s.pick(&rq(&p, None), &all, now).unwrap().index, 1);
        // Target 1 leaves the candidates: another takes the prefix and keeps it.
        let without_1 = [all[0], all[2]];
        let (t, _) = route(&mut s, &rq(&p, None), &without_1, &mut sink, now);
        assert_ne!(t, 1);
        for _ in 0..20 {
            let i = s.pick(&rq(&p, None), &without_1, now).unwrap().index;
            assert_eq!(without_1[i].target, t);
        }
        // Targets outside the index are cold, never a panic.
        let stranger = [
            Candidate {
                target: 50,
                ..all[0]
            },
            all[1],
        ];
        s.pick(&rq(&p, None), &stranger, now).unwrap();
        s.routed(&rq(&p, None), 50, &mut sink, now);
    }

    #[test]
    fn declares_its_needs_and_reports_what_it_learned() {
        let mut s = strategy(2);
        assert!(s.needs().contains(Needs::CANONICAL_PROMPT));
        let mut sink = ShareSink::default();
        s.routed(
            &rq(&text(21, 640), Some(b"k")),
            1,
            &mut sink,
            Instant::now(),
        );
        let l = s.learned(1);
        assert!(l.contains(&("prefix_bytes", 640.0)));
        assert!(l.contains(&("prefix_nodes", 10.0)));
        assert!(l.contains(&("sessions", 1.0)));
    }

    #[test]
    fn registry_options() {
        use crate::testing::{lookup, validate_spec, Trait};
        let info = lookup("cache_aware").unwrap();
        assert!(info.aliases.is_empty());
        for t in [Trait::LoadAware, Trait::Stateful, Trait::SingleWinner] {
            assert!(info.traits.contains(&t));
        }
        let ok: toml::Table = toml::from_str(
            "threshold = 0.7\nmax_bytes_per_target = 1048576\nbalance_abs_threshold = 0\n\
             balance_rel_threshold = 2\nsession_ttl = \"30s\"\nmax_sessions = 10",
        )
        .unwrap();
        assert_eq!(validate_spec("cache_aware", &ok), Ok("cache_aware"));
        let o = crate::testing::parse_options::<Options>(&ok).unwrap();
        assert_eq!(o.threshold, 0.7);
        assert_eq!(o.max_bytes_per_target, 1 << 20);
        assert_eq!(o.balance.abs, 0);
        assert_eq!(o.balance.rel, 2.0);
        assert_eq!(o.session_ttl, Duration::from_secs(30));
        assert_eq!(o.pins.max_sessions, 10);
        assert_eq!(
            crate::testing::parse_options::<Options>(&toml::Table::new()).unwrap(),
            Options::default()
        );
        for bad in [
            "threshold = 1.5",
            "threshold = -0.1",
            "max_bytes_per_target = 10",
            "balance_abs_threshold = -1",
            "balance_rel_threshold = 0.5",
            "session_ttl = \"0s\"",
            "max_sessions = 0",
        ] {
            let t: toml::Table = toml::from_str(bad).unwrap();
            assert!(validate_spec("cache_aware", &t).is_err(), "{bad}");
        }
        let ctx = crate::testing::context(&[1.0, 1.0], &[]);
        let spec = crate::testing::raw("cache_aware", ok);
        crate::testing::build(&spec, &ctx);
    }

    #[test]
    fn remapped_targets_keep_their_prefixes_and_pins_and_a_removed_ones_are_gone() {
        let t0 = Instant::now();
        let mut s = CacheAware::new(Options::default(), 3, 1);
        let mut sink = ShareSink::default();
        let (p0, p1, p2) = (&[b'a'; 256][..], &[b'b'; 256][..], &[b'c'; 256][..]);
        s.routed(&rq(p0, Some(b"s0")), 0, &mut sink, t0);
        s.routed(&rq(p1, Some(b"s1")), 1, &mut sink, t0);
        s.routed(&rq(p2, Some(b"s2")), 2, &mut sink, t0);
        // Target 1 leaves; target 2 becomes 1; a new target 2 joins.
        assert!(s.remap_targets(&[Some(0), Some(2), None]));
        assert_eq!(s.index.matched(0, p0), 256);
        assert_eq!(
            s.index.matched(1, p2),
            256,
            "target 2's prefixes follow it to id 1"
        );
        assert_eq!(
            s.index.matched(1, p1),
            0,
            "the removed target's prefixes are gone"
        );
        assert_eq!(s.index.held(2), 0, "the joining target starts empty");
        let pin = |id: &[u8]| {
            s.sessions.get(
                SessionKey {
                    header: Some(id),
                    prompt: b"",
                }
                .hash(),
                t0,
            )
        };
        assert_eq!(pin(b"s0"), Some(0));
        assert_eq!(pin(b"s2"), Some(1));
        assert_eq!(pin(b"s1"), Some(crate::shared::sessions::GONE));
    }
}
