//! The attempt layer of a disaggregated route (`disaggregation`): each request is prefilled
//! on an engine of the route's prefill pool and decoded on one of its decode pool, as two
//! exchanges of their own ([`Exchange`]): one over the prefill pool's route (its strategy,
//! its inputs, the prefill targets it tried), one over the route itself (the decode pool).
//! Each leg is picked, admitted, sent, recorded and learnt from as any attempt is, so what
//! each pool's strategy learns comes from its own legs only.
//!
//! - `vllm`: the prefill leg first (the client's body with `kv_transfer_params` asking for a
//!   remote decode, one token, no stream; its answer read whole, not relayed); then the
//!   decode leg, the client's body with the prefill's `kv_transfer_params`, relayed as any
//!   attempt. The transfer parameters name one prefill's blocks, so a decode that fails
//!   before the client saw a byte is retried with a fresh prefill.
//! - `sglang`: both legs at once with the same `bootstrap_host`, `bootstrap_port` and
//!   `bootstrap_room` (the decode engine fetches the KV cache from the prefill engine's
//!   bootstrap server). The prefill's answer is drained; the decode's head is relayed once
//!   the prefill's answer has ended well, so a prefill failure fails the attempt before any
//!   byte reached the client, and a new pair (a new room) is tried. A prefill that answers
//!   with a status the route does not retry, or a decode that refuses the request (a 4xx),
//!   ends the pair at once: that answer goes to the client and the other leg is dropped.
//!
//! A leg's failure is retried within the route's `retries` (counted over both legs), its
//! `retry_on`, its deadline and the pool's retry budget; a prefill answer that is not a
//! success and not retried is relayed to the client as the engine's answer.
//!
//! Owns the order of the legs and the pairing of their retries. It must not relay bytes
//! itself (`relay`), read a whole answer (`drain`) or write a body (`leg_body`).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;

use rolter_codec::api::fields::Fields;
use rolter_codec::{GatewayError, UpstreamFailure};
use rolter_config::PdProtocol;

use super::attempt::{self, Next};
use super::client::{ClientIo, Fate};
use super::drain;
use super::exchange::{Attempted, Exchange};
use super::leg_body::{self, LegBody};
use super::pick::Picked;
use super::relay::{self, Leg, Opened, Outcome, Report, Sending};
use super::release::Released;
use super::request::IoBufs;
use super::{queue, record, upstream_request};
use crate::access_log::Flags;
use crate::mesh::load::InFlight;

/// Which pool a leg ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Prefill,
    Decode,
}

/// What one try of the pair came to.
enum Pair {
    /// The client was answered (or went away): the connection's fate.
    Done(Fate),
    /// A leg failed before any byte reached the client.
    Failed {
        pool: Pool,
        e: GatewayError,
        /// Other candidates the failed leg's pool had.
        others: usize,
    },
    /// No candidate could be picked in a pool.
    NoCandidate(Pool, GatewayError),
}

/// The two exchanges of one disaggregated request.
pub struct Legs<'p, 'e, 's> {
    pub prefill: &'p mut Exchange<'s>,
    pub decode: &'e mut Exchange<'s>,
}

/// Prefills and decodes until the request is answered; the connection's fate afterwards.
pub async fn until_answered(legs: Legs<'_, '_, '_>, io: &mut ClientIo, bufs: &mut IoBufs) -> Fate {
    let Legs { prefill, decode } = legs;
    let state = decode.state;
    let protocol = decode
        .routed
        .route
        .disaggregation
        .map_or(PdProtocol::Vllm, |d| d.protocol);
    // Each pool's retry budget counts the route's requests.
    for ex in [&*prefill, &*decode] {
        state.routes[ex.routed.index]
            .retry_budget
            .request(ex.attempts.started);
    }
    let mut failures = 0;
    loop {
        let tried = match protocol {
            PdProtocol::Vllm => vllm(prefill, decode, io, bufs, failures).await,
            PdProtocol::Sglang => sglang(prefill, decode, io, bufs, failures).await,
        };
        let (pool, e, others) = match tried {
            Pair::Done(fate) => return fate,
            Pair::NoCandidate(pool, e) => {
                let ex = match pool {
                    Pool::Prefill => &mut *prefill,
                    Pool::Decode => &mut *decode,
                };
                return attempt::no_candidate(ex, io, bufs, e).await;
            }
            Pair::Failed { pool, e, others } => (pool, e, others),
        };
        failures += 1;
        let ex = match pool {
            Pool::Prefill => &mut *prefill,
            Pool::Decode => &mut *decode,
        };
        let left = retries_left(ex, failures, others);
        match attempt::after_failure(ex, io, e, left).await {
            Next::Retry(e) => ex.attempts.last_err = Some(e),
            Next::Answer(e) => return attempt::answer(ex, io, bufs, &e).await,
            Next::ClientGone => return Fate::Close,
        }
    }
}

