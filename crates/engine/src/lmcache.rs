//! The LMCache controller's lookup API as the gateway uses it: the `POST /lookup` body for a
//! prompt's token ids, the answer parsed into per-target matched tokens, and a per-core memo
//! that reuses an answer for the same prompt prefix within a short window.
//!
//! The controller (`python -m lmcache.v1.api_server`) answers
//! `{"event_id":"Lookup…","layout_info":{"<instance id>":["<location>",<matched end>],…}}`:
//! it walks the prompt's chunks in order, stops at the first chunk no instance holds, and
//! names each chunk's first holder with the end of that chunk. An instance id maps to a
//! target through the target's `lmcache_instance` (default: its name).
//!
//! Pure: no sockets, no clock reads (time comes in as an argument), no logging. The call
//! itself is made by the gateway's `route_clients::cache_lookup` on the worker.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::de::IgnoredAny;
use serde::Deserialize;

use rolter_core::TargetId;

/// What the controller said of one prompt: per target, the prompt tokens it holds.
pub type Holdings = Rc<[(TargetId, u32)]>;

/// The request body: `{"tokens":[…]}`.
pub fn lookup_body(tokens: &[u32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(12 + tokens.len() * 7);
    out.extend_from_slice(b"{\"tokens\":[");
    let mut buf = itoa::Buffer::new();
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(buf.format(*t).as_bytes());
    }
    out.extend_from_slice(b"]}");
}

/// The route's LMCache instance ids and the targets they name.
#[derive(Debug, Clone, Default)]
pub struct Instances {
    by_id: HashMap<Box<str>, TargetId>,
}

impl Instances {
    /// `(instance id, target)` pairs; a later pair for the same id is ignored.
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, TargetId)>) -> Instances {
        let mut by_id = HashMap::new();
        for (id, t) in pairs {
            by_id.entry(Box::from(id)).or_insert(t);
        }
        Instances { by_id }
    }

    pub fn target(&self, instance: &str) -> Option<TargetId> {
        self.by_id.get(instance).copied()
    }
}

/// Why an answer could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// Not the JSON the controller sends.
    Malformed(String),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::Malformed(e) => write!(f, "malformed lookup answer: {e}"),
        }
    }
}

#[derive(Deserialize)]
struct LookupRet<'a> {
    #[serde(borrow, default)]
    layout_info: HashMap<Cow<'a, str>, (IgnoredAny, u64)>,
}

/// A parsed answer: holdings of the route's targets, and how many instance ids named no
/// target of the route (a configuration mismatch when it is not zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub holdings: Vec<(TargetId, u32)>,
    pub unknown_instances: usize,
}

/// Parses a `/lookup` answer; matched ends are capped at `prompt_len` tokens.
pub fn parse_lookup(
    body: &[u8],
    instances: &Instances,
    prompt_len: u32,
) -> Result<Parsed, LookupError> {
    let ret: LookupRet<'_> =
        serde_json::from_slice(body).map_err(|e| LookupError::Malformed(e.to_string()))?;
    let mut holdings = Vec::with_capacity(ret.layout_info.len());
    let mut unknown_instances = 0;
    for (id, (_, end)) in &ret.layout_info {
        match instances.target(id) {
            Some(t) => {
                let tokens = (*end).min(u64::from(prompt_len));
                holdings.push((t, tokens as u32));
            }
            None => unknown_instances += 1,
        }
    }
    holdings.sort_unstable();
    Ok(Parsed {
        holdings,
        unknown_instances,
    })
}

/// The memo key of a prompt: its token ids up to the last whole `chunk` (the controller's
/// chunk size), or the whole prompt when it is shorter than one chunk. Prompts that agree on
/// every whole chunk get the same answer from the controller, up to the partial last chunk.
pub fn memo_key(tokens: &[u32], chunk: usize) -> u64 {
    let whole = tokens.len() / chunk.max(1) * chunk.max(1);
    let keyed = if whole == 0 { tokens } else { &tokens[..whole] };
    // Streamed through a stack buffer: no allocation per request.
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = [0u8; 4096];
    for part in keyed.chunks(buf.len() / 4) {
        for (dst, t) in buf.chunks_exact_mut(4).zip(part) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        hasher.update(&buf[..part.len() * 4]);
    }
    hasher.digest() ^ (keyed.len() as u64).rotate_left(32)
}

/// Recent answers by memo key, each reused until `window` after it arrived. Bounded: when
/// full, expired entries go first, then everything (the memo is a shortcut, never a source
/// of truth).
#[derive(Debug)]
pub struct LookupMemo {
    window: Duration,
    capacity: usize,
    entries: HashMap<u64, (Instant, Holdings)>,
}

impl LookupMemo {
    pub fn new(window: Duration, capacity: usize) -> LookupMemo {
        LookupMemo {
            window,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// The answer for `key` when it arrived within the window before `now`.
    pub fn get(&self, key: u64, now: Instant) -> Option<Holdings> {
        if self.window.is_zero() {
            return None;
        }
        let (at, h) = self.entries.get(&key)?;
        (now.saturating_duration_since(*at) < self.window).then(|| h.clone())
    }

    pub fn put(&mut self, key: u64, now: Instant, holdings: Holdings) {
        if self.window.is_zero() {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let window = self.window;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < window);
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now, holdings));
    }

