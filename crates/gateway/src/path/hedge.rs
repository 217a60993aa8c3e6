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

use rolter_core::TargetId;

use super::client::ClientIo;
use super::exchange::{Attempted, Exchange};
use super::pick::{self, Ask};
use super::reader::Reader;
use super::relay::{self, ClientSide, Leg, Opened, Outcome, Report, Sending, TryLimits};
use super::release::Released;
use super::request::IoBufs;
use super::{record, upstream_request};
use crate::mesh::caps::Admitted;
use crate::mesh::load::InFlight;
use crate::mesh::messages::HedgeEvent;
use crate::mesh::Record;
use crate::path::state::PooledBufs;

/// The first attempt, picked and admitted, and when its hedge follows.
pub struct First<'s> {
    pub target: TargetId,
    pub admitted: Admitted<'s>,
    pub load_at_send: u64,
    pub client: ClientSide,
    pub limits: TryLimits,
    /// How long after the first attempt's start the hedge is sent.
    pub after: Duration,
}

/// What a hedged attempt came to.
pub struct Hedged {
    /// The attempt whose outcome stands: the winner, or the hedge when both failed.
    pub leg: Attempted,
    /// The other leg's target, when a hedge was sent (its attempt is recorded already).
    pub other: Option<TargetId>,
}

/// What the race needs beside its buffers.
#[derive(Clone, Copy)]
struct Plan<'a, 's> {
    ex: &'a Exchange<'s>,
    watch: &'a Reader,
    first: FirstLeg,
    /// When the hedge is sent, after the first leg's start.
    after: Duration,
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

/// The first leg's terms, once its place is held.
#[derive(Clone, Copy)]
struct FirstLeg {
    target: TargetId,
    load_at_send: u64,
    client: ClientSide,
    limits: TryLimits,
}

/// What the two legs came to when the race ended, with what they reported.
struct Raced<'s> {
    first: FirstLeg,
    /// The first leg's places, held until it ends (dropped at once when the hedge wins).
    held: Option<(Released<'s>, InFlight<'s>)>,
    /// The first leg's head (`None`: still running when the race ended, now dropped).
    a: Option<Opened>,
    /// The hedge: `None` never ended, `Some(None)` none was sent.
    b: Option<Option<Second<'s>>>,
    first_report: Report,
    second_report: Report,
    /// The hedge's target, its load when sent and its client side, once sent.
    sent: Sent,
}

/// Runs the first attempt with a hedge `after` its start (see the module's documentation);
/// the winner's response is relayed to the client.
pub async fn exchange<'s>(
    ex: &Exchange<'s>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    first: First<'s>,
) -> Hedged {
    let state = ex.state;
    let held = (
        Released::new(first.admitted, &state.core.waiters),
        state.load.enter(first.target),
    );
    let leg = FirstLeg {
        target: first.target,
        load_at_send: first.load_at_send,
        client: first.client,
        limits: first.limits,
    };
    let mut raced = Raced {
        first: leg,
        held: Some(held),
        a: None,
        b: None,
        first_report: Report::default(),
        second_report: Report::default(),
        sent: Cell::new(None),
    };
    let plan = Plan {
        ex,
        watch: &io.reader,
        first: leg,
        after: first.after,
    };
    race_legs(plan, bufs, &mut raced).await;
    let a_failed = matches!(raced.a, Some(Opened::Done(Outcome::Failed(_))));
    // The first leg stands when it answered, or when no hedge opened; the hedge when it
    // answered first, or when both failed (it is the later attempt).
    let second_won = (raced.a.is_none() || a_failed) && matches!(raced.b, Some(Some(_)));
    if second_won {
        drop(raced.held.take());
        second_stands(ex, io, bufs, raced).await
    } else {
        first_stands(ex, io, bufs, raced).await
    }
}

