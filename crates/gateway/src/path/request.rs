//! A request as the connection loop parsed it (borrowed from the connection's buffers), and
//! the buffers one request is served with, lent by the worker for the request's length.
//!
//! Owns no bytes of its own: the connection owns the read buffer, the worker the spare
//! buffer sets (and the single buffers a streaming request lends back while it waits).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Instant, SystemTime};

use rolter_codec::h1::request_head::{HeaderSpan, RequestHead};
use rolter_codec::h1::request_id::RequestId;
use rolter_codec::{Reply, Surface};

use super::outgoing::Outgoing;

/// A parsed request, borrowed from the connection's buffers.
pub struct Request<'a> {
    pub head: &'a RequestHead,
    pub buf: &'a [u8],
    pub spans: &'a [HeaderSpan],
    pub body: &'a [u8],
    /// Where a large body lies in the read buffer, shared so that the upstream write sends
    /// it from there ([`super::outgoing`]); `None` when the body is copied instead.
    pub body_in_place: Option<BodyInPlace<'a>>,
    pub peer_ip: &'a str,
    pub peer: SocketAddr,
    /// The connection closes after this exchange.
    pub close: bool,
    /// The client's valid `x-request-id`, else a generated one: returned on the response,
    /// sent upstream, written to the access log.
    pub id: RequestId,
    /// When the request was read (for the access log's duration and time).
    pub started: Instant,
    pub time: SystemTime,
    /// The API the request called: the shape of the gateway's own answers to it.
    pub surface: Surface,
}

/// A large body's place: `buf[at..at + body.len()]`, where `buf` is the read buffer the
/// request was parsed from.
#[derive(Clone, Copy)]
pub struct BodyInPlace<'a> {
    pub buf: &'a Rc<Vec<u8>>,
    pub at: usize,
}

impl Request<'_> {
    pub fn header(&self, lower_name: &str) -> Option<&[u8]> {
        self.spans
            .iter()
            .find(|s| s.is(self.buf, lower_name))
            .map(|s| s.value(self.buf))
    }

    /// How the gateway's own error answers this request.
    pub fn reply(&self) -> Reply<'_> {
        Reply {
            surface: self.surface,
            head_only: self.head.method == http::Method::HEAD,
            close: self.close,
            request_id: Some(self.id.as_str()),
        }
    }

    /// The request's size as read: head and body.
    pub fn bytes_in(&self) -> u64 {
        (self.head.len + self.body.len()) as u64
    }
}

/// Smallest upstream read; after a read that fills its buffer the next one is
/// [`MAX_UPSTREAM_READ`], so SSE streams keep small buffers and bursts and large bodies move
/// in large reads.
pub const MIN_UPSTREAM_READ: usize = 4 * 1024;
/// Largest upstream read.
pub const MAX_UPSTREAM_READ: usize = 64 * 1024;

/// Buffers for one request, lent by the worker.
pub struct IoBufs {
    /// Bytes for the client. Lent back to the worker between a stream's events.
    pub out: Vec<u8>,
    /// The upstream request. Its bytes are lent back to the worker once the response has
    /// begun.
    pub up: Outgoing,
    /// Upstream reads.
    pub ubuf: Vec<u8>,
    /// Forwardable response headers, scratch.
    pub hdrs: Vec<u8>,
    /// A request body decoded from chunked framing.
    pub body: Vec<u8>,
    /// The canonical prompt, for strategies that ask for it.
    pub prompt: Vec<u8>,
    /// Request bytes of the gateway's own calls made for an input (tokenize).
    pub side: Vec<u8>,
}

impl IoBufs {
    pub fn new() -> Self {
        IoBufs {
            out: Vec::new(),
            up: Outgoing::default(),
            ubuf: Vec::with_capacity(MIN_UPSTREAM_READ),
            hdrs: Vec::with_capacity(512),
            body: Vec::new(),
            prompt: Vec::new(),
            side: Vec::new(),
        }
    }
}

impl IoBufs {
    /// Largest capacity a buffer may keep when the set goes back to the worker's spares.
    pub const KEEP: usize = 64 * 1024;

    /// Empties every buffer and releases any that grew past [`Self::KEEP`] (a big body or
    /// response), so spare sets stay small.
    pub fn recycle(&mut self) {
        self.up.release_body();
        for b in [
            &mut self.out,
            &mut self.up.bytes,
            &mut self.ubuf,
            &mut self.hdrs,
            &mut self.body,
            &mut self.prompt,
            &mut self.side,
        ] {
            b.clear();
            if b.capacity() > Self::KEEP {
                *b = Vec::new();
            }
        }
    }
}

impl Default for IoBufs {
    fn default() -> Self {
        Self::new()
    }
}
