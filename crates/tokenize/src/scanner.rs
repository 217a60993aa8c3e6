//! A hand-written scanner for the pre-tokenizer regex of Qwen2 and Llama 3, on ASCII text.
//!
//! Owns finding, in ASCII text, the same matches as Oniguruma finds for
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! (Qwen2; Llama 3's has `\p{N}{1,3}`): the alternatives tried in order at each position,
//! with the regex engine's backtracking worked out by hand. On ASCII, every position starts
//! a match, so the matches cover the text. The regex engine was about a third of a cold
//! encode.
//!
//! Must not: see non-ASCII text (callers use the regex for it: Unicode letters, numbers,
//! spaces and case folding are the regex engine's tables), or patterns other than the two.

/// The Qwen2 pattern (numbers one digit at a time).
pub(crate) const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Llama 3 pattern (numbers up to three digits at a time).
pub(crate) const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The scanner of one of the two patterns.
#[derive(Clone, Copy)]
pub(crate) struct Scanner {
    max_digits: usize,
}

fn letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// `\s` on ASCII: tab, line feed, vertical tab, form feed, carriage return, space.
fn space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

fn newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// `[^\s\p{L}\p{N}]`.
fn other(b: u8) -> bool {
    !space(b) && !letter(b) && !digit(b)
}

impl Scanner {
    /// The scanner for `pattern`, when it is one of the two.
    pub(crate) fn for_pattern(pattern: &str) -> Option<Scanner> {
        match pattern {
            QWEN2 => Some(Scanner { max_digits: 1 }),
            LLAMA3 => Some(Scanner { max_digits: 3 }),
            _ => None,
        }
    }

    /// Calls `piece` with each match of the pattern in `text` (ASCII), in order.
    pub(crate) fn split<E>(
        &self,
        text: &str,
        mut piece: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<(), E> {
        debug_assert!(text.is_ascii());
        let t = text.as_bytes();
        let mut i = 0;
        while i < t.len() {
            let end = self.match_at(t, i);
            piece(&text[i..end])?;
            i = end;
        }
        Ok(())
    }

    /// The end of the match that starts at `i` (`i < t.len()`).
    fn match_at(&self, t: &[u8], i: usize) -> usize {
        let len = t.len();
        let c = t[i];
        let run = |mut e: usize, class: fn(u8) -> bool| {
            while e < len && class(t[e]) {
                e += 1;
            }
            e
        };
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == b'\'' && i + 1 < len {
            let a = t[i + 1].to_ascii_lowercase();
            if matches!(a, b's' | b't' | b'm' | b'd') {
                return i + 2;
            }
            if i + 2 < len {
                let b = t[i + 2].to_ascii_lowercase();
                if matches!((a, b), (b'r', b'e') | (b'v', b'e') | (b'l', b'l')) {
                    return i + 3;
                }
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if letter(c) {
            return run(i, letter);
        }
        if !digit(c) && !newline(c) && i + 1 < len && letter(t[i + 1]) {
            return run(i + 1, letter);
        }
        // \p{N} or \p{N}{1,3}
        if digit(c) {
            let mut e = i;
            while e < len && e - i < self.max_digits && digit(t[e]) {
                e += 1;
            }
            return e;
        }
        // " ?[^\s\p{L}\p{N}]+[\r\n]*"
        let k = if c == b' ' { i + 1 } else { i };
        if k < len && other(t[k]) {
            return run(run(k, other), newline);
        }
        // Here `c` is whitespace. \s*[\r\n]+: the spaces up to the run's last line break.
        let j = run(i, space);
        if let Some(last) = (i..j).rev().find(|&k| newline(t[k])) {
            return last + 1;
        }
        // \s+(?!\S): the run, less its last space when a non-space follows; else \s+.
        if j < len && j - 1 > i {
            return j - 1;
        }
        j
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex_pieces(re: &onig::Regex, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut last = 0;
        for (s, e) in re.find_iter(text) {
            if s > last {
                out.push(text[last..s].to_string());
            }
            out.push(text[s..e].to_string());
            last = e;
        }
        if last < text.len() {
            out.push(text[last..].to_string());
        }
        out
    }

    fn scanner_pieces(s: Scanner, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        s.split(text, |p| {
            out.push(p.to_string());
            Ok::<(), ()>(())
        })
        .unwrap();
        out
    }

    /// Random ASCII strings, weighted towards the characters the alternatives turn on,
    /// split by the scanner and by Oniguruma: the same pieces.
    #[test]
    fn the_scanner_finds_what_the_regex_finds() {
        const TRICKY: &[u8] = b"  \n\n\r\t\x0b\x0c''sStTrReEvVlLmMdD09aZ!?.,-_()\x00\x1f\x7f";
        for pattern in [QWEN2, LLAMA3] {
            let re = onig::Regex::new(pattern).unwrap();
            let scanner = Scanner::for_pattern(pattern).unwrap();
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            for _ in 0..40_000 {
                let n = (next() % 24) as usize;
                let text: String = (0..n)
                    .map(|_| {
                        let r = next();
                        if r % 3 == 0 {
                            char::from((r >> 8) as u8 & 0x7f)
                        } else {
                            char::from(TRICKY[((r >> 8) % TRICKY.len() as u64) as usize])
                        }
                    })
                    .collect();
                assert_eq!(
                    scanner_pieces(scanner, &text),
                    regex_pieces(&re, &text),
                    "{pattern}: {text:?}"
                );
            }
            let prose = "It's a test: they'll say \"we've 12345 things\"!\r\n\r\n\tdone.  \n  ok ";
            assert_eq!(scanner_pieces(scanner, prose), regex_pieces(&re, prose));
        }
    }

    #[test]
    fn other_patterns_have_no_scanner() {
        assert!(Scanner::for_pattern(r"\s+|\S+").is_none());
    }
}
