//! Stage 5 of the request path: attempts on the chosen targets until one answers the client. Each
//! attempt picks (among the candidates not tried yet), tells the strategy where the request
//! went, loads the model's LoRA adapter there first when the route asks, writes the
//! upstream request and runs the exchange; a failure before any byte reached the client is
//! retried on another target while `retries` and the candidates allow and the failure says
//! a retry is safe.
//!
//! Owns the retry decision. It must not relay bytes itself (that is `relay`) and never
//! retries once the client has seen a byte of the answer.

use std::time::Instant;

use rolter_codec::{GatewayError, Retry};
use rolter_core::PickRequest;

use super::client::{respond, ClientIo, Fate};
use super::inputs::Inputs;
use super::relay::{self, ClientSide, Explain, Outcome, Report};
use super::request::{IoBufs, Request};
use super::route::Routed;
use super::{pick, record, upstream_request};
use crate::path::state::WorkerState;

/// Most attempts one request can make (first try plus the largest `retries`).
const MAX_ATTEMPTS: usize = 11;

/// Tries targets until the request is answered; the connection's fate afterwards.
pub async fn until_answered(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    routed: &Routed<'_>,
    inputs: &Inputs,
    preq: &PickRequest<'_>,
) -> Fate {
    let write_timeout = state.config.server.limits.write_timeout;
    let explain = req.header("x-rolter-explain").is_some_and(|v| v == b"1");
    let rs = &state.routes[routed.index];
    let mut tried = [usize::MAX; MAX_ATTEMPTS];
    let mut attempts = 0usize;
    let mut last_err: Option<GatewayError> = None;
    loop {
        // One clock read serves the pick and the routing record.
        let now = Instant::now();
        let picked = match pick::pick(state, routed, preq, &tried[..attempts], now) {
            Ok(p) => p,
            Err(e) => {
                let e = last_err.take().unwrap_or(e);
                state.record_gateway(e.status, e.code);
                return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
            }
        };
        let tid = picked.target;
        record::routed(state, routed, preq, inputs, tid, now);
        if let Some(loader) = &rs.adapters {
            loader
                .ensure(
                    &state.upstream,
                    &state.links,
                    tid,
                    preq.model,
                    picked.residency,
                    &mut bufs.side,
                )
                .await;
        }
        let retries_left = (routed.route.retries as usize)
            .saturating_sub(attempts)
            .min(picked.others);
        let target = &state.config.targets[tid];
        upstream_request::build(&mut bufs.up, req, &routed.facts, routed.route, target);
        let load_at_send = state.load.load(tid);
        let mut report = Report::default();
        let client = ClientSide {
            http10: req.head.http10,
            close: req.close,
            explain: explain.then_some(Explain {
                route: routed.index,
                score: picked.pick.score,
                fallback: picked.pick.fallback,
                attempt: attempts + 1,
            }),
        };
        let outcome = {
            let _in_flight = state.load.enter(tid);
            relay::exchange(
                state,
                tid,
                &mut io.wr,
                &io.reader,
                bufs,
                client,
                retries_left > 0,
                &mut report,
            )
            .await
        };
        record::attempt(
            state,
            routed.index,
            tid,
            preq,
            &outcome,
            &report,
            load_at_send,
        );
        tried[attempts] = tid;
        attempts += 1;
        match outcome {
            Outcome::Relayed { close } => return if close { Fate::Close } else { Fate::KeepAlive },
            Outcome::ClientGone => return Fate::Close,
            Outcome::Failed(e) => {
                if e.retry == Retry::Allowed && retries_left > 0 && attempts < MAX_ATTEMPTS {
                    last_err = Some(e);
                    continue;
                }
                return respond(&mut io.wr, &mut bufs.out, &e, req.close, write_timeout).await;
            }
        }
    }
}
