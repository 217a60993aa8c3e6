//! The fair_catchup ledger, the routing-item stream and fleet load against a real
//! redis-server.

use std::time::Duration;

use rolter_store::testing::RedisServer;
use rolter_store::{Item, LedgerBucket, LedgerRow, Store};

/// A stream id as (ms, seq), which orders like the stream.
fn id(text: &str) -> (u64, u64) {
    let (ms, seq) = text.split_once('-').unwrap();
    (ms.parse().unwrap(), seq.parse().unwrap())
}

fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn ledger_adds_up_per_bucket_and_expires() {
    let server = RedisServer::start();
    let settings = server.settings("t");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let mut raw = raw(&server);
    let ttl = Duration::from_secs(600);
    a.add_ledger(
        &[
            LedgerRow {
                route: "r",
                bucket: 10,
                picks: 3,
                received: &[("e1", 2), ("e2", 1)],
            },
            LedgerRow {
                route: "r",
                bucket: 11,
                picks: 1,
                received: &[("e2", 1)],
            },
            LedgerRow {
                route: "other",
                bucket: 10,
                picks: 9,
                received: &[("e1", 9)],
            },
            LedgerRow {
                route: "r",
                bucket: 12,
                picks: 0,
                received: &[("e1", 0)],
            },
        ],
        ttl,
    )
    .unwrap();
    b.add_ledger(
        &[LedgerRow {
            route: "r",
            bucket: 10,
            picks: 2,
            received: &[("e2", 2)],
        }],
        ttl,
    )
    .unwrap();
    let got = b.read_ledger("r", 9, 12).unwrap();
    assert_eq!(
        got,
        vec![
            LedgerBucket {
                bucket: 10,
                picks: 5,
                received: vec![("e1".into(), 2), ("e2".into(), 3)]
            },
            LedgerBucket {
                bucket: 11,
                picks: 1,
                received: vec![("e2".into(), 1)]
            },
        ]
    );
    assert_eq!(a.read_ledger("other", 10, 10).unwrap()[0].picks, 9);
    assert!(a.read_ledger("r", 12, 11).unwrap().is_empty());
    let exists: bool = redis::cmd("EXISTS")
        .arg("{t}:fc:r:12")
        .query(&mut raw)
        .unwrap();
    assert!(!exists, "a row of zeros wrote a bucket");
    let pttl: i64 = redis::cmd("PTTL")
        .arg("{t}:fc:r:10")
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 0 && pttl <= 600_000, "ttl {pttl}");
    assert!(a
        .add_ledger(
            &[LedgerRow {
                route: "r",
                bucket: 1,
                picks: 1,
                received: &[("#", 1)]
            }],
            ttl
        )
        .is_err());
}

#[test]
fn items_reach_other_replicas_late_readers_catch_up_and_the_stream_is_trimmed() {
    // Small stream nodes, so `MAXLEN ~` trims close to the bound.
    let server = RedisServer::start_with(&["--stream-node-max-entries", "4"]);
    let settings = server.settings("t");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let mut raw = raw(&server);
    assert_eq!(a.last_item_id().unwrap(), "0-0");
    let pin = Item::SessionPin {
        route: "r".into(),
        key: 7,
        target: "e1".into(),
    };
    let prefix = Item::Prefix {
        route: "r".into(),
        target: "e2".into(),
        data: vec![1, 2, 3],
    };
    let assigned = Item::Assigned {
        route: "r".into(),
        target: "e3".into(),
        count: 4,
    };
    let id_a = a
        .append_items("A", std::slice::from_ref(&pin), 1000)
        .unwrap();
    let id_b = b
        .append_items("B", &[prefix.clone(), assigned.clone()], 1000)
        .unwrap();
    assert!(id(&id_a) < id(&id_b), "{id_a} {id_b}");

    let (last, got) = a.read_items("A", "0", 100).unwrap();
    assert_eq!(last, id_b);
    assert_eq!(
        got,
        vec![prefix.clone(), assigned.clone()],
        "A sees only B's items"
    );
    let (_, got) = b.read_items("B", "0", 100).unwrap();
    assert_eq!(got, vec![pin.clone()]);
    // Nothing new after the last id; a count bounds one read.
    assert_eq!(
        a.read_items("A", &last, 100).unwrap(),
        (last.clone(), vec![])
    );
    let (first, got) = a.read_items("C", "0", 1).unwrap();
    assert_eq!((first, got), (id_a.clone(), vec![pin.clone()]));

    // A late replica replays everything from "0"; one that starts from last_item_id sees
    // only what comes after.
    let mut c = Store::connect(&settings).unwrap();
    let (_, got) = c.read_items("C", "0", 100).unwrap();
    assert_eq!(got, vec![pin.clone(), prefix, assigned]);
    let now = c.last_item_id().unwrap();
    assert_eq!(now, id_b);
    assert!(c.read_items("C", &now, 100).unwrap().1.is_empty());
    // An entry of another format version is passed over, its id still consumed.
    let foreign: String = redis::cmd("XADD")
        .arg("{t}:items")
        .arg("*")
        .arg("v")
        .arg("2")
        .arg("o")
        .arg("Z")
        .arg("b")
        .arg("??")
        .query(&mut raw)
        .unwrap();
    a.append_items("A", std::slice::from_ref(&pin), 1000)
        .unwrap();
    let (last, got) = c.read_items("C", &now, 100).unwrap();
    assert_eq!(got, vec![pin.clone()]);
    assert!(id(&last) > id(&foreign), "{last} {foreign}");

    for _ in 0..200 {
        a.append_items("A", std::slice::from_ref(&pin), 10).unwrap();
    }
    let len: u64 = redis::cmd("XLEN").arg("{t}:items").query(&mut raw).unwrap();
    assert!(
        (10..=14).contains(&len),
        "stream length {len} after trimming to ~10"
    );
}

