//! One upstream exchange: take a pooled connection or connect, write the request, read the
//! response head, and stream the body to the client as it arrives.
//!
//! Every upstream read is raced against the client-disconnect watch and a deadline (the
//! first-byte timeout until the head arrives, the idle timeout after: a coarse one, as the
//! write timeout of the body's writes). A stream whose events come far apart lends no read
//! buffer between them ([`PARK_UPSTREAM_AFTER`]). Each upstream read
//! becomes one client write, so an SSE event is never held back. A client that goes away
//! drops the upstream connection at once (the engine sees the close and aborts). A failure
//! after bytes reached the client ends the stream with an SSE error event and no terminal
//! chunk, never a clean end. Only a cleanly finished exchange returns its connection to the
//! pool. This module must not retry: it reports whether a retry is safe.

use std::io;
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::time::Instant;

use rolter_codec::api::deltas::DeltaCounter;
use rolter_codec::api::sequence::last_sequence_number;
use rolter_codec::api::usage;
use rolter_codec::api::usage_chunk::UsageChunkCut;
use rolter_codec::h1::chunked::{encode_chunk, encode_chunk_parts, ChunkedDecoder, LAST_CHUNK};
use rolter_codec::h1::request_id::RequestId;
use rolter_codec::h1::response_head::{self, RespFraming, ResponseHead};
use rolter_codec::h1::write::{write_content_length, write_header, write_status_line};
use rolter_codec::translate::Reply;
use rolter_codec::{GatewayError, Surface, UpstreamFailure};
use rolter_config::RetryOn;
use rolter_core::Usage;

use super::client::ClientIo;
use super::idle_timer::IdleDeadline;
use super::race::{race, race_idle, Race};
use super::reader::Reader;
use super::request::{IoBufs, MAX_UPSTREAM_READ, MIN_UPSTREAM_READ};
use crate::access_log::Cut;
use crate::path::state::WorkerState;
use crate::upstream::conn::UpstreamConn;
use crate::upstream::connect::ConnectError;
use crate::upstream::reuse::{with_connection, Step};

/// How an exchange ended.
pub enum Outcome {
    /// The response went to the client (completely, or cut off with an error signalled).
    Relayed { close: bool },
    /// The client went away; the upstream connection was dropped.
    ClientGone,
    /// Nothing reached the client; the caller answers or retries.
    Failed(GatewayError),
}

/// What one exchange observed, for learning, health and metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    /// When the request was written upstream.
    pub sent: Option<std::time::Instant>,
    /// The final response status (0 when no response head arrived).
    pub status: u16,
    /// When the final response head arrived.
    pub head: Option<std::time::Instant>,
    /// When the first response body byte arrived (the head, for an empty body).
    pub first_byte: Option<std::time::Instant>,
    /// The response is an event stream: its first body byte is its first token's. A plain
    /// answer's first byte comes when generation has ended, so it tells nothing of TTFT.
    pub streamed: bool,
    /// The response was relayed to its end.
    pub completed: bool,
    /// Token usage found in a successful response.
    pub usage: Option<Usage>,
    /// The status line the client received from this exchange (0: none).
    pub client_status: u16,
    /// Bytes written to the client by this exchange.
    pub bytes_out: u64,
    /// How the response was cut off after it started reaching the client, if it was.
    pub cut: Option<Cut>,
    /// Non-empty content deltas in a successful event stream (an estimate of its
    /// completion tokens when it reports no usage).
    pub deltas: u32,
    /// How long the target asked to be left alone: a 429 with `Retry-After` or
    /// `x-ratelimit-reset-*`, or a 503 with `Retry-After`.
    pub wait: Option<std::time::Duration>,
}

/// What the relay needs to know about the client's side of the exchange.
#[derive(Debug, Clone, Copy)]
pub struct ClientSide {
    /// An HTTP/1.0 client: no chunked framing; the connection closes after the response.
    pub http10: bool,
    /// The client asked to close after this exchange.
    pub close: bool,
    /// `x-rolter-explain: 1`: say in the response head why this target was chosen.
    pub explain: Option<Explain>,
    /// Returned in the response head.
    pub request_id: RequestId,
    /// The API called: the shape of the error event that ends a cut stream.
    pub surface: Surface,
}

/// Why a request went where it did, for `x-rolter-explain`.
#[derive(Debug, Clone, Copy)]
pub struct Explain {
    pub route: usize,
    /// The winning score, when the strategy scores.
    pub score: Option<f64>,
    /// The fallback the strategy took, if any.
    pub fallback: Option<&'static str>,
    /// Attempt number (1 = first try).
    pub attempt: usize,
}

/// What bounds one exchange and which failures the attempt stage may retry.
#[derive(Debug, Clone, Copy)]
pub struct TryLimits {
    /// The failures that may still be retried (`RetryOn::NONE` on the last attempt): a
    /// response with such a status is held back from the client and reported as failed.
    pub retry_on: RetryOn,
    /// The route's `per_try_timeout` from the attempt's start; without it, the target's
    /// first_byte timeout from the request being written.
    pub per_try_end: Option<Instant>,
    /// The route's `deadline` for the whole request.
    pub request_end: Option<Instant>,
}

impl TryLimits {
    /// When the response head must have arrived, for a request written now.
    fn first_byte_by(&self, first_byte: std::time::Duration) -> Instant {
        let by = self
            .per_try_end
            .unwrap_or_else(|| Instant::now() + first_byte);
        self.request_end.map_or(by, |end| by.min(end))
    }

    /// Whether the request's deadline (not the attempt's) has passed.
    fn past_request_end(&self) -> bool {
        self.request_end.is_some_and(|end| Instant::now() >= end)
    }
}

/// Runs one exchange on `leg`'s target: [`open`], then [`relay`] of the response.
/// `bufs.up` holds the request bytes; what happened is written to `leg.report` as it
/// happens.
pub async fn exchange<H>(io: &mut ClientIo, bufs: &mut IoBufs, leg: Leg<'_, H>) -> Outcome {
    let to = Sending {
        state: leg.state,
        tid: leg.target,
        watch: &io.reader,
        limits: leg.limits,
    };
    // Boxed: the head's wait (a runtime timer among it) is over before the body streams,
    // and a long stream should not carry its space for as long as it lasts.
    let opening = Box::pin(open(to, bufs, leg.report));
    match opening.await {
        Opened::Done(outcome) => outcome,
        Opened::Head(start) => relay(io, bufs, start, leg).await,
    }
}

