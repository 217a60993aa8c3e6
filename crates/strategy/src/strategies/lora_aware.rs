//! `lora_aware`: send a request for a LoRA adapter where the adapter is already resident.
//!
//! The gateway fills [`Candidate::lora`] with what the control thread last published about
//! the request's `model` on each target ([`Residency`]): from `vllm:lora_requests_info` (the
//! adapters running and waiting there, and `max_lora`) and from `GET /v1/models` (the
//! adapters registered there). A pick, in order:
//!
//! 1. **No signal.** When no candidate has a fresh LoRA signal (scraping off or stale), the
//!    least loaded candidate wins (ties at random), marked as fallback `no_lora_signal`.
//! 2. **Base model.** A model that is not a known adapter (in no target's lists, not in the
//!    `adapters` option, not routed as one within `window`) goes to the least loaded
//!    candidate (ties at random). This is the normal path, not a fallback.
//! 3. **Residency score.** Each candidate scores, following llm-d's lora-affinity scorer:
//!    running `score_running` (1.0) > free adapter slot `score_free_slot` (0.8, only where
//!    the adapter is registered or registration is unknown) > waiting `score_waiting`
//!    (0.6) > registered without a free slot `score_loaded` (0.4) > nothing (0). A
//!    candidate this route sent the adapter to within `window` counts as running there
//!    (unless its model list shows the adapter is not there), so a burst for a newly used
//!    adapter does not scatter before the next scrape shows where it runs. With `w_load` above 0, `w_load × load / largest load` is subtracted. The
//!    highest total wins; ties by load, then at random.
//!
//! `routed` remembers (adapter, target) for `window` and shares it with the other cores as
//! a (key, target) entry of the kind session pins use (this strategy pins no sessions, so
//! the entry is unambiguous within its route); `apply_shared` applies the other cores'.
//! At most `max_adapters` adapters are remembered per core, expired ones dropped first.
//!
//! Owns its generator, the routing memory and a scratch vector sized to the route at
//! build. It must not block, lock, log, do I/O or allocate per pick once warm (the memory
//! allocates only while it grows to its bound); time comes in as an argument.

use std::time::{Duration, Instant};

use rolter_core::{adapter_key, Level, Residency};
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::requirements::AdapterLoading;
use crate::requirements::Requirements;
use crate::shared::choose::{choose_least_loaded, choose_least_loaded_among};
use crate::shared::key_map::KeyMap;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Needs, Pick, PickRequest, ShareSink, Shared, TargetId};

/// Fallback reason when no candidate has a fresh LoRA signal.
pub const NO_LORA_SIGNAL: &str = "no_lora_signal";

/// Scores closer than this tie.
const SCORE_EPSILON: f64 = 1e-9;

/// Targets remembered per adapter in the routing memory (the most recent ones).
const RECENT_TARGETS: usize = 4;

/// The value of each rung, in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LadderScores {
    pub running: f64,
    pub free_slot: f64,
    pub waiting: f64,
    pub loaded: f64,
}

impl LadderScores {
    /// llm-d's lora-affinity values (running 1.0, free slot 0.8, waiting 0.6), with 0.4
    /// for an adapter registered where no slot is free.
    pub const DEFAULT: LadderScores = LadderScores {
        running: 1.0,
        free_slot: 0.8,
        waiting: 0.6,
        loaded: 0.4,
    };

    /// The value of `level`; unknown and none score 0.
    pub fn of(&self, level: Level) -> f64 {
        match level {
            Level::Running => self.running,
            Level::FreeSlot => self.free_slot,
            Level::Waiting => self.waiting,
            Level::Loaded => self.loaded,
            Level::None | Level::Unknown => 0.0,
        }
    }
}

