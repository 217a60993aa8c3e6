//! DNS discovery through the binary, under both drivers, against a real DNS server:
//! `dnsmasq` on a loopback port serving a hosts file the test rewrites (SIGHUP makes it read
//! it again), and mock engines on 127.0.0.2–4 at one port. A `[[targets]]` entry with
//! `discover = { dns = "vllm.test", port = P }` becomes one target per address:
//! - an added address becomes a target that starts through slow start and takes traffic,
//!   and no request fails;
//! - a removed address's target takes no new request, and its in-flight streams finish;
//! - a `consistent_hash` route moves only the keys of the changed target, and they come
//!   back when it returns;
//! - while the DNS server is down the last good set keeps serving, and the failed lookups
//!   are logged and counted; an entry that cannot be looked up at start is a config error.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::binary::Gw;
use common::process::{free_port, signal, Kill};
use common::*;
use rolter::config::discover::{lookup, DiscoverSpec};
use rolter::config::DriverChoice;
use rolter_mock::MockHandle;

const NAME: &str = "vllm.test";

/// dnsmasq answering for [`NAME`] from a hosts file.
struct Dns {
    port: u16,
    hosts: PathBuf,
    _dir: tempfile::TempDir,
    child: Option<Kill>,
    /// More dnsmasq options (SRV records).
    extra: Vec<String>,
}

impl Dns {
    fn start(addrs: &[Ipv4Addr]) -> Dns {
        Dns::start_with(addrs, Vec::new())
    }

    fn start_with(addrs: &[Ipv4Addr], extra: Vec<String>) -> Dns {
        let dir = tempfile::tempdir().unwrap();
        let mut dns = Dns {
            port: free_port(),
            hosts: dir.path().join("hosts"),
            _dir: dir,
            child: None,
            extra,
        };
        dns.write(addrs);
        dns.run();
        dns
    }

    fn nameserver(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn write(&self, addrs: &[Ipv4Addr]) {
        let text: String = addrs.iter().map(|a| format!("{a} {NAME}\n")).collect();
        std::fs::write(&self.hosts, text).unwrap();
    }

    /// Starts dnsmasq and waits until it answers with the hosts file's addresses.
    fn run(&mut self) {
        // Debian installs it in /usr/sbin, which an unprivileged PATH may not hold.
        let bin = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("dnsmasq");
        let child = Command::new(bin)
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--pid-file=",
                "--local-ttl=0",
            ])
            .arg(format!("--port={}", self.port))
            .arg(format!("--addn-hosts={}", self.hosts.display()))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq (Debian's dnsmasq-base) is installed by tests/run.sh");
        self.child = Some(Kill(child));
        self.wait_answers();
    }

    /// The addresses dnsmasq answers now, once they are those of the hosts file.
    fn wait_answers(&self) {
        let want: BTreeSet<String> = std::fs::read_to_string(&self.hosts)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        let spec = DiscoverSpec::Addresses {
            name: NAME.into(),
            port: 1,
        };
        // Without addresses in the file, its SRV records are what it serves.
        let srv = DiscoverSpec::Srv {
            name: format!("_http._tcp.{NAME}"),
        };
        wait_for(
            "dnsmasq answers the hosts file",
            Duration::from_secs(10),
            || {
                if want.is_empty() {
                    return lookup(&srv, &[self.nameserver()]).is_ok();
                }
                lookup(&spec, &[self.nameserver()]).is_ok_and(|m| {
                    m.iter().map(|m| m.host.clone()).collect::<BTreeSet<_>>() == want
                })
            },
        );
    }

    /// Rewrites the hosts file and makes dnsmasq read it again.
    fn set(&self, addrs: &[Ipv4Addr]) {
        self.write(addrs);
        let child = self.child.as_ref().expect("dnsmasq runs");
        signal(&child.0, libc::SIGHUP);
        self.wait_answers();
    }

