//! The report: per workload the fleet it ran on, and per policy the metrics of its run, as
//! Markdown and JSON.

use std::fmt::Write;

use serde::Serialize;

use crate::sim::{FleetSpec, RunResult, SimConfig};
use crate::workload::Sizes;

/// One workload as run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    pub name: String,
    pub requests: usize,
    pub sessions: usize,
    /// Distinct prompt blocks over the whole workload.
    pub footprint_blocks: usize,
    /// Fleet cache capacity ÷ footprint (below 1: the fleet cannot hold everything).
    pub fleet_cache_ratio: f64,
    pub fleet: FleetSpec,
    /// LoRA adapters the requests name (0: base model only).
    #[serde(skip_serializing_if = "is_zero")]
    pub adapters: usize,
}

/// How the replicas sync, for the report's header (nothing when items and load go as
/// they happen).
fn sync_label(sync: &crate::store::SyncPeriods) -> String {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    match (sync.items.is_zero(), sync.load.is_zero()) {
        (true, true) => String::new(),
        _ => format!(
            " (items synced every {} ms, load every {} ms; 0: as they happen)",
            ms(sync.items),
            ms(sync.load)
        ),
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// Everything one invocation produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    pub sim: SimConfig,
    pub sizes: Sizes,
    pub workloads: Vec<WorkloadInfo>,
    pub results: Vec<RunResult>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }

    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Fleet simulation\n\nseed {}, {}{} gateway cores ({} assignment), exchange every {} ms, {} load view, scale {}\n",
            self.seed,
            if self.sim.replicas > 1 {
                format!(
                    "{} replicas (a random one per request) sharing {} through a store with {} ms delay{}, each with ",
                    self.sim.replicas,
                    self.sim.share.label(),
                    self.sim.store_delay.as_secs_f64() * 1e3,
                    sync_label(&self.sim.sync)
                )
            } else {
                String::new()
            },
            self.sim.cores,
            match self.sim.core_assign {
                crate::sim::CoreAssign::RoundRobin => "round-robin",
                crate::sim::CoreAssign::Random => "random",
            },
            self.sim.exchange.as_secs_f64() * 1e3,
            match self.sim.load_view {
                crate::sim::LoadView::Global => "global",
                crate::sim::LoadView::PerCore => "per-core",
            },
            self.sizes.scale
        );
        for w in &self.workloads {
            let e = &w.fleet.engine;
            let _ = writeln!(
                out,
                "## {}\n\n{} requests in {} sessions; {} engines × {} slots, cache {} blocks each \
                 (fleet holds {:.0}% of the {} distinct prompt blocks); prefill {:.3} ms/token, \
                 ITL {:.1} ms{}\n",
                w.name,
                w.requests,
                w.sessions,
                w.fleet.targets,
                e.max_running,
                e.cache_blocks,
                w.fleet_cache_ratio * 100.0,
                w.footprint_blocks,
                e.prefill_per_token.as_secs_f64() * 1e3,
                e.itl.as_secs_f64() * 1e3,
                match w.fleet.slow {
                    Some((t, f)) => format!("; engine-{t} is {f}× slower"),
                    None => String::new(),
                }
            );
            if let Some(l) = &w.fleet.lora {
                let _ = writeln!(
                    out,
                    "{} adapters; {} adapter slots per engine, a slot load costs {:.0} ms; \
                     LoRA residency scraped every {:.0} ms\n",
                    w.adapters,
                    l.max_loras,
                    l.load_delay.as_secs_f64() * 1e3,
                    self.sim.scrape.as_secs_f64() * 1e3
                );
                self.lora_table(&mut out, &w.name);
                continue;
            }
            let _ = writeln!(
                out,
                "| policy | requests | hit rate | TTFT mean ms | p50 ms | p99 ms | load spread | per target | sticky sessions |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|---:|");
            for r in self.results.iter().filter(|r| r.workload == w.name) {
                let per: Vec<String> = r.per_target.iter().map(|c| c.to_string()).collect();
                let _ = writeln!(
                    out,
                    "| {} | {}{} | {:.1}% | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} |",
                    r.policy,
                    r.requests,
                    if r.rejected > 0 {
                        format!(" ({} rejected)", r.rejected)
                    } else {
                        String::new()
                    },
                    r.hit_rate * 100.0,
                    r.ttft_mean_ms,
                    r.ttft_p50_ms,
                    r.ttft_p99_ms,
                    r.load_spread,
                    per.join("/"),
                    r.sticky_sessions
                        .map(|s| format!("{:.0}%", s * 100.0))
                        .unwrap_or_else(|| "–".into()),
                );
            }
            out.push('\n');
        }
        out
    }

    /// The table of a workload on engines with adapter slots: adapter loads first.
    fn lora_table(&self, out: &mut String, workload: &str) {
        let _ = writeln!(
            out,
            "| policy | requests | adapter loads | per 1k requests | TTFT mean ms | p50 ms | p99 ms | load spread | per target | loads per target | hit rate |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|");
        let join = |v: &[u64]| {
            v.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join("/")
        };
        for r in self.results.iter().filter(|r| r.workload == workload) {
            let _ = writeln!(
                out,
                "| {} | {}{} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {:.1}% |",
                r.policy,
                r.requests,
                if r.rejected > 0 {
                    format!(" ({} rejected)", r.rejected)
                } else {
                    String::new()
                },
                r.adapter_loads.unwrap_or(0),
                r.adapter_loads_per_1k.unwrap_or(0.0),
                r.ttft_mean_ms,
                r.ttft_p50_ms,
                r.ttft_p99_ms,
                r.load_spread,
                join(&r.per_target),
                join(r.adapter_loads_per_target.as_deref().unwrap_or(&[])),
                r.hit_rate * 100.0,
            );
        }
        out.push('\n');
    }
}
