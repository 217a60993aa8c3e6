//! A whole-input reference for the chunked grammar the gateway's decoder documents
//! (RFC 9112 §7.1 read strictly): 1 to 16 hex digits of size, an optional `;` extension of
//! at most 1024 bytes without control characters (HTAB allowed), CRLF after the size line
//! and after each chunk's data, trailer lines (no bare CR or LF, 8 KiB in all) dropped, and
//! the blank line that ends the body. Written as plain recursive descent over the whole
//! input, sharing nothing with the incremental decoder, so the `chunked` target can compare
//! the two.

/// What the whole input is, read as a chunked body from its first byte.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A complete body, `consumed` bytes long, carrying `data`.
    Done { data: Vec<u8>, consumed: usize },
    /// A valid start of a body; `data` is what its chunks carried so far.
    Incomplete { data: Vec<u8> },
    /// Not a chunked body, whatever follows.
    Invalid,
}

/// Reads `input` as a chunked body.
pub fn decode(input: &[u8]) -> Outcome {
    let mut r = Reader {
        input,
        at: 0,
        data: Vec::new(),
    };
    match r.body() {
        Ok(()) => Outcome::Done {
            data: r.data,
            consumed: r.at,
        },
        Err(Stop::Short) => Outcome::Incomplete { data: r.data },
        Err(Stop::Bad) => Outcome::Invalid,
    }
}

/// Why reading stopped before the end of the body.
enum Stop {
    /// The input ended.
    Short,
    /// A byte broke the grammar.
    Bad,
}

struct Reader<'a> {
    input: &'a [u8],
    at: usize,
    data: Vec<u8>,
}

impl Reader<'_> {
    fn next(&mut self) -> Result<u8, Stop> {
        let b = *self.input.get(self.at).ok_or(Stop::Short)?;
        self.at += 1;
        Ok(b)
    }

    fn expect(&mut self, want: u8) -> Result<(), Stop> {
        if self.next()? == want {
            Ok(())
        } else {
            Err(Stop::Bad)
        }
    }

    /// `*chunk last-chunk trailer-section CRLF`.
    fn body(&mut self) -> Result<(), Stop> {
        loop {
            let size = self.size_line()?;
            if size == 0 {
                return self.trailers();
            }
            let avail = (self.input.len() - self.at) as u64;
            let take = avail.min(size) as usize;
            self.data
                .extend_from_slice(&self.input[self.at..self.at + take]);
            self.at += take;
            if (take as u64) < size {
                return Err(Stop::Short);
            }
            self.expect(b'\r')?;
            self.expect(b'\n')?;
        }
    }

    /// `chunk-size [ ";" extension ] CRLF`; the size.
    fn size_line(&mut self) -> Result<u64, Stop> {
        let mut size = 0u64;
        let mut digits = 0;
        loop {
            let b = self.next()?;
            match char::from(b).to_digit(16) {
                Some(v) if digits < 16 => {
                    size = (size << 4) | u64::from(v);
                    digits += 1;
                }
                Some(_) => return Err(Stop::Bad),
                None if digits == 0 => return Err(Stop::Bad),
                None if b == b';' => {
                    self.extension()?;
                    break;
                }
                None if b == b'\r' => break,
                None => return Err(Stop::Bad),
            }
        }
        self.expect(b'\n')?;
        Ok(size)
    }

    /// The extension's bytes, through the CR that ends them.
    fn extension(&mut self) -> Result<(), Stop> {
        let mut len = 0;
        loop {
            let b = self.next()?;
            if b == b'\r' {
                return Ok(());
            }
            if (b < 0x20 && b != b'\t') || b == 0x7f {
                return Err(Stop::Bad);
            }
            len += 1;
            if len > 1024 {
                return Err(Stop::Bad);
            }
        }
    }

    /// Trailer lines, then the blank line.
    fn trailers(&mut self) -> Result<(), Stop> {
        let mut total = 0;
        loop {
            let mut b = self.next()?;
            if b == b'\r' {
                return self.expect(b'\n');
            }
            loop {
                match b {
                    b'\n' => return Err(Stop::Bad),
                    b'\r' => {
                        self.expect(b'\n')?;
                        break;
                    }
                    _ => {
                        total += 1;
                        if total > 8 * 1024 {
                            return Err(Stop::Bad);
                        }
                    }
                }
                b = self.next()?;
            }
        }
    }
}
