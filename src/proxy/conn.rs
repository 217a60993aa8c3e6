//! The client connection loop: read a head, read the body, answer locally or forward, and
//! keep the connection alive for the next (possibly pipelined) request.
//!
//! Owns the client socket and its reusable buffers for the connection's whole life. Every
//! rejection of a malformed request answers with an OpenAI-shaped error and closes the
//! connection; recoverable errors after a well-formed request keep it open.

use std::net::SocketAddr;
use std::ops::Range;
use std::rc::Rc;

use http::Method;
use monoio::buf::IoBufMut;
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use monoio::time::Instant;

use super::forward::{forward, Fate, IoBufs, Request};
use super::state::WorkerState;
use crate::error::GatewayError;
use crate::http::chunked::ChunkedDecoder;
use crate::http::head::{self, BodyFraming, HeadError, HeaderSpan, RequestHead};
use crate::http::response::{write_head_and_body, CONTINUE_100};
use crate::openai::is_proxied_path;

/// The two halves of a client socket: a read can stay armed while the relay writes.
pub struct ClientIo {
    pub rd: OwnedReadHalf<TcpStream>,
    pub wr: OwnedWriteHalf<TcpStream>,
}

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

/// Counts an open connection for the worker's drain logic.
struct ConnGuard<'a>(&'a WorkerState);

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
    }
}

/// Counts a request in progress for the worker's drain logic.
struct ActiveRequest<'a>(&'a WorkerState);

impl<'a> ActiveRequest<'a> {
    fn enter(state: &'a WorkerState) -> Self {
        state.active_requests.set(state.active_requests.get() + 1);
        ActiveRequest(state)
    }
}

impl Drop for ActiveRequest<'_> {
    fn drop(&mut self) {
        self.0.active_requests.set(self.0.active_requests.get() - 1);
    }
}

/// Serves one client connection until it closes.
pub async fn serve(state: Rc<WorkerState>, stream: TcpStream, peer: SocketAddr) {
    state.connections.set(state.connections.get() + 1);
    let _guard = ConnGuard(&state);
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut io = ClientIo { rd, wr };
    let peer_ip = peer.ip().to_string();
    let mut rbuf: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut spans: Vec<HeaderSpan> = Vec::with_capacity(32);
    let mut body: Vec<u8> = Vec::new();
    let mut bufs = IoBufs::new();
    let limits = state.config.server.limits.clone();

    loop {
        let head = match read_head(&state, &mut io, &mut rbuf, &mut spans).await {
            HeadRead::Head(h) => h,
            HeadRead::Closed => return,
            HeadRead::Reject(e) => {
                reject(&mut io, &mut bufs.out, &e, limits.write_timeout).await;
                return;
            }
        };
        let (loc, consumed) = match read_body(&mut io, &mut rbuf, &mut body, &head, &limits).await {
            Ok(v) => v,
            Err(Some(e)) => {
                reject(&mut io, &mut bufs.out, &e, limits.write_timeout).await;
                return;
            }
            Err(None) => return,
        };
        let close = head.close || state.draining.get();
        let _active = ActiveRequest::enter(&state);
        let fate = {
            let body: &[u8] = match &loc {
                BodyLoc::InBuf(r) => &rbuf[r.clone()],
                BodyLoc::Decoded => &body,
            };
            let req = Request {
                head: &head,
                buf: &rbuf,
                spans: &spans,
                body,
                peer_ip: &peer_ip,
                close,
            };
            dispatch(&state, &mut io, &req, &mut bufs, &limits).await
        };
        if bufs.watch_has_data {
            rbuf.extend_from_slice(&bufs.watch);
            bufs.watch.clear();
            bufs.watch_has_data = false;
        }
        if fate == Fate::Close || close {
            return;
        }
        rbuf.drain(..consumed);
    }
}

