//! The strategy registry: canonical names, aliases, advertised traits, options with their
//! types and defaults, and construction of per-core instances.
//!
//! Owns the mapping from configuration to strategy objects. It must not hold per-request
//! state; `validate_spec` runs at configuration load, `build` once per route per worker.

use super::adaptive::{Adaptive, AdaptiveOptions};
use super::cache_aware::{CacheAware, CacheAwareOptions};
use super::cheapest::{Cheapest, DEFAULT_OUTPUT_TOKENS};
use super::consistent_hash::{ConsistentHash, DEFAULT_POINTS, MAX_POINTS};
use super::failover::Failover;
use super::fair_catchup::{FairCatchup, DEFAULT_MAX_CATCHUP_SHARE, DEFAULT_WINDOW};
use super::fastest::{Fastest, FastestOptions};
use super::least_loaded::LeastLoaded;
use super::lmcache_aware::{LmcacheAware, LmcacheAwareOptions};
use super::lora_aware::{LoraAware, LoraAwareOptions};
use super::pipeline::{Pipeline, PipelineOptions};
use super::power_of_two::PowerOfTwo;
use super::precise_cache_aware::PreciseCacheAware;
use super::predicted_latency::{PredictedLatency, PredictedLatencyOptions};
use super::random::Random;
use super::random_weighted::RandomWeighted;
use super::round_robin::RoundRobin;
use std::sync::Arc;

use super::{Strategy, Switches};
use crate::config::{StrategySpec, Target, TargetId};
use crate::engine_state::view::EngineView;
use crate::pricing::PriceBook;

/// What a strategy advertises about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trait {
    /// Honours target weights.
    Weighted,
    /// Keeps state between picks.
    Stateful,
    /// Reads the live load view.
    LoadAware,
    /// Needs an asynchronous input before it can pick.
    AsyncInput,
    /// Consults health beyond the candidate filter.
    HealthAware,
    /// Always one winner per pick.
    SingleWinner,
}

impl Trait {
    pub fn label(self) -> &'static str {
        match self {
            Trait::Weighted => "weighted",
            Trait::Stateful => "stateful",
            Trait::LoadAware => "load-aware",
            Trait::AsyncInput => "async-input",
            Trait::HealthAware => "health-aware",
            Trait::SingleWinner => "single-winner",
        }
    }
}

/// The type an option's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    Bool,
    Integer,
    Float,
    Duration,
    String,
}

/// A value check beyond the option's type.
pub type OptionCheck = fn(&toml::Value) -> Result<(), String>;

/// One option a strategy accepts.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub key: &'static str,
    pub kind: OptionKind,
    pub default: &'static str,
    pub help: &'static str,
    /// Extra check on a well-typed value; returns a message on failure.
    pub check: Option<OptionCheck>,
}

/// Everything the registry knows about one strategy.
pub struct StrategyInfo {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub summary: &'static str,
    pub traits: &'static [Trait],
    pub options: &'static [OptionSpec],
    build: fn(&toml::Table, &BuildContext) -> Box<dyn Strategy>,
}

/// What a strategy instance is built for.
pub struct BuildContext<'a> {
    /// Number of targets in the whole configuration (strategies index state by target id).
    pub target_count: usize,
    /// Seed for per-core randomness.
    pub seed: u64,
    /// Every target of the configuration (weights, tiers, models), indexed by target id.
    pub targets: &'a [Target],
    /// The targets of the route this instance serves, in configuration order.
    pub route_targets: &'a [TargetId],
    /// Prices per target and model (catalog, `[catalog]` and per-target overrides).
    pub prices: &'a PriceBook,
    /// Run-time switches shared by every core (the adaptive kill switch).
    pub switches: &'a Arc<Switches>,
    /// The engines' own state (KV block index, stream liveness), shared by every core.
    pub engine: &'a EngineView,
}

/// The balance guard's options, shared by `cache_aware` and `precise_cache_aware`.
const BALANCE_ABS_OPTION: OptionSpec = OptionSpec {
    key: "balance_abs_threshold",
    kind: OptionKind::Integer,
    default: "32",
    help: "balance guard: pick by load when max load - min load among the candidates exceeds this and max > balance_rel_threshold x min",
    check: Some(non_negative_integer),
};
const BALANCE_REL_OPTION: OptionSpec = OptionSpec {
    key: "balance_rel_threshold",
    kind: OptionKind::Float,
    default: "1.5",
    help: "balance guard: the ratio max load / min load must exceed too (>= 1)",
    check: Some(cache_ratio),
};

