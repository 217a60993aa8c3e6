//! Stage 2 of the request path: the request's routing facts (one borrowed JSON pass over the
//! body) and the first route whose rules all hold and one of whose targets serves the
//! requested model.
//!
//! Owns route matching. A request no route takes is a 404 `model_not_found` and never
//! reaches an upstream; it must not pick targets (that is `pick`).

use rolter_codec::api::facts::{self, RequestFacts};
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
    /// The header that carried the caller's gateway API key: never sent upstream.
    pub key_header: Option<&'static str>,
}

/// The request's facts and its route, or the error to answer.
pub fn route<'a>(state: &'a WorkerState, req: &Request<'a>) -> Result<Routed<'a>, GatewayError> {
    let facts = facts::extract(req.body)?;
    if facts.model.is_empty() {
        return Err(
            GatewayError::client(400, "missing_model", "`model` is required").with_param("model"),
        );
    }
    let path = req.head.path(req.buf);
    let config = &state.config;
    match match_route(&config.routes, &config.targets, path, &facts.model, req) {
        Some(index) => Ok(Routed {
            facts,
            index,
            route: &config.routes[index],
            key_header: None,
        }),
        None => Err(model_not_found(&facts.model)),
    }
}

fn model_not_found(model: &str) -> GatewayError {
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
        (m.paths.is_empty() || m.paths.iter().any(|p| p == path))
            && (m.models.is_empty() || m.models.iter().any(|x| x == model))
            && m.header
                .as_ref()
                .is_none_or(|(n, v)| req.header(n) == Some(v.as_bytes()))
            && r.targets.iter().any(|&t| targets[t].serves(model))
    })
}
