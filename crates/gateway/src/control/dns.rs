//! Re-resolution of targets named by a host name: every `server.dns_refresh`, and soon after
//! an attempt that got no response (rate-limited to one per [`FORCED_GAP`] per target). The
//! lookups run on a resolver thread of their own, since `getaddrinfo` blocks; the control
//! thread hands it jobs and folds its answers in on the tick. A changed address set yields
//! a new address table for the workers; a failed or empty lookup keeps the last good address
//! and is logged (at most once a minute per target) and counted.
//!
//! Owns the address each target's new connections use, as the control plane knows it. It
//! must not resolve on the control thread itself or touch a worker's state: workers get the
//! table as a mesh message.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use rolter_config::Config;

use crate::metrics::dns::DnsCounts;

/// Resolves a host name and port to addresses (blocking). The system resolver in service,
/// a table in tests.
pub type ResolveFn = Arc<dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The system resolver (`getaddrinfo`, through std).
pub fn system_resolver() -> ResolveFn {
    Arc::new(|host, port| {
        use std::net::ToSocketAddrs;
        Ok((host, port).to_socket_addrs()?.collect())
    })
}

/// The shortest time between two lookups of one target asked for by failed attempts.
pub const FORCED_GAP: Duration = Duration::from_secs(5);

/// A failing target's lookups are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Once any address moved, the table is sent again this often, so a worker whose inbox was
/// full when it changed (a counted mesh drop) catches up.
pub const REPUBLISH: Duration = Duration::from_secs(5);

/// One lookup for the resolver thread: target index, host, port.
type Job = (usize, String, u16);
/// Its answer.
type Answer = (usize, io::Result<Vec<SocketAddr>>);

/// The resolver thread's ends of the channels. The thread ends when `jobs` is dropped.
struct ResolverThread {
    jobs: Sender<Job>,
    answers: Receiver<Answer>,
}

impl ResolverThread {
    fn spawn(resolve: ResolveFn) -> io::Result<ResolverThread> {
        let (jobs, job_rx) = unbounded::<Job>();
        let (answer_tx, answers) = unbounded::<Answer>();
        std::thread::Builder::new()
            .name("rolter-dns".into())
            .spawn(move || {
                for (t, host, port) in job_rx {
                    if answer_tx.send((t, resolve(&host, port))).is_err() {
                        break;
                    }
                }
            })?;
        Ok(ResolverThread { jobs, answers })
    }
}

/// What a lookup's answer did to a target's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The current address is still among the answers: nothing changes.
    Unchanged,
    /// The current address is gone: new connections use the first answer.
    Changed,
    /// An error or no address: the last good address stays.
    Failed,
}

/// One named target's resolution state.
struct Named {
    target: usize,
    name: String,
    host: String,
    port: u16,
    next_due: Instant,
    last_forced: Option<Instant>,
    pending: bool,
    counts: DnsCounts,
    /// When a failure was last logged, and failures since.
    failure_log: Option<(Instant, u64)>,
}

/// The targets' current addresses and the schedule of their lookups.
pub struct DnsBook {
    addrs: Vec<SocketAddr>,
    named: Vec<Named>,
    /// Index into `named` by target (`usize::MAX`: an IP address, never resolved).
    slot: Vec<usize>,
    refresh: Duration,
    resolve: ResolveFn,
    thread: Option<ResolverThread>,
    /// The table changed since it was last published.
    dirty: bool,
    /// When the table was last published (`None`: never, it is the load-time one).
    published: Option<Instant>,
}

impl DnsBook {
    /// The book for `config`'s targets, with the addresses resolved at load, resolving with
    /// `resolve` (started on the first lookup due).
    pub fn new(config: &Config, resolve: ResolveFn, now: Instant) -> DnsBook {
        let refresh = config.server.dns_refresh;
        let mut slot = vec![usize::MAX; config.targets.len()];
        let mut named = Vec::new();
        for (t, target) in config.targets.iter().enumerate() {
            let Some(host) = &target.dns_name else {
                continue;
            };
            if refresh.is_zero() {
                continue;
            }
            slot[t] = named.len();
            named.push(Named {
                target: t,
                name: target.name.clone(),
                host: host.clone(),
                port: target.addr.port(),
                next_due: now + refresh,
                last_forced: None,
                pending: false,
                counts: DnsCounts::default(),
                failure_log: None,
            });
        }
        DnsBook {
            addrs: config.targets.iter().map(|t| t.addr).collect(),
            named,
            slot,
            refresh,
            resolve,
            thread: None,
            dirty: false,
            published: None,
        }
    }

    /// The address target `t`'s new connections use.
    pub fn addr(&self, t: usize) -> SocketAddr {
        self.addrs[t]
    }

    fn named_mut(&mut self, t: usize) -> Option<&mut Named> {
        let i = *self.slot.get(t)?;
        self.named.get_mut(i)
    }

