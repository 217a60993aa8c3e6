//! `[[routes]]`: names and references, match rules, strategies, tokenizers, cache controllers.

use super::*;

// ------------------------------------------------------------------ names and references

#[test]
fn no_targets_is_an_error() {
    let errs = errors("[server]\nworkers = 1\n");
    error_at(&errs, "targets");
    let errs = errors("targets = []\n");
    error_at(&errs, "targets");
}

#[test]
fn empty_routes_array_is_an_error() {
    let errs = errors(&format!("routes = []\n{ONE_TARGET}"));
    error_at(&errs, "routes");
}

#[test]
fn names_required_unique_and_well_formed() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
[[targets]]
name = \"a\"
url = \"http://10.0.0.2\"
[[targets]]
name = \"\"
url = \"http://10.0.0.3\"
[[targets]]
name = \"bad name!\"
url = \"http://10.0.0.4\"
[[targets]]
url = \"http://10.0.0.5\"
[[targets]]
name = \"nourl\"
[[routes]]
name = \"r\"
targets = [\"a\"]
[[routes]]
name = \"r\"
targets = [\"a\"]
[[routes]]
name = \"\"
targets = [\"a\"]
[[routes]]
targets = [\"a\"]
";
    let errs = errors(text);
    assert!(error_at(&errs, "targets[1].name")
        .message
        .contains("already used by targets[0]"));
    assert!(error_at(&errs, "targets[2].name").message.contains("empty"));
    assert!(error_at(&errs, "targets[3].name")
        .fix
        .contains("`bad-name-`"));
    error_at(&errs, "targets[4].name");
    error_at(&errs, "targets[5].url");
    assert!(error_at(&errs, "routes[1].name")
        .message
        .contains("already used by routes[0]"));
    error_at(&errs, "routes[2].name");
    error_at(&errs, "routes[3].name");
    assert_eq!(errs.len(), 8, "{}", ConfigErrors { errors: errs });
}

#[test]
fn dangling_route_target_names_it_and_lists_known() {
    let text = format!(
        "{ONE_TARGET}[[targets]]\nname = \"bee\"\nurl = \"http://10.0.0.2\"\n\
         [[routes]]\nname = \"r\"\ntargets = [\"a\", \"be\", \"a\"]\n\
         [[routes]]\nname = \"s\"\ntargets = []\n[[routes]]\nname = \"t\"\n"
    );
    let errs = errors(&text);
    let e = error_at(&errs, "routes[0].targets[1]");
    assert!(e.message.contains("`be`"), "{e}");
    assert!(e.fix.contains("a, bee"), "{e}");
    assert!(e.fix.contains("did you mean `bee`?"), "{e}");
    assert!(error_at(&errs, "routes[0].targets[2]")
        .message
        .contains("twice"));
    error_at(&errs, "routes[1].targets");
    error_at(&errs, "routes[2].targets");
    assert_eq!(errs.len(), 4);
}

#[test]
fn route_to_invalid_target_is_not_dangling() {
    // The target has a bad URL; the route naming it must not add a second, misleading error.
    let text = "[[targets]]\nname = \"a\"\nurl = \"ftp://x\"\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n";
    let errs = errors(text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    assert_eq!(errs[0].key, "targets[0].url");
}

// ------------------------------------------------------------------ match rules

#[test]
fn match_rules() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\", \"m2\"]
[[targets]]
name = \"b\"
url = \"http://10.0.0.2\"
models = [\"m3\"]
[[routes]]
name = \"r\"
targets = [\"a\", \"b\"]
forward_client_auth = true
retries = 0
[routes.match]
paths = [\"/v1/embeddings\", \"/v1/messages\"]
models = [\"m1\", \"m3\"]
header = { name = \"X-Tenant\", value = \"blue\" }
";
    let c = load(text).unwrap();
    let r = &c.routes[0];
    assert!(r.forward_client_auth);
    assert_eq!(r.retries, 0);
    assert_eq!(r.matcher.paths, vec!["/v1/embeddings", "/v1/messages"]);
    assert_eq!(r.matcher.models, vec!["m1", "m3"]);
    assert_eq!(
        r.matcher.header,
        Some(("x-tenant".to_string(), "blue".to_string()))
    );
}

#[test]
fn passthrough_prefixes_load_and_select_their_requests() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\"]
[[routes]]
name = \"custom\"
targets = [\"a\"]
[routes.match]
passthrough = [\"/v1/custom/\", \"/metrics-proxy/\"]
[[routes]]
name = \"both\"
targets = [\"a\"]
[routes.match]
paths = [\"/v1/embeddings\"]
passthrough = [\"/x\"]
[[routes]]
name = \"rest\"
targets = [\"a\"]
";
    let c = load(text).unwrap();
    let [custom, both, rest] = &c.routes[..] else {
        panic!("three routes")
    };
    assert_eq!(
        custom.matcher.passthrough,
        vec!["/v1/custom/", "/metrics-proxy/"]
    );
    assert!(custom.matcher.takes_passthrough("/v1/custom/a/b"));
    assert!(!custom.matcher.takes_passthrough("/v1/custom"));
    // A passthrough route takes proxied paths only when it lists them.
    assert!(!custom.matcher.takes_proxied("/v1/chat/completions"));
    assert!(both.matcher.takes_proxied("/v1/embeddings"));
    assert!(!both.matcher.takes_proxied("/v1/completions"));
    assert!(both.matcher.takes_passthrough("/xyz"));
    assert!(rest.matcher.takes_proxied("/v1/completions"));
    assert!(!rest.matcher.takes_passthrough("/v1/custom/a"));
}

#[test]
fn passthrough_errors() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
[[routes]]
name = \"r\"
targets = [\"a\"]
[routes.match]
passthrough = [\"custom/\", \"/a b\", \"/v1/rerank\", \"/q?x\", \"\", \"/ok\", \"/ok\"]
";
    // Empty and repeated entries first; the others are checked once the list is clean.
    let errs = errors(text);
    error_at(&errs, "routes[0].match.passthrough[4]");
    error_at(&errs, "routes[0].match.passthrough[6]");
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let text = text.replace(", \"\", \"/ok\", \"/ok\"", "");
    let errs = errors(&text);
    let e = error_at(&errs, "routes[0].match.passthrough[0]");
    assert!(e.fix.contains("\"/custom/\""), "{e}");
    error_at(&errs, "routes[0].match.passthrough[1]");
    let e = error_at(&errs, "routes[0].match.passthrough[2]");
    assert!(e.fix.contains("match.paths"), "{e}");
    error_at(&errs, "routes[0].match.passthrough[3]");
    assert_eq!(errs.len(), 4, "{}", ConfigErrors { errors: errs });
}

#[test]
fn match_errors() {
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
models = [\"m1\"]
[[targets]]
name = \"any\"
url = \"http://10.0.0.2\"
[[routes]]
name = \"r\"
targets = [\"a\"]
[routes.match]
paths = [\"/v1/chat/completion\", \"/v1/completions\"]
models = [\"m1\", \"m9\", \"\"]
header = { name = \"bad header\", value = \"\" }
[[routes]]
name = \"s\"
targets = [\"a\", \"any\"]
match = { models = [\"m9\"] }
";
    let errs = errors(text);
    let e = error_at(&errs, "routes[0].match.paths[0]");
    assert!(
        e.fix.contains("did you mean `/v1/chat/completions`?"),
        "{e}"
    );
    let e = error_at(&errs, "routes[0].match.models[1]");
    assert!(
        e.message.contains("`m9`") && e.message.contains("m1"),
        "{e}"
    );
    error_at(&errs, "routes[0].match.models[2]");
    error_at(&errs, "routes[0].match.header.name");
    error_at(&errs, "routes[0].match.header.value");
    // Route `s` has a target without a model list, so m9 may be served: no error.
    assert_eq!(errs.len(), 5, "{}", ConfigErrors { errors: errs });
}

#[test]
fn retries_bounds() {
    for (r, ok) in [("0", true), ("10", true), ("11", false), ("-1", false)] {
        let text =
            format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nretries = {r}\n");
        match load(&text) {
            Ok(c) => assert!(ok, "{r}: {c:?}"),
            Err(errs) => {
                assert!(!ok, "{r}: {errs}");
                error_at(&errs.errors, "routes[0].retries");
            }
        }
    }
}

#[test]
fn retry_policy_defaults_and_values() {
    let route =
        |extra: &str| format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n{extra}\n");
    let c = load(&route("")).unwrap();
    let p = &c.routes[0].retry;
    assert_eq!(*p, RetryPolicy::default());
    assert!(p.on.contains(RetryReason::ResetBeforeResponse));
    assert!(p.on.contains(RetryReason::Status429));
    assert!(!p.on.contains(RetryReason::FirstByteTimeout));
    assert_eq!(p.per_try_timeout, None);
    assert_eq!(p.deadline, None);
    assert_eq!(p.backoff, Duration::from_millis(25));
    assert_eq!(p.backoff_max, Duration::from_millis(250));
    assert_eq!((p.budget, p.budget_min), (0.2, 3));
    assert_eq!(p.retry_after_max, Duration::from_secs(60));

    let c = load(&route(
        "retry_on = [\"first_byte_timeout\", \"503\"]\nper_try_timeout = \"2s\"\ndeadline = \"10s\"\nretry_backoff = \"10ms\"\nretry_backoff_max = \"1s\"\nretry_budget = 0.5\nretry_budget_min = 0\nretry_after_max = \"5m\"",
    ))
    .unwrap();
    let p = &c.routes[0].retry;
    assert!(p.on.contains(RetryReason::FirstByteTimeout) && p.on.contains(RetryReason::Status503));
    assert!(!p.on.contains(RetryReason::ConnectFailure) && !p.on.status(502));
    assert_eq!(p.per_try_timeout, Some(Duration::from_secs(2)));
    assert_eq!(p.deadline, Some(Duration::from_secs(10)));
    assert_eq!((p.budget, p.budget_min), (0.5, 0));
    assert_eq!(p.retry_after_max, Duration::from_secs(300));
    assert_eq!(
        load(&route("retry_on = []")).unwrap().routes[0].retry.on,
        RetryOn::NONE
    );
}

#[test]
fn hedge_after_is_a_delay_or_a_percentile_on_a_route_of_two_targets() {
    let two = format!(
        "{ONE_TARGET}[[targets]]\nname = \"b\"\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\ntargets = [\"a\", \"b\"]\n"
    );
    assert_eq!(load(&two).unwrap().routes[0].retry.hedge_after, None);
    let with = |v: &str| format!("{two}hedge_after = {v}\n");
    assert_eq!(
        load(&with("\"250ms\"")).unwrap().routes[0]
            .retry
            .hedge_after,
        Some(HedgeAfter::Delay(Duration::from_millis(250)))
    );
    assert_eq!(
        load(&with("\"p95\"")).unwrap().routes[0].retry.hedge_after,
        Some(HedgeAfter::Percentile(95.0))
    );
    for (v, says) in [
        ("\"p101\"", "p99.9"),
        ("\"p10\"", "p50"),
        ("\"0s\"", "zero"),
        ("300", "unit"),
    ] {
        let errs = errors(&with(v));
        let e = error_at(&errs, "routes[0].hedge_after");
        assert!(
            format!("{} {}", e.message, e.fix).contains(says),
            "{v}: {e:?}"
        );
    }
    // One target: nowhere to send the hedge.
    let one =
        format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nhedge_after = \"1s\"\n");
    let errs = errors(&one);
    assert!(error_at(&errs, "routes[0].hedge_after")
        .fix
        .contains("second target"));
}

#[test]
fn retry_policy_errors_name_the_key() {
    for (extra, key, says) in [
        (
            "retry_on = [\"500\"]",
            "routes[0].retry_on[0]",
            "connect_failure",
        ),
        (
            "per_try_timeout = \"0s\"",
            "routes[0].per_try_timeout",
            "zero",
        ),
        ("deadline = 5", "routes[0].deadline", "unit"),
        (
            "retry_backoff = \"1s\"\nretry_backoff_max = \"100ms\"",
            "routes[0].retry_backoff_max",
            "retry_backoff",
        ),
        ("retry_budget = -0.1", "routes[0].retry_budget", "0.2"),
        (
            "retry_budget_min = -1",
            "routes[0].retry_budget_min",
            "default 3",
        ),
    ] {
        let text = format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n{extra}\n");
        let errs = errors(&text);
        let e = error_at(&errs, key);
        assert!(
            format!("{} {}", e.message, e.fix).contains(says),
            "{extra}: {e}"
        );
    }
}

#[test]
fn queue_keys() {
    let route =
        |extra: &str| format!("{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n{extra}\n");
    let c = load(&route("")).unwrap();
    assert_eq!(c.routes[0].queue, None, "no queue by default");
    let c = load(&route("queue_max = 32")).unwrap();
    assert_eq!(
        c.routes[0].queue,
        Some(RouteQueue {
            max: 32,
            timeout: std::time::Duration::from_secs(2)
        })
    );
    let c = load(&route("queue_max = 4\nqueue_timeout = \"250ms\"")).unwrap();
    assert_eq!(
        c.routes[0].queue.unwrap().timeout,
        std::time::Duration::from_millis(250)
    );
    let errs = errors(&route("queue_max = 0"));
    assert!(error_at(&errs, "routes[0].queue_max").message.contains('0'));
    let errs = errors(&route("queue_timeout = \"1s\""));
    assert!(error_at(&errs, "routes[0].queue_timeout")
        .fix
        .contains("queue_max"));
    let errs = errors(&route("queue_max = 4\nqueue_timeout = \"0s\""));
    error_at(&errs, "routes[0].queue_timeout");
}

// ------------------------------------------------------------------ strategies

#[test]
fn strategy_forms() {
    let text = format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nstrategy = \"round_robin\"\n\
         [[routes]]\nname = \"s\"\ntargets = [\"a\"]\nstrategy = {{ name = \"round_robin\" }}\n"
    );
    let c = load(&text).unwrap();
    assert_eq!(c.routes[0].strategy.name(), "round_robin");
    assert!(c.routes[0].strategy.is_default());
    assert_eq!(c.routes[1].strategy.name(), "round_robin");
    assert!(c.routes[1].strategy.is_default());
}

#[test]
fn strategy_errors() {
    let text = format!(
        "{ONE_TARGET}\
         [[routes]]\nname = \"r0\"\ntargets = [\"a\"]\nstrategy = \"zzz_no_such_strategy\"\n\
         [[routes]]\nname = \"r1\"\ntargets = [\"a\"]\nstrategy = {{ name = \"zzz_nope\" }}\n\
         [[routes]]\nname = \"r2\"\ntargets = [\"a\"]\nstrategy = {{ threshold = 2 }}\n\
         [[routes]]\nname = \"r3\"\ntargets = [\"a\"]\nstrategy = 7\n\
         [[routes]]\nname = \"r4\"\ntargets = [\"a\"]\nstrategy = {{ name = 7 }}\n\
         [[routes]]\nname = \"r5\"\ntargets = [\"a\"]\nstrategy = \"\"\n"
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].strategy")
        .message
        .contains("`zzz_no_such_strategy`"));
    assert!(error_at(&errs, "routes[1].strategy.name")
        .message
        .contains("`zzz_nope`"));
    error_at(&errs, "routes[2].strategy.name");
    error_at(&errs, "routes[3].strategy");
    error_at(&errs, "routes[4].strategy.name");
    error_at(&errs, "routes[5].strategy");
    assert_eq!(errs.len(), 6, "{}", ConfigErrors { errors: errs });
}

#[test]
fn a_misspelt_strategy_name_gets_the_closest_suggested() {
    let text = format!(
        "{ONE_TARGET}\
         [[routes]]\nname = \"r0\"\ntargets = [\"a\"]\nstrategy = \"least-loaded\"\n\
         [[routes]]\nname = \"r1\"\ntargets = [\"a\"]\nstrategy = {{ name = \"fastset\" }}\n"
    );
    let errs = errors(&text);
    let e = error_at(&errs, "routes[0].strategy");
    assert!(e.message.contains("unknown strategy `least-loaded`"), "{e}");
    assert!(e.fix.contains("did you mean `least_loaded`?"), "{e}");
    let e = error_at(&errs, "routes[1].strategy.name");
    assert!(e.fix.contains("did you mean `fastest`?"), "{e}");
    // Far from every name: the list of valid names, no guess.
    let errs = errors(&format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nstrategy = \"zzz_no_such_strategy\"\n"
    ));
    let e = error_at(&errs, "routes[0].strategy");
    assert!(!e.fix.contains("did you mean"), "{e}");
    assert!(e.message.contains("valid names"), "{e}");
}

#[test]
fn least_loaded_max_concurrent_is_refused_for_the_target_key() {
    let errs = errors(&format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n\
         [routes.strategy]\nname = \"least_loaded\"\nmax_concurrent = 4\n"
    ));
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    let e = error_at(&errs, "routes[0].strategy.max_concurrent");
    assert!(e.message.contains("no longer an option"), "{e}");
    assert!(e.fix.contains("`targets[i].max_concurrent`"), "{e}");
    assert!(e.fix.contains("exact across workers"), "{e}");
    // The target key is the way to cap it.
    let c = load(&format!(
        "{ONE_TARGET}max_concurrent = 4\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n\
         strategy = \"least_loaded\"\n"
    ))
    .unwrap();
    assert_eq!(c.targets[0].max_concurrent, Some(4));
}

// ------------------------------------------------------------------ tokenizers

fn precise_route(options: &str) -> String {
    format!(
        "{ONE_TARGET}\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\nname = \"precise_cache_aware\"\n{options}\n"
    )
}

#[test]
#[cfg(feature = "local-tokenizer")]
fn precise_cache_aware_loads_a_local_tokenizer_or_uses_the_engine() {
    let c = load(&precise_route("")).unwrap();
    assert!(c.routes[0].tokenizer.is_none(), "default: the engine");
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/tokenizer/chatml"
    );
    let c = load(&precise_route(&format!(
        "tokenizer = \"{dir}/tokenizer.json\"\nmin_blocks = 2"
    )))
    .unwrap();
    let t = c.routes[0].tokenizer.as_ref().expect("loaded");
    assert!(
        t.has_chat_template(),
        "tokenizer_config.json beside it was read"
    );
}

#[test]
fn a_missing_tokenizer_file_is_a_configuration_error() {
    let errs = errors(&precise_route(
        "tokenizer = \"/nonexistent/tokenizer.json\"",
    ));
    let e = error_at(&errs, "routes[0].strategy.tokenizer");
    assert!(e.message.contains("/nonexistent/tokenizer.json"), "{e}");
    assert!(e.fix.contains("engine"), "{e}");
}

#[test]
#[cfg(feature = "kv-events")]
fn kv_events_endpoints_and_settings_are_checked() {
    let ok = format!(
        "{ONE_TARGET}[targets.kv_events]\nendpoint = \"tcp://10.0.0.1:5557\"\nreplay_endpoint = \"tcp://10.0.0.1:5558\"\n\n[kv_events]\nblock_size = 32\nstale_after = \"3s\"\n"
    );
    let c = load(&ok).unwrap();
    let kv = c.targets[0].kv_events.as_ref().unwrap();
    assert_eq!(kv.endpoint, "tcp://10.0.0.1:5557");
    assert_eq!(kv.replay_endpoint.as_deref(), Some("tcp://10.0.0.1:5558"));
    assert_eq!(c.kv_events.block_size, 32);
    assert_eq!(c.kv_events.stale_after, Duration::from_secs(3));
    // The engine's bind address is not something to connect to.
    let errs = errors(&format!(
        "{ONE_TARGET}[targets.kv_events]\nendpoint = \"tcp://*:5557\"\n"
    ));
    let e = error_at(&errs, "targets[0].kv_events.endpoint");
    assert!(e.fix.contains("tcp://host:port"), "{e}");
    let errs = errors(&format!(
        "{ONE_TARGET}[targets.kv_events]\ntopic = \"kv@\"\n"
    ));
    error_at(&errs, "targets[0].kv_events.endpoint");
    let errs = errors(&format!("{ONE_TARGET}[kv_events]\nblock_size = 0\n"));
    error_at(&errs, "kv_events.block_size");
}

#[test]
fn kv_events_repair_timeout_defaults_to_two_seconds_and_must_be_a_positive_duration() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.kv_events.repair_timeout, Duration::from_secs(2));
    let c = load(&format!(
        "{ONE_TARGET}[kv_events]\nrepair_timeout = \"750ms\"\n"
    ))
    .unwrap();
    assert_eq!(c.kv_events.repair_timeout, Duration::from_millis(750));
    let errs = errors(&format!(
        "{ONE_TARGET}[kv_events]\nrepair_timeout = \"0s\"\n"
    ));
    let e = error_at(&errs, "kv_events.repair_timeout");
    assert!(e.message.contains("zero"), "{e}");
    assert!(e.fix.contains("\"2s\""), "{e}");
    let errs = errors(&format!("{ONE_TARGET}[kv_events]\nrepair_timeout = 5\n"));
    let e = error_at(&errs, "kv_events.repair_timeout");
    assert!(e.fix.contains("\"5s\""), "{e}");
}

// ------------------------------------------------------------------ lmcache_aware

fn lmcache_route(target_extra: &str, options: &str) -> String {
    format!(
        "[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8001\"\n{target_extra}\n[[targets]]\nname = \"b\"\nurl = \"http://127.0.0.1:8002\"\n\n[[routes]]\nname = \"r\"\ntargets = [\"a\", \"b\"]\n[routes.strategy]\nname = \"lmcache_aware\"\n{options}\n"
    )
}

#[test]
fn lmcache_aware_resolves_its_controller_and_maps_instances() {
    let c = load(&lmcache_route(
        "lmcache_instance = \"vllm-pod-0\"",
        "controller = \"http://127.0.0.1:9000\"\nlookup_timeout = \"20ms\"",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let ctl = c.routes[0].cache_controller.as_ref().expect("resolved");
    assert_eq!(ctl.addr, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(ctl.host_header, "127.0.0.1:9000");
    assert_eq!(ctl.base_path, "");
    assert_eq!(c.targets[0].lmcache_instance, "vllm-pod-0");
    assert_eq!(
        c.targets[1].lmcache_instance, "b",
        "default: the target's name"
    );
    // Other strategies have no controller.
    let c = load(&precise_route("")).unwrap();
    assert!(c.routes[0].cache_controller.is_none());
}

#[test]
fn lmcache_aware_without_a_usable_controller_is_a_configuration_error() {
    let errs = errors(&lmcache_route("", ""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("no `controller`"), "{e}");
    assert!(e.fix.contains("http://"), "{e}");

    let errs = errors(&lmcache_route("", "controller = \"https://10.0.0.1:9000\""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("plain HTTP"), "{e}");

    let errs = errors(&lmcache_route("", "controller = \"10.0.0.1:9000\""));
    let e = error_at(&errs, "routes[0].strategy.controller");
    assert!(e.message.contains("no scheme"), "{e}");

    let errs = errors(&lmcache_route("", "controller = 9000"));
    error_at(&errs, "routes[0].strategy.controller");

    let errs = errors(&lmcache_route(
        "lmcache_instance = \"\"",
        "controller = \"http://127.0.0.1:9000\"",
    ));
    let e = error_at(&errs, "targets[0].lmcache_instance");
    assert!(e.fix.contains("LMCACHE_LMCACHE_INSTANCE_ID"), "{e}");

    let errs = errors(&lmcache_route(
        "",
        "controller = \"http://127.0.0.1:9000\"\nw_prefix = 0\nw_free = 0",
    ));
    error_at(&errs, "routes[0].strategy.w_prefix");
}

#[test]
#[cfg(not(feature = "local-tokenizer"))]
fn a_tokenizer_file_needs_the_local_tokenizer_feature() {
    let errs = errors(&precise_route("tokenizer = \"/models/x/tokenizer.json\""));
    let e = error_at(&errs, "routes[0].strategy.tokenizer");
    assert!(e.message.contains("local-tokenizer"), "{e}");
    assert!(e.fix.contains("tokenizer = \"engine\""), "{e}");
    assert!(load(&precise_route("tokenizer = \"engine\"")).is_ok());
}

#[test]
#[cfg(not(feature = "kv-events"))]
fn kv_events_need_the_kv_events_feature() {
    let errs = errors(&format!(
        "{ONE_TARGET}[targets.kv_events]\nendpoint = \"tcp://10.0.0.1:5557\"\n"
    ));
    let e = error_at(&errs, "targets[0].kv_events");
    assert!(e.message.contains("kv-events"), "{e}");
}
