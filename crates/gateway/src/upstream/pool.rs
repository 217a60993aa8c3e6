//! The per-core keep-alive pool: idle upstream connections per target.
//!
//! Bounded idle count per target, an idle timeout, and a liveness check before reuse (a
//! non-blocking peek: a connection the upstream closed, or one with unexpected bytes
//! waiting, is discarded). Only connections whose exchange finished cleanly are ever put
//! back; the caller guarantees that. Owns idle sockets only; it is `!Send` by design.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::conn::UpstreamConn;

struct Idle {
    stream: UpstreamConn,
    since: Instant,
}

/// Per-target settings the pool needs.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    pub max_idle: usize,
    pub idle_timeout: Duration,
}

pub struct Pool {
    idle: RefCell<Vec<VecDeque<Idle>>>,
    limits: Vec<PoolLimits>,
}

impl Pool {
    pub fn new(limits: Vec<PoolLimits>) -> Self {
        let idle = limits.iter().map(|_| VecDeque::new()).collect();
        Pool {
            idle: RefCell::new(idle),
            limits,
        }
    }

    /// Takes the most recently used live connection to `target`, if any.
    pub fn take(&self, target: usize, now: Instant) -> Option<UpstreamConn> {
        let mut idle = self.idle.borrow_mut();
        let q = &mut idle[target];
        let timeout = self.limits[target].idle_timeout;
        while let Some(c) = q.pop_back() {
            if now.saturating_duration_since(c.since) < timeout && is_alive(&c.stream) {
                return Some(c.stream);
            }
        }
        None
    }

    /// Returns a connection whose exchange completed cleanly. Over the idle bound, the
    /// oldest idle connection is closed.
    pub fn put(&self, target: usize, stream: UpstreamConn, now: Instant) {
        let max = self.limits[target].max_idle;
        if max == 0 {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let q = &mut idle[target];
        if q.len() >= max {
            q.pop_front();
        }
        q.push_back(Idle { stream, since: now });
    }

    /// Closes idle connections past their timeout (called from the worker's tick).
    pub fn evict_expired(&self, now: Instant) {
        let mut idle = self.idle.borrow_mut();
        for (t, q) in idle.iter_mut().enumerate() {
            let timeout = self.limits[t].idle_timeout;
            q.retain(|c| now.saturating_duration_since(c.since) < timeout);
        }
    }

    /// Takes over `old`'s idle connections of the targets a reload left unchanged:
    /// `map[t]` is target `t`'s index in `old`'s configuration, when it is the same target.
    pub fn adopt(&self, old: &Pool, map: &[Option<usize>]) {
        let mut idle = self.idle.borrow_mut();
        let mut from = old.idle.borrow_mut();
        for (t, o) in map.iter().enumerate() {
            if let (Some(o), Some(q)) = (o, idle.get_mut(t)) {
                if let Some(src) = from.get_mut(*o) {
                    std::mem::swap(q, src);
                }
            }
        }
    }

    /// Closes every idle connection (drain).
    pub fn clear(&self) {
        for q in self.idle.borrow_mut().iter_mut() {
            q.clear();
        }
    }
}

/// A pooled connection is alive when a non-blocking peek on its TCP socket finds neither EOF
/// nor data. For TLS a waiting byte is an alert (close_notify), a late record or stray data:
/// not reusable either way, like unexpected bytes on a plaintext connection.
fn is_alive(stream: &UpstreamConn) -> bool {
    let fd = stream.as_raw_fd();
    let mut b = [0u8; 1];
    // SAFETY: fd is a valid socket owned by `stream` (directly or under its TLS session); the buffer is 1 byte of stack.
    let n = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        err.kind() == std::io::ErrorKind::WouldBlock
    } else {
        false
    }
}
