//! Stage 4 of the request path: the candidates and the strategy's choice among them.
//!
//! The candidates are the route's targets that serve the model, are eligible (healthy, not
//! ejected), are not cooling after a 429 (every target cooling: a 429 with the shortest
//! `Retry-After`), are under `max_concurrent` (the exact count over every core, from the
//! shared admission counters, plus the other replicas' requests with `state.share_load`)
//! and have not failed this request already, each with
//! its weight, load (with the other replicas' for routes with `fleet_load`), tier, engine
//! queue, KV-cache use and (for strategies that read it) LoRA adapter residency. Strategies
//! only ever see candidates.
//!
//! A route with a shared rotation (`atomic` round-robin) advances it in the state store over
//! the candidates first, waiting at most `state.pick_timeout`; the candidates are built
//! again after the wait (other requests ran meanwhile) and the strategy is given the answer.
//!
//! The chosen target is then admitted: one compare-and-swap on its shared counter
//! (`mesh::caps`). Another core may have taken the last place between the filter and the
//! admission; the candidates are then built again (that target now shows full), at most
//! once per target of the route. The returned [`Picked`] holds the place until it drops.
//!
//! Owns the candidate filter and admission, in a scratch list reused by every pick. It must not allocate
//! per request (the rotation's ask to the store carries its own copy of the member set),
//! and it applies what the other cores sent before it reads the load view.

use std::time::Instant;

use rolter_codec::h1::retry_after::whole_seconds;
use rolter_codec::GatewayError;
use rolter_config::held_back;
use rolter_core::{AsyncInputs, Candidate, Needs, Pick, PickRequest, Residency, TargetId};

use super::admit::Admit;
use super::route::Routed;
use crate::mesh::caps::Admitted;
use crate::mesh::Record;
use crate::path::state::WorkerState;

/// The 503's message when every candidate is at its `max_concurrent` limit (the access
/// log's `UO`, overflow).
pub const ALL_FULL: &str = "every target for this model is at its max_concurrent limit";

/// What a pick is asked: the routed request, what its strategy picks for, the targets it
/// tried already (never candidates again), and what admission knows of it (its class
/// decides the places it may take).
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    pub routed: &'a Routed<'a>,
    pub preq: &'a PickRequest<'a>,
    pub tried: &'a [TargetId],
    pub admit: &'a Admit,
    /// Where a wait in the route's queue is noted, for the access log.
    pub waited: Option<&'a std::cell::Cell<std::time::Duration>>,
}

/// The strategy's choice, admitted.
pub struct Picked<'s> {
    pub target: TargetId,
    /// Other candidates left for a retry.
    pub others: usize,
    pub pick: Pick,
    /// The chosen target's LoRA residency of the requested model, as the strategy saw it.
    pub residency: Residency,
    /// The target's place under its `max_concurrent`, held until the attempt ends.
    pub admitted: Admitted<'s>,
    /// When the strategy chose (the attempt's start).
    pub at: Instant,
}

/// Builds the candidate set, asks the route's strategy and admits its choice; the 503 to
/// answer when no candidate is left (`ALL_FULL` when they are all at their cap) or the
/// strategy finds none acceptable.
pub async fn pick<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    now: Instant,
) -> Result<Picked<'s>, GatewayError> {
    let rs = &state.routes[ask.routed.index];
    if let (Some(rotation), Some(link)) = (&rs.rotation, &state.core.store) {
        let members: Vec<(u16, f64)> = {
            fill(state, ask, now)?;
            let cands = state.candidates.borrow();
            if cands.len() < 2 {
                drop(cands);
                return admit(state, ask, now, true);
            }
            cands.iter().map(|c| (c.target as u16, c.weight)).collect()
        };
        // Boxed: only routes with a shared rotation wait for the store, and every pick's
        // future would otherwise carry the wait's space.
        let next = Box::pin(rotation.next(link, &state.config, ask.routed.index, members)).await;
        let inputs = AsyncInputs {
            rotation: next,
            ..ask.preq.inputs.clone()
        };
        let preq = PickRequest {
            inputs: &inputs,
            ..*ask.preq
        };
        // Other requests on this core used the scratch list while this one waited.
        let now = Instant::now();
        return admit(state, Ask { preq: &preq, ..ask }, now, false);
    }
    admit(state, ask, now, false)
}

