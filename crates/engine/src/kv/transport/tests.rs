use super::*;

#[test]
fn splits_messages_and_rejects_malformed_ones() {
    let ok = vec![b"kv@a".to_vec(), 7u64.to_be_bytes().to_vec(), vec![0x90]];
    assert_eq!(split_message(ok), Some((b"kv@a".to_vec(), 7, vec![0x90])));
    assert_eq!(split_message(vec![vec![], vec![0; 8]]), None);
    assert_eq!(split_message(vec![vec![], vec![0; 4], vec![]]), None);
    assert_eq!(split_message(vec![vec![]; 4]), None);
}

#[test]
fn parses_replay_replies_with_and_without_topic() {
    let seq = 5u64.to_be_bytes().to_vec();
    match split_reply(vec![vec![], seq.clone(), b"p".to_vec()]) {
        Some(Reply::Frame(t, 5, p)) => assert!(t.is_empty() && p == b"p"),
        _ => panic!("bare reply"),
    }
    match split_reply(vec![vec![], b"t".to_vec(), seq, b"p".to_vec()]) {
        Some(Reply::Frame(t, 5, p)) => assert!(t == b"t" && p == b"p"),
        _ => panic!("reply with topic"),
    }
    let end = END_SEQ.to_be_bytes().to_vec();
    assert!(matches!(
        split_reply(vec![vec![], end.clone(), vec![]]),
        Some(Reply::End)
    ));
    assert!(matches!(
        split_reply(vec![vec![], vec![], end, vec![]]),
        Some(Reply::End)
    ));
    assert!(split_reply(vec![vec![], vec![1, 2], vec![]]).is_none());
    assert!(split_reply(vec![vec![]]).is_none());
}

#[test]
fn counts_gaps_and_resets() {
    let base = Instant::now();
    let c = Counters::default();
    for seq in [0, 1, 2, 5, 6, 10, 3] {
        c.note_live(seq, base, base);
    }
    let s = c.snapshot(4, base);
    assert_eq!((s.gaps, s.missed, s.seq_resets), (2, 2 + 3, 1));
    assert_eq!(s.last_seq, Some(3));
    assert_eq!(s.last_message, Some(base));
    assert_eq!(s.target, 4);
    assert_eq!(Counters::default().snapshot(0, base).last_seq, None);
}

#[test]
fn endpoint_config_rejects_unknown_fields() {
    let ep: KvEventsEndpoint = toml::from_str("endpoint = \"tcp://h:5557\"").unwrap();
    assert_eq!(ep.topic, "");
    assert_eq!(ep.replay_endpoint, None);
    assert!(toml::from_str::<KvEventsEndpoint>("endpoint = \"x\"\nhwm = 3").is_err());
}

/// A PUB and a ROUTER in this process, speaking vLLM's protocol.
fn publisher(ctx: &zmq::Context) -> (zmq::Socket, String, zmq::Socket, String) {
    let pubs = ctx.socket(zmq::PUB).unwrap();
    pubs.bind("tcp://127.0.0.1:*").unwrap();
    let pub_ep = pubs.get_last_endpoint().unwrap().unwrap();
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.bind("tcp://127.0.0.1:*").unwrap();
    let router_ep = router.get_last_endpoint().unwrap().unwrap();
    (pubs, pub_ep, router, router_ep)
}

fn serve_replay(router: &zmq::Socket, buffer: &[(u64, Vec<u8>)]) {
    let req = router.recv_multipart(0).unwrap();
    assert_eq!(req.len(), 3, "[identity, empty, start]");
    let start = u64::from_be_bytes(req[2].as_slice().try_into().unwrap());
    for (seq, p) in buffer.iter().filter(|(s, _)| *s >= start) {
        let msg: [&[u8]; 4] = [&req[0], b"", &seq.to_be_bytes(), p];
        router.send_multipart(msg, 0).unwrap();
    }
    let end: [&[u8]; 4] = [&req[0], b"", &END_SEQ.to_be_bytes(), b""];
    router.send_multipart(end, 0).unwrap();
}