/// The retries a request still has after `failures` failed legs: the route's `retries`
/// count both pools' failures, and a pool can retry only on another candidate.
fn retries_left(ex: &Exchange<'_>, failures: usize, others: usize) -> usize {
    (ex.routed.route.retries as usize)
        .saturating_sub(failures.saturating_sub(1))
        .min(others)
}

/// Picks in `ex`'s pool among the candidates it has not failed on.
async fn pick<'s>(ex: &Exchange<'s>, io: &ClientIo) -> Result<Picked<'s>, GatewayError> {
    queue::pick(ex.state, ex.ask(), ex.attempts.request_end, &io.reader).await
}

/// A leg's places held while it runs: the target's place under `max_concurrent` and its
/// in-flight count.
type Held<'s> = (Released<'s>, InFlight<'s>);

/// A picked leg ready to send: its request written into its buffers, the strategy told.
struct Ready<'s> {
    picked: Picked<'s>,
    load_at_send: u64,
}

/// Tells the strategy where the leg goes and writes its request into `bufs.up`.
fn prepare<'s>(ex: &mut Exchange<'s>, picked: Picked<'s>, bufs: &mut IoBufs) -> Ready<'s> {
    let state = ex.state;
    ex.served.fallback = picked.pick.fallback.or(ex.served.fallback);
    record::routed(ex, picked.target, picked.at, picked.pick.score);
    upstream_request::build_leg(&mut bufs.up, ex, picked.target);
    Ready {
        load_at_send: state.load.load(picked.target),
        picked,
    }
}

/// Records a finished leg and notes it in its exchange; a failed one is tried no more.
fn finish(ex: &mut Exchange<'_>, a: &Attempted) {
    record::attempt(ex, a);
    attempt::note(&mut ex.served, a);
    ex.served.last_time = a.report.sent.map(|t| t.elapsed());
    ex.attempts
        .note(a.target, matches!(a.outcome, Outcome::Failed(_)));
    ex.served.attempts = ex.attempts.n as u8;
}

/// vLLM's pair: the prefill leg, then the decode leg with its transfer parameters, one
/// after the other on the request's buffers (the prefill's answer in `bufs.body`, which the
/// request's own body has left).
async fn vllm(
    pre: &mut Exchange<'_>,
    ex: &mut Exchange<'_>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    failures: usize,
) -> Pair {
    let state = ex.state;
    let picked = match pick(pre, io).await {
        Ok(p) => p,
        Err(e) => return Pair::NoCandidate(Pool::Prefill, e),
    };
    let others = picked.others;
    pre.body = LegBody::vllm_prefill();
    let ready = prepare(pre, picked, bufs);
    let left = retries_left(pre, failures + 1, others);
    let (mut a, whole) = prefill_leg(pre, io, bufs, ready, left).await;
    if whole {
        match transfer_params(&bufs.body, &state.config.targets[a.target].name) {
            Ok(p) => ex.body = LegBody::vllm_decode(p),
            Err(e) => {
                // Not the answer a prefill gives: the target failed the leg.
                a.report.completed = false;
                a.outcome = Outcome::Failed(e);
            }
        }
    }
    bufs.body.clear();
    finish(pre, &a);
    match a.outcome {
        Outcome::Relayed { close } if !whole => {
            // The prefill engine's own answer (an error it gave) went to the client.
            return Pair::Done(if close { Fate::Close } else { Fate::KeepAlive });
        }
        Outcome::Relayed { .. } => {}
        Outcome::ClientGone => return gone(ex),
        Outcome::Failed(e) => {
            return Pair::Failed {
                pool: Pool::Prefill,
                e,
                others,
            }
        }
    }
    decode_alone(ex, io, bufs, failures).await
}

