//! `lmcache_aware`: send a request to the engine whose LMCache store holds the most of its
//! prompt, as the LMCache controller reports it, preferring engines with free KV-cache room.
//!
//! A pick, in order:
//!
//! 0. **Balance guard** (as `cache_aware`'s): when the candidates' loads differ by more than
//!    `balance_abs_threshold` (32) and the highest exceeds `balance_rel_threshold` (1.5)
//!    times the lowest, the least-loaded candidate wins (fallback `imbalance`).
//! 1. **Inputs.** The prompt's token ids (`Needs::TOKEN_IDS`) and the controller's answer
//!    for them (`Needs::CACHE_LOOKUP`: `POST /lookup`, resolved before the pick by
//!    the gateway's `route_clients::cache_lookup`, reused for the same prefix within
//!    `lookup_window`). Without token ids the least-loaded candidate wins (fallback
//!    `no_token_ids`); without an answer within `lookup_timeout` likewise (fallback `lmcache_unreachable`).
//! 2. **Score.** Each candidate's held share of the prompt (matched tokens ÷ prompt tokens,
//!    in [0, 1]) and its free KV-cache share (1 − `kv_cache_usage` from the metrics scrape;
//!    a target without one counts as the mean of those that have one) are weighted by
//!    `w_prefix` (1.0) and `w_free` (0.25) and divided by the weights' sum, so a score is
//!    in [0, 1]. When the most any candidate holds is above `min_tokens` (default 0), the
//!    best score wins, ties by load then at random; otherwise load decides (the normal path
//!    for a prompt no engine holds).
//!
//! Owns a generator. It must not block, log, do I/O or read a clock.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::{help_lines, StrategyOptions};
use crate::requirements::Requirements;
use crate::requirements::{CacheLookupOptions, TokenizerOptions};
use crate::shared::balance::BalanceGuard;
use crate::shared::balance::IMBALANCE;
use crate::shared::choose::{choose_least_loaded, choose_least_loaded_among};
use crate::strategies::precise_cache_aware::NO_TOKEN_IDS;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Needs, Pick, PickRequest};

/// Fallback: the controller gave no usable answer in time.
pub const LMCACHE_UNREACHABLE: &str = "lmcache_unreachable";

