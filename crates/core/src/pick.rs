//! A strategy's answer.

/// A strategy's choice: an index into the candidate slice, and the score that won when the
/// strategy scores (for the explain headers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub index: usize,
    pub score: Option<f64>,
    /// Set when the strategy could not use its own signal and fell back (cold targets, a
    /// kill switch, a missing input): a short static reason, counted in the gateway's
    /// metrics (`rolter_strategy_fallbacks_total{route,strategy,reason}`).
    pub fallback: Option<&'static str>,
}

impl Pick {
    pub fn at(index: usize) -> Pick {
        Pick {
            index,
            score: None,
            fallback: None,
        }
    }

    /// A pick made by a fallback path, with its reason.
    pub fn fallback(index: usize, reason: &'static str) -> Pick {
        Pick {
            index,
            score: None,
            fallback: Some(reason),
        }
    }
}

/// What decided a pick on a route that shares state with the other gateway replicas: this
/// replica's own information, or what it learned from the others (a session pin or a
/// prefix another replica routed, or their requests in flight changing the choice).
/// Counted per route in `rolter_routing_basis_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Basis {
    #[default]
    Local,
    SharedPin,
    SharedPrefix,
    SharedLoad,
}

impl Basis {
    pub const ALL: [Basis; 4] = [
        Basis::Local,
        Basis::SharedPin,
        Basis::SharedPrefix,
        Basis::SharedLoad,
    ];

    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Basis::Local => "local",
            Basis::SharedPin => "shared_pin",
            Basis::SharedPrefix => "shared_prefix",
            Basis::SharedLoad => "shared_load",
        }
    }
}
