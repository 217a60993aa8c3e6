//! What a strategy is asked about: the request's routing facts, its session, and the
//! asynchronous inputs resolved for it before the pick.

use std::rc::Rc;

use crate::TargetId;

/// Inputs a strategy asks the gateway to resolve before its pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs(u8);

impl Needs {
    pub const NONE: Needs = Needs(0);
    /// The prompt as token ids (local tokenizer or the engine's tokenize endpoint).
    pub const TOKEN_IDS: Needs = Needs(1);
    /// A prefix lookup at a cache controller (LMCache).
    pub const CACHE_LOOKUP: Needs = Needs(2);
    /// The next position of a rotation kept in the shared state store, advanced over the
    /// candidates of this pick ([`AsyncInputs::rotation`]).
    pub const SHARED_ROTATION: Needs = Needs(16);
    /// `PickRequest::prompt` in canonical form (whitespace-free JSON), for prefix matching
    /// and conversation keys.
    pub const CANONICAL_PROMPT: Needs = Needs(8);
    /// [`Candidate::lora`](crate::Candidate::lora): each target's residency of the
    /// requested model's LoRA adapter.
    pub const LORA_RESIDENCY: Needs = Needs(64);

    pub const fn union(self, other: Needs) -> Needs {
        Needs(self.0 | other.0)
    }
    pub const fn contains(self, other: Needs) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Results of the asynchronous inputs, resolved before `pick`. `None` means not asked for,
/// or not available in time.
#[derive(Debug, Clone, Default)]
pub struct AsyncInputs {
    pub token_ids: Option<Rc<[u32]>>,
    /// Per target: prompt tokens the cache controller reports as held there.
    pub cached_tokens: Option<Rc<[(TargetId, u32)]>>,
    /// The target the shared rotation gave this pick (one of its candidates), from the
    /// store or from this core's lease of positions; `None` when the store could not answer
    /// in time.
    pub rotation: Option<TargetId>,
}

/// What a strategy knows about the request being routed.
#[derive(Debug, Clone, Copy)]
pub struct PickRequest<'a> {
    pub model: &'a str,
    /// The session this request belongs to; hashed only by strategies that read it.
    pub session: SessionKey<'a>,
    /// The prompt (messages, prompt or input JSON): canonical (whitespace-free) when the
    /// strategy asked for [`Needs::CANONICAL_PROMPT`], else as the client sent it.
    pub prompt: &'a [u8],
    pub prompt_tokens: u32,
    pub max_tokens: Option<u64>,
    pub inputs: &'a AsyncInputs,
}

/// What identifies a request's session: the `x-session-id` header when present, else the
/// conversation itself. The hash is computed on demand, so strategies that ignore sessions
/// pay nothing for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionKey<'a> {
    /// The `x-session-id` header value, when the client sent a non-empty one.
    pub header: Option<&'a [u8]>,
    /// The prompt bytes the key falls back to.
    pub prompt: &'a [u8],
}

impl SessionKey<'_> {
    /// A stable 64-bit key: the header's hash, else the prompt's.
    pub fn hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self.header.unwrap_or(self.prompt))
    }

    /// Whether the client named the session explicitly.
    pub fn is_explicit(&self) -> bool {
        self.header.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::SessionKey;

    #[test]
    fn session_key_prefers_the_header() {
        let a = SessionKey {
            header: Some(b"user-1"),
            prompt: b"[{\"role\":\"user\",\"content\":\"hi\"}]",
        };
        let b = SessionKey {
            header: Some(b"user-1"),
            prompt: b"[]",
        };
        assert_eq!(a.hash(), b.hash(), "the header decides, not the prompt");
        assert!(a.is_explicit());
        let c = SessionKey {
            header: None,
            prompt: b"[]",
        };
        let d = SessionKey {
            header: None,
            prompt: b"[1]",
        };
        assert_ne!(c.hash(), d.hash());
        assert!(!c.is_explicit());
    }
}
