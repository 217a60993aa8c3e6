//! Worker threads: SO_REUSEPORT listeners, one monoio runtime per thread (io_uring or
//! epoll, timers enabled), the accept loop and graceful shutdown.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::task::Poll;
use std::time::Duration;

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};
use socket2::{Domain, Protocol, Socket, Type};

use crate::conn::{self, Local};
use crate::{Driver, Shared};

/// Binds `n` listeners on the same address (SO_REUSEPORT); the first one resolves port 0.
pub(crate) fn bind(addr: SocketAddr, n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let mut out = Vec::with_capacity(n);
    let mut addr = addr;
    for _ in 0..n {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(4096)?;
        let l: std::net::TcpListener = s.into();
        addr = l.local_addr()?;
        out.push(l);
    }
    Ok(out)
}

/// Per-thread share of `max_running` (0 = unlimited).
pub(crate) fn thread_limit(max_running: usize, threads: usize, idx: usize) -> usize {
    if max_running == 0 {
        return 0;
    }
    let base = max_running / threads;
    let extra = usize::from(idx < max_running % threads);
    (base + extra).max(1)
}

/// Thread body: builds the runtime, reports the driver in use (or the build error)
/// through `ready`, then serves until shutdown. `limits`: the thread's share of each
/// data-parallel rank's `max_running`.
pub(crate) fn run_thread(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    limits: Vec<usize>,
    driver: Driver,
    ready: mpsc::Sender<io::Result<Driver>>,
) {
    let want_uring = match driver {
        Driver::IoUring => true,
        Driver::Epoll => false,
        Driver::Auto => monoio::utils::detect_uring(),
    };
    if want_uring {
        match RuntimeBuilder::<IoUringDriver>::new()
            .enable_timer()
            .build()
        {
            Ok(mut rt) => {
                let _ = ready.send(Ok(Driver::IoUring));
                rt.block_on(thread_main(listener, shared, limits));
                return;
            }
            Err(e) if driver == Driver::IoUring => {
                let _ = ready.send(Err(e));
                return;
            }
            Err(_) => {}
        }
    }
    match RuntimeBuilder::<LegacyDriver>::new().enable_timer().build() {
        Ok(mut rt) => {
            let _ = ready.send(Ok(Driver::Epoll));
            rt.block_on(thread_main(listener, shared, limits));
        }
        Err(e) => {
            let _ = ready.send(Err(e));
        }
    }
}

/// Completes with the first of two futures to finish.
async fn first<A: Future, B: Future>(a: A, b: B) {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

async fn thread_main(listener: std::net::TcpListener, shared: Arc<Shared>, limits: Vec<usize>) {
    let listener = match monoio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    let local = Rc::new(Local::new(&limits, &shared));
    let accept = async {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    monoio::spawn(conn::serve(stream, shared.clone(), local.clone()));
                }
                Err(_) => monoio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    };
    let watch = async {
        while !shared.shutdown.load(Ordering::Acquire) {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    first(accept, watch).await;
    drop(listener);
    // Close every connection so clients see EOF, and let the tasks wind down.
    local.shutdown_all();
    for _ in 0..200 {
        if local.open_conns() == 0 {
            break;
        }
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}
