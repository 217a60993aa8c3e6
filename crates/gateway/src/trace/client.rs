//! The exporter thread's HTTP/1.1 client for the collector: one blocking keep-alive
//! connection (plain TCP, or TLS through rustls), a POST of one encoded request, and the
//! response read and discarded, every step bounded by the export's deadline.
//!
//! Owns the connection to the collector. It runs only on the exporter thread, which may
//! wait here; nothing on a worker ever does.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_codec::h1::chunked::ChunkedDecoder;
use rolter_codec::h1::response_head::{self, RespFraming};
use rolter_config::{TraceEndpoint, Tracing};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Response body bytes read and discarded at most; past them the connection is closed.
const MAX_DISCARD: u64 = 1 << 20;

/// Why an export did not succeed.
#[derive(Debug)]
pub enum PostError {
    /// The host name gave no address.
    Resolve(io::Error),
    Connect(io::Error),
    /// Writing the request or reading the response failed.
    Io(io::Error),
    /// The export's deadline passed.
    TimedOut(Duration),
    /// The collector closed the connection before a whole response.
    Closed,
    /// The response was not HTTP/1.1.
    Malformed,
    /// The collector answered, but not with a 2xx status.
    Status(u16),
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::Resolve(e) => write!(f, "resolving the collector's host failed: {e}"),
            PostError::Connect(e) => write!(f, "connecting to the collector failed: {e}"),
            PostError::Io(e) => write!(f, "talking to the collector failed: {e}"),
            PostError::TimedOut(t) => write!(f, "the collector did not answer within {t:?}"),
            PostError::Closed => f.write_str("the collector closed the connection"),
            PostError::Malformed => f.write_str("the collector's response is not HTTP/1.1"),
            PostError::Status(s) => write!(f, "the collector answered with status {s}"),
        }
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }

    /// Bounds the next read or write by what is left before `deadline`.
    fn until(&self, deadline: Instant, timeout: Duration) -> Result<(), PostError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(PostError::TimedOut(timeout));
        }
        let tcp = self.tcp();
        tcp.set_read_timeout(Some(left)).map_err(PostError::Io)?;
        tcp.set_write_timeout(Some(left)).map_err(PostError::Io)
    }

    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }

    fn write_some(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A failure, and whether it came before any byte of a response.
type Attempt = Result<(), (PostError, bool)>;

/// The collector client: the endpoint, the request head's fixed part and the connection.
pub struct OtlpClient {
    endpoint: TraceEndpoint,
    timeout: Duration,
    /// The request line and every header but `content-length`.
    head: Vec<u8>,
    tls: Option<Arc<ClientConfig>>,
    conn: Option<Stream>,
    /// The response head as it arrives.
    buf: Vec<u8>,
}

impl OtlpClient {
    /// A client for `settings`' endpoint, headers and timeout; connects on the first post.
    pub fn new(settings: &Tracing) -> Result<OtlpClient, String> {
        let e = &settings.endpoint;
        let tls = if e.tls {
            Some(tls_config(&e.ca_certs)?)
        } else {
            None
        };
        let mut head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-protobuf\r\nuser-agent: rolter/{}\r\n",
            e.path,
            e.host_header,
            env!("CARGO_PKG_VERSION")
        )
        .into_bytes();
        for (name, value) in &settings.headers {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        Ok(OtlpClient {
            endpoint: e.clone(),
            timeout: settings.timeout,
            head,
            tls,
            conn: None,
            buf: Vec::with_capacity(1024),
        })
    }

    /// POSTs `body` (one encoded request) by `deadline`. A kept-alive connection that
    /// fails before any response byte is replaced once (the collector may have closed it
    /// while it was idle).
    pub fn post(&mut self, body: &[u8], deadline: Instant) -> Result<(), PostError> {
        let reused = self.conn.is_some();
        match self.attempt(body, deadline) {
            Ok(()) => Ok(()),
            Err((_, true)) if reused => self.attempt(body, deadline).map_err(|(e, _)| e),
            Err((e, _)) => Err(e),
        }
    }

    fn attempt(&mut self, body: &[u8], deadline: Instant) -> Attempt {
        let result = self.exchange(body, deadline);
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// One request and its response on the current connection (made first if needed).
    fn exchange(&mut self, body: &[u8], deadline: Instant) -> Attempt {
        let mut stream = match self.conn.take() {
            Some(s) => s,
            None => self.connect(deadline).map_err(|e| (e, false))?,
        };
        let mut head = Vec::with_capacity(self.head.len() + 40);
        head.extend_from_slice(&self.head);
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        head.extend_from_slice(b"\r\n\r\n");
        let t = self.timeout;
        send(&mut stream, &head, deadline, t).map_err(|e| (e, true))?;
        send(&mut stream, body, deadline, t).map_err(|e| (e, true))?;
        stream.flush().map_err(|e| (PostError::Io(e), true))?;
        let (status, keep_alive) = read_response(&mut stream, &mut self.buf, deadline, t)?;
        if keep_alive {
            self.conn = Some(stream);
        }
        match status {
            200..=299 => Ok(()),
            s => Err((PostError::Status(s), false)),
        }
    }

    fn connect(&self, deadline: Instant) -> Result<Stream, PostError> {
        let e = &self.endpoint;
        let addrs: Vec<_> = (e.host.as_str(), e.port)
            .to_socket_addrs()
            .map_err(PostError::Resolve)?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PostError::TimedOut(self.timeout));
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(tcp) => return self.wrap(tcp),
                Err(err) => last = err,
            }
        }
        Err(PostError::Connect(last))
    }

    fn wrap(&self, tcp: TcpStream) -> Result<Stream, PostError> {
        let _ = tcp.set_nodelay(true);
        let Some(config) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        let name = ServerName::try_from(self.endpoint.host.clone()).map_err(|e| {
            PostError::Connect(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
        })?;
        let conn = ClientConnection::new(config.clone(), name)
            .map_err(|e| PostError::Connect(io::Error::other(e)))?;
        Ok(Stream::Tls(Box::new(StreamOwned::new(conn, tcp))))
    }
}

