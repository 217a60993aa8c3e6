//! Option values: the error a bad value gets, the range checks every strategy's options use
//! (each with the message the configuration shows), and the serde form of durations.
//!
//! A leaf: it knows no strategy and no options type.

use std::fmt;
use std::time::Duration;

/// One problem with a strategy's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The option at fault, as written under the strategy table (`name` for the strategy's
    /// name itself).
    pub key: String,
    pub message: String,
    /// How to fix it, when the generic advice (correct or remove the option) is wrong.
    pub fix: Option<String>,
}

impl OptionError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        OptionError {
            key: key.into(),
            message: message.into(),
            fix: None,
        }
    }

    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Pushes `message` for `key` unless `ok`.
pub fn require(errors: &mut Vec<OptionError>, ok: bool, key: &str, message: &str) {
    if !ok {
        errors.push(OptionError::new(key, message));
    }
}

/// A duration longer than zero.
pub fn positive_duration(errors: &mut Vec<OptionError>, key: &str, d: Duration) {
    require(
        errors,
        !d.is_zero(),
        key,
        "must be a duration longer than zero, such as \"10s\"",
    );
}

/// An integer above zero.
pub fn positive(errors: &mut Vec<OptionError>, key: &str, n: u64) {
    require(errors, n > 0, key, "must be a positive integer");
}

/// A finite number of at least zero.
pub fn non_negative(errors: &mut Vec<OptionError>, key: &str, x: f64) {
    require(
        errors,
        x.is_finite() && x >= 0.0,
        key,
        "must be a finite number >= 0",
    );
}

/// A fraction in [0, 1].
pub fn fraction(errors: &mut Vec<OptionError>, key: &str, x: f64) {
    require(
        errors,
        (0.0..=1.0).contains(&x),
        key,
        "must be a fraction from 0 to 1, such as 0.5",
    );
}

/// Serde for durations written as `"500ms"`, `"10s"`, `"5m"`.
pub mod duration {
    use std::fmt;
    use std::time::Duration;

    use serde::{de, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"500ms\" or \"10s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                humantime::parse_duration(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(V)
    }
}
