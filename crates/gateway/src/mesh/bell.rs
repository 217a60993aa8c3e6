//! `Bell`: wakes a thread's event loop from another thread. The store's news rings the
//! control thread's bell as it arrives; a worker rings it after sending records while the
//! control thread sleeps through a quiet tick.
//!
//! Owns a ring count, the sleeper's flag and its waker slot. A ring that finds the sleeper
//! awake costs one fence and one load ([`ring_if_asleep`](Bell::ring_if_asleep)); the lock
//! guards only the waker slot and is taken by the sleeper and by a ring that must wake it,
//! so a busy worker never takes it.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

/// The rings, whether the waiting side sleeps, and its waker.
#[derive(Default)]
pub struct Bell {
    rings: AtomicU64,
    asleep: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Bell {
    /// Rings: the next (or current) [`Doorbell::rung`] resolves.
    pub fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }

    /// Rings only when the waiting side said it sleeps ([`Doorbell::sleep`]). Called after
    /// what it should see was sent: either the sleeper sees that, or this sees it asleep.
    #[inline]
    pub fn ring_if_asleep(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) {
            self.ring();
        }
    }
}

/// The waiting side of a [`Bell`].
pub struct Doorbell {
    bell: Arc<Bell>,
    seen: u64,
}

impl Doorbell {
    /// A new bell and its waiting side.
    pub fn new() -> (Arc<Bell>, Doorbell) {
        let bell = Arc::new(Bell::default());
        (bell.clone(), Doorbell { bell, seen: 0 })
    }

    /// Says the waiting side sleeps until rung: from now on
    /// [`ring_if_asleep`](Bell::ring_if_asleep) rings. The caller looks once more for what
    /// it waits for after this, and then waits on [`rung`](Doorbell::rung).
    pub fn sleep(&self) {
        self.bell.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Says the waiting side is awake again.
    pub fn wake(&self) {
        self.bell.asleep.store(false, Ordering::SeqCst);
    }

    /// Resolves once the bell rang since the last time it resolved (at once if it did).
    pub async fn rung(&mut self) {
        std::future::poll_fn(|cx| {
            if let Ok(mut slot) = self.bell.waker.lock() {
                // Read under the lock a ring takes: a ring comes after the waker is in, or
                // its count is seen here.
                let rings = self.bell.rings.load(Ordering::SeqCst);
                if rings != self.seen {
                    self.seen = rings;
                    *slot = None;
                    return Poll::Ready(());
                }
                *slot = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> monoio::Runtime<monoio::LegacyDriver> {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap()
    }

    /// Whether `f` is still pending after one poll.
    fn pending<F: std::future::Future>(f: F) -> bool {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        f.as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    }

    #[test]
    fn a_ring_from_another_thread_wakes_the_waiting_loop() {
        let (bell, mut door) = Doorbell::new();
        runtime().block_on(async move {
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                bell.ring();
                bell
            });
            door.rung().await;
            let bell = t.join().unwrap();
            // Two rings before the next wait: one wake, and the wait after waits again.
            bell.ring();
            bell.ring();
            door.rung().await;
            assert!(pending(door.rung()));
        });
    }

    #[test]
    fn only_a_sleeping_side_is_rung_by_ring_if_asleep() {
        let (bell, mut door) = Doorbell::new();
        bell.ring_if_asleep();
        assert!(pending(door.rung()), "awake: nothing rang");
        door.sleep();
        bell.ring_if_asleep();
        assert!(!pending(door.rung()), "asleep: the ring is seen");
        door.wake();
        bell.ring_if_asleep();
        assert!(pending(door.rung()), "awake again");
    }

    #[test]
    fn a_sleeping_loop_is_woken_by_a_ring_from_another_thread() {
        let (bell, mut door) = Doorbell::new();
        runtime().block_on(async move {
            door.sleep();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                bell.ring_if_asleep();
            });
            door.rung().await;
            door.wake();
            t.join().unwrap();
        });
    }
}
