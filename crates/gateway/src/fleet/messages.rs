//! What travels to and from the state thread.
//!
//! Workers and the control thread send [`ToState`] (bounded channel, `try_send`: a full
//! queue drops the message and the drop is counted). The state thread sends [`StoreNews`] to
//! the control thread, by route and target name, since the other replicas may run another
//! configuration.

use std::sync::Arc;

use rolter_config::Config;
use rolter_core::ShareBatch;

/// A message for the state thread.
pub enum ToState {
    /// Advance `route`'s shared rotation over `members` (target index, weight) by `lease`
    /// positions; the reply lists the targets in order. A dropped reply means the store
    /// could not answer.
    Rotate {
        config: Arc<Config>,
        route: u16,
        members: Vec<(u16, f64)>,
        lease: u32,
        reply: futures_channel::oneshot::Sender<Vec<u16>>,
    },
    /// One core's shared routing items of a tick, indexed by `config`'s routes and targets.
    Share {
        config: Arc<Config>,
        batch: Arc<ShareBatch>,
    },
    /// This replica's requests in flight per target (every core), by `config`'s targets.
    Load {
        config: Arc<Config>,
        in_flight: Vec<u32>,
    },
    /// The client API keys' new requests and tokens in `minute` (of the Unix clock) on
    /// this replica, by key name (`[auth] share_limits`).
    KeyUse {
        minute: u64,
        rows: Vec<rolter_store::KeyUse>,
    },
    /// The running configuration, after a reload.
    Config(Arc<Config>),
}

/// What the store said about the other replicas, by name.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreNews {
    /// Shared items of other replicas, oldest first.
    Items(Vec<rolter_store::Item>),
    /// Per route with durable books: the picks and per-target assignments over its window
    /// that are not this process's own.
    Ledgers(Vec<LedgerNews>),
    /// The other live replicas' requests in flight, summed per target name.
    FleetLoad(Vec<(String, u64)>),
    /// The other replicas' requests and tokens per client API key in `minute`.
    KeyUse {
        minute: u64,
        others: Vec<rolter_store::KeyUse>,
    },
}

/// One route's books beyond this process's own.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerNews {
    pub route: String,
    pub picks: u64,
    pub received: Vec<(String, u64)>,
}
