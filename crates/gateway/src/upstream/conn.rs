//! One upstream connection: plaintext TCP or TLS over TCP, behind monoio's owned-buffer I/O
//! traits so the relay and the pool handle both the same way.
//!
//! Owns the choice of transport per connection only. Plaintext stays a bare `TcpStream`
//! (no boxing, no extra copy); TLS is boxed because the rustls session and its buffers are
//! large. A TLS read or write whose future was dropped before completing leaves the stream
//! unusable: callers drop such a connection (the relay drops the upstream on every
//! cancelled I/O, and only cleanly finished exchanges reach the pool).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::BufResult;
use monoio_rustls::ClientTlsStream;

/// A TLS session over TCP, with the socket's descriptor kept for the pool's liveness peek
/// (the TLS stream does not expose its inner socket).
pub struct TlsConn {
    fd: RawFd,
    stream: ClientTlsStream<TcpStream>,
}

impl TlsConn {
    /// Wraps an established TLS stream; `fd` must be the descriptor of the `TcpStream` it owns.
    pub fn new(fd: RawFd, stream: ClientTlsStream<TcpStream>) -> Self {
        TlsConn { fd, stream }
    }

    /// The ALPN protocol the server selected, if any.
    pub fn alpn_protocol(&self) -> Option<Vec<u8>> {
        self.stream.alpn_protocol()
    }
}

/// An upstream connection.
pub enum UpstreamConn {
    Plain(TcpStream),
    Tls(Box<TlsConn>),
}

impl UpstreamConn {
    /// Whether this connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, UpstreamConn::Tls(_))
    }

    /// Waits, holding no buffer, until a plaintext connection has bytes, EOF or an error.
    /// Not relaxed: after a read that did not drain the socket to `EAGAIN`, epoll's cached
    /// readiness is stale, so under epoll a `poll(2)` checks it (io_uring arms a poll).
    /// `None` for TLS, whose session may already hold decrypted bytes: there only a read
    /// tells.
    pub fn readable(&self) -> Option<impl std::future::Future<Output = io::Result<()>> + '_> {
        match self {
            UpstreamConn::Plain(s) => Some(s.readable(false)),
            UpstreamConn::Tls(_) => None,
        }
    }

    /// True when `e`, from a read on this connection, means the peer closed the TCP
    /// connection without a TLS close_notify. rustls reports that as an error (a possible
    /// truncation); before any response byte it is the same keep-alive race as a plaintext
    /// FIN. A plaintext read never reports it: EOF there is `Ok(0)`.
    pub fn is_unclean_eof(&self, e: &io::Error) -> bool {
        self.is_tls() && e.kind() == io::ErrorKind::UnexpectedEof
    }
}

impl AsRawFd for UpstreamConn {
    /// The TCP socket's descriptor (for a TLS connection, the socket under the session).
    fn as_raw_fd(&self) -> RawFd {
        match self {
            UpstreamConn::Plain(s) => s.as_raw_fd(),
            UpstreamConn::Tls(t) => t.fd,
        }
    }
}

impl AsyncReadRent for UpstreamConn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpstreamConn::Plain(s) => s.read(buf).await,
            UpstreamConn::Tls(t) => t.stream.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpstreamConn::Plain(s) => s.readv(buf).await,
            UpstreamConn::Tls(t) => t.stream.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for UpstreamConn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpstreamConn::Plain(s) => s.write(buf).await,
            UpstreamConn::Tls(t) => t.stream.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpstreamConn::Plain(s) => s.writev(buf).await,
            UpstreamConn::Tls(t) => t.stream.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            UpstreamConn::Plain(s) => s.flush().await,
            UpstreamConn::Tls(t) => t.stream.flush().await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            UpstreamConn::Plain(s) => s.shutdown().await,
            UpstreamConn::Tls(t) => t.stream.shutdown().await,
        }
    }
}
