//! Configuration loading: TOML text → validated [`Config`], reporting every problem at once.
//!
//! The file format is documented in `config/vllm-fleet.toml` and `config/managed-api.toml`.
//! Loading happens in two steps:
//!
//! 1. `raw`: the TOML is parsed (all syntax errors are reported, with line and column) and
//!    deserialized into permissive serde types; unknown keys are collected with
//!    `serde_ignored` and reported with the closest valid key. A type error is reported at
//!    its key, which is then dropped so the rest of the file is still deserialized and
//!    validated.
//! 2. `validate`: every value is checked and converted (URLs parsed and resolved, `${VAR}`
//!    expanded, durations parsed, route references resolved, each strategy's options parsed
//!    and checked by the strategy crate, what the strategy needs prepared — its tokenizer
//!    file loaded, its cache controller resolved — and every route that ranks by price
//!    checked to know a price for each model its targets serve), collecting all errors.
//!
//! Owns the configuration's shape and its checks. It must not start anything: loading
//! touches only the files it names and the resolver.

pub mod discover;
mod error;
mod model;
pub mod prices;
mod raw;
pub mod reload;
mod validate;

#[cfg(test)]
mod tests;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

pub use error::{ConfigError, ConfigErrors};
pub use model::*;
pub use validate::parse_hash;
pub use validate::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_POOL_MAX_IDLE, DEFAULT_RETRIES, DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_STRATEGY, FORBIDDEN_TARGET_HEADERS, HASH_PREFIX, IMPLICIT_ROUTE_NAME, MAX_RETRIES,
    PROXIED_PATHS,
};

use error::Collector;
pub use validate::Discoverer;
use validate::{EnvLookup, Host, Resolver};

/// Reads and loads the configuration file at `path`.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    load_file_discovering(path, &system_discover)
}

/// [`load_file`] with `discover` looking `discover` entries up (a reload passes one that
/// keeps a group's running members when its lookup fails).
pub fn load_file_discovering(
    path: &Path,
    discover: Discoverer<'_>,
) -> Result<Config, ConfigErrors> {
    let source = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_full(&text, &source, &system_resolve, discover, &system_env),
        Err(e) => {
            let mut errs = Collector::new(&source);
            errs.push(
                "(file)",
                format!("cannot read the configuration file: {e}"),
                "check the path passed to rolter and that the file is readable",
            );
            Err(errs.into_errors())
        }
    }
}

/// Loads a configuration from TOML text; `source` names the file in messages and becomes
/// [`Config::source`]. Host names are resolved with the system resolver and `${VAR}` in
/// header values is expanded from the process environment.
pub fn load_str(text: &str, source: &str) -> Result<Config, ConfigErrors> {
    load_with(text, source, &system_resolve, &system_env)
}

/// [`load_str`] with injectable host-name resolution and environment lookup (for tests).
pub(crate) fn load_with(
    text: &str,
    source: &str,
    resolve: Resolver<'_>,
    env: EnvLookup<'_>,
) -> Result<Config, ConfigErrors> {
    load_full(text, source, resolve, &system_discover, env)
}

/// Looks a `discover` entry up in DNS ([`discover::lookup`]).
pub fn system_discover(
    _entry: &str,
    spec: &discover::DiscoverSpec,
    nameservers: &[SocketAddr],
) -> Result<Vec<discover::Member>, String> {
    discover::lookup(spec, nameservers).map_err(|e| e.to_string())
}

pub(crate) fn load_full(
    text: &str,
    source: &str,
    resolve: Resolver<'_>,
    discover: Discoverer<'_>,
    env: EnvLookup<'_>,
) -> Result<Config, ConfigErrors> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Relative paths in the file (`ca_file`) are relative to the file's directory.
    let source_path = Path::new(source);
    let config_dir = source_path
        .is_file()
        .then(|| source_path.parent())
        .flatten()
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        });
    let host = Host {
        resolve,
        discover,
        env,
        cores,
        config_dir,
    };
    let mut errs = Collector::new(source);
    let raw = raw::parse(text, &mut errs);
    let config = raw.and_then(|raw| validate::validate(raw, source, &host, &mut errs));
    match config {
        Some(mut c) if errs.is_empty() => {
            c.digest = digest(text);
            Ok(c)
        }
        _ => Err(errs.into_errors()),
    }
}

/// What a file says about where its gateway listens, read leniently (the file may have
/// errors): the `server.listen` port (default 8080) and `server.control_socket` (relative
/// to the file's directory). `rolter reload` finds the running gateway with it even when
/// the new file is invalid, so the gateway itself refuses it, logs and counts that.
pub fn peek_control(path: &Path) -> (u16, Option<std::path::PathBuf>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let value: toml::Table = text.parse().unwrap_or_default();
    let server = value.get("server").and_then(|s| s.as_table());
    let port = server
        .and_then(|s| s.get("listen"))
        .and_then(|l| l.as_str())
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(8080);
    let socket = server
        .and_then(|s| s.get("control_socket"))
        .and_then(|c| c.as_str())
        .filter(|c| !c.is_empty())
        .map(|c| {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            validate::common::config_path(dir, c)
        });
    (port, socket)
}

/// The `hash` value of a client API key in `[[keys]]`: `sha256:` and the key's SHA-256 in
/// lowercase hex.
pub fn key_hash(key: &str) -> String {
    format!("{HASH_PREFIX}{}", digest(key))
}

/// SHA-256 of `text`, lowercase hex.
pub fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn system_resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

fn system_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