    fn stop(&mut self) {
        self.child = None;
    }
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// Mock engines on 127.0.0.`last` for each of `lasts`, all at one port; named by address.
/// The port stays bound on 127.0.0.1 by the returned listener while the engines run, so
/// that a test picking a free port there (a gateway's listener, dnsmasq) cannot get it.
fn engines(lasts: &[u8], itl: Duration) -> (u16, (Vec<MockHandle>, std::net::TcpListener)) {
    for _ in 0..20 {
        let guard = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = guard.local_addr().unwrap().port();
        let started: Result<Vec<MockHandle>, _> = lasts
            .iter()
            .map(|&l| {
                let mut cfg = rolter_mock::MockConfig {
                    name: ip(l).to_string(),
                    listen: SocketAddr::from((ip(l), port)),
                    models: vec!["m".to_string()],
                    itl,
                    tokens: 20,
                    ..rolter_mock::MockConfig::default()
                };
                cfg.record_requests = false;
                rolter_mock::spawn(cfg)
            })
            .collect();
        if let Ok(m) = started {
            return (port, (m, guard));
        }
    }
    panic!("no port free on every loopback address");
}

/// The binary with one `discover` entry over [`NAME`] at `port` and one route.
fn gateway(driver: DriverChoice, dns: &Dns, port: u16, strategy: &str, health: &str) -> Gw {
    Gw::start(
        driver,
        2,
        &format!(
            "dns_refresh = \"1s\"\nnameservers = [\"{}\"]",
            dns.nameserver()
        ),
        &format!(
            "[health]\nactive = false\n{health}\n\n\
             [[targets]]\nname = \"vllm\"\ndiscover = {{ dns = \"{NAME}\", port = {port} }}\n\n\
             [[routes]]\nname = \"main\"\nstrategy = \"{strategy}\"\ntargets = [\"vllm\"]\n\
             [routes.match]\nmodels = [\"m\"]\n"
        ),
    )
}

fn member(last: u8, port: u16) -> String {
    format!("vllm/{}:{port}", ip(last))
}

/// The gateway's members of `vllm`, from `/admin/targets`.
fn members(g: &Gw) -> BTreeSet<String> {
    targets(g).into_keys().collect()
}

/// `/admin/targets` by name.
fn targets(g: &Gw) -> BTreeMap<String, serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_str(&g.admin_get("/admin/targets")).unwrap();
    let list = doc
        .get("targets")
        .and_then(|t| t.as_array())
        .or(doc.as_array())
        .cloned()
        .unwrap_or_default();
    list.into_iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t))
        .collect()
}

fn wait_members(g: &Gw, want: &[String], ctx: &str) {
    let want: BTreeSet<String> = want.iter().cloned().collect();
    // The admin API shows the control thread's view, which switches before the workers;
    // the members gauge is set once every worker serves with the new set.
    let gauge = "rolter_discovery_members{group=\"vllm\"}";
    wait_for(ctx, Duration::from_secs(15), || {
        members(g) == want && g.series(gauge) == Some(want.len() as f64)
    });
}

/// What the load threads saw: per target, the requests it served; and every failure.
#[derive(Default)]
struct Tally {
    served: Mutex<BTreeMap<String, u64>>,
    failures: Mutex<Vec<String>>,
}

/// `n` keep-alive clients sending requests (streams when `stream`) until `stop`.
fn load(
    addr: SocketAddr,
    n: usize,
    stream: bool,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (stop, tally) = (stop.clone(), tally.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    c.send(&post("/v1/chat/completions", &[], &chat_body(stream)));
                    match c.response() {
                        Ok(r) if r.status == 200 => {
                            if stream {
                                let events = sse_events(&r.body);
                                if events.last().map(|e| e.1.as_str()) != Some("[DONE]") {
                                    tally
                                        .failures
                                        .lock()
                                        .unwrap()
                                        .push(format!("a stream was cut: {events:?}"));
                                }
                            }
                            let t = r.header("x-rolter-target").unwrap_or("?").to_string();
                            *tally.served.lock().unwrap().entry(t).or_default() += 1;
                        }
                        Ok(r) => {
                            tally.failures.lock().unwrap().push(format!(
                                "status {}: {}",
                                r.status,
                                r.text()
                            ));
                            c = Client::connect(addr);
                        }
                        Err(e) => {
                            tally.failures.lock().unwrap().push(format!("i/o: {e}"));
                            c = Client::connect(addr);
                        }
                    }
                }
            })
        })
        .collect()
}