/// What opening an exchange gave.
pub enum Opened {
    /// A response head to relay (its bytes in `bufs.hdrs`, what followed it in `bufs.ubuf`).
    Head(ResponseStart),
    /// The exchange is over before any byte reached the client: a failure (a status the
    /// attempt stage may retry included), or the client went away.
    Done(Outcome),
}

/// A response whose head was read, with the connection it arrived on.
pub struct ResponseStart {
    pub up: UpstreamConn,
    pub head: ResponseHead,
}

/// Where an exchange goes and what bounds its wait for the head.
#[derive(Clone, Copy)]
pub struct Sending<'a> {
    pub state: &'a WorkerState,
    /// The target.
    pub tid: usize,
    /// The client's disconnect watch.
    pub watch: &'a Reader,
    pub limits: TryLimits,
}

/// The first half of an exchange with target `to.tid`, up to the response head: on a
/// pooled connection or a fresh one (once more on a fresh one when the pooled one turns out
/// closed before it took the request), the request (`bufs.up`) written and the head read.
/// A status `to.limits.retry_on` names is held back from the client and reported as failed.
/// Dropping the future closes its connection, so the engine sees the abort.
pub async fn open(to: Sending<'_>, bufs: &mut IoBufs, report: &mut Report) -> Opened {
    let Sending {
        state,
        tid,
        watch,
        limits,
    } = to;
    if let Some(e) = bufs.up.refused.take() {
        // A body the target's API cannot carry: answered, never sent.
        return Opened::Done(Outcome::Failed(e));
    }
    // The buffer for the client's bytes is not needed before the head arrives (which can
    // take as long as the engine's queue): the worker keeps it meanwhile.
    state.core.give_back(&mut bufs.out);
    let target = &state.config.targets[tid];
    let pooled = state.upstream.pooled(tid);
    let fresh = async || {
        // connect() enforces its own timeout; the outer deadline only backs it up.
        let mut deadline =
            Instant::now() + target.timeouts.connect + std::time::Duration::from_secs(1);
        if let Some(end) = limits
            .per_try_end
            .into_iter()
            .chain(limits.request_end)
            .min()
        {
            deadline = deadline.min(end);
        }
        // Boxed: a fresh connection is the rarer case (the pool serves most), and the
        // connect (with a TLS handshake) would otherwise widen every exchange's state.
        match race(Box::pin(state.upstream.connect(tid)), watch, deadline).await {
            Race::Done(Ok(s)) => Ok(s),
            Race::Done(Err(e)) => {
                let kind = match e {
                    ConnectError::TimedOut { .. } => UpstreamFailure::ConnectTimeout,
                    ConnectError::Tcp(_) => UpstreamFailure::ConnectFailed,
                    ConnectError::Tls(_) => UpstreamFailure::TlsFailed,
                };
                Err(Opened::Done(Outcome::Failed(GatewayError::upstream(
                    kind,
                    format!("could not connect to target `{}`: {e}", target.name),
                ))))
            }
            Race::ClientGone => Err(Opened::Done(Outcome::ClientGone)),
            Race::TimedOut => Err(Opened::Done(Outcome::Failed(GatewayError::upstream(
                UpstreamFailure::ConnectTimeout,
                format!("connecting to target `{}` timed out", target.name),
            )))),
        }
    };
    // A stale answer on a fresh connection stands (`with_connection`).
    with_connection(pooled, fresh, async |up, _reused| match send_and_read_head(
        to, up, bufs, report,
    )
    .await
    {
        Head::Stale(o) => Step::Stale(Opened::Done(o)),
        Head::Failed(o) => Step::Done(Opened::Done(o)),
        Head::Read(up, head) => {
            report.status = head.status;
            report.head = Some(std::time::Instant::now());
            if head.status == 429 || (head.status == 503 && head.retry_after.is_some()) {
                report.wait = head.wait;
            }
            if limits.retry_on.status(head.status) {
                let mut e = GatewayError::upstream(
                    UpstreamFailure::Refused(head.status),
                    format!("target `{}` answered {}", target.name, head.status),
                );
                e.retry_after = head.retry_after;
                return Step::Done(Opened::Done(Outcome::Failed(e)));
            }
            Step::Done(Opened::Head(ResponseStart { up, head }))
        }
    })
    .await
}

/// What writing the request and reading the response head gave.
enum Head {
    /// The head, with the connection it arrived on.
    Read(UpstreamConn, ResponseHead),
    /// The connection was closed before any response byte (the keep-alive race): the
    /// engine never took the request. The outcome stands when the connection was fresh
    /// (`with_connection` tries a fresh one after a pooled one only).
    Stale(Outcome),
    Failed(Outcome),
}

/// Writes the request (`bufs.up`) on `up` and reads the response head, skipping interim
/// (1xx) responses.
async fn send_and_read_head(
    to: Sending<'_>,
    mut up: UpstreamConn,
    bufs: &mut IoBufs,
    report: &mut Report,
) -> Head {
    let target = &to.state.config.targets[to.tid];
    let req = std::mem::take(&mut bufs.up);
    let deadline = to.limits.first_byte_by(target.timeouts.first_byte);
    match race(req.write_to(&mut up), to.watch, deadline).await {
        Race::Done((Ok(()), req)) => {
            bufs.up = req;
            report.sent = Some(std::time::Instant::now());
        }
        Race::Done((Err(e), req)) => {
            bufs.up = req;
            let failed = Outcome::Failed(GatewayError::upstream(
                UpstreamFailure::WriteFailed,
                format!(
                    "sending the request to target `{}` failed: {e}",
                    target.name
                ),
            ));
            return Head::Stale(failed);
        }
        Race::ClientGone => return Head::Failed(Outcome::ClientGone),
        Race::TimedOut => {
            return Head::Failed(Outcome::Failed(first_byte_timeout(
                &target.name,
                &to.limits,
            )))
        }
    }
    // The head is read in this same function, not in one it awaits: the exchange's future
    // is then moved once less on every request.
    bufs.ubuf.clear();
    let mut answered = false;
    loop {
        match buffered_head(&target.name, bufs) {
            Ok(Some(h)) => return Head::Read(up, h),
            Ok(None) => {}
            Err(failed) => return Head::Failed(failed),
        }
        bufs.ubuf.reserve(MIN_UPSTREAM_READ);
        // A Vec read fills from index 0: read into the spare capacity so a partial head
        // already buffered is kept.
        let len = bufs.ubuf.len();
        let ub = std::mem::take(&mut bufs.ubuf).slice_mut(len..);
        match race(up.read(ub), to.watch, deadline).await {
            Race::Done((Ok(n), ub)) if n > 0 => {
                to.state.core.activity.note();
                bufs.ubuf = ub.into_inner();
                answered = true;
            }
            Race::Done((res, ub)) => {
                bufs.ubuf = ub.into_inner();
                return closed_before_head(to, &up, res, answered);
            }
            Race::ClientGone => return Head::Failed(Outcome::ClientGone),
            Race::TimedOut => {
                return Head::Failed(Outcome::Failed(first_byte_timeout(
                    &target.name,
                    &to.limits,
                )))
            }
        }
    }
}

