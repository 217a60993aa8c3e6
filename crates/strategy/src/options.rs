//! Strategy options: the trait each strategy's typed options struct implements, the one
//! parser that turns a route's `[routes.strategy]` table into it, the type-erased
//! [`StrategySpec`] a route holds, and the [`InnerStrategy`] a wrapper names in its options.
//!
//! A wrapper's inner strategy is parsed by the registry, the one place that knows every
//! strategy: the options deserialize it as written, then [`parse`] hands each one (through
//! [`StrategyOptions::nested`]) to the registry's parser it was given. So this module, and
//! every strategy, stays below the registry's list of them.
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
use std::sync::Arc;

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::ser::{Impossible, SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::context::BuildContext;
use crate::requirements::Requirements;
use crate::strategy::Strategy;
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

    /// The strategies these options name (a wrapper's), by key, for [`parse`] to resolve.
    fn nested(&mut self) -> Vec<(&'static str, &mut InnerStrategy)> {
        Vec::new()
    }
}

/// The help lines of `parts`, one part after another, as one array of `N` lines: how a
/// strategy's `HELP` lists its own options beside those of the shared parts it flattens in
/// (`&help_lines::<6>(&[&[("min_blocks", "…")], &BalanceGuard::HELP, &TokenizerOptions::HELP])`).
/// A wrong `N` fails the build.
pub const fn help_lines<const N: usize>(
    parts: &[&[(&'static str, &'static str)]],
) -> [(&'static str, &'static str); N] {
    let mut lines = [("", ""); N];
    let mut n = 0;
    let mut part = 0;
    while part < parts.len() {
        let mut i = 0;
        while i < parts[part].len() {
            assert!(n < N, "help_lines: more lines than N");
            lines[n] = parts[part][i];
            n += 1;
            i += 1;
        }
        part += 1;
    }
    assert!(n == N, "help_lines: fewer lines than N");
    lines
}

/// The registry's parser of a named strategy with its options table, handed down so that
/// options naming another strategy can be resolved without knowing the list of them.
pub type ParseSpec<'a> = &'a dyn Fn(&str, &toml::Table) -> Result<StrategySpec, Vec<OptionError>>;

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

/// Parses `table` (the strategy table without `name`) into `O`, reporting every problem;
/// the strategies it names are parsed with `parse_spec`.
pub fn parse<O: StrategyOptions>(
    table: &toml::Table,
    parse_spec: ParseSpec<'_>,
) -> Result<O, Vec<OptionError>> {
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
    let mut options = match O::deserialize(toml::Value::Table(valid)) {
        Ok(o) => o,
        Err(e) => {
            errors.push(OptionError::new("name", e.to_string()));
            return Err(errors);
        }
    };
    for (key, inner) in options.nested() {
        if let Err(e) = inner.resolve(parse_spec) {
            errors.push(OptionError::new(key, Joined(&e).to_string()));
        }
    }
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
/// Fields of a `#[serde(flatten)]` part count as the option's own; every optional field of
/// a struct that flattens a part (serde writes that struct as a map) must then be written
/// without `skip_serializing_if` (TOML leaves `None` out on its own).
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

/// A route's strategy, validated: its typed options behind a type-erased handle (the
/// registry parses one from a name and a table, and gives its entry).
#[derive(Clone)]
pub struct StrategySpec {
    options: Arc<dyn AnyOptions>,
}

impl StrategySpec {
    /// The strategy's own options, typed.
    pub fn of<O: StrategyOptions>(options: O) -> StrategySpec {
        StrategySpec {
            options: Arc::new(options),
        }
    }

    pub(crate) fn from_erased(options: Arc<dyn AnyOptions>) -> StrategySpec {
        StrategySpec { options }
    }

    /// Canonical name.
    pub fn name(&self) -> &'static str {
        self.options.name()
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
        let defaults = self.options.defaults().to_table();
        self.to_table()
            .into_iter()
            .filter(|(k, v)| defaults.get(k) != Some(v))
            .collect()
    }

    /// Whether every option has its default value.
    pub fn is_default(&self) -> bool {
        self.options.same(&*self.options.defaults())
    }
}

