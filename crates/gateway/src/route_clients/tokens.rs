//! The prompt's token ids, for strategies that read them: from the route's local tokenizer
//! (on the worker's blocking pool, never on the event loop) or from a target's
//! `POST /tokenize`.
//!
//! Owns nothing between requests. It must not fail a request: ids that cannot be had
//! within the timeout are `None`, and the strategy takes its fallback and says so.

use std::rc::Rc;
#[cfg(feature = "local-tokenizer")]
use std::sync::Arc;
use std::time::Duration;

use rolter_config::{Route, Target};
use rolter_strategy::TokenizerOptions;
use rolter_tokenize::remote::{self, CompletionPlan, Endpoint};
use rolter_tokenize::ChatRequest;
#[cfg(feature = "local-tokenizer")]
use rolter_tokenize::LocalTokenizer;

use crate::mesh::load::LoadView;
use crate::upstream::Upstreams;

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
    #[cfg(feature = "local-tokenizer")]
    Local {
        tokenizer: Arc<LocalTokenizer>,
        timeout: Duration,
    },
}

impl TokenSource {
    /// The source configured for `route`, from its strategy's tokenizer options (`None`:
    /// the strategy reads no token ids).
    pub fn for_route(route: &Route, options: Option<&TokenizerOptions>) -> TokenSource {
        let Some(options) = options else {
            return TokenSource::None;
        };
        let timeout = options.tokenize_timeout;
        #[cfg(feature = "local-tokenizer")]
        if let Some(t) = &route.tokenizer {
            return TokenSource::Local {
                tokenizer: t.clone(),
                timeout,
            };
        }
        #[cfg(not(feature = "local-tokenizer"))]
        let _ = route;
        TokenSource::Engine { timeout }
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
    up: &Upstreams,
    load: &LoadView,
    source: &TokenSource,
    route: &Route,
    prompt: &Prompt<'_>,
    scratch: &mut Vec<u8>,
) -> Option<Rc<[u32]>> {
    match source {
        TokenSource::None => None,
        #[cfg(feature = "local-tokenizer")]
        TokenSource::Local { tokenizer, timeout } => {
            local(tokenizer.clone(), prompt, *timeout).await
        }
        TokenSource::Engine { timeout } => engine(up, load, route, prompt, *timeout, scratch).await,
    }
}

#[cfg(feature = "local-tokenizer")]
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
    up: &'a Upstreams,
    load: &LoadView,
    route: &Route,
    model: &'a str,
) -> Option<(usize, &'a Target, &'a str)> {
    route.targets.iter().find_map(|&tid| {
        let t = up.target(tid);
        (t.serves(model) && load.eligible(tid)).then(|| {
            let upstream = t.upstream_models.get(model).map_or(model, String::as_str);
            (tid, t, upstream)
        })
    })
}

async fn engine(
    up: &Upstreams,
    load: &LoadView,
    route: &Route,
    prompt: &Prompt<'_>,
    timeout: Duration,
    scratch: &mut Vec<u8>,
) -> Option<Rc<[u32]>> {
    let (tid, _, model) = tokenizing_target(up, load, route, prompt.model)?;
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
    let resp = up
        .post_json(tid, path, &body, timeout, MAX_TOKENIZE_BODY, scratch)
        .await
        .ok()?;
    if !(200..300).contains(&resp.status) {
        return None;
    }
    remote::parse_response(&resp.body, &mut ids).ok()?;
    Some(ids.into())
}