fn served(tally: &Tally, name: &str) -> u64 {
    tally.served.lock().unwrap().get(name).copied().unwrap_or(0)
}

#[test]
fn an_added_address_becomes_a_target_that_starts_slowly_and_no_request_fails() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (port, _engines) = engines(&[2, 3], Duration::ZERO);
        let dns = Dns::start(&[ip(2)]);
        let g = gateway(
            d,
            &dns,
            port,
            "round_robin",
            "slow_start_window = \"3s\"\nslow_start_min_weight = 0.1",
        );
        wait_members(&g, &[member(2, port)], ctx);
        let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
        let threads = load(g.addr, 4, false, &stop, &tally);
        std::thread::sleep(Duration::from_millis(300));

        dns.set(&[ip(2), ip(3)]);
        let added = Instant::now();
        wait_members(&g, &[member(2, port), member(3, port)], ctx);
        let ramp = targets(&g)[&member(3, port)]["health"]["slow_start_ramp"]
            .as_f64()
            .unwrap();
        let seen_after = added.elapsed();
        assert!(
            ramp < 1.0,
            "{ctx}: the added target starts through slow start (ramp {ramp}, {seen_after:?} \
             after the change)"
        );
        // Before the ramp ends the new target gets less than the old one; after, its share.
        let (old0, new0) = (
            served(&tally, &member(2, port)),
            served(&tally, &member(3, port)),
        );
        std::thread::sleep(Duration::from_millis(800));
        let (old1, new1) = (
            served(&tally, &member(2, port)),
            served(&tally, &member(3, port)),
        );
        wait_for("the ramp ends", Duration::from_secs(10), || {
            targets(&g)[&member(3, port)]["health"]["slow_start_ramp"].as_f64() == Some(1.0)
        });
        let (old2, new2) = (
            served(&tally, &member(2, port)),
            served(&tally, &member(3, port)),
        );
        std::thread::sleep(Duration::from_millis(800));
        let (old3, new3) = (
            served(&tally, &member(2, port)),
            served(&tally, &member(3, port)),
        );
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());

        let failures = tally.failures.lock().unwrap().clone();
        assert!(failures.is_empty(), "{ctx}: no request fails: {failures:?}");
        let early = (new1 - new0) as f64 / (old1 - old0).max(1) as f64;
        let late = (new3 - new2) as f64 / (old3 - old2).max(1) as f64;
        assert!(
            new3 > new2 && late > 0.8,
            "{ctx}: after slow start the added target takes its round-robin share ({late:.2} of \
             the old one's)"
        );
        assert!(
            early < late,
            "{ctx}: during slow start it took less ({early:.2} of the old one's) than after \
             ({late:.2})"
        );
        assert_eq!(
            g.series("rolter_discovery_members{group=\"vllm\"}"),
            Some(2.0),
            "{ctx}"
        );
        assert!(
            g.series("rolter_discovery_lookups_total{group=\"vllm\",result=\"changed\"}")
                >= Some(1.0),
            "{ctx}"
        );
        assert!(
            g.stderr().contains("discovery: the members changed"),
            "{ctx}: the change is logged:\n{}",
            g.stderr()
        );
    }
}