/// The response head whole in `bufs.ubuf`, if it is, into `bufs.hdrs` (what follows it
/// stays in `bufs.ubuf`), past any interim (1xx) responses: several heads can arrive in one
/// read. A malformed head, or a protocol switch, is a bad response of target `name`.
fn buffered_head(name: &str, bufs: &mut IoBufs) -> Result<Option<ResponseHead>, Outcome> {
    loop {
        bufs.hdrs.clear();
        match response_head::parse(&bufs.ubuf, false, &mut bufs.hdrs) {
            Ok(Some(h)) if h.status == 101 => return Err(Outcome::Failed(bad_response(name))),
            Ok(Some(h)) if (100..200).contains(&h.status) => {
                bufs.ubuf.drain(..h.len);
            }
            Ok(head) => return Ok(head),
            Err(_) => return Err(Outcome::Failed(bad_response(name))),
        }
    }
}

/// The connection ended (`res`: a read of 0 bytes or an error) before a whole response
/// head; `answered` when some of it had arrived.
fn closed_before_head(
    to: Sending<'_>,
    up: &UpstreamConn,
    res: io::Result<usize>,
    answered: bool,
) -> Head {
    let target = &to.state.config.targets[to.tid];
    let closed = match &res {
        Ok(n) => *n == 0,
        Err(e) => up.is_unclean_eof(e),
    };
    let why = match res {
        Err(e) => e.to_string(),
        Ok(_) => "connection closed".to_string(),
    };
    // Before any response byte the engine cannot have answered: a retry is allowed
    // (`reset_before_response`), after one it is not.
    let failed = Outcome::Failed(GatewayError::upstream(
        if answered {
            UpstreamFailure::ClosedInHead
        } else {
            UpstreamFailure::ClosedBeforeResponse
        },
        format!("target `{}` closed before answering: {why}", target.name),
    ));
    // A pooled connection closed (FIN, for TLS with or without close_notify) before any
    // response byte: the keep-alive race, where the engine closed it as idle and never took
    // the request; it is tried once on a fresh one, whatever the route's retry policy. A
    // reset (RST), or a close of a fresh connection, is the attempt stage's to retry
    // (`reset_before_response`); any byte (even an interim response) means the engine took
    // it: no retry.
    if !answered && closed {
        Head::Stale(failed)
    } else {
        Head::Failed(failed)
    }
}

fn first_byte_timeout(name: &str, limits: &TryLimits) -> GatewayError {
    let within = if limits.past_request_end() {
        "the route's deadline"
    } else if limits.per_try_end.is_some() {
        "the route's per_try_timeout"
    } else {
        "its first_byte timeout"
    };
    GatewayError::upstream(
        UpstreamFailure::FirstByteTimeout,
        format!("target `{name}` did not answer within {within}"),
    )
}

fn bad_response(name: &str) -> GatewayError {
    GatewayError::upstream(
        UpstreamFailure::BadResponse,
        format!("target `{name}` sent a malformed response head"),
    )
}

/// How the body relay loop ended.
enum StreamEnd {
    Complete,
    ClientGone,
    /// The upstream failed after bytes reached the client.
    UpstreamFailed,
    /// The gateway's drain grace ran out with the stream still running.
    ShutdownCut,
    /// The upstream went idle past its timeout after bytes reached the client.
    UpstreamTimedOut,
}

/// Body progress for one response.
enum BodyState {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    Empty,
}

/// One attempt's exchange as the relay sees it: the target, the client's side, what
/// bounds it, the places it holds and where it reports what happened.
pub struct Leg<'a, H> {
    pub state: &'a WorkerState,
    pub target: usize,
    pub client: ClientSide,
    pub limits: TryLimits,
    /// The target's place under `max_concurrent` and its in-flight count: released once
    /// the engine is done (before the last bytes reach the client), or when the exchange
    /// ends, however it ends.
    pub held: &'a mut Option<H>,
    pub report: &'a mut Report,
}

/// The copy of one response body to the client: its framing both ways, what the relayed
/// bytes said so far, and the upstream reads' sizing.
struct BodyCopy {
    body: BodyState,
    tail: SseTail,
    /// The client gets chunked framing (the engine's body is chunked or close-delimited).
    client_chunked: bool,
    /// Usage is looked for only in successful responses.
    scan_usage: bool,
    /// The body is complete.
    done: bool,
    /// Bytes beyond the body's end were seen: the connection is unusable.
    overrun: bool,
    /// The next upstream read's size.
    read_size: usize,
    /// The next read waits for readiness before taking a buffer.
    park: bool,
    /// The last read's byte count: a parked read expects about as many.
    last_n: usize,
    /// The response status, for the client's record.
    status: u16,
    idle: Duration,
    write_timeout: Duration,
    surface: Surface,
    /// The answer's translation into the client's API, when the request was translated.
    translation: Option<Box<Translating>>,
    /// The stream's usage event, kept from the client, when the gateway asked for it on the
    /// client's behalf (`stream_usage = "ask"`): its counts are the stream's.
    usage_cut: Option<Box<UsageChunkCut>>,
    /// The engine was asked for the stream's usage (by the gateway or the client): its
    /// content deltas are not counted.
    expect_usage: bool,
}

/// Whether the engine was asked for a stream's usage.
#[derive(Clone, Copy)]
struct Expected {
    /// By the gateway, on the client's behalf: the usage event is cut.
    asked: bool,
    /// By either, from an engine that reports it as far as this core knows.
    reported: bool,
}