/// The decode leg of vLLM's pair, relayed to the client as any attempt is.
async fn decode_alone(
    ex: &mut Exchange<'_>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    failures: usize,
) -> Pair {
    let state = ex.state;
    let picked = match pick(ex, io).await {
        Ok(p) => p,
        Err(e) => return Pair::NoCandidate(Pool::Decode, e),
    };
    let others = picked.others;
    let ready = prepare(ex, picked, bufs);
    let left = retries_left(ex, failures + 1, others);
    let (client, limits) = attempt::leg_terms(ex, &ready.picked, left);
    let tid = ready.picked.target;
    let mut report = Report::default();
    let mut held: Option<Held<'_>> = Some((
        Released::new(ready.picked.admitted, &state.core.waiters),
        state.load.enter(tid),
    ));
    let leg = Leg {
        state,
        target: tid,
        client,
        limits,
        held: &mut held,
        report: &mut report,
    };
    let outcome = relay::exchange(io, bufs, leg).await;
    drop(held);
    let a = Attempted {
        target: tid,
        outcome,
        report,
        load_at_send: ready.load_at_send,
    };
    finish(ex, &a);
    decoded(ex, a, others)
}

/// What the decode leg's outcome makes of the pair.
fn decoded(ex: &mut Exchange<'_>, a: Attempted, others: usize) -> Pair {
    match a.outcome {
        Outcome::Relayed { close } => Pair::Done(if close { Fate::Close } else { Fate::KeepAlive }),
        Outcome::ClientGone => gone(ex),
        Outcome::Failed(e) => Pair::Failed {
            pool: Pool::Decode,
            e,
            others,
        },
    }
}

/// The client went away.
fn gone(ex: &mut Exchange<'_>) -> Pair {
    ex.served.flags.insert(Flags::DC);
    Pair::Done(Fate::Close)
}

/// Runs a prefill leg: opened, its answer read whole (into `pbufs.body`; `true` then) when
/// it is a success, relayed to the client when it is an answer the route does not retry.
async fn prefill_leg(
    pre: &Exchange<'_>,
    io: &mut ClientIo,
    pbufs: &mut IoBufs,
    ready: Ready<'_>,
    retries_left: usize,
) -> (Attempted, bool) {
    let state = pre.state;
    let (client, limits) = attempt::leg_terms(pre, &ready.picked, retries_left);
    let tid = ready.picked.target;
    let mut report = Report::default();
    let mut held: Option<Held<'_>> = Some((
        Released::new(ready.picked.admitted, &state.core.waiters),
        state.load.enter(tid),
    ));
    let to = Sending {
        state,
        tid,
        watch: &io.reader,
        limits,
    };
    let opened = Box::pin(relay::open(to, pbufs, &mut report)).await;
    let (outcome, prefilled) = match opened {
        Opened::Done(o) => (o, false),
        Opened::Head(start) if (200..300).contains(&start.head.status) => {
            match drain::read_whole(to, pbufs, start, &mut report).await {
                // Read whole, as a relayed answer is: a success for the target.
                Ok(()) => (Outcome::Relayed { close: false }, true),
                Err(o) => (o, false),
            }
        }
        Opened::Head(start) => {
            let leg = Leg {
                state,
                target: tid,
                client,
                limits,
                held: &mut held,
                report: &mut report,
            };
            (relay::relay(io, pbufs, start, leg).await, false)
        }
    };
    drop(held);
    let a = Attempted {
        target: tid,
        outcome,
        report,
        load_at_send: ready.load_at_send,
    };
    (a, prefilled)
}

/// The `kv_transfer_params` of a vLLM prefill answer, verbatim; the failure when it has none.
fn transfer_params(answer: &[u8], target: &str) -> Result<String, GatewayError> {
    let params = Fields::parse(answer)
        .ok()
        .and_then(|f| f.get("kv_transfer_params"))
        .map(|v| v.get())
        .filter(|v| *v != "null");
    params.map(str::to_string).ok_or_else(|| {
        GatewayError::upstream(
            UpstreamFailure::BadResponse,
            format!("target `{target}` answered the prefill without kv_transfer_params: is it started with a KV connector (--kv-transfer-config with kv_role kv_producer or kv_both)?"),
        )
    })
}

