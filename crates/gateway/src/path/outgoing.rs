//! The upstream request as it goes on the wire: the bytes the gateway wrote (the head, and
//! the model name it swapped in) in a reused buffer, and a large body where it was read.
//!
//! A body of at least [`IN_PLACE_BODY_MIN`] bytes read with a Content-Length is not copied
//! after the head: the connection shares its read buffer for the request's length, and one
//! vectored write sends the head and the body from there (with the swapped model name
//! between the body's two parts). A smaller body (or a chunked one, decoded into a buffer
//! of its own) is copied after the head, and the request goes out in one plain write.
//!
//! Owns those bytes and the write loop; it must not keep the shared read buffer past a
//! completed write (the connection takes it back after the request), and must not change
//! the segments it was given, so a write that failed on a stale pooled connection can be
//! sent again whole on a fresh one.

use std::io;
use std::ops::Range;
use std::rc::Rc;

use monoio::buf::IoVecBuf;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};
use rolter_codec::translate::Reply;
use rolter_codec::GatewayError;

/// Smallest body written from the read buffer in place. Below it, copying the body after
/// the head costs less than sharing the read buffer (an allocation) and gathering.
pub const IN_PLACE_BODY_MIN: usize = 8 * 1024;

/// A large body in the connection's read buffer, written from there.
struct InPlace {
    buf: Rc<Vec<u8>>,
    /// `bytes[..head_len]` is written first; `bytes[head_len..]` (the swapped model name,
    /// or nothing) goes between `first` and `second`.
    head_len: usize,
    first: Range<usize>,
    second: Range<usize>,
}

/// The upstream request's bytes, reused request after request.
#[derive(Default)]
pub struct Outgoing {
    /// The bytes the gateway wrote: the head, then the whole body when it is copied, or
    /// the swapped model name when the body is written in place.
    pub bytes: Vec<u8>,
    in_place: Option<InPlace>,
    /// The segments of a vectored write, rebuilt for every write. Kept in a heap buffer of
    /// its own so that their address holds while the runtime owns the value.
    iov: Vec<libc::iovec>,
    /// The first segment not written in full yet.
    next: usize,
    /// A body written again (a leg's changed fields), before it is copied after the head.
    pub scratch: Vec<u8>,
    /// The translation of the answer, when the request was written in the target's API
    /// rather than the client's (`upstream_request`); the relay takes it.
    pub reply: Option<Box<Reply>>,
    /// Why the request could not be written in the target's API: it is answered with
    /// this and never sent.
    pub refused: Option<GatewayError>,
    /// The request asks the engine for the stream's usage on the client's behalf
    /// (`stream_usage = "ask"`): the relay keeps the usage event from the client.
    pub asked_usage: bool,
    /// The engine is expected to report the stream's usage (asked by the gateway or by the
    /// client): its content deltas are not counted.
    pub usage_expected: bool,
}

impl Outgoing {
    /// Empties the bytes and lets go of any body in place.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.reply = None;
        self.refused = None;
        self.asked_usage = false;
        self.usage_expected = false;
        self.release_body();
    }

    /// Lets go of the shared read buffer (the bytes stay).
    pub fn release_body(&mut self) {
        self.in_place = None;
        self.iov.clear();
        self.next = 0;
    }

    /// The body goes from `buf`: its `first` range right after the bytes written so far,
    /// then whatever is written to `bytes` after this call, then its `second` range.
    pub fn body_in_place(&mut self, buf: &Rc<Vec<u8>>, first: Range<usize>, second: Range<usize>) {
        debug_assert!(first.end <= buf.len() && second.end <= buf.len());
        self.in_place = Some(InPlace {
            buf: Rc::clone(buf),
            head_len: self.bytes.len(),
            first,
            second,
        });
    }

    /// Is the body written from the read buffer?
    pub fn is_in_place(&self) -> bool {
        self.in_place.is_some()
    }

    /// The request's length on the wire.
    pub fn len(&self) -> usize {
        self.bytes.len()
            + self
                .in_place
                .as_ref()
                .map_or(0, |p| p.first.len() + p.second.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The request's bytes in order, copied.
    #[cfg(test)]
    fn to_vec(&self) -> Vec<u8> {
        let Some(p) = &self.in_place else {
            return self.bytes.clone();
        };
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.bytes[..p.head_len]);
        v.extend_from_slice(&p.buf[p.first.clone()]);
        v.extend_from_slice(&self.bytes[p.head_len..]);
        v.extend_from_slice(&p.buf[p.second.clone()]);
        v
    }

    /// Writes the whole request on `w`. On an error the value comes back unchanged, to be
    /// written again elsewhere; after a completed write its body in place is let go.
    pub async fn write_to<W: AsyncWriteRent>(mut self, w: &mut W) -> (io::Result<()>, Self) {
        if self.in_place.is_none() {
            let (r, bytes) = w.write_all(std::mem::take(&mut self.bytes)).await;
            self.bytes = bytes;
            return (r.map(drop), self);
        }
        self.arm();
        while self.next < self.iov.len() {
            let (r, back) = w.writev(self).await;
            self = back;
            match r {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), self),
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), self),
            }
        }
        self.release_body();
        (Ok(()), self)
    }

    /// Builds the segments of a vectored write from the bytes and the body in place.
    fn arm(&mut self) {
        self.iov.clear();
        self.next = 0;
        let Some(p) = &self.in_place else { return };
        let (head, swapped) = self.bytes.split_at(p.head_len);
        for seg in [
            head,
            &p.buf[p.first.clone()],
            swapped,
            &p.buf[p.second.clone()],
        ] {
            if !seg.is_empty() {
                self.iov.push(libc::iovec {
                    iov_base: seg.as_ptr() as *mut libc::c_void,
                    iov_len: seg.len(),
                });
            }
        }
    }

    /// Moves past `n` written bytes: whole segments, then into the next one.
    fn advance(&mut self, mut n: usize) {
        while n > 0 && self.next < self.iov.len() {
            let seg = &mut self.iov[self.next];
            if n >= seg.iov_len {
                n -= seg.iov_len;
                self.next += 1;
            } else {
                // SAFETY: `n` is less than the segment's length, so the pointer stays inside
                // the segment, which points into a buffer this value holds.
                seg.iov_base = unsafe { (seg.iov_base as *mut u8).add(n) } as *mut libc::c_void;
                seg.iov_len -= n;
                n = 0;
            }
        }
    }
}

