//! Counting the content deltas of a streamed answer: each non-empty `"content": "…"`
//! (chat) or `"text": "…"` (completions) string in the SSE events, an estimate of the
//! completion tokens for streams whose engine reports no usage (most engines send about one
//! token per delta).
//!
//! A byte-level state machine fed each upstream read in turn, so a key split across two
//! reads still counts; it never allocates and must not parse JSON.

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
        for &b in data {
            self.step(b);
        }
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
    fn other_keys_and_values_do_not_count() {
        assert_eq!(
            count(&[b"{\"reasoning_content\":\"x\",\"contents\":\"y\",\"context\":\"z\",\"x\":\"content\"}"]),
            0
        );
        assert_eq!(count(&[b"{\"content\":null,\"text\":\"\"}"]), 0);
    }
}