/// Where the prompt's token ids come from, shared by `precise_cache_aware` and
/// `lmcache_aware` (read by `proxy::inputs`; a path is loaded at configuration time).
const TOKENIZER_OPTION: OptionSpec = OptionSpec {
    key: "tokenizer",
    kind: OptionKind::String,
    default: "engine",
    help: "where token ids come from: \"engine\" (the target's POST /tokenize) or the path of a Hugging Face tokenizer.json",
    check: None,
};
const TOKENIZER_CONFIG_OPTION: OptionSpec = OptionSpec {
    key: "tokenizer_config",
    kind: OptionKind::String,
    default: "",
    help: "with a local tokenizer: the model's tokenizer_config.json (chat template, special tokens); default: the one beside tokenizer.json",
    check: None,
};
const TOKENIZE_TIMEOUT_OPTION: OptionSpec = OptionSpec {
    key: "tokenize_timeout",
    kind: OptionKind::Duration,
    default: "100ms",
    help: "how long the engine's tokenize call may take before the pick falls back to load",
    check: Some(positive_duration),
};

fn reject_atomic(v: &toml::Value) -> Result<(), String> {
    if v.as_bool() == Some(true) {
        Err(
            "`atomic = true` needs the shared state store, which this version does not \
             provide; remove the option or set it to false (each core then keeps its own cursor)"
                .into(),
        )
    } else {
        Ok(())
    }
}

