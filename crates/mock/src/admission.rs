//! Per-thread FIFO admission queue implementing `max_running`: a request holds a
//! [`Permit`] while it runs; requests over the limit wait in arrival order. Keeps the
//! shared `running` / `waiting` gauges up to date. Dropping a queued [`Acquire`] (client
//! went away) leaves the queue; dropping a [`Permit`] hands the slot to the next waiter.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::stats::{dec, inc, Stats};

pub(crate) struct Admission {
    limit: usize,
    running: Cell<usize>,
    queue: RefCell<VecDeque<Rc<Waiter>>>,
    /// The engine's counters, and the data-parallel rank's when it has its own.
    stats: Vec<Arc<Stats>>,
}

#[derive(Default)]
struct Waiter {
    granted: Cell<bool>,
    cancelled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// A running slot; released on drop.
pub(crate) struct Permit {
    adm: Rc<Admission>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        for s in &self.adm.stats {
            dec(&s.running);
        }
        self.adm.release();
    }
}

impl Admission {
    /// `limit` 0 means unlimited; `stats` are the counters whose gauges it keeps.
    pub fn new(limit: usize, stats: Vec<Arc<Stats>>) -> Rc<Self> {
        Rc::new(Admission {
            limit,
            running: Cell::new(0),
            queue: RefCell::new(VecDeque::new()),
            stats,
        })
    }

    pub fn acquire(self: &Rc<Self>) -> Acquire {
        Acquire {
            adm: self.clone(),
            waiter: None,
            done: false,
        }
    }

    fn release(&self) {
        let mut q = self.queue.borrow_mut();
        while let Some(w) = q.pop_front() {
            if w.cancelled.get() {
                continue;
            }
            // The slot passes directly to the next waiter.
            w.granted.set(true);
            for s in &self.stats {
                dec(&s.waiting);
                s.admit();
            }
            if let Some(waker) = w.waker.borrow_mut().take() {
                waker.wake();
            }
            return;
        }
        self.running.set(self.running.get() - 1);
    }
}

pub(crate) struct Acquire {
    adm: Rc<Admission>,
    waiter: Option<Rc<Waiter>>,
    done: bool,
}

impl Future for Acquire {
    type Output = Permit;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        let this = &mut *self;
        assert!(!this.done, "Acquire polled after completion");
        match &this.waiter {
            None => {
                let adm = &this.adm;
                if adm.limit == 0
                    || (adm.running.get() < adm.limit && adm.queue.borrow().is_empty())
                {
                    adm.running.set(adm.running.get() + 1);
                    adm.stats.iter().for_each(|s| s.admit());
                    this.done = true;
                    return Poll::Ready(Permit { adm: adm.clone() });
                }
                let w = Rc::new(Waiter::default());
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                adm.stats.iter().for_each(|s| inc(&s.waiting));
                adm.queue.borrow_mut().push_back(w.clone());
                this.waiter = Some(w);
                Poll::Pending
            }
            Some(w) => {
                if w.granted.get() {
                    this.done = true;
                    this.waiter = None;
                    Poll::Ready(Permit {
                        adm: this.adm.clone(),
                    })
                } else {
                    *w.waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(w) = self.waiter.take() {
            if w.granted.get() {
                // Granted but never observed: give the slot back.
                drop(Permit {
                    adm: self.adm.clone(),
                });
            } else {
                w.cancelled.set(true);
                self.adm.stats.iter().for_each(|s| dec(&s.waiting));
                self.adm.queue.borrow_mut().retain(|x| !Rc::ptr_eq(x, &w));
            }
        }
    }
}
