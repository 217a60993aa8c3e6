//! What an idle keep-alive connection and a slow stream cost the gateway's heap, counted by
//! a counting global allocator around mimalloc (exact, and independent of the machine's
//! load). After one request, a connection waiting for its next one holds its two small
//! tasks and a few handles, and no buffer, no runtime timer (its keep-alive deadline and its
//! reader's park delay are coarse ones) and no TLS state. A stream between two events far
//! apart holds its request's state and bytes, and no read or write buffer. Under both
//! drivers.

mod common;

use std::alloc::{GlobalAlloc, Layout};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Duration;

use common::*;

/// Bytes allocated and not yet freed, by every thread of this process.
static LIVE: AtomicI64 = AtomicI64::new(0);

struct Counting;

// SAFETY: every call is passed on unchanged to mimalloc; the counter is only arithmetic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as i64 - l.size() as i64, Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests count one process-wide total, so they take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sends one request on a new connection and reads its whole answer (no allocation on
/// this side), leaving the connection open and idle.
fn one_request(addr: SocketAddr, raw: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(raw).expect("send");
    let mut buf = [0u8; 8192];
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).expect("read");
        assert!(n > 0, "the gateway closed the connection");
        got += n;
        let Some(end) = buf[..got].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).expect("head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().expect("length"))
            })
            .expect("content-length");
        if got >= end + 4 + len {
            return s;
        }
    }
}

#[test]
fn an_idle_keep_alive_connection_holds_under_3_kib_of_heap() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for d in drivers() {
        let ctx = driver_name(d);
        let m = mock("m", |c| c.record_requests = false);
        let g = gateway_for(d, &[&m], "");
        let raw = post("/v1/chat/completions", &[], &chat_body(false)).into_bytes();
        const WARM: usize = 100;
        const N: usize = 1000;
        let mut conns: Vec<TcpStream> = Vec::with_capacity(WARM + N);
        // Warm up: the worker's buffer sets, the upstream pool, the metrics' series.
        for _ in 0..WARM {
            conns.push(one_request(g.local_addr(), &raw));
        }
        std::thread::sleep(Duration::from_millis(500));
        let before = LIVE.load(Relaxed);
        for _ in 0..N {
            conns.push(one_request(g.local_addr(), &raw));
        }
        // Long enough for every connection's read to park (after 100 ms).
        std::thread::sleep(Duration::from_millis(1000));
        let per_conn = (LIVE.load(Relaxed) - before) as f64 / N as f64;
        eprintln!("{ctx}: {per_conn:.0} heap bytes per idle connection");
        // 1.9 KiB when written; an idle wait holding a runtime timer (640 B each) or an
        // armed 4 KiB read buffer goes over.
        assert!(
            per_conn < 3072.0,
            "{ctx}: {per_conn:.0} heap bytes per idle keep-alive connection"
        );
        assert!(per_conn > 0.0, "{ctx}: the connections are counted");
        drop(conns);
    }
}

/// Opens a stream on a new connection and reads until its first content event, leaving the
/// stream running.
fn open_stream(addr: SocketAddr, raw: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(raw).expect("send");
    let mut buf = [0u8; 4096];
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).expect("read");
        assert!(n > 0, "the stream closed early");
        got += n;
        let seen = &buf[..got];
        if seen.starts_with(b"HTTP/1.1 200") && seen.windows(9).any(|w| w == b"\"content\"") {
            return s;
        }
        assert!(got < buf.len(), "no content event in {got} bytes");
    }
}

/// Live heap bytes per stream that `n` streams opened on `addr` add, once every one is
/// between events (the engine's own share included: it runs in this process too).
fn heap_per_stream(addr: SocketAddr, raw: &[u8], n: usize) -> f64 {
    let warm: Vec<TcpStream> = (0..20).map(|_| open_stream(addr, raw)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = LIVE.load(Relaxed);
    let streams: Vec<TcpStream> = (0..n).map(|_| open_stream(addr, raw)).collect();
    std::thread::sleep(Duration::from_millis(400));
    let per = (LIVE.load(Relaxed) - before) as f64 / n as f64;
    drop(streams);
    drop(warm);
    per
}

#[test]
fn a_slow_stream_between_events_holds_under_10_kib_of_heap() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for d in drivers() {
        let ctx = driver_name(d);
        // 100 tokens 50 ms apart: every stream is still running when counted.
        let m = mock("m", |c| {
            c.record_requests = false;
            c.itl = Duration::from_millis(50);
            c.tokens = 100;
        });
        let g = gateway_for(d, &[&m], "");
        let raw = post("/v1/chat/completions", &[], &chat_body(true)).into_bytes();
        const N: usize = 200;
        let direct = heap_per_stream(m.addr(), &raw, N);
        std::thread::sleep(Duration::from_millis(300));
        let via = heap_per_stream(g.local_addr(), &raw, N);
        let per_stream = via - direct;
        eprintln!("{ctx}: {per_stream:.0} heap bytes per slow stream (engine's own {direct:.0})");
        // 8.0–8.5 KiB when written (18 KiB before streams parked their upstream reads and
        // raced coarse deadlines); a stream that keeps its 4 KiB read buffer armed between
        // events, or a request buffer sized for the read instead of the request, goes over.
        assert!(
            per_stream < 10240.0,
            "{ctx}: {per_stream:.0} heap bytes per slow stream between events"
        );
        assert!(per_stream > 0.0, "{ctx}: the streams are counted");
    }
}
