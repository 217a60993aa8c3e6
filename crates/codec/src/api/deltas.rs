//! Counting the content deltas of a streamed answer: each non-empty `"content": "…"`
//! (chat) or `"text": "…"` (completions) string in the SSE events, an estimate of the
//! completion tokens for streams whose engine reports no usage (most engines send about one
//! token per delta).
//!
//! A byte-level state machine fed each upstream read in turn, so a key split across two
//! reads still counts. Between keys it does not walk the bytes: one SIMD search for both
//! keys ([`KeySearch`]) jumps to the next `"content"` or `"text"`, and the machine runs
//! only from the key's end to its value's first byte, over what the previous read left
//! unfinished, and from the last quote in a read's last bytes (where a key the next read
//! completes may begin). It never allocates and must not parse JSON.

use std::sync::LazyLock;

use super::key_search::KeySearch;

/// The two keys, in the order of [`Key`]'s variants.
static KEYS: LazyLock<KeySearch> = LazyLock::new(|| KeySearch::new(&[b"\"content\"", b"\"text\""]));
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
        // What the previous read left unfinished: a key, its colon, or its value's start.
        let mut i = self.resume(data, 0);
        while self.state == State::Scan {
            let Some((key, end)) = KEYS.find(data, i) else {
                break;
            };
            self.key = if key == 0 { Key::Content } else { Key::Text };
            self.state = State::Colon;
            i = self.resume(data, end);
        }
        if self.state != State::Scan {
            return; // the read ended inside a key or before its value's first byte
        }
        // No whole key is left; one the next read completes may begin at the last quote of
        // the last bytes (a key has no quote inside it).
        let tail = data.len().saturating_sub(LONGEST_PARTIAL).max(i);
        if let Some(q) = memchr::memrchr(b'"', &data[tail..]) {
            for &b in &data[tail + q..] {
                self.step(b);
            }
        }
    }

    /// Steps from `from` until the machine is back to scanning (where it is then) or the
    /// end of `data`.
    fn resume(&mut self, data: &[u8], from: usize) -> usize {
        let mut i = from;
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

    /// The machine stepped over every byte, with no search: what `feed` must count.
    fn stepped(data: &[u8]) -> u32 {
        let mut c = DeltaCounter::default();
        for &b in data {
            c.step(b);
        }
        c.count()
    }

    #[test]
    fn the_search_counts_what_stepping_every_byte_counts() {
        // Random runs of key-like pieces, cut into random reads.
        const PIECES: [&str; 14] = [
            "\"",
            "content",
            "text",
            "conten",
            "tex",
            ":",
            " ",
            "\n",
            "x",
            "\\",
            "\"\"",
            "\"content\"",
            "\"text\": \"",
            "{\"delta\":{",
        ];
        let mut rng = fastrand::Rng::with_seed(17);
        for _ in 0..3000 {
            let data: Vec<u8> = (0..rng.usize(1..40))
                .flat_map(|_| PIECES[rng.usize(..PIECES.len())].bytes())
                .collect();
            let mut c = DeltaCounter::default();
            let mut rest = &data[..];
            while !rest.is_empty() {
                let (read, next) = rest.split_at(rng.usize(1..=rest.len()));
                c.feed(read);
                rest = next;
            }
            assert_eq!(
                c.count(),
                stepped(&data),
                "{:?}",
                String::from_utf8_lossy(&data)
            );
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
