//! How every upstream call gets its connection: a pooled one when the pool has a live one,
//! else a fresh one; and when a pooled one turns out to have been closed by the peer before
//! it took the request (the keep-alive race), once more on a fresh one. The relay of client
//! traffic and the gateway's own buffered calls (tokenize, adapter loads, cache lookups)
//! all go through [`with_connection`].
//!
//! Owns that policy only. It must not retry more than once, never retries after the peer
//! may have seen the request, and never puts a connection back itself: an exchange that
//! ended cleanly does that.

use std::time::Instant;

use super::conn::UpstreamConn;
use super::pool::Pool;
use super::side_request::{self, SideError, SideResponse};

/// How one exchange on a connection went.
pub enum Step<T> {
    /// Finished, well or not; `T` is the caller's answer.
    Done(T),
    /// The connection was closed before any response byte, so the peer never took the
    /// request. `T` is the answer when no retry is possible (the connection was fresh).
    Stale(T),
}

/// Runs `exchange` on `pooled` (when some) or on a connection from `fresh`; when a pooled
/// connection turns out stale, once more on a fresh one. `exchange` gets the connection and
/// whether it was reused.
pub async fn with_connection<T>(
    pooled: Option<UpstreamConn>,
    mut fresh: impl AsyncFnMut() -> Result<UpstreamConn, T>,
    mut exchange: impl AsyncFnMut(UpstreamConn, bool) -> Step<T>,
) -> T {
    let mut next = pooled;
    loop {
        let reused = next.is_some();
        let conn = match next.take() {
            Some(c) => c,
            None => match fresh().await {
                Ok(c) => c,
                Err(t) => return t,
            },
        };
        match exchange(conn, reused).await {
            Step::Done(t) => return t,
            Step::Stale(t) if !reused => return t,
            // `next` is empty: the retry connects afresh.
            Step::Stale(_) => {}
        }
    }
}

/// Why one of the gateway's own calls gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    TimedOut,
    Connect(String),
    Exchange(SideError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::TimedOut => f.write_str("timed out"),
            CallError::Connect(e) => write!(f, "connect failed: {e}"),
            CallError::Exchange(e) => e.fmt(f),
        }
    }
}

/// One buffered call (the request bytes in `request`, handed back for reuse) to the peer
/// behind `pool` slot `slot`, on a pooled connection or one from `connect`; the connection
/// goes back to the pool when the answer allows keep-alive. Timeouts are the caller's.
pub async fn call(
    pool: &Pool,
    slot: usize,
    mut connect: impl AsyncFnMut() -> Result<UpstreamConn, String>,
    request: &mut Vec<u8>,
    max_body: usize,
) -> Result<SideResponse, CallError> {
    let pooled = pool.take(slot, Instant::now());
    with_connection(
        pooled,
        async || connect().await.map_err(|e| Err(CallError::Connect(e))),
        async |mut conn, _reused| {
            let (req, result) =
                side_request::exchange(&mut conn, std::mem::take(request), max_body).await;
            *request = req;
            match result {
                Ok(resp) => {
                    if resp.keep_alive {
                        pool.put(slot, conn, Instant::now());
                    }
                    Step::Done(Ok(resp))
                }
                // A connection the peer closed while idle: nothing was taken.
                Err(e @ (SideError::Io(_) | SideError::Malformed)) => {
                    Step::Stale(Err(CallError::Exchange(e)))
                }
                Err(e) => Step::Done(Err(CallError::Exchange(e))),
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// The policy on its own: which connections an exchange is tried on.
    #[monoio::test_all(timer_enabled = true)]
    async fn a_stale_pooled_connection_is_retried_once_on_a_fresh_one() {
        let fresh = Cell::new(0);
        let tries = Cell::new(Vec::new());
        let conn = || async {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let s = monoio::net::TcpStream::connect_addr(addr).await.unwrap();
            UpstreamConn::Plain(s)
        };
        // Pooled and stale, then fresh and done.
        let pooled = Some(conn().await);
        let r: u32 = with_connection(
            pooled,
            async || {
                fresh.set(fresh.get() + 1);
                Ok(conn().await)
            },
            async |_c, reused| {
                let mut t = tries.take();
                t.push(reused);
                tries.set(t);
                if reused {
                    Step::Stale(1)
                } else {
                    Step::Done(2)
                }
            },
        )
        .await;
        assert_eq!((r, fresh.get(), tries.take()), (2, 1, vec![true, false]));
        // Fresh and stale: no second try, the stale answer stands.
        let r: u32 = with_connection(
            None,
            async || {
                fresh.set(fresh.get() + 1);
                Ok(conn().await)
            },
            async |_c, _reused| Step::Stale(7),
        )
        .await;
        assert_eq!((r, fresh.get()), (7, 2));
        // No connection at all: the connect error is the answer.
        let r: u32 = with_connection(None, async || Err(9), async |_c, _r| Step::Done(0)).await;
        assert_eq!(r, 9);
    }
}