/// Runs the first leg and, once `after` has passed without its head, the hedge, until one
/// of them answers (or sees the client leave), or both have failed. Leaving drops a leg
/// still running: its connection closes at once, so its engine aborts.
async fn race_legs<'s>(plan: Plan<'_, 's>, bufs: &mut IoBufs, raced: &mut Raced<'s>) {
    let hedge_at = monoio::time::Instant::now() + plan.after;
    let (a, b) = (&mut raced.a, &mut raced.b);
    let to = Sending {
        state: plan.ex.state,
        tid: plan.first.target,
        watch: plan.watch,
        limits: plan.first.limits,
    };
    let mut a_leg = pin!(relay::open(to, bufs, &mut raced.first_report));
    let mut sleep = pin!(monoio::time::sleep_until(hedge_at));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(o) = a_leg.as_mut().poll(cx) {
            *a = Some(o);
            return Poll::Ready(());
        }
        sleep.as_mut().poll(cx).map(|_| ())
    })
    .await;
    if a.is_some() {
        return;
    }
    let mut b_leg = pin!(launch(plan, &mut raced.second_report, &raced.sent));
    std::future::poll_fn(|cx| {
        if a.is_none() {
            if let Poll::Ready(o) = a_leg.as_mut().poll(cx) {
                *a = Some(o);
            }
        }
        if b.is_none() {
            if let Poll::Ready(s) = b_leg.as_mut().poll(cx) {
                *b = Some(s);
            }
        }
        let a_failed = matches!(a, Some(Opened::Done(Outcome::Failed(_))));
        let b_failed = match &b {
            Some(Some(s)) => matches!(s.opened, Opened::Done(Outcome::Failed(_))),
            Some(None) => true,
            None => false,
        };
        // A leg that answered (or saw the client leave) ends the race; one that failed
        // leaves it to the other.
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

/// The first leg's outcome stands: a hedge sent meanwhile lost, and is recorded as such.
async fn first_stands<'s>(
    ex: &Exchange<'s>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    raced: Raced<'s>,
) -> Hedged {
    let Raced {
        first,
        held,
        a,
        b,
        mut first_report,
        second_report,
        sent,
    } = raced;
    let hedge = sent.get();
    if let Some((t, load, _)) = hedge {
        let outcome = match b {
            Some(Some(Second {
                opened: Opened::Done(o),
                ..
            })) => o,
            // Still running (dropped above) or answered too late: cancelled.
            _ => Outcome::ClientGone,
        };
        let lost = Attempted {
            target: t,
            outcome,
            report: second_report,
            load_at_send: load,
        };
        record::attempt(ex, &lost);
    }
    let outcome = match a.expect("the first leg ended the race") {
        Opened::Done(o) => o,
        Opened::Head(start) => {
            let mut held = held;
            let leg = Leg {
                state: ex.state,
                target: first.target,
                client: first.client,
                limits: first.limits,
                held: &mut held,
                report: &mut first_report,
            };
            relay::relay(io, bufs, start, leg).await
        }
    };
    Hedged {
        leg: Attempted {
            target: first.target,
            outcome,
            report: first_report,
            load_at_send: first.load_at_send,
        },
        other: hedge.map(|h| h.0),
    }
}

/// The hedge's outcome stands: it answered first, or both failed. The first leg is
/// recorded as it ended (cancelled when it was still running).
async fn second_stands<'s>(
    ex: &Exchange<'s>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    raced: Raced<'s>,
) -> Hedged {
    let (state, routed) = (ex.state, ex.routed);
    let Raced {
        first,
        // Dropped already: the hedge won.
        held: _,
        a,
        b: Some(Some(second)),
        first_report,
        mut second_report,
        sent,
    } = raced
    else {
        unreachable!("the hedge won")
    };
    let (t, load, client) = sent.get().expect("a hedge that opened was sent");
    let first_outcome = match a {
        Some(Opened::Done(o)) => o,
        _ => Outcome::ClientGone,
    };
    let tid = first.target;
    let lost = Attempted {
        target: tid,
        outcome: first_outcome,
        report: first_report,
        load_at_send: first.load_at_send,
    };
    record::attempt(ex, &lost);
    let outcome = match second.opened {
        Opened::Done(o) => o,
        Opened::Head(start) => {
            state.links.record(Record::Hedge {
                route: routed.index as u16,
                event: HedgeEvent::Won,
            });
            // The winner's head and what followed it are in the hedge's buffer set.
            let mut spare = second.bufs;
            std::mem::swap(&mut bufs.ubuf, &mut spare.ubuf);
            std::mem::swap(&mut bufs.hdrs, &mut spare.hdrs);
            let mut held = Some(second.held);
            let leg = Leg {
                state,
                target: t,
                client,
                limits: first.limits,
                held: &mut held,
                report: &mut second_report,
            };
            relay::relay(io, bufs, start, leg).await
        }
    };
    Hedged {
        leg: Attempted {
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
async fn launch<'s>(plan: Plan<'_, 's>, report: &mut Report, sent: &Sent) -> Option<Second<'s>> {
    let (ex, state, routed) = (plan.ex, plan.ex.state, plan.ex.routed);
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
    let ask = Ask {
        routed,
        preq: ex.pick,
        tried: &[plan.first.target],
        admit: &ex.admit,
        waited: None,
    };
    let picked = match pick::pick(state, ask, Instant::now()).await {
        Ok(p) => p,
        Err(_) => return skipped("no_target"),
    };
    let t = picked.target;
    let mut bufs = state.core.take_bufs();
    let now = picked.at;
    record::routed(ex, t, now, picked.pick.score);
    if let Some(loader) = &rs.adapters {
        loader
            .ensure(
                &state.upstream,
                &state.links,
                t,
                ex.pick.model,
                picked.residency,
                &mut bufs.side,
            )
            .await;
    }
    upstream_request::build_leg(&mut bufs.up, ex, t);
    let load_at_send = state.load.load(t);
    let held = (
        Released::new(picked.admitted, &state.core.waiters),
        state.load.enter(t),
    );
    let mut client = plan.first.client;
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
        ..plan.first.limits
    };
    let to = Sending {
        state,
        tid: t,
        watch: plan.watch,
        limits,
    };
    let opened = relay::open(to, &mut bufs, report).await;
    Some(Second { opened, held, bufs })
}
