//! The client API keys' series: `rolter_key_requests_total{key,result}` (served,
//! unauthorized, forbidden, rate_limited) and `rolter_key_tokens_total{key,kind}` (prompt,
//! completion), written from the key book's counts each time `/metrics` is rendered.
//!
//! Owns those names and their help texts. Only the running configuration's keys are
//! written, so a key removed by a reload stops being reported; requests with no known key
//! are counted under `key="-"` (no key name can be `-`). Nothing is written when no keys
//! are configured. It keeps no state between renders.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::mesh::key_limits::{KeyBook, KeyResult};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByResult {
    key: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByKind {
    key: String,
    kind: &'static str,
}

/// Appends the keys' series to `out`.
pub fn render(book: &KeyBook, out: &mut String) {
    if book.is_empty() {
        return;
    }
    let mut r = Registry::default();
    let requests = Family::<ByResult, Counter>::default();
    let tokens = Family::<ByKind, Counter>::default();
    requests
        .get_or_create(&ByResult {
            key: "-".into(),
            result: "unauthorized",
        })
        .inc_by(book.unauthorized());
    for (name, results, prompt, completion) in book.snapshot() {
        for r in KeyResult::ALL {
            requests
                .get_or_create(&ByResult {
                    key: name.to_string(),
                    result: r.label(),
                })
                .inc_by(results[r as usize]);
        }
        for (kind, n) in [("prompt", prompt), ("completion", completion)] {
            tokens
                .get_or_create(&ByKind {
                    key: name.to_string(),
                    kind,
                })
                .inc_by(n);
        }
    }
    r.register(
        "rolter_key_requests",
        "Requests by client API key and result: served (admitted to a route), unauthorized (no key or an unknown one, key=\"-\"), forbidden (route or model not allowed), rate_limited (over requests_per_minute or tokens_per_minute)",
        requests,
    );
    r.register(
        "rolter_key_tokens",
        "Tokens used by client API key, by kind (prompt, completion), as the responses' usage reported them",
        tokens,
    );
    super::text::append(out, &r);
}
