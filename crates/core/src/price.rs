//! Prices per 1M tokens, and the book cost-aware strategies read them from.
//!
//! The book is resolved once per configuration (by the configuration crate) and only looked
//! up afterwards: a small per-target table, no allocation per lookup.

use std::collections::HashMap;

use crate::TargetId;

/// A model's price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Currency units per 1M input tokens.
    pub input_per_mtok: f64,
    /// Currency units per 1M output tokens.
    pub output_per_mtok: f64,
}

/// Prices per 1M tokens (input, output) of well-known managed models, keyed by the name the
/// upstream expects. Operators override any of them in `[catalog]` or per target.
pub const BUILTIN: &[(&str, f64, f64)] = &[
    ("gpt-4o", 2.50, 10.00),
    ("gpt-4o-mini", 0.15, 0.60),
    ("gpt-4.1", 2.00, 8.00),
    ("gpt-4.1-mini", 0.40, 1.60),
    ("gpt-4.1-nano", 0.10, 0.40),
    ("o3", 2.00, 8.00),
    ("o3-mini", 1.10, 4.40),
    ("o4-mini", 1.10, 4.40),
    ("gpt-3.5-turbo", 0.50, 1.50),
    ("claude-3-5-haiku-latest", 0.80, 4.00),
    ("claude-3-5-sonnet-latest", 3.00, 15.00),
    ("claude-3-7-sonnet-latest", 3.00, 15.00),
    ("claude-sonnet-4-0", 3.00, 15.00),
    ("claude-opus-4-0", 15.00, 75.00),
    ("gemini-2.0-flash", 0.10, 0.40),
    ("gemini-2.5-flash", 0.30, 2.50),
    ("gemini-2.5-pro", 1.25, 10.00),
    ("deepseek-chat", 0.27, 1.10),
    ("deepseek-reasoner", 0.55, 2.19),
    ("mistral-large-latest", 2.00, 6.00),
    ("mistral-small-latest", 0.20, 0.60),
];

/// The built-in price of an upstream model name, if the catalog knows it.
pub fn builtin(model: &str) -> Option<Price> {
    BUILTIN
        .iter()
        .find(|(name, _, _)| *name == model)
        .map(|&(_, input, output)| Price {
            input_per_mtok: input,
            output_per_mtok: output,
        })
}

/// Resolved prices per target and public model name.
#[derive(Debug, Clone, Default)]
pub struct PriceBook {
    targets: Vec<TargetPrices>,
}

/// One target's prices.
#[derive(Debug, Clone, Default)]
pub struct TargetPrices {
    /// The target's own `price`: applies to every model it serves.
    pub fixed: Option<Price>,
    /// Public model name → price of the upstream model it maps to.
    pub by_model: Vec<(String, Price)>,
    /// `[catalog]` entries (over the built-in catalog), for a target that serves any model
    /// without listing them.
    pub catalog: HashMap<String, Price>,
}

impl PriceBook {
    /// A book over the given per-target prices, indexed by target id.
    pub fn from_targets(targets: Vec<TargetPrices>) -> PriceBook {
        PriceBook { targets }
    }

    /// A book with one fixed price per target (tests, benchmarks).
    pub fn fixed(prices: &[Option<Price>]) -> PriceBook {
        PriceBook {
            targets: prices
                .iter()
                .map(|&p| TargetPrices {
                    fixed: p,
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The estimated cost (currency units) of a request with `prompt_tokens` in and
    /// `output_tokens` out, for public model `model` on `target`; `None` when the price is
    /// unknown or the result is not finite.
    #[inline]
    pub fn estimate(
        &self,
        target: TargetId,
        model: &str,
        prompt_tokens: u32,
        output_tokens: f64,
    ) -> Option<f64> {
        let p = self.price(target, model)?;
        let cost = f64::from(prompt_tokens) * p.input_per_mtok / 1e6
            + output_tokens * p.output_per_mtok / 1e6;
        cost.is_finite().then_some(cost)
    }

    /// The price of serving public model `model` on `target`, if known.
    pub fn price(&self, target: TargetId, model: &str) -> Option<Price> {
        let t = self.targets.get(target)?;
        if let Some(p) = t.fixed {
            return Some(p);
        }
        if let Some((_, p)) = t.by_model.iter().find(|(m, _)| m == model) {
            return Some(*p);
        }
        if t.by_model.is_empty() {
            return catalog_price(&t.catalog, model);
        }
        None
    }
}

/// The price of upstream model `upstream` in `catalog`, else in the built-in catalog.
pub fn catalog_price(catalog: &HashMap<String, Price>, upstream: &str) -> Option<Price> {
    catalog.get(upstream).copied().or_else(|| builtin(upstream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_knows_well_known_models() {
        let p = builtin("gpt-4o-mini").unwrap();
        assert_eq!(p.input_per_mtok, 0.15);
        assert_eq!(p.output_per_mtok, 0.60);
        assert!(builtin("my-private-llama").is_none());
    }

    #[test]
    fn fixed_book_answers_for_any_model() {
        let p = Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
        };
        let book = PriceBook::fixed(&[Some(p), None]);
        assert_eq!(book.price(0, "anything"), Some(p));
        assert_eq!(book.price(1, "anything"), None);
        assert_eq!(book.price(7, "anything"), None);
    }
}