/// Chooses among the candidates (filled already when `filled`) and admits the choice,
/// building the candidates again when another core took the chosen target's last place.
fn admit<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    now: Instant,
    filled: bool,
) -> Result<Picked<'s>, GatewayError> {
    for round in 0..=ask.routed.route.targets.len() {
        if round > 0 || !filled {
            fill(state, ask, now)?;
        }
        if let Some(p) = choose(state, ask, now)? {
            return Ok(p);
        }
    }
    Err(all_full())
}

/// The lowest time to first token (ms) the route's strategy predicts for the request
/// over its candidates, when it predicts one for each of them (`None` otherwise, or when
/// no candidate is left: the pick then answers).
pub fn predicted_ttft_ms(state: &WorkerState, ask: Ask<'_>, now: Instant) -> Option<f64> {
    fill(state, ask, now).ok()?;
    let cands = state.candidates.borrow();
    let strategy = state.routes[ask.routed.index].strategy.borrow();
    let mut best: Option<f64> = None;
    for c in cands.iter() {
        let v = strategy.predicted_ttft_ms(ask.preq, c)?;
        best = Some(best.map_or(v, |b| b.min(v)));
    }
    best
}

/// The 503 when every candidate is at its cap.
fn all_full() -> GatewayError {
    GatewayError::internal(503, "no_available_target", ALL_FULL).with_retry_after(1)
}

/// Fills the worker's scratch candidate list; the 503 when no target is left.
fn fill(state: &WorkerState, ask: Ask<'_>, now: Instant) -> Result<(), GatewayError> {
    let Ask {
        routed,
        preq,
        tried,
        admit,
        ..
    } = ask;
    let classes = &state.config.classes;
    let (route_idx, route) = (routed.index, routed.route);
    let fleet_load = state.routes[route_idx].fleet_load;
    state.drain_signals();
    let mut cands = state.candidates.borrow_mut();
    cands.clear();
    let mut full = 0;
    let mut out = 0;
    let mut drained = 0;
    // The shortest wait of the targets cooling after a 429.
    let mut cooling_left = None;
    // Adapter residency only for strategies that read it (the model is hashed once).
    let lora = state.routes[route_idx]
        .needs
        .contains(Needs::LORA_RESIDENCY)
        .then(|| state.load.lora.lookup(preq.model));
    for &t in &route.targets {
        let target = &state.config.targets[t];
        // A passthrough request has no model: any target of its route serves it.
        let serves = preq.model.is_empty() || target.serves(preq.model);
        if !serves || tried.contains(&t) {
            continue;
        }
        // `weight = 0` drains the target: no strategy ever sees it.
        if target.weight <= 0.0 {
            drained += 1;
            continue;
        }
        if !state.load.eligible(t) {
            out += 1;
            continue;
        }
        if let Some(left) = cooling(state, t, now) {
            cooling_left = Some(cooling_left.map_or(left, |l: std::time::Duration| l.min(left)));
            continue;
        }
        let fleet = state.load.fleet_in_flight(t);
        // Exact over this gateway's cores; the other replicas' share is a soft addition.
        let counted = u64::from(state.caps.admitted(t)) + if state.fleet_caps { fleet } else { 0 };
        if target
            .max_concurrent
            .is_some_and(|m| counted + u64::from(held_back(classes, admit.rank, m)) >= u64::from(m))
        {
            full += 1;
            continue;
        }
        let from_fleet = if fleet_load { fleet } else { 0 };
        cands.push(Candidate {
            target: t,
            weight: target.weight,
            load: state.load.load(t) + from_fleet,
            fleet_load: from_fleet,
            tier: target.tier,
            queue_depth: state.load.queue_depth(t),
            kv_usage: state.load.kv_usage(t),
            lora: lora.as_ref().map_or(Residency::UNKNOWN, |l| {
                let r = l.residency(t);
                match &state.routes[route_idx].adapters {
                    Some(loader) => loader.residency(l.key(), t, r, now),
                    None => r,
                }
            }),
        });
    }
    drop(lora);
    slow_start(state, &mut cands);
    if cands.is_empty() {
        if let Some(left) = cooling_left.filter(|_| full == 0) {
            return Err(GatewayError::internal(
                429,
                "targets_rate_limited",
                "every target for this model asked to be left alone (429 with Retry-After); retry after the time given",
            )
            .with_retry_after(whole_seconds(left).max(1)));
        }
        if full > 0 {
            return Err(all_full());
        }
        let msg = if out > 0 {
            "every target for this model is unhealthy or ejected"
        } else if drained > 0 {
            "every target for this model is drained (weight = 0)"
        } else {
            "no target is available for this model"
        };
        return Err(GatewayError::internal(503, "no_available_target", msg).with_retry_after(1));
    }
    Ok(())
}

