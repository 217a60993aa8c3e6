//! Strict, incremental decoder for `Transfer-Encoding: chunked` bodies (RFC 9112 §7.1).
//!
//! Used for request bodies (which the gateway re-frames with a fresh Content-Length) and
//! for upstream responses (which it re-frames towards the client). It accepts exactly the
//! grammar: hex sizes of at most 16 digits, bounded extensions, CRLF everywhere, and drops
//! trailers. It must not allocate: data is handed to a callback as borrowed slices.

/// Longest chunk extension accepted, bytes.
pub const MAX_EXTENSION_BYTES: usize = 1024;
/// Largest trailer section accepted, bytes.
pub const MAX_TRAILER_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// The bytes do not follow the chunked grammar.
    Malformed(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    FinalLf,
    Done,
}

/// Incremental chunked decoder. Feed it bytes as they arrive.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    digits: u8,
    ext_len: usize,
    trailer_len: usize,
    /// Data bytes decoded so far.
    pub decoded: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size,
            size: 0,
            digits: 0,
            ext_len: 0,
            trailer_len: 0,
            decoded: 0,
        }
    }

    /// True once the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes of the current chunk still to come (its declared size minus what was
    /// decoded), so a caller can refuse an oversized chunk before its data arrives.
    pub fn pending_chunk_bytes(&self) -> u64 {
        match self.state {
            State::Data => self.size,
            _ => 0,
        }
    }

    /// Consumes bytes from `input`, handing chunk data to `on_data`. Returns how many bytes
    /// were consumed; it stops right after the end of the body and leaves what follows.
    pub fn feed(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => {
                    self.size_byte(b)?;
                    i += 1;
                }
                State::Ext => {
                    self.extension_byte(b)?;
                    i += 1;
                }
                State::SizeLf => {
                    self.size_line_end(b)?;
                    i += 1;
                }
                State::Data => i += self.data(&input[i..], &mut on_data),
                State::DataCr | State::DataLf => {
                    self.data_end(b)?;
                    i += 1;
                }
                State::TrailerStart | State::TrailerLine | State::TrailerLf => {
                    self.trailer_byte(b)?;
                    i += 1;
                }
                State::FinalLf => {
                    self.final_lf(b)?;
                    return Ok(i + 1);
                }
                State::Done => return Ok(i),
            }
        }
        Ok(i)
    }

    /// One byte of the size: a hex digit, or the `;` or CR that ends it.
    #[inline(always)]
    fn size_byte(&mut self, b: u8) -> Result<(), ChunkError> {
        if let Some(v) = hex_val(b) {
            if self.digits == 16 {
                return Err(ChunkError::Malformed("chunk size too large"));
            }
            self.size = (self.size << 4) | u64::from(v);
            self.digits += 1;
        } else if self.digits == 0 {
            return Err(ChunkError::Malformed("invalid chunk size"));
        } else if b == b';' {
            self.state = State::Ext;
            self.ext_len = 0;
        } else if b == b'\r' {
            self.state = State::SizeLf;
        } else {
            return Err(ChunkError::Malformed("invalid chunk size"));
        }
        Ok(())
    }

    /// One byte of a chunk extension (skipped, bounded), or the CR that ends the line.
    #[inline(always)]
    fn extension_byte(&mut self, b: u8) -> Result<(), ChunkError> {
        if b == b'\r' {
            self.state = State::SizeLf;
        } else if b == b'\n' || (b < 0x20 && b != b'\t') || b == 0x7f {
            return Err(ChunkError::Malformed("invalid chunk extension"));
        } else {
            self.ext_len += 1;
            if self.ext_len > MAX_EXTENSION_BYTES {
                return Err(ChunkError::Malformed("chunk extension too long"));
            }
        }
        Ok(())
    }

    /// The LF of the size line: data follows, or the trailer after the last chunk.
    #[inline(always)]
    fn size_line_end(&mut self, b: u8) -> Result<(), ChunkError> {
        if b != b'\n' {
            return Err(ChunkError::Malformed("chunk size line not ended by CRLF"));
        }
        self.state = if self.size == 0 {
            State::TrailerStart
        } else {
            State::Data
        };
        Ok(())
    }

    /// Hands as much of the current chunk's data as `avail` holds to `on_data`; returns
    /// the bytes taken.
    #[inline(always)]
    fn data(&mut self, avail: &[u8], on_data: &mut impl FnMut(&[u8])) -> usize {
        let take = (avail.len() as u64).min(self.size) as usize;
        on_data(&avail[..take]);
        self.size -= take as u64;
        self.decoded += take as u64;
        if self.size == 0 {
            self.state = State::DataCr;
        }
        take
    }

    /// The CRLF after a chunk's data; then the next size line.
    #[inline(always)]
    fn data_end(&mut self, b: u8) -> Result<(), ChunkError> {
        if self.state == State::DataCr {
            if b != b'\r' {
                return Err(ChunkError::Malformed("chunk data longer than its size"));
            }
            self.state = State::DataLf;
        } else {
            if b != b'\n' {
                return Err(ChunkError::Malformed("chunk data not ended by CRLF"));
            }
            self.state = State::Size;
            self.size = 0;
            self.digits = 0;
        }
        Ok(())
    }

    /// One byte of the trailer section (counted and dropped), up to the CR of its blank
    /// line.
    #[inline(always)]
    fn trailer_byte(&mut self, b: u8) -> Result<(), ChunkError> {
        match (self.state, b) {
            (State::TrailerLf, b'\n') => self.state = State::TrailerStart,
            (State::TrailerLf, _) => {
                return Err(ChunkError::Malformed("bare CR in trailer section"))
            }
            (_, b'\n') => return Err(ChunkError::Malformed("bare LF in trailer section")),
            (State::TrailerStart, b'\r') => self.state = State::FinalLf,
            (_, b'\r') => self.state = State::TrailerLf,
            _ => {
                self.state = State::TrailerLine;
                self.count_trailer()?;
            }
        }
        Ok(())
    }

    /// The LF that ends the body.
    #[inline(always)]
    fn final_lf(&mut self, b: u8) -> Result<(), ChunkError> {
        if b != b'\n' {
            return Err(ChunkError::Malformed("chunked body not ended by CRLF"));
        }
        self.state = State::Done;
        Ok(())
    }

    fn count_trailer(&mut self) -> Result<(), ChunkError> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILER_BYTES {
            return Err(ChunkError::Malformed("trailer section too large"));
        }
        Ok(())
    }
}

