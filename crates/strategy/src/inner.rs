//! A strategy named inside another's options (`failover`'s `within_tier`, `adaptive`'s
//! `fallback_strategy`, `fair_catchup`'s `base_strategy`): a name, or a table with `name`
//! and that strategy's own options, parsed and checked by the registry like a route's.

use std::fmt;

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::registry::StrategySpec;
use crate::requirements::Requirements;
use crate::values::OptionError;

/// A validated inner strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct InnerStrategy(pub StrategySpec);

impl InnerStrategy {
    /// The named strategy with its defaults (for the wrappers' own defaults).
    pub fn named(name: &str) -> InnerStrategy {
        InnerStrategy(StrategySpec::with_defaults(name).expect("a registered strategy"))
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Reports `key` when it names the wrapper itself.
    pub fn check_not(&self, own: &str, key: &str, errors: &mut Vec<OptionError>) {
        if self.name() == own {
            errors.push(OptionError::new(
                key,
                format!("{own} cannot be its own {key} strategy"),
            ));
        }
    }

    /// What the inner strategy needs, said through the wrapper's option.
    pub fn requirements(&self, wrapper: &str, option: &str) -> Requirements {
        Requirements::through(self.0.requirements(), wrapper, option)
    }
}

impl Serialize for InnerStrategy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_default() {
            return s.serialize_str(self.0.name());
        }
        // The options that differ from the inner strategy's defaults: the shortest form
        // that parses back to the same strategy.
        let table = self.0.non_default();
        let mut map = s.serialize_map(Some(table.len() + 1))?;
        map.serialize_entry("name", self.0.name())?;
        for (k, v) in &table {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for InnerStrategy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(d)?;
        let (name, options) = match value {
            toml::Value::String(name) => (name, toml::Table::new()),
            toml::Value::Table(mut t) => match t.remove("name") {
                Some(toml::Value::String(name)) => (name, t),
                _ => {
                    return Err(de::Error::custom(
                        "a strategy table needs name = \"<strategy>\" beside its options",
                    ))
                }
            },
            _ => {
                return Err(de::Error::custom(
                    "must be a strategy name, or a table with `name` and its options",
                ))
            }
        };
        StrategySpec::parse(&name, &options)
            .map(InnerStrategy)
            .map_err(|errors| de::Error::custom(Joined(&errors)))
    }
}

struct Joined<'a>(&'a [OptionError]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            if e.key == "name" {
                f.write_str(&e.message)?;
            } else {
                write!(f, "`{}`: {}", e.key, e.message)?;
            }
        }
        Ok(())
    }
}
