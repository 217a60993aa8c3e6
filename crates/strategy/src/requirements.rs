//! What a route's strategy needs from the gateway beyond the candidates: prices for every
//! target, the prompt's token ids, a cache-controller lookup, LoRA adapters loaded on
//! demand. The configuration checks and prepares them (a price for every model, the local
//! tokenizer file loaded, the controller's address resolved); the gateway's request path
//! supplies them. Wrapper strategies pass on what their inner strategies need.
//!
//! Owns these typed settings and their defaults; consumers read them from here, never from
//! a strategy's raw options or its name.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the gateway must supply for a route's strategy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requirements {
    /// The strategy ranks by price, so every target of the route needs a known price for
    /// every model it serves there.
    pub prices: Option<PriceUse>,
    /// The prompt's token ids, and where they come from.
    pub token_ids: Option<TokenizerOptions>,
    /// A lookup at an LMCache controller before each pick.
    pub cache_lookup: Option<CacheLookupOptions>,
    /// LoRA adapters loaded on the chosen target before forwarding.
    pub adapter_loading: Option<AdapterLoading>,
    /// What the strategy keeps in, or reads through, the shared state store (`[state]`).
    pub store: Option<StoreUse>,
}

impl Requirements {
    /// What a wrapper needs for the inner strategy it names in `option`: the inner one's
    /// requirements, with the reason for prices said through the wrapper.
    pub fn through(mut inner: Requirements, wrapper: &str, option: &str) -> Requirements {
        if let Some(p) = &mut inner.prices {
            p.by = format!("`{wrapper}` with {option} {}", p.by);
            p.instead = p.instead.take().map(|i| format!("{i} in its {option}"));
        }
        if let Some(s) = &mut inner.store {
            for by in &mut s.by {
                *by = format!("`{wrapper}` with {option} {by}");
            }
        }
        inner
    }