/// The largest whole answer translated (a long completion is a few hundred kilobytes):
/// a larger one is a bad response.
const MAX_TRANSLATED_BODY: usize = 16 << 20;

/// An answer on its way from the engine's API to the client's.
struct Translating {
    reply: Reply,
    /// The answer is an event stream, translated event by event (else a whole body,
    /// gathered in `whole` and translated at its end).
    events: bool,
    whole: Vec<u8>,
    /// The client's bytes of what was fed last, before framing.
    out: Vec<u8>,
}

impl Translating {
    /// Translates `data` of the engine's body; `done` when the body ends with it. `Err`
    /// when the answer cannot be translated: a success body that is not the engine's API's,
    /// or an event stream that ended before its API's end.
    fn feed(&mut self, status: u16, data: &[u8], done: bool) -> Result<(), ()> {
        self.out.clear();
        if self.events {
            self.reply.events(data, &mut self.out);
            if self.reply.overflowed() || (done && !self.reply.finish(&mut self.out)) {
                return Err(());
            }
        } else {
            if self.whole.len() + data.len() > MAX_TRANSLATED_BODY {
                return Err(());
            }
            self.whole.extend_from_slice(data);
            if done {
                let whole = std::mem::take(&mut self.whole);
                self.reply
                    .whole(status, &whole, &mut self.out)
                    .map_err(|_| ())?;
            }
        }
        Ok(())
    }
}

/// The second half of an exchange: streams the response whose head [`open`] read to the
/// client, then ends it cleanly or with the error event of a cut stream.
pub async fn relay<H>(
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    start: ResponseStart,
    mut leg: Leg<'_, H>,
) -> Outcome {
    let ResponseStart { up, head } = start;
    let state = leg.state;
    let reply = bufs.up.reply.take();
    let usage = Expected {
        asked: bufs.up.asked_usage,
        reported: bufs.up.usage_expected,
    };
    leg.report.streamed = head.is_sse;
    // The request went out and its answer has begun: its bytes are not needed again (a
    // retry rebuilds them), so the buffer serves other requests while this one streams.
    state.core.give_back(&mut bufs.up.bytes);
    state.core.lend(&mut bufs.out);
    let (mut copy, close_client) = response_head(&head, bufs, &leg, (reply, usage));
    let first = &bufs.ubuf[head.len..];
    if copy.scan_usage && !first.is_empty() {
        leg.report.usage = usage::scan(first).or(leg.report.usage);
    }
    if copy.feed(first, &mut bufs.out).is_err() {
        // Nothing has reached the client yet: a plain 502, not a cut-off stream.
        let name = &state.config.targets[leg.target].name;
        return Outcome::Failed(bad_response(name));
    }
    if copy.tail.sent || copy.done {
        leg.report.first_byte = Some(std::time::Instant::now());
    }
    // A read that filled its buffer (the head's too) leaves more queued: the next read takes
    // all it can, so a burst of events moves in one read and one write.
    copy.read_size = next_read_size(bufs.ubuf.len(), bufs.ubuf.capacity());
    copy.last_n = bufs.ubuf.len();
    let mut up = up;
    let end = copy_body(io, bufs, &mut up, &mut copy, &mut leg).await;
    leg.report.deltas = copy.tail.deltas.count();
    if let Some(u) = copy.usage_cut.as_ref().and_then(|c| c.usage()) {
        leg.report.usage = Some(u);
    }
    if copy.expect_usage && leg.report.usage.is_none() && matches!(end, StreamEnd::Complete) {
        // Asked and not told: this core counts the target's streams from now on.
        state.usage_unreported(leg.target);
    }
    match end {
        StreamEnd::Complete => leg.report.completed = true,
        StreamEnd::ClientGone => {
            leg.report.cut = Some(Cut::ClientGone);
            return Outcome::ClientGone;
        }
        StreamEnd::UpstreamFailed | StreamEnd::UpstreamTimedOut | StreamEnd::ShutdownCut => {
            let (cut, err) = cut_error(end, &state.config.targets[leg.target].name);
            leg.report.cut = Some(cut);
            // Boxed: the rare ending, which a stream's future should not be sized for.
            let ending = Ending {
                head: &head,
                copy: &copy,
                err: &err,
            };
            return Box::pin(fail_midstream(io, &mut bufs.out, ending, leg.report)).await;
        }
    }
    if head.keep_alive && !copy.overrun && !matches!(copy.body, BodyState::UntilClose) {
        state
            .upstream
            .pool
            .put(leg.target, up, Instant::now().into_std());
    }
    Outcome::Relayed {
        close: close_client,
    }
}

