//! `fair_catchup` (`catch_up`): weight-proportional shares that survive outages. A target
//! that missed assignments (it was not a candidate) is preferred once it is back, at a
//! bounded rate, until its books balance; otherwise a base strategy decides.
//!
//! The books, per route target, over a sliding window of [`BUCKETS`] time buckets:
//!
//! - **received**: picks that landed on the target (base or catch-up picks alike);
//! - **expected**: every pick the route makes, whichever target it lands on and whether or
//!   not a given target was a candidate at that moment, adds `w_t / Σ w` to the expected
//!   count of *every* route target `t` (`w` = the configured weights, 0 for a drained target).
//!   Expected counts are therefore `share_t × picks in the window`; an absent target's
//!   expected count keeps growing while its received count does not, which is its deficit.
//!
//! Both counts are kept per bucket; the ring advances with `now`, and a bucket's picks leave
//! the window (from both counts at once) when the ring comes round to it, so a pick is
//! remembered for between `window × 11/12` and `window`. A candidate whose deficit
//! (expected − received) is at least 1 is preferred, the largest deficit per unit of weight
//! first (ties at random), with `score` = its deficit. Catch-up picks are capped two ways so a
//! returning target is not flooded: at most `max_catchup_share` of the route's picks in the
//! current bucket (counting the pick being made), and spread out by a credit that grows by
//! `max_catchup_share` per pick and is capped at one pick. Every other pick is the base
//! strategy's, passed through unchanged.
//!
//! Owns its books (preallocated at build, indexed by route slot) and the base strategy. It
//! must not allocate, log or read a clock per pick: time comes only from `now`.
//!
//! The books are per core. With `durable = true` every assignment is also shared: the other
//! cores add it to their books (so each core keeps the replica's books), and the gateway's
//! state thread adds it to the route's window in the shared state store. What the store
//! holds beyond this replica's own assignments (the other replicas', and this replica's
//! before a restart) arrives as a [`RouteLedger`] and is added to the window sums, so every
//! replica repays the same fleet-wide deficit under the same catch-up rule. While the store
//! is away the local books decide alone; the assignments made meanwhile reach the store
//! when it returns.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::InnerStrategy;
use crate::options::StrategyOptions;
use crate::requirements::{Requirements, StoreUse};
use crate::shared::wrap::{Wrapped, Wrapper};
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Pick, PickRequest, RouteLedger, ShareSink, Shared, TargetId};

/// Time buckets in the sliding window.
pub const BUCKETS: usize = 12;

/// The options of `fair_catchup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// How long assignments are remembered.
    #[serde(with = "crate::values::duration")]
    pub window: Duration,
    /// Largest fraction of the route's picks per bucket that may repay deficits.
    pub max_catchup_share: f64,
    /// The strategy that picks when no candidate is owed.
    pub base_strategy: InnerStrategy,
    /// The books live in the shared state store: shared by every replica, kept over restarts.
    pub durable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            window: Duration::from_secs(60),
            max_catchup_share: 0.5,
            base_strategy: InnerStrategy::of(super::round_robin::Options::default()),
            durable: false,
        }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "fair_catchup";
    const ALIASES: &'static [&'static str] = &["catch_up"];
    const SUMMARY: &'static str = "Weighted shares kept over a sliding window; targets that missed picks (outage) catch up at a bounded rate";
    const TRAITS: &'static [Trait] = &[Trait::Weighted, Trait::Stateful, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[
        (
            "window",
            "how long assignments are remembered (12 time buckets; a pick is forgotten after 11/12 to 12/12 of it)",
        ),
        (
            "max_catchup_share",
            "largest fraction of the route's picks per bucket that may repay deficits, in (0, 1]",
        ),
        (
            "base_strategy",
            "the strategy that picks when no candidate is owed (any name or alias but fair_catchup, or a table with name and its options)",
        ),
        (
            "durable",
            "keep the books in the shared state store ([state]): every replica repays the same deficits, and they survive a restart",
        ),
    ];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::positive_duration(errors, "window", self.window);
        let share = self.max_catchup_share;
        crate::values::require(
            errors,
            share > 0.0 && share <= 1.0,
            "max_catchup_share",
            "must be a fraction greater than 0 and at most 1, such as 0.5",
        );
        self.base_strategy
            .check_not(Self::NAME, "base_strategy", errors);
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        let mut f = FairCatchup::from_context(
            self.base_strategy.spec().build(ctx),
            ctx,
            self.window,
            self.max_catchup_share,
        );
        f.own.durable = self.durable;
        Box::new(f)
    }

    fn requirements(&self) -> Requirements {
        let own = Requirements {
            store: self.durable.then(|| StoreUse {
                ledger: Some(self.window),
                ..StoreUse::by(format!("`{}` with durable = true", Self::NAME))
            }),
            ..Requirements::default()
        };
        own.and(self.base_strategy.requirements(Self::NAME, "base_strategy"))
    }

    fn nested(&mut self) -> Vec<(&'static str, &mut InnerStrategy)> {
        vec![("base_strategy", &mut self.base_strategy)]
    }
}

