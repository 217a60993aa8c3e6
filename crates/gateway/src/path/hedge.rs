//! Hedging (a route's `hedge_after`): when the first attempt has sent no response byte
//! within the route's delay, a second attempt goes to another candidate and the two race;
//! the first to send its response head wins and is relayed, and the other is dropped at
//! once, which closes its upstream connection so its engine aborts the request.
//!
//! A hedge is charged to the route's retry budget like a retry (none is sent once it is
//! spent) and is made at most once per request, on its first attempt. A leg that fails
//! while the other still runs leaves the race to the other; when both fail, the later
//! failure is the attempt's, for the attempt stage to retry or answer. The delay is fixed,
//! or a percentile of the route's recent send-to-head times on this core
//! ([`HeadTimes`](super::head_times::HeadTimes)).
//!
//! Owns the race and the route's head-time percentile. It must not retry (that is
//! `attempt`) and never hedges once a byte reached the client: the race ends at the head.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use rolter_core::{PickRequest, TargetId};

use super::client::ClientIo;
use super::inputs::Inputs;
use super::reader::Reader;
use super::relay::{self, ClientSide, Opened, Outcome, Report, TryLimits};
use super::release::Released;
use super::request::{IoBufs, Request};
use super::route::Routed;
use super::{pick, record, upstream_request};
use crate::mesh::caps::Admitted;
use crate::mesh::load::InFlight;
use crate::mesh::messages::HedgeEvent;
use crate::mesh::Record;
use crate::path::state::{PooledBufs, WorkerState};

/// The first attempt, picked and admitted.
pub struct First<'s> {
    pub target: TargetId,
    pub admitted: Admitted<'s>,
    pub load_at_send: u64,
    pub client: ClientSide,
    pub limits: TryLimits,
}

/// The attempt whose outcome stands: the winner, or the hedge when both failed.
pub struct Leg {
    pub target: TargetId,
    pub outcome: Outcome,
    pub report: Report,
    pub load_at_send: u64,
}

/// What a hedged attempt came to.
pub struct Hedged {
    pub leg: Leg,
    /// The other leg's target, when a hedge was sent (its attempt is recorded already).
    pub other: Option<TargetId>,
}

/// What the hedge leg needs beside its buffers.
#[derive(Clone, Copy)]
struct Plan<'a, 'r, 'p> {
    routed: &'a Routed<'r>,
    req: &'a Request<'r>,
    inputs: &'a Inputs,
    preq: &'a PickRequest<'p>,
    watch: &'a Reader,
    first: TargetId,
    client: ClientSide,
    limits: TryLimits,
}

/// The hedge leg's target once picked, and its load when sent.
type Sent = Cell<Option<(TargetId, u64, ClientSide)>>;

/// A hedge leg that opened, with its places held while it relays and the buffer set it
/// was sent with (taken from the core's spares only when the hedge goes out).
struct Second<'s> {
    opened: Opened,
    held: (Released<'s>, InFlight<'s>),
    bufs: PooledBufs<'s>,
}