static STRATEGIES: &[StrategyInfo] = &[
    StrategyInfo {
        name: "round_robin",
        aliases: &[
            "smooth_weighted_round_robin",
            "weighted",
            "weighted_round_robin",
        ],
        summary: "Rotation through the candidates; smooth weighted round-robin when weights differ",
        traits: &[Trait::Weighted, Trait::Stateful, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "atomic",
            kind: OptionKind::Bool,
            default: "false",
            help: "keep one cursor for every gateway replica in the shared state store",
            check: Some(reject_atomic),
        }],
        build: |_, ctx| Box::new(RoundRobin::with_offset(ctx.target_count, ctx.seed)),
    },
    StrategyInfo {
        name: "random",
        aliases: &[],
        summary: "Uniform random choice among the candidates",
        traits: &[Trait::SingleWinner],
        options: &[],
        build: |_, ctx| Box::new(Random::new(ctx.seed)),
    },
    StrategyInfo {
        name: "random_weighted",
        aliases: &[],
        summary: "Random choice with probability proportional to weight",
        traits: &[Trait::Weighted, Trait::SingleWinner],
        options: &[],
        build: |_, ctx| Box::new(RandomWeighted::new(ctx.seed)),
    },
    StrategyInfo {
        name: "power_of_two",
        aliases: &["p2c"],
        summary: "The less loaded of two candidates sampled at random",
        traits: &[Trait::LoadAware, Trait::SingleWinner],
        options: &[],
        build: |_, ctx| Box::new(PowerOfTwo::new(ctx.seed)),
    },
    StrategyInfo {
        name: "least_loaded",
        aliases: &[],
        summary: "The lowest load among the candidates; ties at random",
        traits: &[Trait::LoadAware, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "max_concurrent",
            kind: OptionKind::Integer,
            default: "none",
            help: "cap on every target's load for this route (a full target is skipped; all full: 503 with Retry-After)",
            check: Some(positive_integer),
        }],
        build: |opts, ctx| {
            let max = opts
                .get("max_concurrent")
                .and_then(|v| v.as_integer())
                .map(|v| v as u64);
            Box::new(LeastLoaded::new(ctx.seed, max))
        },
    },
    StrategyInfo {
        name: "failover",
        aliases: &["active_passive"],
        summary: "All traffic to the lowest tier with a candidate; a sub-strategy within it",
        traits: &[Trait::HealthAware, Trait::Stateful, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "within_tier",
            kind: OptionKind::String,
            default: "round_robin",
            help: "the strategy that spreads traffic within a tier (any name or alias but failover)",
            check: Some(sub_strategy),
        }],
        build: |opts, ctx| {
            let name = opts
                .get("within_tier")
                .and_then(|v| v.as_str())
                .unwrap_or("round_robin");
            let info = lookup(name).expect("within_tier validated at load");
            Box::new(Failover::new((info.build)(&toml::Table::new(), ctx)))
        },
    },
    // ---- latency strategies: fastest, adaptive, predicted_latency ----
    StrategyInfo {
        name: "fastest",
        aliases: &[],
        summary: "The lowest time-decayed EWMA of time to first token; unmeasured targets first",
        traits: &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "half_life",
                kind: OptionKind::Duration,
                default: "10s",
                help: "time after which an old TTFT average keeps half its weight against a new sample",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "min_samples",
                kind: OptionKind::Integer,
                default: "3",
                help: "successful samples before a target counts as measured; unmeasured targets are picked first, least loaded among them",
                check: Some(positive_integer),
            },
            OptionSpec {
                key: "tie_tolerance",
                kind: OptionKind::Float,
                default: "0",
                help: "relative margin: targets within best × (1 + tie_tolerance) tie and load decides",
                check: Some(non_negative_number),
            },
        ],
        build: |opts, ctx| Box::new(Fastest::new(FastestOptions::from_table(opts), ctx)),
    },
    StrategyInfo {
        name: "adaptive",
        aliases: &[],
        summary: "Lowest weighted blend of normalised latency, estimated cost and load; global kill switch",
        traits: &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "w_latency",
                kind: OptionKind::Float,
                default: "1.0",
                help: "weight of the normalised TTFT average (unmeasured targets score 0)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_cost",
                kind: OptionKind::Float,
                default: "1.0",
                help: "weight of the normalised estimated request cost (unknown price scores 1, the worst)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_load",
                kind: OptionKind::Float,
                default: "1.0",
                help: "weight of the normalised load",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "half_life",
                kind: OptionKind::Duration,
                default: "10s",
                help: "half-life of the TTFT average",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "default_output_tokens",
                kind: OptionKind::Integer,
                default: "256",
                help: "output tokens assumed for the cost estimate when the request sets no max_tokens",
                check: Some(non_negative_integer),
            },
            OptionSpec {
                key: "fallback_strategy",
                kind: OptionKind::String,
                default: "least_loaded",
                help: "the strategy used while the adaptive kill switch is off (any name or alias but adaptive)",
                check: Some(fallback_strategy),
            },
        ],
        build: |opts, ctx| {
            let name = opts
                .get("fallback_strategy")
                .and_then(|v| v.as_str())
                .unwrap_or("least_loaded");
            let info = lookup(name).expect("fallback_strategy validated at load");
            let fallback = (info.build)(&toml::Table::new(), ctx);
            Box::new(Adaptive::new(
                AdaptiveOptions::from_table(opts),
                fallback,
                ctx,
            ))
        },
    },
    StrategyInfo {
        name: "predicted_latency",
        aliases: &[],
        summary: "Lowest TTFT predicted by a per-target online model of queue depth and prompt size",
        traits: &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "forgetting",
            kind: OptionKind::Float,
            default: "0.995",
            help: "weight an old sample keeps per new one, in (0.9, 1]; 1 never forgets, 0.995 remembers about 200 samples",
            check: Some(forgetting),
        }],
        build: |opts, ctx| {
            Box::new(PredictedLatency::new(
                PredictedLatencyOptions::from_table(opts),
                ctx,
            ))
        },
    },
    // ---- cost and fairness strategies: cheapest, fair_catchup ----
    StrategyInfo {
        name: "cheapest",
        aliases: &[],
        summary: "The lowest estimated cost of this request (catalog prices); ties by load, then at random",
        traits: &[Trait::LoadAware, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "default_output_tokens",
            kind: OptionKind::Integer,
            default: "256",
            help: "expected output tokens of a request without max_tokens / max_completion_tokens (>= 1)",
            check: Some(positive_integer),
        }],
        build: |opts, ctx| {
            let output = opts
                .get("default_output_tokens")
                .and_then(|v| v.as_integer())
                .map_or(DEFAULT_OUTPUT_TOKENS, |v| v.max(1) as u64);
            Box::new(Cheapest::new(ctx.seed, ctx.prices.clone(), output))
        },
    },
    StrategyInfo {
        name: "fair_catchup",
        aliases: &["catch_up"],
        summary: "Weighted shares kept over a sliding window; targets that missed picks (outage) catch up at a bounded rate",
        traits: &[Trait::Weighted, Trait::Stateful, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "window",
                kind: OptionKind::Duration,
                default: "60s",
                help: "how long assignments are remembered (12 time buckets; a pick is forgotten after 11/12 to 12/12 of it)",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "max_catchup_share",
                kind: OptionKind::Float,
                default: "0.5",
                help: "largest fraction of the route's picks per bucket that may repay deficits, in (0, 1]",
                check: Some(unit_share),
            },
            OptionSpec {
                key: "base_strategy",
                kind: OptionKind::String,
                default: "round_robin",
                help: "the strategy that picks when no candidate is owed (any name or alias but fair_catchup)",
                check: Some(base_strategy),
            },
        ],
        build: |opts, ctx| {
            let window = opts
                .get("window")
                .and_then(|v| v.as_str())
                .and_then(|s| humantime::parse_duration(s).ok())
                .unwrap_or(DEFAULT_WINDOW);
            let share = opts
                .get("max_catchup_share")
                .and_then(number)
                .unwrap_or(DEFAULT_MAX_CATCHUP_SHARE);
            let name = opts
                .get("base_strategy")
                .and_then(|v| v.as_str())
                .unwrap_or("round_robin");
            let info = lookup(name).expect("base_strategy validated at load");
            let base = (info.build)(&toml::Table::new(), ctx);
            Box::new(FairCatchup::from_context(base, ctx, window, share))
        },
    },
    // ---- prefix strategies: cache_aware ----
    StrategyInfo {
        name: "cache_aware",
        aliases: &[],
        summary: "The candidate whose prefix tree holds most of the prompt; the least warmed below the threshold; session pins; balance guard",
        traits: &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "threshold",
                kind: OptionKind::Float,
                default: "0.5",
                help: "smallest matched fraction of the prompt that sends it to the best-matching target, in [0, 1]; below it the least warmed target wins",
                check: Some(cache_fraction),
            },
            OptionSpec {
                key: "max_bytes_per_target",
                kind: OptionKind::Integer,
                default: "4194304",
                help: "prompt bytes remembered per target (least recently used evicted first); the index costs about as much memory per target per core",
                check: Some(cache_max_bytes),
            },
            BALANCE_ABS_OPTION,
            BALANCE_REL_OPTION,
            OptionSpec {
                key: "session_ttl",
                kind: OptionKind::Duration,
                default: "10m",
                help: "how long a request with x-session-id keeps going to the target that last served its session",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "max_sessions",
                kind: OptionKind::Integer,
                default: "100000",
                help: "sessions remembered per core (least recently used forgotten first)",
                check: Some(positive_integer),
            },
        ],
        build: |opts, ctx| {
            Box::new(CacheAware::new(
                CacheAwareOptions::from_table(opts),
                ctx.target_count,
                ctx.seed,
            ))
        },
    },
    StrategyInfo {
        name: "precise_cache_aware",
        aliases: &[],
        summary: "The candidate holding the longest run of the prompt's leading KV blocks, from the engines' KV-cache events; load below min_blocks",
        traits: &[Trait::LoadAware, Trait::AsyncInput, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "min_blocks",
                kind: OptionKind::Integer,
                default: "0",
                help: "the best-holding target wins only when it holds more than this many leading blocks; otherwise load decides",
                check: Some(non_negative_integer),
            },
            BALANCE_ABS_OPTION,
            BALANCE_REL_OPTION,
            TOKENIZER_OPTION,
            TOKENIZER_CONFIG_OPTION,
            TOKENIZE_TIMEOUT_OPTION,
        ],
        build: |opts, ctx| {
            let min_blocks = opts
                .get("min_blocks")
                .and_then(toml::Value::as_integer)
                .unwrap_or(0)
                .clamp(0, i64::from(u32::MAX)) as u32;
            let abs = opts
                .get("balance_abs_threshold")
                .and_then(toml::Value::as_integer)
                .unwrap_or(32)
                .max(0) as u64;
            let rel = opts
                .get("balance_rel_threshold")
                .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
                .unwrap_or(1.5);
            Box::new(
                PreciseCacheAware::new(ctx.engine.clone(), min_blocks, ctx.seed)
                    .with_balance(abs, rel),
            )
        },
    },
    StrategyInfo {
        name: "lmcache_aware",
        aliases: &[],
        summary: "The candidate whose LMCache store holds the most of the prompt (the LMCache controller's /lookup), with free KV-cache room as a second term; load below min_tokens or when the controller does not answer",
        traits: &[Trait::LoadAware, Trait::AsyncInput, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "controller",
                kind: OptionKind::String,
                default: "(required)",
                help: "the LMCache controller's API server, http://host:port (python -m lmcache.v1.api_server --port 9000)",
                check: None,
            },
            OptionSpec {
                key: "lookup_timeout",
                kind: OptionKind::Duration,
                default: "50ms",
                help: "how long a lookup may take before the pick falls back to load (fallback lmcache_unreachable)",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "lookup_window",
                kind: OptionKind::Duration,
                default: "2s",
                help: "a lookup's answer is reused for prompts with the same whole chunks for this long (per core); \"0s\" asks every time",
                check: None,
            },
            OptionSpec {
                key: "retry_after",
                kind: OptionKind::Duration,
                default: "1s",
                help: "after a failed lookup, the controller is not asked again (picks fall back at once) for this long",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "chunk_size",
                kind: OptionKind::Integer,
                default: "256",
                help: "the controller's chunk size in tokens (LMCache's chunk_size); prompts that agree on every whole chunk share a memoised answer",
                check: Some(positive_integer),
            },
            OptionSpec {
                key: "min_tokens",
                kind: OptionKind::Integer,
                default: "0",
                help: "the scores decide only when some candidate holds more than this many prompt tokens; otherwise load decides",
                check: Some(non_negative_integer),
            },
            OptionSpec {
                key: "w_prefix",
                kind: OptionKind::Float,
                default: "1.0",
                help: "weight of the held share of the prompt (matched tokens / prompt tokens)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_free",
                kind: OptionKind::Float,
                default: "0.25",
                help: "weight of the free KV-cache share (1 - vllm:kv_cache_usage_perc from the metrics scrape)",
                check: Some(non_negative_number),
            },
            BALANCE_ABS_OPTION,
            BALANCE_REL_OPTION,
            TOKENIZER_OPTION,
            TOKENIZER_CONFIG_OPTION,
            TOKENIZE_TIMEOUT_OPTION,
        ],
        build: |opts, ctx| {
            Box::new(LmcacheAware::new(
                LmcacheAwareOptions::from_table(opts),
                ctx.seed,
            ))
        },
    },
    StrategyInfo {
        name: "pipeline",
        aliases: &[],
        summary: "Filter (max_queue), then the highest weighted sum of normalised scorers (weight, load, prefix, latency, cost, queue, kv_cache, lora); ties at random; sticky sessions",
        traits: &[
            Trait::Weighted,
            Trait::LoadAware,
            Trait::Stateful,
            Trait::SingleWinner,
        ],
        options: &[
            OptionSpec {
                key: "w_weight",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the static-weight scorer (weight / largest weight)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_load",
                kind: OptionKind::Float,
                default: "1",
                help: "weight of the load scorer (1 - load / largest load)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_prefix",
                kind: OptionKind::Float,
                default: "1",
                help: "weight of the prefix scorer (leading prompt bytes already sent to the target / prompt length)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_latency",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the latency scorer (smallest TTFT average / own; unmeasured scores 1)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_cost",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the cost scorer (cheapest estimate / own; unknown price scores 0)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_queue",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the engine-queue scorer (1 - queue_depth / largest queue_depth)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_kv_cache",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the KV-cache scorer (1 - KV-cache use; unknown scores 0.5). All weights 0: uniform random",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "w_lora",
                kind: OptionKind::Float,
                default: "0",
                help: "weight of the LoRA scorer (lora_aware's residency score of the requested adapter: running 1, free slot 0.8, waiting 0.6, registered 0.4; 1 for a base model)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "max_queue",
                kind: OptionKind::Integer,
                default: "none",
                help: "drop candidates whose engine queue is longer (unless that drops them all)",
                check: Some(non_negative_integer),
            },
            OptionSpec {
                key: "session_ttl",
                kind: OptionKind::Duration,
                default: "10m",
                help: "an x-session-id request goes back to the target that last served it within this time; \"0s\" turns affinity off",
                check: Some(pipeline_session_ttl),
            },
            OptionSpec {
                key: "max_sessions",
                kind: OptionKind::Integer,
                default: "100000",
                help: "sessions remembered per core (least recently used forgotten first)",
                check: Some(positive_integer),
            },
            OptionSpec {
                key: "max_bytes_per_target",
                kind: OptionKind::Integer,
                default: "16777216",
                help: "prompt bytes the prefix index keeps per target (least recently used evicted)",
                check: Some(positive_integer),
            },
            OptionSpec {
                key: "half_life",
                kind: OptionKind::Duration,
                default: "10s",
                help: "half-life of the TTFT average of the latency scorer",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "default_output_tokens",
                kind: OptionKind::Integer,
                default: "256",
                help: "output tokens the cost scorer assumes when the request sets no max_tokens",
                check: Some(positive_integer),
            },
        ],
        build: |opts, ctx| Box::new(Pipeline::new(PipelineOptions::from_table(opts), ctx)),
    },
    // ---- engine-state strategies: lora_aware ----
    StrategyInfo {
        name: "lora_aware",
        aliases: &[],
        summary: "For a LoRA adapter: where it runs, else a free adapter slot, else where it waits (llm-d's ladder, plus this route's recent routing); base models and missing signals by load",
        traits: &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner],
        options: &[
            OptionSpec {
                key: "window",
                kind: OptionKind::Duration,
                default: "10s",
                help: "a target this route sent an adapter to within this time counts as running it (bridges the gap until the next scrape)",
                check: Some(positive_duration),
            },
            OptionSpec {
                key: "score_running",
                kind: OptionKind::Float,
                default: "1.0",
                help: "score of a target where the adapter has running requests, in [0, 1]",
                check: Some(cache_fraction),
            },
            OptionSpec {
                key: "score_free_slot",
                kind: OptionKind::Float,
                default: "0.8",
                help: "score of a target with a free adapter slot (fewer running adapters than max_lora) that lists the adapter, in [0, 1]",
                check: Some(cache_fraction),
            },
            OptionSpec {
                key: "score_waiting",
                kind: OptionKind::Float,
                default: "0.6",
                help: "score of a target where requests for the adapter wait, in [0, 1]",
                check: Some(cache_fraction),
            },
            OptionSpec {
                key: "score_loaded",
                kind: OptionKind::Float,
                default: "0.4",
                help: "score of a target that lists the adapter but has no free slot, in [0, 1]",
                check: Some(cache_fraction),
            },
            OptionSpec {
                key: "w_load",
                kind: OptionKind::Float,
                default: "0",
                help: "subtract w_load x load / largest load from each score; 0 keeps the ladder strict (load only breaks ties)",
                check: Some(non_negative_number),
            },
            OptionSpec {
                key: "max_adapters",
                kind: OptionKind::Integer,
                default: "4096",
                help: "adapters whose recent routing each core remembers (expired, then least recently used, forgotten first)",
                check: Some(positive_integer),
            },
            OptionSpec {
                key: "adapters",
                kind: OptionKind::String,
                default: "none",
                help: "comma-separated adapter names treated as adapters even before a target lists them, e.g. \"sql-lora,chat-lora\"",
                check: Some(lora_adapter_names),
            },
            OptionSpec {
                key: "load_from",
                kind: OptionKind::String,
                default: "off",
                help: "a directory on the engines holding one subdirectory per adapter: a request for one of `adapters` whose chosen target does not list it loads it there first (POST /v1/load_lora_adapter with lora_path = load_from/<name>)",
                check: None,
            },
            OptionSpec {
                key: "load_timeout",
                kind: OptionKind::Duration,
                default: "30s",
                help: "how long an adapter load may take; after it the request is forwarded anyway",
                check: Some(positive_duration),
            },
        ],
        build: |opts, ctx| {
            Box::new(LoraAware::new(
                LoraAwareOptions::from_table(opts),
                ctx.route_targets.len().max(ctx.target_count),
                ctx.seed,
            ))
        },
    },
    StrategyInfo {
        name: "consistent_hash",
        aliases: &[],
        summary: "Hash ring keyed by the session (x-session-id, else the conversation); a target's keys move only while it is not a candidate",
        traits: &[Trait::Weighted, Trait::SingleWinner],
        options: &[OptionSpec {
            key: "points",
            kind: OptionKind::Integer,
            default: "100",
            help: "ring points per target at weight 1 (scaled by weight, rounded, at least 1), 1 to 10000",
            check: Some(hash_points),
        }],
        build: |opts, ctx| {
            let points = opts
                .get("points")
                .and_then(|v| v.as_integer())
                .map_or(DEFAULT_POINTS, |v| v.clamp(1, MAX_POINTS) as u32);
            Box::new(ConsistentHash::from_context(ctx, points))
        },
    },
];

