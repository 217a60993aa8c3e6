//! Configuration errors: every problem found in one load, each with a concrete fix.

use std::fmt;

/// One problem in a configuration file.
///
/// Displays as `<file>: <key>: <message> (fix: <fix>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or other source name) the problem is in.
    pub file: String,
    /// Full key path, e.g. `targets[1].url` or `routes[0].strategy.threshold`;
    /// `(document)` when the problem is not tied to one key.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {} (fix: {})",
            self.file, self.key, self.message, self.fix
        )
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found while loading a configuration (never empty when returned as an error).
///
/// Displays as one line per error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// Number of errors.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// True when there are no errors.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// Iterate over the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.errors.iter()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors { errors: vec![e] }
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

/// Collects errors for one source while validating.
#[derive(Debug)]
pub(crate) struct Collector {
    file: String,
    errors: Vec<ConfigError>,
    /// Keys whose value was dropped after a type error: what validation then finds at them
    /// (or under them) follows from the value being gone and is not reported.
    dropped: Vec<String>,
}

impl Collector {
    pub(crate) fn new(file: &str) -> Self {
        Collector {
            file: file.to_string(),
            errors: Vec::new(),
            dropped: Vec::new(),
        }
    }

    pub(crate) fn push(
        &mut self,
        key: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let key = key.into();
        if self.dropped.iter().any(|d| is_under(&key, d)) {
            return;
        }
        self.errors.push(ConfigError {
            file: self.file.clone(),
            key,
            message: message.into(),
            fix: fix.into(),
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// From now on, errors at `key` or under it are not reported: its value was dropped
    /// after the type error already reported there.
    pub(crate) fn drop_under(&mut self, key: String) {
        self.dropped.push(key);
    }

    /// Takes over the errors another source's collector found (a file this one names).
    pub(crate) fn absorb(&mut self, other: Collector) {
        self.errors.extend(other.errors);
    }

    pub(crate) fn into_errors(self) -> ConfigErrors {
        ConfigErrors {
            errors: self.errors,
        }
    }
}

/// True when `key` is `parent` or a key path inside it (`parent.x`, `parent[0]`).
fn is_under(key: &str, parent: &str) -> bool {
    key.strip_prefix(parent)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}
