//! One eligible target as a strategy sees it.

use crate::{Residency, TargetId};

/// One eligible target, as a strategy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Candidate {
    pub target: TargetId,
    /// Effective weight (> 0: a drained target, weight 0, is never a candidate).
    pub weight: f64,
    /// Requests in flight to this target (every core) plus its engine queue depth when known.
    pub load: u64,
    /// Of `load`, the other gateway replicas' requests in flight (routes with `fleet_load`;
    /// 0 otherwise).
    pub fleet_load: u64,
    /// Failover tier (0 = primary).
    pub tier: u32,
    /// The engine's own waiting queue from a fresh scrape (0 when unknown; part of `load`).
    pub queue_depth: u64,
    /// The engine's KV-cache use in [0, 1] from a fresh scrape, when known.
    pub kv_usage: Option<f32>,
    /// What this target holds of the requested LoRA adapter; filled in only for strategies
    /// that ask for [`Needs::LORA_RESIDENCY`](crate::Needs::LORA_RESIDENCY), else unknown.
    pub lora: Residency,
}
