//! Rolter's fleet simulator: the gateway's real strategies, built through the registry
//! exactly as a worker builds them, routing generated workloads over modelled inference
//! engines on a virtual clock. No sockets, no threads per request, no wall-clock reads:
//! a run is a pure function of its seed and settings.
//!
//! - [`engine`]: slots, FIFO queue, serialised prefill and an LRU prefix cache of blocks.
//! - [`adapters`]: an engine's LoRA adapter slots (LRU, load delay, slot loads).
//! - [`workload`]: multi-turn chat, RAG, few-shot, mixed long/short, heterogeneous fleet,
//!   many LoRA adapters, a few users with short think times.
//! - [`fleet`]: the fleet's configuration, parsed by the gateway's loader.
//! - [`sim`]: the event loop, R gateway replicas of N cores with the cross-core exchange,
//!   the oracle.
//! - [`store`]: the store the replicas share state through, with its delay and sync ticks.
//! - [`lora_feed`]: the gateway's LoRA residency signal (scraped, published, looked up).
//! - [`report`]: Markdown and JSON.
//! - [`pd`]: disaggregated prefill/decode fleets against co-located ones (`rolter-sim pd`).
//! - [`admission`]: the gateway's queue under overload, with and without priority classes,
//!   fair queueing between tenants and deadlines (`rolter-sim admission`).

pub mod adapters;
pub mod admission;
pub mod engine;
pub mod fleet;
pub mod lora_feed;
pub mod pd;
pub mod report;
pub mod sim;
pub mod store;
pub mod workload;

use std::time::Duration;

use adapters::LoraParams;
use engine::EngineParams;
use report::{Report, WorkloadInfo};
use sim::{FleetSpec, Policy, RunResult, SimConfig};
use workload::{Kind, Sizes, Workload};

/// The fleet every workload runs on unless told otherwise.
#[derive(Debug, Clone, Copy)]
pub struct FleetDefaults {
    pub targets: usize,
    pub max_running: usize,
    pub ttft_base: Duration,
    pub prefill_per_token: Duration,
    pub itl: Duration,
    /// Per-engine cache in blocks; `None`: [`cache_blocks`] of the workload.
    pub cache_blocks: Option<usize>,
    /// The slow replica's factor in the `hetero` workload.
    pub slow_factor: f64,
    /// Adapter slots per engine in the `lora` workload.
    pub max_loras: usize,
    /// What a slot load costs in the `lora` workload.
    pub lora_load_delay: Duration,
}

impl Default for FleetDefaults {
    fn default() -> Self {
        FleetDefaults {
            targets: 4,
            max_running: 64,
            ttft_base: Duration::from_millis(20),
            prefill_per_token: Duration::from_micros(50),
            itl: Duration::from_millis(10),
            cache_blocks: None,
            slow_factor: 3.0,
            max_loras: 4,
            lora_load_delay: Duration::from_millis(200),
        }
    }
}

/// Prefix-cache blocks per engine of the `few-users` workload.
pub const FEW_USERS_CACHE_BLOCKS: usize = 160;

/// Prefix-cache blocks per engine for `kind`. Arrival rates do not change with the scale,
/// so the live working set (and so these sizes) does not either.
pub fn cache_blocks(kind: Kind) -> usize {
    match kind {
        // About 600 conversations are live at once (7 users/s, ~90 s each), growing to
        // ~200 blocks: the fleet's 64k blocks hold about half of their history when each
        // conversation stays on one engine, and far less when every engine keeps a copy.
        Kind::MultiTurn | Kind::MultiTurnNoHeader | Kind::Hetero => 16000,
        // 24 documents of 250 blocks: the fleet holds every document, one engine a quarter.
        Kind::Rag => 1500,
        // 6 templates of ~190 blocks: one engine holds about half of them.
        Kind::FewShot => 600,
        // Long unique prompts (~560 blocks each) keep churning the caches.
        Kind::Mixed => 8192,
        // Per-adapter system prompts (~7 blocks) and unique questions (~20 blocks): the
        // caches keep every system prompt and a few hundred recent questions.
        Kind::Lora => 4000,
        // Six live conversations (up to ~140 blocks each, ~70 on average) behind four
        // system prompts (25 blocks each): the fleet holds them, one engine about two.
        Kind::FewUsers => FEW_USERS_CACHE_BLOCKS,
    }
}

