//! Test helpers: candidates, samples, requests and build contexts made from plain values.

use std::sync::Arc;

use rolter_core::{AsyncInputs, Candidate, PickRequest, Price, PriceBook, Sample, Switches};

use crate::context::BuildContext;
use crate::options::StrategySpec;

/// Candidates with target ids 0.. and the given (weight, load) pairs.
pub fn cands(spec: &[(f64, u64)]) -> Vec<Candidate> {
    spec.iter()
        .enumerate()
        .map(|(i, &(weight, load))| Candidate {
            target: i,
            weight,
            load,
            ..Candidate::default()
        })
        .collect()
}

/// A successful sample for `target` with the given TTFT (ms), load and prompt tokens.
pub fn sample(target: usize, ttft_ms: u64, load: u64, prompt_tokens: u32) -> Sample {
    Sample {
        target,
        status: 200,
        success: true,
        ttft: Some(std::time::Duration::from_millis(ttft_ms)),
        first_byte: Some(std::time::Duration::from_millis(ttft_ms)),
        duration: std::time::Duration::from_millis(ttft_ms * 2),
        load_at_send: load,
        prompt_tokens,
        usage: None,
        finished: std::time::Instant::now(),
    }
}

/// A fixed price per 1M input and output tokens.
pub fn price(input: f64, output: f64) -> Option<Price> {
    Some(Price {
        input_per_mtok: input,
        output_per_mtok: output,
    })
}

/// A build context for a route over targets 0..`weights.len()` with those weights, the
/// given fixed prices (or none) and default switches. Leaked: tests only.
pub fn context(weights: &[f64], prices: &[Option<Price>]) -> BuildContext<'static> {
    let weights: &'static [f64] = Box::leak(weights.to_vec().into_boxed_slice());
    let names: &'static [String] = Box::leak(
        (0..weights.len())
            .map(|i| format!("t{i}"))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    let route_targets: &'static [usize] =
        Box::leak((0..weights.len()).collect::<Vec<_>>().into_boxed_slice());
    let mut all_prices = prices.to_vec();
    all_prices.resize(weights.len(), None);
    BuildContext {
        target_count: weights.len(),
        seed: 7,
        weights,
        names,
        route_targets,
        prices: Box::leak(Box::new(PriceBook::fixed(&all_prices))),
        switches: Box::leak(Box::new(Arc::new(Switches::default()))),
        kv: None,
    }
}

/// The strategy `name` with the options written in `options` (TOML); panics when invalid.
pub fn spec(name: &str, options: &str) -> StrategySpec {
    let table: toml::Table = toml::from_str(options).expect("options are TOML");
    StrategySpec::parse(name, &table).unwrap_or_else(|e| panic!("{name} {options}: {e:?}"))
}

/// Resolves a strategy name or alias and checks its options, as the configuration does:
/// the canonical name, or every (option key, message) at fault.
pub fn validate_spec(
    name: &str,
    options: &toml::Table,
) -> Result<&'static str, Vec<(String, String)>> {
    StrategySpec::parse(name, options)
        .map(|s| s.name())
        .map_err(|errs| errs.into_iter().map(|e| (e.key, e.message)).collect())
}

/// `O` parsed from `table` as the registry parses a route's options (the strategies it
/// names included).
pub fn parse_options<O: crate::StrategyOptions>(
    table: &toml::Table,
) -> Result<O, Vec<crate::OptionError>> {
    crate::options::parse::<O>(table, &StrategySpec::parse)
}

/// The strategy `name` with `options` (a TOML table); panics when invalid.
pub fn raw(name: &str, options: toml::Table) -> StrategySpec {
    StrategySpec::parse(name, &options).unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

pub use crate::registry::{lookup, Trait};

/// Builds one instance of `spec` for `ctx`.
pub fn build(spec: &StrategySpec, ctx: &BuildContext<'_>) -> Box<dyn crate::strategy::Strategy> {
    spec.build(ctx)
}

/// A request with no prompt and no asynchronous inputs.
pub fn req() -> PickRequest<'static> {
    let inputs: &'static AsyncInputs = Box::leak(Box::default());
    PickRequest {
        model: "m",
        session: Default::default(),
        prompt: b"",
        prompt_tokens: 0,
        max_tokens: None,
        inputs,
    }
}

#[cfg(test)]
mod tests {
    use super::{context, sample};

    #[test]
    fn test_context_carries_weights_and_prices() {
        let p = rolter_core::Price {
            input_per_mtok: 1.0,
            output_per_mtok: 3.0,
        };
        let ctx = context(&[2.0, 1.0], &[Some(p)]);
        assert_eq!(ctx.weights.len(), 2);
        assert_eq!(ctx.weights[0], 2.0);
        assert_eq!(ctx.route_targets, &[0, 1]);
        assert_eq!(ctx.prices.price(0, "m"), Some(p));
        assert_eq!(ctx.prices.price(1, "m"), None);
        assert!(ctx.switches.adaptive());
        let s = sample(1, 40, 3, 100);
        assert!(s.success && s.target == 1 && s.load_at_send == 3);
    }
}