/// SGLang's pair: both legs at once with the same bootstrap fields; the decode relayed once
/// the prefill's answer has ended well.
async fn sglang<'s>(
    pre: &mut Exchange<'s>,
    ex: &mut Exchange<'s>,
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    failures: usize,
) -> Pair {
    let state = ex.state;
    let p = match pick(pre, io).await {
        Ok(p) => p,
        Err(e) => return Pair::NoCandidate(Pool::Prefill, e),
    };
    let d = match pick(ex, io).await {
        Ok(d) => d,
        Err(e) => return Pair::NoCandidate(Pool::Decode, e),
    };
    let (p_others, d_others) = (p.others, d.others);
    let prefill_target = &state.config.targets[p.target];
    let batch = ex.fields.and_then(Fields::batch_size);
    let rooms: Vec<u64> = (0..batch.unwrap_or(1).max(1))
        .map(|_| leg_body::bootstrap_room())
        .collect();
    let body = LegBody::sglang(
        &leg_body::bootstrap_host(prefill_target),
        prefill_target.bootstrap_port,
        &rooms,
        batch.is_some(),
    );
    pre.body = body.clone();
    ex.body = body;
    let mut pbufs = state.core.take_bufs();
    let p = prepare(pre, p, &mut pbufs);
    let d = prepare(ex, d, bufs);
    let (p_left, d_left) = (
        retries_left(pre, failures + 1, p_others),
        retries_left(ex, failures + 1, d_others),
    );
    let both = Both {
        pre: &mut *pre,
        ex: &mut *ex,
        io: &mut *io,
        p,
        d,
        p_left,
        d_left,
    };
    let ran = both.run(&mut pbufs, bufs).await;
    drop(pbufs);
    match ran {
        Ran::PrefillFailed(e) => Pair::Failed {
            pool: Pool::Prefill,
            e,
            others: p_others,
        },
        Ran::Decoded(a) => decoded(ex, a, d_others),
        Ran::PrefillAnswered(close) => {
            Pair::Done(if close { Fate::Close } else { Fate::KeepAlive })
        }
        Ran::Gone => gone(ex),
    }
}

/// SGLang's two legs, picked and written, with the retries each leaves.
struct Both<'a, 's> {
    pre: &'a mut Exchange<'s>,
    ex: &'a mut Exchange<'s>,
    io: &'a mut ClientIo,
    p: Ready<'s>,
    d: Ready<'s>,
    p_left: usize,
    d_left: usize,
}

/// What running both legs came to (each recorded already).
enum Ran {
    /// The prefill failed before any byte reached the client.
    PrefillFailed(GatewayError),
    /// The decode leg ended (relayed, or failed before a byte reached the client).
    Decoded(Attempted),
    /// The prefill engine's own answer went to the client (the connection closes after it
    /// when `true`).
    PrefillAnswered(bool),
    /// The client went away.
    Gone,
}

