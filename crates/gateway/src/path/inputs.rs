//! Stage 3 of the request path: what the route's strategy asks for before its pick, resolved
//! with a deadline each by the route's clients ([`route_clients`](crate::route_clients)):
//! the prompt's token ids, an LMCache controller's answer for them, and the prompt in
//! canonical (whitespace-free) form.
//!
//! Owns the resolution order only. It must not fail a request: an input that cannot be
//! had in time is left empty, and the strategy falls back and says so.

use rolter_codec::api::canonical;
use rolter_core::{AsyncInputs, Needs};

use super::request::{IoBufs, Request};
use super::route::Routed;
use crate::mesh::Record;
use crate::path::state::WorkerState;
use crate::route_clients::tokens::{self, Prompt, TokenSource};

/// The resolved inputs of one request.
pub struct Inputs {
    pub resolved: AsyncInputs,
    /// The memo key of the cache lookup, when one was made (to note where the request
    /// went).
    pub lookup_key: Option<u64>,
}

/// Resolves what the route's strategy needs, in order: token ids, then the cache lookup
/// (which needs them).
pub async fn resolve(
    state: &WorkerState,
    routed: &Routed<'_>,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Inputs {
    let rs = &state.routes[routed.index];
    if matches!(rs.tokens, TokenSource::None) && rs.lookup.is_none() {
        return Inputs {
            resolved: AsyncInputs::default(),
            lookup_key: None,
        };
    }
    // Boxed: the calls are large futures, and most routes make none.
    Box::pin(resolve_calls(state, routed, req, bufs)).await
}

async fn resolve_calls(
    state: &WorkerState,
    routed: &Routed<'_>,
    req: &Request<'_>,
    bufs: &mut IoBufs,
) -> Inputs {
    let rs = &state.routes[routed.index];
    let mut resolved = AsyncInputs::default();
    if !matches!(rs.tokens, TokenSource::None) {
        let path = req.head.path(req.buf);
        let chat = path == "/v1/chat/completions";
        if chat || path == "/v1/completions" {
            let prompt = Prompt {
                chat,
                json: routed.facts.prompt,
                model: &routed.facts.model,
            };
            resolved.token_ids = tokens::token_ids(
                &state.upstream,
                &state.load,
                &rs.tokens,
                routed.route,
                &prompt,
                &mut bufs.side,
            )
            .await;
        }
    }
    let mut lookup_key = None;
    if let (Some(client), Some(ids)) = (&rs.lookup, &resolved.token_ids) {
        let found = client.lookup(ids, &mut bufs.prompt, &mut bufs.side).await;
        lookup_key = Some(found.key);
        state.links.record(Record::CacheLookup {
            route: routed.index as u16,
            result: found.result.label(),
            unknown_instances: found.unknown_instances as u32,
        });
        resolved.cached_tokens = found.holdings;
    }
    Inputs {
        resolved,
        lookup_key,
    }
}

/// The prompt as the strategy compares it: canonical in `scratch` when it asked for that,
/// else as the client sent it.
pub fn prompt<'a>(needs: Needs, raw: &'a [u8], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    if needs.contains(Needs::CANONICAL_PROMPT) {
        canonical::minify(raw, scratch);
        scratch
    } else {
        raw
    }
}
