//! The interface every load-balancing strategy implements.
//!
//! A strategy is small, synchronous and per core: each worker builds its own instance per
//! route, signals come in as values ([`Candidate`], [`PickRequest`]) and time comes in as an
//! argument. It must never block, do I/O, take a lock or log per request. Strategies that
//! need an asynchronous input (token ids, a cache-controller lookup) declare it through
//! [`Strategy::needs`]; the gateway resolves it before calling `pick` and passes the result
//! in [`AsyncInputs`](rolter_core::AsyncInputs), leaving a field `None` when the input could
//! not be had in time, in which case the strategy falls back as the spec says.

use std::time::Instant;

use rolter_core::{
    Basis, Candidate, Needs, Pick, PickRequest, RouteLedger, Sample, ShareSink, Shared, TargetId,
};

/// The interface every load-balancing strategy implements. Its name is its options'
/// ([`StrategyOptions::NAME`](crate::options::StrategyOptions::NAME)), which the route's
/// [`StrategySpec`](crate::options::StrategySpec) holds.
pub trait Strategy {
    /// Asynchronous inputs this strategy wants before `pick`.
    fn needs(&self) -> Needs {
        Needs::NONE
    }

    /// Chooses one of `candidates`, or `None` when none is acceptable (the gateway answers
    /// 503). Never called with no candidate: the gateway answers 503 before it asks, and a
    /// wrapper hands its inner strategy a non-empty part of its own candidates; so no
    /// strategy checks for an empty list.
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

    /// Applies what another core's instance of this route's strategy shared (or, for the
    /// kinds the route shares through the state store, another replica's).
    fn apply_shared(&mut self, _item: &Shared<'_>, _now: Instant) {}

    /// [`apply_shared`](Strategy::apply_shared) for what another gateway replica shared
    /// through the state store: strategies that report their [`basis`](Strategy::basis)
    /// remember it came from the fleet.
    fn apply_fleet_shared(&mut self, item: &Shared<'_>, now: Instant) {
        self.apply_shared(item, now);
    }

    /// What decided the last pick: this replica's own information, or the other
    /// replicas' (read right after `pick`, on routes that share state).
    fn basis(&self) -> Basis {
        Basis::Local
    }

    /// Applies the route's books as the shared state store holds them for the other
    /// replicas (`fair_catchup` with `durable = true`); replaces the previous ledger.
    fn apply_ledger(&mut self, _ledger: &RouteLedger) {}

    /// Carries what this instance learned over to a configuration whose targets moved:
    /// `map[new] = Some(old)` for each target of the new configuration that is the same
    /// target (same name, same definition) in the old one. Returns false (the default)
    /// when the strategy cannot, and a fresh instance is built instead. A strategy whose
    /// state is per target (a prefix index, session pins) keeps what the kept targets had,
    /// so a target joining or leaving moves only its own keys.
    fn remap_targets(&mut self, _map: &[Option<TargetId>]) -> bool {
        false
    }

    /// The time to first token (ms) the strategy predicts for `req` on candidate `c`, when
    /// it makes such predictions and knows the target (admission refuses a request whose
    /// deadline no candidate can meet). `None` (the default): no prediction.
    fn predicted_ttft_ms(&self, _req: &PickRequest<'_>, _c: &Candidate) -> Option<f64> {
        None
    }

    /// What the strategy has learned about `target`, as named numbers (a TTFT average,
    /// model coefficients), for the admin API. Never called on the request path.
    fn learned(&self, _target: TargetId) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}
