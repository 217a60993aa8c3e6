//! The one way a strategy wraps another (`failover`, `adaptive`, `fair_catchup`): the
//! wrapper decides some picks itself and hands the others to its inner strategy, and the
//! inner strategy sees every hook regardless of who picked — what it needs, every sample,
//! every routing, what the other cores shared — so an inner `cache_aware` learns its
//! prefixes and sessions exactly as it would on its own.
//!
//! Owns the forwarding only; the wrappers' own logic lives in their files.

use std::time::Instant;

use rolter_core::{
    Candidate, Needs, Pick, PickRequest, RouteLedger, Sample, ShareSink, Shared, TargetId,
};

use crate::strategy::Strategy;

/// The part of a wrapper strategy that is its own.
pub trait Wrapper {
    /// Inputs the wrapper itself needs (the inner strategy's are added).
    fn needs(&self) -> Needs {
        Needs::NONE
    }

    /// The pick, asking `inner` when the wrapper leaves the choice to it.
    fn pick(
        &mut self,
        inner: &mut dyn Strategy,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick>;

    /// Learns from a finished attempt (the inner strategy is taught too).
    fn observe(&mut self, _sample: &Sample) {}

    /// Learns from a routing decision (the inner strategy is told too).
    fn routed(&mut self, _req: &PickRequest<'_>, _target: TargetId, _now: Instant) {}

    /// What the wrapper itself passes on to the other cores after a routing decision.
    fn share(&mut self, _share: &mut ShareSink) {}

    /// Applies what the wrapper's instance on another core shared (the inner strategy is
    /// given every item too).
    fn apply_shared(&mut self, _item: &Shared<'_>, _now: Instant) {}

    /// Applies the other replicas' books from the shared state store.
    fn apply_ledger(&mut self, _ledger: &RouteLedger) {}

    /// What the wrapper itself learned about `target`, for the admin API.
    fn learned(&self, _target: TargetId) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

/// A wrapper and the strategy it wraps, as one strategy.
pub struct Wrapped<W> {
    pub own: W,
    pub inner: Box<dyn Strategy>,
}

impl<W: Wrapper> Wrapped<W> {
    pub fn new(own: W, inner: Box<dyn Strategy>) -> Self {
        Wrapped { own, inner }
    }
}

impl<W> std::ops::Deref for Wrapped<W> {
    type Target = W;
    fn deref(&self) -> &W {
        &self.own
    }
}

impl<W> std::ops::DerefMut for Wrapped<W> {
    fn deref_mut(&mut self) -> &mut W {
        &mut self.own
    }
}

impl<W: Wrapper> Strategy for Wrapped<W> {
    fn needs(&self) -> Needs {
        self.own.needs().union(self.inner.needs())
    }

    fn pick(
        &mut self,
        req: &PickRequest<'_>,
        candidates: &[Candidate],
        now: Instant,
    ) -> Option<Pick> {
        self.own.pick(&mut *self.inner, req, candidates, now)
    }

    fn observe(&mut self, sample: &Sample) {
        self.own.observe(sample);
        self.inner.observe(sample);
    }

    fn routed(
        &mut self,
        req: &PickRequest<'_>,
        target: TargetId,
        share: &mut ShareSink,
        now: Instant,
    ) {
        self.own.routed(req, target, now);
        self.own.share(share);
        self.inner.routed(req, target, share, now);
    }

    fn apply_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.own.apply_shared(item, now);
        self.inner.apply_shared(item, now);
    }

    fn apply_fleet_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.own.apply_shared(item, now);
        self.inner.apply_fleet_shared(item, now);
    }

    fn basis(&self) -> rolter_core::Basis {
        self.inner.basis()
    }

    fn apply_ledger(&mut self, ledger: &RouteLedger) {
        self.own.apply_ledger(ledger);
        self.inner.apply_ledger(ledger);
    }

    fn learned(&self, target: TargetId) -> Vec<(&'static str, f64)> {
        let mut own = self.own.learned(target);
        for (k, v) in self.inner.learned(target) {
            if !own.iter().any(|(o, _)| *o == k) {
                own.push((k, v));
            }
        }
        own
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use rolter_core::{AsyncInputs, PickRequest, SessionKey, ShareSink};

    use crate::testing::{cands, context, spec};

    /// A long prompt shared by `n`-numbered conversations.
    fn prompt(system: u8, question: &str) -> Vec<u8> {
        let mut p = format!(
            "[{{\"role\":\"system\",\"content\":\"{}\"}}",
            (system as char).to_string().repeat(3000)
        )
        .into_bytes();
        p.extend_from_slice(
            format!(",{{\"role\":\"user\",\"content\":\"{question}\"}}]").as_bytes(),
        );
        p
    }

    fn request<'a>(
        prompt: &'a [u8],
        session: Option<&'a [u8]>,
        inputs: &'a AsyncInputs,
    ) -> PickRequest<'a> {
        PickRequest {
            model: "m",
            session: SessionKey {
                header: session,
                prompt,
            },
            prompt,
            prompt_tokens: 100,
            max_tokens: None,
            inputs,
        }
    }

    /// Every wrapper with an inner `cache_aware`: what one core's inner strategy learns from
    /// routing (a prefix, a session) reaches the other core's through the shared items, and
    /// both then send that prefix and that session to the same target.
    #[test]
    fn an_inner_cache_aware_learns_and_shares_through_every_wrapper() {
        let inner = "{ name = \"cache_aware\", max_bytes_per_target = 65536 }";
        for (wrapper, options) in [
            ("failover", format!("within_tier = {inner}")),
            ("adaptive", format!("fallback_strategy = {inner}")),
            ("fair_catchup", format!("base_strategy = {inner}")),
        ] {
            let s = spec(wrapper, &options);
            let ctx_a = crate::testing::context(&[1.0; 4], &[]);
            let ctx_b = crate::context::BuildContext {
                seed: 99,
                ..context(&[1.0; 4], &[])
            };
            // The kill switch off: adaptive's fallback picks.
            ctx_a.switches.set_adaptive(false);
            ctx_b.switches.set_adaptive(false);
            let (mut a, mut b) = (s.build(&ctx_a), s.build(&ctx_b));
            let c = cands(&[(1.0, 0); 4]);
            let inputs = AsyncInputs::default();
            let now = Instant::now();
            let first = prompt(b'A', "first");
            let r = request(&first, Some(b"user-1"), &inputs);
            let p = a.pick(&r, &c, now).unwrap();
            let target = c[p.index].target;
            let mut sink = ShareSink::default();
            sink.for_route(0);
            a.routed(&r, target, &mut sink, now);
            let batch = sink.take_batch();
            assert_eq!(batch.len(), 2, "{wrapper}: one prefix, one session pin");
            for (_, item) in batch.iter() {
                b.apply_shared(&item, now);
            }
            let next = prompt(b'A', "a different question");
            // fair_catchup repays deficits once the other targets are owed a pick (after
            // four here); until then its base strategy decides.
            let picks = if wrapper == "fair_catchup" { 1 } else { 10 };
            for s in [&mut a, &mut b] {
                for _ in 0..picks {
                    let p = s.pick(&request(&next, None, &inputs), &c, now).unwrap();
                    assert_eq!(c[p.index].target, target, "{wrapper}: the warm prefix");
                }
            }
            let unrelated = prompt(b'Z', "unrelated");
            let p = b
                .pick(&request(&unrelated, Some(b"user-1"), &inputs), &c, now)
                .unwrap();
            assert_eq!(c[p.index].target, target, "{wrapper}: the session pin");
            assert!(
                !b.learned(target).is_empty(),
                "{wrapper}: the inner strategy reports what it learned"
            );
        }
    }
}