/// The options of `lmcache_aware`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// The LMCache controller's API server, `http://host:port`; required. (Unset, TOML
    /// leaves it out; no `skip_serializing_if` beside flattened parts, see
    /// [`crate::options::field_names`].)
    pub controller: Option<String>,
    #[serde(with = "crate::values::duration")]
    pub lookup_timeout: Duration,
    #[serde(with = "crate::values::duration")]
    pub lookup_window: Duration,
    #[serde(with = "crate::values::duration")]
    pub retry_after: Duration,
    /// The controller's chunk size in tokens.
    pub chunk_size: usize,
    pub min_tokens: u32,
    pub w_prefix: f64,
    pub w_free: f64,
    /// `balance_abs_threshold`, `balance_rel_threshold`.
    #[serde(flatten)]
    pub balance: BalanceGuard,
    /// `tokenizer`, `tokenizer_config`, `tokenize_timeout`: where the token ids come from.
    #[serde(flatten)]
    pub tokens: TokenizerOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller: None,
            lookup_timeout: Duration::from_millis(50),
            lookup_window: Duration::from_secs(2),
            retry_after: Duration::from_secs(1),
            chunk_size: 256,
            min_tokens: 0,
            w_prefix: 1.0,
            w_free: 0.25,
            balance: BalanceGuard::default(),
            tokens: TokenizerOptions::default(),
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "lmcache_aware";
    const SUMMARY: &'static str = "The candidate whose LMCache store holds the most of the prompt (the LMCache controller's /lookup), with free KV-cache room as a second term; load below min_tokens or when the controller does not answer";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::AsyncInput, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &help_lines::<13>(&[
        &[
            (
                "controller",
                "required: the LMCache controller's API server, http://host:port (python -m lmcache.v1.api_server --port 9000)",
            ),
            (
                "lookup_timeout",
                "how long a lookup may take before the pick falls back to load (fallback lmcache_unreachable)",
            ),
            (
                "lookup_window",
                "a lookup's answer is reused for prompts with the same whole chunks for this long (per core); \"0s\" asks every time",
            ),
            (
                "retry_after",
                "after a failed lookup, the controller is not asked again (picks fall back at once) for this long",
            ),
            (
                "chunk_size",
                "the controller's chunk size in tokens (LMCache's chunk_size); prompts that agree on every whole chunk share a memoised answer",
            ),
            (
                "min_tokens",
                "the scores decide only when some candidate holds more than this many prompt tokens; otherwise load decides",
            ),
            (
                "w_prefix",
                "weight of the held share of the prompt (matched tokens / prompt tokens)",
            ),
            (
                "w_free",
                "weight of the free KV-cache share (1 - vllm:kv_cache_usage_perc from the metrics scrape)",
            ),
        ],
        &BalanceGuard::HELP,
        &TokenizerOptions::HELP,
    ]);

    fn check(&self, errors: &mut Vec<OptionError>) {
        if self.controller.as_deref().is_none_or(str::is_empty) {
            errors.push(
                OptionError::new("controller", "lmcache_aware has no `controller`").with_fix(
                    "set controller = \"http://<controller host>:9000\" (the LMCache controller's API server, `python -m lmcache.v1.api_server --port 9000`)",
                ),
            );
        }
        crate::values::positive_duration(errors, "lookup_timeout", self.lookup_timeout);
        crate::values::positive_duration(errors, "retry_after", self.retry_after);
        crate::values::positive(errors, "chunk_size", self.chunk_size as u64);
        crate::values::non_negative(errors, "w_prefix", self.w_prefix);
        crate::values::non_negative(errors, "w_free", self.w_free);
        self.balance.check_options(errors);
        self.tokens.check(errors);
        if errors.is_empty() && self.w_prefix == 0.0 && self.w_free == 0.0 {
            errors.push(OptionError::new(
                "w_prefix",
                "w_prefix and w_free are both 0, so lmcache_aware would score all targets \
                 alike; give w_prefix a value above 0",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(LmcacheAware::new(self, ctx.seed))
    }

    fn requirements(&self) -> Requirements {
        Requirements {
            token_ids: Some(self.tokens.clone()),
            cache_lookup: Some(CacheLookupOptions {
                controller: self.controller.clone().unwrap_or_default(),
                timeout: self.lookup_timeout,
                window: self.lookup_window,
                retry_after: self.retry_after,
                chunk_tokens: self.chunk_size,
            }),
            ..Requirements::default()
        }
    }
}

/// What a pick reads of the options.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scoring {
    min_tokens: u32,
    w_prefix: f64,
    w_free: f64,
    guard: BalanceGuard,
}

pub struct LmcacheAware {
    options: Scoring,
    rng: fastrand::Rng,
    scores: Vec<f64>,
}

impl LmcacheAware {
    pub fn new(options: &Options, seed: u64) -> Self {
        LmcacheAware {
            options: Scoring {
                min_tokens: options.min_tokens,
                w_prefix: options.w_prefix,
                w_free: options.w_free,
                guard: options.balance,
            },
            rng: fastrand::Rng::with_seed(seed),
            scores: Vec::new(),
        }
    }
}

impl Strategy for LmcacheAware {
    fn needs(&self) -> Needs {
        Needs::TOKEN_IDS.union(Needs::CACHE_LOOKUP)
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        if let Some(i) = self.options.guard.check(&mut self.rng, candidates) {
            return Some(Pick::fallback(i, IMBALANCE));
        }
        let Some(ids) = req.inputs.token_ids.as_deref() else {
            let i = choose_least_loaded(&mut self.rng, candidates)?;
            return Some(Pick::fallback(i, NO_TOKEN_IDS));
        };
        let Some(held) = req.inputs.cached_tokens.as_deref() else {
            let i = choose_least_loaded(&mut self.rng, candidates)?;
            return Some(Pick::fallback(i, LMCACHE_UNREACHABLE));
        };
        let prompt = ids.len().max(1) as f64;
        let held_by = |c: &Candidate| {
            held.iter()
                .find(|&&(t, _)| t == c.target)
                .map_or(0, |&(_, n)| n)
        };
        let best_held = candidates.iter().map(held_by).max().unwrap_or(0);
        if best_held <= self.options.min_tokens {
            return Some(Pick {
                score: Some(0.0),
                ..Pick::at(choose_least_loaded(&mut self.rng, candidates)?)
            });
        }
        let (sum, known) = candidates
            .iter()
            .filter_map(|c| c.kv_usage)
            .fold((0.0, 0u32), |(s, n), u| (s + f64::from(u), n + 1));
        let mean_usage = if known == 0 {
            0.0
        } else {
            sum / f64::from(known)
        };
        let o = &self.options;
        let weights = (o.w_prefix + o.w_free).max(f64::MIN_POSITIVE);
        self.scores.clear();
        self.scores.extend(candidates.iter().map(|c| {
            let share = (f64::from(held_by(c)) / prompt).min(1.0);
            let usage = c.kv_usage.map_or(mean_usage, f64::from).clamp(0.0, 1.0);
            (o.w_prefix * share + o.w_free * (1.0 - usage)) / weights
        }));
        let best = self.scores.iter().copied().fold(f64::MIN, f64::max);
        let scores = &self.scores;
        let top = |i: usize| scores[i] >= best - 1e-12;
        let chosen = choose_least_loaded_among(&mut self.rng, candidates, top)?;
        Some(Pick {
            index: chosen,
            score: Some(best),
            fallback: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::testing::{cands, req};
    use rolter_core::AsyncInputs;

    fn pick_with(
        s: &mut LmcacheAware,
        prompt_len: u32,
        held: Option<&[(usize, u32)]>,
        c: &[Candidate],
    ) -> Pick {
        let ids: Vec<u32> = (0..prompt_len).collect();
        let inputs = AsyncInputs {
            token_ids: Some(Rc::from(ids)),
            cached_tokens: held.map(Rc::from),
            rotation: None,
        };
        let r = PickRequest {
            inputs: &inputs,
            ..req()
        };
        s.pick(&r, c, Instant::now()).unwrap()
    }

    fn strategy() -> LmcacheAware {
        LmcacheAware::new(&Options::default(), 3)
    }

    fn with_usage(mut c: Vec<Candidate>, usage: &[Option<f32>]) -> Vec<Candidate> {
        for (c, u) in c.iter_mut().zip(usage) {
            c.kv_usage = *u;
        }
        c
    }

    #[test]
    fn the_instance_holding_the_most_wins_over_load() {
        let mut s = strategy();
        let c = cands(&[(1.0, 0), (1.0, 9), (1.0, 0)]);
        let p = pick_with(&mut s, 1000, Some(&[(0, 256), (1, 768)]), &c);
        assert_eq!((p.index, p.fallback), (1, None));
        // 0.768 held, free room unknown everywhere (counts as equal): (0.768 + 0.25) / 1.25.
        assert!((p.score.unwrap() - (0.768 + 0.25) / 1.25).abs() < 1e-9);
    }

    #[test]
    fn free_cache_room_separates_equal_holders() {
        let mut s = strategy();
        let c = with_usage(
            cands(&[(1.0, 0), (1.0, 0), (1.0, 0)]),
            &[Some(0.9), Some(0.2), Some(0.0)],
        );
        // Targets 0 and 1 hold the whole prompt; 1 has more room. Target 2 is empty but
        // holds nothing: the prefix term dominates.
        let held = [(0, 512), (1, 512)];
        for _ in 0..50 {
            assert_eq!(pick_with(&mut s, 512, Some(&held), &c).index, 1);
        }
        // A target without a usage figure counts as the mean of the others (0.55 here):
        // worse than 0.2, better than 0.9.
        let c = with_usage(c, &[Some(0.9), None, Some(0.2)]);
        let held = [(0, 512), (1, 512)];
        assert_eq!(pick_with(&mut s, 512, Some(&held), &c).index, 1);
    }

    #[test]
    fn a_small_match_against_much_room_still_wins_at_default_weights() {
        let mut s = strategy();
        // 256 of 1000 held on a 95 %-full engine against nothing on an empty one:
        // (0.256 + 0.25 * 0.05) vs 0.25: the holder wins.
        let c = with_usage(cands(&[(1.0, 0), (1.0, 0)]), &[Some(0.95), Some(0.0)]);
        assert_eq!(pick_with(&mut s, 1000, Some(&[(0, 256)]), &c).index, 0);
        // With free room weighted as much as the prefix, the empty engine wins.
        let mut s = LmcacheAware::new(
            &Options {
                w_free: 1.0,
                ..Options::default()
            },
            3,
        );
        assert_eq!(pick_with(&mut s, 1000, Some(&[(0, 256)]), &c).index, 1);
    }

    #[test]
    fn at_or_below_min_tokens_load_decides_without_a_fallback() {
        let c = cands(&[(1.0, 5), (1.0, 1)]);
        let mut s = LmcacheAware::new(
            &Options {
                min_tokens: 256,
                ..Options::default()
            },
            1,
        );
        let p = pick_with(&mut s, 1000, Some(&[(0, 256)]), &c);
        assert_eq!((p.index, p.fallback), (1, None));
        let p = pick_with(&mut s, 1000, Some(&[(0, 512)]), &c);
        assert_eq!((p.index, p.fallback), (0, None));
        // Nothing held anywhere: load.
        let mut s = strategy();
        let p = pick_with(&mut s, 1000, Some(&[]), &c);
        assert_eq!((p.index, p.fallback), (1, None));
    }

    #[test]
    fn without_inputs_load_decides_and_says_why() {
        let c = cands(&[(1.0, 4), (1.0, 1)]);
        let mut s = strategy();
        let p = s.pick(&req(), &c, Instant::now()).unwrap();
        assert_eq!((p.index, p.fallback), (1, Some(NO_TOKEN_IDS)));
        let p = pick_with(&mut s, 100, None, &c);
        assert_eq!((p.index, p.fallback), (1, Some(LMCACHE_UNREACHABLE)));
    }

    #[test]
    fn holdings_of_targets_that_are_not_candidates_are_ignored() {
        let mut s = strategy();
        // Target 7 (ejected, or on another route) holds everything; the candidates hold
        // nothing: load decides.
        let c = cands(&[(1.0, 3), (1.0, 0)]);
        let p = pick_with(&mut s, 600, Some(&[(7, 600)]), &c);
        assert_eq!((p.index, p.fallback), (1, None));
    }

    #[test]
    fn the_balance_guard_overrides_a_holder() {
        let mut s = strategy();
        let c = cands(&[(1.0, 40), (1.0, 2)]);
        let p = pick_with(&mut s, 512, Some(&[(0, 512)]), &c);
        assert_eq!((p.index, p.fallback), (1, Some(IMBALANCE)));
    }

    #[test]
    fn equal_scores_tie_by_load_then_at_random() {
        let mut s = strategy();
        let c = cands(&[(1.0, 2), (1.0, 2), (1.0, 5)]);
        let held = [(0, 512), (1, 512), (2, 512)];
        let mut counts = [0u32; 3];
        for _ in 0..2000 {
            counts[pick_with(&mut s, 512, Some(&held), &c).index] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!(counts[0] > 850 && counts[1] > 850, "{counts:?}");
    }

    #[test]
    fn options_come_from_the_table() {
        let t: toml::Table = toml::from_str(
            "controller = \"http://127.0.0.1:9000\"\nmin_tokens = 300\nw_prefix = 2\nw_free = 0.5\nbalance_abs_threshold = 8\nbalance_rel_threshold = 2.0",
        )
        .unwrap();
        let o = crate::testing::parse_options::<Options>(&t).unwrap();
        assert_eq!(o.min_tokens, 300);
        assert_eq!((o.w_prefix, o.w_free), (2.0, 0.5));
        assert_eq!((o.balance.abs, o.balance.rel), (8, 2.0));
        let only: toml::Table = toml::from_str("controller = \"http://127.0.0.1:9000\"").unwrap();
        assert_eq!(
            crate::testing::parse_options::<Options>(&only).unwrap(),
            Options {
                controller: Some("http://127.0.0.1:9000".into()),
                ..Options::default()
            }
        );
    }
}
