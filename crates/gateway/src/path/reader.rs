//! The client reader: one task per client connection that keeps exactly one read armed on
//! the client socket for the connection's whole life.
//!
//! The same armed read serves two purposes: it receives the next request's bytes, and it is
//! the disconnect watch while an exchange is in progress (EOF or an error means the client
//! is gone and the upstream must be dropped). Bytes go into the connection's [`Inbox`];
//! the connection task takes them when it needs them. Compared with arming and cancelling a
//! separate watch read per request, this saves two io_uring operations per request, and it
//! keeps watching after pipelined bytes arrive.
//!
//! A plaintext read that stays armed for [`PARK_AFTER`] (a coarse deadline, see
//! [`super::idle_timer`]) without completing (an idle keep-alive connection, or a long
//! stream during which the client sends nothing) is
//! cancelled and its buffer freed: the reader then waits for readability with no buffer
//! lent to the kernel, and arms a read only when bytes (or EOF) are there. A busy
//! connection, whose next request arrives sooner, never parks and pays no extra kernel
//! operation; a parked one pays one cancel and one readiness wait per idle spell (under
//! epoll, neither is a system call).
//!
//! Owns the read half of the client connection (plaintext or TLS: for TLS the bytes here
//! are the decrypted ones). It must not parse anything, and it stops
//! reading while the inbox holds more than its cap (a client cannot make the gateway buffer
//! without bound).

use std::cell::RefCell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use monoio::io::Canceller;

use super::idle_timer::IdleDeadline;
use super::stream::{ClientRead, ReadSource};

/// Smallest read buffer: an idle connection holds no more than this.
const MIN_READ: usize = 4 * 1024;
/// Largest read buffer, reached after reads that filled the buffer (large bodies).
const MAX_READ: usize = 64 * 1024;
/// How long a plaintext read stays armed before it is cancelled for a readiness wait
/// without a buffer. Back-to-back keep-alive requests come far sooner; a client that
/// pauses longer costs one cancel and one readiness wait per pause.
pub const PARK_AFTER: Duration = Duration::from_millis(100);

/// Bytes received from the client and not yet taken by the connection task.
pub struct Inbox {
    data: Vec<u8>,
    /// The client closed its side, or the socket failed.
    eof: bool,
    /// The connection task is done; the reader must stop.
    closed: bool,
    /// Stop reading while `data` holds at least this many bytes.
    cap: usize,
    /// The connection task, waiting for bytes or EOF.
    conn_waker: Option<Waker>,
    /// The reader, paused because the inbox is full.
    reader_waker: Option<Waker>,
}

/// The connection task's handle on its reader.
#[derive(Clone)]
pub struct Reader {
    inbox: Rc<RefCell<Inbox>>,
}

impl Reader {
    /// Starts the reader task for `rd`. It stops reading while `cap` bytes wait unread.
    pub fn spawn(rd: ClientRead, cap: usize) -> Reader {
        let inbox = Rc::new(RefCell::new(Inbox {
            data: Vec::new(),
            eof: false,
            closed: false,
            cap: cap.max(MIN_READ),
            conn_waker: None,
            reader_waker: None,
        }));
        // One task type per transport: a plaintext connection's task holds no TLS state.
        match rd {
            ClientRead::Plain(rd) => drop(monoio::spawn(read_loop(rd, inbox.clone()))),
            ClientRead::Tls(rd) => drop(monoio::spawn(read_loop(rd, inbox.clone()))),
        }
        Reader { inbox }
    }

    /// Moves every received byte to the end of `buf`. Returns how many.
    pub fn take_into(&self, buf: &mut Vec<u8>) -> usize {
        let mut inbox = self.inbox.borrow_mut();
        let n = inbox.data.len();
        if n == 0 {
            return 0;
        }
        if buf.is_empty() && buf.capacity() <= inbox.data.capacity() {
            std::mem::swap(buf, &mut inbox.data);
        } else {
            buf.extend_from_slice(&inbox.data);
        }
        inbox.data.clear();
        if let Some(w) = inbox.reader_waker.take() {
            w.wake();
        }
        n
    }

    /// Whether bytes are waiting.
    pub fn has_data(&self) -> bool {
        !self.inbox.borrow().data.is_empty()
    }

    /// The client closed its side or the socket failed.
    pub fn is_gone(&self) -> bool {
        self.inbox.borrow().eof
    }

    /// Ready when bytes are waiting or the client is gone; registers the caller otherwise.
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut inbox = self.inbox.borrow_mut();
        if !inbox.data.is_empty() || inbox.eof {
            return Poll::Ready(());
        }
        set_waker(&mut inbox.conn_waker, cx);
        Poll::Pending
    }

    /// Ready when the client is gone (bytes arriving meanwhile stay in the inbox).
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut inbox = self.inbox.borrow_mut();
        if inbox.eof {
            return Poll::Ready(());
        }
        set_waker(&mut inbox.conn_waker, cx);
        Poll::Pending
    }

    /// Tells the reader to stop. The caller then shuts the socket so the armed read ends.
    pub fn close(&self) {
        let mut inbox = self.inbox.borrow_mut();
        inbox.closed = true;
        if let Some(w) = inbox.reader_waker.take() {
            w.wake();
        }
    }
}

fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

