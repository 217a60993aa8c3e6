//! Racing an I/O future against the client's disconnect and a deadline.
//!
//! While a request is in progress, the connection's reader keeps a read armed on the client
//! socket (`proxy::reader`). EOF or an error there means the client is gone and the
//! upstream exchange must be abandoned at once; bytes there (a pipelined next request) stay
//! in the inbox and do not interrupt anything. This module must not drop the raced I/O
//! future unless the client is gone or the deadline passed: dropping it loses an in-flight
//! upstream read, so the caller then discards that upstream connection.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;

use monoio::time::Instant;

use super::idle_timer::IdleDeadline;
use super::reader::Reader;

/// Outcome of a race.
pub enum Race<T> {
    Done(T),
    ClientGone,
    TimedOut,
}

/// Polls `io` until it completes, the client goes away, or `deadline` passes.
pub async fn race<T, F>(io: F, client: &Reader, deadline: Instant) -> Race<T>
where
    F: Future<Output = T>,
{
    let mut io = pin!(io);
    let mut sleep = pin!(monoio::time::sleep_until(deadline));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = io.as_mut().poll(cx) {
            return Poll::Ready(Race::Done(v));
        }
        if client.poll_gone(cx).is_ready() {
            return Poll::Ready(Race::ClientGone);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Race::TimedOut);
        }
        Poll::Pending
    })
    .await
}

/// Waits until client bytes are waiting or the client is gone, or `deadline` passes.
/// Returns false on timeout.
pub async fn client_ready(client: &Reader, deadline: Instant) -> bool {
    ready_before(client, pin!(monoio::time::sleep_until(deadline))).await
}

/// As [`client_ready`], for the long wait of an idle connection: its deadline is a coarse
/// one ([`IdleDeadline`]), which an idle task holds in a few bytes instead of a runtime
/// timer. Returns false on timeout.
pub async fn client_ready_idle(client: &Reader, deadline: IdleDeadline) -> bool {
    ready_before(client, pin!(deadline)).await
}

/// Ready with true once client bytes wait or the client is gone, with false once `due`
/// completes first. `due` comes pinned so its caller stores it once.
async fn ready_before<F: Future<Output = ()>>(client: &Reader, mut due: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| {
        if client.poll_ready(cx).is_ready() {
            return Poll::Ready(true);
        }
        if due.as_mut().poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await
}
