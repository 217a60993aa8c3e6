//! Counting the content deltas of a streamed answer: each non-empty `"content": "…"`
//! (chat) or `"text": "…"` (completions) string in the SSE events, an estimate of the
//! completion tokens for streams whose engine reports no usage (most engines send about one
//! token per delta).
//!
//! A byte-level state machine fed each upstream read in turn, so a key split across two
//! reads still counts. Between keys it does not walk the bytes: a SIMD substring search
//! (`memchr::memmem`) jumps to the next `"content"` or `"text"`, and the machine runs only
//! from there, over a key carried from the previous read, and over the last bytes of a read
//! (where a key the next read completes may begin). It never allocates and must not parse
//! JSON.

use std::sync::LazyLock;

use memchr::memmem::Finder;

static CONTENT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"content\""));
static TEXT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"text\""));
/// The longest start of a key that a read can end in: `"conten` plus its last letter.
const LONGEST_PARTIAL: usize = b"\"content".len();

/// Counts non-empty `"content"` and `"text"` string values across the reads of one body.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeltaCounter {
    state: State,
    /// Bytes of the key matched so far (after the opening quote).
    matched: u8,
    /// Which key is being matched.
    key: Key,
    count: u32,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Looking for a quote that could open a key.
    #[default]
    Scan,
    /// Inside a candidate key.
    Key,
    /// The key's closing quote was seen: whitespace, then a colon.
    Colon,
    /// After the colon: whitespace, then the value's opening quote.
    Value,
    /// After the value's opening quote: its first byte says whether it is empty.
    First,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Key {
    #[default]
    Content,
    Text,
}

impl Key {
    fn name(self) -> &'static [u8] {
        match self {
            Key::Content => b"content",
            Key::Text => b"text",
        }
    }
}

fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl DeltaCounter {
    /// Non-empty deltas seen so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Feeds the next bytes of the body.
    pub fn feed(&mut self, data: &[u8]) {
        let mut i = self.run(data, 0);
        if i == data.len() {
            return;
        }
        // The next occurrence of each key at or after `i` (searched again only once passed).
        let find = |f: &Finder<'_>, from: usize| f.find(&data[from..]).map(|o| from + o);
        let mut content = find(&CONTENT, i);
        let mut text = find(&TEXT, i);
        loop {
            if content.is_some_and(|p| p < i) {
                content = find(&CONTENT, i);
            }
            if text.is_some_and(|p| p < i) {
                text = find(&TEXT, i);
            }
            let Some(p) = content.into_iter().chain(text).min() else {
                break;
            };
            i = self.run(data, p);
            if i == data.len() {
                return;
            }
        }
        // No whole key is left; one the next read completes may begin in the last bytes.
        let tail = data.len().saturating_sub(LONGEST_PARTIAL).max(i);
        for &b in &data[tail..] {
            self.step(b);
        }
    }

    /// Steps from `from` while a key is being matched (the first byte always); where it
    /// stopped: back to scanning (then `State::Scan`), or the end of `data`.
    fn run(&mut self, data: &[u8], from: usize) -> usize {
        let mut i = from;
        if self.state == State::Scan {
            if i >= data.len() {
                return i;
            }
            self.step(data[i]);
            i += 1;
        }
        while i < data.len() && self.state != State::Scan {
            self.step(data[i]);
            i += 1;
        }
        i
    }

    fn step(&mut self, b: u8) {
        match self.state {
            State::Scan => {
                if b == b'"' {
                    self.state = State::Key;
                    self.matched = 0;
                }
            }
            State::Key => {
                let m = self.matched as usize;
                if m == 0 {
                    self.key = match b {
                        b'c' => Key::Content,
                        b't' => Key::Text,
                        b'"' => return, // `""`: the second quote may open a key
                        _ => {
                            self.state = State::Scan;
                            return;
                        }
                    };
                    self.matched = 1;
                    return;
                }
                let name = self.key.name();
                if m == name.len() {
                    self.state = if b == b'"' { State::Colon } else { State::Scan };
                } else if name[m] == b {
                    self.matched += 1;
                } else {
                    // A quote here may open the next key.
                    self.state = if b == b'"' { State::Key } else { State::Scan };
                    self.matched = 0;
                }
            }
            State::Colon => {
                if b == b':' {
                    self.state = State::Value;
                } else if !ws(b) {
                    self.state = State::Scan;
                    self.step(b);
                }
            }
            State::Value => {
                if b == b'"' {
                    self.state = State::First;
                } else if !ws(b) {
                    self.state = State::Scan;
                }
            }
            State::First => {
                if b != b'"' {
                    self.count = self.count.saturating_add(1);
                }
                // The value's other bytes never open a key: a quote inside it is escaped,
                // and its closing quote is followed by `,` or `}`.
                self.state = State::Scan;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeltaCounter;

    fn count(parts: &[&[u8]]) -> u32 {
        let mut c = DeltaCounter::default();
        for p in parts {
            c.feed(p);
        }
        c.count()
    }

    #[test]
    fn counts_chat_and_completion_deltas() {
        let chat =
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\": \"lo\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        assert_eq!(count(&[chat]), 2);
        let completions =
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n";
        assert_eq!(count(&[completions]), 2);
    }

    #[test]
    fn a_key_split_across_reads_counts_once() {
        let event = b"data: {\"choices\":[{\"delta\":{\"content\":\"word\"}}]}\n\n";
        for cut in 0..event.len() {
            assert_eq!(count(&[&event[..cut], &event[cut..]]), 1, "cut at {cut}");
        }
    }

    #[test]
    fn a_stream_split_anywhere_counts_what_the_byte_machine_counts() {
        let stream: Vec<u8> = (0..40)
            .flat_map(|i| {
                let v = if i % 7 == 0 { String::new() } else { format!("w{i}") };
                format!(
                    "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\": \"{v}\"}},\"text\":\"t\"}}]}}\n\n"
                )
                .into_bytes()
            })
            .collect();
        // Byte by byte is the reference: every read one byte long.
        let mut one = DeltaCounter::default();
        for b in &stream {
            one.feed(std::slice::from_ref(b));
        }
        assert_eq!(
            one.count(),
            40 - 6 + 40,
            "non-empty contents and every text"
        );
        for size in [2, 3, 7, 9, 10, 64, 100, 4096] {
            let mut c = DeltaCounter::default();
            for part in stream.chunks(size) {
                c.feed(part);
            }
            assert_eq!(c.count(), one.count(), "reads of {size} bytes");
        }
    }

    #[test]
    fn other_keys_and_values_do_not_count() {
        assert_eq!(
            count(&[b"{\"reasoning_content\":\"x\",\"contents\":\"y\",\"context\":\"z\",\"x\":\"content\"}"]),
            0
        );
        assert_eq!(count(&[b"{\"content\":null,\"text\":\"\"}"]), 0);
    }
}
