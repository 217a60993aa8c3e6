//! Busy polling (`server.busy_poll`): after each client request or upstream read, a worker
//! keeps polling its ring (io_uring) or its epoll set for that long instead of sleeping in
//! the kernel, so the next completion is picked up without a wake-up.
//!
//! How: two tasks wake each other in turn, so the runtime always has a task to run and,
//! between runs, submits and reaps completions without waiting (monoio pushes a task that
//! wakes itself to the front of its queue, which would starve every other task; a task
//! woken by another one goes to the back). The runtime's timers fire only when it parks, so
//! polling stops for one zero-timeout park at least every [`SLICE`]: a timer is late by at
//! most that. With no note for `busy_poll`, the poller waits for the next note and the
//! worker sleeps as it does without polling.
//!
//! The time spent polling goes to [`PollStats`] (`rolter_busy_poll_seconds_total`).
//!
//! Owns the poller's two tasks. It must not touch requests or connections; it reads only
//! the core's activity notes and the polling time of the current configuration.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::mesh::polling::PollStats;
use crate::path::activity::Waiter;
use crate::path::state::WorkerCore;

/// The longest stretch of polling without a park (which fires due timers). The timer
/// wheel counts whole milliseconds, so a timer created at the start of a slice is due at
/// its end.
pub const SLICE: Duration = Duration::from_millis(1);

/// The two tasks' wakers: each one, when polled, wakes the other and waits.
#[derive(Default)]
struct Pair {
    wakers: [Cell<Option<Waker>>; 2],
}

impl Pair {
    /// Lets every other task and the ring run once: wakes the partner (queued behind the
    /// tasks ready now) and waits until it wakes this side again.
    async fn bounce(&self, side: usize) {
        let mut waited = false;
        std::future::poll_fn(|cx| {
            if waited {
                return Poll::Ready(());
            }
            waited = true;
            self.wakers[side].set(Some(cx.waker().clone()));
            if let Some(w) = self.wakers[1 - side].take() {
                w.wake();
            }
            Poll::Pending
        })
        .await
    }
}

/// Starts the poller on this worker; its tasks end with the worker's runtime. `window`
/// reads the current configuration's `server.busy_poll` (so a reload changes it); zero:
/// the poller only waits for notes.
pub fn start(core: Rc<WorkerCore>, stats: Arc<PollStats>, window: impl Fn() -> Duration + 'static) {
    let pair = Rc::new(Pair::default());
    let echo = pair.clone();
    monoio::spawn(async move {
        loop {
            echo.bounce(1).await;
        }
    });
    monoio::spawn(async move {
        loop {
            core.activity.next(Waiter::Poller).await;
            let window = window();
            if !window.is_zero() {
                poll_while_active(&core, &pair, &stats, window).await;
            }
        }
    });
}

/// Polls until `window` passes with no note, parking once per [`SLICE`]; each slice's
/// time goes to `stats` as it ends.
async fn poll_while_active(core: &WorkerCore, pair: &Pair, stats: &PollStats, window: Duration) {
    let mut seen = core.activity.count();
    let mut last_note = Instant::now();
    loop {
        let slice_start = Instant::now();
        let park = monoio::time::sleep(Duration::ZERO);
        loop {
            pair.bounce(0).await;
            let now = Instant::now();
            let count = core.activity.count();
            if count != seen {
                seen = count;
                last_note = now;
            } else if now.duration_since(last_note) >= window {
                stats.add(now.duration_since(slice_start));
                return;
            }
            if now.duration_since(slice_start) >= SLICE {
                stats.add(now.duration_since(slice_start));
                break;
            }
        }
        // Due since the slice began: the runtime parks without waiting and fires it, with
        // every other timer due by now.
        park.await;
    }
}