/// Slot marker for target ids outside the route.
const NOT_IN_ROUTE: u32 = u32::MAX;
/// Tolerance for the float comparisons on expected counts and credit.
const EPSILON: f64 = 1e-9;

pub struct FairCatchup {
    rng: fastrand::Rng,
    /// Route slot per target id, `NOT_IN_ROUTE` for the others.
    slot: Vec<u32>,
    /// Per slot: effective weight (> 0) and share of the route (`weight / Σ weight`).
    weight: Vec<f64>,
    share: Vec<f64>,
    /// Received picks per bucket and slot: `received[bucket * slots + slot]`.
    received: Vec<u64>,
    /// Per slot: received picks summed over the window.
    window_received: Vec<u64>,
    /// Per bucket: the route's picks, and how many of them repaid a deficit.
    bucket_picks: [u64; BUCKETS],
    bucket_catchups: [u64; BUCKETS],
    /// The route's picks summed over the window.
    window_picks: u64,
    /// Length of one bucket in nanoseconds (≥ 1).
    bucket_nanos: u128,
    /// Time of the first pick; bucket numbers count from it.
    epoch: Option<Instant>,
    /// Absolute number of the current bucket (its ring index is `current % BUCKETS`).
    current: u64,
    max_share: f64,
    /// Catch-up credit in picks, in [0, 1].
    credit: f64,
    /// Assignments are shared with the other cores and the store (`durable`).
    durable: bool,
    /// The target of the last pick, until it is shared.
    unshared: Option<TargetId>,
    /// The other replicas' window from the store: picks, and received per slot.
    ext_picks: u64,
    ext_received: Vec<u64>,
}

impl FairCatchup {
    /// `route` lists the route's targets with their configured weights (non-positive or
    /// non-finite weights count as 1.0). `max_catchup_share` is clamped into (0, 1].
    pub fn new(
        base: Box<dyn Strategy>,
        target_count: usize,
        route: &[(TargetId, f64)],
        window: Duration,
        max_catchup_share: f64,
        seed: u64,
    ) -> Wrapped<FairCatchup> {
        let size = route
            .iter()
            .map(|&(t, _)| t + 1)
            .max()
            .unwrap_or(0)
            .max(target_count);
        let mut slot = vec![NOT_IN_ROUTE; size];
        let mut weight = Vec::with_capacity(route.len());
        for &(t, w) in route {
            if slot[t] != NOT_IN_ROUTE {
                continue;
            }
            slot[t] = weight.len() as u32;
            // A drained target (weight 0) is owed no share, so it is never caught up on.
            weight.push(if w.is_finite() && w >= 0.0 { w } else { 1.0 });
        }
        let total: f64 = weight.iter().sum();
        let share = weight
            .iter()
            .map(|w| if total > 0.0 { w / total } else { 0.0 })
            .collect();
        let slots = weight.len();
        let max_share = if max_catchup_share.is_finite() && max_catchup_share > 0.0 {
            max_catchup_share.min(1.0)
        } else {
            Options::default().max_catchup_share
        };
        let own = FairCatchup {
            rng: fastrand::Rng::with_seed(seed ^ 0x6661_6972_5f63_7570),
            slot,
            weight,
            share,
            received: vec![0; slots * BUCKETS],
            window_received: vec![0; slots],
            bucket_picks: [0; BUCKETS],
            bucket_catchups: [0; BUCKETS],
            window_picks: 0,
            bucket_nanos: (window.as_nanos() / BUCKETS as u128).max(1),
            epoch: None,
            current: 0,
            max_share,
            credit: 0.0,
            durable: false,
            unshared: None,
            ext_picks: 0,
            ext_received: vec![0; slots],
        };
        Wrapped::new(own, base)
    }