// SAFETY: the segments point into `bytes` and the shared read buffer, both held by this value
// and unchanged while the runtime owns it (a write takes the value by move); moving the value
// moves neither buffer's heap allocation, nor the segment array's. The pointer and count
// returned describe `iov[next..]`, valid `iovec`s built by `arm` and moved on by `advance`.
unsafe impl IoVecBuf for Outgoing {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov[self.next..].as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len() - self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts at most `step` bytes per write, recording what it was given.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        writes: usize,
    }

    impl AsyncWriteRent for Trickle {
        async fn write<T: monoio::buf::IoBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            let n = buf.bytes_init().min(self.step);
            // SAFETY: `bytes_init` bytes from `read_ptr` are initialised.
            let s = unsafe { std::slice::from_raw_parts(buf.read_ptr(), n) };
            self.got.extend_from_slice(s);
            self.writes += 1;
            (Ok(n), buf)
        }

        async fn writev<T: IoVecBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            // SAFETY: the value promises `read_iovec_len` valid iovecs at the pointer.
            let iov =
                unsafe { std::slice::from_raw_parts(buf.read_iovec_ptr(), buf.read_iovec_len()) };
            let mut left = self.step;
            let mut n = 0;
            for v in iov {
                let take = v.iov_len.min(left);
                // SAFETY: each iovec describes `iov_len` readable bytes.
                let s = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, take) };
                self.got.extend_from_slice(s);
                n += take;
                left -= take;
                if left == 0 {
                    break;
                }
            }
            self.writes += 1;
            (Ok(n), buf)
        }

        async fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }

        async fn shutdown(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn body() -> Rc<Vec<u8>> {
        Rc::new((0..40_000u32).map(|i| (i % 251) as u8).collect())
    }

    fn swapped(buf: &Rc<Vec<u8>>) -> Outgoing {
        let mut o = Outgoing::default();
        o.bytes.extend_from_slice(b"POST /v1 HTTP/1.1\r\n\r\n");
        o.body_in_place(buf, 100..20_000, 20_010..39_000);
        o.bytes.extend_from_slice(b"\"swapped\"");
        o
    }

    fn expected(buf: &[u8]) -> Vec<u8> {
        let mut v = b"POST /v1 HTTP/1.1\r\n\r\n".to_vec();
        v.extend_from_slice(&buf[100..20_000]);
        v.extend_from_slice(b"\"swapped\"");
        v.extend_from_slice(&buf[20_010..39_000]);
        v
    }

    #[monoio::test_all]
    async fn partial_writes_send_every_segment_in_order_then_let_the_body_go() {
        for step in [1, 7, 4096, 19_900, 1 << 20] {
            let buf = body();
            let o = swapped(&buf);
            assert_eq!(o.len(), expected(&buf).len());
            assert_eq!(o.to_vec(), expected(&buf));
            let mut w = Trickle {
                got: Vec::new(),
                step,
                writes: 0,
            };
            let (r, o) = o.write_to(&mut w).await;
            r.unwrap();
            assert_eq!(w.got, expected(&buf), "step {step}");
            assert!(
                step < 1 << 20 || w.writes == 1,
                "one write when it all fits"
            );
            assert!(!o.is_in_place());
            assert_eq!(
                Rc::strong_count(&buf),
                1,
                "the read buffer is the connection's again"
            );
        }
    }

    /// Fails every write after `ok` of them.
    struct Breaks {
        ok: usize,
        step: usize,
    }

    impl AsyncWriteRent for Breaks {
        async fn write<T: monoio::buf::IoBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            (Err(io::ErrorKind::BrokenPipe.into()), buf)
        }

        async fn writev<T: IoVecBuf>(&mut self, buf: T) -> monoio::BufResult<usize, T> {
            if self.ok == 0 {
                return (Err(io::ErrorKind::BrokenPipe.into()), buf);
            }
            self.ok -= 1;
            (Ok(self.step), buf)
        }

        async fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }

        async fn shutdown(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[monoio::test_all]
    async fn a_failed_write_keeps_the_whole_request_to_send_again() {
        let buf = body();
        let o = swapped(&buf);
        let (r, o) = o.write_to(&mut Breaks { ok: 3, step: 5000 }).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert!(o.is_in_place());
        let mut w = Trickle {
            got: Vec::new(),
            step: 3000,
            writes: 0,
        };
        let (r, _) = o.write_to(&mut w).await;
        r.unwrap();
        assert_eq!(
            w.got,
            expected(&buf),
            "sent again whole, from its first byte"
        );
    }

    #[monoio::test_all]
    async fn a_copied_body_goes_in_one_plain_write() {
        let mut o = Outgoing::default();
        o.bytes
            .extend_from_slice(b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}");
        let mut w = Trickle {
            got: Vec::new(),
            step: 1 << 20,
            writes: 0,
        };
        let (r, o) = o.write_to(&mut w).await;
        r.unwrap();
        assert_eq!(w.got, o.bytes);
        assert_eq!(w.writes, 1);
    }
}