async fn read_loop<R: ReadSource>(mut rd: R, inbox: Rc<RefCell<Inbox>>) {
    let mut buf: Vec<u8> = Vec::with_capacity(MIN_READ);
    let mut size = MIN_READ;
    let mut canceller = Canceller::new();
    // The last read was cancelled as idle: wait for readability before lending a buffer.
    let mut parked = false;
    loop {
        // Wait while the inbox is full; stop when the connection is done.
        std::future::poll_fn(|cx| {
            let mut i = inbox.borrow_mut();
            if i.closed || i.data.len() < i.cap {
                Poll::Ready(())
            } else {
                set_waker(&mut i.reader_waker, cx);
                Poll::Pending
            }
        })
        .await;
        if inbox.borrow().closed {
            return;
        }
        if R::PARKS && parked {
            // Readable also means EOF or an error: the read below then reports it.
            let _ = rd.readable().await;
            if inbox.borrow().closed {
                return;
            }
            parked = false;
        }
        buf.clear();
        if buf.capacity() < size {
            buf.reserve(size);
        }
        let (res, b) = if R::PARKS {
            let read = pin!(rd.cancelable_read(buf, canceller.handle()));
            park_idle(read, &mut canceller).await
        } else {
            rd.read(buf).await
        };
        buf = b;
        let mut i = inbox.borrow_mut();
        if i.closed {
            return;
        }
        match res {
            Ok(n) if n > 0 => {
                // Grow after a full read (a large body), shrink back after a small one.
                size = if n == buf.capacity() {
                    (size * 2).min(MAX_READ)
                } else {
                    MIN_READ
                };
                if i.data.is_empty() && n > buf.capacity() / 2 {
                    std::mem::swap(&mut i.data, &mut buf);
                    if buf.capacity() > MAX_READ {
                        buf = Vec::new();
                    }
                } else {
                    // A small read is copied out (the inbox's buffer is then about its size)
                    // and the read buffer kept: a request that streams for minutes holds
                    // its bytes, not a mostly empty read buffer, for the same one
                    // allocation a swap would cost the next read.
                    i.data.extend_from_slice(&buf);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {
                // Cancelled as idle, nothing read: the buffer goes back to the allocator.
                buf = Vec::new();
                parked = true;
                continue;
            }
            _ => {
                i.eof = true;
                if let Some(w) = i.conn_waker.take() {
                    w.wake();
                }
                return;
            }
        }
        if let Some(w) = i.conn_waker.take() {
            w.wake();
        }
    }
}

/// Awaits `read`, cancelling it once it has been armed for [`PARK_AFTER`]. A cancelled read
/// still completes: with `ECANCELED`, or with the bytes that arrived first (so none is
/// lost to the cancel).
async fn park_idle<T, F: Future<Output = monoio::BufResult<usize, T>>>(
    mut read: std::pin::Pin<&mut F>,
    canceller: &mut Canceller,
) -> monoio::BufResult<usize, T> {
    let mut idle = IdleDeadline::after(PARK_AFTER);
    let mut cancelled = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = read.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if !cancelled && idle.poll_due(cx).is_ready() {
            cancelled = true;
            *canceller = std::mem::take(canceller).cancel();
            // The cancel completes the read; poll it again in case that was at once.
            if let Poll::Ready(r) = read.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    use monoio::io::AsyncWriteRentExt;
    use monoio::net::{TcpListener, TcpStream};

    /// Waits for the inbox to hold `want` bytes (or EOF) and takes them.
    async fn take(r: &Reader, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < want {
            std::future::poll_fn(|cx| r.poll_ready(cx)).await;
            if r.take_into(&mut got) == 0 {
                break;
            }
        }
        got
    }

    /// A connection that goes quiet long enough for its read to park still receives every
    /// byte sent afterwards, in order, and its EOF; under both drivers.
    #[monoio::test_all(timer_enabled = true)]
    async fn parked_reader_receives_later_bytes_and_eof() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (rd, _wr) = super::super::stream::plain(server);
        let r = Reader::spawn(rd, MIN_READ);
        // The worker's tick, which sweeps the idle deadlines.
        monoio::spawn(async {
            loop {
                monoio::time::sleep(Duration::from_millis(5)).await;
                super::super::idle_timer::sweep(std::time::Instant::now());
            }
        });
        for round in 0..3u8 {
            // Quiet for several park delays: the read is cancelled and the reader waits
            // for readability with no buffer.
            monoio::time::sleep(PARK_AFTER * 3).await;
            let msg = vec![b'a' + round; 3000 + round as usize];
            let (res, _) = client.write_all(msg.clone()).await;
            res.unwrap();
            assert_eq!(take(&r, msg.len()).await, msg);
        }
        drop(client);
        std::future::poll_fn(|cx| r.poll_gone(cx)).await;
        assert!(r.is_gone());
        assert!(!r.has_data());
        r.close();
    }

    #[test]
    fn take_into_swaps_or_appends() {
        let inbox = Rc::new(RefCell::new(Inbox {
            data: b"abc".to_vec(),
            eof: false,
            closed: false,
            cap: MIN_READ,
            conn_waker: None,
            reader_waker: None,
        }));
        let r = Reader { inbox };
        let mut buf = Vec::new();
        assert_eq!(r.take_into(&mut buf), 3);
        assert_eq!(buf, b"abc");
        r.inbox.borrow_mut().data.extend_from_slice(b"def");
        assert_eq!(r.take_into(&mut buf), 3);
        assert_eq!(buf, b"abcdef");
        assert_eq!(r.take_into(&mut buf), 0);
        assert!(!r.has_data());
    }
}