impl PartialEq for StrategySpec {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name() && self.options.same(&*other.options)
    }
}

impl fmt::Debug for StrategySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrategySpec")
            .field("name", &self.name())
            .field("options", &self.options)
            .finish()
    }
}

/// A strategy named inside another's options (`failover`'s `within_tier`, `adaptive`'s
/// `fallback_strategy`, `fair_catchup`'s `base_strategy`): a name, or a table with `name`
/// and that strategy's own options. Deserialized as written; [`parse`] resolves it with the
/// registry's parser before the wrapper's checks run, so a parsed wrapper's inner strategy
/// is always a validated [`StrategySpec`].
#[derive(Clone, Debug, PartialEq)]
pub struct InnerStrategy(Inner);

#[derive(Clone, Debug, PartialEq)]
enum Inner {
    Spec(StrategySpec),
    /// As written, until [`parse`] resolves it.
    Written {
        name: String,
        options: toml::Table,
    },
}

impl InnerStrategy {
    /// `options`' strategy (for the wrappers' own defaults).
    pub fn of<O: StrategyOptions>(options: O) -> InnerStrategy {
        InnerStrategy(Inner::Spec(StrategySpec::of(options)))
    }

    /// The validated strategy. Only [`parse`] makes a wrapper's options from a file, and
    /// it resolves every inner strategy first.
    pub fn spec(&self) -> &StrategySpec {
        match &self.0 {
            Inner::Spec(spec) => spec,
            Inner::Written { name, .. } => {
                panic!("inner strategy `{name}` used before the registry parsed it")
            }
        }
    }

    pub fn name(&self) -> &'static str {
        self.spec().name()
    }

    /// The validated strategy, `None` while it is as written (a wrapper's checks run after
    /// an inner strategy that failed to parse too).
    pub fn resolved(&self) -> Option<&StrategySpec> {
        match &self.0 {
            Inner::Spec(spec) => Some(spec),
            Inner::Written { .. } => None,
        }
    }

    /// Parses the strategy as written with the registry's `parse_spec`.
    fn resolve(&mut self, parse_spec: ParseSpec<'_>) -> Result<(), Vec<OptionError>> {
        if let Inner::Written { name, options } = &self.0 {
            self.0 = Inner::Spec(parse_spec(name, options)?);
        }
        Ok(())
    }

    /// Reports `key` when it names the wrapper itself (nothing while it is unresolved: its
    /// own error is reported).
    pub fn check_not(&self, own: &str, key: &str, errors: &mut Vec<OptionError>) {
        if self.resolved().is_some_and(|s| s.name() == own) {
            errors.push(OptionError::new(
                key,
                format!("{own} cannot be its own {key} strategy"),
            ));
        }
    }

    /// What the inner strategy needs, said through the wrapper's option.
    pub fn requirements(&self, wrapper: &str, option: &str) -> Requirements {
        Requirements::through(self.spec().requirements(), wrapper, option)
    }
}

impl Serialize for InnerStrategy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let spec = self.spec();
        if spec.is_default() {
            return s.serialize_str(spec.name());
        }
        // The options that differ from the inner strategy's defaults: the shortest form
        // that parses back to the same strategy.
        let table = spec.non_default();
        let mut map = s.serialize_map(Some(table.len() + 1))?;
        map.serialize_entry("name", spec.name())?;
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
        Ok(InnerStrategy(Inner::Written { name, options }))
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

/// Options behind a type-erased handle, as a route's validated strategy holds them.
pub(crate) trait AnyOptions: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;
    fn defaults(&self) -> Arc<dyn AnyOptions>;
    fn build(&self, ctx: &BuildContext<'_>) -> Box<dyn Strategy>;
    fn requirements(&self) -> Requirements;
    fn to_table(&self) -> toml::Table;
    fn as_any(&self) -> &dyn Any;
    fn same(&self, other: &dyn AnyOptions) -> bool;
}

impl<O: StrategyOptions> AnyOptions for O {
    fn name(&self) -> &'static str {
        O::NAME
    }
    fn defaults(&self) -> Arc<dyn AnyOptions> {
        Arc::new(O::default())
    }
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