async fn dispatch(
    state: &WorkerState,
    io: &mut ClientIo,
    req: &Request<'_>,
    bufs: &mut IoBufs,
    limits: &crate::config::Limits,
) -> Fate {
    let path = req.head.path(req.buf);
    let method = &req.head.method;
    let local: Result<&[u8], GatewayError> = match (method, path) {
        (&Method::POST, p) if is_proxied_path(p) => {
            return forward(state, io, req, bufs).await;
        }
        (_, p) if is_proxied_path(p) => Err(GatewayError::client(
            405,
            "method_not_allowed",
            format!("{path} accepts only POST"),
        )),
        (&Method::GET, "/health") => Ok(br#"{"status":"ok"}"#),
        (&Method::GET, "/v1/models") => Ok(&state.models_body),
        (_, "/health") | (_, "/v1/models") => Err(GatewayError::client(
            405,
            "method_not_allowed",
            format!("{path} accepts only GET"),
        )),
        _ => Err(GatewayError::client(
            404,
            "not_found",
            format!("no such endpoint: {path}"),
        )),
    };
    let body = match local {
        Ok(body) => body,
        Err(e) => {
            return respond(
                &mut io.wr,
                &mut bufs.out,
                &e,
                req.close,
                limits.write_timeout,
            )
            .await
        }
    };
    bufs.out.clear();
    write_head_and_body(&mut bufs.out, 200, "application/json", &[], body, req.close);
    write_out(&mut io.wr, &mut bufs.out, limits.write_timeout).await
}

/// Writes an error response; the connection stays open unless `close`.
pub async fn respond(
    wr: &mut OwnedWriteHalf<TcpStream>,
    out: &mut Vec<u8>,
    e: &GatewayError,
    close: bool,
    write_timeout: std::time::Duration,
) -> Fate {
    out.clear();
    e.write_response(out, close);
    write_out(wr, out, write_timeout).await
}

async fn write_out(
    wr: &mut OwnedWriteHalf<TcpStream>,
    out: &mut Vec<u8>,
    write_timeout: std::time::Duration,
) -> Fate {
    let buf = std::mem::take(out);
    match monoio::time::timeout(write_timeout, wr.write_all(buf)).await {
        Ok((Ok(_), buf)) => {
            *out = buf;
            Fate::KeepAlive
        }
        _ => Fate::Close,
    }
}

/// Answers a rejected request and closes (RFC 9112 §6.1: close after a framing error).
async fn reject(
    io: &mut ClientIo,
    out: &mut Vec<u8>,
    e: &GatewayError,
    write_timeout: std::time::Duration,
) {
    let _ = respond(&mut io.wr, out, e, true, write_timeout).await;
    let _ = monoio::time::timeout(write_timeout, io.wr.shutdown()).await;
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

fn timeout_error(what: &'static str) -> GatewayError {
    GatewayError::client(
        408,
        "request_timeout",
        format!("timed out reading the request {what}"),
    )
}

/// Reads until a complete head is buffered.
async fn read_head(
    state: &WorkerState,
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    spans: &mut Vec<HeaderSpan>,
) -> HeadRead {
    let limits = &state.config.server.limits;
    let mut started: Option<Instant> = None;
    loop {
        if !rbuf.is_empty() {
            started.get_or_insert_with(Instant::now);
            match head::parse(rbuf, &state.head_limits, spans) {
                Ok(Some(h)) => return HeadRead::Head(h),
                Ok(None) => {}
                Err(e) => return HeadRead::Reject(head_error(e)),
            }
        }
        let deadline = match started {
            Some(t) => t + limits.head_timeout,
            None => {
                if state.draining.get() {
                    return HeadRead::Closed;
                }
                Instant::now() + limits.keepalive_timeout
            }
        };
        rbuf.reserve(4096);
        // A Vec read fills from index 0: read into the spare capacity so the bytes already
        // buffered (a partial head) are kept.
        let len = rbuf.len();
        let buf = std::mem::take(rbuf).slice_mut(len..);
        match monoio::time::timeout_at(deadline, io.rd.read(buf)).await {
            Ok((Ok(0), buf)) => {
                *rbuf = buf.into_inner();
                return HeadRead::Closed;
            }
            Ok((Ok(_), buf)) => *rbuf = buf.into_inner(),
            Ok((Err(_), _)) => return HeadRead::Closed,
            Err(_) => {
                return if started.is_some() {
                    HeadRead::Reject(timeout_error("head"))
                } else {
                    HeadRead::Closed
                }
            }
        }
    }
}

/// Reads the whole body. `Err(None)`: the client went away.
async fn read_body(
    io: &mut ClientIo,
    rbuf: &mut Vec<u8>,
    body: &mut Vec<u8>,
    head: &RequestHead,
    limits: &crate::config::Limits,
) -> Result<(BodyLoc, usize), Option<GatewayError>> {
    let max = limits.max_body_bytes;
    let deadline = Instant::now() + limits.body_timeout;
    match head.framing {
        BodyFraming::None => Ok((BodyLoc::InBuf(head.len..head.len), head.len)),
        BodyFraming::Length(n) => {
            if n > max as u64 {
                return Err(Some(head_error(HeadError::PayloadTooLarge)));
            }
            let need = head.len + n as usize;
            if head.expect_continue && rbuf.len() < need {
                send_continue(io, limits).await?;
            }
            while rbuf.len() < need {
                rbuf.reserve((need - rbuf.len()).min(256 * 1024));
                read_more(io, rbuf, deadline).await?;
            }
            Ok((BodyLoc::InBuf(head.len..need), need))
        }
        BodyFraming::Chunked => {
            if head.expect_continue && rbuf.len() == head.len {
                send_continue(io, limits).await?;
            }
            body.clear();
            let mut dec = ChunkedDecoder::new();
            let mut pos = head.len;
            loop {
                let n = dec
                    .feed(&rbuf[pos..], |d| body.extend_from_slice(d))
                    .map_err(|e| {
                        let crate::http::chunked::ChunkError::Malformed(m) = e;
                        Some(GatewayError::client(400, "bad_request", m))
                    })?;
                pos += n;
                // Count the rest of a declared chunk too: a 1 GiB chunk size is refused
                // at once, not after the body timeout.
                if body.len() as u64 + dec.pending_chunk_bytes() > max as u64 {
                    return Err(Some(head_error(HeadError::PayloadTooLarge)));
                }
                if dec.is_done() {
                    return Ok((BodyLoc::Decoded, pos));
                }
                rbuf.reserve(16 * 1024);
                read_more(io, rbuf, deadline).await?;
            }
        }
    }
}

async fn send_continue(
    io: &mut ClientIo,
    limits: &crate::config::Limits,
) -> Result<(), Option<GatewayError>> {
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
    // Append after what is buffered (a plain Vec read would overwrite from index 0).
    let len = rbuf.len();
    let buf = std::mem::take(rbuf).slice_mut(len..);
    match monoio::time::timeout_at(deadline, io.rd.read(buf)).await {
        Ok((Ok(0), _)) | Ok((Err(_), _)) => Err(None),
        Ok((Ok(_), buf)) => {
            *rbuf = buf.into_inner();
            Ok(())
        }
        Err(_) => Err(Some(timeout_error("body"))),
    }
}
