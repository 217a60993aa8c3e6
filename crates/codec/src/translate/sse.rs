//! Server-sent events split out of a byte stream that arrives in arbitrary pieces: each
//! complete event's `event:` name and its `data:` lines joined, as the SSE standard
//! defines them (LF, CRLF or CR line ends; comments and other fields ignored). At most one
//! partial event is held between calls, of at most [`MAX_EVENT`] bytes: a stream whose
//! event grows beyond it is not an event stream, and nothing more is taken from it
//! ([`SseSplitter::overflowed`]).
//!
//! Owns the framing only; what an event means is the caller's.

/// The largest event held (an engine's event is a few hundred bytes; a tool call's
/// arguments or a long reasoning delta some kilobytes).
pub const MAX_EVENT: usize = 1 << 20;

/// Splits events out of the bytes fed to it.
#[derive(Debug, Default)]
pub struct SseSplitter {
    /// The bytes of the event not yet ended.
    partial: Vec<u8>,
    /// An event outgrew [`MAX_EVENT`]: nothing more is taken.
    overflowed: bool,
}

/// One complete event.
#[derive(Debug, PartialEq, Eq)]
pub struct Event<'a> {
    /// Its `event:` field (empty when it has none).
    pub name: &'a str,
    /// Its `data:` lines, joined with `\n`.
    pub data: &'a str,
}

impl SseSplitter {
    /// Feeds `data` and calls `each` for every event it completes, in order.
    pub fn feed(&mut self, data: &[u8], mut each: impl FnMut(Event<'_>)) {
        if self.overflowed {
            return;
        }
        self.partial.extend_from_slice(data);
        let mut start = 0;
        while let Some(len) = event_end(&self.partial[start..]) {
            let raw = &self.partial[start..start + len];
            start += len;
            let mut name = String::new();
            let mut joined = String::new();
            let mut any_data = false;
            for line in lines(raw) {
                let line = String::from_utf8_lossy(line);
                let (field, value) = match line.split_once(':') {
                    Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                    None => (line.as_ref(), ""),
                };
                match field {
                    "event" => name = value.to_string(),
                    "data" => {
                        if any_data {
                            joined.push('\n');
                        }
                        joined.push_str(value);
                        any_data = true;
                    }
                    _ => {}
                }
            }
            if any_data || !name.is_empty() {
                each(Event {
                    name: &name,
                    data: &joined,
                });
            }
        }
        self.partial.drain(..start);
        if self.partial.len() > MAX_EVENT {
            self.overflowed = true;
            self.partial = Vec::new();
        }
    }

    /// An event outgrew [`MAX_EVENT`]: the stream is not one the caller can translate.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Whether bytes of an unfinished event are held.
    pub fn holds_partial(&self) -> bool {
        self.partial.iter().any(|b| !b.is_ascii_whitespace())
    }
}

/// The length of the first complete event in `buf` (through its blank line), if one is.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    let mut line_start = 0;
    while i < buf.len() {
        let b = buf[i];
        if b == b'\n' || b == b'\r' {
            // A CR at the end of what arrived may be the first half of a CRLF.
            if b == b'\r' && i + 1 == buf.len() {
                return None;
            }
            let next = if b == b'\r' && buf[i + 1] == b'\n' {
                i + 2
            } else {
                i + 1
            };
            if i == line_start {
                return Some(next);
            }
            i = next;
            line_start = next;
        } else {
            i += 1;
        }
    }
    None
}

/// The lines of one event (its blank line excluded).
fn lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    raw.split(|&b| b == b'\n' || b == b'\r')
        .filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(parts: &[&[u8]]) -> Vec<(String, String)> {
        let mut s = SseSplitter::default();
        let mut got = Vec::new();
        for p in parts {
            s.feed(p, |e| got.push((e.name.to_string(), e.data.to_string())));
        }
        got
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b"event: a\ndata: {\"x\":1}\n\ndata: [DONE]\n\n";
        let whole = split(&[stream]);
        assert_eq!(
            whole,
            [
                ("a".to_string(), "{\"x\":1}".to_string()),
                (String::new(), "[DONE]".to_string())
            ]
        );
        for cut in 0..stream.len() {
            assert_eq!(
                split(&[&stream[..cut], &stream[cut..]]),
                whole,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn crlf_and_multi_line_data_and_comments() {
        let got = split(&[b": ping\r\n\r\ndata: a\r\ndata: b\r", b"\n\r\n"]);
        assert_eq!(got, [(String::new(), "a\nb".to_string())]);
    }

    #[test]
    fn an_event_without_end_stops_the_splitter_at_its_bound() {
        let mut s = SseSplitter::default();
        s.feed(&vec![b'x'; MAX_EVENT], |_| panic!("not complete"));
        assert!(!s.overflowed(), "exactly at the bound is still held");
        s.feed(b"x", |_| panic!("not complete"));
        assert!(s.overflowed());
        s.feed(b"\n\ndata: x\n\n", |_| panic!("nothing after the overflow"));
        assert!(!s.holds_partial());
    }

    #[test]
    fn a_partial_event_is_held() {
        let mut s = SseSplitter::default();
        s.feed(b"data: {\"x\"", |_| panic!("not complete"));
        assert!(s.holds_partial());
        let mut n = 0;
        s.feed(b":1}\n\n", |e| {
            assert_eq!(e.data, "{\"x\":1}");
            n += 1
        });
        assert_eq!(n, 1);
        assert!(!s.holds_partial());
    }
}
