//! The gateway's own request to a target from a worker, made before routing when a strategy
//! needs an input only the engine can give (the prompt's token ids from its tokenize
//! endpoint). It rides the core's keep-alive pool like client traffic does.
//!
//! Owns one call's connection for the length of the call. It must not retry beyond one fresh
//! connection after a stale pooled one, must not outlive its timeout, and must not be used to
//! relay client bodies.

use std::time::Duration;

use monoio::time::Instant;

use super::state::WorkerState;
use crate::upstream::connect::connect;
use crate::upstream::side_request::{self, SideError, SideResponse};

/// Why a side call gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideCallError {
    TimedOut,
    Connect(String),
    Exchange(SideError),
}

impl std::fmt::Display for SideCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SideCallError::TimedOut => f.write_str("timed out"),
            SideCallError::Connect(e) => write!(f, "connect failed: {e}"),
            SideCallError::Exchange(e) => e.fmt(f),
        }
    }
}

/// `POST path` with a JSON body to target `tid`, the whole call within `timeout`; the
/// response body at most `max_body` bytes. `scratch` holds the request bytes and is handed
/// back for reuse.
pub async fn post_json(
    state: &WorkerState,
    tid: usize,
    path: &str,
    body: &[u8],
    timeout: Duration,
    max_body: usize,
    scratch: &mut Vec<u8>,
) -> Result<SideResponse, SideCallError> {
    match monoio::time::timeout(timeout, call(state, tid, path, body, max_body, scratch)).await {
        Ok(r) => r,
        Err(_) => Err(SideCallError::TimedOut),
    }
}

async fn call(
    state: &WorkerState,
    tid: usize,
    path: &str,
    body: &[u8],
    max_body: usize,
    scratch: &mut Vec<u8>,
) -> Result<SideResponse, SideCallError> {
    let target = &state.config.targets[tid];
    let mut fresh = false;
    loop {
        let pooled = if fresh {
            None
        } else {
            state.pool.take(tid, Instant::now().into_std())
        };
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let tls = state.tls.get(tid).map(|t| t.params());
                connect(target.addr, target.timeouts.connect, tls)
                    .await
                    .map_err(|e| SideCallError::Connect(e.to_string()))?
            }
        };
        let mut req = std::mem::take(scratch);
        side_request::build_request(&mut req, target, "POST", path, Some(body), true);
        let (req, result) = side_request::exchange(&mut conn, req, max_body).await;
        *scratch = req;
        match result {
            Ok(resp) => {
                if resp.keep_alive {
                    state.pool.put(tid, conn, Instant::now().into_std());
                }
                return Ok(resp);
            }
            // A pooled connection the engine closed while idle: once more on a fresh one.
            Err(SideError::Io(_) | SideError::Malformed) if reused => fresh = true,
            Err(e) => return Err(SideCallError::Exchange(e)),
        }
    }
}