#[test]
fn a_removed_address_drains_its_target_without_a_failed_or_cut_request() {
    for d in drivers() {
        let ctx = driver_name(d);
        // 20 tokens 40 ms apart: each stream lasts about 0.8 s.
        let (port, _engines) = engines(&[2, 3], Duration::from_millis(40));
        let dns = Dns::start(&[ip(2), ip(3)]);
        let g = gateway(d, &dns, port, "round_robin", "");
        wait_members(&g, &[member(2, port), member(3, port)], ctx);
        let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
        let threads = load(g.addr, 6, true, &stop, &tally);
        wait_for("streams on both targets", Duration::from_secs(10), || {
            served(&tally, &member(3, port)) >= 2 && served(&tally, &member(2, port)) >= 2
        });

        dns.set(&[ip(2)]);
        wait_members(&g, &[member(2, port)], ctx);
        // Streams picked before the workers switched (the admin API shows the control
        // thread's view, which switches first) may still finish on the removed target.
        std::thread::sleep(Duration::from_millis(2000));
        let removed_before = served(&tally, &member(3, port));
        let kept_before = served(&tally, &member(2, port));
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        threads.into_iter().for_each(|t| t.join().unwrap());

        let failures = tally.failures.lock().unwrap().clone();
        assert!(
            failures.is_empty(),
            "{ctx}: no request fails and no stream is cut: {failures:?}"
        );
        assert_eq!(
            served(&tally, &member(3, port)),
            removed_before,
            "{ctx}: the removed target takes no new request"
        );
        assert!(
            served(&tally, &member(2, port)) > kept_before,
            "{ctx}: the remaining target serves"
        );
    }
}

/// The target that served one chat request with `headers` and `body` (which must succeed).
fn served_by(g: &Gw, headers: &[(&str, &str)], body: &str) -> String {
    let r = call(g.addr, &post("/v1/chat/completions", headers, body));
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-rolter-target").unwrap().to_string()
}

/// The targets that served `n` plain requests.
fn targets_serving(g: &Gw, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| served_by(g, &[], &chat_body(false)))
        .collect()
}

/// Checks that between `before` and `after` (each item's target) only the items of
/// `removed` moved, and that they left it; `what` names an item in messages.
fn only_removed_moved(before: &[String], after: &[String], removed: &str, what: &str) {
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if b == removed {
            assert_ne!(a, removed, "{what} {i} left the removed target");
        } else {
            assert_eq!(a, b, "{what} {i} of a kept target stays where it was");
        }
    }
}

/// Which target serves each of `keys` (as `x-session-id`).
fn owners(g: &Gw, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|k| served_by(g, &[("x-session-id", k.as_str())], &chat_body(false)))
        .collect()
}

#[test]
fn a_consistent_hash_route_moves_only_the_changed_targets_keys() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (port, _engines) = engines(&[2, 3, 4], Duration::ZERO);
        let dns = Dns::start(&[ip(2), ip(3), ip(4)]);
        let g = gateway(d, &dns, port, "consistent_hash", "");
        let all = [member(2, port), member(3, port), member(4, port)];
        wait_members(&g, &all, ctx);
        let keys: Vec<String> = (0..90).map(|i| format!("session-{i}")).collect();
        let before = owners(&g, &keys);
        let owned: BTreeSet<&String> = before.iter().collect();
        assert_eq!(owned.len(), 3, "{ctx}: every target owns keys: {owned:?}");

        dns.set(&[ip(2), ip(3)]);
        wait_members(&g, &all[..2], ctx);
        let without = owners(&g, &keys);
        only_removed_moved(&before, &without, &all[2], &format!("{ctx}: key"));

        dns.set(&[ip(2), ip(3), ip(4)]);
        wait_members(&g, &all, ctx);
        let back = owners(&g, &keys);
        assert_eq!(
            back, before,
            "{ctx}: the returning target (same name) gets its keys back, and only those"
        );
    }
}

/// Which target serves each conversation of `prompts` (no session header: the prefix
/// decides).
fn prompt_owners(g: &Gw, prompts: &[String]) -> Vec<String> {
    prompts
        .iter()
        .map(|p| {
            let body = serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": p}],
            });
            served_by(g, &[], &body.to_string())
        })
        .collect()
}

