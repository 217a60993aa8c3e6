//! Admission under overload (`rolter-sim admission`): priority classes keep interactive
//! requests fast at twice the fleet's capacity, fair queueing shares the fleet between
//! backlogged tenants (refunds keep a flood at its share, displacement within a class
//! does it with a small queue), and deadlines bound the wait. Every run is deterministic
//! by its seed and simulates 60 s in well under a second.

use rolter_sim::admission::cli::{run_admission, AdmissionArgs, AdmissionReport};
use rolter_sim::admission::metrics::ClassStats;
use rolter_sim::admission::{AdmissionResult, Mode};

fn report(
    scenario: &str,
    queue_max: &str,
    seed: u64,
    edit: impl Fn(&mut AdmissionArgs),
) -> AdmissionReport {
    let mut args = AdmissionArgs {
        scenarios: scenario.into(),
        queue_max: queue_max.into(),
        seed,
        threads: Some(2),
        ..AdmissionArgs::default()
    };
    edit(&mut args);
    run_admission(&args, &|_| {}).expect("valid settings")
}

fn result(r: &AdmissionReport, mode: Mode) -> &AdmissionResult {
    r.results.iter().find(|x| x.mode == mode).expect("mode ran")
}

fn class<'a>(r: &'a AdmissionResult, name: &str) -> &'a ClassStats {
    r.classes.iter().find(|c| c.name == name).expect("class")
}

#[test]
fn classes_cut_interactive_p99_at_twice_the_capacity() {
    for seed in [1, 2, 3] {
        let rep = report("classes", "64", seed, |_| {});
        let (fifo, adm) = (result(&rep, Mode::Fifo), result(&rep, Mode::Admission));
        let offered = fifo.offered_per_s / fifo.capacity_per_s;
        assert!(
            (1.9..2.1).contains(&offered),
            "seed {seed}: offered {offered:.2}× capacity"
        );
        let (fi, ai) = (class(fifo, "interactive"), class(adm, "interactive"));
        let (fb, ab) = (class(fifo, "batch"), class(adm, "batch"));
        assert!(
            ai.ttft_p99_ms < 0.1 * fi.ttft_p99_ms,
            "seed {seed}: interactive p99 {:.0} ms with classes, {:.0} ms FIFO",
            ai.ttft_p99_ms,
            fi.ttft_p99_ms
        );
        // FIFO treats both classes alike and refuses interactive requests at the door;
        // with classes every interactive request is served and batch pays.
        assert!(
            (fi.ttft_p99_ms / fb.ttft_p99_ms - 1.0).abs() < 0.1,
            "seed {seed}"
        );
        assert!(fi.refused > 0 && ai.served == ai.offered, "seed {seed}");
        assert!(
            ab.ttft_p50_ms > fb.ttft_p50_ms && ab.served < fb.served,
            "seed {seed}"
        );
        // A full queue gives batch waiters' seats to batch arrivals tagged before them
        // and to interactive ones that find no place; no interactive waiter is displaced,
        // and FIFO never displaces.
        assert!(
            adm.displaced > 0 && ab.displaced == adm.displaced,
            "seed {seed}"
        );
        assert_eq!(fifo.displaced, 0);
    }
}

#[test]
fn fair_queueing_shares_a_deep_queue_between_backlogged_tenants() {
    for seed in [1, 2, 3] {
        let rep = report("tenants", "1024", seed, |_| {});
        let (fifo, fair) = (result(&rep, Mode::Fifo), result(&rep, Mode::Admission));
        // Every tenant asks for more than an equal share of what is served (the light
        // ones by about a tenth), so equal shares are the max-min fair answer.
        let served: u64 = fair.tenants.iter().map(|t| t.served).sum();
        for t in &fair.tenants {
            assert!(
                t.offered as f64 > 1.05 * served as f64 / 3.0,
                "seed {seed}: {} asks {} of {served}",
                t.name,
                t.offered
            );
        }
        // Near equal, not exact: a timed-out waiter's refund lowers its tenant's last tag
        // below tags its other waiters hold, so the shares drift (heavy 40-44 %).
        assert!(
            fair.jain >= 0.93,
            "seed {seed}: Jain {:.3} with fair queueing",
            fair.jain
        );
        for t in &fair.tenants {
            assert!(
                (0.22..0.5).contains(&t.share),
                "seed {seed}: {} {:.3}",
                t.name,
                t.share
            );
        }
        assert!(fifo.jain < 0.6, "seed {seed}: Jain {:.3} FIFO", fifo.jain);
        assert!(
            fifo.tenants[0].share > 0.75,
            "seed {seed}: FIFO serves by arrival"
        );
    }
}