/// Writes the client's response head into `bufs.out` (the engine's headers, the gateway's,
/// the framing); the body copy it sets up, and whether the client's connection closes
/// after it. `reply` translates the answer; `usage` says whether the engine was asked for
/// the stream's usage.
fn response_head<H>(
    head: &ResponseHead,
    bufs: &mut IoBufs,
    leg: &Leg<'_, H>,
    (reply, usage): (Option<Box<Reply>>, Expected),
) -> (BodyCopy, bool) {
    let state = leg.state;
    let target = &state.config.targets[leg.target];
    let client = &leg.client;
    let success = (200..300).contains(&head.status);
    let stream = head.is_sse && success && reply.is_none();
    let usage_cut = (usage.asked && stream).then(|| Box::new(UsageChunkCut::new()));
    // The cut finds the usage; everything else is scanned for it.
    let scan_usage = success && usage_cut.is_none();
    let translation = reply.map(|reply| {
        Box::new(Translating {
            // An error is translated whole, whatever its framing says.
            events: head.is_sse && scan_usage,
            reply: *reply,
            whole: Vec::new(),
            out: Vec::new(),
        })
    });
    // A translated body's length is known only at its end: it goes chunked (or, to an
    // HTTP/1.0 client, until the close).
    let reframed = translation.is_some() || usage_cut.is_some();
    let client_chunked = !client.http10
        && (reframed || matches!(head.framing, RespFraming::Chunked | RespFraming::Close));
    let out = &mut bufs.out;
    out.clear();
    write_status_line(out, head.status);
    out.extend_from_slice(&bufs.hdrs);
    write_header(out, b"x-request-id", client.request_id.as_bytes());
    write_header(out, b"x-rolter-target", target.name.as_bytes());
    if let Some(x) = client.explain {
        write_explain(state, &x, out);
    }
    let body = body_framing(head, client_chunked, reframed, out);
    // An HTTP/1.0 client learns the end of an unframed body from the close; a client that
    // asked to close, or a draining gateway, says so in the response (RFC 9112 §9.6).
    let close_client =
        client.http10 || client.close || state.core.draining.get() || (reframed && !client_chunked);
    if close_client {
        write_header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    let copy = BodyCopy {
        body,
        tail: SseTail {
            count_deltas: head.is_sse && success && !(usage.reported && stream),
            track_sequence: head.is_sse
                && client.surface == Surface::Responses
                && translation.is_none(),
            ..SseTail::default()
        },
        client_chunked,
        scan_usage,
        done: false,
        overrun: false,
        read_size: MIN_UPSTREAM_READ,
        park: false,
        last_n: 0,
        status: head.status,
        idle: target.timeouts.idle,
        write_timeout: state.config.server.limits.write_timeout,
        surface: client.surface,
        translation,
        usage_cut,
        expect_usage: usage.reported && stream,
    };
    (copy, close_client)
}

/// `x-rolter-explain: 1`: why the request went where it did, as response headers.
fn write_explain(state: &WorkerState, x: &Explain, out: &mut Vec<u8>) {
    let route = &state.config.routes[x.route];
    write_header(out, b"x-rolter-route", route.name.as_bytes());
    write_header(out, b"x-rolter-strategy", route.strategy.name().as_bytes());
    match x.score {
        // Explaining is opt-in per request, so formatting here is acceptable.
        Some(s) if s.is_finite() => {
            write_header(out, b"x-rolter-score", format!("{s:.6}").as_bytes())
        }
        _ => write_header(out, b"x-rolter-score", b"none"),
    }
    if let Some(f) = x.fallback {
        write_header(out, b"x-rolter-fallback", f.as_bytes());
    }
    let mut b = itoa::Buffer::new();
    write_header(out, b"x-rolter-attempt", b.format(x.attempt).as_bytes());
    write_header(out, b"x-rolter-worker", b.format(state.id).as_bytes());
}

/// The framing headers of the client's response, and how the engine's body is read. A
/// reframed body (translated, or with the usage event cut) has no length of its own.
fn body_framing(
    head: &ResponseHead,
    client_chunked: bool,
    reframed: bool,
    out: &mut Vec<u8>,
) -> BodyState {
    if reframed {
        if client_chunked {
            write_header(out, b"transfer-encoding", b"chunked");
        }
        return match head.framing {
            RespFraming::Length(0) | RespFraming::Empty => BodyState::Empty,
            RespFraming::Length(n) => BodyState::Length(n),
            RespFraming::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
            RespFraming::Close => BodyState::UntilClose,
        };
    }
    match head.framing {
        RespFraming::Length(n) => {
            write_content_length(out, n);
            if n == 0 {
                BodyState::Empty
            } else {
                BodyState::Length(n)
            }
        }
        RespFraming::Chunked => {
            if client_chunked {
                write_header(out, b"transfer-encoding", b"chunked");
            }
            BodyState::Chunked(ChunkedDecoder::new())
        }
        RespFraming::Close => {
            if client_chunked {
                write_header(out, b"transfer-encoding", b"chunked");
            }
            BodyState::UntilClose
        }
        RespFraming::Empty => {
            if head.status != 204 && head.status != 304 {
                write_content_length(out, 0);
            }
            BodyState::Empty
        }
    }
}

impl BodyCopy {
    /// Appends body bytes from `data` to `out` in the client's framing; notes whether the
    /// body is complete and whether bytes beyond its end were seen.
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
        if self.translation.is_some() {
            return self.feed_translated(data, out);
        }
        let (client_chunked, tail) = (self.client_chunked, &mut self.tail);
        let mut cut = self.usage_cut.as_deref_mut();
        let cutting = cut.is_some();
        let mut emit = |out: &mut Vec<u8>, d: &[u8]| match cut.as_deref_mut() {
            Some(c) => c.feed(d, |kept| relay_parts(tail, client_chunked, out, kept)),
            None => relay_bytes(tail, client_chunked, out, d),
        };
        let (done, overrun) = match &mut self.body {
            BodyState::Empty => (true, !data.is_empty()),
            BodyState::Length(remaining) => {
                let take = (*remaining).min(data.len() as u64) as usize;
                // A length-framed body goes to the client as it is (`response_head` chunks
                // it only when it cuts the usage event from it).
                debug_assert!(
                    !client_chunked || cutting,
                    "a length-framed body is never rechunked"
                );
                emit(out, &data[..take]);
                *remaining -= take as u64;
                (*remaining == 0, take < data.len())
            }
            BodyState::Chunked(dec) => {
                let n = dec.feed(data, |d| emit(out, d)).map_err(|_| ())?;
                (dec.is_done(), n < data.len())
            }
            BodyState::UntilClose => {
                emit(out, data);
                (false, false)
            }
        };
        self.done = done;
        self.overrun |= overrun;
        if done {
            self.end_cut(out);
        }
        Ok(())
    }

    /// The body ended: an unfinished last event the usage cut held goes out.
    fn end_cut(&mut self, out: &mut Vec<u8>) {
        let (client_chunked, tail) = (self.client_chunked, &mut self.tail);
        if let Some(c) = self.usage_cut.as_deref_mut() {
            c.finish(|held| relay_parts(tail, client_chunked, out, held));
        }
    }

    /// [`feed`](Self::feed) of a translated answer: the engine's body bytes are unframed,
    /// translated, and what the client gets of them framed.
    fn feed_translated(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
        let Some(t) = self.translation.as_deref_mut() else {
            return Ok(());
        };
        let mut body = std::mem::take(&mut t.whole);
        let start = body.len();
        let (done, overrun) = match &mut self.body {
            BodyState::Empty => (true, !data.is_empty()),
            // The end of a close-delimited body (`copy_body` saw the close).
            BodyState::UntilClose if self.done => (true, false),
            BodyState::Length(remaining) => {
                let take = (*remaining).min(data.len() as u64) as usize;
                body.extend_from_slice(&data[..take]);
                *remaining -= take as u64;
                (*remaining == 0, take < data.len())
            }
            BodyState::Chunked(dec) => {
                let n = dec
                    .feed(data, |d| body.extend_from_slice(d))
                    .map_err(|_| ())?;
                (dec.is_done(), n < data.len())
            }
            BodyState::UntilClose => {
                body.extend_from_slice(data);
                (false, false)
            }
        };
        self.done = done;
        self.overrun |= overrun;
        let status = self.status;
        if t.events {
            // The stream's new bytes are translated now; nothing is kept of them here, and
            // the buffer serves the next read's.
            let fed = t.feed(status, &body[start..], done);
            body.clear();
            t.whole = body;
            fed?;
        } else {
            t.whole = body;
            t.feed(status, &[], done)?;
        }
        if !t.out.is_empty() {
            self.tail.note(&t.out);
            if self.client_chunked {
                encode_chunk(out, &t.out);
            } else {
                out.extend_from_slice(&t.out);
            }
        }
        Ok(())
    }

    /// After a read of `n` bytes into `ubuf` (`parked`: into a buffer of its own): sizes
    /// the client's buffer and the next read, scans for usage and feeds the body.
    fn took(
        &mut self,
        state: &WorkerState,
        bufs: &mut IoBufs,
        n: usize,
        parked: bool,
        report: &mut Report,
    ) -> Result<(), ()> {
        self.last_n = n;
        if parked {
            // Its own small buffer, as the read's: a decode step's events arrive together
            // for every stream, and each holds its write's buffer until the write completes.
            bufs.out.reserve_exact(n + FRAMING_ROOM);
        } else {
            state.core.lend(&mut bufs.out);
        }
        self.read_size = if parked && n < MIN_UPSTREAM_READ {
            // After a parked read an ordinary small one (which takes the rest, when the
            // parked one filled its small buffer).
            MIN_UPSTREAM_READ
        } else {
            next_read_size(n, bufs.ubuf.capacity())
        };
        if self.scan_usage {
            report.usage = usage::scan(&bufs.ubuf).or(report.usage);
        }
        self.feed(&bufs.ubuf, &mut bufs.out)?;
        if report.first_byte.is_none() && (self.tail.sent || self.done) {
            report.first_byte = Some(std::time::Instant::now());
        }
        Ok(())
    }
}

