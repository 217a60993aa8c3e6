//! Stage 1 of the request path when `[[keys]]` are configured: who is calling. The key
//! comes from `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's header); it
//! is hashed once (SHA-256), looked up in the map built at load and compared with the
//! stored hash in constant time. Once routed, the key must be allowed the route and the
//! model, and be within its per-minute limits (the shared windows of
//! [`mesh::key_limits`](crate::mesh::key_limits)).
//!
//! Owns the answers 401 (missing or unknown key), 403 (route or model not allowed) and 429
//! (over a limit, with `Retry-After`). It must not keep, log or forward the key: only its
//! name leaves this stage.

use rolter_codec::GatewayError;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::request::Request;
use super::route::Routed;
use crate::mesh::key_limits::{minute_now, KeyResult};
use crate::path::state::WorkerState;

/// The key a request was identified by.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// Index in `config.keys.keys` and in the key book.
    pub key: usize,
    /// The header that carried it (withheld from the upstream).
    pub header: &'static str,
}

const ACCEPTED: &str = "send the API key as `Authorization: Bearer <key>` or `x-api-key: <key>`";

/// The request's caller: `Ok(None)` when no keys are configured (the gateway is open).
pub fn identify(state: &WorkerState, req: &Request<'_>) -> Result<Option<Caller>, GatewayError> {
    let keys = &state.config.keys;
    if keys.is_empty() {
        return Ok(None);
    }
    let presented = presented(req);
    let found = presented.and_then(|(key, header)| {
        let hash: [u8; 32] = Sha256::digest(key).into();
        let &i = keys.by_hash.get(&hash)?;
        bool::from(keys.keys[i].hash[..].ct_eq(&hash[..])).then_some(Caller { key: i, header })
    });
    match (found, presented) {
        (Some(c), _) => Ok(Some(c)),
        (None, None) => {
            state.keys.count_unauthorized();
            Err(GatewayError::client(
                401,
                "missing_api_key",
                format!("This gateway requires an API key: {ACCEPTED}."),
            ))
        }
        (None, Some(_)) => {
            state.keys.count_unauthorized();
            Err(GatewayError::client(
                401,
                "invalid_api_key",
                format!(
                    "The API key is not valid here: {ACCEPTED}, with a key this gateway knows."
                ),
            ))
        }
    }
}

/// The key the client sent and the header it came in: `Authorization: Bearer` first,
/// else `x-api-key`.
fn presented<'a>(req: &'a Request<'_>) -> Option<(&'a [u8], &'static str)> {
    let bearer = req.header("authorization").and_then(|v| {
        let (scheme, rest) = v.split_at_checked(7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| rest.trim_ascii())
            .filter(|k| !k.is_empty())
    });
    if let Some(k) = bearer {
        return Some((k, "authorization"));
    }
    req.header("x-api-key")
        .map(<[u8]>::trim_ascii)
        .filter(|k| !k.is_empty())
        .map(|k| (k, "x-api-key"))
}

/// Whether `caller` may send this routed request now: the route and the model allowed,
/// and a place in its minute's windows (the request is counted there when admitted).
pub fn permit(
    state: &WorkerState,
    caller: Caller,
    routed: &Routed<'_>,
) -> Result<(), GatewayError> {
    let key = &state.config.keys.keys[caller.key];
    let refuse = |e: GatewayError, r: KeyResult| {
        state.keys.count(caller.key, r);
        Err(e)
    };
    if key
        .routes
        .as_ref()
        .is_some_and(|r| !r.contains(&routed.index))
    {
        return refuse(
            GatewayError::client(
                403,
                "route_not_allowed",
                format!(
                    "This API key may not use route `{}`; ask for a key that allows it.",
                    routed.route.name
                ),
            ),
            KeyResult::Forbidden,
        );
    }
    let model: &str = &routed.facts.model;
    if key
        .models
        .as_ref()
        .is_some_and(|m| !m.iter().any(|x| x == model))
    {
        return refuse(
            GatewayError::client(
                403,
                "model_not_allowed",
                if model.is_empty() {
                    // A passthrough request names no model.
                    "This API key may use only its listed models, and this request names none."
                        .into()
                } else {
                    format!("This API key may not use the model `{model}`.")
                },
            )
            .with_param("model"),
            KeyResult::Forbidden,
        );
    }
    if let Err(secs) = state.keys.admit(caller.key, minute_now()) {
        return refuse(
            GatewayError::client(
                429,
                "rate_limit_exceeded",
                format!(
                    "This API key is over its per-minute limit; try again in {secs} s, when the minute's window ends."
                ),
            )
            .with_retry_after(u64::from(secs)),
            KeyResult::RateLimited,
        );
    }
    state.keys.count(caller.key, KeyResult::Served);
    Ok(())
}

/// A served request's usage, charged to its key.
pub fn charge(state: &WorkerState, caller: Caller, prompt: u32, completion: u32) {
    state
        .keys
        .charge(caller.key, minute_now().0, prompt, completion);
}
