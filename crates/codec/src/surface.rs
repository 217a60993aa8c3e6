//! Which API a request called (its *surface*): the shape the gateway's own answers to it
//! take, so each API's SDK understands them. OpenAI's chat, completions, embeddings, models
//! and the engines' other endpoints share OpenAI's error shape; the Responses API adds its
//! own streamed error event; Anthropic's `/v1/messages` has its own error body and event.
//!
//! Owns the mapping from a path to a surface only. It must not render anything (that is
//! `error`).

/// The API a request called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Surface {
    /// OpenAI's shapes: `{"error":{"message","type","param","code"}}`, and a `data:` line
    /// with that object mid-stream.
    #[default]
    OpenAi,
    /// OpenAI's Responses API: OpenAI's error body; mid-stream, an `event: error` whose data
    /// is `{"type":"error","code","message","param","sequence_number"}`.
    Responses,
    /// Anthropic's Messages API: `{"type":"error","error":{"type","message"}}`, and the same
    /// object as an `event: error` mid-stream.
    Anthropic,
}

impl Surface {
    /// The surface of a request to `path` (origin form, no query).
    pub fn of_path(path: &str) -> Surface {
        let under = |base: &str| {
            path.strip_prefix(base)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        if under("/v1/messages") {
            Surface::Anthropic
        } else if under("/v1/responses") {
            Surface::Responses
        } else {
            Surface::OpenAi
        }
    }

    /// The surface's name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Surface::OpenAi => "openai",
            Surface::Responses => "responses",
            Surface::Anthropic => "anthropic",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Surface;

    #[test]
    fn paths_map_to_their_api() {
        for (p, s) in [
            ("/v1/messages", Surface::Anthropic),
            ("/v1/messages/count_tokens", Surface::Anthropic),
            ("/v1/messagesx", Surface::OpenAi),
            ("/v1/responses", Surface::Responses),
            ("/v1/chat/completions", Surface::OpenAi),
            ("/v1/embeddings", Surface::OpenAi),
            ("/nope", Surface::OpenAi),
        ] {
            assert_eq!(Surface::of_path(p), s, "{p}");
        }
    }
}
