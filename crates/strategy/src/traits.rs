//! What a strategy advertises about itself (the Balance document's "Modes": weighted,
//! single-winner, stateful, health_check), as `rolter strategies` lists it.

/// What a strategy advertises about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trait {
    /// Honours target weights.
    Weighted,
    /// Keeps state between picks.
    Stateful,
    /// Reads the live load view.
    LoadAware,
    /// Needs an asynchronous input before it can pick.
    AsyncInput,
    /// Consults health beyond the candidate filter.
    HealthAware,
    /// Always one winner per pick.
    SingleWinner,
}

impl Trait {
    pub fn label(self) -> &'static str {
        match self {
            Trait::Weighted => "weighted",
            Trait::Stateful => "stateful",
            Trait::LoadAware => "load-aware",
            Trait::AsyncInput => "async-input",
            Trait::HealthAware => "health-aware",
            Trait::SingleWinner => "single-winner",
        }
    }
}