    /// Both sets of requirements (the first one's price reason wins).
    pub fn and(self, other: Requirements) -> Requirements {
        Requirements {
            prices: self.prices.or(other.prices),
            token_ids: self.token_ids.or(other.token_ids),
            cache_lookup: self.cache_lookup.or(other.cache_lookup),
            adapter_loading: self.adapter_loading.or(other.adapter_loading),
            store: match (self.store, other.store) {
                (Some(a), Some(b)) => Some(a.and(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// What a route's strategy keeps in, or reads through, the shared state store. The gateway
/// asks the store only for what some route declares here; `rolter check` refuses a
/// configuration that declares anything without a `[state]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreUse {
    /// One rotation for every replica (`round_robin` with `atomic = true`): the positions
    /// taken per store call (`lease`, 1 for exact interleaving).
    pub rotation: Option<u32>,
    /// The books of `fair_catchup` (`durable = true`) over this window: this replica's
    /// assignments are added to the store's window, the other replicas' are read back.
    pub ledger: Option<Duration>,
    /// Session pins are published to the other replicas and theirs applied here.
    pub sessions: bool,
    /// Prefix insertions are published to the other replicas and theirs applied here.
    pub prefixes: bool,
    /// Candidate loads include the other replicas' requests in flight.
    pub fleet_load: bool,
    /// What asks for the store, one phrase per use, for the error that names it:
    /// "`round_robin` with atomic = true".
    pub by: Vec<String>,
}

impl StoreUse {
    /// A use of the store asked for by `by`.
    pub fn by(by: impl Into<String>) -> StoreUse {
        StoreUse {
            by: vec![by.into()],
            ..StoreUse::default()
        }
    }

    /// What `strategy`'s `share_sessions` / `share_prefixes` options ask for, if anything.
    pub fn sharing(strategy: &str, sessions: bool, prefixes: bool) -> Option<StoreUse> {
        let by = match (sessions, prefixes) {
            (false, false) => return None,
            (true, false) => format!("`{strategy}` with share_sessions = true"),
            (false, true) => format!("`{strategy}` with share_prefixes = true"),
            (true, true) => {
                format!("`{strategy}` with share_sessions = true and share_prefixes = true")
            }
        };
        Some(StoreUse {
            sessions,
            prefixes,
            ..StoreUse::by(by)
        })
    }

    /// What a load-aware strategy's `fleet_load` option asks for, if anything.
    pub fn fleet_load(strategy: &str, on: bool) -> Option<StoreUse> {
        on.then(|| StoreUse {
            fleet_load: true,
            ..StoreUse::by(format!("`{strategy}` with fleet_load = true"))
        })
    }

    /// Both uses.
    pub fn and(mut self, other: StoreUse) -> StoreUse {
        self.rotation = self.rotation.or(other.rotation);
        self.ledger = self.ledger.or(other.ledger);
        self.sessions |= other.sessions;
        self.prefixes |= other.prefixes;
        self.fleet_load |= other.fleet_load;
        self.by.extend(other.by);
        self
    }

    /// Whether the route shares items (pins, prefixes, assignments) with the other replicas.
    pub fn shares_items(&self) -> bool {
        self.sessions || self.prefixes || self.ledger.is_some()
    }
}

/// Why a strategy ranks by price, for the configuration error that names a target without
/// one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceUse {
    /// What ranks, after "strategy": "`cheapest`", "`adaptive` with w_cost = 1 (the
    /// default)".
    pub by: String,
    /// Another way out than adding prices ("set w_cost = 0"), when there is one.
    pub instead: Option<String>,
}

/// Where a route's token ids come from: `tokenizer`, `tokenizer_config` and
/// `tokenize_timeout` of the strategies that read token ids (flattened into their options).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenizerOptions {
    /// `"engine"` (the target's `POST /tokenize`) or the path of a Hugging Face
    /// `tokenizer.json`.
    pub tokenizer: String,
    /// With a local tokenizer: the model's `tokenizer_config.json`; unset, the one beside
    /// `tokenizer.json`.
    pub tokenizer_config: Option<String>,
    /// How long tokenizing may take before the pick falls back to load.
    #[serde(with = "crate::values::duration")]
    pub tokenize_timeout: Duration,
}

/// The value of `tokenizer` that asks the engines.
pub const ENGINE_TOKENIZER: &str = "engine";

impl Default for TokenizerOptions {
    fn default() -> Self {
        TokenizerOptions {
            tokenizer: ENGINE_TOKENIZER.to_string(),
            tokenizer_config: None,
            tokenize_timeout: Duration::from_millis(100),
        }
    }
}

impl TokenizerOptions {
    /// The help lines of the three options.
    pub const HELP: [(&'static str, &'static str); 3] = [
        (
            "tokenizer",
            "where token ids come from: \"engine\" (the target's POST /tokenize) or the path of a Hugging Face tokenizer.json",
        ),
        (
            "tokenizer_config",
            "with a local tokenizer: the model's tokenizer_config.json (chat template, special tokens); default: the one beside tokenizer.json",
        ),
        (
            "tokenize_timeout",
            "how long the engine's tokenize call may take before the pick falls back to load",
        ),
    ];

    /// The path of a local tokenizer file, when one is named.
    pub fn local_path(&self) -> Option<&str> {
        (self.tokenizer != ENGINE_TOKENIZER).then_some(self.tokenizer.as_str())
    }

    pub(crate) fn check(&self, errors: &mut Vec<crate::values::OptionError>) {
        crate::values::positive_duration(errors, "tokenize_timeout", self.tokenize_timeout);
        crate::values::require(
            errors,
            !self.tokenizer.is_empty(),
            "tokenizer",
            "must be \"engine\" or the path of a tokenizer.json",
        );
    }
}

/// An LMCache controller lookup before each pick (`lmcache_aware`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLookupOptions {
    /// The controller's API server as written (`http://host:port`).
    pub controller: String,
    /// How long a lookup may take before the pick falls back to load.
    pub timeout: Duration,
    /// An answer is reused for prompts with the same whole chunks for this long (per core).
    pub window: Duration,
    /// After a failed lookup, the controller is not asked again for this long.
    pub retry_after: Duration,
    /// The controller's chunk size in tokens.
    pub chunk_tokens: usize,
}

/// Loading a missing LoRA adapter on the chosen target before forwarding (`lora_aware`
/// with `load_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterLoading {
    /// The directory on the engines holding one subdirectory per adapter, without a
    /// trailing slash.
    pub load_from: String,
    /// The adapters that may be loaded.
    pub adapters: Vec<String>,
    /// How long a load may take; after it the request is forwarded anyway.
    pub timeout: Duration,
    /// A load counts as registered on its target for this long (until the next model-list
    /// poll shows it).
    pub window: Duration,
}
