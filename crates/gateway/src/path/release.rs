//! A core's notice that a target's admission place may have freed: the requests waiting in
//! a route's queue on this core (`path::queue`) are woken, in arrival order, to try again.
//!
//! A release on this core wakes them at once ([`Released`] drops); a release on another
//! core reaches them on this core's next signal tick (the worker wakes them every tick
//! while any wait). Owns the wakers only; it must not admit anything itself, and it is
//! never shared with another core.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::mesh::caps::Admitted;

/// The wakers of this core's queued requests.
#[derive(Default)]
pub struct Waiters {
    epoch: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
    /// Requests queued on this core now (any route).
    queued: Cell<usize>,
}

impl Waiters {
    /// Wakes every queued request (each tries admission again). Cheap when none waits.
    pub fn wake_all(&self) {
        if self.queued.get() == 0 {
            return;
        }
        self.epoch.set(self.epoch.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves at the next [`wake_all`](Self::wake_all).
    pub fn next_wake(&self) -> NextWake<'_> {
        NextWake {
            waiters: self,
            epoch: self.epoch.get(),
        }
    }

    /// One more request queued on this core; forgotten when the guard drops.
    pub fn enter(&self) -> Queued<'_> {
        self.queued.set(self.queued.get() + 1);
        Queued { waiters: self }
    }
}

/// A request counted as queued on this core.
pub struct Queued<'a> {
    waiters: &'a Waiters,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let w = self.waiters;
        w.queued.set(w.queued.get() - 1);
        // The next in line may find room this one did not take.
        w.wake_all();
    }
}

/// Ready once the waiters were woken after it was made.
pub struct NextWake<'a> {
    waiters: &'a Waiters,
    epoch: u64,
}

impl Future for NextWake<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.waiters.epoch.get() != self.epoch {
            return Poll::Ready(());
        }
        let mut wakers = self.waiters.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// An admitted place that, once released, tells this core's queued requests.
pub struct Released<'a> {
    admitted: Option<Admitted<'a>>,
    waiters: &'a Waiters,
}

impl<'a> Released<'a> {
    pub fn new(admitted: Admitted<'a>, waiters: &'a Waiters) -> Self {
        Released {
            admitted: Some(admitted),
            waiters,
        }
    }
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        drop(self.admitted.take());
        self.waiters.wake_all();
    }
}
