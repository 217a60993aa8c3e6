//! What the store is told to connect to: the URLs, the topology, credentials, TLS trust,
//! timeouts and the key prefix.
//!
//! Owns the settings and their checks (the parts the server cannot check for us, such as a
//! key prefix that would split keys over cluster slots). It must not connect, read the
//! environment or parse configuration files: the caller fills the struct.

use std::path::PathBuf;
use std::time::Duration;

/// How the URLs of [`StoreSettings::urls`] are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server: exactly one URL.
    Standalone,
    /// Redis Sentinel: the URLs are sentinels, asked in order for the address of `master`.
    Sentinel { master: String },
    /// Redis Cluster: the URLs are seed nodes; every key lives in one slot (see
    /// [`StoreSettings::key_prefix`]).
    Cluster,
}

/// Where the shared state lives and how to talk to it. Its `Debug` leaves the password out.
#[derive(Clone, PartialEq)]
pub struct StoreSettings {
    /// `redis://host:port[/db]` or `rediss://host:port` (TLS); several for Sentinel or Cluster.
    pub urls: Vec<String>,
    pub topology: Topology,
    /// ACL user; `None` authenticates as `default` (or not at all without a password).
    pub username: Option<String>,
    /// Password of the ACL user, or the server's `requirepass`.
    pub password: Option<String>,
    /// A PEM file of the CA that signs the servers' certificates on `rediss://`. It replaces
    /// the built-in web roots (the usual case of a private CA); without it, the web roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Bound on establishing one connection (TCP, TLS, AUTH).
    pub connect_timeout: Duration,
    /// Bound on every command's round trip once connected.
    pub command_timeout: Duration,
    /// Every key is `{<key_prefix>}:…`: one hash tag, so all the keys of one fleet share one
    /// cluster slot (scripts and pipelines stay on one node) and several fleets can share
    /// one store under different prefixes.
    pub key_prefix: String,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("StoreSettings")
            .field("urls", &urls)
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

/// `url` without the password it may carry (`redis://user:secret@host` → `redis://user:…@host`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((cred, host)) => match cred.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:…@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

impl StoreSettings {
    /// One standalone server at `url`, with 1 s to connect, 100 ms per command and the
    /// prefix `rolter`.
    pub fn standalone(url: impl Into<String>) -> StoreSettings {
        StoreSettings {
            urls: vec![url.into()],
            topology: Topology::Standalone,
            username: None,
            password: None,
            tls_ca_file: None,
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(100),
            key_prefix: "rolter".into(),
        }
    }

    /// What is wrong with these settings, if anything, as one operator-readable sentence.
    pub fn problem(&self) -> Option<String> {
        if self.urls.is_empty() {
            return Some("no store URL: give at least one redis:// or rediss:// URL".into());
        }
        if let Some(url) = self
            .urls
            .iter()
            .find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return Some(format!(
                "store URL `{url}` is neither redis:// nor rediss:// (TLS)"
            ));
        }
        match &self.topology {
            Topology::Standalone if self.urls.len() > 1 => {
                return Some(format!(
                    "{} store URLs for a standalone server: give one, or choose the sentinel \
                     or cluster topology",
                    self.urls.len()
                ));
            }
            Topology::Sentinel { master } if master.is_empty() => {
                return Some("the sentinel topology needs the master's name".into());
            }
            _ => {}
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}']) {
            return Some(format!(
                "key prefix `{}` must be non-empty and hold no `{{` or `}}` (it becomes the \
                 keys' hash tag)",
                self.key_prefix
            ));
        }
        if self.connect_timeout.is_zero() || self.command_timeout.is_zero() {
            return Some("the store's connect and command timeouts must be above zero".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_debug_and_messages() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:…@h:1/0");
        assert_eq!(redact_url("rediss://:pw@h:1"), "rediss://:…@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        let mut s = StoreSettings::standalone("redis://:in-url@h:1");
        s.password = Some("in-field".into());
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("in-url") && !shown.contains("in-field"),
            "{shown}"
        );
    }

    #[test]
    fn problems_are_named() {
        let ok = StoreSettings::standalone("redis://127.0.0.1:6379");
        assert_eq!(ok.problem(), None);
        let mut s = ok.clone();
        s.urls.push("redis://127.0.0.1:6380".into());
        assert!(s.problem().unwrap().contains("2 store URLs"));
        s.topology = Topology::Cluster;
        assert_eq!(s.problem(), None);
        let mut s = ok.clone();
        s.urls = vec!["http://x".into()];
        assert!(s.problem().unwrap().contains("`http://x`"));
        let mut s = ok.clone();
        s.key_prefix = "a{b".into();
        assert!(s.problem().unwrap().contains("hash tag"));
        s.key_prefix.clear();
        assert!(s.problem().is_some());
        let mut s = ok.clone();
        s.topology = Topology::Sentinel { master: "".into() };
        assert!(s.problem().unwrap().contains("master"));
        let mut s = ok;
        s.command_timeout = std::time::Duration::ZERO;
        assert!(s.problem().unwrap().contains("timeouts"));
    }
}