/// `threshold` of cache_aware: a fraction in [0, 1].
fn cache_fraction(v: &toml::Value) -> Result<(), String> {
    match number(v) {
        Some(x) if (0.0..=1.0).contains(&x) => Ok(()),
        _ => Err("must be a fraction from 0 to 1, such as 0.5".into()),
    }
}

/// `max_bytes_per_target` of cache_aware: at least one 64-byte chunk.
fn cache_max_bytes(v: &toml::Value) -> Result<(), String> {
    match v.as_integer() {
        Some(n) if n >= 64 => Ok(()),
        _ => Err("must be an integer of at least 64 (bytes), such as 4194304".into()),
    }
}

/// `balance_rel_threshold` of cache_aware: a ratio of at least 1.
fn cache_ratio(v: &toml::Value) -> Result<(), String> {
    match number(v) {
        Some(x) if x >= 1.0 => Ok(()),
        _ => Err("must be a number >= 1, such as 1.5".into()),
    }
}

/// `adapters` of lora_aware: at least one name in the comma-separated list.
fn lora_adapter_names(v: &toml::Value) -> Result<(), String> {
    match v.as_str().map(super::lora_aware::adapter_list) {
        Some(names) if !names.is_empty() => Ok(()),
        _ => Err("must name at least one adapter, such as \"sql-lora,chat-lora\"".into()),
    }
}

