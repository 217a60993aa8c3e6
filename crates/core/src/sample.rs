//! What one finished upstream attempt teaches, and what it says about its target.

use std::time::{Duration, Instant};

use crate::TargetId;

/// What one finished upstream attempt teaches. Every core's strategies see every sample:
/// their own core's at once, the other cores' within one signal exchange period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub target: TargetId,
    /// Response status; 0 when no response head arrived (connect error, timeout, reset).
    pub status: u16,
    /// A 2xx response relayed to its end. Only successes teach latency.
    pub success: bool,
    /// From the request being sent upstream to the first body byte of an event stream:
    /// the first token's. `None` for a plain answer, whose first byte comes when the
    /// engine has generated all of it.
    pub ttft: Option<Duration>,
    /// From the request being sent upstream to the first response body byte, of any
    /// answer (for a plain one, its generation's whole time).
    pub first_byte: Option<Duration>,
    /// From the request being sent upstream to the end of the response.
    pub duration: Duration,
    /// The load the gateway saw for this target when it sent the request.
    pub load_at_send: u64,
    /// The request's estimated prompt tokens (what the strategy saw at pick time).
    pub prompt_tokens: u32,
    /// Token usage as the response reported it, when it did.
    pub usage: Option<Usage>,
    /// When the attempt ended.
    pub finished: Instant,
}

/// Token usage reported by the engine (`usage` in the body or the last stream event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// How an attempt ended, for health and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A 2xx response relayed to its end.
    Success,
    /// The target failed: connect error, timeout, reset, malformed or 5xx response, or a
    /// stream cut off by the upstream.
    TargetFailed,
    /// The target answered, not with success, but not at fault either (4xx, 429).
    Answered,
    /// The client went away first; says nothing about the target.
    ClientGone,
}
