//! Rolter's shared state on Redis or Valkey: what several gateway replicas agree on.
//!
//! The only crate that speaks to the store. It is a low layer, depending on no other Rolter
//! crate, and blocking: the gateway calls it from one dedicated state thread, never from a
//! worker. Its modules:
//!
//! - [`settings`]: URLs, topology (standalone, Sentinel, Cluster), credentials, TLS CA,
//!   timeouts, key prefix.
//! - `connect`: one connection per topology, timeouts applied.
//! - `batch`: several commands in one round trip, on a server or a cluster.
//! - `key_layout`: the key layout, every key `{<prefix>}:…` (one hash tag, one cluster slot).
//! - [`error`]: [`StoreError`], and whether a connection must be replaced.
//! - [`rotation`]: the shared smooth weighted round-robin, one script call per lease, and
//!   [`swrr_reference`], the same rule in Rust.
//! - [`ledger`]: fair_catchup's picks and received counts per wall-clock bucket.
//! - [`key_use`]: the client API keys' requests and tokens per minute over the fleet.
//! - [`items`]: session pins, prefix insertions and assignments on one stream.
//! - `load`: each replica's in-flight counts, read back as the fleet's.
//! - [`watch`]: both streams followed as they grow (one blocking `XREAD`).
//! - `store`: [`Store`], the connection and its calls.
//! - `testing` (feature `testing`): a real `redis-server` on a loopback port.

mod batch;
mod connect;
pub mod error;
pub mod items;
mod key_layout;
pub mod key_use;
pub mod ledger;
mod load;
pub mod rotation;
pub mod settings;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watch;

pub use error::StoreError;
pub use items::Item;
pub use key_use::KeyUse;
pub use ledger::{LedgerBucket, LedgerRow};
pub use rotation::{swrr_reference, RotateAsk};
pub use settings::{StoreSettings, Topology};
pub use store::Store;
pub use watch::{Cursor, Entry, LoadEntry, News};