/// Copies the body to the client as it arrives, one client write per upstream read, until
/// it is complete or the exchange ends otherwise.
async fn copy_body<H>(
    io: &mut ClientIo,
    bufs: &mut IoBufs,
    up: &mut UpstreamConn,
    copy: &mut BodyCopy,
    leg: &mut Leg<'_, H>,
) -> StreamEnd {
    let Leg {
        state,
        held,
        report,
        ..
    } = leg;
    loop {
        if copy.done {
            // The engine is done with the request: its place under `max_concurrent` is
            // free before the last bytes reach the client, so a client that sends its next
            // request the moment it has this answer finds the place free.
            drop(held.take());
            if copy.client_chunked {
                bufs.out.extend_from_slice(LAST_CHUNK);
            }
        }
        if !write_out(io, &mut bufs.out, copy, report).await {
            // The client is gone or stopped reading: drop the upstream so the engine aborts.
            return StreamEnd::ClientGone;
        }
        if copy.done {
            return StreamEnd::Complete;
        }
        // Between events a stream holds at most its upstream read's buffer: the one for the
        // client's bytes goes back to the worker until the next event arrives.
        state.core.give_back(&mut bufs.out);
        let waited = std::time::Instant::now();
        let cut = state.core.cut_at.get();
        let deadline = cut.map_or(waited + copy.idle, |c| (waited + copy.idle).min(c));
        let parked = copy.park && !up.is_tls();
        let size = if parked {
            parked_read_size(copy.last_n)
        } else {
            copy.read_size
        };
        let next = NextRead {
            size,
            deadline,
            park: parked,
        };
        let read = read_next(up, &io.reader, &mut bufs.ubuf, next).await;
        // Events as far apart as the last two: the next wait lends no buffer.
        copy.park = waited.elapsed() >= PARK_UPSTREAM_AFTER;
        match read {
            Race::Done(Ok(n)) if n > 0 => {
                state.core.activity.note();
                if copy.took(state, bufs, n, parked, report).is_err() {
                    return StreamEnd::UpstreamFailed;
                }
            }
            Race::Done(res) => {
                // Over TLS only a close_notify (`Ok(0)`) is a clean end; a bare TCP close is
                // a possible truncation and fails the stream.
                let clean_close = res.is_ok() || !up.is_tls();
                if !(matches!(copy.body, BodyState::UntilClose) && clean_close) {
                    return StreamEnd::UpstreamFailed;
                }
                // A close-delimited body ends cleanly at EOF.
                copy.done = true;
                if copy.usage_cut.is_some() {
                    state.core.lend(&mut bufs.out);
                    copy.end_cut(&mut bufs.out);
                }
                if copy.translation.is_some() {
                    state.core.lend(&mut bufs.out);
                    if copy.feed_translated(&[], &mut bufs.out).is_err() {
                        return StreamEnd::UpstreamFailed;
                    }
                }
            }
            Race::ClientGone => return StreamEnd::ClientGone,
            Race::TimedOut if cut.is_some_and(|c| std::time::Instant::now() >= c) => {
                return StreamEnd::ShutdownCut
            }
            Race::TimedOut => return StreamEnd::UpstreamTimedOut,
        }
    }
}

/// Writes what `out` holds to the client under the write timeout; `false` when the client
/// is gone or stopped reading.
async fn write_out(
    io: &mut ClientIo,
    out: &mut Vec<u8>,
    copy: &BodyCopy,
    report: &mut Report,
) -> bool {
    if out.is_empty() {
        return true;
    }
    let buf = std::mem::take(out);
    let deadline = IdleDeadline::after(copy.write_timeout);
    match race_idle(io.wr.write_all(buf), &io.reader, deadline).await {
        Race::Done((Ok(_), buf)) => {
            report.client_status = copy.status;
            report.bytes_out += buf.len() as u64;
            *out = buf;
            true
        }
        _ => false,
    }
}

