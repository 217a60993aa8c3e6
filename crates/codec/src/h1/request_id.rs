//! The request id: a client's `x-request-id` kept when it is safe to echo and log (at most
//! [`MAX_LEN`] visible ASCII bytes, no spaces, quotes or backslashes), otherwise a fresh
//! one: 32 lowercase hex digits from a per-thread random prefix and a counter.
//!
//! Owns the id's validation and generation only; it stores the id inline (no allocation)
//! and must not do I/O.

use std::cell::Cell;

/// Longest client-sent id kept.
pub const MAX_LEN: usize = 128;

/// A request id, stored inline.
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; MAX_LEN],
    len: u8,
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Is `v` a request id the gateway keeps?
pub fn is_valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|&b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\'))
}

thread_local! {
    /// (random prefix, counter) of this thread's generated ids.
    static SEQ: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

impl RequestId {
    /// The client's id when it is valid, else a generated one.
    pub fn from_client(sent: Option<&[u8]>) -> RequestId {
        match sent {
            Some(v) if is_valid(v) => {
                let mut id = RequestId {
                    bytes: [0; MAX_LEN],
                    len: v.len() as u8,
                };
                id.bytes[..v.len()].copy_from_slice(v);
                id
            }
            _ => RequestId::generate(),
        }
    }

    /// A fresh id, unique within the process (and, by its random prefix, very likely
    /// across processes): 32 hex digits.
    pub fn generate() -> RequestId {
        let (prefix, n) = SEQ.with(|c| {
            let (mut prefix, n) = c.get();
            if prefix == 0 {
                prefix = fastrand::u64(1..);
            }
            c.set((prefix, n.wrapping_add(1)));
            (prefix, n)
        });
        let mut id = RequestId {
            bytes: [0; MAX_LEN],
            len: 32,
        };
        let hex = b"0123456789abcdef";
        for (i, v) in [prefix, n].into_iter().enumerate() {
            for j in 0..16 {
                id.bytes[i * 16 + j] = hex[((v >> (60 - 4 * j)) & 0xf) as usize];
            }
        }
        id
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub fn as_str(&self) -> &str {
        // Only visible ASCII is ever stored.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_client_id_is_kept() {
        let id = RequestId::from_client(Some(b"req-42_abc.DEF:9"));
        assert_eq!(id.as_str(), "req-42_abc.DEF:9");
        let long = [b'a'; MAX_LEN];
        assert_eq!(RequestId::from_client(Some(&long)).as_bytes(), &long[..]);
    }

    #[test]
    fn an_invalid_client_id_is_replaced() {
        let too_long = [b'a'; MAX_LEN + 1];
        for bad in [
            &b""[..],
            b"has space",
            b"quo\"te",
            b"back\\slash",
            b"tab\there",
            "caf\u{e9}".as_bytes(),
            &too_long,
        ] {
            let id = RequestId::from_client(Some(bad));
            assert_ne!(id.as_bytes(), bad);
            assert_eq!(id.as_str().len(), 32);
            assert!(id.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn generated_ids_differ() {
        let a = RequestId::from_client(None);
        let b = RequestId::generate();
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.as_str()[..16], b.as_str()[..16], "one prefix per thread");
    }
}
