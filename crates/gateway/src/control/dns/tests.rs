//! The DNS book on its own (answers fed by hand), through its resolver thread (a resolver
//! whose answers the test changes), and with a worker's upstreams: after the table moves,
//! new connections go to the new address.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolter_config::Config;

use super::*;
use crate::upstream::tls::UpstreamTls;
use crate::upstream::Upstreams;

/// A configuration with target `byname` at `http://localhost:<port>` (its load-time address
/// set to `first`) and target `byip` at an IP address.
fn config(first: SocketAddr, refresh: &str) -> Config {
    let text = format!(
        "[server]\ndns_refresh = \"{refresh}\"\n\
         [[targets]]\nname = \"byname\"\nurl = \"http://localhost:{}\"\n\
         [[targets]]\nname = \"byip\"\nurl = \"http://127.0.0.1:9\"\n",
        first.port()
    );
    let mut c = rolter_config::load_str(&text, "dns.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.targets[0].dns_name.as_deref(), Some("localhost"));
    assert_eq!(c.targets[1].dns_name, None);
    c.targets[0].addr = first;
    c
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn never() -> ResolveFn {
    Arc::new(|_, _| panic!("the book resolved on its own"))
}

fn failure() -> io::Result<Vec<SocketAddr>> {
    Err(io::Error::other("temporary failure in name resolution"))
}

#[test]
fn lookups_are_due_every_refresh_and_only_for_names() {
    let t0 = Instant::now();
    let c = config(addr("127.0.0.1:8000"), "30s");
    let mut book = DnsBook::new(&c, never(), t0);
    assert!(book.due(t0).is_empty(), "resolved at load: nothing due yet");
    let later = t0 + Duration::from_secs(30);
    assert_eq!(book.due(later), vec![(0, "localhost".to_string(), 8000)]);
    assert!(
        book.due(later).is_empty(),
        "one lookup at a time per target"
    );
    book.resolved(0, Ok(vec![addr("127.0.0.1:8000")]), later);
    assert!(book.due(later + Duration::from_secs(29)).is_empty());
    assert_eq!(book.due(later + Duration::from_secs(30)).len(), 1);

    // dns_refresh = "0s": never re-resolved.
    let c = config(addr("127.0.0.1:8000"), "0s");
    let mut book = DnsBook::new(&c, never(), t0);
    assert!(book.due(t0 + Duration::from_secs(3600)).is_empty());
    book.connect_failed(0, t0);
    assert!(book.due(t0).is_empty());
    assert!(book.counts().is_empty());
}

#[test]
fn a_new_address_is_published_and_a_failure_keeps_the_last_good_one() {
    let t0 = Instant::now();
    let old = addr("127.0.0.1:8000");
    let new = addr("127.0.0.2:8000");
    let c = config(old, "30s");
    let mut book = DnsBook::new(&c, never(), t0);

    // Still among the answers (in any position): nothing moves.
    let out = book.resolved(0, Ok(vec![addr("127.0.0.9:8000"), old]), t0);
    assert_eq!(out, Outcome::Unchanged);
    assert_eq!(book.addr(0), old);
    assert_eq!(book.publishable(t0), None);
    assert_eq!(
        book.publishable(t0 + REPUBLISH),
        None,
        "the load-time table is not re-sent"
    );

    // Gone: the first answer.
    assert_eq!(book.resolved(0, Ok(vec![new, old]), t0), Outcome::Unchanged);
    assert_eq!(book.resolved(0, Ok(vec![new]), t0), Outcome::Changed);
    assert_eq!(book.addr(0), new);
    let table = book.publishable(t0).expect("a table to publish");
    assert_eq!(&table[..], &[new, addr("127.0.0.1:9")]);
    assert_eq!(book.publishable(t0), None, "published once");
    // Sent again later, for a worker that missed it.
    assert_eq!(
        book.publishable(t0 + REPUBLISH).as_deref(),
        Some(&table[..])
    );
    assert_eq!(book.publishable(t0 + REPUBLISH), None);

    // An error or an empty answer keeps the last good address.
    assert_eq!(book.resolved(0, failure(), t0), Outcome::Failed);
    assert_eq!(book.resolved(0, Ok(Vec::new()), t0), Outcome::Failed);
    assert_eq!(book.addr(0), new);
    assert_eq!(book.publishable(t0 + REPUBLISH), None);

    let counts = book.counts();
    assert_eq!(
        counts,
        vec![(
            0,
            DnsCounts {
                unchanged: 2,
                changed: 1,
                failed: 2
            }
        )]
    );
    let names = vec!["byname".to_string(), "byip".to_string()];
    let mut out = String::new();
    crate::metrics::dns::render(&names, &counts, &mut out);
    assert!(
        out.contains("# TYPE rolter_dns_resolutions_total counter\n"),
        "{out}"
    );
    assert!(
        out.contains("rolter_dns_resolutions_total{target=\"byname\",result=\"failed\"} 2\n"),
        "{out}"
    );
    assert!(
        out.contains("rolter_dns_resolutions_total{target=\"byname\",result=\"changed\"} 1\n"),
        "{out}"
    );
    assert!(
        !out.contains("byip"),
        "an IP target is never resolved: {out}"
    );
}

#[test]
fn failed_attempts_bring_the_lookup_forward_at_most_once_per_gap() {
    let t0 = Instant::now();
    let c = config(addr("127.0.0.1:8000"), "5m");
    let mut book = DnsBook::new(&c, never(), t0);
    book.connect_failed(1, t0); // an IP address: nothing to do
    book.connect_failed(0, t0);
    assert_eq!(book.due(t0).len(), 1);
    book.resolved(0, failure(), t0);
    // Within the gap: not again.
    let soon = t0 + FORCED_GAP / 2;
    book.connect_failed(0, soon);
    assert!(book.due(soon).is_empty());
    // After it: again.
    let after = t0 + FORCED_GAP;
    book.connect_failed(0, after);
    assert_eq!(book.due(after).len(), 1);
}

/// A resolver whose answer the test sets, counting its calls.
#[derive(Clone)]
struct Scripted {
    answer: Arc<Mutex<io::Result<Vec<SocketAddr>>>>,
    calls: Arc<Mutex<Vec<(String, u16)>>>,
}

impl Scripted {
    fn new(first: SocketAddr) -> Scripted {
        Scripted {
            answer: Arc::new(Mutex::new(Ok(vec![first]))),
            calls: Arc::default(),
        }
    }

    fn set(&self, answer: io::Result<Vec<SocketAddr>>) {
        *self.answer.lock().unwrap() = answer;
    }

    fn resolver(&self) -> ResolveFn {
        let me = self.clone();
        Arc::new(move |host, port| {
            me.calls.lock().unwrap().push((host.to_string(), port));
            match &*me.answer.lock().unwrap() {
                Ok(list) => Ok(list.clone()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            }
        })
    }
}

fn lookups(book: &DnsBook) -> u64 {
    book.counts()
        .iter()
        .map(|(_, n)| n.unchanged + n.changed + n.failed)
        .sum()
}

/// One lookup through the resolver thread: a failed attempt (at `clock`, moved on past the
/// rate limit) makes it due, then the book is ticked at that same instant, so no second
/// lookup becomes due, until its answer is folded in. Returns what the ticks published.
fn one_lookup(book: &mut DnsBook, clock: &mut Instant, s: &Scripted) -> Option<Arc<[SocketAddr]>> {
    *clock += FORCED_GAP;
    book.connect_failed(0, *clock);
    let before = lookups(book);
    let calls = s.calls.lock().unwrap().len();
    let mut published = None;
    // Bounded, in case the resolver thread never answers (each wait is 1 ms of real time).
    for _ in 0..20_000 {
        if let Some(t) = book.tick(*clock) {
            published = Some(t);
        }
        if lookups(book) > before {
            assert_eq!(lookups(book), before + 1);
            assert_eq!(s.calls.lock().unwrap().len(), calls + 1, "one lookup asked");
            return published;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!(
        "the resolver thread never answered; calls {:?}",
        s.calls.lock().unwrap()
    );
}

#[test]
fn the_resolver_thread_answers_and_workers_connect_to_the_new_address() {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr_a, addr_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let c = config(addr_a, "30s");
    let scripted = Scripted::new(addr_a);
    let mut clock = Instant::now();
    let mut book = DnsBook::new(&c, scripted.resolver(), clock);

    // Same address: nothing published.
    assert_eq!(one_lookup(&mut book, &mut clock, &scripted), None);
    assert_eq!(
        scripted.calls.lock().unwrap()[0],
        ("localhost".to_string(), addr_a.port())
    );

    // The name moves to B: the table says so.
    scripted.set(Ok(vec![addr_b]));
    let table = one_lookup(&mut book, &mut clock, &scripted).expect("a new table");
    assert_eq!(table[0], addr_b);

    // A failed lookup afterwards keeps B.
    scripted.set(failure());
    let again = one_lookup(&mut book, &mut clock, &scripted);
    assert!(again.as_ref().is_none_or(|t| t[0] == addr_b), "{again:?}");
    assert_eq!(book.addr(0), addr_b);
    assert_eq!(book.counts()[0].1.failed, 1);

    // A worker's upstreams take the table: a new connection reaches B, not A.
    let config = Arc::new(c);
    let tls = Arc::new(UpstreamTls::build(&config.targets).unwrap());
    let up = Upstreams::new(config, tls);
    assert_eq!(up.addrs.get(0), addr_a);
    up.addrs.apply(&table);
    assert_eq!(up.addrs.get(0), addr_b);
    // A table of another length (another configuration) is ignored.
    up.addrs.apply(&table[..1]);
    assert_eq!(up.addrs.get(0), addr_b);
    connect_lands_on(&up, &b, &a);
}

/// Connects through `up` to target 0 under each driver this kernel has and checks `to`
/// accepted it and `not` did not.
fn connect_lands_on(up: &Upstreams, to: &TcpListener, not: &TcpListener) {
    use crate::runtime::driver::{block_on, ActiveDriver};
    not.set_nonblocking(true).unwrap();
    let mut drivers = vec![ActiveDriver::Epoll];
    if monoio::utils::detect_uring() {
        drivers.push(ActiveDriver::IoUring);
    }
    for driver in drivers {
        let local = block_on(driver, async {
            match up.connect(0).await.expect("connected") {
                crate::upstream::conn::UpstreamConn::Plain(s) => s.local_addr().unwrap(),
                crate::upstream::conn::UpstreamConn::Tls(_) => unreachable!("plaintext"),
            }
        })
        .unwrap();
        let (accepted, _) = to.accept().expect("the new address accepted");
        assert_eq!(accepted.peer_addr().unwrap(), local, "{}", driver.label());
        assert!(
            not.accept().is_err(),
            "{}: the old address got a connection",
            driver.label()
        );
    }
}
