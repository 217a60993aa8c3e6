//! Stage 3 of the request path, once routed and permitted: what admission knows of the
//! request. Its class comes from `x-rolter-priority` on a route that trusts the header
//! (from any client on an open gateway, else only from keys with `set_priority`), else
//! from its key's `priority`, else from the route's `default_class`. Its tenant (for fair
//! queueing) is the route's `tenant_header` value, else its key, else "no key". Its
//! deadline is `x-rolter-deadline-ms` (at most the route's `deadline`).
//!
//! Owns the answers 400 (an unknown class, a malformed deadline) and 403 (a key that may
//! not choose its class). It must not wait or admit: the queue and the pick use what it
//! found.

use std::time::{Duration, Instant};

use rolter_codec::GatewayError;
use rolter_config::Config;

use super::auth::Caller;
use super::request::Request;
use super::route::Routed;
use crate::mesh::admission::HEADER_TENANTS;

/// The header that names a request's class on routes with `priority_header`.
pub const PRIORITY_HEADER: &str = "x-rolter-priority";
/// The header that carries a request's deadline, in milliseconds from its arrival.
pub const DEADLINE_HEADER: &str = "x-rolter-deadline-ms";
/// The longest deadline a client may ask for.
const MAX_DEADLINE: Duration = Duration::from_secs(3600);

/// What admission knows of one request.
#[derive(Debug, Clone, Copy)]
pub struct Admit {
    /// Index in `config.classes`.
    pub class: usize,
    /// The class's rank (0 first).
    pub rank: u8,
    /// The tenant's finish tag (see `mesh::admission`): a key's index, the keys' count for
    /// callers without one, or after that a header-named tenant's hash.
    pub tenant: usize,
    /// The tenant's weight in fair queueing (its key's `share`).
    pub share: u32,
    /// The tenant is a header-named one (its name is not a key's).
    pub tenant_named: bool,
    /// The client's deadline (`x-rolter-deadline-ms`), from the request's arrival.
    pub deadline: Option<Instant>,
}

/// The request's class, tenant and deadline, or the error to answer.
pub fn classify(
    config: &Config,
    req: &Request<'_>,
    routed: &Routed<'_>,
    caller: Option<Caller>,
) -> Result<Admit, GatewayError> {
    let adm = &routed.route.admission;
    let key = caller.map(|c| &config.keys.keys[c.key]);
    let mut class = key.and_then(|k| k.priority).unwrap_or(adm.default_class);
    if let Some(v) = req.header(PRIORITY_HEADER).filter(|_| adm.priority_header) {
        if key.is_some_and(|k| !k.set_priority) {
            return Err(GatewayError::client(
                403,
                "priority_not_allowed",
                format!("This API key may not choose its requests' class with `{PRIORITY_HEADER}`: remove the header, or give the key set_priority = true."),
            ));
        }
        class = config
            .classes
            .iter()
            .position(|c| c.name.as_bytes() == v)
            .ok_or_else(|| unknown_class(config, v))?;
    }
    let (tenant, tenant_named) = match adm.tenant_header.as_deref().and_then(|h| req.header(h)) {
        Some(name) => (named_tenant(config.keys.keys.len(), name), true),
        None => (caller.map_or(config.keys.keys.len(), |c| c.key), false),
    };
    Ok(Admit {
        class,
        rank: config.classes[class].rank,
        tenant,
        share: key.map_or(1, |k| k.share),
        tenant_named,
        deadline: deadline(req)?,
    })
}

fn unknown_class(config: &Config, v: &[u8]) -> GatewayError {
    let known: Vec<&str> = config.classes.iter().map(|c| c.name.as_str()).collect();
    GatewayError::client(
        400,
        "unknown_priority",
        format!(
            "`{PRIORITY_HEADER}: {}` names no class of this gateway; use one of: {}.",
            String::from_utf8_lossy(v),
            known.join(", ")
        ),
    )
}

/// A header-named tenant's finish tag: after the keys' and the keyless callers'.
fn named_tenant(keys: usize, name: &[u8]) -> usize {
    keys + 1 + (xxhash_rust::xxh3::xxh3_64(name) as usize % HEADER_TENANTS)
}

/// `x-rolter-deadline-ms`: whole milliseconds, 1 to an hour.
fn deadline(req: &Request<'_>) -> Result<Option<Instant>, GatewayError> {
    let Some(v) = req.header(DEADLINE_HEADER) else {
        return Ok(None);
    };
    let ms = std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .filter(|d| !d.is_zero() && *d <= MAX_DEADLINE);
    match ms {
        Some(d) => Ok(Some(req.started + d)),
        None => Err(GatewayError::client(
            400,
            "invalid_deadline",
            format!(
                "`{DEADLINE_HEADER}` must be a whole number of milliseconds from 1 to 3600000."
            ),
        )),
    }
}