/// The fleet for `workload`.
pub fn fleet_for(workload: &Workload, d: &FleetDefaults) -> FleetSpec {
    FleetSpec {
        targets: d.targets,
        engine: EngineParams {
            max_running: d.max_running,
            cache_blocks: d
                .cache_blocks
                .unwrap_or_else(|| cache_blocks(workload.kind)),
            ttft_base: d.ttft_base,
            prefill_per_token: d.prefill_per_token,
            itl: d.itl,
        },
        slow: (workload.kind == Kind::Hetero).then_some((0, d.slow_factor)),
        lora: (workload.adapters > 0).then_some(LoraParams {
            max_loras: d.max_loras.max(1),
            load_delay: d.lora_load_delay,
        }),
    }
}

/// Runs every workload × policy, on `threads` threads; results in workload, policy order.
pub fn run_matrix(
    kinds: &[Kind],
    policies: &[Policy],
    sizes: &Sizes,
    fleet: &FleetDefaults,
    cfg: &SimConfig,
    threads: usize,
    progress: &(dyn Fn(&RunResult) + Sync),
) -> Report {
    // Multi-turn variants share one generated workload.
    let mut workloads: Vec<(Workload, WorkloadInfo)> = Vec::new();
    for &kind in kinds {
        let w = match workloads.iter().find(|(w, _)| {
            matches!(
                w.kind,
                Kind::MultiTurn | Kind::MultiTurnNoHeader | Kind::Hetero
            ) && matches!(
                kind,
                Kind::MultiTurn | Kind::MultiTurnNoHeader | Kind::Hetero
            )
        }) {
            Some((w, _)) => Workload {
                kind,
                sessions: w.sessions.clone(),
                adapters: w.adapters,
            },
            None => workload::generate(kind, sizes, cfg.seed),
        };
        let footprint = w.footprint_blocks();
        let spec = fleet_for(&w, fleet);
        let info = WorkloadInfo {
            name: kind.name().to_string(),
            requests: w.requests(),
            sessions: w.sessions.len(),
            footprint_blocks: footprint,
            fleet_cache_ratio: (spec.engine.cache_blocks * spec.targets) as f64
                / footprint.max(1) as f64,
            fleet: spec,
            adapters: w.adapters,
        };
        workloads.push((w, info));
    }
    let jobs: Vec<(usize, usize)> = (0..workloads.len())
        .flat_map(|w| (0..policies.len()).map(move |p| (w, p)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<RunResult>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(w, p)) = jobs.get(j) else { break };
                let (wl, info) = &workloads[w];
                let r = sim::run(wl, &info.fleet, &policies[p], cfg);
                progress(&r);
                *slots[j].lock().expect("result slot") = Some(r);
            });
        }
    });
    Report {
        seed: cfg.seed,
        sim: *cfg,
        sizes: *sizes,
        workloads: workloads.into_iter().map(|(_, i)| i).collect(),
        results: slots
            .into_iter()
            .map(|s| s.into_inner().expect("result slot").expect("every job ran"))
            .collect(),
    }
}

/// Parses `NAME.KEY=VALUE` strategy options (the command lines' `--option`) into one table
/// per strategy name, in first-seen order. A value is read as TOML (`0.3`, `"30s"`, `true`)
/// and kept as a bare string when it is not TOML (`least_loaded`).
pub fn parse_options(raw: &[String]) -> Result<Vec<(String, toml::Table)>, String> {
    let mut out: Vec<(String, toml::Table)> = Vec::new();
    for o in raw {
        let (path, value) = o
            .split_once('=')
            .ok_or_else(|| format!("option `{o}`: expected NAME.KEY=VALUE"))?;
        let (name, key) = path
            .split_once('.')
            .ok_or_else(|| format!("option `{o}`: expected NAME.KEY=VALUE"))?;
        let value = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.trim().to_string()));
        let name = name.trim().to_string();
        let key = key.trim().to_string();
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => {
                t.insert(key, value);
            }
            None => out.push((name, toml::Table::from_iter([(key, value)]))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_options;

    #[test]
    fn options_parse_as_toml_values() {
        let o = parse_options(&[
            "cache_aware.threshold=0.3".into(),
            "cache_aware.session_ttl=\"30s\"".into(),
            "failover.within_tier=least_loaded".into(),
        ])
        .unwrap();
        assert_eq!(o.len(), 2);
        assert_eq!(o[0].1["threshold"].as_float(), Some(0.3));
        assert_eq!(o[0].1["session_ttl"].as_str(), Some("30s"));
        assert_eq!(o[1].1["within_tier"].as_str(), Some("least_loaded"));
        assert!(parse_options(&["nodot=1".into()]).is_err());
    }
}