impl Default for LadderScores {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The options of `lora_aware`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// A target this route sent an adapter to within this time counts as running it.
    #[serde(with = "crate::values::duration")]
    pub window: Duration,
    pub score_running: f64,
    pub score_free_slot: f64,
    pub score_waiting: f64,
    pub score_loaded: f64,
    pub w_load: f64,
    /// Adapters whose recent routing each core remembers.
    pub max_adapters: usize,
    /// Comma-separated adapter names treated as adapters even before a target lists them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapters: Option<String>,
    /// The engines' directory of adapters to load on demand; unset, nothing is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_from: Option<String>,
    #[serde(with = "crate::values::duration")]
    pub load_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        let s = LadderScores::DEFAULT;
        Options {
            window: Duration::from_secs(10),
            score_running: s.running,
            score_free_slot: s.free_slot,
            score_waiting: s.waiting,
            score_loaded: s.loaded,
            w_load: 0.0,
            max_adapters: 4096,
            adapters: None,
            load_from: None,
            load_timeout: Duration::from_secs(30),
        }
    }
}

impl Options {
    /// The residency ladder's values.
    pub fn scores(&self) -> LadderScores {
        LadderScores {
            running: self.score_running,
            free_slot: self.score_free_slot,
            waiting: self.score_waiting,
            loaded: self.score_loaded,
        }
    }

    /// The names in `adapters`.
    pub fn adapter_names(&self) -> Vec<String> {
        self.adapters
            .as_deref()
            .map(adapter_list)
            .unwrap_or_default()
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "lora_aware";
    const SUMMARY: &'static str = "For a LoRA adapter: where it runs, else a free adapter slot, else where it waits (llm-d's ladder, plus this route's recent routing); base models and missing signals by load";
    const TRAITS: &'static [Trait] = &[Trait::LoadAware, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "window",
            "a target this route sent an adapter to within this time counts as running it (bridges the gap until the next scrape)",
        ),
        (
            "score_running",
            "score of a target where the adapter has running requests, in [0, 1]",
        ),
        (
            "score_free_slot",
            "score of a target with a free adapter slot (fewer running adapters than max_lora) that lists the adapter, in [0, 1]",
        ),
        (
            "score_waiting",
            "score of a target where requests for the adapter wait, in [0, 1]",
        ),
        (
            "score_loaded",
            "score of a target that lists the adapter but has no free slot, in [0, 1]",
        ),
        (
            "w_load",
            "subtract w_load x load / largest load from each score; 0 keeps the ladder strict (load only breaks ties)",
        ),
        (
            "max_adapters",
            "adapters whose recent routing each core remembers (expired, then least recently used, forgotten first)",
        ),
        (
            "adapters",
            "comma-separated adapter names treated as adapters even before a target lists them, e.g. \"sql-lora,chat-lora\"",
        ),
        (
            "load_from",
            "a directory on the engines holding one subdirectory per adapter: a request for one of `adapters` whose chosen target does not list it loads it there first (POST /v1/load_lora_adapter with lora_path = load_from/<name>)",
        ),
        (
            "load_timeout",
            "how long an adapter load may take; after it the request is forwarded anyway",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::positive_duration(errors, "window", self.window);
        for (key, v) in [
            ("score_running", self.score_running),
            ("score_free_slot", self.score_free_slot),
            ("score_waiting", self.score_waiting),
            ("score_loaded", self.score_loaded),
        ] {
            crate::values::fraction(errors, key, v);
        }
        crate::values::non_negative(errors, "w_load", self.w_load);
        crate::values::positive(errors, "max_adapters", self.max_adapters as u64);
        crate::values::positive_duration(errors, "load_timeout", self.load_timeout);
        if self.adapters.is_some() && self.adapter_names().is_empty() {
            errors.push(OptionError::new(
                "adapters",
                "must name at least one adapter, such as \"sql-lora,chat-lora\"",
            ));
        }
        if self.load_from.as_deref().is_some_and(|s| !s.is_empty()) && self.adapters.is_none() {
            errors.push(OptionError::new(
                "load_from",
                "load_from loads only the adapters named in `adapters`, and there are none; \
                 add adapters = \"<name>,<name>\" (the subdirectories of load_from)",
            ));
        }
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(LoraAware::new(
            self,
            ctx.route_targets.len().max(ctx.target_count),
            ctx.seed,
        ))
    }