impl Both<'_, '_> {
    /// Sends both legs, waits for the prefill's answer to end and the decode's head, then
    /// relays the decode's answer; or relays at once the answer of a leg that answered
    /// with a status the route does not retry (the other leg dropped).
    async fn run(self, pbufs: &mut IoBufs, bufs: &mut IoBufs) -> Ran {
        let Both {
            pre,
            ex,
            io,
            p,
            d,
            p_left,
            d_left,
        } = self;
        let state = ex.state;
        let (p_client, p_limits) = attempt::leg_terms(pre, &p.picked, p_left);
        let (d_client, d_limits) = attempt::leg_terms(ex, &d.picked, d_left);
        let (pt, dt) = (p.picked.target, d.picked.target);
        let mut p_held: Option<Held<'_>> = Some((
            Released::new(p.picked.admitted, &state.core.waiters),
            state.load.enter(pt),
        ));
        let mut d_held: Option<Held<'_>> = Some((
            Released::new(d.picked.admitted, &state.core.waiters),
            state.load.enter(dt),
        ));
        let (mut p_report, mut d_report) = (Report::default(), Report::default());
        let p_to = Sending {
            state,
            tid: pt,
            watch: &io.reader,
            limits: p_limits,
        };
        let d_to = Sending {
            tid: dt,
            limits: d_limits,
            ..p_to
        };
        let (p_end, d_opened) = {
            let prefill = async {
                match relay::open(p_to, pbufs, &mut p_report).await {
                    Opened::Head(start) if (200..300).contains(&start.head.status) => {
                        match drain::read_whole(p_to, pbufs, start, &mut p_report).await {
                            Ok(()) => PrefillEnd::Whole,
                            Err(o) => PrefillEnd::Failed(o),
                        }
                    }
                    Opened::Head(start) => PrefillEnd::Answer(start),
                    Opened::Done(o) => PrefillEnd::Failed(o),
                }
            };
            until_both(prefill, relay::open(d_to, bufs, &mut d_report), pair_over).await
        };
        let mut prefill = Ended {
            target: pt,
            end: None,
            report: p_report,
            load_at_send: p.load_at_send,
        };
        match p_end {
            Some(PrefillEnd::Answer(start)) => {
                drop((d_opened, d_held));
                let answer = Answer {
                    client: p_client,
                    limits: p_limits,
                    held: &mut p_held,
                };
                return prefill.answer(pre, io, pbufs, start, answer).await;
            }
            Some(PrefillEnd::Whole) => prefill.end = Some(Ok(())),
            Some(PrefillEnd::Failed(o)) => prefill.end = Some(Err(o)),
            None => {}
        }
        drop(p_held);
        match prefill.record(pre) {
            Some(Ok(e)) => return Ran::PrefillFailed(e),
            Some(Err(())) => return Ran::Gone,
            None => {}
        }
        let outcome = match d_opened {
            Some(Opened::Done(o)) => o,
            Some(Opened::Head(start)) => {
                let leg = Leg {
                    state,
                    target: dt,
                    client: d_client,
                    limits: d_limits,
                    held: &mut d_held,
                    report: &mut d_report,
                };
                relay::relay(io, bufs, start, leg).await
            }
            None => Outcome::ClientGone,
        };
        drop(d_held);
        let a = Attempted {
            target: dt,
            outcome,
            report: d_report,
            load_at_send: d.load_at_send,
        };
        finish(ex, &a);
        Ran::Decoded(a)
    }
}

/// How SGLang's prefill leg ended.
enum PrefillEnd {
    /// Its answer was a success, read whole.
    Whole,
    /// It answered with a status the route does not retry: that answer is the client's.
    Answer(relay::ResponseStart),
    /// It failed before any byte reached the client, or the client went away.
    Failed(Outcome),
}

/// Whether the wait for both legs is over: either leg failed, the prefill answered with a
/// status that is not a success, or the decode refused the request itself (a 4xx): that
/// answer is the client's and the other leg is dropped; or the prefill's answer has ended
/// and the decode's head is in. A decode's 5xx waits for the prefill: a decode engine that
/// cannot fetch from a dead prefill engine answers one, and the prefill's failure then
/// decides (a new pair), not the decode's answer.
fn pair_over(p: &Option<PrefillEnd>, d: &Option<Opened>) -> bool {
    let decode_refused = matches!(d, Some(Opened::Head(s)) if (400..500).contains(&s.head.status));
    matches!(p, Some(PrefillEnd::Answer(_) | PrefillEnd::Failed(_)))
        || matches!(d, Some(Opened::Done(_)))
        || decode_refused
        || (p.is_some() && d.is_some())
}

/// SGLang's prefill leg as the wait for both legs left it.
struct Ended {
    target: usize,
    /// `None`: still running when the wait ended, and dropped (its engine sees the
    /// close); `Err`: an outcome other than an answer read whole.
    end: Option<Result<(), Outcome>>,
    report: Report,
    load_at_send: u64,
}

/// What relaying a prefill's own answer needs beside its buffers.
struct Answer<'h, 's> {
    client: relay::ClientSide,
    limits: relay::TryLimits,
    held: &'h mut Option<Held<'s>>,
}

impl Ended {
    /// Relays the prefill engine's own answer (an error it gave) to the client, and
    /// records the leg.
    async fn answer(
        mut self,
        pre: &mut Exchange<'_>,
        io: &mut ClientIo,
        pbufs: &mut IoBufs,
        start: relay::ResponseStart,
        answer: Answer<'_, '_>,
    ) -> Ran {
        let leg = Leg {
            state: pre.state,
            target: self.target,
            client: answer.client,
            limits: answer.limits,
            held: answer.held,
            report: &mut self.report,
        };
        let outcome = relay::relay(io, pbufs, start, leg).await;
        let close = matches!(outcome, Outcome::Relayed { close: true });
        self.end = Some(Err(outcome));
        match self.record(pre) {
            Some(Ok(e)) => Ran::PrefillFailed(e),
            Some(Err(())) => Ran::Gone,
            None => Ran::PrefillAnswered(close),
        }
    }

