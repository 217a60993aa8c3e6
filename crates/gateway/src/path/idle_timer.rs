//! Coarse deadlines for the waits a connection holds for long: the keep-alive timeout
//! between requests, the reader's park delay, and a streaming body's idle and write
//! timeouts (one wait per event). One worker-local table, swept by the worker's tick,
//! takes the place of a runtime timer inside every waiting task (a monoio `Sleep` is 640
//! bytes, and an idle connection's two tasks each carried one).
//!
//! Owns the table and its sweep. A deadline fires at the first sweep after it has passed:
//! up to about 10 ms late while the worker is busy (it ticks every 2 ms and scans at most
//! once per `SWEEP_EVERY`), up to its 100 ms tick while it is quiet. It must not serve
//! deadlines that need precision (the request's head and body reads, connects, the wait
//! for a response's first byte and the per-try timeouts keep runtime timers), and it must
//! not be used off a worker thread.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

/// A sweep scans the table at most this often; a busy worker ticks more often than this.
const SWEEP_EVERY: Duration = Duration::from_millis(10);

struct Entry {
    at: Instant,
    waker: Waker,
    fired: bool,
}

struct Table {
    entries: RefCell<Slab<Entry>>,
    /// The earliest deadline not yet fired (a sweep before it has nothing to do).
    earliest: Cell<Option<Instant>>,
    last_sweep: Cell<Option<Instant>>,
}

thread_local! {
    static TABLE: Table = const {
        Table {
            entries: RefCell::new(Slab::new()),
            earliest: Cell::new(None),
            last_sweep: Cell::new(None),
        }
    };
}

/// Wakes every wait whose deadline has passed by `now`. Called by the worker's tick.
pub fn sweep(now: Instant) {
    TABLE.with(|t| {
        if t.earliest.get().is_none_or(|e| now < e) {
            return;
        }
        if t.last_sweep.get().is_some_and(|l| now < l + SWEEP_EVERY) {
            return;
        }
        t.last_sweep.set(Some(now));
        let mut due = Vec::new();
        let mut earliest: Option<Instant> = None;
        {
            let mut entries = t.entries.borrow_mut();
            for (_, e) in entries.iter_mut() {
                if e.fired {
                    continue;
                }
                if e.at <= now {
                    e.fired = true;
                    due.push(e.waker.clone());
                } else if earliest.is_none_or(|x| e.at < x) {
                    earliest = Some(e.at);
                }
            }
        }
        t.earliest.set(earliest);
        // Woken outside the borrow: a woken task may poll (and register) before this returns.
        for w in due {
            w.wake();
        }
    })
}

/// How many waits the table holds.
#[cfg(test)]
fn pending() -> usize {
    TABLE.with(|t| t.entries.borrow().len())
}

/// A wait that ends at a coarse deadline. Dropping it removes it from the table.
pub struct IdleDeadline {
    at: Instant,
    key: Option<usize>,
}

impl IdleDeadline {
    pub fn at(at: Instant) -> Self {
        IdleDeadline { at, key: None }
    }

    pub fn after(d: Duration) -> Self {
        Self::at(Instant::now() + d)
    }

    /// Ready once a sweep found the deadline passed; registers the caller otherwise.
    pub fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        TABLE.with(|t| {
            let mut entries = t.entries.borrow_mut();
            match self.key {
                Some(k) => {
                    let e = &mut entries[k];
                    if e.fired {
                        return Poll::Ready(());
                    }
                    if !e.waker.will_wake(cx.waker()) {
                        e.waker = cx.waker().clone();
                    }
                }
                None => {
                    self.key = Some(entries.insert(Entry {
                        at: self.at,
                        waker: cx.waker().clone(),
                        fired: false,
                    }));
                    if t.earliest.get().is_none_or(|e| self.at < e) {
                        t.earliest.set(Some(self.at));
                    }
                }
            }
            Poll::Pending
        })
    }
}

impl Future for IdleDeadline {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_due(cx)
    }
}

impl Drop for IdleDeadline {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            // The thread's table can be gone already when a runtime ends at thread exit.
            let _ = TABLE.try_with(|t| {
                if let Ok(mut entries) = t.entries.try_borrow_mut() {
                    entries.try_remove(k);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn fires_at_the_first_sweep_after_its_deadline_and_leaves_on_drop() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let t0 = Instant::now();
        let mut early = IdleDeadline::at(t0 + Duration::from_millis(50));
        let mut late = IdleDeadline::at(t0 + Duration::from_secs(60));
        assert!(early.poll_due(&mut cx).is_pending());
        assert!(late.poll_due(&mut cx).is_pending());
        assert_eq!(pending(), 2);
        sweep(t0 + Duration::from_millis(49));
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
        assert!(early.poll_due(&mut cx).is_pending());
        sweep(t0 + Duration::from_millis(70));
        assert_eq!(
            count.0.load(Ordering::Relaxed),
            1,
            "only the due one is woken"
        );
        assert!(early.poll_due(&mut cx).is_ready());
        assert!(late.poll_due(&mut cx).is_pending());
        // A sweep right after another does not scan again; nothing else is due anyway.
        sweep(t0 + Duration::from_millis(75));
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        drop(early);
        drop(late);
        assert_eq!(pending(), 0, "dropped waits leave the table");
        // A wait never polled holds no entry.
        let unpolled = IdleDeadline::after(Duration::ZERO);
        assert_eq!(pending(), 0);
        drop(unpolled);
    }
}
