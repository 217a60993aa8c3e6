//! The messages on the mesh: what a worker receives (other cores' load snapshots, samples
//! and shared routing state; the control thread's target signals and LoRA table) and what
//! the control thread receives (load snapshots and records).

use std::net::SocketAddr;
use std::sync::Arc;

use rolter_core::{RouteLedger, Sample, ShareBatch, Verdict};
use rolter_engine::lora::LoraTable;

use super::load::TargetSignal;
use crate::access_log::{Cut, Entry};

/// Messages a worker receives.
pub enum ToWorker {
    /// Another core's in-flight counts per target.
    Load { from: usize, snapshot: Arc<[u32]> },
    /// Attempts that finished on another core.
    Samples(Arc<[Sample]>),
    /// What another core's strategies learned from their routing (prefixes, sessions).
    Shared(Arc<ShareBatch>),
    /// What the other replicas shared through the state store (from the control thread).
    FleetShared(Arc<ShareBatch>),
    /// Routes' books beyond this replica's own, from the state store (by route index).
    Ledger(Arc<[(usize, RouteLedger)]>),
    /// The other replicas' requests in flight per target, from the state store.
    FleetLoad(Arc<[u32]>),
    /// The control thread's eligibility and queue depth per target.
    Targets(Arc<[TargetSignal]>),
    /// LoRA adapter residency per target (only while some route reads it).
    Lora(Arc<LoraTable>),
    /// Where new connections to each target go (indexed by target), after a host name
    /// resolved to a new address.
    Addrs(Arc<[SocketAddr]>),
}

/// What the control thread learns of an attempt beyond its sample.
#[derive(Debug, Default, Clone, Copy)]
pub struct AttemptNotes {
    /// How a response that had reached the client was cut off, if it was.
    pub cut: Option<Cut>,
    /// Completion tokens counted from the stream's deltas when no usage was reported.
    pub estimated_completion: u32,
    /// The gateway's error code for a failed attempt (`upstream_connect_failed`, …).
    pub error: Option<&'static str>,
}

/// Messages the control thread receives.
pub enum ToControl {
    Load { from: usize, snapshot: Arc<[u32]> },
    Records(Vec<Record>),
}

/// What a worker reports to the control thread.
#[derive(Debug, Clone)]
pub enum Record {
    /// One upstream attempt of a request on `route`.
    Attempt {
        route: u16,
        sample: Sample,
        verdict: Verdict,
        notes: AttemptNotes,
    },
    /// A finished request, for the access log.
    Request(Box<Entry>),
    /// A strategy could not use its signal and fell back.
    Fallback { route: u16, reason: &'static str },
    /// Picks of a route that shares state with the other replicas since the last tick, by
    /// what decided them (indexed like [`Basis::ALL`](rolter_core::Basis::ALL)).
    Bases { route: u16, counts: [u32; 4] },
    /// A route asked its cache controller before picking: `result` is the lookup's
    /// outcome label; `unknown_instances` counts instance ids in the answer that named no
    /// target of the route.
    CacheLookup {
        route: u16,
        result: &'static str,
        unknown_instances: u32,
    },
    /// A route loaded a LoRA adapter on `target` before forwarding (`load_from`).
    /// `adapter` is the adapter's key ([`adapter_key`](rolter_core::adapter_key)).
    AdapterLoad {
        target: u16,
        adapter: u64,
        loaded: bool,
    },
    /// The gateway answered a request itself (no target reached).
    Gateway { status: u16, code: &'static str },
    /// A client TLS handshake completed (`Ok(version)`, after `seconds`) or failed
    /// (`Err(reason)`).
    TlsHandshake {
        result: Result<&'static str, &'static str>,
        seconds: f64,
    },
    /// A request on `route` is tried again after a failure `retry_on` names (`reason`).
    Retry { route: u16, reason: &'static str },
    /// A hedge on `route` was sent, won its race, or was not sent (`Skipped` with why:
    /// `budget`, `no_target`).
    Hedge { route: u16, event: HedgeEvent },
    /// A request on `route` was not retried because the route's retry budget on the core
    /// was spent; the client got the last attempt's error.
    RetryBudgetExhausted { route: u16 },
    /// `target` answered a 429 (or a 503 with `Retry-After`) and cools until `until`: out
    /// of every core's candidates meanwhile.
    Cooldown {
        target: u16,
        until: std::time::Instant,
    },
    /// `target`'s stream came back without the usage this core asked for: the core counts
    /// its streams' content deltas from now on (sent once per core and configuration).
    UsageUnreported { target: u16 },
    /// A request entered `route`'s queue on this core.
    Queued { route: u16, class: u8 },
    /// A request left `route`'s queue (or found it full: `overflow`, not queued), with how
    /// it ended and how long it waited.
    Queue {
        route: u16,
        /// The request's class (an index in `config.classes`).
        class: u8,
        /// The request's tenant (`path::admit::Admit::tenant`).
        tenant: u32,
        result: &'static str,
        waited: std::time::Duration,
    },
}

/// What became of a route's hedge (`hedge_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeEvent {
    Sent,
    Won,
    Skipped(&'static str),
}