#[test]
fn load_sums_other_live_replicas_and_drops_expired_ones() {
    let server = RedisServer::start();
    let settings = server.settings("t");
    let mut a = Store::connect(&settings).unwrap();
    let mut raw = raw(&server);
    let long = Duration::from_secs(600);
    a.publish_load("A", &[("e1", 3), ("e2", 1)], long).unwrap();
    a.publish_load("B", &[("e1", 2)], long).unwrap();
    a.publish_load("C", &[("e2", 5), ("e3", 1)], Duration::from_millis(50))
        .unwrap();
    // C's counts may already have expired on a slow machine: wait until they have.
    let mut rounds = 0;
    while redis::cmd("EXISTS")
        .arg("{t}:load:C")
        .query::<bool>(&mut raw)
        .unwrap()
    {
        rounds += 1;
        assert!(rounds < 2000, "C's load key never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(a.read_load("A").unwrap(), vec![("e1".to_string(), 2)]);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("{t}:replicas")
        .arg(0)
        .arg(-1)
        .query(&mut raw)
        .unwrap();
    assert_eq!(
        members,
        ["A", "B"],
        "the expired replica is removed from the set"
    );
    a.publish_load("C", &[("e2", 5), ("e3", 1)], long).unwrap();
    assert_eq!(
        a.read_load("A").unwrap(),
        vec![
            ("e1".to_string(), 2),
            ("e2".to_string(), 5),
            ("e3".to_string(), 1)
        ]
    );
    assert_eq!(
        a.read_load("B").unwrap(),
        vec![
            ("e1".to_string(), 3),
            ("e2".to_string(), 6),
            ("e3".to_string(), 1)
        ]
    );
    // A new publication replaces the old counts.
    a.publish_load("B", &[], long).unwrap();
    assert_eq!(
        a.read_load("A").unwrap(),
        vec![("e2".to_string(), 5), ("e3".to_string(), 1)]
    );
}

#[test]
fn key_use_adds_up_over_replicas_per_minute_and_expires() {
    use rolter_store::KeyUse;
    let server = RedisServer::start();
    let settings = server.settings("k");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let ttl = Duration::from_secs(120);
    let row = |key: &str, requests, tokens| KeyUse {
        key: key.into(),
        requests,
        tokens,
    };
    let got = a
        .exchange_key_use(7, &[row("alpha", 2, 30), row("b:c", 1, 0)], ttl)
        .unwrap();
    assert_eq!(got, [row("alpha", 2, 30), row("b:c", 1, 0)]);
    // Another replica adds to the same minute and reads the sum; nothing to add still reads.
    let got = b.exchange_key_use(7, &[row("alpha", 1, 5)], ttl).unwrap();
    assert_eq!(got, [row("alpha", 3, 35), row("b:c", 1, 0)]);
    assert_eq!(a.exchange_key_use(7, &[], ttl).unwrap(), got);
    // Another minute is its own.
    assert!(a.exchange_key_use(8, &[], ttl).unwrap().is_empty());
    let mut raw = raw(&server);
    let pttl: i64 = redis::cmd("PTTL")
        .arg("{k}:keyuse:7")
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 0 && pttl <= 120_000, "{pttl}");
}

#[test]
fn a_watch_wakes_on_another_replicas_items_and_load_and_skips_its_own() {
    let server = RedisServer::start();
    let settings = server.settings("w");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    let pin = Item::SessionPin {
        route: "r".into(),
        key: 9,
        target: "e1".into(),
    };
    b.append_items("B#1", std::slice::from_ref(&pin), 1000)
        .unwrap();
    // A cursor taken now skips what came before.
    let mut cursor = a.watch_cursor().unwrap();
    let before = cursor.clone();
    let news = a
        .watch("A#1", "A", &mut cursor, 10, Some(Duration::from_millis(20)))
        .unwrap();
    assert!(news.entries.is_empty() && news.loads.is_empty());
    assert_eq!(cursor, before, "nothing read, nothing moved");

    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.append_items("B#1", std::slice::from_ref(&pin), 1000)
            .unwrap();
        b.publish_load("B", &[("e1", 3)], Duration::from_secs(60))
            .unwrap();
        b
    });
    let started = std::time::Instant::now();
    let news = a
        .watch("A#1", "A", &mut cursor, 10, Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the watch waited out its block instead of waking on the entry"
    );
    let mut b = writer.join().unwrap();
    let mut entries = news.entries;
    let mut loads = news.loads;
    if loads.is_empty() {
        // The load may have landed after the watch woke on the item.
        let more = a
            .watch("A#1", "A", &mut cursor, 10, Some(Duration::from_secs(1)))
            .unwrap();
        entries.extend(more.entries);
        loads.extend(more.loads);
    }
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].origin, "B#1");
    assert!(entries[0].unix_ms > 1_600_000_000_000);
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0].replica, "B");
    assert_eq!(loads[0].counts, vec![("e1".to_string(), 3)]);

    // A's own publications are skipped, the cursor still moves past them.
    a.append_items(
        "A#1",
        &[Item::SessionPin {
            route: "r".into(),
            key: 1,
            target: "e2".into(),
        }],
        1000,
    )
    .unwrap();
    a.publish_load("A", &[("e2", 1)], Duration::from_secs(60))
        .unwrap();
    let moved = cursor.clone();
    let news = a
        .watch("A#1", "A", &mut cursor, 10, Some(Duration::from_millis(20)))
        .unwrap();
    assert!(news.entries.is_empty() && news.loads.is_empty());
    assert_ne!(cursor, moved);
    // B, watching from the start, sees A's.
    let mut from_start = rolter_store::Cursor {
        items: "0".into(),
        loads: "0".into(),
    };
    let news = b.watch("B#1", "B", &mut from_start, 100, None).unwrap();
    assert_eq!(news.entries.len(), 1);
    assert_eq!(news.loads.len(), 1);
    assert_eq!(news.loads[0].replica, "A");
}

#[test]
fn a_load_appended_between_publications_reaches_the_stream_and_leaves_the_keys_alone() {
    let server = RedisServer::start();
    let settings = server.settings("al");
    let mut a = Store::connect(&settings).unwrap();
    let mut b = Store::connect(&settings).unwrap();
    b.publish_load("B", &[("e1", 1)], Duration::from_secs(60))
        .unwrap();
    let mut cursor = a.watch_cursor().unwrap();
    b.append_load("B", &[("e1", 4), ("e2", 2)]).unwrap();
    let news = a
        .watch("A#1", "A", &mut cursor, 10, Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(news.loads.len(), 1);
    assert_eq!(news.loads[0].replica, "B");
    assert_eq!(
        news.loads[0].counts,
        vec![("e1".to_string(), 4), ("e2".to_string(), 2)]
    );
    // Where a reader starts: the last publication's counts, not the appended change.
    assert_eq!(a.read_load("A").unwrap(), vec![("e1".to_string(), 1)]);
    // And the appended entry alone never makes a replica live in the keys.
    b.append_load("C", &[("e3", 7)]).unwrap();
    assert_eq!(a.read_load("A").unwrap(), vec![("e1".to_string(), 1)]);
}
