//! Encoding a prompt piece by piece between its added tokens, with a bounded cache of each
//! piece's ids.
//!
//! The library finds the added tokens whose `normalized` is false in the raw text first
//! (leftmost-longest), and normalises, pre-tokenizes and encodes each piece between them on
//! its own: nothing merges across such a token. So a prompt's ids are its pieces' ids with
//! the tokens' ids between them. A chat template writes added tokens (`<|im_start|>`,
//! `<|eot_id|>` ...) around every message, so the pieces are the messages, and the next
//! request of a conversation repeats every piece but its new turn. This module owns that
//! split, the rule that says when it is exact, and the cache of piece ids, keyed by a 128-bit
//! hash (XXH3) of the piece's bytes.
//!
//! The rule, decided once per tokenizer ([`Segmenter::new`]): tokenizer.json sets no
//! truncation and no padding, special tokens are not encoded as text, and no added token with
//! `normalized: false` has `lstrip`, `rstrip` or `single_word` (each makes a token's match
//! depend on its neighbours' text, or take some of it). Otherwise the caller encodes the whole
//! text at once. Added tokens with `normalized: true` are matched by the library after
//! normalisation, inside a piece, so they do not split pieces here.
//!
//! Must not: block for long (a cache shard is locked only for one lookup or one insert),
//! grow without bound, or encode anything itself (the caller passes the piece encoder).

use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_128;

/// Default bound of the piece cache, in cached ids (about 4 bytes each, plus 64 bytes per
/// piece): some 8 MiB.
pub(crate) const DEFAULT_CACHE_IDS: u64 = 2 * 1024 * 1024;

/// Per-piece overhead counted against the bound, in ids (map slot, `Arc` header, key).
const PIECE_OVERHEAD: u64 = 16;

#[derive(Clone)]
struct IdsWeight;

impl Weighter<u128, Arc<[u32]>> for IdsWeight {
    fn weight(&self, _key: &u128, ids: &Arc<[u32]>) -> u64 {
        ids.len() as u64 + PIECE_OVERHEAD
    }
}

/// The split at a tokenizer's added tokens, and the cache of the pieces' ids.
pub(crate) struct Segmenter {
    tokens: AhoCorasick,
    /// The id of each pattern of `tokens`.
    ids: Vec<u32>,
    cache: Cache<u128, Arc<[u32]>, IdsWeight>,
}

impl Segmenter {
    /// The segmenter of `tokenizer`, with a cache of about `cache_ids` ids (0: no cache), or
    /// why piece-wise encoding would not give the library's ids.
    pub(crate) fn new(tokenizer: &Tokenizer, cache_ids: u64) -> Result<Self, String> {
        if tokenizer.get_truncation().is_some() {
            return Err("tokenizer.json sets truncation".into());
        }
        if tokenizer.get_padding().is_some() {
            return Err("tokenizer.json sets padding".into());
        }
        if tokenizer.get_encode_special_tokens() {
            return Err("special tokens are encoded as text".into());
        }
        let mut added: Vec<_> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| !t.normalized)
            .collect();
        added.sort_by_key(|(id, _)| *id);
        if let Some((_, t)) = added
            .iter()
            .find(|(_, t)| t.lstrip || t.rstrip || t.single_word)
        {
            return Err(format!(
                "added token {:?} has lstrip, rstrip or single_word",
                t.content
            ));
        }
        let tokens = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(added.iter().map(|(_, t)| t.content.as_str()))
            .map_err(|e| format!("cannot index the added tokens: {e}"))?;
        let ids = added.iter().map(|(id, _)| *id).collect();
        let cache_ids = cache_ids.max(1);
        let cache = Cache::with_weighter((cache_ids / 64).max(16) as usize, cache_ids, IdsWeight);
        Ok(Segmenter { tokens, ids, cache })
    }

    /// Appends the ids of `text` to `out`: each added token's id, and for each piece between
    /// them its cached ids, or those `encode` appends (then cached).
    pub(crate) fn encode<E>(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        mut encode: impl FnMut(&str, &mut Vec<u32>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut last = 0;
        for m in self.tokens.find_iter(text) {
            self.piece(&text[last..m.start()], out, &mut encode)?;
            out.push(self.ids[m.pattern().as_usize()]);
            last = m.end();
        }
        self.piece(&text[last..], out, &mut encode)
    }

    fn piece<E>(
        &self,
        piece: &str,
        out: &mut Vec<u32>,
        encode: &mut impl FnMut(&str, &mut Vec<u32>) -> Result<(), E>,
    ) -> Result<(), E> {
        if piece.is_empty() {
            return Ok(());
        }
        let key = xxh3_128(piece.as_bytes());
        if let Some(ids) = self.cache.get(&key) {
            out.extend_from_slice(&ids);
            return Ok(());
        }
        let start = out.len();
        encode(piece, out)?;
        self.cache.insert(key, Arc::from(&out[start..]));
        Ok(())
    }

    /// Empties the cache.
    pub(crate) fn clear(&self) {
        self.cache.clear();
    }

    /// Pieces in the cache.
    pub(crate) fn cached_pieces(&self) -> usize {
        self.cache.len()
    }
}
