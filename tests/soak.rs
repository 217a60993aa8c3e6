//! The soak's short version (`loadtest/soak.sh` runs it for as long as asked): a real
//! gateway process under mixed load for a few seconds while an engine is killed and comes
//! back, another answers 503, a third resets its streams, clients abandon streams and the
//! configuration reloads. Nothing is lost, and the gateway's file descriptors come back to
//! their baseline once the load stops.

use std::time::Duration;

#[test]
fn a_short_soak_loses_nothing_and_returns_its_descriptors() {
    let out = std::env::temp_dir().join(format!("rolter-soak-test-{}", std::process::id()));
    let cfg = rolter_soak::SoakConfig {
        rolter: env!("CARGO_BIN_EXE_rolter").into(),
        duration: Duration::from_secs(12),
        clients: 6,
        workers: 2,
        out: out.clone(),
    };
    let r = rolter_soak::run(&cfg).expect("the soak runs");
    let md = r.markdown();
    assert_eq!(r.lost, 0, "{md}");
    assert_eq!(r.sent, r.answered + r.failed_total() + r.abandoned, "{md}");
    assert!(r.answered > r.sent / 2, "{md}");
    assert!(r.events.len() >= 8, "the whole schedule ran: {md}");
    let (start, end) = (&r.process[0], r.process.last().unwrap());
    assert!(
        end.fds <= start.fds + 4,
        "descriptors: {} at the start, {} idle at the end\n{md}",
        start.fds,
        end.fds
    );
    assert!(
        end.rss_kib < start.rss_kib + 32 * 1024,
        "resident memory grew from {} to {} KiB\n{md}",
        start.rss_kib,
        end.rss_kib
    );
    assert_eq!((end.upstream_sockets, end.client_sockets), (0, 0), "{md}");
    eprintln!("{md}");
    let _ = std::fs::remove_dir_all(out);
}
