//! A strategy's asynchronous inputs, resolved before its pick: the prompt's token ids, from
//! the route's local tokenizer (on the worker's blocking pool, never on the event loop) or
//! from a target's `POST /tokenize`.
//!
//! Owns nothing between requests. It must not fail a request: an input that cannot be had
//! within its timeout is `None`, and the strategy takes its fallback and says so.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::forward::serves;
use super::side_call;
use super::state::WorkerState;
use crate::config::{Route, Target};
use crate::tokenize::remote::{self, CompletionPlan, Endpoint};
use crate::tokenize::{ChatRequest, LocalTokenizer};

/// Largest `/tokenize` answer read (a 128k-token prompt is about 1 MB of JSON).
const MAX_TOKENIZE_BODY: usize = 4 * 1024 * 1024;

/// Where a route's token ids come from.
#[derive(Clone)]
pub enum TokenSource {
    /// The route's strategy needs none.
    None,
    /// The target's own tokenize endpoint, within `timeout`.
    Engine { timeout: Duration },
    /// A tokenizer loaded at configuration time, run on the blocking pool within `timeout`.
    Local {
        tokenizer: Arc<LocalTokenizer>,
        timeout: Duration,
    },
}

impl TokenSource {
    /// The source configured for `route`, given whether its strategy asks for token ids.
    pub fn for_route(route: &Route, needs_token_ids: bool) -> TokenSource {
        if !needs_token_ids {
            return TokenSource::None;
        }
        let timeout = route
            .strategy
            .options
            .get("tokenize_timeout")
            .and_then(toml::Value::as_str)
            .and_then(|s| humantime::parse_duration(s).ok())
            .unwrap_or(Duration::from_millis(100));
        match &route.tokenizer {
            Some(t) => TokenSource::Local {
                tokenizer: t.clone(),
                timeout,
            },
            None => TokenSource::Engine { timeout },
        }
    }
}

/// The request as tokenization needs it.
pub struct Prompt<'a> {
    /// `/v1/chat/completions` (messages) rather than a completions prompt.
    pub chat: bool,
    /// The raw JSON of `messages` or `prompt`.
    pub json: &'a [u8],
    pub model: &'a str,
}

/// The prompt's token ids, or `None` when they cannot be had in time.
pub async fn token_ids(
    state: &WorkerState,
    source: &TokenSource,
    route: &Route,
    prompt: &Prompt<'_>,
    scratch: &mut Vec<u8>,
) -> Option<Rc<[u32]>> {
    match source {
        TokenSource::None => None,
        TokenSource::Local { tokenizer, timeout } => {
            local(tokenizer.clone(), prompt, *timeout).await
        }
        TokenSource::Engine { timeout } => engine(state, route, prompt, *timeout, scratch).await,
    }
}

async fn local(
    tokenizer: Arc<LocalTokenizer>,
    prompt: &Prompt<'_>,
    timeout: Duration,
) -> Option<Rc<[u32]>> {
    let (chat, json) = (prompt.chat, prompt.json.to_vec());
    let job = monoio::spawn_blocking(move || {
        let mut ids = Vec::new();
        let r = if chat {
            tokenizer.chat_ids(&json, None, true, &mut ids)
        } else {
            tokenizer.prompt_ids(&json, &mut ids)
        };
        r.ok().map(|()| ids)
    });
    match monoio::time::timeout(timeout, job).await {
        Ok(Ok(Some(ids))) => Some(ids.into()),
        _ => None,
    }
}

/// The first target of the route that is eligible and serves the model, with the model
/// name it expects.
fn tokenizing_target<'a>(
    state: &'a WorkerState,
    route: &Route,
    model: &'a str,
) -> Option<(usize, &'a Target, &'a str)> {
    route.targets.iter().find_map(|&tid| {
        let t = &state.config.targets[tid];
        (serves(t, model) && state.load.eligible(tid)).then(|| {
            let upstream = t.upstream_models.get(model).map_or(model, String::as_str);
            (tid, t, upstream)
        })
    })
}

async fn engine(
    state: &WorkerState,
    route: &Route,
    prompt: &Prompt<'_>,
    timeout: Duration,
    scratch: &mut Vec<u8>,
) -> Option<Rc<[u32]>> {
    let (tid, _, model) = tokenizing_target(state, route, prompt.model)?;
    let mut body = Vec::with_capacity(prompt.json.len() + 128);
    let mut ids = Vec::new();
    let path = if prompt.chat {
        let req = ChatRequest {
            messages: prompt.json,
            tools: None,
            add_generation_prompt: true,
            chat_template_kwargs: None,
        };
        remote::chat_body(Endpoint::VllmTokenize, Some(model), &req, &mut body).ok()?;
        Endpoint::VllmTokenize.chat_path()?
    } else {
        match remote::completion_body(
            Endpoint::VllmTokenize,
            Some(model),
            prompt.json,
            &mut body,
            &mut ids,
        )
        .ok()?
        {
            CompletionPlan::Passthrough => return Some(ids.into()),
            CompletionPlan::Send => Endpoint::VllmTokenize.completion_path(),
        }
    };
    let resp = side_call::post_json(state, tid, path, &body, timeout, MAX_TOKENIZE_BODY, scratch)
        .await
        .ok()?;
    if !(200..300).contains(&resp.status) {
        return None;
    }
    remote::parse_response(&resp.body, &mut ids).ok()?;
    Some(ids.into())
}
