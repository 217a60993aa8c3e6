//! Connecting: AUTH and ACL users, a killed or stopped server, reconnecting after a
//! restart, Sentinel and Cluster topologies — against real redis-server processes.

use std::sync::mpsc;
use std::time::Duration;

use rolter_store::testing::RedisServer;
use rolter_store::{Store, StoreError, StoreSettings, Topology};

/// Runs `f` on its own thread; a call that hangs fails the test instead of stalling it.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a store call hung instead of failing within its timeout")
}

fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

#[test]
fn a_password_is_required_and_accepted() {
    let server = RedisServer::with_password("s3cret");
    let mut settings = server.settings("t");
    let refused = Store::connect(&settings)
        .err()
        .expect("connected without the password");
    assert!(matches!(refused, StoreError::Auth(_)), "{refused:?}");
    assert!(refused.is_connection());
    settings.password = Some("wrong".into());
    let refused = Store::connect(&settings)
        .err()
        .expect("connected with a wrong password");
    assert!(matches!(refused, StoreError::Auth(_)), "{refused:?}");
    assert!(
        !refused.to_string().contains("wrong"),
        "the password is echoed: {refused}"
    );
    settings.password = Some("s3cret".into());
    let mut store = Store::connect(&settings).unwrap();
    assert_eq!(
        store.rotate("r", &[("a", 1.0), ("b", 1.0)], 3).unwrap(),
        [0, 1, 0]
    );

    // An ACL user, allowed the fleet's keys only.
    let mut admin = raw(&format!("redis://:s3cret@127.0.0.1:{}", server.port()));
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("rolter")
        .arg("on")
        .arg(">pw-of-rolter")
        .arg("~{t}:*")
        .arg("+@all")
        .exec(&mut admin)
        .unwrap();
    settings.username = Some("rolter".into());
    settings.password = Some("pw-of-rolter".into());
    let mut store = Store::connect(&settings).unwrap();
    assert_eq!(
        store.rotate("r", &[("a", 1.0), ("b", 1.0)], 1).unwrap(),
        [1]
    );
    settings.password = Some("s3cret".into());
    let refused = Store::connect(&settings)
        .err()
        .expect("the ACL user took another password");
    assert!(matches!(refused, StoreError::Auth(_)), "{refused:?}");
    // The same user under another fleet's prefix is refused by the ACL.
    settings.password = Some("pw-of-rolter".into());
    settings.key_prefix = "other".into();
    let mut store = Store::connect(&settings).unwrap();
    let refused = store.rotate("r", &[("a", 1.0)], 1).unwrap_err();
    assert!(matches!(refused, StoreError::Auth(_)), "{refused:?}");
}

