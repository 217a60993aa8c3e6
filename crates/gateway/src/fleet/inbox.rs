//! The control thread's inbox of store news: a bounded channel and a doorbell that wakes the
//! control thread's event loop across threads as news arrives, so another replica's pick
//! reaches the workers without waiting for the next control tick.
//!
//! Owns the channel and the waker slot. The senders (the state and reader threads) never
//! block: a full inbox drops the news (the caller counts it). The lock guards only the
//! waker slot, between the control thread and a sender; no worker takes it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::messages::StoreNews;

/// News the inbox holds before a sender's news is dropped.
const CAPACITY: usize = 256;

/// The rings and the control thread's waker.
#[derive(Default)]
struct Bell {
    rings: AtomicU64,
    waker: Mutex<Option<Waker>>,
}

impl Bell {
    fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }
}

/// A sender's end.
#[derive(Clone)]
pub struct NewsSender {
    tx: Sender<StoreNews>,
    bell: Arc<Bell>,
}

impl NewsSender {
    /// Queues `news` and wakes the control thread; false when the inbox is full or gone.
    pub fn send(&self, news: StoreNews) -> bool {
        let sent = self.tx.try_send(news).is_ok();
        if sent {
            self.bell.ring();
        }
        sent
    }
}

/// The control thread's end: the news, read on its tick or when the doorbell rings.
pub struct NewsInbox {
    rx: Receiver<StoreNews>,
}

impl NewsInbox {
    pub fn try_recv(&self) -> Result<StoreNews, TryRecvError> {
        self.rx.try_recv()
    }
}

/// What the control thread's event loop waits on beside its tick.
pub struct Doorbell {
    bell: Arc<Bell>,
    seen: u64,
}

impl Doorbell {
    /// Resolves once news arrived since the last time it resolved (at once if some did).
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

/// A new inbox, its sender and its doorbell.
pub fn inbox() -> (NewsSender, NewsInbox, Doorbell) {
    let (tx, rx) = crossbeam_channel::bounded(CAPACITY);
    let bell = Arc::new(Bell::default());
    (
        NewsSender {
            tx,
            bell: bell.clone(),
        },
        NewsInbox { rx },
        Doorbell { bell, seen: 0 },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_from_another_thread_wakes_the_waiting_loop() {
        let (tx, rx, mut bell) = inbox();
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        rt.block_on(async move {
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                assert!(tx.send(StoreNews::FleetLoad(Vec::new())));
                tx
            });
            bell.rung().await;
            assert!(matches!(rx.try_recv(), Ok(StoreNews::FleetLoad(_))));
            let tx = t.join().unwrap();
            // Two rings before the next wait: one wake, and the wait after waits again.
            tx.send(StoreNews::FleetLoad(Vec::new()));
            tx.send(StoreNews::FleetLoad(Vec::new()));
            bell.rung().await;
            let mut later = std::pin::pin!(bell.rung());
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(std::future::Future::poll(later.as_mut(), cx).is_pending())
            });
            assert!(polled.await, "a seen ring resolved a second wait");
        });
    }
}