/// How long `t` still cools after a 429 (or a 503 with `Retry-After`), if it does: it is
/// then no candidate.
fn cooling(state: &WorkerState, t: TargetId, now: Instant) -> Option<std::time::Duration> {
    state.load.cooling_left(t, now)
}

/// Slow start, for every strategy: a candidate whose share is ramping up (it joined
/// recently, `health.slow_start_window`) stays a candidate with probability `ramp`, so its
/// share of the picks is about `ramp` times what it would be. The last candidates are never
/// all ramped out.
fn slow_start(state: &WorkerState, cands: &mut Vec<Candidate>) {
    if cands.len() < 2 || cands.iter().all(|c| state.load.ramp(c.target) >= 1.0) {
        return;
    }
    let mut out = state.ramped_out.borrow_mut();
    out.clear();
    cands.retain(|c| {
        let ramp = state.load.ramp(c.target);
        let keep = ramp >= 1.0 || fastrand::f32() < ramp;
        if !keep {
            out.push(*c);
        }
        keep
    });
    if cands.is_empty() {
        cands.extend(out.drain(..));
    }
}

/// Asks the route's strategy to choose among the filled candidates and admits the choice;
/// `None` when another core took its last place meanwhile.
fn choose<'s>(
    state: &'s WorkerState,
    ask: Ask<'_>,
    now: Instant,
) -> Result<Option<Picked<'s>>, GatewayError> {
    let (route_idx, preq) = (ask.routed.index, ask.preq);
    let cands = state.candidates.borrow();
    let route = &state.routes[route_idx];
    let pick = {
        let mut strategy = route.strategy.borrow_mut();
        let pick = strategy.pick(preq, &cands, now);
        if pick.is_some() && (route.shares_items || route.fleet_load) {
            let c = &route.bases[strategy.basis() as usize];
            c.set(c.get().saturating_add(1));
        }
        pick
    };
    match pick {
        Some(p) if p.index < cands.len() => {
            if let Some(reason) = p.fallback {
                state.links.record(Record::Fallback {
                    route: route_idx as u16,
                    reason,
                });
            }
            let chosen = &cands[p.index];
            let held = state.config.targets[chosen.target]
                .max_concurrent
                .map_or(0, |m| held_back(&state.config.classes, ask.admit.rank, m));
            let Some(admitted) = state.caps.try_admit(chosen.target, held) else {
                return Ok(None);
            };
            Ok(Some(Picked {
                target: chosen.target,
                others: cands.len() - 1,
                pick: p,
                residency: chosen.lora,
                admitted,
                at: now,
            }))
        }
        _ => Err(GatewayError::internal(
            503,
            "no_available_target",
            "the route's strategy found no acceptable target",
        )
        .with_retry_after(1)),
    }
}