    /// An attempt on `t` got no response (a failed connect, a reset): look its name up
    /// again soon, at most once per [`FORCED_GAP`].
    pub fn connect_failed(&mut self, t: usize, now: Instant) {
        if let Some(n) = self.named_mut(t) {
            if n.last_forced
                .is_some_and(|at| now.saturating_duration_since(at) < FORCED_GAP)
            {
                return;
            }
            n.last_forced = Some(now);
            n.next_due = n.next_due.min(now);
        }
    }

    /// The lookups due at `now`, each marked pending until its answer is folded in.
    pub fn due(&mut self, now: Instant) -> Vec<(usize, String, u16)> {
        let mut jobs = Vec::new();
        for n in &mut self.named {
            if !n.pending && n.next_due <= now {
                n.pending = true;
                n.next_due = now + self.refresh;
                jobs.push((n.target, n.host.clone(), n.port));
            }
        }
        jobs
    }

    /// Folds one lookup's answer in.
    pub fn resolved(
        &mut self,
        t: usize,
        result: io::Result<Vec<SocketAddr>>,
        now: Instant,
    ) -> Outcome {
        let current = self.addrs[t];
        let Some(n) = self.named_mut(t) else {
            return Outcome::Unchanged;
        };
        n.pending = false;
        let outcome = match &result {
            Ok(list) if list.contains(&current) => Outcome::Unchanged,
            Ok(list) if !list.is_empty() => Outcome::Changed,
            _ => Outcome::Failed,
        };
        match outcome {
            Outcome::Unchanged => n.counts.unchanged += 1,
            Outcome::Changed => n.counts.changed += 1,
            Outcome::Failed => n.counts.failed += 1,
        }
        let (name, host) = (n.name.clone(), n.host.clone());
        match (outcome, result) {
            (Outcome::Changed, Ok(list)) => {
                n.failure_log = None;
                self.addrs[t] = list[0];
                self.dirty = true;
                tracing::info!(
                    target = %name,
                    host = %host,
                    old = %current,
                    new = %list[0],
                    "a target's host name resolves to a new address; new connections use it"
                );
            }
            (Outcome::Failed, result) => {
                let why = match result {
                    Err(e) => e.to_string(),
                    Ok(_) => "no address".to_string(),
                };
                let due = match &mut n.failure_log {
                    Some((at, since)) if now.saturating_duration_since(*at) < LOG_EVERY => {
                        *since += 1;
                        None
                    }
                    Some(entry) => {
                        let since = entry.1 + 1;
                        *entry = (now, 0);
                        Some(since)
                    }
                    None => {
                        n.failure_log = Some((now, 0));
                        Some(1)
                    }
                };
                if let Some(failures) = due {
                    tracing::warn!(
                        target = %name,
                        host = %host,
                        keeping = %current,
                        failures,
                        "resolving a target's host name failed: {why}; keeping its last good \
                         address (counted in rolter_dns_resolutions_total)"
                    );
                }
            }
            _ => n.failure_log = None,
        }
        outcome
    }

    /// The address table to send the workers: when it changed since the last call, and
    /// again every [`REPUBLISH`] once it differs from the load-time one.
    pub fn publishable(&mut self, now: Instant) -> Option<Arc<[SocketAddr]>> {
        let again = self
            .published
            .is_some_and(|at| now.saturating_duration_since(at) >= REPUBLISH);
        if !std::mem::take(&mut self.dirty) && !again {
            return None;
        }
        self.published = Some(now);
        Some(self.addrs.as_slice().into())
    }

    /// The control tick: folds the resolver's answers in, hands it the lookups due, and
    /// returns the new table when an address changed. The resolver thread starts with
    /// the first lookup.
    pub fn tick(&mut self, now: Instant) -> Option<Arc<[SocketAddr]>> {
        if self.named.is_empty() {
            return None;
        }
        let answers: Vec<Answer> = match &self.thread {
            Some(th) => th.answers.try_iter().collect(),
            None => Vec::new(),
        };
        for (t, result) in answers {
            self.resolved(t, result, now);
        }
        let jobs = self.due(now);
        if !jobs.is_empty() && self.thread.is_none() {
            match ResolverThread::spawn(self.resolve.clone()) {
                Ok(th) => self.thread = Some(th),
                Err(e) => {
                    tracing::error!("cannot start the DNS resolver thread: {e}");
                    for (t, _, _) in &jobs {
                        if let Some(n) = self.named_mut(*t) {
                            n.pending = false;
                        }
                    }
                    return self.publishable(now);
                }
            }
        }
        if let Some(th) = &self.thread {
            for job in jobs {
                // The thread outlives the book's sender; a send can only fail if it died.
                let _ = th.jobs.send(job);
            }
        }
        self.publishable(now)
    }

    /// Every named target's lookup counts, as `(target index, counts)`.
    pub fn counts(&self) -> Vec<(usize, DnsCounts)> {
        self.named.iter().map(|n| (n.target, n.counts)).collect()
    }
}

#[cfg(test)]
mod tests;
