//! The client connection loop: read a head, read the body, answer the gateway's own
//! endpoints or forward, and keep the connection alive for the next (possibly pipelined)
//! request.
//!
//! A connection beyond `server.max_connections` (counted over every worker, `mesh::caps`)
//! is answered 503 `too_many_connections` with `Connection: close` before anything is
//! read, and closed (on a TLS listener it is closed without an answer, before any
//! handshake).
//!
//! With `[server.tls]` the TLS handshake runs first, within `server.tls.handshake_timeout`
//! (a connection that does not finish it is closed, and counted by reason); the requests
//! then see the same limits and timeouts as on plaintext.
//!
//! Owns the client socket and its reusable buffers for the connection's whole life. Every
//! rejection of a malformed request answers with an OpenAI-shaped error and closes the
//! connection; recoverable errors after a well-formed request keep it open.

use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio::time::Instant;
use rolter_codec::h1::chunked::{ChunkError, ChunkedDecoder};
use rolter_codec::h1::request_head::{
    self, BodyFraming, HeadError, HeadLimits, HeaderSpan, RequestHead,
};
use rolter_codec::h1::request_id::RequestId;
use rolter_codec::h1::write::CONTINUE_100;
use rolter_codec::{GatewayError, Reply, Surface};
use rolter_config::Limits;

use super::client::{respond, ClientIo, Fate};
use super::forward::forward;
use super::idle_timer::IdleDeadline;
use super::local;
use super::outgoing::IN_PLACE_BODY_MIN;
use super::race::{client_ready, client_ready_idle};
use super::reader::Reader;
use super::record;
use super::request::{BodyInPlace, IoBufs, Request};
use super::stream::{self, HandshakeFailure};
use crate::path::generation::Generations;
use crate::path::state::{WorkerCore, WorkerState};

/// Where the request body is.
enum BodyLoc {
    /// A range of the read buffer (Content-Length or no body).
    InBuf(Range<usize>),
    /// Decoded from chunked framing into the body buffer.
    Decoded,
}

enum HeadRead {
    Head(RequestHead),
    /// The client closed, or went idle past the keep-alive timeout, between requests.
    Closed,
    Reject(GatewayError),
}

/// How long a refused connection is kept for its answer to be read before it is closed.
const REFUSE_LINGER: std::time::Duration = std::time::Duration::from_millis(200);

/// A connection over `server.max_connections`: a 503 at once with `Connection: close`,
/// counted; then the write side is shut and what the client already sent is read (briefly)
/// so that closing does not reset the answer away before the client reads it.
async fn refuse(worker: &Generations, mut stream: TcpStream) {
    let e = GatewayError::internal(
        503,
        "too_many_connections",
        "the gateway has server.max_connections client connections open; retry shortly",
    )
    .with_retry_after(1);
    worker.current().record_gateway(e.status, e.code);
    let mut out = Vec::with_capacity(512);
    e.write_response(&mut out, true);
    let _ = monoio::time::timeout(REFUSE_LINGER, async {
        let (r, _) = stream.write_all(out).await;
        if r.is_err() {
            return;
        }
        let _ = stream.shutdown().await;
        let mut buf = vec![0u8; 4096];
        loop {
            let (r, b) = stream.read(buf).await;
            buf = b;
            if !matches!(r, Ok(n) if n > 0) {
                break;
            }
        }
    })
    .await;
}

/// Counts an open connection for the worker's drain logic.
struct ConnGuard<'a>(&'a WorkerCore);

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
    }
}

/// Counts a request in progress for the worker's drain logic.
struct ActiveRequest<'a>(&'a WorkerCore);

impl<'a> ActiveRequest<'a> {
    fn enter(state: &'a WorkerCore) -> Self {
        state.active_requests.set(state.active_requests.get() + 1);
        ActiveRequest(state)
    }
}

impl Drop for ActiveRequest<'_> {
    fn drop(&mut self) {
        self.0.active_requests.set(self.0.active_requests.get() - 1);
    }
}

/// How long a draining gateway waits on a keep-alive connection for a request the client
/// may already have sent, before it closes the connection. Shorter than the worker's wait
/// for idle connections at the end of a drain.
const DRAIN_NEXT_REQUEST: std::time::Duration = std::time::Duration::from_millis(200);

