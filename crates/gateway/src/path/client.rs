//! The client side of a connection: its reader task and write half, what becomes of the
//! connection after a request, and writing a response to it within the write timeout.
//!
//! Owns the client connection's halves (plaintext or TLS, [`super::stream`]). It must not
//! parse requests or decide routing.

use std::os::fd::RawFd;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;
use rolter_codec::{GatewayError, Reply};

use super::reader::Reader;
use super::stream::ClientWrite;

/// The client connection: its reader task (which always has a read armed) and the write
/// half.
pub struct ClientIo {
    pub reader: Reader,
    pub wr: ClientWrite,
    pub(super) fd: RawFd,
}

impl Drop for ClientIo {
    fn drop(&mut self) {
        // A TLS session says it is ending (close_notify), so the client can tell a complete
        // answer from a cut one.
        self.wr.close_notify_now();
        // Stop the reader and end its armed read: the socket closes once both halves go.
        self.reader.close();
        // SAFETY: the fd stays open until the reader task drops its half, after this.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }
}

/// What happens to the client connection after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    KeepAlive,
    Close,
}

/// Writes an error response answering `to` (its API's shape, its id, the head only for
/// HEAD); the connection stays open unless `to.close`. `out` keeps the response's bytes
/// when the write succeeded.
pub async fn respond(
    wr: &mut ClientWrite,
    out: &mut Vec<u8>,
    e: &GatewayError,
    to: Reply<'_>,
    write_timeout: Duration,
) -> Fate {
    out.clear();
    e.write_reply(out, to);
    write_out(wr, out, write_timeout).await
}

/// Writes `out` (handed back for reuse) within `write_timeout`.
pub async fn write_out(wr: &mut ClientWrite, out: &mut Vec<u8>, write_timeout: Duration) -> Fate {
    let buf = std::mem::take(out);
    match monoio::time::timeout(write_timeout, wr.write_all(buf)).await {
        Ok((Ok(_), buf)) => {
            *out = buf;
            Fate::KeepAlive
        }
        _ => Fate::Close,
    }
}