/// `within_tier` names a registered strategy other than failover itself.
fn sub_strategy(v: &toml::Value) -> Result<(), String> {
    other_strategy(v, "failover", "within_tier strategy")
}

fn positive_integer(v: &toml::Value) -> Result<(), String> {
    match v.as_integer() {
        Some(n) if n > 0 => Ok(()),
        _ => Err("must be a positive integer".into()),
    }
}

/// Every registered strategy.
pub fn all() -> &'static [StrategyInfo] {
    STRATEGIES
}

/// Finds a strategy by canonical name or alias.
pub fn lookup(name: &str) -> Option<&'static StrategyInfo> {
    STRATEGIES
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name))
}

fn valid_names() -> String {
    let mut names: Vec<&str> = Vec::new();
    for s in STRATEGIES {
        names.push(s.name);
        names.extend_from_slice(s.aliases);
    }
    names.join(", ")
}

fn kind_matches(kind: OptionKind, v: &toml::Value) -> bool {
    match kind {
        OptionKind::Bool => v.is_bool(),
        OptionKind::Integer => v.is_integer(),
        OptionKind::Float => v.is_float() || v.is_integer(),
        OptionKind::Duration => v
            .as_str()
            .map(|s| humantime::parse_duration(s).is_ok())
            .unwrap_or(false),
        OptionKind::String => v.is_str(),
    }
}

