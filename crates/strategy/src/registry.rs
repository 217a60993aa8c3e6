//! The registry's entries and what a route holds: [`StrategyInfo`] (a strategy's canonical
//! name, aliases, summary and traits, its options with their defaults) built from its
//! options type by [`entry`], lookups over the crate's list of every strategy
//! ([`crate::STRATEGIES`]), and the validated [`StrategySpec`].
//!
//! Owns the mapping from a name and an options table to a strategy. It must not hold
//! per-request state; [`StrategySpec::parse`] runs at configuration load, and
//! [`StrategySpec::build`] once per route per worker.

use std::fmt;
use std::sync::Arc;

use crate::context::BuildContext;
use crate::options::{self, AnyOptions, OptionLine, StrategyOptions};
use crate::requirements::Requirements;
use crate::strategy::Strategy;
pub use crate::traits::Trait;
use crate::values::OptionError;

/// Parses a strategy table into type-erased options.
type ParseFn = fn(&toml::Table) -> Result<Arc<dyn AnyOptions>, Vec<OptionError>>;

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
) -> Result<Arc<dyn AnyOptions>, Vec<OptionError>> {
    options::parse::<O>(t).map(|o| Arc::new(o) as Arc<dyn AnyOptions>)
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

/// Every registered strategy.
pub fn all() -> &'static [StrategyInfo] {
    crate::STRATEGIES
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

/// A route's strategy, validated: its registry entry and its typed options.
#[derive(Clone)]
pub struct StrategySpec {
    info: &'static StrategyInfo,
    options: Arc<dyn AnyOptions>,
}

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
        let options = (info.parse)(options)?;
        Ok(StrategySpec { info, options })
    }

    /// A strategy with every option at its default; `None` for an unknown name.
    pub fn with_defaults(name: &str) -> Option<StrategySpec> {
        let info = lookup(name)?;
        Some(StrategySpec {
            info,
            options: (info.defaults)(),
        })
    }

    /// The strategy's own options, typed.
    pub fn of<O: StrategyOptions>(options: O) -> StrategySpec {
        StrategySpec {
            info: lookup(O::NAME).expect("every options type is registered"),
            options: Arc::new(options),
        }
    }

    /// Canonical name.
    pub fn name(&self) -> &'static str {
        self.info.name
    }

    pub fn info(&self) -> &'static StrategyInfo {
        self.info
    }

    /// The typed options, when they are `O`'s.
    pub fn options<O: StrategyOptions>(&self) -> Option<&O> {
        self.options.as_any().downcast_ref()
    }

    /// Builds one per-core instance.
    pub fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        self.options.build(ctx)
    }

    /// What the gateway must supply for this strategy (and any strategy it wraps).
    pub fn requirements(&self) -> Requirements {
        self.options.requirements()
    }

    /// The options as a TOML table, every option present that has a value.
    pub fn to_table(&self) -> toml::Table {
        self.options.to_table()
    }

    /// The options whose values differ from the defaults, as TOML (for labels and
    /// summaries).
    pub fn non_default(&self) -> toml::Table {
        let defaults = (self.info.defaults)().to_table();
        self.to_table()
            .into_iter()
            .filter(|(k, v)| defaults.get(k) != Some(v))
            .collect()
    }

    /// Whether every option has its default value.
    pub fn is_default(&self) -> bool {
        self.options.same(&*(self.info.defaults)())
    }
}

impl PartialEq for StrategySpec {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.info, other.info) && self.options.same(&*other.options)
    }
}

impl fmt::Debug for StrategySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrategySpec")
            .field("name", &self.info.name)
            .field("options", &self.options)
            .finish()
    }
}

#[cfg(test)]
mod tests;