/// Most unread client bytes buffered while a request is being served (pipelining).
const READER_CAP: usize = 64 * 1024;

/// Serves one client connection until it closes. Each request takes the core's current
/// configuration once its head is complete and keeps it to its end.
pub async fn serve(worker: Rc<Generations>, stream: TcpStream, peer: SocketAddr) {
    let core = worker.core.clone();
    let max = worker.current().config.server.max_connections;
    let Some(_open) = core.connection_cap.try_open(Some(max)) else {
        if worker.current().client_tls.is_some() {
            // A TLS client cannot read a plaintext 503, and a handshake is what an overload
            // must not pay for: the connection is closed at once (and counted the same).
            worker.current().record_gateway(503, "too_many_connections");
            return;
        }
        // Boxed, like every rarely taken branch here: the task of each open connection is
        // as large as its largest await.
        Box::pin(refuse(&worker, stream)).await;
        return;
    };
    core.connections.set(core.connections.get() + 1);
    let _guard = ConnGuard(&core);
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let (reader_cap, tls) = {
        let s = worker.current();
        let cap = s.config.server.limits.max_head_bytes.max(READER_CAP);
        let tls = s.client_tls.clone().zip(s.config.server.tls.as_ref());
        (cap, tls.map(|(c, t)| (c, t.handshake_timeout)))
    };
    let (rd, wr) = match tls {
        None => stream::plain(stream),
        Some((config, within)) => {
            // The handshake holds no configuration's state while it waits: the settings
            // were taken at accept.
            let started = Instant::now();
            let accept = monoio::time::timeout(within, stream::accept(stream, fd, config));
            let result = match Box::pin(accept).await {
                Ok(r) => r,
                Err(_) => Err(HandshakeFailure::Timeout),
            };
            let secs = started.elapsed().as_secs_f64();
            let state = worker.current();
            match result {
                Ok(a) => {
                    state.record_tls_handshake(Ok(a.version), secs);
                    (a.rd, a.wr)
                }
                Err(f) => {
                    state.record_tls_handshake(Err(f.label()), secs);
                    return;
                }
            }
        }
    };
    let mut io = ClientIo {
        reader: Reader::spawn(rd, reader_cap),
        wr,
        fd,
    };
    let peer_ip = peer.ip().to_string();
    let mut rbuf: Vec<u8> = Vec::new();
    // Grows to the most headers a request on this connection had.
    let mut spans: Vec<HeaderSpan> = Vec::new();

    loop {
        // The limits of the configuration current when the request starts; waiting for it
        // holds no configuration's state, so an idle connection never keeps a replaced one.
        let (head_limits, limits) = {
            let s = worker.current();
            (s.head_limits, s.config.server.limits.clone())
        };
        // Between requests the task holds only this wait; a request's own state (its head,
        // body and forwarding) is boxed for as long as it is served.
        if rbuf.is_empty() && !next_request(&core, &limits, &io, &mut rbuf).await {
            return;
        }
        let conn = ConnTerms {
            worker: &worker,
            core: &core,
            peer,
            peer_ip: &peer_ip,
            head_limits: &head_limits,
            limits: &limits,
        };
        let more = Box::pin(serve_one(conn, &mut io, &mut rbuf, &mut spans)).await;
        if !more {
            return;
        }
    }
}

/// Waits for the first bytes of the next request; false when the client closed, or stayed
/// idle past the keep-alive timeout (during a drain, past a short wait).
async fn next_request(
    core: &WorkerCore,
    limits: &Limits,
    io: &ClientIo,
    rbuf: &mut Vec<u8>,
) -> bool {
    // Draining: the last response did not say `Connection: close` (it started before the
    // drain), so the client may be sending its next request right now. It gets a short
    // while to arrive, and is answered with `Connection: close`.
    let wait = if core.draining.get() {
        DRAIN_NEXT_REQUEST
    } else {
        limits.keepalive_timeout
    };
    client_ready_idle(&io.reader, IdleDeadline::after(wait)).await && io.reader.take_into(rbuf) > 0
}

