//! Finding the next of a few literal JSON keys (quotes included) in a body's bytes: one
//! SIMD pass for all of them (`aho-corasick`'s packed Teddy searcher) where the CPU has it,
//! one `memchr::memmem` search per key where it does not.
//!
//! Runs on the relay path over each upstream read: it never allocates after it is built,
//! and it knows nothing of what follows a key.

use aho_corasick::packed::Searcher;
use aho_corasick::Span;
use memchr::memmem::Finder;

/// A set of keys to look for, none a prefix of another.
pub struct KeySearch {
    /// `None` where the CPU has no SIMD for Teddy (then `each` searches).
    packed: Option<Searcher>,
    each: Vec<Finder<'static>>,
}

impl KeySearch {
    /// The searcher for `keys`, which are reported by their index in it.
    pub fn new(keys: &[&'static [u8]]) -> KeySearch {
        let mut s = KeySearch::each_alone(keys);
        s.packed = Searcher::new(keys.iter().copied());
        s
    }

    /// Searches with one `memmem` finder per key, as on a CPU without Teddy.
    fn each_alone(keys: &[&'static [u8]]) -> KeySearch {
        KeySearch {
            packed: None,
            each: keys.iter().map(|&k| Finder::new(k)).collect(),
        }
    }

    /// The leftmost key in `data` at or after `from`: its index and where its match ends.
    pub fn find(&self, data: &[u8], from: usize) -> Option<(usize, usize)> {
        if from > data.len() {
            return None;
        }
        if let Some(p) = &self.packed {
            return p
                .find_in(data, Span::from(from..data.len()))
                .map(|m| (m.pattern().as_usize(), m.end()));
        }
        let rest = &data[from..];
        self.each
            .iter()
            .enumerate()
            .filter_map(|(k, f)| f.find(rest).map(|at| (at, k, f.needle().len())))
            .min()
            .map(|(at, k, len)| (k, from + at + len))
    }
}

#[cfg(test)]
mod tests {
    use super::KeySearch;

    const KEYS: [&[u8]; 2] = [b"\"content\"", b"\"text\""];

    #[test]
    fn finds_the_leftmost_key_with_or_without_simd() {
        let data = b"{\"text\":\"a\",\"content\":\"b\",\"contents\":1,\"text\":2}";
        for s in [KeySearch::new(&KEYS), KeySearch::each_alone(&KEYS)] {
            let mut found = Vec::new();
            let mut from = 0;
            while let Some((k, end)) = s.find(data, from) {
                found.push((k, end));
                from = end;
            }
            assert_eq!(found, [(1, 7), (0, 21), (1, 45)]);
            assert_eq!(s.find(data, data.len()), None);
            assert_eq!(s.find(data, data.len() + 1), None);
            assert_eq!(s.find(b"", 0), None);
        }
    }

    #[test]
    fn a_long_haystack_finds_what_memmem_finds() {
        // Long enough for Teddy's own path (short ones take its slower fallback).
        let mut data = b"x".repeat(300);
        data.extend_from_slice(b"\"text\"");
        data.extend(b"y".repeat(300));
        data.extend_from_slice(b"\"content\"");
        let simd = KeySearch::new(&KEYS);
        let each = KeySearch::each_alone(&KEYS);
        for from in [0, 100, 301, 306, 500, 607, 615] {
            assert_eq!(
                simd.find(&data, from),
                each.find(&data, from),
                "from {from}"
            );
        }
        assert_eq!(simd.find(&data, 0), Some((1, 306)));
        assert_eq!(simd.find(&data, 301), Some((0, 615)));
    }
}