    /// An instance for the route of `ctx`, weights from its targets.
    pub fn from_context(
        base: Box<dyn Strategy>,
        ctx: &BuildContext<'_>,
        window: Duration,
        max_catchup_share: f64,
    ) -> Wrapped<FairCatchup> {
        let route: Vec<(TargetId, f64)> = ctx
            .route_targets
            .iter()
            .map(|&t| (t, ctx.weight(t)))
            .collect();
        Self::new(
            base,
            ctx.target_count,
            &route,
            window,
            max_catchup_share,
            ctx.seed,
        )
    }

    /// A target's deficit (expected − received) as of the last pick, or `None` when the
    /// target is not in the route.
    pub fn deficit(&self, target: TargetId) -> Option<f64> {
        self.slot_of(target).map(|s| self.slot_deficit(s))
    }

    fn slot_of(&self, target: TargetId) -> Option<usize> {
        match self.slot.get(target) {
            Some(&s) if s != NOT_IN_ROUTE => Some(s as usize),
            _ => None,
        }
    }

    fn slot_deficit(&self, s: usize) -> f64 {
        (self.window_picks + self.ext_picks) as f64 * self.share[s]
            - (self.window_received[s] + self.ext_received[s]) as f64
    }

    /// Records `count` assignments to `target` in the current bucket.
    fn record(&mut self, target: TargetId, count: u64) {
        if let Some(s) = self.slot_of(target) {
            let slots = self.weight.len();
            let b = (self.current % BUCKETS as u64) as usize;
            self.bucket_picks[b] += count;
            self.window_picks += count;
            self.received[b * slots + s] += count;
            self.window_received[s] += count;
        }
    }

    /// Moves the ring to the bucket of `now`, emptying the buckets it passes.
    fn advance(&mut self, now: Instant) {
        let epoch = *self.epoch.get_or_insert(now);
        let bucket = (now.saturating_duration_since(epoch).as_nanos() / self.bucket_nanos)
            .min(u64::MAX as u128) as u64;
        if bucket <= self.current {
            return;
        }
        let steps = (bucket - self.current).min(BUCKETS as u64);
        let slots = self.weight.len();
        for k in 1..=steps {
            let b = ((self.current + k) % BUCKETS as u64) as usize;
            self.window_picks -= self.bucket_picks[b];
            self.bucket_picks[b] = 0;
            self.bucket_catchups[b] = 0;
            let row = &mut self.received[b * slots..(b + 1) * slots];
            for (sum, r) in self.window_received.iter_mut().zip(row.iter_mut()) {
                *sum -= *r;
                *r = 0;
            }
        }
        self.current = bucket;
    }

    /// The candidate with the largest deficit per unit of weight among those owed at least
    /// one pick (ties at random), with its deficit.
    fn most_owed(&mut self, candidates: &[Candidate]) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        let mut best_rel = f64::NEG_INFINITY;
        let mut ties = 0u32;
        for (i, c) in candidates.iter().enumerate() {
            let Some(s) = self.slot_of(c.target) else {
                continue;
            };
            let deficit = self.slot_deficit(s);
            if deficit < 1.0 - EPSILON {
                continue;
            }
            let rel = deficit / self.weight[s];
            let tolerance = EPSILON * rel.abs().max(1.0);
            if best.is_none() || rel > best_rel + tolerance {
                best = Some((i, deficit));
                best_rel = rel;
                ties = 1;
            } else if rel >= best_rel - tolerance {
                ties += 1;
                if self.rng.u32(..ties) == 0 {
                    best = Some((i, deficit));
                }
            }
        }
        best
    }
}

