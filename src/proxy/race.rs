//! Racing an I/O future against the client's disconnect watch and a deadline.
//!
//! While a request is in progress the gateway keeps one cancelable read armed on the client
//! socket. EOF or an error there means the client is gone and the upstream exchange must be
//! abandoned at once. Bytes there (a pipelined next request) are kept, not lost: the watch
//! stores them and stops watching. It must not drop the raced I/O future on a client-data
//! event, since that would lose an in-flight upstream read.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;

use monoio::time::Instant;
use monoio::BufResult;

/// The client-disconnect watch: one armed cancelable read on the client socket.
pub struct Watch<'a, F: Future<Output = BufResult<usize, Vec<u8>>>> {
    fut: Pin<&'a mut F>,
    live: bool,
    /// The read's buffer once it completed (holding any bytes it read).
    buf: Option<Vec<u8>>,
    /// The client closed its side or the socket failed.
    pub gone: bool,
}

impl<'a, F: Future<Output = BufResult<usize, Vec<u8>>>> Watch<'a, F> {
    pub fn new(fut: Pin<&'a mut F>) -> Self {
        Watch {
            fut,
            live: true,
            buf: None,
            gone: false,
        }
    }

    fn poll_watch(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        if !self.live {
            return self.gone;
        }
        if let Poll::Ready((res, buf)) = self.fut.as_mut().poll(cx) {
            self.live = false;
            self.buf = Some(buf);
            if !matches!(res, Ok(n) if n > 0) {
                self.gone = true;
            }
        }
        self.gone
    }

    /// Cancels the armed read (if still pending) and waits for it to settle, keeping any
    /// bytes it read. Call once the exchange is over.
    pub async fn settle(&mut self, canceller: monoio::io::Canceller) {
        if !self.live {
            return;
        }
        let _ = canceller.cancel();
        let (res, buf) = self.fut.as_mut().await;
        self.live = false;
        self.buf = Some(buf);
        if matches!(res, Ok(0)) {
            self.gone = true;
        }
    }

    /// The read buffer, once the watch has completed or settled.
    pub fn take_buf(&mut self) -> Option<Vec<u8>> {
        self.buf.take()
    }

    pub fn is_live(&self) -> bool {
        self.live
    }
}

/// Outcome of a race.
pub enum Race<T> {
    Done(T),
    ClientGone,
    TimedOut,
}

/// Polls `io` until it completes, the client goes away, or `deadline` passes.
pub async fn race<T, F, W>(io: F, watch: &mut Watch<'_, W>, deadline: Instant) -> Race<T>
where
    F: Future<Output = T>,
    W: Future<Output = BufResult<usize, Vec<u8>>>,
{
    let mut io = pin!(io);
    let mut sleep = pin!(monoio::time::sleep_until(deadline));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = io.as_mut().poll(cx) {
            return Poll::Ready(Race::Done(v));
        }
        if watch.poll_watch(cx) {
            return Poll::Ready(Race::ClientGone);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Race::TimedOut);
        }
        Poll::Pending
    })
    .await
}
