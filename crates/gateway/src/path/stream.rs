//! The client connection's byte stream, plaintext or TLS: the read half the reader task
//! owns, the write half responses are written with, the TLS handshake that turns an
//! accepted socket into a session, and the session's close_notify.
//!
//! Owns the transport of client bytes. Plaintext halves are the socket's own halves (no
//! boxing, no extra copy). A TLS session is shared by its two halves through a `RefCell`
//! that is borrowed only between awaits, never across one: each half owns its half of the
//! socket and its own ciphertext buffer, so the read the reader task keeps armed and a
//! write of the connection task never touch the session at the same time (unlike
//! splitting a monoio-rustls stream, whose halves alias one `&mut` stream across awaits).
//! It must not parse HTTP.

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;

use monoio::buf::{IoBuf, IoVecBuf};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent,
    OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use monoio::BufResult;
use rustls::{ServerConfig, ServerConnection};

/// Room for one whole TLS record (16 KiB of payload and its framing and tag): the largest
/// ciphertext read, reached after reads that filled the buffer.
const RECORD: usize = 17 * 1024;
/// The smallest ciphertext read, what an idle TLS connection holds in its armed read (the
/// session reassembles records that arrive in pieces).
const MIN_RAW: usize = 4 * 1024;

/// The TLS state both halves share.
struct Session {
    conn: ServerConnection,
    /// A write of ciphertext did not complete (its future was dropped or failed): the
    /// record stream is cut, nothing more may be written.
    broken: bool,
    /// close_notify was queued.
    closing: bool,
}

type Shared = Rc<RefCell<Session>>;

/// The read half of a client connection.
pub enum ClientRead {
    Plain(OwnedReadHalf<TcpStream>),
    Tls(TlsRead),
}

/// The write half of a client connection.
pub enum ClientWrite {
    Plain(OwnedWriteHalf<TcpStream>),
    Tls(TlsWrite),
}

pub struct TlsRead {
    rd: OwnedReadHalf<TcpStream>,
    session: Shared,
    /// Ciphertext read from the socket; `raw[pos..]` is not yet given to the session.
    raw: Vec<u8>,
    pos: usize,
    /// The next read's size: doubled after a read that filled the buffer, back to
    /// [`MIN_RAW`] after one that did not.
    size: usize,
}

pub struct TlsWrite {
    wr: OwnedWriteHalf<TcpStream>,
    session: Shared,
    fd: RawFd,
    /// Ciphertext on its way to the socket (kept for reuse).
    out: Vec<u8>,
}

/// Splits a plaintext connection.
pub fn plain(stream: TcpStream) -> (ClientRead, ClientWrite) {
    let (rd, wr) = stream.into_split();
    (ClientRead::Plain(rd), ClientWrite::Plain(wr))
}

/// Why a handshake failed (the `reason` label of the failure counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// `server.tls.handshake_timeout` passed.
    Timeout,
    /// The client closed (or reset) the connection before the handshake ended.
    Closed,
    /// What arrived is not a TLS handshake (plaintext HTTP to the TLS port, for one).
    NotTls,
    /// No protocol version, cipher suite or ALPN protocol in common.
    Incompatible,
    /// The client aborted with an alert (it did not trust the certificate, say).
    Alert,
    /// Any other protocol error.
    Error,
}

impl HandshakeFailure {
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Closed => "closed",
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::Incompatible => "incompatible",
            HandshakeFailure::Alert => "alert",
            HandshakeFailure::Error => "error",
        }
    }

    fn of(e: &rustls::Error) -> HandshakeFailure {
        match e {
            rustls::Error::InvalidMessage(_) => HandshakeFailure::NotTls,
            rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol => {
                HandshakeFailure::Incompatible
            }
            rustls::Error::AlertReceived(_) => HandshakeFailure::Alert,
            _ => HandshakeFailure::Error,
        }
    }
}

/// A finished handshake: the halves and the negotiated version ("1.2", "1.3").
pub struct Accepted {
    pub rd: ClientRead,
    pub wr: ClientWrite,
    pub version: &'static str,
}

