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
