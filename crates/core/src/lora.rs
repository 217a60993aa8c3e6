//! What a target holds of a LoRA adapter, and the 64-bit key adapter names are compared by.
//!
//! Adapter names never reach a worker: the control thread hashes each one with
//! [`adapter_key`], and the worker hashes the request's `model` the same way, so a lookup
//! compares integers.

/// Seed of [`adapter_key`], so adapter keys do not coincide with other xxh3 keys.
const KEY_SEED: u64 = 0x6c6f_7261_5f6b_6579;

/// The 64-bit key of an adapter (or model) name: what the control thread publishes and the
/// worker looks up.
#[inline]
pub fn adapter_key(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), KEY_SEED)
}

/// What one target holds of the requested adapter, as flags. The gateway computes it per
/// candidate for routes whose strategy asks for [`Needs::LORA_RESIDENCY`](crate::Needs::LORA_RESIDENCY); `UNKNOWN`
/// (no flag) everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Residency(u8);

impl Residency {
    /// Nothing known about this target.
    pub const UNKNOWN: Residency = Residency(0);
    /// The requested model is an adapter some target reports (the same on every candidate).
    pub const ADAPTER: Residency = Residency(1);
    /// A fresh `vllm:lora_requests_info` for this target: the flags below up to
    /// `FREE_SLOT` are meaningful.
    pub const SLOTS_KNOWN: Residency = Residency(2);
    /// The adapter has running requests on this target.
    pub const RUNNING: Residency = Residency(4);
    /// The adapter has waiting requests on this target.
    pub const WAITING: Residency = Residency(8);
    /// Fewer adapters run on this target than its `max_lora`.
    pub const FREE_SLOT: Residency = Residency(16);
    /// A fresh `GET /v1/models` for this target: `LOADED` is meaningful.
    pub const LISTED: Residency = Residency(32);
    /// The adapter is registered on this target (listed with a `parent`).
    pub const LOADED: Residency = Residency(64);

    pub const fn union(self, other: Residency) -> Residency {
        Residency(self.0 | other.0)
    }

    /// These flags without `other`'s.
    pub const fn without(self, other: Residency) -> Residency {
        Residency(self.0 & !other.0)
    }

    pub const fn contains(self, other: Residency) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any fresh LoRA signal exists for this target.
    pub const fn known(self) -> bool {
        self.0 & (Self::SLOTS_KNOWN.0 | Self::LISTED.0) != 0
    }

    /// The rung of the residency ladder this target is on.
    pub fn level(self) -> Level {
        if !self.known() {
            return Level::Unknown;
        }
        if self.contains(Self::RUNNING) {
            return Level::Running;
        }
        // Where the adapter list is known, a target that does not list the adapter cannot
        // serve it (vLLM answers 404), free slot or not.
        let servable = !self.contains(Self::LISTED) || self.contains(Self::LOADED);
        let slot = self.contains(Self::FREE_SLOT) || !self.contains(Self::SLOTS_KNOWN);
        if servable && slot {
            Level::FreeSlot
        } else if self.contains(Self::WAITING) {
            Level::Waiting
        } else if self.contains(Self::LOADED) {
            Level::Loaded
        } else {
            Level::None
        }
    }
}

/// The residency ladder, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No fresh signal for this target.
    Unknown,
    /// Known not to hold the adapter (or to hold it with no slot and nothing waiting).
    None,
    /// Registered, but every adapter slot is busy and nothing for it waits.
    Loaded,
    /// Requests for the adapter wait there.
    Waiting,
    /// A free adapter slot where the adapter is (or may be) registered.
    FreeSlot,
    /// Requests for the adapter run there.
    Running,
}
