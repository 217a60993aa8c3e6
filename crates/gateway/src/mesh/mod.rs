//! The per-core mesh: how what one core knows reaches the others and the control thread
//! without locks.
//!
//! - [`load`]: a worker's load view: its own exact in-flight counts, the other cores' latest
//!   snapshots, the control thread's target signals (eligibility, engine queue, KV-cache use)
//!   and the LoRA residency table.
//! - [`messages`]: what travels: load snapshots, attempt samples, shared routing state,
//!   records for the control thread, target signals and LoRA tables for the workers.
//! - [`caps`]: the hard caps every core shares: each target's exact admission count
//!   (`max_concurrent`) and the process's client connections (`server.max_connections`),
//!   the only atomics the cores share on the request path.
//! - [`key_limits`]: the client API keys' shared windows (`requests_per_minute`,
//!   `tokens_per_minute`, exact per gateway) and their counts for `/metrics`.
//! - [`polling`]: the time the workers spent busy polling, for `/metrics`.
//! - [`bell`]: wakes a thread's event loop from another thread (the control thread's, as
//!   the store's news or a worker's records arrive while it sleeps through a quiet tick).
//! - [`links`]: both ends of the bounded crossbeam channels, the heartbeat that re-sends a
//!   full snapshot so a dropped one heals, and the drop counters.
//!
//! Workers only push into channels (`try_send`) and drain them (`try_recv`); nothing here
//! blocks or does I/O, and the only lock (the bell's waker slot) is taken by a worker only
//! on the tick that finds the control thread asleep.

pub mod admission;
pub mod bell;
pub mod caps;
pub mod key_limits;
pub mod links;
pub mod load;
pub mod messages;
pub mod polling;

pub use links::{mesh, ControlLinks, Kind, MeshDrops, WorkerLinks, HEARTBEAT_TICKS, INBOX};
pub use messages::{Record, ToControl, ToWorker};

#[cfg(test)]
mod tests;