    fn requirements(&self) -> Requirements {
        let load_from = self
            .load_from
            .as_deref()
            .map(|d| d.trim_end_matches('/'))
            .filter(|d| !d.is_empty());
        Requirements {
            adapter_loading: load_from.map(|dir| AdapterLoading {
                load_from: dir.to_string(),
                adapters: self.adapter_names(),
                timeout: self.load_timeout,
                window: self.window,
            }),
            ..Requirements::default()
        }
    }
}

/// The names of a comma-separated `adapters` option, trimmed, empty ones left out.
pub fn adapter_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// One target an adapter was routed to: when, and when that was last shared.
#[derive(Debug, Clone, Copy)]
struct Slot {
    target: TargetId,
    routed: Instant,
    shared: Instant,
}

/// The targets one adapter was routed to lately, most recent first.
#[derive(Debug, Clone, Copy)]
struct Recent {
    slots: [Slot; RECENT_TARGETS],
    len: u8,
}

impl Recent {
    fn live(&self) -> &[Slot] {
        &self.slots[..self.len as usize]
    }

    /// The latest routing of this adapter anywhere (the front slot).
    fn newest(&self) -> Instant {
        self.slots[0].routed
    }
}

/// Adapter → targets this route sent it to within `window`, bounded.
#[derive(Debug)]
pub struct RecentRoutes {
    map: KeyMap<Recent>,
    max: usize,
    window: Duration,
}

impl RecentRoutes {
    pub fn new(max: usize, window: Duration) -> Self {
        let max = max.max(1);
        let mut map = KeyMap::default();
        // Room for the bound up front: recording never rehashes.
        map.reserve(max.min(1 << 16) + 1);
        RecentRoutes { map, max, window }
    }

    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) <= self.window
    }

    /// Whether `key` was routed anywhere within the window.
    pub fn contains(&self, key: u64, now: Instant) -> bool {
        self.map
            .get(&key)
            .is_some_and(|r| self.fresh(r.newest(), now))
    }

    /// Whether `key` was routed to `target` within the window.
    pub fn routed_to(&self, key: u64, target: TargetId, now: Instant) -> bool {
        self.targets(key)
            .is_some_and(|r| self.routed_within(r, target, now))
    }

    /// The targets `key` was routed to, for [`Self::routed_within`] (one map lookup for
    /// every candidate of a pick).
    fn targets(&self, key: u64) -> Option<&Recent> {
        self.map.get(&key)
    }

    fn routed_within(&self, r: &Recent, target: TargetId, now: Instant) -> bool {
        r.live()
            .iter()
            .any(|s| s.target == target && self.fresh(s.routed, now))
    }

    /// Adapters remembered (expired ones included until evicted).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Records `key` → `target` at `now`. Returns whether the other cores should hear of
    /// it: a new pair, or one last shared more than a quarter of the window ago (so their
    /// copy does not expire while this core keeps routing there).
    pub fn record(&mut self, key: u64, target: TargetId, now: Instant) -> bool {
        let refresh = self.window / 4;
        let fresh_slot = Slot {
            target,
            routed: now,
            shared: now,
        };
        if let Some(r) = self.map.get_mut(&key) {
            let len = r.len as usize;
            if let Some(i) = r.slots[..len].iter().position(|s| s.target == target) {
                let mut slot = r.slots[i];
                slot.routed = now;
                let share = now.saturating_duration_since(slot.shared) > refresh;
                if share {
                    slot.shared = now;
                }
                // Move it to the front, most recent first.
                r.slots[..=i].rotate_right(1);
                r.slots[0] = slot;
                return share;
            }
            // A new target: in front; the oldest falls off the end when full.
            let keep = len.min(RECENT_TARGETS - 1);
            r.slots[..=keep].rotate_right(1);
            r.slots[0] = fresh_slot;
            r.len = (keep + 1) as u8;
            return true;
        }
        if self.map.len() >= self.max {
            self.evict(now);
        }
        self.map.insert(
            key,
            Recent {
                slots: [fresh_slot; RECENT_TARGETS],
                len: 1,
            },
        );
        true
    }

    /// Makes room for one entry: expired entries go; if none had expired, the entry used
    /// least recently.
    fn evict(&mut self, now: Instant) {
        let window = self.window;
        self.map
            .retain(|_, r| now.saturating_duration_since(r.newest()) <= window);
        if self.map.len() >= self.max {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, r)| r.newest())
                .map(|(&k, _)| k);
            if let Some(k) = oldest {
                self.map.remove(&k);
            }
        }
    }
}