#[test]
fn a_cache_aware_route_keeps_the_prefixes_of_the_targets_that_stay() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (port, _engines) = engines(&[2, 3, 4], Duration::ZERO);
        let dns = Dns::start(&[ip(2), ip(3), ip(4)]);
        let g = gateway(d, &dns, port, "cache_aware", "");
        let all = [member(2, port), member(3, port), member(4, port)];
        wait_members(&g, &all, ctx);
        let prompts: Vec<String> = (0..30)
            .map(|i| {
                format!(
                    "conversation {i}: {}",
                    "a long shared system prompt ".repeat(20)
                )
            })
            .collect();
        let before = prompt_owners(&g, &prompts);
        let owned: BTreeSet<&String> = before.iter().collect();
        assert_eq!(owned.len(), 3, "{ctx}: new prompts spread: {owned:?}");

        dns.set(&[ip(2), ip(3)]);
        wait_members(&g, &all[..2], ctx);
        let after = prompt_owners(&g, &prompts);
        // A kept target's conversation stays where its prefix is warm: the kept targets'
        // prefixes carried over.
        only_removed_moved(&before, &after, &all[2], &format!("{ctx}: conversation"));
    }
}

#[test]
fn a_dns_outage_keeps_the_last_good_set_logged_and_counted() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (port, _engines) = engines(&[2, 3, 4], Duration::ZERO);
        let mut dns = Dns::start(&[ip(2), ip(3)]);
        let g = gateway(d, &dns, port, "round_robin", "");
        let two = [member(2, port), member(3, port)];
        wait_members(&g, &two, ctx);

        dns.stop();
        let failed = "rolter_discovery_lookups_total{group=\"vllm\",result=\"failed\"}";
        wait_for("two failed lookups", Duration::from_secs(20), || {
            g.series(failed) >= Some(2.0)
        });
        assert_eq!(members(&g), two.iter().cloned().collect(), "{ctx}");
        let seen = targets_serving(&g, 20);
        assert_eq!(
            seen,
            two.iter().cloned().collect(),
            "{ctx}: the last good set serves"
        );
        assert_eq!(
            g.series("rolter_discovery_members{group=\"vllm\"}"),
            Some(2.0),
            "{ctx}"
        );
        let log = g.stderr();
        assert_eq!(
            log.matches("discovery: a lookup failed").count(),
            1,
            "{ctx}: the first failure is logged, and the next ones only counted within a \
             minute:\n{log}"
        );

        // The server comes back with another set: it is taken.
        dns.write(&[ip(2), ip(3), ip(4)]);
        dns.run();
        wait_members(
            &g,
            &[member(2, port), member(3, port), member(4, port)],
            ctx,
        );
    }
}

#[test]
fn srv_records_become_targets_at_their_ports() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (port_a, _a) = engines(&[2], Duration::ZERO);
        let (port_b, _b) = engines(&[3], Duration::ZERO);
        let dns = Dns::start_with(
            &[],
            vec![
                format!("--srv-host=_http._tcp.{NAME},a.{NAME},{port_a},0,100"),
                format!("--srv-host=_http._tcp.{NAME},b.{NAME},{port_b},0,100"),
                format!("--host-record=a.{NAME},{}", ip(2)),
                format!("--host-record=b.{NAME},{}", ip(3)),
            ],
        );
        let g = Gw::start(
            d,
            2,
            &format!("nameservers = [\"{}\"]", dns.nameserver()),
            &format!(
                "[[targets]]\nname = \"pool\"\ndiscover = {{ srv = \"_http._tcp.{NAME}\" }}\n"
            ),
        );
        let want: BTreeSet<String> = [
            format!("pool/a.{NAME}:{port_a}"),
            format!("pool/b.{NAME}:{port_b}"),
        ]
        .into();
        assert_eq!(members(&g), want, "{ctx}");
        let seen = targets_serving(&g, 10);
        assert_eq!(seen, want, "{ctx}: both records' engines serve");
    }
}

#[test]
fn an_entry_that_cannot_be_looked_up_at_start_is_a_config_error() {
    let dns = Dns::start(&[ip(2)]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rolter.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nnameservers = [\"{}\"]\n\n\
             [[targets]]\nname = \"vllm\"\ndiscover = {{ dns = \"missing.test\", port = 8000 }}\n",
            free_port(),
            dns.nameserver()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rolter"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("targets[0].discover") && err.contains("missing.test"),
        "the error names the key and the name: {err}"
    );
}
