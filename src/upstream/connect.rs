//! Opening upstream connections with a timeout and the socket options a streaming proxy
//! needs (TCP_NODELAY, so small SSE writes never wait for ACKs).
//!
//! Owns connection setup only; addresses were resolved at configuration load, so nothing
//! here blocks the worker.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::net::TcpStream;

/// Connects to `addr` within `timeout`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    match monoio::time::timeout(timeout, TcpStream::connect_addr(addr)).await {
        Ok(Ok(s)) => {
            s.set_nodelay(true)?;
            Ok(s)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}
