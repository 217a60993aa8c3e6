//! Strategy options: the trait each strategy's typed options struct implements, and the
//! one parser that turns a route's `[routes.strategy]` table into it.
//!
//! Each strategy's options are one serde struct whose `Default` is the documented default
//! of every option; nothing else in Rolter states a default. The parser reports every
//! problem at once, each with the option's key: an unknown key (with the valid ones), a
//! value of the wrong type (checked key by key, so one bad value does not hide another),
//! then the strategy's own range and combination checks.
//!
//! Owns parsing and describing options. It must not build strategies or read files.

use std::any::Any;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::BuildContext;
use crate::requirements::Requirements;
use crate::traits::Trait;
use crate::values::OptionError;
use crate::Strategy;

/// A strategy's typed options.
///
/// `Default` gives every option its documented default; `rolter strategies` prints them
/// from it. Implementations derive `Serialize` and `Deserialize` with
/// `#[serde(default, deny_unknown_fields)]`.
pub trait StrategyOptions:
    Default + Clone + fmt::Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The strategy's canonical name.
    const NAME: &'static str;
    /// Other names it answers to.
    const ALIASES: &'static [&'static str] = &[];
    /// One line on what it does.
    const SUMMARY: &'static str;
    /// What it advertises about itself.
    const TRAITS: &'static [Trait];

    /// One line of help per option, keyed as in the file, in the order they are listed.
    const HELP: &'static [(&'static str, &'static str)];

    /// Options the strategy no longer takes: refused with what to set instead, rather than
    /// as unknown keys.
    const REMOVED: &'static [RemovedOption] = &[];

    /// Checks beyond each value's type: ranges and combinations. Errors name the key.
    fn check(&self, _errors: &mut Vec<OptionError>) {}

    /// Builds one per-core instance.
    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy>;

    /// What the gateway must supply for this strategy to work as configured.
    fn requirements(&self) -> Requirements {
        Requirements::default()
    }
}

/// An option a strategy used to take, and what replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemovedOption {
    /// The key as it was written under the strategy table.
    pub key: &'static str,
    /// Why it is gone.
    pub message: &'static str,
    /// What to set instead.
    pub fix: &'static str,
}

/// Parses `table` (the strategy table without `name`) into `O`, reporting every problem.
pub fn parse<O: StrategyOptions>(table: &toml::Table) -> Result<O, Vec<OptionError>> {
    let mut errors = Vec::new();
    let mut valid = table.clone();
    for (key, value) in table {
        if let Some(removed) = O::REMOVED.iter().find(|r| r.key == key) {
            errors.push(OptionError::new(key, removed.message).with_fix(removed.fix));
            valid.remove(key);
            continue;
        }
        if !O::HELP.iter().any(|(k, _)| k == key) {
            let known: Vec<&str> = O::HELP.iter().map(|(k, _)| *k).collect();
            let message = if known.is_empty() {
                format!("strategy `{}` takes no options; remove `{key}`", O::NAME)
            } else {
                format!(
                    "unknown option `{key}` for strategy `{}`; valid options: {}",
                    O::NAME,
                    known.join(", ")
                )
            };
            errors.push(OptionError::new(key, message));
            valid.remove(key);
            continue;
        }
        let mut one = toml::Table::new();
        one.insert(key.clone(), value.clone());
        if let Err(e) = O::deserialize(toml::Value::Table(one)) {
            errors.push(OptionError::new(key, type_message(&e.to_string())));
            valid.remove(key);
        }
    }
    // The well-typed options are checked too, so every problem is reported at once.
    let options = match O::deserialize(toml::Value::Table(valid)) {
        Ok(o) => o,
        Err(e) => {
            errors.push(OptionError::new("name", e.to_string()));
            return Err(errors);
        }
    };
    let mut checks = Vec::new();
    options.check(&mut checks);
    for c in checks {
        if !errors.iter().any(|e| e.key == c.key) {
            errors.push(c);
        }
    }
    if errors.is_empty() {
        Ok(options)
    } else {
        Err(errors)
    }
}

/// A serde type error, said the way the rest of the configuration says it.
fn type_message(serde: &str) -> String {
    let first = serde.lines().next().unwrap_or(serde);
    let Some((_, expected)) = first.rsplit_once("expected ") else {
        return first.to_string();
    };
    let expected = expected.trim_end_matches('.');
    let friendly = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        other => other,
    };
    format!("must be {friendly}")
}

/// One option as `rolter strategies` and the docs list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionLine {
    pub key: &'static str,
    /// The default as it would be written in TOML; `None` when the option is unset by
    /// default.
    pub default: Option<String>,
    pub help: &'static str,
}

/// Every option of `O` with its default, from `O::default()`.
pub fn describe<O: StrategyOptions>() -> Vec<OptionLine> {
    let defaults = to_table(&O::default());
    O::HELP
        .iter()
        .map(|&(key, help)| OptionLine {
            key,
            default: defaults.get(key).map(render),
            help,
        })
        .collect()
}

/// A value as it is written in a configuration file.
pub fn render(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) if t.is_empty() => "{}".to_string(),
        toml::Value::Table(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", render(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        toml::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(render).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The options serialized as a TOML table (unset options absent).
pub fn to_table<O: Serialize>(o: &O) -> toml::Table {
    toml::Table::try_from(o).expect("strategy options serialize to a TOML table")
}

/// The serde field names of `O`, read off its derived `Deserialize` (for the test that
/// every field has help and every help line a field).
pub fn field_names<O: DeserializeOwned>() -> &'static [&'static str] {
    struct Capture(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl fmt::Display for Stop {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<T: fmt::Display>(_: T) -> Self {
            Stop
        }
    }
    impl<'de> serde::Deserializer<'de> for &mut Capture {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut c = Capture(None);
    let _ = O::deserialize(&mut c);
    c.0.unwrap_or(&[])
}

/// Options behind a type-erased handle, as a route's validated strategy holds them.
pub(crate) trait AnyOptions: Send + Sync + fmt::Debug {
    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy>;
    fn requirements(&self) -> Requirements;
    fn to_table(&self) -> toml::Table;
    fn as_any(&self) -> &dyn Any;
    fn same(&self, other: &dyn AnyOptions) -> bool;
}

impl<O: StrategyOptions> AnyOptions for O {
    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy> {
        StrategyOptions::build(self, ctx)
    }
    fn requirements(&self) -> Requirements {
        StrategyOptions::requirements(self)
    }
    fn to_table(&self) -> toml::Table {
        to_table(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn same(&self, other: &dyn AnyOptions) -> bool {
        other.as_any().downcast_ref::<O>() == Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::type_message;

    #[test]
    fn type_errors_read_like_the_rest_of_the_configuration() {
        assert_eq!(
            type_message("invalid type: string \"no\", expected a boolean"),
            "must be a boolean"
        );
        assert_eq!(
            type_message("invalid value: integer `-1`, expected u32"),
            "must be a non-negative integer"
        );
        assert_eq!(
            type_message("invalid type: string \"x\", expected f64"),
            "must be a number"
        );
    }
}