impl Wrapper for FairCatchup {
    fn pick(
        &mut self,
        base: &mut dyn Strategy,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        self.advance(now);
        let b = (self.current % BUCKETS as u64) as usize;
        self.credit = (self.credit + self.max_share).min(1.0);
        let may_catch_up = self.credit >= 1.0 - EPSILON
            && (self.bucket_catchups[b] + 1) as f64
                <= self.max_share * (self.bucket_picks[b] + 1) as f64 + EPSILON;
        let owed = if may_catch_up {
            self.most_owed(candidates)
        } else {
            None
        };
        let pick = match owed {
            Some((index, deficit)) => {
                self.credit = (self.credit - 1.0).max(0.0);
                self.bucket_catchups[b] += 1;
                Pick {
                    index,
                    score: Some(deficit),
                    fallback: None,
                }
            }
            None => base.pick(req, candidates, now)?,
        };
        // Record the assignment: one more route pick, received by the chosen target.
        if let Some(c) = candidates.get(pick.index) {
            self.record(c.target, 1);
            if self.durable {
                self.unshared = Some(c.target);
            }
        }
        Some(pick)
    }

    fn share(&mut self, share: &mut ShareSink) {
        if let Some(t) = self.unshared.take() {
            share.assigned(t, 1);
        }
    }

    fn apply_shared(&mut self, item: &Shared<'_>, now: Instant) {
        if let (true, Shared::Assigned { target, count }) = (self.durable, *item) {
            self.advance(now);
            self.record(target, u64::from(count));
        }
    }

