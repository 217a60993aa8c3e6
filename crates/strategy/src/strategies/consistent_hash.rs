//! `consistent_hash`: a hash ring over the route's targets; a request's session key picks
//! the first ring point clockwise whose target is a candidate.
//!
//! Owns an immutable ring (built once per instance from the route's targets: `points` ×
//! weight points per target, rounded, at least 1; none for a drained target, weight 0) and
//! a per-target scratch table reused by every pick. Point positions are the xxh3 hash of
//! the target's *name* and the point number, so every core and every gateway process
//! builds the same ring, and adding or removing a target elsewhere in the configuration
//! moves no other target's points.
//!
//! The key is [`SessionKey::hash`](crate::SessionKey::hash): the `x-session-id` header
//! when present, else the canonical (whitespace-free) conversation, which the strategy asks
//! for through [`Needs::CANONICAL_PROMPT`]. A target that is not a candidate (unhealthy,
//! ejected, full, already tried by this request) is skipped by walking on to the next
//! point, so only the keys it owned move, and they come back when it returns.
//!
//! It must not keep per-request state, learn from samples, read the load view, or allocate
//! on the request path; a pick is one binary search plus a short walk.

use std::time::Instant;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::options::StrategyOptions;
use crate::strategy::Strategy;
use crate::traits::Trait;
use crate::values::OptionError;
use rolter_core::{Candidate, Needs, Pick, PickRequest, TargetId};

/// Largest `points` accepted.
pub const MAX_POINTS: u32 = 10_000;

/// The options of `consistent_hash`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Ring points per target at weight 1.
    pub points: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options { points: 100 }
    }
}

impl StrategyOptions for Options {
    const NAME: &'static str = "consistent_hash";
    const SUMMARY: &'static str = "Hash ring keyed by the session (x-session-id, else the conversation); a target's keys move only while it is not a candidate";
    const TRAITS: &'static [Trait] = &[Trait::Weighted, Trait::SingleWinner];
    const HELP: &'static [(&'static str, &'static str)] = &[(
        "points",
        "ring points per target at weight 1 (scaled by weight, rounded, at least 1), 1 to 10000",
    )];

    fn check(&self, errors: &mut Vec<OptionError>) {
        crate::values::require(
            errors,
            (1..=MAX_POINTS).contains(&self.points),
            "points",
            "must be an integer from 1 to 10000, such as 100",
        );
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        Box::new(ConsistentHash::from_context(ctx, self.points))
    }
}

/// Upper bound on one target's points after weight scaling (keeps a huge weight from
/// building a ring of unbounded size).
const MAX_POINTS_PER_TARGET: f64 = 1_000_000.0;

/// Marker in the scratch table for a target that is not among the current candidates.
const ABSENT: u32 = u32::MAX;

pub struct ConsistentHash {
    /// Point positions, sorted ascending.
    hashes: Box<[u64]>,
    /// `owners[i]` is the target owning `hashes[i]`.
    owners: Box<[u32]>,
    /// Per target id: its index in the current candidate slice during a pick, else
    /// [`ABSENT`]. Every entry is `ABSENT` between picks.
    slot: Box<[u32]>,
}

impl ConsistentHash {
    /// The ring over the route's targets, with their configured names and weights.
    pub fn from_context(ctx: &BuildContext<'_>, points: u32) -> Self {
        let targets = ctx.route_targets.iter().filter_map(|&t| {
            ctx.names
                .get(t)
                .map(|name| (t, name.as_str(), ctx.weight(t)))
        });
        Self::new(targets, ctx.target_count, points)
    }

