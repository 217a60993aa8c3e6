//! Rolter's data plane and the planes beside it.
//!
//! The request's way, top to bottom:
//!
//! - [`runtime`]: the threads: one pinned worker per core with its own monoio runtime
//!   (io_uring or epoll) and SO_REUSEPORT listener, the control thread, the engine-state
//!   threads; start, drain, stop ([`Gateway`]).
//! - [`path`]: the request path on a worker, as named stages: connection loop → route →
//!   inputs → pick → attempt → relay → record, over the worker's per-core state.
//! - [`route_clients`]: the clients of what a route's strategy needs (token ids, an LMCache
//!   lookup, adapter loads).
//! - [`upstream`]: the thin upstream client: each target's current address, connect (TCP,
//!   TLS), the per-core keep-alive pool, the one connection policy every call follows,
//!   buffered side calls.
//!
//! Beside it:
//!
//! - [`mesh`]: the per-core load view and the lock-free channels between cores and the
//!   control thread (snapshots with a heartbeat, samples, shared routing state, records).
//! - [`fleet`]: what this replica shares with the others through the shared state store
//!   (`[state]`): the state thread, its link from the workers, its news for the control thread.
//! - [`control`]: the control plane: health book, scrapes, LoRA book, DNS book, merged
//!   metrics, the signals and address tables it publishes to the workers; [`admin`] is its listener, [`metrics`] its
//!   Prometheus text.
//! - [`strategies`]: each route's strategy instances built from the configuration.
//! - [`lifecycle`]: the drain and stop flags; [`reload`]: what a reload reports and counts.
//! - [`access_log`]: the per-request entries, their JSON lines and the writer thread.
//! - [`trace`]: the OpenTelemetry spans (`[tracing]`): ids, sampling, the OTLP exporter
//!   thread.
//! - [`notify`]: the service manager's notification protocol (sd_notify) and watchdog.
//!
//! Below it, in their own crates: the shared values (`rolter-core`), the HTTP and API
//! codec (`rolter-codec`), the strategies (`rolter-strategy`), the configuration
//! (`rolter-config`), what the engines tell (`rolter-engine`) and tokenization
//! (`rolter-tokenize`).

pub mod access_log;
pub mod admin;
pub mod control;
pub mod fleet;
pub mod lifecycle;
pub mod mesh;
pub mod metrics;
pub mod notify;
pub mod path;
pub mod reload;
pub mod route_clients;
pub mod runtime;
pub mod strategies;
pub mod trace;
pub mod upstream;

pub use runtime::driver::ActiveDriver;
pub use runtime::Gateway;
