//! Half the fleet down, then restarted: with two of four engines stopped every client
//! request is still answered (refused connections are retried, the stopped engines are
//! ejected), and once the engines are restarted on their addresses they serve their share
//! again (both drivers).

mod common;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rolter_mock::{MockConfig, MockHandle};

fn engine(name: &str, listen: SocketAddr) -> MockHandle {
    rolter_mock::spawn(MockConfig {
        name: name.into(),
        listen,
        models: vec!["m".into()],
        record_requests: true,
        ..MockConfig::default()
    })
    .expect("spawn mock engine")
}

fn served_by(addr: SocketAddr, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| explained(addr, &chat_body(false)).target)
        .collect()
}

#[test]
fn half_the_fleet_down_fails_no_request_and_restarted_engines_serve_again() {
    for d in drivers() {
        let addrs: Vec<SocketAddr> = (0..4)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], process::free_port())))
            .collect();
        let mut engines: Vec<Option<MockHandle>> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Some(engine(&format!("e{i}"), *a)))
            .collect();
        let mut rest = String::new();
        for (i, a) in addrs.iter().enumerate() {
            rest.push_str(&target(
                &format!("t{i}"),
                *a,
                "[targets.timeouts]\nconnect = \"300ms\"",
            ));
        }
        rest.push_str("[[routes]]\nname = \"r\"\ntargets = [\"t0\", \"t1\", \"t2\", \"t3\"]\nretries = 3\nstrategy = \"round_robin\"\n[health]\nactive = false\nfailures = 2\nejection_time = \"500ms\"\nmax_ejection_time = \"500ms\"\n");
        let g = gateway_with(d, 2, &rest);
        let before = served_by(g.local_addr(), 8);
        assert!(before.iter().any(|t| t == "t3"), "{before:?}");
        // Half the fleet goes away.
        for e in engines.iter_mut().take(2) {
            e.take().unwrap().shutdown();
        }
        let during = served_by(g.local_addr(), 40);
        assert!(
            during.iter().all(|t| t == "t2" || t == "t3"),
            "under {}: {during:?}",
            driver_name(d)
        );
        // Restarted on the same addresses: back in rotation once the ejection is over.
        for (i, e) in engines.iter_mut().enumerate().take(2) {
            *e = Some(engine(&format!("e{i}"), addrs[i]));
        }
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let after = served_by(g.local_addr(), 8);
            if after.iter().any(|t| t == "t0") && after.iter().any(|t| t == "t1") {
                break;
            }
            assert!(
                Instant::now() < end,
                "the restarted engines never served: {after:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // What each upstream saw: the restarted engines received requests after restarting.
        for e in engines.iter().take(2) {
            assert!(!e.as_ref().unwrap().requests().is_empty());
        }
    }
}
