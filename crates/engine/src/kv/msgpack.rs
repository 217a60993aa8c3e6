//! A bounds-checked msgpack reader over a borrowed buffer, and the error a KV-event
//! message's decoding reports. No input makes it panic, and declared lengths never drive an
//! allocation: strings and byte strings are borrowed from the buffer.

use rmp::Marker;

/// Deepest msgpack nesting accepted (the format needs 5 levels; the rest is headroom for
/// unknown fields).
pub const MAX_DEPTH: usize = 32;

/// Why a message could not be decoded. Offsets are byte positions in the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A message is `[topic, seq, payload]`, or `[seq, payload]` from a replay socket.
    #[error("expected 2 or 3 frames, got {0}")]
    FrameCount(usize),
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame must be 8 bytes, got {0}")]
    SeqLength(usize),
    /// The payload ends inside a value.
    #[error("payload truncated at byte {0}")]
    Truncated(usize),
    /// A value has the wrong msgpack type for its field.
    #[error("unexpected msgpack type 0x{marker:02x} for {field} at byte {at}")]
    Type {
        /// The field being read.
        field: &'static str,
        /// The marker byte found.
        marker: u8,
        /// Where.
        at: usize,
    },
    /// An integer does not fit its field (a negative token id, a block size over `u32`).
    #[error("{field} out of range at byte {at}")]
    Range {
        /// The field being read.
        field: &'static str,
        /// Where.
        at: usize,
    },
    /// A string is not UTF-8.
    #[error("invalid UTF-8 in {field} at byte {at}")]
    Utf8 {
        /// The field being read.
        field: &'static str,
        /// Where.
        at: usize,
    },
    /// A required field is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("msgpack nesting deeper than {MAX_DEPTH} at byte {0}")]
    TooDeep(usize),
    /// Bytes after the batch.
    #[error("{0} bytes after the event batch")]
    Trailing(usize),
}

pub(super) type Result<T> = std::result::Result<T, DecodeError>;

