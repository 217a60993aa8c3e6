//! Stage 2 of the request path: the request's routing facts (one borrowed JSON pass over the
//! body, or a scan of a multipart form's part headers for its `model` field) and the first
//! route whose rules all hold and one of whose targets serves the requested model; for a
//! passthrough path, the first route whose `passthrough` prefix covers it, the body unread.
//!
//! Owns route matching. A request no route takes is a 404 `model_not_found` and never
//! reaches an upstream; it must not pick targets (that is `pick`).

use rolter_codec::api::facts::{self, RequestFacts};
use rolter_codec::api::{is_proxied_path, multipart};
use rolter_codec::GatewayError;
use rolter_config::{Route, Target};

use super::request::Request;
use crate::path::state::WorkerState;

/// A request matched to a route.
pub struct Routed<'a> {
    pub facts: RequestFacts<'a>,
    /// Index of the route in the configuration.
    pub index: usize,
    pub route: &'a Route,
    /// Taken by a `passthrough` prefix: no facts were read from the body.
    pub passthrough: bool,
    /// The header that carried the caller's gateway API key: never sent upstream.
    pub key_header: Option<&'static str>,
}

/// The request's facts and its route, or the error to answer.
pub fn route<'a>(state: &'a WorkerState, req: &Request<'a>) -> Result<Routed<'a>, GatewayError> {
    let path = req.head.path(req.buf);
    let config = &state.config;
    if !is_proxied_path(path) {
        // Only passthrough requests reach here (see `local::is_forwarded`): no model.
        return match match_passthrough(&config.routes, path, req) {
            Some(index) => Ok(Routed {
                facts: RequestFacts::default(),
                index,
                route: &config.routes[index],
                passthrough: true,
                key_header: None,
            }),
            None => Err(not_found(path)),
        };
    }
    let form = match req.header("content-type") {
        Some(ct) => multipart::boundary(ct)?,
        None => None,
    };
    let facts = match form {
        Some(boundary) => multipart::extract(req.body, boundary)?,
        None => facts::extract(req.body)?,
    };
    if facts.model.is_empty() {
        return Err(
            GatewayError::client(400, "missing_model", "`model` is required").with_param("model"),
        );
    }
    match match_route(&config.routes, &config.targets, path, &facts.model, req) {
        Some(index) => Ok(Routed {
            facts,
            index,
            route: &config.routes[index],
            passthrough: false,
            key_header: None,
        }),
        None => Err(model_not_found(&facts.model)),
    }
}

/// The 404 for a path that is neither proxied, nor the gateway's, nor passthrough.
pub fn not_found(path: &str) -> GatewayError {
    GatewayError::client(404, "not_found", format!("no such endpoint: {path}"))
}

/// The 404 for a model no route serves (also `GET /v1/models/{id}`'s for an unknown id).
pub fn model_not_found(model: &str) -> GatewayError {
    GatewayError::client(
        404,
        "model_not_found",
        format!("The model `{model}` does not exist or is not served by this gateway."),
    )
    .with_param("model")
}

/// The first route whose rules all hold and one of whose targets serves the model.
pub fn match_route(
    routes: &[Route],
    targets: &[Target],
    path: &str,
    model: &str,
    req: &Request<'_>,
) -> Option<usize> {
    routes.iter().position(|r| {
        let m = &r.matcher;
        r.matches_requests()
            && m.takes_proxied(path)
            && (m.models.is_empty() || m.models.iter().any(|x| x == model))
            && m.header
                .as_ref()
                .is_none_or(|(n, v)| req.header(n) == Some(v.as_bytes()))
            && r.targets.iter().any(|&t| targets[t].serves(model))
    })
}

/// The first route one of whose `passthrough` prefixes covers `path` and whose header rule
/// holds. Passthrough requests carry no model: `models` rules do not apply.
pub fn match_passthrough(routes: &[Route], path: &str, req: &Request<'_>) -> Option<usize> {
    routes.iter().position(|r| {
        let m = &r.matcher;
        r.matches_requests()
            && m.takes_passthrough(path)
            && m.header
                .as_ref()
                .is_none_or(|(n, v)| req.header(n) == Some(v.as_bytes()))
    })
}
