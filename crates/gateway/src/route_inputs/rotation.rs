//! A route's shared rotation (`round_robin` with `atomic = true`) as one core uses it: the
//! positions this core leased from the store and the candidate set they were leased for.
//!
//! With `lease = 1` every pick asks the store (one script call in the state thread's next
//! pipeline). With `lease = N` a core takes N consecutive positions at once and uses them
//! for its next picks while the candidates stay the same; a change of candidates (an
//! ejection, a reload, a target at its limit) discards what is left, since those positions
//! were computed for the old set.
//!
//! Owns the lease. It must not wait longer than the link's `pick_timeout`; without an answer
//! the pick falls back to the strategy's own cursor.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

use rolter_config::Config;
use rolter_core::TargetId;

use crate::fleet::StoreLink;

/// One core's lease of a route's shared rotation.
pub struct Rotation {
    lease: u32,
    /// Leased targets not yet used, and the member set (target, weight) they are for.
    queue: RefCell<VecDeque<TargetId>>,
    leased_for: RefCell<Vec<(u16, f64)>>,
}

impl Rotation {
    pub fn new(lease: u32) -> Self {
        Rotation {
            lease: lease.max(1),
            queue: RefCell::new(VecDeque::with_capacity(lease as usize)),
            leased_for: RefCell::new(Vec::new()),
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
        if self.lease > 1 {
            let mut queue = self.queue.borrow_mut();
            if *self.leased_for.borrow() == members {
                if let Some(t) = queue.pop_front() {
                    return Some(t);
                }
            } else {
                queue.clear();
            }
        }
        let targets = link
            .rotate(config, route, members.clone(), self.lease)
            .await?;
        let (first, rest) = targets.split_first()?;
        if self.lease > 1 {
            let mut leased_for = self.leased_for.borrow_mut();
            let mut queue = self.queue.borrow_mut();
            if *leased_for != members {
                queue.clear();
                *leased_for = members;
            }
            queue.extend(rest.iter().copied());
        }
        Some(*first)
    }
}
