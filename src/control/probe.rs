//! A small HTTP/1.1 GET for the control thread: metrics scrapes and active health checks,
//! over the same connect (TCP, or TLS with the target's trust settings) the data plane uses.
//!
//! Owns nothing between calls: one connection per probe, `Connection: close`, the whole
//! exchange bounded by a timeout and the body by a size cap. It must never run on a worker.

use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use crate::config::Target;
use crate::http::chunked::ChunkedDecoder;
use crate::http::response::write_header;
use crate::upstream::connect::{connect, TlsParams};
use crate::upstream::response::{self, RespFraming};

/// Largest body a probe reads (a vLLM `/metrics` page is ~100 KB).
pub const MAX_PROBE_BODY: usize = 8 * 1024 * 1024;

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    TimedOut,
    Connect(String),
    Io(String),
    Malformed,
    TooLarge,
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::TimedOut => f.write_str("timed out"),
            ProbeError::Connect(e) => write!(f, "connect failed: {e}"),
            ProbeError::Io(e) => write!(f, "read failed: {e}"),
            ProbeError::Malformed => f.write_str("malformed response"),
            ProbeError::TooLarge => write!(f, "body larger than {MAX_PROBE_BODY} bytes"),
        }
    }
}

/// `GET path` on the target; the status and body, within `timeout`.
pub async fn get(
    target: &Target,
    tls: Option<TlsParams<'_>>,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), ProbeError> {
    match monoio::time::timeout(timeout, get_inner(target, tls, path, timeout)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::TimedOut),
    }
}

async fn get_inner(
    target: &Target,
    tls: Option<TlsParams<'_>>,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), ProbeError> {
    let mut conn = connect(target.addr, timeout, tls)
        .await
        .map_err(|e| ProbeError::Connect(e.to_string()))?;
    let mut req = Vec::with_capacity(256);
    req.extend_from_slice(b"GET ");
    req.extend_from_slice(path.as_bytes());
    req.extend_from_slice(b" HTTP/1.1\r\n");
    write_header(&mut req, b"host", target.host_header.as_bytes());
    for (n, v) in &target.headers {
        write_header(&mut req, n.as_bytes(), v.as_bytes());
    }
    req.extend_from_slice(b"user-agent: rolter-probe\r\nconnection: close\r\n\r\n");
    let (r, _) = conn.write_all(req).await;
    r.map_err(|e| ProbeError::Io(e.to_string()))?;

    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut hdrs = Vec::new();
    let head = loop {
        if let Some(h) =
            response::parse(&buf, false, &mut hdrs).map_err(|_| ProbeError::Malformed)?
        {
            if (100..200).contains(&h.status) {
                buf.drain(..h.len);
                continue;
            }
            break h;
        }
        buf = read_more(&mut conn, buf)
            .await?
            .ok_or(ProbeError::Malformed)?;
    };
    let mut body = Vec::new();
    let mut pending = buf.split_off(head.len);
    let mut decoder = ChunkedDecoder::new();
    loop {
        let done = match head.framing {
            RespFraming::Empty => true,
            RespFraming::Length(n) => {
                body.extend_from_slice(&pending);
                body.len() as u64 >= n
            }
            RespFraming::Chunked => {
                decoder
                    .feed(&pending, |d| body.extend_from_slice(d))
                    .map_err(|_| ProbeError::Malformed)?;
                decoder.is_done()
            }
            RespFraming::Close => {
                body.extend_from_slice(&pending);
                false
            }
        };
        if let RespFraming::Length(n) = head.framing {
            body.truncate(n as usize);
        }
        if done {
            return Ok((head.status, body));
        }
        if body.len() > MAX_PROBE_BODY {
            return Err(ProbeError::TooLarge);
        }
        pending.clear();
        match read_more(&mut conn, pending).await? {
            Some(p) => pending = p,
            None if matches!(head.framing, RespFraming::Close) => return Ok((head.status, body)),
            None => return Err(ProbeError::Malformed),
        }
    }
}

/// Reads more bytes onto `buf`; `None` at end of stream.
async fn read_more(
    conn: &mut crate::upstream::conn::UpstreamConn,
    mut buf: Vec<u8>,
) -> Result<Option<Vec<u8>>, ProbeError> {
    let before = buf.len();
    buf.reserve(16 * 1024);
    let cap = buf.capacity();
    // Read into the spare capacity after the bytes already held.
    let (r, slice) = conn.read(buf.slice_mut(before..cap)).await;
    let b = slice.into_inner();
    match r {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(b)),
        Err(e) => Err(ProbeError::Io(e.to_string())),
    }
}