    /// Records the leg when it ended; its failure (`Err` when the client went away), if
    /// it failed.
    fn record(self, pre: &mut Exchange<'_>) -> Option<Result<GatewayError, ()>> {
        let outcome = match self.end? {
            // Read whole, as a relayed answer is: a success for the target.
            Ok(()) => Outcome::Relayed { close: false },
            Err(o) => o,
        };
        let failed = match &outcome {
            Outcome::Failed(e) => Some(Ok(e.clone())),
            Outcome::ClientGone => Some(Err(())),
            Outcome::Relayed { .. } => None,
        };
        let a = Attempted {
            target: self.target,
            outcome,
            report: self.report,
            load_at_send: self.load_at_send,
        };
        finish(pre, &a);
        failed
    }
}

/// Polls both legs until `over` says the wait is over; a leg still running then is
/// dropped (`None`).
async fn until_both<P: Future, D: Future>(
    prefill: P,
    decode: D,
    over: impl Fn(&Option<P::Output>, &Option<D::Output>) -> bool,
) -> (Option<P::Output>, Option<D::Output>) {
    let mut prefill = pin!(prefill);
    let mut decode = pin!(decode);
    let (mut p, mut d) = (None, None);
    poll_fn(|cx| {
        if p.is_none() {
            if let Poll::Ready(r) = prefill.as_mut().poll(cx) {
                p = Some(r);
            }
        }
        if d.is_none() {
            if let Poll::Ready(r) = decode.as_mut().poll(cx) {
                d = Some(r);
            }
        }
        if over(&p, &d) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (p, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Waker};

    /// A future that is pending `n` times, then ready with `v`.
    fn after<T: Unpin>(n: usize, v: T) -> impl Future<Output = T> {
        let (mut left, mut v) = (n, Some(v));
        poll_fn(move |cx| {
            if left == 0 {
                return Poll::Ready(v.take().unwrap());
            }
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    fn run<F: Future>(f: F) -> F::Output {
        let mut f = pin!(f);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    fn failed() -> Outcome {
        Outcome::Failed(GatewayError::upstream(UpstreamFailure::ConnectFailed, "x"))
    }

    /// The wait's rule in the tests: a failure ends it, else both results.
    fn over(p: &Option<Result<(), Outcome>>, d: &Option<Opened>) -> bool {
        matches!(p, Some(Err(_)))
            || matches!(d, Some(Opened::Done(_)))
            || (p.is_some() && d.is_some())
    }

    #[test]
    fn until_both_ends_when_either_leg_fails() {
        // A decode that ended before its head ends the wait at once: the prefill still
        // running is dropped.
        let (p, d) = run(until_both(
            after(5, Ok(())),
            after(1, Opened::Done(Outcome::ClientGone)),
            over,
        ));
        assert!(p.is_none());
        assert!(matches!(d, Some(Opened::Done(Outcome::ClientGone))));
        let (p, d) = run(until_both(
            after(0, Err(failed())),
            after(9, Opened::Done(failed())),
            over,
        ));
        assert!(matches!(p, Some(Err(Outcome::Failed(_)))));
        assert!(d.is_none(), "a failed prefill stops the decode");
    }

    #[test]
    fn until_both_waits_for_both_when_neither_fails() {
        struct Never;
        impl Future for Never {
            type Output = Opened;
            fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Opened> {
                Poll::Pending
            }
        }
        // A successful prefill alone does not end the wait.
        let mut f = pin!(until_both(after(0, Ok(())), Never, over));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..10 {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
    }

    #[test]
    fn pair_over_stops_at_a_prefill_answer_or_failure() {
        assert!(!pair_over(&None, &None));
        assert!(!pair_over(&Some(PrefillEnd::Whole), &None));
        assert!(pair_over(&Some(PrefillEnd::Failed(failed())), &None));
        assert!(pair_over(&None, &Some(Opened::Done(failed()))));
        assert!(pair_over(
            &Some(PrefillEnd::Whole),
            &Some(Opened::Done(Outcome::ClientGone))
        ));
    }
}