/// Runs the server side of a TLS handshake on `stream` (the caller bounds it in time).
/// Bytes the client sent after its last handshake message (the first request, often in the
/// same packet) stay in the read half.
pub async fn accept(
    mut stream: TcpStream,
    fd: RawFd,
    config: Arc<ServerConfig>,
) -> Result<Accepted, HandshakeFailure> {
    let mut conn = ServerConnection::new(config).map_err(|_| HandshakeFailure::Error)?;
    let mut raw: Vec<u8> = Vec::with_capacity(RECORD);
    let mut out: Vec<u8> = Vec::new();
    let mut pos = 0;
    loop {
        out.clear();
        while conn.wants_write() {
            conn.write_tls(&mut out)
                .map_err(|_| HandshakeFailure::Error)?;
        }
        if !out.is_empty() {
            let (r, o) = stream.write_all(out).await;
            out = o;
            r.map_err(|_| HandshakeFailure::Closed)?;
        }
        if !conn.is_handshaking() {
            break;
        }
        if pos == raw.len() {
            raw.clear();
            pos = 0;
            let (r, b) = stream.read(raw).await;
            raw = b;
            match r {
                Ok(n) if n > 0 => {}
                _ => return Err(HandshakeFailure::Closed),
            }
        }
        let mut rest = &raw[pos..];
        let n = conn
            .read_tls(&mut rest)
            .map_err(|_| HandshakeFailure::Error)?;
        pos += n;
        if let Err(e) = conn.process_new_packets() {
            // Tell the client why (the alert rustls queued), then give up.
            out.clear();
            while conn.wants_write() {
                if conn.write_tls(&mut out).is_err() {
                    break;
                }
            }
            if !out.is_empty() {
                let _ = stream.write_all(out).await;
            }
            return Err(HandshakeFailure::of(&e));
        }
    }
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "1.2",
        _ => "other",
    };
    let session = Rc::new(RefCell::new(Session {
        conn,
        broken: false,
        closing: false,
    }));
    let (rd, wr) = stream.into_split();
    Ok(Accepted {
        rd: ClientRead::Tls(TlsRead {
            rd,
            session: session.clone(),
            raw,
            pos,
            size: MIN_RAW,
        }),
        wr: ClientWrite::Tls(TlsWrite {
            wr,
            session,
            fd,
            out,
        }),
        version,
    })
}

/// A client read half the reader drives: its own type per transport, so a plaintext
/// connection's reader task is not sized for a TLS read's state.
pub trait ReadSource {
    /// Whether a pending read can be cancelled and replaced by [`Self::readable`]: only on
    /// plaintext (a TLS read may hold a partial record in the session's buffers).
    const PARKS: bool;

    /// Reads into the spare capacity of `buf` (which must have some). `Ok(0)`: the client
    /// closed (for TLS: with close_notify, or a TCP close, which this side treats alike:
    /// either way no more request bytes come).
    fn read(&mut self, buf: Vec<u8>) -> impl Future<Output = BufResult<usize, Vec<u8>>>;

    /// A read that `cancel` can cancel: it then ends with `ECANCELED` unless bytes arrived
    /// first. Only called when [`Self::PARKS`].
    fn cancelable_read(
        &mut self,
        buf: Vec<u8>,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>>;

    /// Waits, holding no buffer, until the socket has bytes, EOF or an error. It may end
    /// early under epoll; a read then simply waits. Only called when [`Self::PARKS`].
    fn readable(&self) -> impl Future<Output = io::Result<()>>;
}

impl ReadSource for OwnedReadHalf<TcpStream> {
    const PARKS: bool = true;

    fn read(&mut self, buf: Vec<u8>) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        AsyncReadRent::read(self, buf)
    }

    fn cancelable_read(
        &mut self,
        buf: Vec<u8>,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        CancelableAsyncReadRent::cancelable_read(self, buf, cancel)
    }

    fn readable(&self) -> impl Future<Output = io::Result<()>> {
        // SAFETY: `readable` only takes another handle on the socket's descriptor for a
        // readiness wait; it neither reads nor writes the stream, so it does not alias the
        // write half's use of it.
        let stream = unsafe { &*self.0.get() };
        stream.readable(true)
    }
}

impl ReadSource for TlsRead {
    const PARKS: bool = false;

    fn read(&mut self, buf: Vec<u8>) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        TlsRead::read(self, buf)
    }

    fn cancelable_read(
        &mut self,
        buf: Vec<u8>,
        _cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, Vec<u8>>> {
        TlsRead::read(self, buf)
    }

    fn readable(&self) -> impl Future<Output = io::Result<()>> {
        std::future::ready(Ok(()))
    }
}