#[inline]
fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends one chunk (`size CRLF data CRLF`) to `out`. Empty data writes nothing.
pub fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    encode_chunk_parts(out, &[data]);
}

/// Appends `parts`, one after the other, as one chunk (nothing when they are all empty).
pub fn encode_chunk_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len == 0 {
        return;
    }
    let mut tmp = [0u8; 16];
    let mut n = len;
    let mut i = tmp.len();
    while n > 0 {
        i -= 1;
        tmp[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
    }
    out.extend_from_slice(&tmp[i..]);
    out.extend_from_slice(b"\r\n");
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// The last chunk with an empty trailer section.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let n = d.feed(input, |s| out.extend_from_slice(s))?;
        Ok((out, n, d.is_done()))
    }

    #[test]
    fn decodes_and_stops_at_end() {
        let (out, n, done) =
            decode_all(b"5\r\nhello\r\n6;a=b\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET").unwrap();
        assert_eq!(out, b"hello world");
        assert!(done);
        assert_eq!(
            n,
            b"5\r\nhello\r\n6;a=b\r\n world\r\n0\r\nX-T: 1\r\n\r\n".len()
        );
    }

    #[test]
    fn decodes_byte_by_byte() {
        let input = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        for b in input.iter() {
            let n = d
                .feed(std::slice::from_ref(b), |s| out.extend_from_slice(s))
                .unwrap();
            assert_eq!(n, 1);
        }
        assert!(d.is_done());
        assert_eq!(out, b"abc0123456789abcdef");
    }

    #[test]
    fn rejects_malformed_sizes_and_framing() {
        for bad in [
            &b"0x5\r\nhello\r\n0\r\n\r\n"[..],
            b"0_2e\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"-1\r\n",
            b" 5\r\nhello\r\n",
            b"1FFFFFFFFFFFFFFFF\r\n",
            b"5\r\nhello!!\r\n0\r\n\r\n",
            b"5\nhello\n0\n\n",
            b"2\r\r;a\r\n",
            b"5\r\nhello\r\n0\r\nX: a\n\r\n",
        ] {
            assert!(decode_all(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let mut long_ext = b"1;".to_vec();
        long_ext.extend(std::iter::repeat_n(b'a', 2000));
        assert!(decode_all(&long_ext).is_err());
    }

    #[test]
    fn reports_the_pending_chunk_size() {
        let mut d = ChunkedDecoder::new();
        d.feed(b"40000000\r\nhel", |_| {}).unwrap();
        assert_eq!(d.pending_chunk_bytes(), 0x4000_0000 - 3);
        let mut d = ChunkedDecoder::new();
        d.feed(b"3\r\nabc", |_| {}).unwrap();
        assert_eq!(d.pending_chunk_bytes(), 0);
    }

    #[test]
    fn encodes_chunks() {
        let mut out = Vec::new();
        encode_chunk(&mut out, b"hello world, this is 26 b!");
        assert_eq!(out, b"1a\r\nhello world, this is 26 b!\r\n");
        let (dec, _, _) = decode_all(&[&out[..], LAST_CHUNK].concat()).unwrap();
        assert_eq!(dec, b"hello world, this is 26 b!");
    }
}
