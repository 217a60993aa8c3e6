//! Racing an I/O future against the client's disconnect and a deadline.
//!
//! While a request is in progress, the connection's reader keeps a read armed on the client
//! socket (`path::reader`). EOF or an error there means the client is gone and the
//! upstream exchange must be abandoned at once; bytes there (a pipelined next request) stay
//! in the inbox and do not interrupt anything. This module must not drop the raced I/O
//! future unless the client is gone or the deadline passed: dropping it loses an in-flight
//! upstream read, so the caller then discards that upstream connection.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};

use monoio::time::{Instant, Sleep};

use super::idle_timer::IdleDeadline;
use super::reader::Reader;

/// Outcome of a race.
pub enum Race<T> {
    Done(T),
    ClientGone,
    TimedOut,
}

pin_project_lite::pin_project! {
    /// An I/O future raced against the client's disconnect and a deadline `D`: a plain
    /// struct rather than an `async fn`, so the raced future is stored once (an `async fn`
    /// keeps its argument and its pinned copy side by side) and a coarse deadline adds a
    /// few bytes instead of a runtime timer.
    pub struct Racing<'a, F, D> {
        #[pin]
        io: F,
        #[pin]
        due: D,
        client: &'a Reader,
    }
}

impl<F: Future, D: Future<Output = ()>> Future for Racing<'_, F, D> {
    type Output = Race<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.io.poll(cx) {
            return Poll::Ready(Race::Done(v));
        }
        if this.client.poll_gone(cx).is_ready() {
            return Poll::Ready(Race::ClientGone);
        }
        if this.due.poll(cx).is_ready() {
            return Poll::Ready(Race::TimedOut);
        }
        Poll::Pending
    }
}

/// Polls `io` until it completes, the client goes away, or `deadline` passes (a runtime
/// timer: for the deadlines that need precision, up to the response's first byte).
pub fn race<F: Future>(io: F, client: &Reader, deadline: Instant) -> Racing<'_, F, Sleep> {
    Racing {
        io,
        due: monoio::time::sleep_until(deadline),
        client,
    }
}

/// As [`race`], with a coarse deadline ([`IdleDeadline`], which fires up to about 10 ms
/// late while the worker is busy): for the idle and write timeouts of a stream's body,
/// which a long stream waits on once per event.
pub fn race_idle<F: Future>(
    io: F,
    client: &Reader,
    deadline: IdleDeadline,
) -> Racing<'_, F, IdleDeadline> {
    Racing {
        io,
        due: deadline,
        client,
    }
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
