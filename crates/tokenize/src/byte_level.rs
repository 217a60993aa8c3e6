//! A direct encoder for byte-level BPE pipelines (GPT-2, Llama 3, Qwen2 and their kin).
//!
//! Owns encoding one piece of text that holds no added token, for the pipelines it
//! recognises at load: an NFC-family normaliser (or none), then either
//! `Sequence[Split(regex, Isolated), ByteLevel(use_regex: false)]` or
//! `ByteLevel(use_regex: true)`, both without `add_prefix_space`, then any model. It does
//! what the library does for such a piece, without the library's per-byte alignment
//! bookkeeping and per-token strings (which were most of the library's cost): the same
//! regex (Oniguruma, the same pattern), the same byte-to-character table, and the library's
//! own model for each word, so the ids are the library's.
//!
//! Must not: handle added tokens (callers split them out first, see [`super::segments`]),
//! pipelines it does not recognise ([`ByteLevelEncoder::new`] returns `None` for those), or
//! keep state between calls.

use std::borrow::Cow;

use serde_json::Value as Json;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::{Model, NormalizedString, Normalizer, Tokenizer};

use super::scanner::Scanner;

/// The GPT-2 pre-tokenizer regex that `ByteLevel` uses when `use_regex` is true.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The encoder of a recognised pipeline.
pub(crate) struct ByteLevelEncoder {
    split: onig::Regex,
    /// The same split without the regex engine, for ASCII text, when the pattern is Qwen2's
    /// or Llama 3's.
    scanner: Option<Scanner>,
    /// The normaliser leaves ASCII text as it is (NFC, NFD, NFKC, NFKD, or none).
    ascii_identity: bool,
    /// GPT-2's byte-to-character table.
    chars: [char; 256],
}

impl ByteLevelEncoder {
    /// The encoder for `tokenizer`, or `None` when its pipeline is not one this module
    /// reproduces exactly.
    pub(crate) fn new(tokenizer: &Tokenizer) -> Option<Self> {
        let ascii_identity = match tokenizer.get_normalizer() {
            None => true,
            Some(n) => nfc_family(n),
        };
        // Anything outside the NFC family must still be applied; do it with the library's
        // own normaliser, which is exact, and only shortcut ASCII for the NFC family.
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let pattern = split_pattern(&pre)?;
        let split = onig::Regex::new(&pattern).ok()?;
        Some(ByteLevelEncoder {
            split,
            scanner: Scanner::for_pattern(&pattern),
            ascii_identity,
            chars: bytes_to_chars(),
        })
    }

    /// Appends the ids of `text` (which holds no added token) to `out`, as the library's
    /// pipeline encodes it.
    pub(crate) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        out: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let normalized: Cow<'_, str> = match tokenizer.get_normalizer() {
            Some(n) if !(self.ascii_identity && text.is_ascii()) => {
                let mut s = NormalizedString::from(text);
                n.normalize(&mut s)?;
                Cow::Owned(s.get().to_owned())
            }
            _ => Cow::Borrowed(text),
        };
        let model = tokenizer.get_model();
        let mut word = String::with_capacity(64);
        let mut piece = |p: &str| -> tokenizers::Result<()> {
            if p.is_empty() {
                return Ok(());
            }
            word.clear();
            word.extend(p.bytes().map(|b| self.chars[b as usize]));
            out.extend(model.tokenize(&word)?.into_iter().map(|t| t.id));
            Ok(())
        };
        if let Some(scanner) = self.scanner.filter(|_| normalized.is_ascii()) {
            return scanner.split(&normalized, piece);
        }
        // `Isolated`: every match is a piece, and so is every gap between matches.
        let mut last = 0;
        for (start, end) in self.split.find_iter(&normalized) {
            piece(&normalized[last..start])?;
            piece(&normalized[start..end])?;
            last = end;
        }
        piece(&normalized[last..])
    }
}

fn nfc_family(n: &NormalizerWrapper) -> bool {
    match n {
        NormalizerWrapper::NFC(_)
        | NormalizerWrapper::NFD(_)
        | NormalizerWrapper::NFKC(_)
        | NormalizerWrapper::NFKD(_) => true,
        NormalizerWrapper::Sequence(_) => serde_json::to_value(n)
            .ok()
            .and_then(|v| {
                v.get("normalizers")?.as_array().map(|list| {
                    list.iter().all(|n| {
                        matches!(
                            n.get("type").and_then(Json::as_str),
                            Some("NFC" | "NFD" | "NFKC" | "NFKD")
                        )
                    })
                })
            })
            .unwrap_or(false),
        _ => false,
    }
}

/// The regex whose `Isolated` split, followed by the byte-level mapping, is the whole
/// pre-tokenization; `None` for any other shape.
fn split_pattern(pre: &Json) -> Option<String> {
    let byte_level = |v: &Json, use_regex: bool| -> Option<bool> {
        Some(
            v.get("type")?.as_str()? == "ByteLevel"
                && !v.get("add_prefix_space")?.as_bool()?
                && v.get("use_regex")?.as_bool()? == use_regex,
        )
    };
    match pre.get("type")?.as_str()? {
        "ByteLevel" if byte_level(pre, true)? => Some(GPT2_PATTERN.to_string()),
        "Sequence" => {
            let [split, last] = pre.get("pretokenizers")?.as_array()?.as_slice() else {
                return None;
            };
            let ok = split.get("type")?.as_str()? == "Split"
                && split.get("behavior")?.as_str()? == "Isolated"
                && !split.get("invert")?.as_bool()?
                && byte_level(last, false)?;
            ok.then(|| {
                split
                    .get("pattern")?
                    .get("Regex")?
                    .as_str()
                    .map(String::from)
            })?
        }
        _ => None,
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others for
/// U+0100 onwards, in byte order.
fn bytes_to_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        chars[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("U+0100..U+0143 are characters")
        };
    }
    chars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_table_is_the_library_alphabet() {
        let ours: std::collections::HashSet<char> = bytes_to_chars().into_iter().collect();
        let theirs: std::collections::HashSet<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .collect();
        assert_eq!(ours, theirs);
        assert_eq!(bytes_to_chars()[b' ' as usize], 'Ġ');
        assert_eq!(bytes_to_chars()[b'\n' as usize], 'Ċ');
    }
}
