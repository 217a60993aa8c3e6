//! The shared smooth weighted rotation against a real redis-server: exact across
//! connections, nginx's sequence, leases, membership changes, NOSCRIPT recovery.

use std::collections::HashMap;

use rolter_store::testing::RedisServer;
use rolter_store::{swrr_reference, RotateAsk, Store};

fn letters(picks: &[u16]) -> String {
    picks.iter().map(|&i| (b'a' + i as u8) as char).collect()
}

fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn equal_weights_rotate_exactly_across_two_connections() {
    let server = RedisServer::start();
    let settings = server.settings("t");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let m = [("x", 1.0), ("y", 1.0), ("z", 1.0)];
    let mut picks = Vec::new();
    for i in 0..300 {
        let store = if i % 2 == 0 { &mut a } else { &mut b };
        picks.extend(store.rotate("chat", &m, 1).unwrap());
    }
    assert_eq!(picks.len(), 300);
    for w in picks.windows(3) {
        let mut w = w.to_vec();
        w.sort();
        assert_eq!(
            w,
            [0, 1, 2],
            "a window of three picks repeats a member: {picks:?}"
        );
    }
    let mut reference = HashMap::new();
    assert_eq!(picks, swrr_reference(&mut reference, &m, 300));
}

#[test]
fn five_one_one_is_nginx_sequence_and_never_five_in_a_row() {
    let server = RedisServer::start();
    let settings = server.settings("t");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let m = [("a", 5.0), ("b", 1.0), ("c", 1.0)];
    let mut picks = Vec::new();
    for i in 0..700 {
        let store = if i % 3 == 0 { &mut a } else { &mut b };
        picks.extend(store.rotate("r", &m, 1).unwrap());
    }
    let s = letters(&picks);
    assert!(s.starts_with("aabacaa"), "{s}");
    assert_eq!(s, "aabacaa".repeat(100));
    assert!(!s.contains("aaaaa"));
}

#[test]
fn one_lease_returns_the_whole_sequence_in_one_call() {
    let server = RedisServer::start();
    let mut store = Store::connect(&server.settings("t")).unwrap();
    let m = [("a", 5.0), ("b", 1.0), ("c", 1.0)];
    assert_eq!(letters(&store.rotate("r", &m, 7).unwrap()), "aabacaa");
    // A full cycle leaves every current weight at zero: the next lease repeats it.
    assert_eq!(letters(&store.rotate("r", &m, 7).unwrap()), "aabacaa");
    // Leases of different sizes split one sequence.
    let mut split = store.rotate("r", &m, 3).unwrap();
    split.extend(store.rotate("r", &m, 4).unwrap());
    assert_eq!(letters(&split), "aabacaa");
    assert!(store.rotate("r", &m, 0).unwrap().is_empty());
    assert!(store.rotate("r", &[], 5).unwrap().is_empty());
}

#[test]
fn members_left_out_keep_their_weight_and_state_matches_the_reference() {
    let server = RedisServer::start();
    let mut store = Store::connect(&server.settings("t")).unwrap();
    let mut raw = raw(&server);
    // Weights that are not integers, so current weights need all 17 digits.
    let all = [("a", 0.3), ("b", 1.7), ("c", 2.9)];
    let without_b = [("a", 0.3), ("c", 2.9)];
    let mut reference = HashMap::new();
    let plan: [(&[(&str, f64)], u32); 5] = [
        (&all, 4),
        (&without_b, 5),
        (&all, 3),
        (&without_b, 1),
        (&all, 11),
    ];
    for (members, lease) in plan {
        let before_b: Option<String> = redis::cmd("HGET")
            .arg("{t}:rr:r")
            .arg("b")
            .query(&mut raw)
            .unwrap();
        let got = store.rotate("r", members, lease).unwrap();
        assert_eq!(got, swrr_reference(&mut reference, members, lease));
        let stored: HashMap<String, String> = redis::cmd("HGETALL")
            .arg("{t}:rr:r")
            .query(&mut raw)
            .unwrap();
        for (name, text) in &stored {
            assert_eq!(
                text.parse::<f64>().unwrap(),
                reference[name],
                "member {name}"
            );
        }
        if members.len() == 2 {
            assert_eq!(
                stored.get("b"),
                before_b.as_ref(),
                "b was left out, yet changed"
            );
        }
    }
    let ttl: i64 = redis::cmd("PTTL").arg("{t}:rr:r").query(&mut raw).unwrap();
    assert!(ttl > 0 && ttl <= 24 * 3600 * 1000, "ttl {ttl}");
}

#[test]
fn many_rotations_in_one_pipeline_and_after_a_script_flush() {
    let server = RedisServer::start();
    let mut store = Store::connect(&server.settings("t")).unwrap();
    let mut raw = raw(&server);
    let m1 = [("a", 5.0), ("b", 1.0), ("c", 1.0)];
    let m2 = [("p", 1.0), ("q", 1.0)];
    let asks = [
        RotateAsk {
            route: "one",
            members: &m1,
            lease: 4,
        },
        RotateAsk {
            route: "empty",
            members: &[],
            lease: 4,
        },
        RotateAsk {
            route: "two",
            members: &m2,
            lease: 3,
        },
    ];
    let got = store.rotate_many(&asks).unwrap();
    assert_eq!(got, vec![vec![0, 0, 1, 0], vec![], vec![0, 1, 0]]);
    // The server forgets its scripts (a restart, a failover, SCRIPT FLUSH): the calls that
    // answered NOSCRIPT are sent again, once, and the rotation goes on where it was.
    redis::cmd("SCRIPT").arg("FLUSH").exec(&mut raw).unwrap();
    let got = store.rotate_many(&asks).unwrap();
    assert_eq!(got, vec![vec![2, 0, 0, 0], vec![], vec![1, 0, 1]]);
    redis::cmd("SCRIPT").arg("FLUSH").exec(&mut raw).unwrap();
    assert_eq!(store.rotate("two", &m2, 1).unwrap(), vec![0]);
}