/// Runs the first attempt with a hedge `after` its start (see the module's documentation);
/// the winner's response is relayed to the client.
#[allow(clippy::too_many_arguments)]
pub async fn exchange<'s>(
    state: &'s WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    routed: &Routed<'_>,
    inputs: &Inputs,
    preq: &PickRequest<'_>,
    first: First<'s>,
    after: Duration,
) -> Hedged {
    let tid = first.target;
    let held = (
        Released::new(first.admitted, &state.core.waiters),
        state.load.enter(tid),
    );
    let hedge_at = monoio::time::Instant::now() + after;
    let mut report = Report::default();
    let mut second_report = Report::default();
    let sent: Sent = Cell::new(None);
    let plan = Plan {
        routed,
        req,
        inputs,
        preq,
        watch: &io.reader,
        first: tid,
        client: first.client,
        limits: first.limits,
    };
    // `a`: the first leg's head; `b`: the hedge's (`Some(None)`: none was sent).
    let (a, b) = {
        let mut a_leg = pin!(relay::open(
            state,
            tid,
            &io.reader,
            bufs,
            first.limits,
            &mut report
        ));
        let mut a: Option<Opened> = None;
        let mut b: Option<Option<Second<'s>>> = None;
        let mut sleep = pin!(monoio::time::sleep_until(hedge_at));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(o) = a_leg.as_mut().poll(cx) {
                a = Some(o);
                return Poll::Ready(());
            }
            sleep.as_mut().poll(cx).map(|_| ())
        })
        .await;
        if a.is_none() {
            let mut b_leg = pin!(launch(state, plan, &mut second_report, &sent));
            std::future::poll_fn(|cx| {
                if a.is_none() {
                    if let Poll::Ready(o) = a_leg.as_mut().poll(cx) {
                        a = Some(o);
                    }
                }
                if b.is_none() {
                    if let Poll::Ready(s) = b_leg.as_mut().poll(cx) {
                        b = Some(s);
                    }
                }
                let a_failed = matches!(a, Some(Opened::Done(Outcome::Failed(_))));
                let b_failed = match &b {
                    Some(Some(s)) => matches!(s.opened, Opened::Done(Outcome::Failed(_))),
                    Some(None) => true,
                    None => false,
                };
                // A leg that answered (or saw the client leave) ends the race; one that
                // failed leaves it to the other.
                let a_ends = a.is_some() && !a_failed;
                let b_ends = b.is_some() && !b_failed;
                if a_ends || b_ends || (a.is_some() && b.is_some()) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
        // Leaving the scope drops a leg still running: its connection closes at once, so
        // its engine aborts.
        (a, b)
    };
    let a_failed = matches!(a, Some(Opened::Done(Outcome::Failed(_))));
    let hedge = sent.get();
    // The first leg stands when it answered, or when no hedge opened; the hedge when it
    // answered first, or when both failed (it is the later attempt).
    let second_won = (a.is_none() || a_failed) && matches!(b, Some(Some(_)));
    if !second_won {
        // The first leg's outcome stands; a hedge sent meanwhile lost.
        if let Some((t, load, _)) = hedge {
            let outcome = match b {
                Some(Some(Second {
                    opened: Opened::Done(o),
                    ..
                })) => o,
                // Still running (dropped above) or answered too late: cancelled.
                _ => Outcome::ClientGone,
            };
            record::attempt(state, routed.index, t, preq, &outcome, &second_report, load);
            record::cooling(state, t, second_report.wait, &routed.route.retry);
        }
        let outcome = match a.expect("the first leg ended the race") {
            Opened::Done(o) => o,
            Opened::Head(up, head) => {
                let mut held = Some(held);
                relay::relay(
                    state,
                    tid,
                    up,
                    head,
                    &mut io.wr,
                    &io.reader,
                    bufs,
                    first.client,
                    &mut held,
                    &mut report,
                )
                .await
            }
        };
        return Hedged {
            leg: Leg {
                target: tid,
                outcome,
                report,
                load_at_send: first.load_at_send,
            },
            other: hedge.map(|h| h.0),
        };
    }
    // The hedge's outcome stands: it answered first, or both failed.
    let Some(Some(second)) = b else {
        unreachable!("the hedge won")
    };
    let (t, load, client) = hedge.expect("a hedge that opened was sent");
    drop(held);
    let first_outcome = match a {
        Some(Opened::Done(o)) => o,
        _ => Outcome::ClientGone,
    };
    record::attempt(
        state,
        routed.index,
        tid,
        preq,
        &first_outcome,
        &report,
        first.load_at_send,
    );
    record::cooling(state, tid, report.wait, &routed.route.retry);
    let outcome = match second.opened {
        Opened::Done(o) => o,
        Opened::Head(up, head) => {
            state.links.record(Record::Hedge {
                route: routed.index as u16,
                event: HedgeEvent::Won,
            });
            // The winner's head and what followed it are in the hedge's buffer set.
            let mut spare = second.bufs;
            std::mem::swap(&mut bufs.ubuf, &mut spare.ubuf);
            std::mem::swap(&mut bufs.hdrs, &mut spare.hdrs);
            let mut held = Some(second.held);
            relay::relay(
                state,
                t,
                up,
                head,
                &mut io.wr,
                &io.reader,
                bufs,
                client,
                &mut held,
                &mut second_report,
            )
            .await
        }
    };
    Hedged {
        leg: Leg {
            target: t,
            outcome,
            report: second_report,
            load_at_send: load,
        },
        other: Some(tid),
    }
}

/// The hedge leg: charged to the retry budget, picked among the other candidates (never
/// queued), routed, and opened; `None` when the budget is spent or no candidate is left.
async fn launch<'s>(
    state: &'s WorkerState,
    plan: Plan<'_, '_, '_>,
    report: &mut Report,
    sent: &Sent,
) -> Option<Second<'s>> {
    let routed = plan.routed;
    let route = routed.index as u16;
    let rs = &state.routes[routed.index];
    let policy = &routed.route.retry;
    let skipped = |reason| {
        state.links.record(Record::Hedge {
            route,
            event: HedgeEvent::Skipped(reason),
        });
        None
    };
    if !rs
        .retry_budget
        .try_retry(Instant::now(), policy.budget, policy.budget_min)
    {
        return skipped("budget");
    }
    let now = Instant::now();
    let picked = match pick::pick(state, routed, plan.preq, &[plan.first], now).await {
        Ok(p) => p,
        Err(_) => return skipped("no_target"),
    };
    let t = picked.target;
    let mut bufs = state.core.take_bufs();
    record::routed(state, routed, plan.preq, plan.inputs, t, now);
    if let Some(loader) = &rs.adapters {
        loader
            .ensure(
                &state.upstream,
                &state.links,
                t,
                plan.preq.model,
                picked.residency,
                &mut bufs.side,
            )
            .await;
    }
    let target = &state.config.targets[t];
    upstream_request::build(
        &mut bufs.up,
        plan.req,
        &routed.facts,
        routed.route,
        target,
        routed.key_header,
    );
    let load_at_send = state.load.load(t);
    let held = (
        Released::new(picked.admitted, &state.core.waiters),
        state.load.enter(t),
    );
    let mut client = plan.client;
    if let Some(x) = client.explain.as_mut() {
        x.score = picked.pick.score;
        x.fallback = picked.pick.fallback;
        x.attempt += 1;
    }
    sent.set(Some((t, load_at_send, client)));
    state.links.record(Record::Hedge {
        route,
        event: HedgeEvent::Sent,
    });
    let limits = TryLimits {
        per_try_end: policy
            .per_try_timeout
            .map(|p| monoio::time::Instant::from_std(now + p)),
        ..plan.limits
    };
    let opened = relay::open(state, t, plan.watch, &mut bufs, limits, report).await;
    Some(Second { opened, held, bufs })
}