/// What every request of one client connection is served with: the worker's
/// configurations, its core, the peer, and the limits current when the request started.
#[derive(Clone, Copy)]
struct ConnTerms<'a> {
    worker: &'a Generations,
    core: &'a WorkerCore,
    peer: SocketAddr,
    peer_ip: &'a str,
    head_limits: &'a HeadLimits,
    limits: &'a Limits,
}

/// Serves one request whose first bytes are in `rbuf`; false when the connection must
/// close.
async fn serve_one(
    conn: ConnTerms<'_>,
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    spans: &mut Vec<HeaderSpan>,
) -> bool {
    let (core, limits, peer) = (conn.core, conn.limits, conn.peer);
    // A request counts as in progress (for the drain) from its first byte.
    let _active = ActiveRequest::enter(core);
    let head = read_head(conn, io, rbuf, spans).await;
    let state = conn.worker.current();
    // Buffers come from the worker only while a request is being served.
    let mut bufs = core.take_bufs();
    let head = match head {
        HeadRead::Head(h) => h,
        HeadRead::Closed => return false,
        HeadRead::Reject(e) => {
            let out = &mut bufs.out;
            let unread = Unread {
                e: &e,
                called: None,
            };
            Box::pin(refuse_unread(&state, conn, io, out, unread)).await;
            return false;
        }
    };
    let (loc, consumed) = match read_body(io, rbuf, &mut bufs.body, &head, limits).await {
        Ok(v) => v,
        Err(Some(e)) => {
            let unread = Unread {
                e: &e,
                called: Some((&head, &rbuf[..])),
            };
            Box::pin(refuse_unread(&state, conn, io, &mut bufs.out, unread)).await;
            return false;
        }
        Err(None) => return false,
    };
    let close = head.close || core.draining.get();
    // A decoded body leaves the buffer set while the set is lent to the exchange.
    let decoded = std::mem::take(&mut bufs.body);
    // A large body is written upstream from where it was read: the read buffer is shared
    // with the upstream write for the request's length (`outgoing`).
    let shared = match &loc {
        BodyLoc::InBuf(r) if r.len() >= IN_PLACE_BODY_MIN => Some(Rc::new(std::mem::take(rbuf))),
        _ => None,
    };
    let fate = {
        let buf: &[u8] = shared.as_deref().unwrap_or(rbuf);
        let (body, body_in_place): (&[u8], _) = match &loc {
            BodyLoc::InBuf(r) => (
                &buf[r.clone()],
                shared.as_ref().map(|buf| BodyInPlace { buf, at: r.start }),
            ),
            BodyLoc::Decoded => (&decoded, None),
        };
        let id = RequestId::from_client(
            spans
                .iter()
                .find(|s| s.is(buf, "x-request-id"))
                .map(|s| s.value(buf)),
        );
        let req = Request {
            head: &head,
            buf,
            spans,
            body,
            body_in_place,
            peer_ip: conn.peer_ip,
            peer,
            close,
            id,
            started: std::time::Instant::now(),
            time: std::time::SystemTime::now(),
            surface: Surface::of_path(head.path(buf)),
        };
        dispatch(&state, io, &req, &mut bufs).await
    };
    bufs.body = decoded;
    if fate == Fate::Close || close {
        return false;
    }
    let mut consumed = consumed;
    if let Some(shared) = shared {
        bufs.up.release_body();
        (*rbuf, consumed) = take_back(shared, consumed);
    }
    rbuf.drain(..consumed);
    if rbuf.is_empty() {
        // An idle connection keeps no read buffer: the next request's bytes arrive in the
        // reader's buffer, which is swapped in without a copy.
        *rbuf = Vec::new();
    }
    true
}

/// A request that was not read whole, and why.
#[derive(Clone, Copy)]
struct Unread<'a> {
    /// A malformed head, a body too large or too slow.
    e: &'a GatewayError,
    /// The head and its buffer, when the head was read.
    called: Option<(&'a RequestHead, &'a [u8])>,
}

/// A request that was not read whole is answered, counted and logged.
async fn refuse_unread(
    state: &WorkerState,
    conn: ConnTerms<'_>,
    io: &mut ClientIo,
    out: &mut Vec<u8>,
    unread: Unread<'_>,
) {
    let Unread { e, called } = unread;
    state.record_gateway(e.status, e.code);
    let id = RequestId::generate();
    reject(io, out, unread, &id, conn.limits.write_timeout).await;
    record::rejected(state, conn.peer, called, &id, e);
}

