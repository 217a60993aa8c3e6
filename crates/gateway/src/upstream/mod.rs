//! The thin upstream HTTP/1.1 client: connecting (plaintext or TLS) to each target's
//! current address, the per-core keep-alive pool, the one connection policy every call follows, and the buffered exchange of the
//! gateway's own small calls ([`Upstreams::post_json`]).
//!
//! Owns connections to upstreams. It must not buffer client response bodies: the relay on
//! the request path reads and forwards them as they arrive (only `side_request`, for the
//! gateway's own small calls, reads a whole body). Nothing here is shared across cores.

pub mod addrs;
pub mod conn;
pub mod connect;
pub mod pool;
pub mod reuse;
pub mod side_request;
pub mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rolter_config::{Config, Target, TargetId};

use addrs::TargetAddrs;
use conn::UpstreamConn;
use connect::{connect, ConnectError};
use pool::{Pool, PoolLimits};
use reuse::CallError;
use side_request::SideResponse;
use tls::UpstreamTls;

/// One core's way to its targets: their settings, the TLS client configurations (shared by
/// every core), where new connections go, and this core's keep-alive pool.
pub struct Upstreams {
    pub config: Arc<Config>,
    pub tls: Arc<UpstreamTls>,
    pub addrs: TargetAddrs,
    pub pool: Pool,
}

impl Upstreams {
    pub fn new(config: Arc<Config>, tls: Arc<UpstreamTls>) -> Self {
        let pool = Pool::new(
            config
                .targets
                .iter()
                .map(|t| PoolLimits {
                    max_idle: t.pool.max_idle,
                    idle_timeout: t.pool.idle_timeout,
                })
                .collect(),
        );
        let addrs = TargetAddrs::new(&config);
        Upstreams {
            config,
            tls,
            addrs,
            pool,
        }
    }

    #[inline]
    pub fn target(&self, tid: TargetId) -> &Target {
        &self.config.targets[tid]
    }

    /// A pooled live connection to `tid`, if there is one.
    #[inline]
    pub fn pooled(&self, tid: TargetId) -> Option<UpstreamConn> {
        self.pool.take(tid, Instant::now())
    }

    /// The gateway's own `POST path` with a JSON body to target `tid` (a tokenize call, an
    /// adapter load), on this core's pool like client traffic, the whole call within
    /// `timeout` and the answer's body at most `max_body` bytes. `scratch` holds the
    /// request bytes and is handed back for reuse. It must not be used to relay client
    /// bodies.
    pub async fn post_json(
        &self,
        tid: TargetId,
        path: &str,
        body: &[u8],
        timeout: Duration,
        max_body: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<SideResponse, CallError> {
        side_request::build_request(scratch, self.target(tid), "POST", path, Some(body), true);
        let connect = async || self.connect(tid).await.map_err(|e| e.to_string());
        let call = reuse::call(&self.pool, tid, connect, scratch, max_body);
        match monoio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::TimedOut),
        }
    }

    /// A fresh connection to `tid` (TCP, then TLS for an `https://` target) at its current
    /// address, within the target's connect timeout.
    pub async fn connect(&self, tid: TargetId) -> Result<UpstreamConn, ConnectError> {
        let target = self.target(tid);
        let tls = self.tls.get(tid).map(|t| t.params());
        connect(self.addrs.get(tid), target.timeouts.connect, tls).await
    }
}