/// How a stream that had started reaching the client was cut, and the error its last
/// event carries.
fn cut_error(end: StreamEnd, target: &str) -> (Cut, GatewayError) {
    match end {
        StreamEnd::ShutdownCut => (
            Cut::Shutdown,
            GatewayError::internal(
                503,
                "gateway_shutting_down",
                "the gateway is shutting down and its grace period ended; the answer is \
                 incomplete",
            ),
        ),
        _ => (
            if matches!(end, StreamEnd::UpstreamTimedOut) {
                Cut::UpstreamTimeout
            } else {
                Cut::UpstreamReset
            },
            GatewayError::upstream(
                UpstreamFailure::StreamInterrupted,
                format!(
                    "the upstream target `{target}` failed mid-stream; the answer is incomplete"
                ),
            ),
        ),
    }
}

/// A stream whose last wait for the engine's bytes lasted this long waits for the next
/// ones before lending a read buffer: slow streams (a large model's tokens, an engine
/// that pauses mid-answer) then hold no buffer between events, for one readiness wait more
/// per event (an io_uring poll, or under epoll a `poll(2)`). Bursts and fast streams never
/// park.
const PARK_UPSTREAM_AFTER: Duration = Duration::from_millis(20);

/// Room for a client write's framing beyond the bytes read: a chunk's size line and
/// CRLF, the last chunk.
const FRAMING_ROOM: usize = 32;

/// A parked read's size: twice the last read, rounded up to a power of two, from 512 bytes
/// to [`MIN_UPSTREAM_READ`]. A slow stream's events are alike in size; a larger one fills
/// the buffer and the next read (which does not park) takes the rest.
fn parked_read_size(last: usize) -> usize {
    (2 * last)
        .next_power_of_two()
        .clamp(PARKED_READ_MIN, MIN_UPSTREAM_READ)
}

const PARKED_READ_MIN: usize = 512;

/// How the next upstream read of a body is made.
#[derive(Clone, Copy)]
struct NextRead {
    size: usize,
    deadline: std::time::Instant,
    /// Wait for readiness before taking a buffer.
    park: bool,
}

/// Reads the stream's next bytes into `ubuf` (emptied for a read of `next.size`), racing
/// the client's disconnect and `next.deadline`. When `next.park` (plaintext only: a TLS
/// session may hold decrypted bytes already), the buffer is released until the connection
/// is readable and a new one of `size` taken then.
async fn read_next(
    up: &mut UpstreamConn,
    watch: &Reader,
    ubuf: &mut Vec<u8>,
    next: NextRead,
) -> Race<io::Result<usize>> {
    let NextRead {
        size,
        deadline,
        park,
    } = next;
    if let Some(readable) = up.readable().filter(|_| park) {
        *ubuf = Vec::new();
        match race_idle(readable, watch, IdleDeadline::at(deadline)).await {
            // Readable also means EOF or an error: the read below then reports it.
            Race::Done(_) => *ubuf = Vec::with_capacity(size),
            Race::ClientGone => return Race::ClientGone,
            Race::TimedOut => return Race::TimedOut,
        }
    }
    fit_read_buffer(ubuf, size);
    let buf = std::mem::take(ubuf);
    match race_idle(up.read(buf), watch, IdleDeadline::at(deadline)).await {
        Race::Done((res, buf)) => {
            *ubuf = buf;
            Race::Done(res)
        }
        Race::ClientGone => Race::ClientGone,
        Race::TimedOut => Race::TimedOut,
    }
}

/// The next upstream read's size after one that brought `n` bytes into `capacity`: the
/// largest after a full read, the same after a partial one still larger than the smallest
/// (a large body arriving slower than it is read), the smallest after a small one (an SSE
/// stream's events come one at a time and keep small buffers).
fn next_read_size(n: usize, capacity: usize) -> usize {
    if n >= capacity {
        MAX_UPSTREAM_READ
    } else if n > MIN_UPSTREAM_READ {
        capacity
    } else {
        MIN_UPSTREAM_READ
    }
}

/// Empties `buf` for a read of `size`: a buffer a burst grew to [`MAX_UPSTREAM_READ`] is
/// swapped for a small one once reads come back partial, so a stream that goes quiet
/// after a burst does not hold 64 KiB until it ends.
fn fit_read_buffer(buf: &mut Vec<u8>, size: usize) {
    buf.clear();
    if buf.capacity() > 4 * size {
        *buf = Vec::with_capacity(size);
    } else {
        buf.reserve(size);
    }
}

/// Relays body bytes `d` into `out` in the client's framing, noted by `tail`.
fn relay_bytes(tail: &mut SseTail, client_chunked: bool, out: &mut Vec<u8>, d: &[u8]) {
    tail.note(d);
    if client_chunked {
        encode_chunk(out, d);
    } else {
        out.extend_from_slice(d);
    }
}

/// Relays `parts` of the body, one after the other, as [`relay_bytes`] does one.
fn relay_parts(tail: &mut SseTail, client_chunked: bool, out: &mut Vec<u8>, parts: &[&[u8]]) {
    tail.note_parts(parts);
    if client_chunked {
        encode_chunk_parts(out, parts);
    } else {
        for p in parts {
            out.extend_from_slice(p);
        }
    }
}

/// Tracks whether the body bytes relayed so far end on an SSE event boundary, so the error
/// event follows without an empty event before it.
#[derive(Default)]
struct SseTail {
    /// The last three payload bytes (zeros before any).
    last: [u8; 3],
    sent: bool,
    /// Count the content deltas (a successful event stream).
    count_deltas: bool,
    deltas: DeltaCounter,
    /// Note the last `sequence_number` relayed (a Responses API stream).
    track_sequence: bool,
    sequence: Option<u64>,
}

impl SseTail {
    fn note(&mut self, payload: &[u8]) {
        if self.count_deltas {
            self.deltas.feed(payload);
        }
        if self.track_sequence {
            if let Some(n) = last_sequence_number(payload) {
                self.sequence = Some(n);
            }
        }
        for &b in payload.iter().rev().take(3).rev() {
            self.last = [self.last[1], self.last[2], b];
        }
        self.sent |= !payload.is_empty();
    }

    /// [`note`](Self::note) of `parts`, relayed one after the other: without per-byte work
    /// to do, only their last three bytes are looked at.
    fn note_parts(&mut self, parts: &[&[u8]]) {
        if self.count_deltas || self.track_sequence {
            return parts.iter().for_each(|p| self.note(p));
        }
        let (mut got, mut n) = ([0u8; 3], 0);
        for &b in parts.iter().rev().flat_map(|p| p.iter().rev()).take(3) {
            got[2 - n] = b;
            n += 1;
        }
        for &b in &got[3 - n..] {
            self.last = [self.last[1], self.last[2], b];
        }
        self.sent |= n > 0;
    }