pub struct LoraAware {
    rng: fastrand::Rng,
    scores: LadderScores,
    w_load: f64,
    /// Keys of the adapters named in the `adapters` option, sorted.
    configured: Vec<u64>,
    recent: RecentRoutes,
    /// The adapter key of the latest pick that scored residency, for `routed`.
    last: Option<u64>,
    /// Scratch: total score per candidate.
    totals: Vec<f64>,
}

impl LoraAware {
    /// An instance for a route of up to `route_len` targets.
    pub fn new(opts: &Options, route_len: usize, seed: u64) -> Self {
        let mut configured: Vec<u64> = opts
            .adapter_names()
            .iter()
            .map(|a| adapter_key(a))
            .collect();
        configured.sort_unstable();
        configured.dedup();
        LoraAware {
            rng: fastrand::Rng::with_seed(seed),
            scores: opts.scores(),
            w_load: opts.w_load,
            configured,
            recent: RecentRoutes::new(opts.max_adapters, opts.window),
            last: None,
            totals: Vec::with_capacity(route_len),
        }
    }

    /// The routing memory (read-only), for tests and diagnostics.
    pub fn recent(&self) -> &RecentRoutes {
        &self.recent
    }

    /// The least loaded candidate, ties at random.
    fn least_loaded(&mut self, candidates: &[Candidate]) -> Option<usize> {
        choose_least_loaded(&mut self.rng, candidates)
    }
}

impl Strategy for LoraAware {
    fn needs(&self) -> Needs {
        Needs::LORA_RESIDENCY
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        self.last = None;
        if !candidates.iter().any(|c| c.lora.known()) {
            let i = self.least_loaded(candidates)?;
            return Some(Pick::fallback(i, NO_LORA_SIGNAL));
        }
        let key = adapter_key(req.model);
        let adapter = candidates
            .iter()
            .any(|c| c.lora.contains(Residency::ADAPTER))
            || self.configured.binary_search(&key).is_ok()
            || self.recent.contains(key, now);
        if !adapter {
            return Some(Pick::at(self.least_loaded(candidates)?));
        }
        self.last = Some(key);
        let max_load = candidates.iter().map(|c| c.load).max().unwrap_or(0);
        let (scores, recent, w_load) = (&self.scores, &self.recent, self.w_load);
        let routed = recent.targets(key);
        self.totals.clear();
        self.totals.extend(candidates.iter().map(|c| {
            let mut s = scores.of(c.lora.level());
            // Recent routing counts as running, unless the target's model list shows the
            // adapter is not (or no longer) there.
            let unlisted =
                c.lora.contains(Residency::LISTED) && !c.lora.contains(Residency::LOADED);
            if !unlisted && routed.is_some_and(|r| recent.routed_within(r, c.target, now)) {
                s = s.max(scores.running);
            }
            if w_load > 0.0 && max_load > 0 {
                s -= w_load * c.load as f64 / max_load as f64;
            }
            s
        }));
        let best = self
            .totals
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let totals = &self.totals;
        let top = |i: usize| totals[i] >= best - SCORE_EPSILON;
        let i = choose_least_loaded_among(&mut self.rng, candidates, top)?;
        Some(Pick {
            index: i,
            score: Some(best),
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
        let Some(key) = self.last else {
            return;
        };
        if key != adapter_key(req.model) {
            return;
        }
        if self.recent.record(key, target, now) {
            share.session_pin(key, target);
        }
    }

    fn apply_shared(&mut self, item: &Shared<'_>, now: Instant) {
        if let Shared::SessionPin { key, target } = *item {
            self.recent.record(key, target, now);
        }
    }
}

#[cfg(test)]
mod tests;
