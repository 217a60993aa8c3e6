//! A small buffered HTTP/1.1 exchange on an upstream connection, for the gateway's own calls
//! to an engine (metrics scrapes and health checks on the control thread; tokenize calls on
//! a worker): write one request, read the whole response into memory.
//!
//! Owns only the wire format of one exchange. It must not be used for client traffic (the
//! relay in `path::relay` streams that), must not retry, and bounds every body by a size cap.
//! Timeouts are the caller's: wrap the future in `monoio::time::timeout`.

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};

use super::conn::UpstreamConn;
use rolter_codec::h1::chunked::ChunkedDecoder;
use rolter_codec::h1::response_head::{self, RespFraming};
use rolter_codec::h1::write::write_header;
use rolter_config::Target;

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideError {
    Io(String),
    Malformed,
    TooLarge(usize),
}

impl std::fmt::Display for SideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SideError::Io(e) => write!(f, "read failed: {e}"),
            SideError::Malformed => f.write_str("malformed response"),
            SideError::TooLarge(cap) => write!(f, "body larger than {cap} bytes"),
        }
    }
}

/// The response of one exchange.
#[derive(Debug)]
pub struct SideResponse {
    pub status: u16,
    pub body: Vec<u8>,
    /// The connection may carry another request.
    pub keep_alive: bool,
}

/// The request bytes: `method path` with the target's `Host` and configured headers, a JSON
/// body when given, and `Connection: close` unless `keep_alive`.
pub fn build_request(
    out: &mut Vec<u8>,
    target: &Target,
    method: &str,
    path: &str,
    json_body: Option<&[u8]>,
    keep_alive: bool,
) {
    build_request_to(
        out,
        &target.host_header,
        &target.headers,
        method,
        path,
        json_body,
        keep_alive,
    );
}

/// [`build_request`] for a server that is not a target (a cache controller): its `Host`
/// value and extra headers given directly.
pub fn build_request_to(
    out: &mut Vec<u8>,
    host_header: &str,
    headers: &[(String, String)],
    method: &str,
    path: &str,
    json_body: Option<&[u8]>,
    keep_alive: bool,
) {
    out.clear();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    // Engine endpoints (`/metrics`, `/health`, `/tokenize`) live at the server root, not
    // under the target URL's path prefix.
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_header(out, b"host", host_header.as_bytes());
    for (n, v) in headers {
        write_header(out, n.as_bytes(), v.as_bytes());
    }
    out.extend_from_slice(b"user-agent: rolter\r\n");
    if let Some(body) = json_body {
        out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if let Some(body) = json_body {
        out.extend_from_slice(body);
    }
}

/// Writes `request` (from [`build_request`]) on `conn` and reads the whole response, its
/// body at most `max_body` bytes. The request buffer is handed back for reuse.
pub async fn exchange(
    conn: &mut UpstreamConn,
    request: Vec<u8>,
    max_body: usize,
) -> (Vec<u8>, Result<SideResponse, SideError>) {
    let (r, request) = conn.write_all(request).await;
    if let Err(e) = r {
        return (request, Err(SideError::Io(e.to_string())));
    }
    (request, read_response(conn, max_body).await)
}

async fn read_response(
    conn: &mut UpstreamConn,
    max_body: usize,
) -> Result<SideResponse, SideError> {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut hdrs = Vec::new();
    let head = loop {
        if let Some(h) =
            response_head::parse(&buf, false, &mut hdrs).map_err(|_| SideError::Malformed)?
        {
            if (100..200).contains(&h.status) {
                buf.drain(..h.len);
                continue;
            }
            break h;
        }
        buf = read_more(conn, buf).await?.ok_or(SideError::Malformed)?;
    };
    let mut body = Vec::new();
    let mut pending = buf.split_off(head.len);
    let mut decoder = ChunkedDecoder::new();
    loop {
        let done = match head.framing {
            RespFraming::Empty => true,
            RespFraming::Length(n) => {
                if n > max_body as u64 {
                    return Err(SideError::TooLarge(max_body));
                }
                body.extend_from_slice(&pending);
                body.len() as u64 >= n
            }
            RespFraming::Chunked => {
                decoder
                    .feed(&pending, |d| body.extend_from_slice(d))
                    .map_err(|_| SideError::Malformed)?;
                decoder.is_done()
            }
            RespFraming::Close => {
                body.extend_from_slice(&pending);
                false
            }
        };
        let extra = match head.framing {
            RespFraming::Length(n) => body.len() as u64 > n,
            _ => false,
        };
        if let RespFraming::Length(n) = head.framing {
            body.truncate(n as usize);
        }
        if done {
            return Ok(SideResponse {
                status: head.status,
                body,
                // Bytes past the body would belong to no request: never reuse then.
                keep_alive: head.keep_alive
                    && !extra
                    && !matches!(head.framing, RespFraming::Close),
            });
        }
        if body.len() > max_body {
            return Err(SideError::TooLarge(max_body));
        }
        pending.clear();
        match read_more(conn, pending).await? {
            Some(p) => pending = p,
            None if matches!(head.framing, RespFraming::Close) => {
                return Ok(SideResponse {
                    status: head.status,
                    body,
                    keep_alive: false,
                })
            }
            None => return Err(SideError::Malformed),
        }
    }
}

/// Reads more bytes onto `buf`; `None` at end of stream.
async fn read_more(
    conn: &mut UpstreamConn,
    mut buf: Vec<u8>,
) -> Result<Option<Vec<u8>>, SideError> {
    let before = buf.len();
    buf.reserve(16 * 1024);
    let cap = buf.capacity();
    // Read into the spare capacity after the bytes already held.
    let (r, slice) = conn.read(buf.slice_mut(before..cap)).await;
    let b = slice.into_inner();
    match r {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(b)),
        Err(e) => Err(SideError::Io(e.to_string())),
    }
}
