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
use serde::ser::Impossible;
use serde::Serialize;

use crate::context::BuildContext;
use crate::requirements::Requirements;
use crate::strategy::{Named, Strategy};
use crate::traits::Trait;
use crate::values::OptionError;

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

/// The options type a strategy's per-core state is built from: the strategy's name is
/// theirs ([`StrategyOptions::NAME`]), stated once.
pub trait OfOptions {
    type Options: StrategyOptions;
}

impl<S: OfOptions> Named for S {
    fn name(&self) -> &'static str {
        S::Options::NAME
    }
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

/// The option keys `O` serializes, unset ones included, read off its derived `Serialize`
/// on the defaults (for the test that every field has help and every help line a field).
/// Fields of a `#[serde(flatten)]` part count as the option's own; a flattened struct's
/// optional fields must then be written without `skip_serializing_if` (TOML leaves `None`
/// out on its own).
pub fn field_names<O: StrategyOptions>() -> Vec<String> {
    let mut keys = Keys(Vec::new());
    let _ = O::default().serialize(&mut keys);
    keys.0
}

/// A serializer that records the keys of one struct or map and nothing else.
struct Keys(Vec<String>);

#[derive(Debug)]
struct NotATable;

impl fmt::Display for NotATable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("options serialize as a table")
    }
}

impl std::error::Error for NotATable {}

impl serde::ser::Error for NotATable {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotATable
    }
}

/// The `Serializer` methods of every shape but a struct or a map: refused.
macro_rules! not_a_table {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(), NotATable> {
            Err(NotATable)
        })*
    };
}

impl serde::Serializer for &mut Keys {
    type Ok = ();
    type Error = NotATable;
    type SerializeSeq = Impossible<(), NotATable>;
    type SerializeTuple = Impossible<(), NotATable>;
    type SerializeTupleStruct = Impossible<(), NotATable>;
    type SerializeTupleVariant = Impossible<(), NotATable>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), NotATable>;

    not_a_table!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), NotATable> {
        Err(NotATable)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotATable> {
        Err(NotATable)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotATable> {
        Err(NotATable)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotATable> {
        Err(NotATable)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotATable> {
        Err(NotATable)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotATable> {
        Err(NotATable)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotATable> {
        Err(NotATable)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, NotATable> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NotATable> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotATable> {
        Err(NotATable)
    }
}

impl serde::ser::SerializeStruct for &mut Keys {
    type Ok = ();
    type Error = NotATable;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        _: &T,
    ) -> Result<(), NotATable> {
        self.0.push(key.to_string());
        Ok(())
    }
    /// A field left out by `skip_serializing_if` is a key all the same.
    fn skip_field(&mut self, key: &'static str) -> Result<(), NotATable> {
        self.0.push(key.to_string());
        Ok(())
    }
    fn end(self) -> Result<(), NotATable> {
        Ok(())
    }
}

/// The keys of a struct with flattened parts (serde writes it as a map).
impl serde::ser::SerializeMap for &mut Keys {
    type Ok = ();
    type Error = NotATable;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), NotATable> {
        match toml::Value::try_from(key) {
            Ok(toml::Value::String(k)) => {
                self.0.push(k);
                Ok(())
            }
            _ => Err(NotATable),
        }
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, _: &T) -> Result<(), NotATable> {
        Ok(())
    }
    fn end(self) -> Result<(), NotATable> {
        Ok(())
    }
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
