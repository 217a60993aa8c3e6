//! Disaggregated routes (`disaggregation`, `prefill`, `decode`) and data-parallel ranks
//! (`dp_size`, `engine`, `bootstrap_port`).

use super::*;

const FLEET: &str = "\
[[targets]]
name = \"p0\"
url = \"http://10.0.0.1:8000\"
bootstrap_port = 9001
[[targets]]
name = \"p1\"
url = \"http://10.0.0.2:8000\"
[[targets]]
name = \"d0\"
url = \"http://10.0.0.3:8000\"
[[targets]]
name = \"d1\"
url = \"http://10.0.0.4:8000\"
";

fn pd_route(protocol: &str) -> String {
    format!(
        "{FLEET}[[routes]]
name = \"chat\"
disaggregation = \"{protocol}\"
retries = 2
prefill = {{ targets = [\"p0\", \"p1\"], strategy = \"cache_aware\" }}
decode = {{ targets = [\"d0\", \"d1\"], strategy = \"least_loaded\" }}
"
    )
}

#[test]
fn a_disaggregated_route_gets_its_prefill_pool_as_a_route_of_its_own() {
    let c = load(&pd_route("vllm")).unwrap();
    assert_eq!(c.routes.len(), 2);
    let (chat, pool) = (&c.routes[0], &c.routes[1]);
    assert_eq!(chat.name, "chat");
    assert_eq!(chat.targets, vec![2, 3]);
    assert_eq!(chat.strategy.name(), "least_loaded");
    assert_eq!(
        chat.disaggregation,
        Some(Disaggregation {
            protocol: PdProtocol::Vllm,
            prefill_route: 1
        })
    );
    assert!(chat.matches_requests());
    assert_eq!(pool.name, "chat/prefill");
    assert_eq!(pool.targets, vec![0, 1]);
    assert_eq!(pool.strategy.name(), "cache_aware");
    assert_eq!(pool.prefill_of, Some(0));
    assert!(!pool.matches_requests());
    // The route's retry policy holds for both legs.
    assert_eq!(pool.retries, 2);
    assert_eq!(c.targets[0].bootstrap_port, 9001);
    assert_eq!(c.targets[1].bootstrap_port, DEFAULT_BOOTSTRAP_PORT);
    // vLLM engines unless written or implied otherwise.
    assert!(c.targets.iter().all(|t| t.engine == EngineKind::Vllm));
}

#[test]
fn an_sglang_route_makes_its_targets_sglang_engines() {
    let c = load(&pd_route("sglang")).unwrap();
    assert!(c.targets.iter().all(|t| t.engine == EngineKind::Sglang));
    let text = pd_route("sglang").replace("name = \"d1\"\n", "name = \"d1\"\nengine = \"vllm\"\n");
    let c = load(&text).unwrap();
    assert_eq!(c.targets[3].engine, EngineKind::Vllm);
}

#[test]
fn an_unknown_protocol_names_both() {
    let errs = errors(&pd_route("nixl"));
    let e = error_at(&errs, "routes[0].disaggregation");
    assert!(e.message.contains("`nixl`"), "{e}");
    assert!(
        e.fix.contains("\"vllm\"") && e.fix.contains("\"sglang\""),
        "{e}"
    );
}

#[test]
fn pools_without_a_protocol_and_a_protocol_without_pools_are_errors() {
    let text = pd_route("vllm").replace("disaggregation = \"vllm\"\n", "");
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].disaggregation")
        .message
        .contains("no `disaggregation`"));
    let text = format!("{FLEET}[[routes]]\nname = \"chat\"\ndisaggregation = \"vllm\"\n");
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].prefill")
        .message
        .contains("`prefill` pool"));
    assert!(error_at(&errs, "routes[0].decode")
        .message
        .contains("`decode` pool"));
}

#[test]
fn an_empty_pool_and_an_unknown_target_are_errors_in_their_pool() {
    let text = pd_route("vllm").replace("targets = [\"p0\", \"p1\"]", "targets = []");
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].prefill.targets")
        .message
        .contains("empty"));
    let text = pd_route("vllm").replace("[\"d0\", \"d1\"]", "[\"d0\", \"d9\"]");
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].decode.targets[1]")
        .message
        .contains("`d9`"));
}