/// Writes all of `data` by `deadline`.
fn send(
    stream: &mut Stream,
    mut data: &[u8],
    deadline: Instant,
    t: Duration,
) -> Result<(), PostError> {
    while !data.is_empty() {
        stream.until(deadline, t)?;
        match stream.write_some(data) {
            Ok(0) => return Err(PostError::Closed),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e, t)),
        }
    }
    Ok(())
}

/// A read or write that hit the socket's timeout is the deadline passing.
fn io_error(e: io::Error, t: Duration) -> PostError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PostError::TimedOut(t),
        _ => PostError::Io(e),
    }
}

/// Reads some bytes by `deadline`; a closed connection is an error.
fn read_more(
    stream: &mut Stream,
    chunk: &mut [u8],
    deadline: Instant,
    t: Duration,
) -> Result<usize, PostError> {
    loop {
        stream.until(deadline, t)?;
        match stream.read_some(chunk) {
            Ok(0) => return Err(PostError::Closed),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e, t)),
        }
    }
}

/// Reads one response (skipping interim 1xx ones) and discards its body: its status and
/// whether the connection may carry the next request.
fn read_response(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    deadline: Instant,
    t: Duration,
) -> Result<(u16, bool), (PostError, bool)> {
    buf.clear();
    let mut chunk = [0u8; 8192];
    let mut forwarded = Vec::new();
    let head = loop {
        forwarded.clear();
        match response_head::parse(buf, false, &mut forwarded) {
            Ok(Some(h)) if (100..200).contains(&h.status) => {
                buf.drain(..h.len);
                continue;
            }
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(_) => return Err((PostError::Malformed, false)),
        }
        let n = read_more(stream, &mut chunk, deadline, t).map_err(|e| (e, buf.is_empty()))?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let rest = buf.split_off(head.len);
    let whole = discard_body(stream, head.framing, &rest, &mut chunk, deadline, t)
        .map_err(|e| (e, false))?;
    Ok((head.status, head.keep_alive && whole))
}

/// Reads the body framed as `framing` (`rest` already read) and drops it; false when it
/// was left unread (longer than [`MAX_DISCARD`], or delimited by the close).
fn discard_body(
    stream: &mut Stream,
    framing: RespFraming,
    rest: &[u8],
    chunk: &mut [u8],
    deadline: Instant,
    t: Duration,
) -> Result<bool, PostError> {
    match framing {
        RespFraming::Empty => Ok(rest.is_empty()),
        RespFraming::Close => Ok(false),
        RespFraming::Length(n) if n > MAX_DISCARD => Ok(false),
        RespFraming::Length(n) => {
            let mut left = n.saturating_sub(rest.len() as u64);
            while left > 0 {
                left = left.saturating_sub(read_more(stream, chunk, deadline, t)? as u64);
            }
            Ok(rest.len() as u64 <= n)
        }
        RespFraming::Chunked => {
            let mut decoder = ChunkedDecoder::new();
            let used = decoder
                .feed(rest, |_| {})
                .map_err(|_| PostError::Malformed)?;
            if decoder.is_done() {
                return Ok(used == rest.len());
            }
            loop {
                if decoder.decoded > MAX_DISCARD {
                    return Ok(false);
                }
                let n = read_more(stream, chunk, deadline, t)?;
                let used = decoder
                    .feed(&chunk[..n], |_| {})
                    .map_err(|_| PostError::Malformed)?;
                if decoder.is_done() {
                    return Ok(used == n);
                }
            }
        }
    }
}

/// TLS 1.2 and 1.3 with the ring provider, ALPN `http/1.1`: exactly `ca_certs` as roots
/// when there are any, the webpki public roots otherwise.
fn tls_config(
    ca_certs: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<Arc<ClientConfig>, String> {
    let roots = if ca_certs.is_empty() {
        RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }
    } else {
        let mut roots = RootCertStore::empty();
        for c in ca_certs {
            roots
                .add(c.clone())
                .map_err(|e| format!("tracing.ca_file: {e}"))?;
        }
        roots
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client setup for the trace exporter failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