#[test]
fn a_killed_server_fails_the_call_and_a_restarted_one_takes_a_new_connection() {
    let mut server = RedisServer::start();
    let settings = server.settings("t");
    let mut store = Store::connect(&settings).unwrap();
    let m = [("a", 1.0), ("b", 1.0), ("c", 1.0)];
    assert_eq!(store.rotate("r", &m, 2).unwrap(), [0, 1]);
    server.kill();
    let (store, err) = bounded(move || {
        let err = store.rotate("r", &m, 1).unwrap_err();
        (store, err)
    });
    assert!(err.is_connection(), "{err:?}");
    assert!(err.to_string().contains("connection lost"), "{err}");
    let mut store = store;
    // The broken connection answers every later call with the same error, at once.
    assert_eq!(store.ping().unwrap_err(), err);
    let s = settings.clone();
    let err = bounded(move || Store::connect(&s).err()).expect("connected to a dead server");
    assert!(matches!(err, StoreError::Connect(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", server.port())),
        "{err}"
    );

    server.restart();
    let mut store = Store::connect(&settings).unwrap();
    store.ping().unwrap();
    // The restarted server is empty (no persistence): the rotation starts over.
    assert_eq!(store.rotate("r", &m, 3).unwrap(), [0, 1, 2]);
}

#[test]
fn a_server_that_stops_answering_times_out_instead_of_hanging() {
    let server = RedisServer::start();
    let mut settings = server.settings("t");
    settings.command_timeout = Duration::from_millis(200);
    settings.connect_timeout = Duration::from_millis(300);
    let mut store = Store::connect(&settings).unwrap();
    store.ping().unwrap();
    server.pause();
    let (store, err) = bounded(move || {
        let err = store.rotate("r", &[("a", 1.0)], 1).unwrap_err();
        (store, err)
    });
    assert_eq!(err, StoreError::Timeout);
    let s = settings.clone();
    let err = bounded(move || Store::connect(&s).err()).expect("connected to a stopped server");
    assert!(err.is_connection(), "{err:?}");
    server.resume();
    // The late answer of the timed-out call is never read as another call's.
    let mut store = store;
    assert_eq!(store.ping().unwrap_err(), StoreError::Timeout);
    let mut store = Store::connect(&settings).unwrap();
    assert_eq!(
        store.rotate("r", &[("a", 1.0), ("b", 1.0)], 1).unwrap(),
        [0]
    );
}

#[test]
fn sentinel_names_the_master() {
    let master = RedisServer::with_password("m-pw");
    let sentinel = RedisServer::sentinel(master.port(), "main");
    let mut settings = StoreSettings::standalone(sentinel.url());
    // A sentinel that is down comes first: the next one is asked.
    settings.urls.insert(0, "redis://127.0.0.1:1".into());
    settings.topology = Topology::Sentinel {
        master: "main".into(),
    };
    settings.password = Some("m-pw".into());
    let mut store = Store::connect(&settings).unwrap();
    assert_eq!(
        store.rotate("r", &[("a", 2.0), ("b", 1.0)], 3).unwrap(),
        [0, 1, 0]
    );
    let mut direct = raw(&format!("redis://:m-pw@127.0.0.1:{}", master.port()));
    let exists: bool = redis::cmd("EXISTS")
        .arg("{rolter}:rr:r")
        .query(&mut direct)
        .unwrap();
    assert!(exists, "the rotation is not on the master");
    settings.topology = Topology::Sentinel {
        master: "nope".into(),
    };
    let err = Store::connect(&settings)
        .err()
        .expect("an unknown master was found");
    assert!(err.to_string().contains("`nope`"), "{err}");
}

#[test]
fn cluster_keeps_a_fleet_in_one_slot() {
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
        })
        .collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let created = std::process::Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli (Debian package redis-tools) creates the cluster");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    for n in &nodes {
        let mut c = raw(&n.url());
        let mut rounds = 0;
        loop {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            rounds += 1;
            assert!(rounds < 1000, "cluster never became ok: {info}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut settings = StoreSettings::standalone(nodes[0].url());
    settings.urls.push(nodes[1].url());
    settings.topology = Topology::Cluster;
    // Three fleets, whose prefixes hash to slots on the three different nodes.
    for prefix in ["fleet-a", "fleet-b", "fleet-c"] {
        settings.key_prefix = prefix.into();
        let mut store = Store::connect(&settings).unwrap();
        store.ping().unwrap();
        let m = [("a", 5.0), ("b", 1.0), ("c", 1.0)];
        assert_eq!(store.rotate("r", &m, 7).unwrap(), [0, 0, 1, 0, 2, 0, 0]);
        let rows = [rolter_store::LedgerRow {
            route: "r",
            bucket: 1,
            picks: 2,
            received: &[("e", 2)],
        }];
        store.add_ledger(&rows, Duration::from_secs(60)).unwrap();
        assert_eq!(store.read_ledger("r", 0, 3).unwrap()[0].picks, 2);
        let item = rolter_store::Item::Assigned {
            route: "r".into(),
            target: "e".into(),
            count: 1,
        };
        store
            .append_items("A", std::slice::from_ref(&item), 100)
            .unwrap();
        assert_eq!(store.read_items("B", "0", 10).unwrap().1, [item]);
        store
            .publish_load("A", &[("e", 4)], Duration::from_secs(60))
            .unwrap();
        store
            .publish_load("B", &[("e", 1)], Duration::from_secs(60))
            .unwrap();
        assert_eq!(store.read_load("A").unwrap(), [("e".to_string(), 1)]);
    }
    for n in &nodes {
        let keys: u64 = redis::cmd("DBSIZE").query(&mut raw(&n.url())).unwrap();
        assert!(keys > 0, "node {} holds no fleet", n.port());
    }
}

#[test]
fn tls_with_the_operators_ca() {
    // A CA and a server certificate for 127.0.0.1 it signed.
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rolter store test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let dir = std::env::temp_dir().join(format!("rolter-store-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();

    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca_s, cert_s, key_s) = (path(&ca), path(&cert), path(&key));
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert_s,
        "--tls-key-file",
        &key_s,
        "--tls-ca-cert-file",
        &ca_s,
        "--tls-auth-clients",
        "no",
        "--requirepass",
        "tls-pw",
    ]);
    let mut settings = StoreSettings::standalone(format!("rediss://127.0.0.1:{tls_port}"));
    settings.password = Some("tls-pw".into());
    // Without the CA, the built-in web roots do not trust the server.
    let err = Store::connect(&settings)
        .err()
        .expect("trusted an unknown CA");
    assert!(matches!(err, StoreError::Connect(_)), "{err:?}");
    settings.tls_ca_file = Some(ca.clone());
    let mut store = Store::connect(&settings).unwrap();
    assert_eq!(
        store.rotate("r", &[("a", 1.0), ("b", 1.0)], 2).unwrap(),
        [0, 1]
    );
    // The rotation is the one the plain port sees.
    let mut plain = raw(&format!("redis://:tls-pw@127.0.0.1:{}", server.port()));
    let exists: bool = redis::cmd("EXISTS")
        .arg("{rolter}:rr:r")
        .query(&mut plain)
        .unwrap();
    assert!(exists);
    settings.tls_ca_file = Some(dir.join("missing.pem"));
    let err = Store::connect(&settings)
        .err()
        .expect("a missing CA file was accepted");
    assert!(err.to_string().contains("missing.pem"), "{err}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