    /// The request behind `key` was just sent to `target`, whose engine will store its
    /// `tokens` prompt tokens: a remembered answer now says so, so the prompts after it in
    /// the window follow it instead of the answer from before it was stored. Without a
    /// remembered answer nothing changes.
    pub fn note_routed(&mut self, key: u64, target: TargetId, tokens: u32) {
        let Some((_, holdings)) = self.entries.get_mut(&key) else {
            return;
        };
        if holdings
            .iter()
            .any(|&(t, held)| t == target && held >= tokens)
        {
            return;
        }
        let mut merged: Vec<(TargetId, u32)> = holdings
            .iter()
            .copied()
            .filter(|&(t, _)| t != target)
            .collect();
        merged.push((target, tokens));
        merged.sort_unstable();
        *holdings = Rc::from(merged);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// After a failed lookup the controller is not asked again for `pause`; requests meanwhile
/// fall back at once instead of each waiting out the timeout.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pause: Duration,
    until: Option<Instant>,
}

impl Backoff {
    pub fn new(pause: Duration) -> Backoff {
        Backoff { pause, until: None }
    }

    /// Whether a lookup may be made at `now`.
    pub fn open(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| now >= u)
    }

    pub fn failed(&mut self, now: Instant) {
        self.until = Some(now + self.pause);
    }

    pub fn succeeded(&mut self) {
        self.until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instances() -> Instances {
        Instances::new([("vllm-pod-0", 0), ("vllm-pod-1", 1), ("pod-2", 2)])
    }

    #[test]
    fn the_body_lists_the_token_ids() {
        let mut out = Vec::new();
        lookup_body(&[1, 22, 4_294_967_295], &mut out);
        assert_eq!(out, br#"{"tokens":[1,22,4294967295]}"#);
        lookup_body(&[], &mut out);
        assert_eq!(out, br#"{"tokens":[]}"#);
    }

    #[test]
    fn an_answer_maps_instances_to_targets_and_caps_at_the_prompt() {
        let body = br#"{"event_id":"Lookup8c1f","layout_info":{"vllm-pod-1":["LocalCPUBackend",512],"vllm-pod-0":["LocalCPUBackend",256],"elsewhere":["cpu",768]}}"#;
        let p = parse_lookup(body, &instances(), 400).unwrap();
        assert_eq!(p.holdings, vec![(0, 256), (1, 400)]);
        assert_eq!(p.unknown_instances, 1);
    }

    #[test]
    fn an_empty_layout_holds_nothing() {
        let p = parse_lookup(br#"{"event_id":"x","layout_info":{}}"#, &instances(), 9).unwrap();
        assert!(p.holdings.is_empty());
        let p = parse_lookup(br#"{"event_id":"x"}"#, &instances(), 9).unwrap();
        assert!(p.holdings.is_empty());
    }

    #[test]
    fn escaped_instance_ids_are_matched() {
        let body = br#"{"layout_info":{"pod\u002d2":["cpu",16]}}"#;
        let p = parse_lookup(body, &instances(), 100).unwrap();
        assert_eq!(p.holdings, vec![(2, 16)]);
    }

    #[test]
    fn malformed_answers_are_errors() {
        for body in [
            &b"not json"[..],
            br#"{"layout_info":{"vllm-pod-0":["cpu"]}}"#,
            br#"{"layout_info":{"vllm-pod-0":["cpu",-3]}}"#,
            br#"{"layout_info":[1,2]}"#,
            b"",
        ] {
            assert!(
                parse_lookup(body, &instances(), 10).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn memo_keys_agree_on_whole_chunks_only() {
        let a: Vec<u32> = (0..600).collect();
        let mut b = a.clone();
        b[550] = 9_999; // in the partial last chunk
        assert_eq!(memo_key(&a, 256), memo_key(&b, 256));
        let mut c = a.clone();
        c[100] = 9_999; // in a whole chunk
        assert_ne!(memo_key(&a, 256), memo_key(&c, 256));
        // Shorter than one chunk: the whole prompt is the key.
        assert_ne!(memo_key(&a[..10], 256), memo_key(&a[..11], 256));
        assert_ne!(memo_key(&a[..256], 256), memo_key(&a[..512], 256));
    }

    #[test]
    fn the_memo_reuses_within_the_window_and_stays_bounded() {
        let t0 = Instant::now();
        let mut m = LookupMemo::new(Duration::from_secs(2), 3);
        let h: Holdings = Rc::from(vec![(1, 256)]);
        m.put(7, t0, h.clone());
        assert_eq!(m.get(7, t0 + Duration::from_millis(1999)), Some(h.clone()));
        assert_eq!(m.get(7, t0 + Duration::from_secs(2)), None);
        assert_eq!(m.get(8, t0), None);
        for k in 0..10 {
            m.put(100 + k, t0 + Duration::from_secs(k), h.clone());
            assert!(m.len() <= 3);
        }
        // A request routed to target 2 makes the remembered answer name it.
        m.put(5, t0, Rc::from(vec![(1, 256)]));
        m.note_routed(5, 2, 600);
        assert_eq!(&*m.get(5, t0).unwrap(), &[(1, 256), (2, 600)]);
        m.note_routed(5, 1, 600);
        assert_eq!(&*m.get(5, t0).unwrap(), &[(1, 600), (2, 600)]);
        m.note_routed(6, 1, 600);
        assert_eq!(m.get(6, t0), None, "nothing remembered, nothing noted");
        // A zero window turns the memo off.
        let mut off = LookupMemo::new(Duration::ZERO, 3);
        off.put(1, t0, h);
        assert!(off.is_empty() && off.get(1, t0).is_none());
    }

    #[test]
    fn backoff_pauses_after_a_failure() {
        let t0 = Instant::now();
        let mut b = Backoff::new(Duration::from_secs(1));
        assert!(b.open(t0));
        b.failed(t0);
        assert!(!b.open(t0 + Duration::from_millis(999)));
        assert!(b.open(t0 + Duration::from_secs(1)));
        b.failed(t0);
        b.succeeded();
        assert!(b.open(t0));
    }
}
