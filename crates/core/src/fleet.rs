//! What the other gateway replicas did, as the shared state store last reported it: the
//! picks and per-target assignments of a route over a window (the books of `fair_catchup`
//! with `durable = true`).
//!
//! Owns plain data only. The state thread fills it in; strategies add it to their own books.

use crate::TargetId;

/// A route's assignments by the other replicas (and by this replica's earlier runs) over
/// the window, as the store holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteLedger {
    /// Picks the route made, summed over the window.
    pub picks: u64,
    /// Picks that landed on each target, summed over the window (targets of the route only).
    pub received: Vec<(TargetId, u64)>,
}
