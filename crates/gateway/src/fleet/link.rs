//! The workers' end of the state thread: a bounded channel and the pick timeout.
//!
//! Sending never blocks (`try_send`; a full queue counts a drop and the pick falls back).
//! Only the `atomic` rotation waits for an answer, on a oneshot channel whose waker the state
//! thread wakes across threads, and never longer than `pick_timeout`.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};
use rolter_config::Config;
use rolter_core::{ShareBatch, TargetId};

use super::messages::ToState;
use super::stats::StoreStats;

/// Capacity of the state thread's queue.
pub const QUEUE: usize = 16 * 1024;

/// A handle on the state thread, one per worker (and one for the control thread).
#[derive(Clone)]
pub struct StoreLink {
    tx: Sender<ToState>,
    pub pick_timeout: Duration,
    stats: Arc<StoreStats>,
}

impl StoreLink {
    pub fn new(tx: Sender<ToState>, pick_timeout: Duration, stats: Arc<StoreStats>) -> Self {
        StoreLink {
            tx,
            pick_timeout,
            stats,
        }
    }

    /// Queues `msg`; false (and a counted drop) when the queue is full or the thread gone.
    pub fn send(&self, msg: ToState) -> bool {
        match self.tx.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.queue_full();
                false
            }
        }
    }

    /// Passes a core's shared items of a tick on to the other replicas.
    pub fn share(&self, config: &Arc<Config>, batch: &Arc<ShareBatch>) {
        self.send(ToState::Share {
            config: config.clone(),
            batch: batch.clone(),
        });
    }

    /// Advances `route`'s shared rotation over `members` by `lease` positions: the targets
    /// in order, or `None` when the store did not answer within `pick_timeout`.
    pub async fn rotate(
        &self,
        config: &Arc<Config>,
        route: usize,
        members: Vec<(u16, f64)>,
        lease: u32,
    ) -> Option<Vec<TargetId>> {
        // While the store is away the pick falls back at once instead of waiting.
        if !self.stats.is_up() {
            return None;
        }
        let (reply, answer) = futures_channel::oneshot::channel();
        let sent = self.send(ToState::Rotate {
            config: config.clone(),
            route: route as u16,
            members,
            lease,
            reply,
        });
        if !sent {
            return None;
        }
        match monoio::time::timeout(self.pick_timeout, answer).await {
            Ok(Ok(targets)) => Some(targets.into_iter().map(usize::from).collect()),
            Ok(Err(_)) => None,
            Err(_) => {
                self.stats.pick_timed_out();
                None
            }
        }
    }
}
