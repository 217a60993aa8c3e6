//! The address each target's new connections go to, on one core: the one resolved at load
//! until the control thread sends a new table (its DNS book re-resolves host names).
//!
//! Owned by one worker (`Cell`s, no locks). Applying a table changes only where new
//! connections go; pooled connections to an old address are used until they close. It
//! must not resolve anything itself.

use std::cell::Cell;
use std::net::SocketAddr;

use rolter_config::{Config, TargetId};

/// Per-target current address, indexed by target id.
pub struct TargetAddrs {
    addrs: Box<[Cell<SocketAddr>]>,
}

impl TargetAddrs {
    /// The addresses resolved when `config` was loaded.
    pub fn new(config: &Config) -> Self {
        TargetAddrs {
            addrs: config.targets.iter().map(|t| Cell::new(t.addr)).collect(),
        }
    }

    /// Where a new connection to `t` goes.
    #[inline]
    pub fn get(&self, t: TargetId) -> SocketAddr {
        self.addrs[t].get()
    }

    /// Takes the control thread's table (indexed by target id; a table of another length,
    /// from another configuration, is ignored).
    pub fn apply(&self, table: &[SocketAddr]) {
        if table.len() != self.addrs.len() {
            return;
        }
        for (cell, &addr) in self.addrs.iter().zip(table) {
            cell.set(addr);
        }
    }
}