    /// What must precede a new event: nothing before any byte or at an event boundary (two
    /// line ends, in any of SSE's CR/LF/CRLF spellings); otherwise a line end and a blank
    /// line, which end the cut-off event (an extra blank line is harmless to SSE parsers).
    fn separator(&self) -> &'static [u8] {
        let [a, b, c] = self.last;
        let boundary = matches!([b, c], [b'\n', b'\n'] | [b'\r', b'\r'] | [b'\n', b'\r'])
            || [a, b, c] == *b"\n\r\n";
        if !self.sent || boundary {
            b""
        } else {
            b"\n\n"
        }
    }
}

/// A cut stream's ending: its head, its copy so far and the error its last event carries.
struct Ending<'a> {
    head: &'a ResponseHead,
    copy: &'a BodyCopy,
    err: &'a GatewayError,
}

/// Ends a response whose upstream failed after bytes reached the client (or that the end of
/// a drain cuts): an SSE error event for event streams, in the shape of the API called
/// (`surface`), then a close without the terminal chunk, so no client mistakes the cut-off
/// for a complete answer.
async fn fail_midstream(
    io: &mut ClientIo,
    out: &mut Vec<u8>,
    ending: Ending<'_>,
    report: &mut Report,
) -> Outcome {
    let Ending { head, copy, err } = ending;
    out.clear();
    // The event can only follow a body whose end the client learns from the chunking or the
    // close: after a declared Content-Length it would read as part of a complete body.
    if head.is_sse && !matches!(head.framing, RespFraming::Length(_)) {
        let mut event = Vec::with_capacity(256);
        event.extend_from_slice(copy.tail.separator());
        let sequence = match &copy.translation {
            Some(t) => t.reply.sequence(),
            None => copy.tail.sequence,
        };
        event.extend_from_slice(&err.stream_event(copy.surface, sequence));
        if copy.client_chunked {
            encode_chunk(out, &event);
        } else {
            out.extend_from_slice(&event);
        }
        let buf = std::mem::take(out);
        let write = io.wr.write_all(buf);
        if let Ok((Ok(_), buf)) = monoio::time::timeout(copy.write_timeout, write).await {
            report.bytes_out += buf.len() as u64;
        }
    }
    io.wr.cut();
    let _ = monoio::time::timeout(copy.write_timeout, io.wr.shutdown()).await;
    Outcome::Relayed { close: true }
}

#[cfg(test)]
mod tests {
    use super::{
        fit_read_buffer, next_read_size, parked_read_size, SseTail, MAX_UPSTREAM_READ,
        MIN_UPSTREAM_READ,
    };

    #[test]
    fn a_parked_read_expects_about_the_last_ones_size() {
        assert_eq!(parked_read_size(0), 512);
        assert_eq!(parked_read_size(200), 512);
        assert_eq!(parked_read_size(300), 1024);
        assert_eq!(parked_read_size(1500), 4096);
        assert_eq!(parked_read_size(60_000), MIN_UPSTREAM_READ);
    }

    #[test]
    fn a_quiet_stream_after_a_burst_holds_a_small_buffer() {
        let mut buf = Vec::with_capacity(MAX_UPSTREAM_READ);
        buf.extend_from_slice(b"events");
        fit_read_buffer(&mut buf, MIN_UPSTREAM_READ);
        assert!(buf.is_empty());
        assert!((MIN_UPSTREAM_READ..2 * MIN_UPSTREAM_READ).contains(&buf.capacity()));
        // A burst's buffer is kept while bursts go on.
        let mut big = Vec::with_capacity(MAX_UPSTREAM_READ);
        let at = big.as_ptr();
        fit_read_buffer(&mut big, MAX_UPSTREAM_READ);
        assert_eq!((big.as_ptr(), big.capacity()), (at, MAX_UPSTREAM_READ));
    }

    #[test]
    fn a_full_read_makes_the_next_one_the_largest() {
        // A 15 KiB burst after a full 4 KiB head read: one more read takes the rest.
        assert_eq!(next_read_size(4096, 4096), MAX_UPSTREAM_READ);
        // One event at a time: the buffer stays small, even after a burst.
        assert_eq!(next_read_size(230, 4096), MIN_UPSTREAM_READ);
        assert_eq!(next_read_size(3000, MAX_UPSTREAM_READ), MIN_UPSTREAM_READ);
        // A large body read in part keeps its buffer (no shrinking and growing in turn).
        assert_eq!(next_read_size(11_000, MAX_UPSTREAM_READ), MAX_UPSTREAM_READ);
        assert_eq!(
            next_read_size(MAX_UPSTREAM_READ, MAX_UPSTREAM_READ),
            MAX_UPSTREAM_READ
        );
    }

    fn sep(parts: &[&[u8]]) -> &'static [u8] {
        let mut t = SseTail::default();
        for p in parts {
            t.note(p);
        }
        // Noted as one relayed part, or each piece as a part of its own: the same tail.
        let mut whole = SseTail::default();
        whole.note_parts(parts);
        let mut each = SseTail::default();
        parts.iter().for_each(|p| each.note_parts(&[p]));
        for other in [&whole, &each] {
            assert_eq!((other.last, other.sent), (t.last, t.sent), "{parts:?}");
        }
        t.separator()
    }

    #[test]
    fn error_event_separator_follows_the_relayed_tail() {
        assert_eq!(sep(&[]), b"");
        assert_eq!(sep(&[b"data: {}\n\n"]), b"");
        assert_eq!(sep(&[b"data: {}\n", b"\n"]), b"");
        assert_eq!(sep(&[b"data: {}\r\n\r\n"]), b"");
        assert_eq!(sep(&[b"data: {}\r\r"]), b"");
        assert_eq!(sep(&[b"data: {}\n\n", b"data: {\"a\""]), b"\n\n");
        assert_eq!(sep(&[b"data: {}\n"]), b"\n\n");
        assert_eq!(sep(&[b"data: {}\r\n"]), b"\n\n");
        assert_eq!(sep(&[b"data: {}\n\n", b"d", b"a"]), b"\n\n");
        assert_eq!(sep(&[b"data: {}\n", b"", b"\n", b""]), b"");
        assert_eq!(sep(&[b"\n", b"x", b"\n"]), b"\n\n");
    }
}