fn kind_label(kind: OptionKind) -> &'static str {
    match kind {
        OptionKind::Bool => "a boolean",
        OptionKind::Integer => "an integer",
        OptionKind::Float => "a number",
        OptionKind::Duration => "a duration such as \"500ms\" or \"10s\"",
        OptionKind::String => "a string",
    }
}

/// Resolves a strategy name or alias and checks its options. `Err` lists (option key,
/// message) pairs, or `("name", …)` for an unknown name.
pub fn validate_spec(
    name: &str,
    options: &toml::Table,
) -> Result<&'static str, Vec<(String, String)>> {
    let Some(info) = lookup(name) else {
        return Err(vec![(
            "name".to_string(),
            format!("unknown strategy `{name}`; valid names: {}", valid_names()),
        )]);
    };
    let mut errors = Vec::new();
    for (key, value) in options {
        match info.options.iter().find(|o| o.key == key) {
            None => {
                let valid: Vec<&str> = info.options.iter().map(|o| o.key).collect();
                errors.push((
                    key.clone(),
                    if valid.is_empty() {
                        format!("strategy `{}` takes no options; remove `{key}`", info.name)
                    } else {
                        format!(
                            "unknown option `{key}` for strategy `{}`; valid options: {}",
                            info.name,
                            valid.join(", ")
                        )
                    },
                ));
            }
            Some(spec) => {
                if !kind_matches(spec.kind, value) {
                    errors.push((key.clone(), format!("must be {}", kind_label(spec.kind))));
                } else if let Some(check) = spec.check {
                    if let Err(m) = check(value) {
                        errors.push((key.clone(), m));
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        errors = combined_checks(info.name, options);
    }
    if errors.is_empty() {
        Ok(info.name)
    } else {
        Err(errors)
    }
}

/// Builds one per-core instance of a validated strategy.
pub fn build(spec: &StrategySpec, ctx: &BuildContext) -> Box<dyn Strategy> {
    let info = lookup(spec.name).expect("strategy validated at configuration load");
    (info.build)(&spec.options, ctx)
}

/// `session_ttl` of pipeline: any duration, zero included (affinity off).
fn pipeline_session_ttl(v: &toml::Value) -> Result<(), String> {
    match v.as_str().map(humantime::parse_duration) {
        Some(Ok(_)) => Ok(()),
        _ => {
            Err("must be a duration such as \"10m\", or \"0s\" to turn session affinity off".into())
        }
    }
}

/// `points` of consistent_hash: 1 to [`MAX_POINTS`].
fn hash_points(v: &toml::Value) -> Result<(), String> {
    match v.as_integer() {
        Some(n) if (1..=MAX_POINTS).contains(&n) => Ok(()),
        _ => Err(format!(
            "must be an integer from 1 to {MAX_POINTS}, such as 100"
        )),
    }
}

/// A finite number written as a float or an integer.
fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Float(f) if f.is_finite() => Some(*f),
        toml::Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

/// `max_catchup_share` is a fraction in (0, 1].
fn unit_share(v: &toml::Value) -> Result<(), String> {
    match number(v) {
        Some(x) if x > 0.0 && x <= 1.0 => Ok(()),
        _ => Err("must be a fraction greater than 0 and at most 1, such as 0.5".into()),
    }
}

fn positive_duration(v: &toml::Value) -> Result<(), String> {
    match v.as_str().map(humantime::parse_duration) {
        Some(Ok(d)) if !d.is_zero() => Ok(()),
        _ => Err("must be a duration longer than zero, such as \"10s\"".into()),
    }
}

fn non_negative_number(v: &toml::Value) -> Result<(), String> {
    match number(v) {
        Some(f) if f >= 0.0 => Ok(()),
        _ => Err("must be a finite number >= 0".into()),
    }
}

fn non_negative_integer(v: &toml::Value) -> Result<(), String> {
    match v.as_integer() {
        Some(n) if n >= 0 => Ok(()),
        _ => Err("must be an integer >= 0".into()),
    }
}

fn forgetting(v: &toml::Value) -> Result<(), String> {
    match number(v) {
        Some(f) if f > 0.9 && f <= 1.0 => Ok(()),
        _ => Err("must be a number in (0.9, 1], e.g. 0.995".into()),
    }
}

/// A strategy option naming another registered strategy, not `own` itself.
fn other_strategy(v: &toml::Value, own: &str, option: &str) -> Result<(), String> {
    let name = v.as_str().unwrap_or("");
    match lookup(name) {
        Some(info) if info.name == own => Err(format!("{own} cannot be its own {option}")),
        Some(_) => Ok(()),
        None => Err(format!(
            "unknown strategy `{name}`; valid names: {}",
            valid_names()
        )),
    }
}

/// `base_strategy` of fair_catchup.
fn base_strategy(v: &toml::Value) -> Result<(), String> {
    other_strategy(v, "fair_catchup", "base_strategy")
}

/// `fallback_strategy` of adaptive.
fn fallback_strategy(v: &toml::Value) -> Result<(), String> {
    other_strategy(v, "adaptive", "fallback_strategy")
}

/// Checks across several options of one strategy, after each option passed on its own.
fn combined_checks(name: &str, options: &toml::Table) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    if name == "adaptive" {
        let weight = |k: &str| options.get(k).and_then(number).unwrap_or(1.0);
        if ["w_latency", "w_cost", "w_load"]
            .iter()
            .all(|k| weight(k) == 0.0)
        {
            errors.push((
                "w_latency".to_string(),
                "every weight is 0, so adaptive would score all targets alike; give at least \
                 one of w_latency, w_cost, w_load a value above 0"
                    .to_string(),
            ));
        }
    }
    if name == "lora_aware"
        && options
            .get("load_from")
            .and_then(toml::Value::as_str)
            .is_some_and(|s| !s.is_empty())
        && !options.contains_key("adapters")
    {
        errors.push((
            "load_from".to_string(),
            "load_from loads only the adapters named in `adapters`, and there are none; \
             add adapters = \"<name>,<name>\" (the subdirectories of load_from)"
                .to_string(),
        ));
    }
    if name == "lmcache_aware" {
        let weight = |k: &str, d: f64| options.get(k).and_then(number).unwrap_or(d);
        if weight("w_prefix", 1.0) == 0.0 && weight("w_free", 0.25) == 0.0 {
            errors.push((
                "w_prefix".to_string(),
                "w_prefix and w_free are both 0, so lmcache_aware would score all targets \
                 alike; give w_prefix a value above 0"
                    .to_string(),
            ));
        }
    }
    if name == "pipeline" {
        use super::pipeline::Scorer;
        let all_zero = Scorer::ALL.iter().all(|s| {
            options
                .get(s.option())
                .and_then(number)
                .unwrap_or(s.default_weight())
                == 0.0
        });
        if all_zero {
            errors.push((
                "w_load".to_string(),
                "every scorer weight is 0, so pipeline would pick at random; give at least one \
                 of w_weight, w_load, w_prefix, w_latency, w_cost, w_queue, w_kv_cache, w_lora a value \
                 above 0 (or use strategy = \"random\")"
                    .to_string(),
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_needs_one_weight_above_zero() {
        let t: toml::Table = toml::from_str("w_latency = 0\nw_cost = 0.0\nw_load = 0").unwrap();
        let errs = validate_spec("adaptive", &t).unwrap_err();
        assert_eq!(errs[0].0, "w_latency");
        assert!(errs[0].1.contains("at least"), "{errs:?}");
        let t: toml::Table = toml::from_str("w_latency = 0\nw_cost = 0").unwrap();
        assert_eq!(validate_spec("adaptive", &t), Ok("adaptive"));
    }

    #[test]
    fn aliases_resolve() {
        for (alias, canonical) in [
            ("weighted", "round_robin"),
            ("weighted_round_robin", "round_robin"),
            ("smooth_weighted_round_robin", "round_robin"),
            ("round_robin", "round_robin"),
            ("random", "random"),
            ("random_weighted", "random_weighted"),
            ("p2c", "power_of_two"),
            ("power_of_two", "power_of_two"),
            ("least_loaded", "least_loaded"),
            ("active_passive", "failover"),
        ] {
            assert_eq!(validate_spec(alias, &toml::Table::new()), Ok(canonical));
        }
    }

    #[test]
    fn failover_sub_strategy_is_checked() {
        let mut t = toml::Table::new();
        t.insert("within_tier".into(), toml::Value::String("p2c".into()));
        assert_eq!(validate_spec("failover", &t), Ok("failover"));
        t.insert(
            "within_tier".into(),
            toml::Value::String("active_passive".into()),
        );
        assert!(validate_spec("failover", &t).is_err());
        t.insert("within_tier".into(), toml::Value::String("nope".into()));
        assert!(validate_spec("failover", &t).unwrap_err()[0]
            .1
            .contains("valid names"));
    }

    #[test]
    fn unknown_name_lists_valid_names() {
        let err = validate_spec("fastestt", &toml::Table::new()).unwrap_err();
        assert_eq!(err[0].0, "name");
        assert!(err[0].1.contains("round_robin") && err[0].1.contains("random"));
    }

    #[test]
    fn options_are_checked() {
        let mut t = toml::Table::new();
        t.insert("atomic".into(), toml::Value::Boolean(true));
        t.insert("bogus".into(), toml::Value::Integer(1));
        let err = validate_spec("round_robin", &t).unwrap_err();
        assert_eq!(err.len(), 2);
        let mut t = toml::Table::new();
        t.insert("atomic".into(), toml::Value::String("no".into()));
        assert!(validate_spec("round_robin", &t).unwrap_err()[0]
            .1
            .contains("boolean"));
        let mut t = toml::Table::new();
        t.insert("atomic".into(), toml::Value::Boolean(false));
        assert_eq!(validate_spec("round_robin", &t), Ok("round_robin"));
        assert!(validate_spec("random", &t).is_err());
    }
}
