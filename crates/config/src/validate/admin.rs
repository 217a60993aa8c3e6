//! `[admin]`: the admin listener and its token.

use super::common::*;
use super::server::socket_addr;
use super::targets::expand_env;

pub(super) fn admin(
    raw: RawAdmin,
    server: Option<&ServerConfig>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<AdminConfig> {
    let listen = match raw.listen.as_deref() {
        None => Some(
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("valid default admin listen address"),
        ),
        Some(s) => socket_addr(s, "admin.listen", 9091, host, errs),
    };
    let listen = match (listen, server) {
        (Some(a), Some(s)) if overlaps(a, s.listen) => {
            errs.push(
                "admin.listen",
                format!(
                    "admin listener {a} overlaps the client listener server.listen = {}",
                    s.listen
                ),
                format!(
                    "give the admin listener its own port, e.g. listen = \"127.0.0.1:{}\"",
                    if s.listen.port() == 9091 { 9092 } else { 9091 }
                ),
            );
            None
        }
        (a, _) => a,
    };
    let token = match raw.token {
        None => Some(None),
        Some(t) => admin_token(&t, "admin.token", host, errs).map(Some),
    };
    Some(AdminConfig {
        listen: listen?,
        token: token?,
    })
}

/// Whether two listen addresses would claim the same port on a shared address.
pub(super) fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `[admin].token`: non-empty after `${VAR}` expansion, without whitespace or control
/// characters. Messages never echo the value.
pub(super) fn admin_token(
    value: &str,
    key: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<String> {
    const FIX_EMPTY: &str = "write a secret such as token = \"${ROLTER_ADMIN_TOKEN}\" (e.g. from `openssl rand -hex 32`), or remove `token` to leave the admin listener without authentication";
    if value.is_empty() {
        errs.push(key, "token is empty", FIX_EMPTY);
        return None;
    }
    let expanded = expand_env(value, key, host, errs)?;
    if expanded.is_empty() {
        errs.push(
            key,
            "token is empty after expanding its ${VAR} references",
            "set the referenced environment variable to a non-empty secret before starting rolter",
        );
        return None;
    }
    if expanded
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        errs.push(
            key,
            "token contains whitespace or a control character (space, tab, CR, LF, …), which cannot be sent in an Authorization header",
            "use a token of visible characters only, e.g. from `openssl rand -hex 32` (check the value of any ${VAR} it uses, including a trailing newline)",
        );
        return None;
    }
    Some(expanded)
}