#[test]
fn refunds_keep_a_flooding_tenant_at_its_share_when_the_others_ask_more() {
    // Each light tenant asks half the capacity. Without refunds the flood's timed-out
    // waiters kept their tags, its tags ran ahead at its arrival rate and it got what the
    // light tenants left (3-4 %); given back, it competes at its share again.
    for seed in [1, 2, 3] {
        let rep = report("tenants", "1024", seed, |a| a.tenant_share = 0.5);
        let fair = result(&rep, Mode::Admission);
        assert!(fair.jain >= 0.95, "seed {seed}: Jain {:.3}", fair.jain);
        assert!(
            fair.tenants[0].share > 0.2,
            "seed {seed}: heavy {:.3}",
            fair.tenants[0].share
        );
        for t in &fair.tenants[1..] {
            assert!(
                t.share < 0.42 && (t.served as f64) < 0.9 * t.offered as f64,
                "seed {seed}: {} {:.3}, {} of {}",
                t.name,
                t.share,
                t.served,
                t.offered
            );
        }
    }
}

#[test]
fn displacement_within_the_class_makes_a_small_queue_fair() {
    // A full queue of the flood's waiters gives its latest waiter's seat to a light
    // tenant's newcomer (its tag is earlier), so a queue far smaller than the offered
    // rate × queue_timeout shares the fleet too, where FIFO's shares follow arrivals.
    for seed in [1, 2, 3] {
        let rep = report("tenants", "64", seed, |_| {});
        let (fifo, fair) = (result(&rep, Mode::Fifo), result(&rep, Mode::Admission));
        assert!(
            fair.displaced > 0 && fair.refused > fair.requests / 2,
            "seed {seed}"
        );
        assert!(
            fair.jain >= 0.98 && fifo.jain < 0.6,
            "seed {seed}: Jain {:.3} fair, {:.3} FIFO",
            fair.jain,
            fifo.jain
        );
        assert!(fair.jain > fifo.jain + 0.3, "seed {seed}");
        for t in &fair.tenants {
            assert!(
                (t.share - 1.0 / 3.0).abs() < 0.05,
                "seed {seed}: {} {:.3}",
                t.name,
                t.share
            );
        }
        assert_eq!(fifo.displaced, 0);
    }
}

#[test]
fn deadlines_bound_the_wait_with_504s_and_fifo_ignores_them() {
    let rep = report("classes", "64", 1, |a| a.deadline_ms = "batch=1000".into());
    let (fifo, adm) = (result(&rep, Mode::Fifo), result(&rep, Mode::Admission));
    let batch = class(adm, "batch");
    assert!(batch.deadline > 0 && batch.timed_out == 0);
    assert!(batch.wait_p99_ms <= 1000.0, "{}", batch.wait_p99_ms);
    assert_eq!(class(adm, "interactive").deadline, 0);
    assert_eq!(fifo.deadline, 0);
}

#[test]
fn a_run_is_a_function_of_its_seed() {
    let a = report("classes,tenants", "64", 5, |_| {});
    let b = report("classes,tenants", "64", 5, |a| a.threads = Some(1));
    assert_eq!(a.to_json(), b.to_json());
    let c = report("classes,tenants", "64", 6, |_| {});
    assert_ne!(a.to_json(), c.to_json());
}