#[test]
fn a_target_in_both_pools_is_an_error_only_under_sglang() {
    let both = |p: &str| pd_route(p).replace("[\"d0\", \"d1\"]", "[\"d0\", \"p1\"]");
    load(&both("vllm")).expect("a vLLM kv_both engine may prefill and decode");
    let errs = errors(&both("sglang"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = error_at(&errs, "routes[0].decode.targets[1]");
    assert!(e.message.contains("`p1` is in both pools"), "{e}");
}

#[test]
fn a_disaggregated_route_has_no_targets_or_strategy_of_its_own() {
    let text = pd_route("vllm").replace(
        "retries = 2\n",
        "retries = 2\ntargets = [\"d0\"]\nstrategy = \"random\"\n",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{errs:?}");
    for key in ["routes[0].targets", "routes[0].strategy"] {
        assert!(error_at(&errs, key).fix.contains("prefill = {"));
    }
}

#[test]
fn a_disaggregated_route_cannot_hedge_or_pass_through() {
    let text = format!(
        "{}hedge_after = \"100ms\"\n[routes.match]\npassthrough = [\"/v1/files\"]\n",
        pd_route("vllm")
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{errs:?}");
    error_at(&errs, "routes[0].hedge_after");
    error_at(&errs, "routes[0].match.passthrough");
}

#[test]
fn a_bad_pool_strategy_is_an_error_at_its_key() {
    let text = pd_route("vllm").replace("\"cache_aware\"", "\"cache_awar\"");
    let errs = errors(&text);
    error_at(&errs, "routes[0].prefill.strategy");
}

#[test]
fn the_prefill_pools_name_cannot_be_taken() {
    let text = format!(
        "{}[[routes]]\nname = \"chat/prefill\"\ntargets = [\"d0\"]\n",
        pd_route("vllm")
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "routes[0].name")
        .message
        .contains("`chat/prefill`"));
}

#[test]
fn dp_size_makes_one_target_per_rank() {
    let text = "\
[[targets]]
name = \"e\"
url = \"http://10.0.0.1:8000\"
dp_size = 4
lmcache_instance = \"pod-e\"
[[targets]]
name = \"f\"
url = \"http://10.0.0.2:8000\"
[[routes]]
name = \"r\"
targets = [\"f\", \"e\"]
";
    let c = load(text).unwrap();
    let names: Vec<&str> = c.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["e[0]", "e[1]", "e[2]", "e[3]", "f"]);
    assert_eq!(c.routes[0].targets, vec![4, 0, 1, 2, 3]);
    for (r, t) in c.targets[..4].iter().enumerate() {
        let dp = t.dp.as_ref().unwrap();
        assert_eq!(
            (dp.rank, dp.size, dp.engine_name.as_str()),
            (r as u32, 4, "e")
        );
        assert_eq!(t.addr, c.targets[0].addr);
        assert_eq!(t.lmcache_instance, format!("pod-e[{r}]"));
    }
    assert!(c.targets[4].dp.is_none());
}

/// vLLM publishes each data-parallel rank's KV events on the endpoint's port plus the rank.
#[cfg(feature = "kv-events")]
#[test]
fn a_ranks_kv_events_come_from_the_port_plus_its_rank() {
    let text = "\
[[targets]]
name = \"e\"
url = \"http://10.0.0.1:8000\"
dp_size = 2
[targets.kv_events]
endpoint = \"tcp://10.0.0.1:5557\"
replay_endpoint = \"tcp://10.0.0.1:5600\"
";
    let c = load(text).unwrap();
    for (r, t) in c.targets.iter().enumerate() {
        let kv = t.kv_events.as_ref().unwrap();
        assert_eq!(kv.endpoint, format!("tcp://10.0.0.1:{}", 5557 + r));
        assert_eq!(
            kv.replay_endpoint.as_deref(),
            Some(format!("tcp://10.0.0.1:{}", 5600 + r).as_str())
        );
    }
}

#[test]
fn dp_size_engine_and_bootstrap_port_are_checked() {
    let text = "\
[[targets]]
name = \"e\"
url = \"http://10.0.0.1:8000\"
dp_size = 0
engine = \"trt\"
bootstrap_port = 70000
";
    let errs = errors(text);
    assert!(error_at(&errs, "targets[0].dp_size")
        .message
        .contains("between 1 and"));
    assert!(error_at(&errs, "targets[0].engine")
        .message
        .contains("`trt`"));
    assert!(error_at(&errs, "targets[0].bootstrap_port")
        .message
        .contains("70000"));
}

#[test]
fn a_pool_strategy_that_loads_adapters_is_refused() {
    let text = pd_route("vllm").replace(
        "decode = { targets = [\"d0\", \"d1\"], strategy = \"least_loaded\" }",
        "decode = { targets = [\"d0\", \"d1\"], strategy = { name = \"lora_aware\", adapters = \"a\", load_from = \"/adapters\" } }",
    );
    let errs = errors(&text);
    let e = error_at(&errs, "routes[0].decode.strategy.load_from");
    assert!(e.message.contains("loads LoRA adapters"), "{e}");
}
