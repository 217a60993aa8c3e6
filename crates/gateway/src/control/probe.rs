//! A small HTTP/1.1 GET for the control thread: metrics scrapes and active health checks,
//! over the same connect (TCP, or TLS with the target's trust settings) the data plane uses.
//!
//! Owns nothing between calls: one connection per probe, `Connection: close`, the whole
//! exchange bounded by a timeout and the body by a size cap. It must never run on a worker.

use std::net::SocketAddr;
use std::time::Duration;

use crate::upstream::connect::{connect, TlsParams};
use crate::upstream::side_request::{self, SideError};
use rolter_config::Target;

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

/// `GET path` on the target at `addr` (its current address); the status and body, within
/// `timeout`.
pub async fn get(
    target: &Target,
    addr: SocketAddr,
    tls: Option<TlsParams<'_>>,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), ProbeError> {
    let exchange = async {
        let mut conn = connect(addr, timeout, tls)
            .await
            .map_err(|e| ProbeError::Connect(e.to_string()))?;
        let mut req = Vec::with_capacity(256);
        side_request::build_request(&mut req, target, "GET", path, None, false);
        let (_, r) = side_request::exchange(&mut conn, req, MAX_PROBE_BODY).await;
        match r {
            Ok(resp) => Ok((resp.status, resp.body)),
            Err(SideError::Io(e)) => Err(ProbeError::Io(e)),
            Err(SideError::Malformed) => Err(ProbeError::Malformed),
            Err(SideError::TooLarge(_)) => Err(ProbeError::TooLarge),
        }
    };
    match monoio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::TimedOut),
    }
}

/// The body of a 2xx answer to [`get`]; any other outcome becomes the text the admin API
/// shows for it ("answered 503", "timed out", ...).
pub fn ok_body(answer: Result<(u16, Vec<u8>), ProbeError>) -> Result<Vec<u8>, String> {
    match answer {
        Ok((status, body)) if (200..300).contains(&status) => Ok(body),
        Ok((status, _)) => Err(format!("answered {status}")),
        Err(e) => Err(e.to_string()),
    }
}
