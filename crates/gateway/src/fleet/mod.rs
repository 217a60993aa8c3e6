//! The fleet plane: what this replica shares with the other replicas of its fleet through the
//! shared state store (`[state]`, Redis or Valkey), beside the mesh that does the same between
//! the cores of one replica.
//!
//! - [`link`]: the workers' end: a bounded channel to the state thread, never waited on
//!   except by a pick that needs the store's answer (the `atomic` rotation), for at most
//!   `pick_timeout`.
//! - [`messages`]: what goes to the state thread (rotation asks, shared items, load, the
//!   running configuration) and what comes back to the control thread (the other replicas'
//!   items, books and load, by name).
//! - [`thread`]: the state thread, the only place that talks to the store: one connection
//!   (`rolter_store::Store`), rotation asks answered as they come (pipelined), items and
//!   load written as they come, books and key use once per `sync_interval`, reconnecting
//!   every `retry_interval` while the store is away.
//! - [`reader`]: the reader thread, on a connection of its own, waiting on the item and
//!   load streams, so the other replicas' picks and load reach this one as they happen.
//! - [`stats`]: its counters and status, for `/metrics` (`rolter_state_*`) and `/admin/state`.
//! - [`inbox`]: the control thread's inbox of that news, with a doorbell that wakes its
//!   event loop as news arrives.
//! - [`news`]: the control thread's side: the store's news mapped onto this configuration's
//!   route and target indices, for the workers.
//!
//! The store's client blocks on its socket, so it runs on its own threads, never on a
//! worker or the control thread's event loop.

pub mod inbox;
pub mod link;
pub mod messages;
pub mod news;
pub mod reader;
pub mod stats;
pub mod thread;

pub use link::StoreLink;
pub use messages::{StoreNews, ToState};
pub use stats::StoreStats;
