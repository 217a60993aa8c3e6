//! A route's shared rotation (`round_robin` with `atomic = true`) as one core uses it: the
//! positions this core leased from the store and the candidate set they were leased for.
//!
//! With `lease = 1` every pick asks the store (one script call in the state thread's next
//! pipeline). With `lease = N` a core takes N consecutive positions at once and uses them
//! for its next picks while the candidates stay the same; a change of candidates (an
//! ejection, a reload, a target at its limit) discards what is left, since those positions
//! were computed for the old set. One ask per core is in flight at a time: picks that find
//! the lease empty while it runs wait for it and take the next positions of its answer, in
//! order, so a core's picks are one run of consecutive positions.
//!
//! Owns the lease. It must not wait longer than the link's `pick_timeout`; without an answer
//! the pick falls back to the strategy's own cursor.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use futures_channel::oneshot;
use rolter_config::Config;
use rolter_core::TargetId;

use crate::fleet::StoreLink;

/// One core's lease of a route's shared rotation.
pub struct Rotation {
    lease: u32,
    /// Leased targets not yet used, and the member set (target, weight) they are for.
    queue: RefCell<VecDeque<TargetId>>,
    leased_for: RefCell<Vec<(u16, f64)>>,
    /// An ask is in flight on this core, and the picks waiting for its answer.
    asking: Cell<bool>,
    waiters: RefCell<VecDeque<oneshot::Sender<Option<TargetId>>>>,
}

/// Clears the in-flight mark however the asking pick ends (answered, timed out, or dropped
/// with its request); waiters left without an answer then time out into their fallback.
struct Asking<'a>(&'a Cell<bool>);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl Rotation {
    pub fn new(lease: u32) -> Self {
        Rotation {
            lease: lease.max(1),
            queue: RefCell::new(VecDeque::with_capacity(lease as usize)),
            leased_for: RefCell::new(Vec::new()),
            asking: Cell::new(false),
            waiters: RefCell::new(VecDeque::new()),
        }
    }

    /// The next target of the shared rotation over `members` (the pick's candidates, as
    /// target and weight), or `None` when the store did not answer in time.
    pub async fn next(
        &self,
        link: &StoreLink,
        config: &Arc<Config>,
        route: usize,
        members: Vec<(u16, f64)>,
    ) -> Option<TargetId> {
        if self.lease == 1 {
            let targets = link.rotate(config, route, members, 1).await?;
            return targets.first().copied();
        }
        loop {
            {
                let mut queue = self.queue.borrow_mut();
                if *self.leased_for.borrow() == members {
                    if let Some(t) = queue.pop_front() {
                        return Some(t);
                    }
                } else {
                    queue.clear();
                }
            }
            if !self.asking.get() {
                break;
            }
            // Another pick on this core is asking: take a position of its answer.
            let (tx, rx) = oneshot::channel();
            self.waiters.borrow_mut().push_back(tx);
            match monoio::time::timeout(link.pick_timeout, rx).await {
                Ok(Ok(Some(t))) => return Some(t),
                // Its answer had no position left for this pick: ask (or wait) again.
                Ok(Ok(None)) => continue,
                Ok(Err(_)) | Err(_) => return None,
            }
        }
        self.asking.set(true);
        let asking = Asking(&self.asking);
        let answer = link
            .rotate(config, route, members.clone(), self.lease)
            .await;
        drop(asking);
        let Some(targets) = answer else {
            // The waiters' senders go with them: they fall back too.
            self.waiters.borrow_mut().clear();
            return None;
        };
        let mut positions = targets.into_iter();
        let first = positions.next();
        let mut waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        let mut rest: VecDeque<TargetId> = VecDeque::new();
        for t in positions.by_ref() {
            // In order: each waiting pick takes the next position; one that stopped
            // waiting leaves it for the lease.
            let mut placed = false;
            while let Some(w) = waiters.pop_front() {
                if w.send(Some(t)).is_ok() {
                    placed = true;
                    break;
                }
            }
            if !placed {
                rest.push_back(t);
                break;
            }
        }
        rest.extend(positions);
        // Waiters beyond the lease ask again.
        for w in waiters {
            let _ = w.send(None);
        }
        let mut leased_for = self.leased_for.borrow_mut();
        let mut queue = self.queue.borrow_mut();
        if *leased_for != members {
            queue.clear();
            *leased_for = members;
        }
        queue.extend(rest);
        first
    }
}