    /// The ring over `(target id, name, weight)` triples; `target_count` bounds the ids.
    pub fn new<'n>(
        targets: impl IntoIterator<Item = (TargetId, &'n str, f64)>,
        target_count: usize,
        points: u32,
    ) -> Self {
        let points = points.max(1) as f64;
        let mut ring: Vec<(u64, &'n str, u32)> = Vec::new();
        let mut max_id = 0usize;
        for (id, name, weight) in targets {
            let weight = if weight.is_finite() && weight >= 0.0 {
                weight
            } else {
                1.0
            };
            // A drained target (weight 0) has no point on the ring; any other at least one.
            let n = if weight == 0.0 {
                0
            } else {
                (points * weight).round().clamp(1.0, MAX_POINTS_PER_TARGET) as u64
            };
            ring.reserve(n as usize);
            for p in 0..n {
                ring.push((xxh3_64_with_seed(name.as_bytes(), p), name, id as u32));
            }
            max_id = max_id.max(id + 1);
        }
        // Ties (a 64-bit collision) are settled by name, so every process agrees.
        ring.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        ConsistentHash {
            hashes: ring.iter().map(|p| p.0).collect(),
            owners: ring.iter().map(|p| p.2).collect(),
            slot: vec![ABSENT; target_count.max(max_id)].into_boxed_slice(),
        }
    }

    /// Number of points on the ring.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the ring has no point (a route without targets).
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The candidate index owning `key`: the first point at or after `key` (wrapping) whose
    /// target is a candidate. `None` when no candidate is on the ring.
    fn lookup(&mut self, key: u64, candidates: &[Candidate]) -> Option<usize> {
        for (i, c) in candidates.iter().enumerate() {
            if let Some(s) = self.slot.get_mut(c.target) {
                *s = i as u32;
            }
        }
        let start = self.hashes.partition_point(|&h| h < key);
        let (after, before) = self.owners.split_at(start);
        let found = before
            .iter()
            .chain(after)
            .map(|&t| self.slot[t as usize])
            .find(|&s| s != ABSENT);
        for c in candidates {
            if let Some(s) = self.slot.get_mut(c.target) {
                *s = ABSENT;
            }
        }
        found.map(|s| s as usize)
    }
}

impl Strategy for ConsistentHash {
    fn needs(&self) -> Needs {
        Needs::CANONICAL_PROMPT
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        _now: Instant,
    ) -> Option<Pick> {
        match candidates.len() {
            1 => Some(Pick::at(0)),
            n => {
                let key = req.session.hash();
                match self.lookup(key, candidates) {
                    Some(i) => Some(Pick::at(i)),
                    // No candidate belongs to the route's ring (cannot happen with a
                    // validated configuration): still deterministic per key.
                    None => Some(Pick::fallback(
                        ((key as u128 * n as u128) >> 64) as usize,
                        "not_on_ring",
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{cands, context, req};
    use rolter_core::SessionKey;

    fn ring(weights: &[f64], points: u32) -> ConsistentHash {
        ConsistentHash::from_context(&context(weights, &[]), points)
    }

    /// The target chosen for session header `key` among `c`.
    fn owner(s: &mut ConsistentHash, c: &[Candidate], key: &[u8]) -> TargetId {
        let mut r = req();
        r.session = SessionKey {
            header: Some(key),
            prompt: b"",
        };
        c[s.pick(&r, c, Instant::now()).unwrap().index].target
    }

    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("session-{i}").into_bytes())
            .collect()
    }

    #[test]
    fn asks_for_the_canonical_prompt_and_never_falls_back_on_its_own_route() {
        let mut s = ring(&[1.0; 4], 100);
        assert!(s.needs().contains(Needs::CANONICAL_PROMPT));
        assert_eq!(s.len(), 400);
        let c = cands(&[(1.0, 0); 4]);
        let mut r = req();
        r.session.header = Some(b"x");
        assert_eq!(s.pick(&r, &c, Instant::now()).unwrap().fallback, None);
    }

    #[test]
    fn one_and_many_candidates() {
        let mut s = ring(&[1.0; 4], 100);
        let now = Instant::now();
        let four = cands(&[(1.0, 0); 4]);
        assert_eq!(s.pick(&req(), &four[2..3], now), Some(Pick::at(0)));
        let many = cands(&[(1.0, 0); 4]);
        let mut seen = [false; 4];
        for k in keys(200) {
            seen[owner(&mut s, &many, &k)] = true;
        }
        assert_eq!(seen, [true; 4], "every target owns some keys");
    }

    #[test]
    fn a_drained_target_has_no_point_and_owns_no_key() {
        let mut s = ring(&[1.0, 0.0, 1.0], 100);
        assert_eq!(s.len(), 200);
        let c = cands(&[(1.0, 0), (0.0, 0), (1.0, 0)]);
        let mut seen = [0u32; 3];
        for k in keys(500) {
            seen[owner(&mut s, &c, &k)] += 1;
        }
        assert_eq!(seen[1], 0, "{seen:?}");
        assert!(seen[0] > 0 && seen[2] > 0, "{seen:?}");
    }

    #[test]
    fn same_key_same_target_across_instances() {
        let c = cands(&[(1.0, 0); 6]);
        let mut a = ring(&[1.0; 6], 100);
        let mut b = ring(&[1.0; 6], 100);
        for k in keys(2_000) {
            let first = owner(&mut a, &c, &k);
            assert_eq!(owner(&mut a, &c, &k), first, "stable on one core");
            assert_eq!(owner(&mut b, &c, &k), first, "stable across cores");
        }
    }

    #[test]
    fn placement_follows_names_not_target_ids() {
        // The same three targets, numbered differently in a larger configuration.
        let mut a = ConsistentHash::new([(0, "a", 1.0), (1, "b", 1.0), (2, "c", 1.0)], 3, 100);
        let mut b = ConsistentHash::new([(9, "c", 1.0), (3, "a", 1.0), (5, "b", 1.0)], 12, 100);
        let ca: Vec<Candidate> = [0, 1, 2]
            .map(|t| Candidate {
                target: t,
                weight: 1.0,
                ..Candidate::default()
            })
            .to_vec();
        let cb: Vec<Candidate> = [3, 5, 9]
            .map(|t| Candidate {
                target: t,
                weight: 1.0,
                ..Candidate::default()
            })
            .to_vec();
        let name_a = |t: TargetId| ["a", "b", "c"][t];
        let name_b = |t: TargetId| match t {
            3 => "a",
            5 => "b",
            _ => "c",
        };
        for k in keys(2_000) {
            assert_eq!(
                name_a(owner(&mut a, &ca, &k)),
                name_b(owner(&mut b, &cb, &k))
            );
        }
    }

    #[test]
    fn removal_remaps_only_the_removed_targets_keys_and_return_restores_them() {
        let mut s = ring(&[1.0; 8], 100);
        let all = cands(&[(1.0, 0); 8]);
        let without: Vec<Candidate> = all.iter().copied().filter(|c| c.target != 3).collect();
        let ks = keys(10_000);
        let before: Vec<TargetId> = ks.iter().map(|k| owner(&mut s, &all, k)).collect();
        let mut moved_to = [0u32; 8];
        for (k, &was) in ks.iter().zip(&before) {
            let now = owner(&mut s, &without, k);
            if was == 3 {
                assert_ne!(now, 3);
                moved_to[now] += 1;
            } else {
                assert_eq!(now, was, "a key not on the removed target moved");
            }
        }
        let moved: u32 = moved_to.iter().sum();
        assert!(moved > 900, "target 3 owned {moved} of 10000 keys");
        // The orphaned keys spread over the other targets rather than one neighbour.
        let receivers = moved_to.iter().filter(|&&n| n > 0).count();
        assert!(receivers >= 5, "{moved_to:?}");
        assert!(moved_to.iter().all(|&n| n < moved / 2), "{moved_to:?}");
        for (k, &was) in ks.iter().zip(&before) {
            assert_eq!(owner(&mut s, &all, k), was, "the owner's keys come back");
        }
    }

    #[test]
    fn candidates_removed_mid_stream_in_any_order() {
        // Candidate slices need not be in target order; the pick indexes the slice given.
        let mut s = ring(&[1.0; 5], 100);
        let mut c = cands(&[(1.0, 0); 5]);
        let ks = keys(3_000);
        let before: Vec<TargetId> = ks.iter().map(|k| owner(&mut s, &c, k)).collect();
        c.reverse();
        c.retain(|c| c.target != 0 && c.target != 4);
        for (k, &was) in ks.iter().zip(&before) {
            let now = owner(&mut s, &c, k);
            assert!(now != 0 && now != 4);
            if was != 0 && was != 4 {
                assert_eq!(now, was);
            }
        }
    }

    #[test]
    fn weights_scale_shares() {
        let mut s = ring(&[3.0, 1.0], 100);
        assert_eq!(s.len(), 400);
        let c = cands(&[(3.0, 0), (1.0, 0)]);
        let mut counts = [0u32; 2];
        for k in keys(20_000) {
            counts[owner(&mut s, &c, &k)] += 1;
        }
        // Intended share of the weight-3 target: 0.75. A ring of 400 points places
        // arcs unevenly by a few percent; the positions are fixed, so this never flakes.
        let share = counts[0] as f64 / 20_000.0;
        assert!((0.68..=0.82).contains(&share), "{counts:?}");
    }

    #[test]
    fn points_scale_with_weight_rounded_and_at_least_one() {
        let s = ConsistentHash::new(
            [
                (0, "a", 0.5),
                (1, "b", 0.001),
                (2, "c", -2.0),
                (3, "d", 2.25),
            ],
            4,
            10,
        );
        // 5 + 1 (at least one) + 10 (non-positive counts as 1.0) + 23 (22.5 rounded).
        assert_eq!(s.len(), 5 + 1 + 10 + 23);
        assert!(s.hashes.windows(2).all(|w| w[0] <= w[1]));
        assert!(ConsistentHash::new([], 0, 100).is_empty());
    }

    #[test]
    fn equal_weights_spread_evenly() {
        let mut s = ring(&[1.0; 4], Options::default().points);
        let c = cands(&[(1.0, 0); 4]);
        let mut counts = [0u32; 4];
        for k in keys(20_000) {
            counts[owner(&mut s, &c, &k)] += 1;
        }
        for n in counts {
            assert!((3_750..=6_250).contains(&n), "{counts:?}");
        }
    }

    #[test]
    fn header_keys_and_prompt_keys() {
        let mut s = ring(&[1.0; 8], 100);
        let c = cands(&[(1.0, 0); 8]);
        let now = Instant::now();
        let mut pick = |header: Option<&[u8]>, prompt: &[u8]| {
            let mut r = req();
            r.session = SessionKey { header, prompt };
            r.prompt = prompt;
            c[s.pick(&r, &c, now).unwrap().index].target
        };
        // The header decides whatever the conversation.
        let mut seen = [false; 8];
        for i in 0..200 {
            let h = format!("user-{i}");
            let t = pick(
                Some(h.as_bytes()),
                b"[{\"role\":\"user\",\"content\":\"a\"}]",
            );
            assert_eq!(t, pick(Some(h.as_bytes()), b"[]"));
            seen[t] = true;
        }
        assert!(seen.iter().filter(|&&x| x).count() >= 6, "{seen:?}");
        // Without the header the conversation is the key: same conversation, same target;
        // different conversations spread.
        let mut seen = [false; 8];
        for i in 0..200 {
            let p = format!("[{{\"role\":\"system\",\"content\":\"long\"}},{{\"role\":\"user\",\"content\":\"{i}\"}}]");
            let t = pick(None, p.as_bytes());
            assert_eq!(t, pick(None, p.as_bytes()));
            seen[t] = true;
        }
        assert!(seen.iter().filter(|&&x| x).count() >= 6, "{seen:?}");
    }

    #[test]
    fn identical_canonical_prompts_map_identically() {
        let mut s = ring(&[1.0; 8], 100);
        let c = cands(&[(1.0, 0); 8]);
        let now = Instant::now();
        for i in 0..100 {
            let compact = format!("[{{\"role\":\"user\",\"content\":\"q {i}\"}}]");
            let spaced = format!("[ {{ \"role\" : \"user\",\n  \"content\": \"q {i}\" }} ]");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            rolter_codec::api::canonical::minify(compact.as_bytes(), &mut a);
            rolter_codec::api::canonical::minify(spaced.as_bytes(), &mut b);
            assert_eq!(a, b);
            let mut ra = req();
            ra.session = SessionKey {
                header: None,
                prompt: &a,
            };
            let mut rb = ra;
            rb.session.prompt = &b;
            rb.model = "other";
            rb.prompt_tokens = 99;
            assert_eq!(
                s.pick(&ra, &c, now).unwrap().index,
                s.pick(&rb, &c, now).unwrap().index
            );
        }
    }

    #[test]
    fn scratch_is_clean_after_every_pick() {
        let mut s = ring(&[1.0; 4], 100);
        let c = cands(&[(1.0, 0); 4]);
        for k in keys(50) {
            owner(&mut s, &c[1..], &k);
            assert!(s.slot.iter().all(|&x| x == ABSENT));
        }
    }

    #[test]
    fn foreign_candidates_fall_back_deterministically() {
        // Targets outside the route's ring (not possible with a validated configuration).
        let mut s = ConsistentHash::new([(0, "a", 1.0), (1, "b", 1.0)], 4, 10);
        let c: Vec<Candidate> = [2, 3]
            .map(|t| Candidate {
                target: t,
                weight: 1.0,
                ..Candidate::default()
            })
            .to_vec();
        let mut r = req();
        r.session.header = Some(b"k");
        let p = s.pick(&r, &c, Instant::now()).unwrap();
        assert_eq!(p.fallback, Some("not_on_ring"));
        assert_eq!(s.pick(&r, &c, Instant::now()).unwrap().index, p.index);
    }

    #[test]
    fn registry_entry_validates_points_and_builds() {
        use crate::testing::{build, lookup, validate_spec, Trait};
        let info = lookup("consistent_hash").unwrap();
        assert!(info.aliases.is_empty());
        assert_eq!(info.traits, &[Trait::Weighted, Trait::SingleWinner]);
        let table = |text: &str| -> toml::Table { toml::from_str(text).unwrap() };
        assert_eq!(
            validate_spec("consistent_hash", &toml::Table::new()),
            Ok("consistent_hash")
        );
        assert_eq!(
            validate_spec("consistent_hash", &table("points = 1")),
            Ok("consistent_hash")
        );
        for bad in [
            "points = 0",
            "points = -3",
            "points = 10001",
            "points = 1.5",
        ] {
            assert!(
                validate_spec("consistent_hash", &table(bad)).is_err(),
                "{bad}"
            );
        }
        let ctx = context(&[1.0; 4], &[]);
        let spec = crate::testing::spec("consistent_hash", "points = 7");
        let mut s = build(&spec, &ctx);
        assert!(s.needs().contains(Needs::CANONICAL_PROMPT));
        let c = cands(&[(1.0, 0); 4]);
        let mut r = req();
        r.session.header = Some(b"user-7");
        let first = s.pick(&r, &c, Instant::now()).unwrap().index;
        let mut direct = ConsistentHash::from_context(&ctx, 7);
        assert_eq!(direct.len(), 28);
        assert_eq!(direct.pick(&r, &c, Instant::now()).unwrap().index, first);
    }
}
