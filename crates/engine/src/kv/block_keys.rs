//! How a request's token ids become the index's block keys: one key per full chunk of
//! `block_size` tokens, each the hash of its parent key and its tokens, seeded by the key
//! space (LoRA adapter, cache salt), so a match is always a consecutive prefix. The index
//! keys the engines' stored blocks the same way.
//!
//! Pure functions on borrowed input; a leaf of the KV modules.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Largest gateway block size, in tokens.
pub const MAX_BLOCK_SIZE: usize = 256;
/// What separates key spaces besides the tokens: the LoRA adapter (none for the base
/// model) and the request's `cache_salt`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeySpace<'a> {
    /// The adapter the request names in `model`, when it is an adapter.
    pub lora_name: Option<&'a str>,
    /// The request body's `cache_salt`.
    pub cache_salt: Option<&'a str>,
}

/// Domain seed of every chain.
pub(super) const ROOT: u64 = 0x6b76_2d69_6e64_6578;
pub(super) const TAG_LORA: u64 = 0x4c4f_5241;
pub(super) const TAG_LORA_ID: u64 = 0x4c4f_5241_4944;
pub(super) const TAG_SALT: u64 = 0x5341_4c54;
/// Room for a parent key, a block of tokens and an extra digest.
pub(super) const BUF: usize = 8 + 4 * MAX_BLOCK_SIZE + 8;

/// The seed of a chain: the key space's adapter (by name, else by numeric id) and salt.
pub(super) fn seed(lora_name: Option<&str>, lora_id: Option<i64>, cache_salt: Option<&str>) -> u64 {
    let mut h = ROOT;
    if let Some(name) = lora_name {
        h = xxh3_64_with_seed(name.as_bytes(), h ^ TAG_LORA);
    } else if let Some(id) = lora_id {
        h = xxh3_64_with_seed(&id.to_le_bytes(), h ^ TAG_LORA_ID);
    }
    if let Some(salt) = cache_salt {
        h = xxh3_64_with_seed(salt.as_bytes(), h ^ TAG_SALT);
    }
    h
}

/// The key of one chunk of tokens after `parent`.
#[inline]
pub(super) fn chain(buf: &mut [u8; BUF], parent: u64, tokens: &[u32], extra: u64) -> u64 {
    buf[..8].copy_from_slice(&parent.to_le_bytes());
    let mut n = 8;
    for t in tokens {
        buf[n..n + 4].copy_from_slice(&t.to_le_bytes());
        n += 4;
    }
    if extra != 0 {
        buf[n..n + 8].copy_from_slice(&extra.to_le_bytes());
        n += 8;
    }
    xxh3_64(&buf[..n])
}

/// The gateway keys of a request: one per full chunk of `block_size` tokens, chained from
/// the key space's seed. Clears `out` first. `block_size` is clamped to
/// `1..=MAX_BLOCK_SIZE`.
pub fn request_keys(block_size: usize, space: KeySpace<'_>, tokens: &[u32], out: &mut Vec<u64>) {
    out.clear();
    let block_size = block_size.clamp(1, MAX_BLOCK_SIZE);
    out.reserve(tokens.len() / block_size);
    let mut buf = [0u8; BUF];
    let mut parent = seed(space.lora_name, None, space.cache_salt);
    for chunk in tokens.chunks_exact(block_size) {
        parent = chain(&mut buf, parent, chunk, 0);
        out.push(parent);
    }
}
