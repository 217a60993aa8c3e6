//! The control thread's inbox of store news: a bounded channel and a doorbell that wakes the
//! control thread's event loop across threads as news arrives, so another replica's pick
//! reaches the workers without waiting for the next control tick.
//!
//! Owns the channel; the doorbell is a [`crate::mesh::bell`]. The senders (the state and
//! reader threads) never block: a full inbox drops the news (the caller counts it).

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::messages::StoreNews;
use crate::mesh::bell::Bell;
pub use crate::mesh::bell::Doorbell;

/// News the inbox holds before a sender's news is dropped.
const CAPACITY: usize = 256;

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

/// A new inbox, its sender and its doorbell.
pub fn inbox() -> (NewsSender, NewsInbox, Doorbell) {
    let (tx, rx) = crossbeam_channel::bounded(CAPACITY);
    let (bell, doorbell) = Doorbell::new();
    (NewsSender { tx, bell }, NewsInbox { rx }, doorbell)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

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
