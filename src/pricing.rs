//! Prices: the built-in catalog of well-known models, the `[catalog]` table over it, and the
//! per-target `price` over both, resolved once per configuration into a [`PriceBook`].
//!
//! Owns price resolution only. It must not route, and it never runs per request beyond a
//! lookup in a small per-target table.

use std::collections::HashMap;

use crate::config::{Config, Price, TargetId};

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

#[derive(Debug, Clone, Default)]
struct TargetPrices {
    /// The target's own `price`: applies to every model it serves.
    fixed: Option<Price>,
    /// Public model name → price of the upstream model it maps to.
    by_model: Vec<(String, Price)>,
    /// `[catalog]` entries, for models the target serves without listing them.
    catalog: HashMap<String, Price>,
}

impl PriceBook {
    /// Resolves every target's prices: its own `price`, else `[catalog]` by upstream model
    /// name, else the built-in catalog.
    pub fn new(config: &Config) -> PriceBook {
        let targets = config
            .targets
            .iter()
            .map(|t| {
                let by_model = t
                    .models
                    .iter()
                    .filter_map(|public| {
                        let upstream = t.upstream_models.get(public).unwrap_or(public);
                        lookup(&config.catalog, upstream).map(|p| (public.clone(), p))
                    })
                    .collect();
                TargetPrices {
                    fixed: t.price,
                    by_model,
                    catalog: if t.models.is_empty() {
                        config.catalog.clone()
                    } else {
                        HashMap::new()
                    },
                }
            })
            .collect();
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
            return lookup(&t.catalog, model);
        }
        None
    }
}

fn lookup(catalog: &HashMap<String, Price>, upstream: &str) -> Option<Price> {
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