/// A read position in a msgpack buffer. Strings and byte strings are borrowed from it.
pub(super) struct Cursor<'a> {
    buf: &'a [u8],
    /// The next byte to read.
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    pub(super) fn peek(&self) -> Result<u8> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(DecodeError::Truncated(self.pos))
    }

    /// Consumes the next marker byte.
    #[inline]
    pub(super) fn marker(&mut self) -> Result<Marker> {
        let byte = self.peek()?;
        self.pos += 1;
        Ok(Marker::from_u8(byte))
    }

    /// Steps back to the marker at `at` and reports it as the wrong type for `field`.
    pub(super) fn type_error(&mut self, field: &'static str, at: usize) -> DecodeError {
        self.pos = at;
        DecodeError::Type {
            field,
            marker: self.buf[at],
            at,
        }
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let bytes = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.get(..n))
            .ok_or(DecodeError::Truncated(self.buf.len()))?;
        self.pos += n;
        Ok(bytes)
    }

    /// A big-endian unsigned integer of `n` (1..=8) bytes.
    #[inline]
    pub(super) fn be(&mut self, n: usize) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// Consumes a nil if one is next.
    #[inline]
    pub(super) fn nil(&mut self) -> bool {
        if self.buf.get(self.pos) == Some(&0xc0) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Any msgpack integer.
    pub(super) fn int(&mut self, field: &'static str) -> Result<i128> {
        let at = self.pos;
        Ok(match self.marker()? {
            Marker::FixPos(v) => i128::from(v),
            Marker::FixNeg(v) => i128::from(v),
            Marker::U8 => i128::from(self.be(1)?),
            Marker::U16 => i128::from(self.be(2)?),
            Marker::U32 => i128::from(self.be(4)?),
            Marker::U64 => i128::from(self.be(8)?),
            Marker::I8 => i128::from(self.be(1)? as u8 as i8),
            Marker::I16 => i128::from(self.be(2)? as u16 as i16),
            Marker::I32 => i128::from(self.be(4)? as u32 as i32),
            Marker::I64 => i128::from(self.be(8)? as i64),
            _ => return Err(self.type_error(field, at)),
        })
    }

    /// A token id: the unsigned widths that fit `u32` are read directly.
    #[inline]
    pub(super) fn token(&mut self) -> Result<u32> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let (value, len) = match *rest {
            [b @ 0x00..=0x7f, ..] => (u32::from(b), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, b0, b1, ..] => (u32::from(u16::from_be_bytes([b0, b1])), 3),
            [0xce, b0, b1, b2, b3, ..] => (u32::from_be_bytes([b0, b1, b2, b3]), 5),
            _ => return self.int_in("token_ids"),
        };
        self.pos += len;
        Ok(value)
    }

    /// An integer that must fit `T`.
    pub(super) fn int_in<T: TryFrom<i128>>(&mut self, field: &'static str) -> Result<T> {
        let at = self.pos;
        let value = self.int(field)?;
        T::try_from(value).map_err(|_| DecodeError::Range { field, at })
    }

    /// A block hash: an integer of any width, or a byte string (its last 8 bytes).
    pub(super) fn hash(&mut self, field: &'static str) -> Result<u64> {
        let at = self.pos;
        match Marker::from_u8(self.peek()?) {
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                let bytes = self.bin(field)?;
                if bytes.is_empty() {
                    return Err(DecodeError::Range { field, at });
                }
                let tail = &bytes[bytes.len().saturating_sub(8)..];
                Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
            }
            _ => {
                let value = self.int(field)?;
                if value < 0 {
                    // Two's complement: the low 64 bits of the same integer.
                    Ok(value as i64 as u64)
                } else {
                    u64::try_from(value).map_err(|_| DecodeError::Range { field, at })
                }
            }
        }
    }

    /// A float (an integer is accepted too).
    pub(super) fn f64(&mut self, field: &'static str) -> Result<f64> {
        let at = self.pos;
        match self.marker()? {
            Marker::F64 => Ok(f64::from_bits(self.be(8)?)),
            Marker::F32 => Ok(f64::from(f32::from_bits(self.be(4)? as u32))),
            _ => {
                self.pos = at;
                self.int(field).map(|v| v as f64)
            }
        }
    }

    pub(super) fn str(&mut self, field: &'static str) -> Result<&'a str> {
        let at = self.pos;
        let n = match self.marker()? {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.be(1)? as usize,
            Marker::Str16 => self.be(2)? as usize,
            Marker::Str32 => self.be(4)? as usize,
            _ => return Err(self.type_error(field, at)),
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Utf8 { field, at })
    }

    /// A string if one is next (consumed), else `None` (nothing consumed).
    pub(super) fn opt_str(&mut self) -> Option<&'a str> {
        let at = self.pos;
        self.str("string").ok().or_else(|| {
            self.pos = at;
            None
        })
    }

    pub(super) fn bin(&mut self, field: &'static str) -> Result<&'a [u8]> {
        let at = self.pos;
        let n = match self.marker()? {
            Marker::Bin8 => self.be(1)? as usize,
            Marker::Bin16 => self.be(2)? as usize,
            Marker::Bin32 => self.be(4)? as usize,
            _ => return Err(self.type_error(field, at)),
        };
        self.take(n)
    }

    pub(super) fn array_len(&mut self, field: &'static str) -> Result<usize> {
        let at = self.pos;
        Ok(match self.marker()? {
            Marker::FixArray(n) => usize::from(n),
            Marker::Array16 => self.be(2)? as usize,
            Marker::Array32 => self.be(4)? as usize,
            _ => return Err(self.type_error(field, at)),
        })
    }

    pub(super) fn map_len(&mut self, field: &'static str) -> Result<usize> {
        let at = self.pos;
        Ok(match self.marker()? {
            Marker::FixMap(n) => usize::from(n),
            Marker::Map16 => self.be(2)? as usize,
            Marker::Map32 => self.be(4)? as usize,
            _ => return Err(self.type_error(field, at)),
        })
    }

    /// A map key: `Some` when it is a string, `None` (skipped) otherwise.
    pub(super) fn key(&mut self) -> Result<Option<&'a str>> {
        match self.opt_str() {
            Some(key) => Ok(Some(key)),
            None => self.skip(1).map(|()| None),
        }
    }

    /// Skips one value, returning its bytes.
    pub(super) fn skip_raw(&mut self) -> Result<&'a [u8]> {
        let start = self.pos;
        self.skip(1)?;
        Ok(&self.buf[start..self.pos])
    }

    /// Skips one value at nesting `depth`.
    pub(super) fn skip(&mut self, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep(self.pos));
        }
        let at = self.pos;
        let (data, children) = match self.marker()? {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                (0, 0)
            }
            Marker::Reserved => return Err(self.type_error("value", at)),
            Marker::U8 | Marker::I8 => (1, 0),
            Marker::U16 | Marker::I16 => (2, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0),
            Marker::FixStr(n) => (usize::from(n), 0),
            Marker::Str8 | Marker::Bin8 => (self.be(1)? as usize, 0),
            Marker::Str16 | Marker::Bin16 => (self.be(2)? as usize, 0),
            Marker::Str32 | Marker::Bin32 => (self.be(4)? as usize, 0),
            Marker::FixExt1 => (2, 0),
            Marker::FixExt2 => (3, 0),
            Marker::FixExt4 => (5, 0),
            Marker::FixExt8 => (9, 0),
            Marker::FixExt16 => (17, 0),
            Marker::Ext8 => (self.be(1)? as usize + 1, 0),
            Marker::Ext16 => (self.be(2)? as usize + 1, 0),
            Marker::Ext32 => (self.be(4)? as usize + 1, 0),
            Marker::FixArray(n) => (0, usize::from(n)),
            Marker::Array16 => (0, self.be(2)? as usize),
            Marker::Array32 => (0, self.be(4)? as usize),
            Marker::FixMap(n) => (0, 2 * usize::from(n)),
            Marker::Map16 => (0, 2 * self.be(2)? as usize),
            Marker::Map32 => (0, 2 * self.be(4)? as usize),
        };
        self.take(data)?;
        for _ in 0..children {
            self.skip(depth + 1)?;
        }
        Ok(())
    }
}
