//! Run-time switches the control plane flips for every core at once.

use std::sync::atomic::{AtomicBool, Ordering};

/// Run-time switches the control plane flips for every core at once (admin API).
#[derive(Debug)]
pub struct Switches {
    /// The `adaptive` blend; off sends every adaptive route to its fallback strategy.
    adaptive: AtomicBool,
}

impl Switches {
    pub fn new(adaptive: bool) -> Self {
        Switches {
            adaptive: AtomicBool::new(adaptive),
        }
    }

    /// Whether adaptive routes blend (read on every adaptive pick; a relaxed load).
    #[inline]
    pub fn adaptive(&self) -> bool {
        self.adaptive.load(Ordering::Relaxed)
    }

    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Ordering::Relaxed);
    }
}

impl Default for Switches {
    fn default() -> Self {
        Switches::new(true)
    }
}
