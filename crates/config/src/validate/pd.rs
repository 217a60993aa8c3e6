//! A disaggregated route (`disaggregation`, `prefill`, `decode`): the wire protocol, the two
//! pools with a strategy each, and what such a route cannot have; then the targets'
//! data-parallel ranks (`dp_size`), one target per rank, and the engine kind a P/D route
//! implies for its targets.
//!
//! Owns those rules only; the pools' targets and strategies are checked as a route's are.

use super::common::*;
use super::pool::{route_targets, strategy};

/// One pool of a disaggregated route: its targets and its strategy (`None` after an error).
pub(super) struct Pool {
    pub targets: Option<Vec<TargetId>>,
    pub strategy: Option<StrategySpec>,
}

/// The prefill side of a disaggregated route.
pub(super) struct Prefill {
    pub protocol: PdProtocol,
    pub pool: Pool,
}

/// A disaggregated route's two pools.
pub(super) struct Pools {
    pub decode: Pool,
    pub prefill: Prefill,
}

/// The route's pools when it is disaggregated (`Some(Some(_))`), `Some(None)` when it is
/// not, `None` after an error in how it is written.
pub(super) fn pools(
    raw: &mut RawRoute,
    at: &str,
    names: &[Option<String>],
    errs: &mut Collector,
) -> Option<Option<Pools>> {
    let (protocol, prefill, decode) = (
        raw.disaggregation.take(),
        raw.prefill.take(),
        raw.decode.take(),
    );
    if protocol.is_none() && prefill.is_none() && decode.is_none() {
        return Some(None);
    }
    let key = join(at, "disaggregation");
    let protocol = match protocol.as_deref() {
        None => {
            errs.push(
                &key,
                "the route has a `prefill` or `decode` pool but no `disaggregation` protocol",
                "add disaggregation = \"vllm\" (vLLM's KV connectors, e.g. NixlConnector) or \"sglang\" (SGLang's bootstrap server)",
            );
            None
        }
        Some(p) => match PdProtocol::parse(p) {
            Some(p) => Some(p),
            None => {
                errs.push(
                    &key,
                    format!("unknown disaggregation protocol `{p}`"),
                    "write disaggregation = \"vllm\" (prefill, then decode with the prefill's kv_transfer_params) or \"sglang\" (both at once, with bootstrap_host, bootstrap_port and bootstrap_room)",
                );
                None
            }
        },
    };
    let mut ok = true;
    for (field, set) in [
        ("targets", raw.targets.is_some()),
        ("strategy", raw.strategy.is_some()),
    ] {
        if set {
            errs.push(
                join(at, field),
                format!("a disaggregated route has no `{field}` of its own"),
                format!("move `{field}` into the route's `prefill` and `decode` pools: prefill = {{ targets = [\"…\"], strategy = \"cache_aware\" }}, decode = {{ targets = [\"…\"], strategy = \"least_loaded\" }}"),
            );
            ok = false;
        }
    }
    let prefill = pool(prefill, "prefill", at, names, errs);
    let decode = pool(decode, "decode", at, names, errs);
    let (protocol, prefill, decode) = (protocol?, prefill?, decode?);
    if !protocol.allows_shared_targets() {
        shared_targets(&prefill, &decode, protocol, at, names, errs);
    }
    ok.then_some(Some(Pools {
        decode,
        prefill: Prefill {
            protocol,
            pool: prefill,
        },
    }))
}

/// `routes[i].prefill` or `.decode`: required, with targets and (optionally) a strategy.
fn pool(
    raw: Option<RawPdPool>,
    which: &str,
    at: &str,
    names: &[Option<String>],
    errs: &mut Collector,
) -> Option<Pool> {
    let key = join(at, which);
    let Some(raw) = raw else {
        let example = if which == "prefill" {
            "prefill = { targets = [\"…\"], strategy = \"cache_aware\" }"
        } else {
            "decode = { targets = [\"…\"], strategy = \"least_loaded\" }"
        };
        errs.push(
            key,
            format!("a disaggregated route needs a `{which}` pool"),
            format!("add {example}"),
        );
        return None;
    };
    let strategy_key = join(&key, "strategy");
    let strategy = strategy(raw.strategy, &strategy_key, errs);
    if let Some(s) = &strategy {
        if s.requirements().adapter_loading.is_some() {
            errs.push(
                join(&strategy_key, "load_from"),
                format!("the {which} pool's strategy loads LoRA adapters, which a disaggregated route does not do"),
                "remove load_from: load the adapters on the engines beforehand, and lora_aware routes to where they are",
            );
        }
    }
    Some(Pool {
        targets: route_targets(raw.targets, &join(&key, "targets"), names, errs),
        strategy,
    })
}