#[test]
fn subscribes_counts_malformed_and_replays() {
    let ctx = zmq::Context::new();
    let (pubs, pub_ep, router, router_ep) = publisher(&ctx);
    let (t, rx) = KvTransport::start(
        vec![(
            3,
            KvEventsEndpoint {
                endpoint: pub_ep,
                replay_endpoint: Some(router_ep),
                topic: "kv@".into(),
            },
        )],
        KvTransportOptions::default(),
    )
    .unwrap();
    // Slow joiner: publish probes until the subscription is in place.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "subscription never arrived");
        pubs.send_multipart([&b"kv@probe"[..], &[0u8; 8], b""], 0)
            .unwrap();
        if rx.recv_timeout(Duration::from_millis(20)).is_ok() {
            break;
        }
    }
    while rx.try_recv().is_ok() {}
    // The connection is noted from the socket's monitor events, which may come after the
    // first frame: wait for it rather than read it at once.
    loop {
        let s = t.stats()[0].clone();
        if s.connected && s.connects >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "connected never noted: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }

    pubs.send_multipart([&b"other"[..], &1u64.to_be_bytes(), b"x"], 0)
        .unwrap(); // filtered by topic
    pubs.send_multipart([&b"kv@a"[..], &[1, 2, 3]], 0).unwrap(); // malformed
    for seq in [1u64, 2, 4] {
        pubs.send_multipart([&b"kv@a"[..], &seq.to_be_bytes(), &[seq as u8]], 0)
            .unwrap();
    }
    let got: Vec<KvFrame> = (0..3)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got.iter().map(|f| f.seq).collect::<Vec<_>>(), [1, 2, 4]);
    assert!(got
        .iter()
        .all(|f| f.target == 3 && !f.replayed && f.topic == b"kv@a"));
    assert_eq!(got[2].payload, [4]);
    let s = t.stats()[0].clone();
    assert_eq!(s.malformed, 1);
    assert_eq!(s.last_seq, Some(4));
    assert_eq!((s.gaps, s.missed), (1, 1));
    assert!(s.last_message.is_some());

    // Replay through the thread.
    let buffer: Vec<(u64, Vec<u8>)> = (0..5u64).map(|s| (s, vec![s as u8; 3])).collect();
    t.request_replay(3, 3);
    serve_replay(&router, &buffer);
    let replayed: Vec<KvFrame> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert!(replayed.iter().all(|f| f.replayed));
    assert_eq!(replayed.iter().map(|f| f.seq).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(replayed[1].payload, vec![4u8; 3]);
    let end = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((end.seq, end.replayed), (END_SEQ, true));
    assert!(end.payload.is_empty());
    std::thread::sleep(Duration::from_millis(60));
    let s = t.stats()[0].clone();
    assert_eq!((s.replays, s.replayed, s.replay_failures), (1, 2, 0));

    let started = Instant::now();
    t.stop();
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[test]
fn blocking_replay_returns_the_range_and_times_out() {
    let ctx = zmq::Context::new();
    let (_pubs, _pub_ep, router, router_ep) = publisher(&ctx);
    let buffer: Vec<(u64, Vec<u8>)> = (0..6u64).map(|s| (s, vec![s as u8])).collect();
    let ep = router_ep.clone();
    let client = std::thread::spawn(move || replay(&ep, 2, Duration::from_secs(5)));
    serve_replay(&router, &buffer);
    let got = client.join().unwrap().unwrap();
    assert_eq!(got, buffer[2..].to_vec());

    let t0 = Instant::now();
    let err = replay(&router_ep, 0, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, KvTransportError::Timeout { .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn unanswered_replay_times_out() {
    let ctx = zmq::Context::new();
    let (_pubs, pub_ep, _router, router_ep) = publisher(&ctx);
    let (t, rx) = KvTransport::start(
        vec![(
            0,
            KvEventsEndpoint {
                endpoint: pub_ep,
                replay_endpoint: Some(router_ep),
                topic: String::new(),
            },
        )],
        KvTransportOptions {
            replay_timeout: Duration::from_millis(50),
            ..KvTransportOptions::default()
        },
    )
    .unwrap();
    t.request_replay(0, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.stats()[0].replay_failures == 0 {
        assert!(Instant::now() < deadline, "replay never timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.stats()[0].replays, 1);
    assert!(rx.try_recv().is_err());
    // A new request may start once the old one is over.
    t.request_replay(0, 0);
    while t.stats()[0].replays < 2 {
        assert!(Instant::now() < deadline, "second replay never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The mock engine publishes as vLLM does; the transport follows it, sees a dropped
/// message as a gap and recovers it by replay.
#[test]
fn follows_the_mock_engine_and_fills_gaps_by_replay() {
    let mock = rolter_mock::spawn(rolter_mock::MockConfig {
        kv_events: Some(rolter_mock::KvEventsConfig {
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            topic: "kv@mock".into(),
            ..rolter_mock::KvEventsConfig::default()
        }),
        ..rolter_mock::MockConfig::default()
    })
    .unwrap();
    let (t, rx) = KvTransport::start(
        vec![(
            1,
            KvEventsEndpoint {
                endpoint: mock.kv_events_endpoint().unwrap(),
                replay_endpoint: mock.kv_replay_endpoint(),
                topic: "kv@".into(),
            },
        )],
        KvTransportOptions::default(),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rx.recv_timeout(Duration::from_millis(20)).is_err() {
        assert!(Instant::now() < deadline, "subscription never arrived");
        mock.publish_clear();
    }
    while rx.recv_timeout(Duration::from_millis(50)).is_ok() {}
    let next = mock.kv_next_seq().unwrap();

    let chat = |content: &str| {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}]}}"#);
        let mut c = rolter_mock::client::Client::connect(mock.addr());
        c.send(&rolter_mock::client::post(
            "/v1/chat/completions",
            &[],
            &body,
        ));
        assert_eq!(c.response().unwrap().status, 200);
    };
    chat(&"a long enough prompt to fill a few blocks ".repeat(4));
    let f = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((f.seq, f.target, f.replayed), (next, 1, false));
    assert_eq!(f.topic, b"kv@mock");
    assert_eq!(&f.payload[..2], &[0x93, 0xcb], "[ts: float64, ...]");

    mock.drop_next_kv_messages(1);
    chat(&"another prompt that stores other blocks ".repeat(4));
    mock.publish_clear();
    let f = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(f.seq, next + 2);
    let s = t.stats()[0].clone();
    assert_eq!((s.gaps, s.missed, s.last_seq), (1, 1, Some(next + 2)));

    t.request_replay(1, next + 1);
    let f = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(f.replayed);
    assert_eq!(f.seq, next + 1);
    let again = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((again.seq, again.replayed), (next + 2, true));
    t.stop();
    mock.shutdown();
}

#[test]
fn replay_without_endpoint_fails_and_stop_is_prompt() {
    let (t, _rx) = KvTransport::start(
        vec![(
            0,
            KvEventsEndpoint {
                endpoint: "tcp://127.0.0.1:1".into(),
                replay_endpoint: None,
                topic: String::new(),
            },
        )],
        KvTransportOptions::default(),
    )
    .unwrap();
    t.request_replay(0, 0);
    std::thread::sleep(Duration::from_millis(80));
    let s = t.stats()[0].clone();
    assert_eq!((s.replays, s.replay_failures, s.connected), (1, 1, false));
    let started = Instant::now();
    t.stop();
    assert!(started.elapsed() < Duration::from_millis(100));

    let bad = KvTransport::start(
        vec![(
            0,
            KvEventsEndpoint {
                endpoint: "nonsense".into(),
                replay_endpoint: None,
                topic: String::new(),
            },
        )],
        KvTransportOptions::default(),
    );
    assert!(matches!(bad, Err(KvTransportError::Endpoint { .. })));
}
