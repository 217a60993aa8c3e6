use super::*;

#[test]
fn turn_requests_carry_the_messages_verbatim() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let prompt = br#"[{"role":"system","content":"s"},{"role":"user","content":"q"}]"#;
    let req = turn_request(addr, Some("session-7"), prompt, 12);
    let text = String::from_utf8(req).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("\r\nx-session-id: session-7"));
    assert!(head.contains(&format!("Content-Length: {}", body.len())));
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["max_tokens"], 12);
    assert_eq!(v["messages"][1]["content"], "q");
    let no_header = String::from_utf8(turn_request(addr, None, prompt, 1)).unwrap();
    assert!(!no_header.contains("x-session-id"));
}

#[test]
fn time_scaling_scales_arrivals_and_think_times_only() {
    let opts = ReplayOptions {
        scale: 0.02,
        ..ReplayOptions::default()
    };
    let w = opts.workload().unwrap();
    let full = workload::generate(
        Kind::MultiTurn,
        &Sizes {
            scale: 0.02,
            ..Sizes::full()
        },
        opts.seed,
    );
    assert_eq!(w.sessions.len(), full.sessions.len());
    for (a, b) in w.sessions.iter().zip(full.sessions.iter()) {
        assert_eq!(a.start, b.start.mul_f64(0.25));
        for (ta, tb) in a.turns.iter().zip(&b.turns) {
            assert_eq!(ta.think, tb.think.mul_f64(0.25));
            assert_eq!(ta.prompt, tb.prompt);
        }
    }
    assert!(ReplayOptions {
        workload: "hetero".to_string(),
        ..opts
    }
    .workload()
    .is_err());
}

#[test]
fn the_replay_gateway_configuration_loads() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let engine = |i: usize, kv: bool| EngineEntry {
        name: format!("engine-{i}"),
        addr,
        kv: kv.then(|| {
            (
                format!("tcp://127.0.0.1:{}", 5557 + i),
                Some(format!("tcp://127.0.0.1:{}", 6557 + i)),
            )
        }),
    };
    let plain = vec![engine(0, false), engine(1, false)];
    for s in ["round_robin", "cache_aware", "pipeline", "consistent_hash"] {
        let c = gateway_config(&plain, s, &toml::Table::new(), 2).unwrap();
        assert!(
            c.admin.is_some(),
            "{s}: the fallback counters are read there"
        );
    }
    let kv = vec![engine(0, true), engine(1, true)];
    let opts = ReplayOptions {
        options: vec![
            "precise_cache_aware.min_blocks=8".to_string(),
            "cache_aware.threshold=0.3".to_string(),
        ],
        ..ReplayOptions::default()
    };
    for s in ["precise_cache_aware", "cache_aware"] {
        let c = gateway_config(&kv, s, &opts.options_for(s).unwrap(), 1).unwrap();
        assert_eq!(c.routes[0].strategy.non_default().len(), 1, "{s}");
        let k = c.targets[1].kv_events.as_ref().expect("kv_events");
        assert_eq!(k.endpoint, "tcp://127.0.0.1:5558");
        assert_eq!(k.replay_endpoint.as_deref(), Some("tcp://127.0.0.1:6558"));
    }
}

#[test]
fn options_apply_to_their_strategy_only() {
    let opts = ReplayOptions {
        options: vec![
            "precise_cache_aware.min_blocks=8".to_string(),
            "precise_cache_aware.tokenizer=engine".to_string(),
        ],
        ..ReplayOptions::default()
    };
    let t = opts.options_for("precise_cache_aware").unwrap();
    assert_eq!(t["min_blocks"].as_integer(), Some(8));
    assert_eq!(t["tokenizer"].as_str(), Some("engine"));
    assert!(opts.options_for("cache_aware").unwrap().is_empty());
    assert_eq!(
        opts.label("precise_cache_aware"),
        "precise_cache_aware(min_blocks=8,tokenizer=\"engine\")"
    );
    assert_eq!(opts.label("cache_aware"), "cache_aware");
    let bad = ReplayOptions {
        options: vec!["nodot=1".to_string()],
        ..ReplayOptions::default()
    };
    assert!(bad.options_for("cache_aware").is_err());
}

#[test]
fn kv_events_follow_the_strategy_or_the_option() {
    let opts = ReplayOptions::default();
    assert!(opts.kv_events_for("precise_cache_aware"));
    assert!(!opts.kv_events_for("cache_aware"));
    let forced = ReplayOptions {
        kv_events: true,
        ..ReplayOptions::default()
    };
    assert!(forced.kv_events_for("round_robin"));
}

#[test]
fn replicas_are_simulated_as_cores_that_never_exchange() {
    let one = ReplayOptions::default().sim_config();
    assert_eq!((one.cores, one.core_assign), (2, CoreAssign::RoundRobin));
    assert_eq!(one.exchange, Duration::from_millis(2));
    let three = ReplayOptions {
        replicas: 3,
        ..ReplayOptions::default()
    }
    .sim_config();
    assert_eq!((three.cores, three.core_assign), (3, CoreAssign::Random));
    assert_eq!(three.load_view, LoadView::PerCore);
    assert!(three.exchange > Duration::from_secs(3600));
}

#[test]
fn fallback_series_are_summed_by_reason() {
    let text = "# HELP rolter_strategy_fallbacks strategy picked by its fallback\n\
        # TYPE rolter_strategy_fallbacks counter\n\
        rolter_strategy_fallbacks_total{route=\"replay\",strategy=\"precise_cache_aware\",reason=\"no_token_ids\"} 3\n\
        rolter_strategy_fallbacks_total{route=\"replay\",strategy=\"precise_cache_aware\",reason=\"imbalance\"} 1\n\
        rolter_requests_total{route=\"replay\"} 99\n";
    let mut reasons = Vec::new();
    add_fallbacks(text, &mut reasons);
    add_fallbacks(text, &mut reasons);
    assert_eq!(
        reasons,
        vec![
            ("no_token_ids".to_string(), 6),
            ("imbalance".to_string(), 2)
        ]
    );
}
