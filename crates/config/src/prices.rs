//! Resolving every target's prices once per configuration: its own `price`, else
//! `[catalog]` by upstream model name, else the built-in catalog.
//!
//! Owns price resolution only. It must not route; the book it builds is looked up by the
//! cost-aware strategies.

use std::collections::HashMap;

use rolter_core::{builtin, PriceBook, TargetPrices};

use crate::Config;

/// Resolves every target's prices: its own `price`, else `[catalog]` by upstream model
/// name, else the built-in catalog.
pub fn price_book(config: &Config) -> PriceBook {
    let targets = config
        .targets
        .iter()
        .map(|t| {
            let by_model = t
                .models
                .iter()
                .filter_map(|public| {
                    let upstream = t.upstream_models.get(public).unwrap_or(public);
                    config
                        .catalog
                        .get(upstream.as_str())
                        .copied()
                        .or_else(|| builtin(upstream))
                        .map(|p| (public.clone(), p))
                })
                .collect();
            TargetPrices {
                fixed: t.price,
                by_model,
                catalog: if t.models.is_empty() {
                    config
                        .catalog
                        .iter()
                        .map(|(k, v)| (k.clone(), *v))
                        .collect()
                } else {
                    HashMap::new()
                },
            }
        })
        .collect();
    PriceBook::from_targets(targets)
}