/// Under a protocol whose engines run in one mode, a target in both pools is an error.
fn shared_targets(
    prefill: &Pool,
    decode: &Pool,
    protocol: PdProtocol,
    at: &str,
    names: &[Option<String>],
    errs: &mut Collector,
) {
    let (Some(p), Some(d)) = (&prefill.targets, &decode.targets) else {
        return;
    };
    for (i, t) in d.iter().enumerate() {
        if p.contains(t) {
            let name = names[*t].as_deref().unwrap_or("?");
            errs.push(
                format!("{at}.decode.targets[{i}]"),
                format!(
                    "target `{name}` is in both pools; under disaggregation = \"{}\" an engine runs either as a prefill or as a decode server",
                    protocol.name()
                ),
                "list each target in one pool only (an SGLang engine is started with --disaggregation-mode prefill or decode)",
            );
        }
    }
}

/// What a disaggregated route cannot have: passthrough prefixes (it splits a JSON
/// inference request in two) and hedging.
pub(super) fn check_route(
    protocol: PdProtocol,
    matcher: &RouteMatch,
    retry: &RetryPolicy,
    at: &str,
    errs: &mut Collector,
) {
    if !matcher.passthrough.is_empty() {
        errs.push(
            join(&join(at, "match"), "passthrough"),
            format!(
                "a disaggregated route (disaggregation = \"{}\") serves inference requests only; it cannot pass other paths through",
                protocol.name()
            ),
            "remove `passthrough` from this route and put it on a route of its own",
        );
    }
    if retry.hedge_after.is_some() {
        errs.push(
            join(at, "hedge_after"),
            "a disaggregated route cannot hedge: a second decode would need a second prefill",
            "remove hedge_after from this route (per_try_timeout and retry_on still bound each leg)",
        );
    }
}

/// The engine kind of each target: as written, else SGLang's for a target of a
/// `disaggregation = "sglang"` route, else vLLM's.
pub(super) fn engine_kinds(targets: &mut [Target], written: &[bool], routes: &[Route]) {
    for r in routes {
        let sglang = r
            .disaggregation
            .is_some_and(|d| d.protocol == PdProtocol::Sglang)
            || r.prefill_of
                .and_then(|m| routes.get(m))
                .and_then(|m| m.disaggregation)
                .is_some_and(|d| d.protocol == PdProtocol::Sglang);
        if !sglang {
            continue;
        }
        for &t in &r.targets {
            if !written.get(t).copied().unwrap_or(true) {
                targets[t].engine = EngineKind::Sglang;
            }
        }
    }
}

/// One target per data-parallel rank: a target with `dp_size = N` becomes N targets named
/// `name[0]` … `name[N-1]` at the same address (a rank's KV events come from the endpoint's
/// port plus its rank, as vLLM publishes them), and each route's targets are renumbered.
pub(super) fn expand_ranks(
    targets: Vec<Target>,
    sizes: &[u32],
    routes: &mut [Route],
) -> Vec<Target> {
    if sizes.iter().all(|&s| s <= 1) {
        return targets;
    }
    let mut out = Vec::with_capacity(targets.len());
    // Old index → the new indices of its ranks.
    let mut ranks: Vec<std::ops::Range<usize>> = Vec::with_capacity(targets.len());
    for (t, size) in targets.into_iter().zip(sizes.iter().copied()) {
        let start = out.len();
        if size <= 1 {
            out.push(t);
        } else {
            for rank in 0..size {
                let mut r = t.clone();
                r.name = format!("{}[{rank}]", t.name);
                r.dp = Some(DpRank {
                    rank,
                    size,
                    engine_name: t.name.clone(),
                });
                if let Some(kv) = &mut r.kv_events {
                    kv.endpoint = port_plus(&kv.endpoint, rank);
                    kv.replay_endpoint = kv.replay_endpoint.as_deref().map(|e| port_plus(e, rank));
                }
                r.lmcache_instance = format!("{}[{rank}]", t.lmcache_instance);
                out.push(r);
            }
        }
        ranks.push(start..out.len());
    }
    for r in routes {
        r.targets = r.targets.iter().flat_map(|&t| ranks[t].clone()).collect();
    }
    out
}

/// `tcp://host:port` with `rank` added to its port (other endpoints unchanged).
fn port_plus(endpoint: &str, rank: u32) -> String {
    let Some((head, port)) = endpoint.rsplit_once(':') else {
        return endpoint.to_string();
    };
    match port.parse::<u32>() {
        Ok(p) if endpoint.starts_with("tcp://") => format!("{head}:{}", p + rank),
        _ => endpoint.to_string(),
    }
}
