//! The registry: [`StrategyInfo`] (a strategy's canonical name, aliases, summary and
//! traits, its options with their defaults) built from its options type by [`entry`], the
//! list of every strategy ([`STRATEGIES`]), lookups over it, and [`StrategySpec::parse`],
//! which makes a route's validated strategy from a name and a table (and parses the
//! strategies a wrapper names with itself).
//!
//! The only module that knows every strategy: nothing below it imports it, so a wrapper's
//! options (in `strategies`) reach the registry only through the parser `options::parse`
//! is handed.
//!
//! Owns the mapping from a name and an options table to a strategy. It must not hold
//! per-request state; [`StrategySpec::parse`] runs at configuration load, and
//! [`StrategySpec::build`] once per route per worker.

use std::sync::Arc;

use crate::options::{self, AnyOptions, OptionLine, ParseSpec, StrategyOptions, StrategySpec};
use crate::strategies;
pub use crate::traits::Trait;
use crate::values::OptionError;

/// Parses a strategy table into type-erased options (the strategies it names with the
/// parser given).
type ParseFn = fn(&toml::Table, ParseSpec<'_>) -> Result<Arc<dyn AnyOptions>, Vec<OptionError>>;

/// Everything the registry knows about one strategy.
pub struct StrategyInfo {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub summary: &'static str,
    pub traits: &'static [Trait],
    parse: ParseFn,
    defaults: fn() -> Arc<dyn AnyOptions>,
    describe: fn() -> Vec<OptionLine>,
    fields: fn() -> Vec<String>,
    help: &'static [(&'static str, &'static str)],
}

fn parse_erased<O: StrategyOptions>(
    t: &toml::Table,
    parse_spec: ParseSpec<'_>,
) -> Result<Arc<dyn AnyOptions>, Vec<OptionError>> {
    options::parse::<O>(t, parse_spec).map(|o| Arc::new(o) as Arc<dyn AnyOptions>)
}

fn defaults_erased<O: StrategyOptions>() -> Arc<dyn AnyOptions> {
    Arc::new(O::default())
}

/// The registry entry of the strategy whose options are `O`.
pub const fn entry<O: StrategyOptions>() -> StrategyInfo {
    StrategyInfo {
        name: O::NAME,
        aliases: O::ALIASES,
        summary: O::SUMMARY,
        traits: O::TRAITS,
        parse: parse_erased::<O>,
        defaults: defaults_erased::<O>,
        describe: options::describe::<O>,
        fields: options::field_names::<O>,
        help: O::HELP,
    }
}

impl StrategyInfo {
    /// Every option with its default (from the options type's `Default`) and help.
    pub fn options(&self) -> Vec<OptionLine> {
        (self.describe)()
    }

    /// The option keys the options type serializes (unset ones included), for consistency
    /// tests.
    pub fn option_fields(&self) -> Vec<String> {
        (self.fields)()
    }

    /// The keys the help lists.
    pub fn option_keys(&self) -> impl Iterator<Item = &'static str> {
        self.help.iter().map(|(k, _)| *k)
    }
}

/// Every strategy, in the order `rolter strategies` lists them: each one's registry entry,
/// built from its options type.
pub static STRATEGIES: &[StrategyInfo] = &[
    entry::<strategies::round_robin::Options>(),
    entry::<strategies::random::Options>(),
    entry::<strategies::random_weighted::Options>(),
    entry::<strategies::power_of_two::Options>(),
    entry::<strategies::least_loaded::Options>(),
    entry::<strategies::failover::Options>(),
    entry::<strategies::fastest::Options>(),
    entry::<strategies::adaptive::Options>(),
    entry::<strategies::predicted_latency::Options>(),
    entry::<strategies::cheapest::Options>(),
    entry::<strategies::fair_catchup::Options>(),
    entry::<strategies::cache_aware::Options>(),
    entry::<strategies::precise_cache_aware::Options>(),
    entry::<strategies::lmcache_aware::Options>(),
    entry::<strategies::pipeline::Options>(),
    entry::<strategies::lora_aware::Options>(),
    entry::<strategies::consistent_hash::Options>(),
];

/// Every registered strategy.
pub fn all() -> &'static [StrategyInfo] {
    STRATEGIES
}

/// Finds a strategy by canonical name or alias.
pub fn lookup(name: &str) -> Option<&'static StrategyInfo> {
    all()
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name))
}

/// Every name and alias, for messages.
pub fn valid_names() -> String {
    let mut names: Vec<&str> = Vec::new();
    for s in all() {
        names.push(s.name);
        names.extend_from_slice(s.aliases);
    }
    names.join(", ")
}

/// The registered name or alias closest to `name` (Damerau-Levenshtein), when it is close
/// enough to be a likely misspelling: at most a third of the longer word apart, and at
/// least 2 edits allowed.
pub fn closest_name(name: &str) -> Option<&'static str> {
    let (best, distance) = all()
        .iter()
        .flat_map(|s| std::iter::once(s.name).chain(s.aliases.iter().copied()))
        .map(|n| (n, strsim::damerau_levenshtein(name, n)))
        .min_by_key(|&(_, d)| d)?;
    let allowed = (name.chars().count().max(best.len()) / 3).max(2);
    (distance <= allowed).then_some(best)
}

#[cfg(test)]
mod tests;

/// The registry's side of a [`StrategySpec`]: made from a name, and its entry.
impl StrategySpec {
    /// Resolves a name or alias and parses its options. Errors name the option (`name` for
    /// an unknown strategy name).
    pub fn parse(name: &str, options: &toml::Table) -> Result<StrategySpec, Vec<OptionError>> {
        let Some(info) = lookup(name) else {
            let error = OptionError::new(
                "name",
                format!("unknown strategy `{name}`; valid names: {}", valid_names()),
            );
            return Err(vec![match closest_name(name) {
                Some(best) => error.with_fix(format!(
                    "did you mean `{best}`? (`rolter strategies` lists every strategy)"
                )),
                None => error,
            }]);
        };
        let options = (info.parse)(options, &StrategySpec::parse)?;
        Ok(StrategySpec::from_erased(options))
    }

    /// A strategy with every option at its default; `None` for an unknown name.
    pub fn with_defaults(name: &str) -> Option<StrategySpec> {
        let info = lookup(name)?;
        Some(StrategySpec::from_erased((info.defaults)()))
    }

    /// Its registry entry.
    pub fn info(&self) -> &'static StrategyInfo {
        lookup(self.name()).expect("every options type is registered")
    }
}
