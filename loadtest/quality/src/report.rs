//! Renders run summaries as Markdown (one table per scenario) and as JSON.
//!
//! Owns presentation only: it formats what `stats` computed and adds nothing measured. It
//! must not run anything or read clocks beyond the report's header line given to it.

use std::fmt::Write as _;

use serde::Serialize;

use crate::scenario::Scenario;
use crate::stats::RunSummary;

/// The whole output of one invocation.
#[derive(Serialize)]
pub struct Report<'a> {
    pub command: String,
    pub machine: String,
    pub duration_s: f64,
    pub rounds: usize,
    pub workers: usize,
    pub scenarios: Vec<ScenarioReport<'a>>,
}

#[derive(Serialize)]
pub struct ScenarioReport<'a> {
    pub scenario: &'a Scenario,
    pub runs: Vec<RunSummary>,
}

fn fmt_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub fn markdown(report: &Report<'_>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Command: `{}`  \nMachine: {}  \n{} s per run, {} round(s), gateway workers: {}. Every run starts a fresh fleet and gateway, and no warm-up is discarded, so each strategy's cold start is included. Rows pool the requests of every round; the \"by round\" column shows each round on its own. Latencies in ms, measured by the client (request written → first token event; → end of stream). `adaptive a/b/c` = w_latency/w_cost/w_load.\n",
        report.command, report.machine, report.duration_s, report.rounds, report.workers
    );
    for sr in &report.scenarios {
        scenario_table(&mut s, sr);
    }
    s
}

fn scenario_table(s: &mut String, sr: &ScenarioReport<'_>) {
    let sc = sr.scenario;
    let _ = writeln!(s, "#### `{}`: {}\n", sc.name, sc.question);
    let _ = writeln!(s, "- Fleet: {}.", sc.fleet_line());
    let _ = writeln!(s, "- Workload: {}.\n", sc.workload_line());
    let classes = sc.prompts.len() > 1;
    let priced = sc.engines.iter().any(|e| e.price.is_some());
    let mut head = String::from(
        "| strategy | done | err | req/s | TTFT p50 | p95 | p99 | mean | total p50 | total p95 |",
    );
    let mut rule = String::from("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    if classes {
        for p in &sc.prompts {
            let _ = write!(head, " TTFT p95 {} |", p.name);
            rule.push_str("---:|");
        }
    }
    if priced {
        head.push_str(" $ per 1k req |");
        rule.push_str("---:|");
    }
    let names: Vec<&str> = sc.engines.iter().map(|e| e.name).collect();
    let _ = write!(
        head,
        " share ({}) | engine queue, mean ({}) | fallback picks | by round: {} |",
        names.join(" / "),
        names.join(" / "),
        if priced {
            format!("$ per 1k (share of `{}`)", names[0])
        } else {
            format!("TTFT mean (share of `{}`)", names[0])
        }
    );
    rule.push_str("---|---|---|---|");
    let _ = writeln!(s, "{head}\n{rule}");
    for r in &sr.runs {
        let mut row = format!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.completed,
            r.errors,
            r.throughput_rps,
            fmt_ms(r.ttft_ms.p50),
            fmt_ms(r.ttft_ms.p95),
            fmt_ms(r.ttft_ms.p99),
            fmt_ms(r.ttft_ms.mean),
            fmt_ms(r.total_ms.p50),
            fmt_ms(r.total_ms.p95),
        );
        if classes {
            for p in &sc.prompts {
                let v = r.ttft_by_class_ms.get(p.name).map_or(0.0, |d| d.p95);
                let _ = write!(row, " {} |", fmt_ms(v));
            }
        }
        if priced {
            match r.cost_per_1k_usd {
                Some(c) => {
                    let _ = write!(row, " {c:.4} |");
                }
                None => row.push_str(" – |"),
            }
        }
        let shares: Vec<String> = r
            .shares
            .iter()
            .map(|x| format!("{:.0} %", x.fraction * 100.0))
            .collect();
        let queues: Vec<String> = sc
            .engines
            .iter()
            .map(|e| {
                format!(
                    "{:.1}",
                    r.engine_waiting_mean.get(e.name).copied().unwrap_or(0.0)
                )
            })
            .collect();
        let fallbacks = if r.fallbacks.is_empty() {
            "–".to_string()
        } else {
            r.fallbacks
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let by_round: Vec<String> = r
            .rounds
            .iter()
            .map(|b| {
                let share = b.shares.first().copied().unwrap_or(0.0) * 100.0;
                match (priced, b.cost_per_1k_usd) {
                    (true, Some(c)) => format!("{c:.3} ({share:.0} %)"),
                    _ => format!("{} ({share:.0} %)", fmt_ms(b.ttft_mean_ms)),
                }
            })
            .collect();
        let _ = writeln!(
            row,
            " {} | {} | {} | {} |",
            shares.join(" / "),
            queues.join(" / "),
            fallbacks,
            by_round.join(" · ")
        );
        s.push_str(&row);
    }
    let errors: Vec<String> = sr
        .runs
        .iter()
        .filter(|r| !r.error_examples.is_empty())
        .map(|r| format!("{}: {}", r.label, r.error_examples.join("; ")))
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors: {}", errors.join(" — "));
    }
    s.push('\n');
}
