//! `precise_cache_aware`: send a request to the engine that holds the longest run of its
//! leading KV blocks, as the engines themselves report them in their KV-cache events.
//!
//! A pick, in order:
//!
//! 0. **Balance guard** (as `cache_aware`'s): when the candidates' loads differ by more than
//!    `balance_abs_threshold` (32) and the highest exceeds `balance_rel_threshold` (1.5)
//!    times the lowest, the least-loaded candidate wins (fallback `imbalance`). Without it,
//!    the first engine to hold a prefix every prompt shares (a system prompt) would draw
//!    every request.
//! 1. **Token ids.** The request's prompt as token ids (`Needs::TOKEN_IDS`: a local tokenizer
//!    with the model's chat template, or the engine's tokenize endpoint, resolved before the
//!    pick). Without them, the least-loaded candidate wins (fallback `no_token_ids`).
//! 2. **Live streams.** Only candidates whose KV-event stream is live can be scored; when
//!    none is (no events yet, publisher stopped, index dropped after a gap), the
//!    least-loaded candidate wins (fallback `kv_events_stale`).
//! 3. **Score.** The ids are cut into full blocks and keyed the way the index keys the
//!    events' `token_ids` (chained, so a match is a consecutive prefix); each live candidate
//!    scores the number of leading blocks it holds. When the best score is above
//!    `min_blocks` (default [`DEFAULT_MIN_BLOCKS`], 2), the best wins, ties by load then at
//!    random; otherwise load decides (the normal path for a prompt no engine holds, and
//!    for one whose only match is the chat template's first block or two, which every
//!    prompt shares).
//!
//! Owns scratch buffers (keys, candidate ids, scores) that grow to the largest request seen,
//! and a generator. It reads the shared index without locks, must not block, log, or do
//! I/O, and reads no clock.

use std::sync::Arc;
use std::time::Instant;

use rolter_core::KvCacheView;
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::{help_lines, StrategyOptions};
use crate::requirements::Requirements;
use crate::requirements::TokenizerOptions;
use crate::shared::balance::BalanceGuard;
use crate::shared::balance::IMBALANCE;
use crate::shared::choose::{choose_least_loaded, choose_least_loaded_among};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Needs, Pick, PickRequest};

/// Fallback: the request's token ids were not available in time.
pub const NO_TOKEN_IDS: &str = "no_token_ids";
/// Fallback: no candidate's KV-event stream is live.
pub const KV_EVENTS_STALE: &str = "kv_events_stale";

/// The default `min_blocks`: a match of one or two blocks (up to 32 tokens with 16-token
/// blocks: a chat template's header and a short default system prompt, shared by every
/// prompt) is not worth a cache hit, and following it would draw every request to the
/// engines that served the first ones (docs/strategies.md has the measurement).
pub const DEFAULT_MIN_BLOCKS: u32 = 2;

/// The options of `precise_cache_aware`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// The best-holding target wins only above this many leading blocks.
    pub min_blocks: u32,
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
            min_blocks: DEFAULT_MIN_BLOCKS,
            balance: BalanceGuard::default(),
            tokens: TokenizerOptions::default(),
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "precise_cache_aware";
    const SUMMARY: &'static str = "The candidate holding the longest run of the prompt's leading KV blocks, from the engines' KV-cache events; load below min_blocks";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::AsyncInput, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &help_lines::<6>(&[
        &[
            (
                "min_blocks",
                "the best-holding target wins only when it holds more than this many leading blocks; otherwise load decides",
            ),
        ],
        &BalanceGuard::HELP,
        &TokenizerOptions::HELP,
    ]);

    fn check(&self, errors: &mut Vec<OptionError>) {
        self.balance.check_options(errors);
        self.tokens.check(errors);
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(
            PreciseCacheAware::new(ctx.kv.cloned(), self.min_blocks, ctx.seed)
                .with_balance(self.balance),
        )
    }

    fn requirements(&self) -> Requirements {
        Requirements {
            token_ids: Some(self.tokens.clone()),
            ..Requirements::default()
        }
    }
}

pub struct PreciseCacheAware {
    view: Option<Arc<dyn KvCacheView>>,
    min_blocks: u32,
    guard: BalanceGuard,
    rng: fastrand::Rng,
    keys: Vec<u64>,
    targets: Vec<u32>,
    scores: Vec<u32>,
}

impl PreciseCacheAware {
    /// Scores over `view`; without one (no target publishes KV events) every pick falls
    /// back to load.
    pub fn new(view: Option<Arc<dyn KvCacheView>>, min_blocks: u32, seed: u64) -> Self {
        PreciseCacheAware {
            view,
            min_blocks,
            guard: BalanceGuard::default(),
            rng: fastrand::Rng::with_seed(seed),
            keys: Vec::new(),
            targets: Vec::new(),
            scores: Vec::new(),
        }
    }

    /// The balance guard's thresholds (see the module documentation).
    pub fn with_balance(mut self, guard: BalanceGuard) -> Self {
        self.guard = guard;
        self
    }

    fn least_loaded(&mut self, candidates: &[Candidate]) -> Option<usize> {
        choose_least_loaded(&mut self.rng, candidates)
    }
}

impl Strategy for PreciseCacheAware {
    fn needs(&self) -> Needs {
        Needs::TOKEN_IDS
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        if let Some(i) = self.guard.check(&mut self.rng, candidates) {
            return Some(Pick::fallback(i, IMBALANCE));
        }
        let (Some(ids), Some(view)) = (req.inputs.token_ids.as_deref(), self.view.as_deref())
        else {
            let reason = if req.inputs.token_ids.is_none() {
                NO_TOKEN_IDS
            } else {
                KV_EVENTS_STALE
            };
            return Some(Pick::fallback(self.least_loaded(candidates)?, reason));
        };
        if !candidates.iter().any(|c| view.is_live(c.target)) {
            return Some(Pick::fallback(
                self.least_loaded(candidates)?,
                KV_EVENTS_STALE,
            ));
        }
        view.block_keys(ids, &mut self.keys);
        self.targets.clear();
        self.targets
            .extend(candidates.iter().map(|c| c.target as u32));
        self.scores.clear();
        self.scores.resize(candidates.len(), 0);
        view.leading_blocks(&self.keys, &self.targets, &mut self.scores);
        for (c, s) in candidates.iter().zip(self.scores.iter_mut()) {
            if !view.is_live(c.target) {
                *s = 0;
            }
        }
        let best = self.scores.iter().copied().max().unwrap_or(0);
        let score = if self.keys.is_empty() {
            0.0
        } else {
            f64::from(best) / self.keys.len() as f64
        };
        let chosen = if best > self.min_blocks {
            let scores = &self.scores;
            choose_least_loaded_among(&mut self.rng, candidates, |i| scores[i] == best)?
        } else {
            self.least_loaded(candidates)?
        };
        Some(Pick {
            index: chosen,
            score: Some(score),
            fallback: None,
        })
    }
}