/// The read buffer back from the upstream write it was shared with, and how much of it the
/// request took. A write abandoned in flight (the client left, a deadline passed) may still
/// hold it until the kernel is done with it: then the bytes after the request (a pipelined
/// one's) are copied out, and the request took none of the copy.
fn take_back(shared: Rc<Vec<u8>>, consumed: usize) -> (Vec<u8>, usize) {
    match Rc::try_unwrap(shared) {
        Ok(v) => (v, consumed),
        Err(still) => (still[consumed..].to_vec(), 0),
    }
}

/// Forwards an inference request; answers anything else locally.
async fn dispatch(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Fate {
    if local::is_forwarded(state, req) {
        // Not boxed on its own: the request it serves is (see `serve`).
        return forward(state, io, req, bufs).await;
    }
    // Boxed for the same reason (the gateway's own endpoints are not the hot path).
    Box::pin(local::answer(state, io, req, bufs)).await
}

/// Answers a rejected request and closes (RFC 9112 §6.1: close after a framing error): in
/// the shape of the API it called, and without a body to HEAD, when its head was read.
async fn reject(
    io: &mut ClientIo,
    out: &mut Vec<u8>,
    unread: Unread<'_>,
    id: &RequestId,
    write_timeout: std::time::Duration,
) {
    let Unread { e, called: head } = unread;
    // The request was not read whole: the answer carries a fresh id.
    let to = Reply {
        surface: head.map_or(Surface::OpenAi, |(h, buf)| Surface::of_path(h.path(buf))),
        head_only: head.is_some_and(|(h, _)| h.method == http::Method::HEAD),
        close: true,
        request_id: Some(id.as_str()),
    };
    let _ = respond(&mut io.wr, out, e, to, write_timeout).await;
    let _ = monoio::time::timeout(write_timeout, io.wr.shutdown()).await;
    linger(io, out).await;
}

/// Longest a rejected connection is drained before it is closed.
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);
/// Most bytes drained from a rejected connection before it is closed.
const LINGER_BYTES: usize = 1024 * 1024;

/// Lingering close: after answering a rejected request and shutting the write side, read
/// and discard what the client is still sending (bounded in time and bytes) until it closes.
/// Closing with unread bytes would make the kernel reset the connection, and a reset can
/// destroy the error response before the client reads it.
async fn linger(io: &mut ClientIo, scratch: &mut Vec<u8>) {
    let deadline = Instant::now() + LINGER_TIME;
    let mut drained = 0;
    while drained < LINGER_BYTES && client_ready(&io.reader, deadline).await {
        scratch.clear();
        let n = io.reader.take_into(scratch);
        if n == 0 {
            break;
        }
        drained += n;
    }
    scratch.clear();
}

fn head_error(e: HeadError) -> GatewayError {
    let code = match e {
        HeadError::BadRequest(_) => "bad_request",
        HeadError::UriTooLong => "uri_too_long",
        HeadError::HeaderTooLarge | HeadError::TooManyHeaders => "headers_too_large",
        HeadError::NotImplemented => "transfer_coding_not_implemented",
        HeadError::ExpectationFailed => "expectation_failed",
        HeadError::UnsupportedMediaType => "content_encoding_not_supported",
        HeadError::PayloadTooLarge => "body_too_large",
    };
    GatewayError::client(e.status(), code, e.message())
}

/// The 413 for a body over `max` bytes, naming the limit and its key.
fn body_too_large(max: usize) -> GatewayError {
    GatewayError::client(
        413,
        "body_too_large",
        format!(
            "request body exceeds the limit of {max} bytes (server.limits.max_body_bytes); \
             send a smaller body or raise the limit"
        ),
    )
}

fn timeout_error(what: &'static str) -> GatewayError {
    GatewayError::client(
        408,
        "request_timeout",
        format!("timed out reading the request {what}"),
    )
}

