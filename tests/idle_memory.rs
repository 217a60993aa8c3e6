//! What an idle keep-alive connection costs the gateway's heap, counted by a counting global
//! allocator around mimalloc (exact, and independent of the machine's load): after one
//! request, a connection waiting for its next one holds its two small tasks and a few
//! handles, and no buffer, no runtime timer (its keep-alive deadline and its reader's park
//! delay are coarse ones) and no TLS state. Under both drivers.

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