impl TlsRead {
    async fn read(&mut self, mut buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        loop {
            {
                let mut s = self.session.borrow_mut();
                let start = buf.len();
                buf.resize(buf.capacity().max(start + 1), 0);
                let r = s.conn.reader().read(&mut buf[start..]);
                match r {
                    Ok(n) => {
                        buf.truncate(start + n);
                        return (Ok(n), buf);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => buf.truncate(start),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        buf.truncate(start);
                        return (Ok(0), buf);
                    }
                    Err(e) => {
                        buf.truncate(start);
                        return (Err(e), buf);
                    }
                }
                if self.pos < self.raw.len() {
                    let mut rest = &self.raw[self.pos..];
                    match s.conn.read_tls(&mut rest) {
                        Ok(n) => self.pos += n,
                        Err(e) => return (Err(e), buf),
                    }
                    if let Err(e) = s.conn.process_new_packets() {
                        return (Err(io::Error::new(io::ErrorKind::InvalidData, e)), buf);
                    }
                    continue;
                }
            }
            // The session needs more ciphertext: no borrow is held while the read waits.
            let mut raw = std::mem::take(&mut self.raw);
            raw.clear();
            self.pos = 0;
            if raw.capacity() > 2 * self.size {
                raw = Vec::new();
            }
            raw.reserve(self.size);
            let (r, raw) = AsyncReadRent::read(&mut self.rd, raw).await;
            self.raw = raw;
            if let Ok(n) = r {
                self.size = if n > 0 && n == self.raw.capacity() {
                    (self.size * 2).min(RECORD)
                } else {
                    MIN_RAW
                };
            }
            match r {
                Ok(0) => {
                    // Tell the session about the TCP close; its reader then reports a clean
                    // (close_notify) or unclean end.
                    let mut s = self.session.borrow_mut();
                    let _ = s.conn.read_tls(&mut io::empty());
                    if let Err(e) = s.conn.process_new_packets() {
                        return (Err(io::Error::new(io::ErrorKind::InvalidData, e)), buf);
                    }
                }
                Ok(_) => {}
                Err(e) => return (Err(e), buf),
            }
        }
    }
}

impl TlsWrite {
    /// Encrypts what `data` the session takes and writes the records whole.
    async fn write_slice(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = {
            let mut s = self.session.borrow_mut();
            if s.broken {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "an earlier TLS write to this client did not complete",
                ));
            }
            let n = s.conn.writer().write(data)?;
            self.out.clear();
            while s.conn.wants_write() {
                s.conn.write_tls(&mut self.out)?;
            }
            // Until the records are all on the socket, a dropped future leaves a cut one.
            s.broken = true;
            n
        };
        self.flush_out().await?;
        self.session.borrow_mut().broken = false;
        Ok(n)
    }

    async fn flush_out(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        let (r, mut out) = self.wr.write_all(out).await;
        out.clear();
        self.out = out;
        r.map(|_| ())
    }

    /// Queues close_notify once; `false` when it cannot be sent (already queued, or the
    /// record stream is cut). Its records are left in `self.out`.
    fn queue_close_notify(&mut self) -> bool {
        let mut s = self.session.borrow_mut();
        if s.broken || s.closing {
            return false;
        }
        s.closing = true;
        s.conn.send_close_notify();
        self.out.clear();
        while s.conn.wants_write() {
            if s.conn.write_tls(&mut self.out).is_err() {
                return false;
            }
        }
        true
    }

    /// Sends close_notify without waiting (the connection is being dropped): one small
    /// record, handed to the socket only if it fits now.
    pub fn close_notify_now(&mut self) {
        if self.queue_close_notify() && !self.out.is_empty() {
            // SAFETY: `fd` is the open socket this half writes to; no write of ours is in
            // flight (the half is borrowed mutably), and the send does not block.
            unsafe {
                libc::send(
                    self.fd,
                    self.out.as_ptr().cast(),
                    self.out.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                );
            }
            self.out.clear();
        }
    }
}

impl ClientWrite {
    /// The answer was cut off: the session must end without close_notify, so a TLS client
    /// sees a truncation (a TCP close without it), never a clean end of a partial body.
    pub fn cut(&mut self) {
        if let ClientWrite::Tls(t) = self {
            t.session.borrow_mut().closing = true;
        }
    }

    /// Sends close_notify now if this is TLS (see [`TlsWrite::close_notify_now`]).
    pub fn close_notify_now(&mut self) {
        if let ClientWrite::Tls(t) = self {
            t.close_notify_now();
        }
    }
}

impl AsyncWriteRent for ClientWrite {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientWrite::Plain(wr) => wr.write(buf).await,
            ClientWrite::Tls(t) => {
                // SAFETY: `buf` is owned here and outlives the call; its bytes are copied
                // into the session before the first await.
                let data = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
                let r = t.write_slice(data).await;
                (r, buf)
            }
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientWrite::Plain(wr) => wr.writev(buf).await,
            ClientWrite::Tls(t) => {
                // The first iovec only (a write may take less than it is given).
                // SAFETY: `buf` is owned here and outlives the call; the iovec it points to
                // is copied into the session before the first await.
                let data: &[u8] = unsafe {
                    if buf.read_iovec_len() == 0 {
                        &[]
                    } else {
                        let v = *buf.read_iovec_ptr();
                        std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                    }
                };
                let r = t.write_slice(data).await;
                (r, buf)
            }
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            ClientWrite::Plain(wr) => wr.flush().await,
            ClientWrite::Tls(t) => t.wr.flush().await,
        }
    }

    /// For TLS: close_notify, then the socket's write side.
    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            ClientWrite::Plain(wr) => wr.shutdown().await,
            ClientWrite::Tls(t) => {
                if t.queue_close_notify() {
                    t.session.borrow_mut().broken = true;
                    t.flush_out().await?;
                    t.session.borrow_mut().broken = false;
                }
                t.wr.shutdown().await
            }
        }
    }
}
