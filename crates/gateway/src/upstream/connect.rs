//! Opening upstream connections with a timeout and the socket options a streaming proxy
//! needs (TCP_NODELAY, so small SSE writes never wait for ACKs), plus the TLS handshake for
//! `https://` targets.
//!
//! Owns connection setup only; addresses were resolved at configuration load and TLS client
//! settings built at gateway start, so nothing here blocks the worker or reads files.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpStream;
use monoio_rustls::{TlsConnector, TlsError};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;

use super::conn::{TlsConn, UpstreamConn};

/// What a TLS target needs for the handshake.
#[derive(Clone, Copy)]
pub struct TlsParams<'a> {
    pub config: &'a Arc<ClientConfig>,
    /// SNI and the name the certificate must match.
    pub server_name: &'a ServerName<'static>,
}

/// Why a connection could not be set up.
#[derive(Debug)]
pub enum ConnectError {
    /// TCP connect (plus the handshake, for `tls`) did not finish within the connect timeout.
    TimedOut { tls: bool },
    /// The TCP connection failed (refused, unreachable, reset).
    Tcp(io::Error),
    /// The TLS handshake failed (certificate not trusted, name mismatch, protocol error,
    /// the peer closing or resetting mid-handshake).
    Tls(String),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::TimedOut { tls: false } => f.write_str("connect timed out"),
            ConnectError::TimedOut { tls: true } => {
                f.write_str("connect and TLS handshake did not finish within the connect timeout")
            }
            ConnectError::Tcp(e) => write!(f, "{e}"),
            ConnectError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
        }
    }
}

/// Connects to `addr` and, for a TLS target, completes the handshake, all within `timeout`.
pub async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<TlsParams<'_>>,
) -> Result<UpstreamConn, ConnectError> {
    let is_tls = tls.is_some();
    match monoio::time::timeout(timeout, connect_inner(addr, tls)).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::TimedOut { tls: is_tls }),
    }
}

async fn connect_inner(
    addr: SocketAddr,
    tls: Option<TlsParams<'_>>,
) -> Result<UpstreamConn, ConnectError> {
    let s = TcpStream::connect_addr(addr)
        .await
        .map_err(ConnectError::Tcp)?;
    s.set_nodelay(true).map_err(ConnectError::Tcp)?;
    let Some(tls) = tls else {
        return Ok(UpstreamConn::Plain(s));
    };
    let fd = s.as_raw_fd();
    let connector = TlsConnector::from(tls.config.clone());
    match connector.connect(tls.server_name.clone(), s).await {
        Ok(stream) => Ok(UpstreamConn::Tls(Box::new(TlsConn::new(fd, stream)))),
        Err(TlsError::Rustls(e)) => Err(ConnectError::Tls(e.to_string())),
        Err(TlsError::Io(e)) => Err(ConnectError::Tls(e.to_string())),
    }
}