    fn apply_ledger(&mut self, ledger: &RouteLedger) {
        self.ext_picks = ledger.picks;
        self.ext_received.iter_mut().for_each(|r| *r = 0);
        for &(t, n) in &ledger.received {
            if let Some(s) = self.slot_of(t) {
                self.ext_received[s] = n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategies::round_robin::RoundRobin;
    use crate::testing;
    use crate::testing::{cands, context, req};

    const WINDOW: Duration = Duration::from_secs(60);

    /// Over targets 0..weights.len() with SWRR as the base.
    fn fair(weights: &[f64], share: f64) -> Wrapped<FairCatchup> {
        let route: Vec<(TargetId, f64)> = weights.iter().copied().enumerate().collect();
        FairCatchup::new(
            Box::new(RoundRobin::new(weights.len())),
            weights.len(),
            &route,
            WINDOW,
            share,
            5,
        )
    }

    fn weighted(weights: &[f64]) -> Vec<Candidate> {
        let spec: Vec<(f64, u64)> = weights.iter().map(|&w| (w, 0)).collect();
        cands(&spec)
    }

    /// `n` picks at `now`, returning the targets chosen and how many were catch-up picks.
    fn run(
        f: &mut Wrapped<FairCatchup>,
        c: &[Candidate],
        n: usize,
        now: Instant,
    ) -> (Vec<usize>, usize) {
        let mut targets = Vec::with_capacity(n);
        let mut catchups = 0;
        for _ in 0..n {
            let p = f.pick(&req(), c, now).unwrap();
            assert_eq!(p.fallback, None);
            if p.score.is_some() {
                catchups += 1;
            }
            targets.push(c[p.index].target);
        }
        (targets, catchups)
    }

    fn count(targets: &[usize], t: usize) -> usize {
        targets.iter().filter(|&&x| x == t).count()
    }

    #[test]
    fn a_drained_target_is_owed_nothing_and_never_picked() {
        let mut f = fair(&[1.0, 0.0, 1.0], 0.5);
        let all = weighted(&[1.0, 0.0, 1.0]);
        let t0 = Instant::now();
        // Target 2 is away for a while: target 0 alone takes the traffic.
        let (during, _) = run(&mut f, &all[..2], 200, t0);
        assert_eq!(count(&during, 1), 0);
        // Back: the catch-up goes to target 2, never to the drained one.
        let mut after = Vec::new();
        let mut catchups = 0;
        for step in 1..=100u64 {
            let (t, k) = run(&mut f, &all, 10, t0 + Duration::from_millis(100 * step));
            after.extend(t);
            catchups += k;
        }
        assert_eq!(count(&after, 1), 0);
        assert!(catchups > 0, "target 2 was caught up on");
        assert!(f.deficit(1).unwrap() <= 0.0);
    }

    #[test]
    fn without_an_outage_shares_follow_the_base_strategy() {
        let mut f = fair(&[3.0, 1.0], 0.5);
        let c = weighted(&[3.0, 1.0]);
        let t0 = Instant::now();
        let mut all = Vec::new();
        let mut catchups = 0;
        // 4000 picks over 100 s: ten per 250 ms, so history also ages out meanwhile.
        for step in 0..400u64 {
            let (t, k) = run(&mut f, &c, 10, t0 + Duration::from_millis(250 * step));
            all.extend(t);
            catchups += k;
        }
        assert_eq!(
            catchups, 0,
            "SWRR never leaves a target a whole pick behind"
        );
        assert_eq!(count(&all, 0), 3000);
        assert_eq!(count(&all, 1), 1000);
        assert!(!all.windows(4).any(|w| w.iter().all(|&t| t == 0)));
        assert!(f.deficit(0).unwrap().abs() < 1.0 && f.deficit(1).unwrap().abs() < 1.0);
    }

    #[test]
    fn an_outage_is_repaid_at_a_bounded_rate_then_shares_return_to_normal() {
        let mut f = fair(&[1.0, 1.0], 0.5);
        let both = weighted(&[1.0, 1.0]);
        let only_a = [both[0]];
        let t0 = Instant::now();
        let tick = Duration::from_millis(100); // 50 picks per 5 s bucket
        let at = |i: u64| t0 + tick * i as u32;
        // Outage: target 1 is not a candidate for 100 picks (10 s).
        for i in 0..100 {
            assert_eq!(f.pick(&req(), &only_a, at(i)).unwrap().index, 0);
        }
        assert!((f.deficit(1).unwrap() - 50.0).abs() < 1e-9);
        assert!((f.deficit(0).unwrap() + 50.0).abs() < 1e-9);
        // Target 1 is back: it gets more than its half until the books balance, but never
        // more than half of the picks of any bucket go to repayment.
        let bucket = WINDOW / BUCKETS as u32;
        let mut per_bucket = std::collections::HashMap::<u64, (u32, u32)>::new();
        let mut got = Vec::new();
        let mut i = 100;
        while f.deficit(1).unwrap() >= 1.0 {
            let now = at(i);
            let p = f.pick(&req(), &both, now).unwrap();
            let e = per_bucket
                .entry(now.duration_since(t0).as_nanos() as u64 / bucket.as_nanos() as u64)
                .or_default();
            e.0 += 1;
            if let Some(d) = p.score {
                assert_eq!(p.index, 1, "only the returning target is owed");
                assert!(d >= 1.0);
                e.1 += 1;
            }
            got.push(both[p.index].target);
            i += 1;
            assert!(i < 1000, "the deficit must be repaid");
        }
        for (b, (picks, catchups)) in &per_bucket {
            assert!(
                *catchups as f64 <= 0.5 * *picks as f64,
                "bucket {b}: {catchups} of {picks}"
            );
        }
        // Repayment at 3 picks in 4: 200 picks repay a deficit of 50 (less what aged out).
        let returned = count(&got, 1) as f64 / got.len() as f64;
        assert!(
            returned > 0.7 && returned <= 0.76,
            "{returned} over {}",
            got.len()
        );
        assert!(got.len() >= 150, "{}", got.len());
        // Not flooded: repayments interleave with base picks, so never four in a row.
        assert!(!got.windows(4).any(|w| w.iter().all(|&t| t == 1)));
        // Books balanced: back to the base strategy's plain alternation (at most one more
        // repayment while the last half pick settles).
        let (after, catchups) = run(&mut f, &both, 100, at(i));
        assert!(catchups <= 1, "{catchups}");
        assert!((49..=51).contains(&count(&after, 1)), "{after:?}");
        let (after, catchups) = run(&mut f, &both, 100, at(i));
        assert_eq!(catchups, 0);
        assert_eq!(count(&after, 1), 50);
    }

    #[test]
    fn catch_up_share_bounds_the_repayment_rate() {
        for share in [0.2, 1.0] {
            let mut f = fair(&[1.0, 1.0], share);
            let both = weighted(&[1.0, 1.0]);
            let now = Instant::now();
            run(&mut f, &both[..1], 200, now);
            let (got, catchups) = run(&mut f, &both, 100, now);
            if share == 1.0 {
                // Everything repays while the deficit lasts.
                assert_eq!(catchups, 100);
                assert_eq!(count(&got, 1), 100);
            } else {
                // One repayment per five picks (the bucket already holds 200 picks, the
                // credit spreads them), so 20 + half of the 80 base picks.
                assert_eq!(catchups, 20);
                assert_eq!(count(&got, 1), 60);
            }
        }
    }

    #[test]
    fn the_first_picks_of_a_bucket_respect_the_share() {
        let mut f = fair(&[1.0, 1.0], 0.5);
        let both = weighted(&[1.0, 1.0]);
        let t0 = Instant::now();
        run(&mut f, &both[..1], 40, t0);
        // A fresh bucket: its first pick cannot be a repayment (1 of 1 > 0.5).
        let next = t0 + WINDOW / BUCKETS as u32;
        let p = f.pick(&req(), &both, next).unwrap();
        assert_eq!(p.score, None);
        let p = f.pick(&req(), &both, next).unwrap();
        assert!(p.score.is_some());
    }

    #[test]
    fn history_older_than_the_window_is_forgotten() {
        let mut f = fair(&[1.0, 1.0], 0.5);
        let both = weighted(&[1.0, 1.0]);
        let t0 = Instant::now();
        run(&mut f, &both[..1], 100, t0);
        assert!(f.deficit(1).unwrap() >= 50.0 - 1e-9);
        // Just inside the window (11 buckets on): still owed.
        let mut g = fair(&[1.0, 1.0], 0.5);
        run(&mut g, &both[..1], 100, t0);
        let (_, k) = run(&mut g, &both, 10, t0 + Duration::from_secs(56));
        assert!(k > 0);
        // A whole window later: nothing is owed any more.
        let (got, catchups) = run(&mut f, &both, 20, t0 + WINDOW);
        assert_eq!(catchups, 0);
        assert_eq!(count(&got, 1), 10);
        assert!(f.deficit(1).unwrap().abs() < 1.0);
        // Far later as well (the ring is emptied once, not once per bucket passed).
        let (_, catchups) = run(&mut f, &both, 20, t0 + Duration::from_secs(100_000));
        assert_eq!(catchups, 0);
    }

    #[test]
    fn weights_shape_the_expected_counts() {
        let both = weighted(&[3.0, 1.0]);
        let now = Instant::now();
        // The weight-1 target out for 40 picks: it was owed a quarter of them.
        let mut f = fair(&[3.0, 1.0], 0.5);
        run(&mut f, &both[..1], 40, now);
        assert!((f.deficit(1).unwrap() - 10.0).abs() < 1e-9);
        assert!((f.deficit(0).unwrap() + 10.0).abs() < 1e-9);
        // The weight-3 target out for 40 picks: it was owed three quarters.
        let mut g = fair(&[3.0, 1.0], 0.5);
        run(&mut g, &both[1..], 40, now);
        assert!((g.deficit(0).unwrap() - 30.0).abs() < 1e-9);
        let (got, catchups) = run(&mut g, &both, 40, now);
        assert!(catchups > 0);
        assert!(
            count(&got, 0) > 30,
            "more than its 3/4 while repaying: {got:?}"
        );
        // Negative (invalid) weights count as 1.0; a zero weight is owed nothing.
        let mut h = fair(&[-1.0, -2.0], 0.5);
        run(&mut h, &both[..1], 20, now);
        assert!((h.deficit(1).unwrap() - 10.0).abs() < 1e-9);
        let mut z = fair(&[1.0, 0.0], 0.5);
        run(&mut z, &both[..1], 20, now);
        assert_eq!(z.deficit(1), Some(0.0));
    }

    #[test]
    fn the_largest_deficit_per_weight_is_repaid_first() {
        let mut f = fair(&[1.0, 2.0, 1.0], 1.0);
        let c = weighted(&[1.0, 2.0, 1.0]);
        let now = Instant::now();
        // Target 0 alone for 40 picks: 1 is owed 20 (10 per weight), 2 is owed 10 (10).
        run(&mut f, &c[..1], 40, now);
        // Target 1 back first, for 8 picks, all repayments: it is still owed 16 (8 per
        // weight), while 2 is now owed 12 (12 per weight).
        let (got, catchups) = run(&mut f, &c[..2], 8, now);
        assert_eq!((count(&got, 1), catchups), (8, 8));
        assert!((f.deficit(1).unwrap() - 16.0).abs() < 1e-9);
        assert!((f.deficit(2).unwrap() - 12.0).abs() < 1e-9);
        let p = f.pick(&req(), &c, now).unwrap();
        assert_eq!(
            p.index, 2,
            "the larger deficit per unit of weight, not the larger one"
        );
        assert!((p.score.unwrap() - 12.0).abs() < 1e-9);
    }

    #[test]
    fn equal_deficits_are_repaid_in_random_order() {
        let c = weighted(&[1.0, 1.0, 1.0]);
        let now = Instant::now();
        let mut firsts = [0u32; 3];
        for seed in 0..200 {
            let route = [(0, 1.0), (1, 1.0), (2, 1.0)];
            let base = Box::new(RoundRobin::new(3));
            let mut f = FairCatchup::new(base, 3, &route, WINDOW, 1.0, seed);
            run(&mut f, &c[..1], 30, now);
            firsts[c[f.pick(&req(), &c, now).unwrap().index].target] += 1;
        }
        assert_eq!(firsts[0], 0);
        assert!(firsts[1] > 60 && firsts[2] > 60, "{firsts:?}");
    }

    #[test]
    fn one_and_changing_candidate_sets() {
        let mut f = fair(&[1.0, 1.0, 1.0], 0.5);
        let all = weighted(&[1.0, 1.0, 1.0]);
        let now = Instant::now();
        assert_eq!(f.pick(&req(), &all[2..], now).unwrap().index, 0);
        let (got, _) = run(&mut f, &all, 300, now);
        for t in 0..3 {
            assert!((95..=105).contains(&count(&got, t)), "{got:?}");
        }
        // A target outside the route is never owed anything and is not recorded.
        assert_eq!(f.deficit(9), None);
        let stranger = [Candidate {
            target: 9,
            weight: 1.0,
            load: 0,
            tier: 0,
            ..Candidate::default()
        }];
        assert_eq!(f.pick(&req(), &stranger, now).unwrap().index, 0);
    }

    fn table(options: &[(&str, toml::Value)]) -> toml::Table {
        options
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn spec(options: &[(&str, toml::Value)]) -> crate::StrategySpec {
        testing::raw("fair_catchup", table(options))
    }

    #[test]
    fn registry_builds_with_defaults_and_with_options() {
        let ctx = context(&[1.0, 1.0], &[]);
        let both = weighted(&[1.0, 1.0]);
        let now = Instant::now();
        assert_eq!(
            testing::validate_spec("catch_up", &toml::Table::new()),
            Ok("fair_catchup")
        );
        let info = testing::lookup("catch_up").unwrap();
        assert_eq!(info.name, "fair_catchup");
        assert!(info.traits.contains(&testing::Trait::Weighted));
        let mut s = testing::build(&spec(&[]), &ctx);
        for _ in 0..20 {
            s.pick(&req(), &both[..1], now).unwrap();
        }
        // Default share 0.5: repayments alternate with base picks.
        let scored = (0..10)
            .filter(|_| s.pick(&req(), &both, now).unwrap().score.is_some())
            .count();
        assert_eq!(scored, 5);
        let opts = [
            ("window", toml::Value::String("10s".into())),
            ("max_catchup_share", toml::Value::Integer(1)),
            ("base_strategy", toml::Value::String("p2c".into())),
        ];
        assert_eq!(
            testing::validate_spec("fair_catchup", &table(&opts)),
            Ok("fair_catchup")
        );
        let mut s = testing::build(&spec(&opts), &ctx);
        for _ in 0..20 {
            s.pick(&req(), &both[..1], now).unwrap();
        }
        let scored = (0..10)
            .filter(|_| s.pick(&req(), &both, now).unwrap().score.is_some())
            .count();
        assert_eq!(scored, 10, "share 1: every pick repays while owed");
        // The 10 s window forgets the outage after 10 s.
        assert_eq!(
            s.pick(&req(), &both, now + Duration::from_secs(10))
                .unwrap()
                .score,
            None
        );
    }

    #[test]
    fn bad_options_are_rejected() {
        for (key, value) in [
            ("base_strategy", toml::Value::String("fair_catchup".into())),
            ("base_strategy", toml::Value::String("catch_up".into())),
            ("base_strategy", toml::Value::String("nope".into())),
            ("base_strategy", toml::Value::Integer(1)),
            ("max_catchup_share", toml::Value::Integer(0)),
            ("max_catchup_share", toml::Value::Float(1.5)),
            ("max_catchup_share", toml::Value::Float(-0.1)),
            ("max_catchup_share", toml::Value::Float(f64::NAN)),
            ("max_catchup_share", toml::Value::String("0.5".into())),
            ("window", toml::Value::String("0s".into())),
            ("window", toml::Value::String("soon".into())),
            ("window", toml::Value::Integer(60)),
            ("bogus", toml::Value::Boolean(true)),
        ] {
            let err = testing::validate_spec("fair_catchup", &table(&[(key, value.clone())]))
                .unwrap_err();
            assert_eq!(err[0].0, key, "{value:?}");
        }
        let err = testing::validate_spec(
            "fair_catchup",
            &table(&[("base_strategy", toml::Value::String("nope".into()))]),
        )
        .unwrap_err();
        assert!(err[0].1.contains("valid names"), "{err:?}");
        for ok in ["failover", "least_loaded", "cheapest", "weighted"] {
            let opts = table(&[("base_strategy", toml::Value::String(ok.into()))]);
            assert_eq!(
                testing::validate_spec("catch_up", &opts),
                Ok("fair_catchup")
            );
        }
    }

    #[test]
    fn durable_books_add_the_store_ledger_and_share_every_assignment() {
        let mut a = fair(&[1.0, 1.0], 0.5);
        a.own.durable = true;
        let mut b = fair(&[1.0, 1.0], 0.5);
        b.own.durable = true;
        let c = weighted(&[1.0, 1.0]);
        let now = Instant::now();
        // The store says: over the window the other replicas made 100 picks, all on target 0
        // (target 1 was away for them): target 1 is owed 50.
        let ledger = RouteLedger {
            picks: 100,
            received: vec![(0, 100)],
        };
        a.apply_ledger(&ledger);
        assert_eq!(a.own.deficit(1), Some(50.0));
        assert_eq!(a.own.deficit(0), Some(-50.0));
        let mut sink = ShareSink::default();
        let mut to_one = 0;
        for _ in 0..40 {
            let p = a.pick(&req(), &c, now).unwrap();
            let t = c[p.index].target;
            to_one += usize::from(t == 1);
            a.routed(&req(), t, sink.for_route(0), now);
        }
        // Catch-up at the bounded rate: at most half of the picks beyond the base's half.
        assert!(to_one > 20 && to_one <= 30, "{to_one} of 40 to target 1");
        // Every assignment was shared; another core applying them keeps the same books.
        let batch = sink.take_batch();
        assert_eq!(batch.len(), 40);
        b.apply_ledger(&ledger);
        for (_, item) in batch.iter() {
            b.apply_shared(&item, now);
        }
        assert_eq!(b.own.deficit(1), a.own.deficit(1));
        // Without durable nothing is shared and other cores' items are ignored.
        let mut plain = fair(&[1.0, 1.0], 0.5);
        let mut sink = ShareSink::default();
        let p = plain.pick(&req(), &c, now).unwrap();
        plain.routed(&req(), c[p.index].target, sink.for_route(0), now);
        assert!(sink.is_empty());
        let before = plain.own.deficit(1);
        plain.apply_shared(
            &Shared::Assigned {
                target: 1,
                count: 9,
            },
            now,
        );
        assert_eq!(plain.own.deficit(1), before);
        // The option asks for the store, through any wrapper that names it.
        let o = Options {
            durable: true,
            ..Options::default()
        };
        let store = o.requirements().store.unwrap();
        assert_eq!(store.ledger, Some(WINDOW));
        assert_eq!(store.by, ["`fair_catchup` with durable = true"]);
    }
}