/// Reads until a complete head is buffered; the request's first bytes are in `rbuf`.
async fn read_head(
    conn: ConnTerms<'_>,
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    spans: &mut Vec<HeaderSpan>,
) -> HeadRead {
    let deadline = Instant::now() + conn.limits.head_timeout;
    loop {
        match request_head::parse(rbuf, conn.head_limits, spans) {
            Ok(Some(h)) => return HeadRead::Head(h),
            Ok(None) => {}
            Err(e) => return HeadRead::Reject(head_error(e)),
        }
        if !client_ready(&io.reader, deadline).await {
            return HeadRead::Reject(timeout_error("head"));
        }
        if io.reader.take_into(rbuf) == 0 {
            // Nothing waiting, so the client is gone.
            return HeadRead::Closed;
        }
    }
}

/// Reads the whole body. `Err(None)`: the client went away.
async fn read_body(
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    body: &mut Vec<u8>,
    head: &RequestHead,
    limits: &Limits,
) -> Result<(BodyLoc, usize), Option<GatewayError>> {
    let max = limits.max_body_bytes;
    let deadline = Instant::now() + limits.body_timeout;
    match head.framing {
        BodyFraming::None => Ok((BodyLoc::InBuf(head.len..head.len), head.len)),
        BodyFraming::Length(n) => {
            if n > max as u64 {
                return Err(Some(body_too_large(max)));
            }
            let need = head.len + n as usize;
            if head.expect_continue && rbuf.len() < need {
                Box::pin(send_continue(io, limits)).await?;
            }
            while rbuf.len() < need {
                rbuf.reserve((need - rbuf.len()).min(256 * 1024));
                read_more(io, rbuf, deadline).await?;
            }
            Ok((BodyLoc::InBuf(head.len..need), need))
        }
        BodyFraming::Chunked => {
            if head.expect_continue && rbuf.len() == head.len {
                Box::pin(send_continue(io, limits)).await?;
            }
            body.clear();
            let mut dec = ChunkedDecoder::new();
            // Framing bytes (sizes, extensions, trailers) may not outweigh the data: the raw
            // body is capped, and decoded bytes leave the read buffer as they are decoded, so
            // memory stays bounded whatever the chunking.
            let raw_cap = (max as u64).saturating_mul(2).saturating_add(64 * 1024);
            let mut raw: u64 = 0;
            loop {
                let n = dec
                    .feed(&rbuf[head.len..], |d| body.extend_from_slice(d))
                    .map_err(|e| {
                        let ChunkError::Malformed(m) = e;
                        Some(GatewayError::client(400, "bad_request", m))
                    })?;
                rbuf.drain(head.len..head.len + n);
                raw += n as u64;
                // Count the rest of a declared chunk too: a 1 GiB chunk size is refused
                // at once, not after the body timeout.
                if body.len() as u64 + dec.pending_chunk_bytes() > max as u64 || raw > raw_cap {
                    return Err(Some(body_too_large(max)));
                }
                if dec.is_done() {
                    return Ok((BodyLoc::Decoded, head.len));
                }
                read_more(io, rbuf, deadline).await?;
            }
        }
    }
}

/// Boxed where it is called: only a client sending `Expect: 100-continue` needs it, and a
/// write (over TLS especially) is a large future.
async fn send_continue(io: &mut ClientIo, limits: &Limits) -> Result<(), Option<GatewayError>> {
    match monoio::time::timeout(limits.write_timeout, io.wr.write_all(CONTINUE_100)).await {
        Ok((Ok(_), _)) => Ok(()),
        _ => Err(None),
    }
}

async fn read_more(
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<(), Option<GatewayError>> {
    if !client_ready(&io.reader, deadline).await {
        return Err(Some(timeout_error("body")));
    }
    if io.reader.take_into(rbuf) == 0 {
        return Err(None);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_buffer_comes_back_whole_or_as_the_bytes_after_the_request() {
        let buf = Rc::new(b"REQUEST-BYTESnext".to_vec());
        let (v, consumed) = take_back(buf, 13);
        assert_eq!(
            (&v[consumed..], v.len()),
            (&b"next"[..], 17),
            "no copy when unshared"
        );

        let buf = Rc::new(b"REQUEST-BYTESnext".to_vec());
        let in_flight = Rc::clone(&buf);
        let (v, consumed) = take_back(buf, 13);
        assert_eq!(
            (&v[..], consumed),
            (&b"next"[..], 0),
            "still shared: the tail copied"
        );
        assert_eq!(Rc::strong_count(&in_flight), 1);
    }
}
