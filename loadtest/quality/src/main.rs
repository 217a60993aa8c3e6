//! `rolter-quality`: routing quality by strategy. The real gateway runs in-process in front of
//! in-process mock engines; every strategy of a scenario runs on a freshly started fleet and
//! gateway with the same closed-loop streaming load, and the client-side results (TTFT,
//! total latency, errors, share per target, estimated spend) are written as Markdown and JSON.
//!
//! This module owns the command line and the order of runs. It must not change the gateway
//! or the mock engines, and it pins nothing: the machine's noise is part of every figure.
//!
//! Modules: `scenario` (fleets, workloads, variants, gateway configuration), `run` (one
//! measured run), `client` (the measuring HTTP client), `stats` (summaries), `report`
//! (Markdown and JSON).

mod client;
mod report;
mod run;
mod scenario;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::report::{Report, ScenarioReport};
use crate::run::RunOptions;

#[derive(Parser, Debug)]
#[command(
    name = "rolter-quality",
    about = "Compare routing strategies on the same in-process fleet and load"
)]
struct Args {
    /// Measured time per run (one strategy on one scenario), e.g. "10s".
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Concurrent closed-loop clients; overrides every scenario's own default.
    #[arg(long)]
    concurrency: Option<usize>,
    /// A scenario name (mixed-speed, queue-limited, prices, prompt-mix) or "all".
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Only these variants: comma-separated strategy names or row labels
    /// (e.g. "least_loaded,fastest"); default: every variant of each scenario.
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Rounds: every variant runs once per round, rounds in turn (A B C A B C …), and the
    /// report pools the rounds' requests and shows each round's headline figures.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Gateway worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seed of the clients' prompt-mix generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the JSON report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the Markdown report here (it is printed to stdout as well).
    #[arg(long)]
    md: Option<PathBuf>,
}

fn machine_note() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "{cores} CPUs, Linux {kernel}; gateway, mock engines and clients in one process on loopback, nothing pinned"
    )
}

fn main() -> ExitCode {
    let args = Args::parse();
    let all = scenario::all();
    let chosen: Vec<scenario::Scenario> = if args.scenario == "all" {
        all
    } else {
        let picked: Vec<_> = all
            .into_iter()
            .filter(|s| s.name == args.scenario)
            .collect();
        if picked.is_empty() {
            eprintln!(
                "unknown scenario {:?}; valid: all, {}",
                args.scenario,
                scenario::names().join(", ")
            );
            return ExitCode::from(2);
        }
        picked
    };
    let wanted = |v: &scenario::Variant| {
        args.strategies.is_empty()
            || args
                .strategies
                .iter()
                .any(|s| s.trim() == v.strategy || s.trim() == v.label)
    };
    for name in &args.strategies {
        let known = chosen
            .iter()
            .flat_map(|s| &s.variants)
            .any(|v| name.trim() == v.strategy || name.trim() == v.label);
        if !known {
            let labels: Vec<&str> = chosen
                .iter()
                .flat_map(|s| s.variants.iter().map(|v| v.label.as_str()))
                .collect();
            eprintln!(
                "--strategies: {name:?} names no variant of the chosen scenarios; valid: {}",
                labels.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let command = format!(
        "rolter-quality {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let rounds = args.rounds.max(1);
    let plan: Vec<(usize, Vec<usize>)> = chosen
        .iter()
        .enumerate()
        .map(|(i, sc)| {
            let vs = (0..sc.variants.len())
                .filter(|&v| wanted(&sc.variants[v]))
                .collect();
            (i, vs)
        })
        .collect();
    // data[scenario][variant slot] = one RunData per round that succeeded.
    let mut data: Vec<Vec<Vec<stats::RunData>>> = plan
        .iter()
        .map(|(_, vs)| vs.iter().map(|_| Vec::new()).collect())
        .collect();
    let mut failed = false;
    for round in 0..rounds {
        for (si, (sc_index, vs)) in plan.iter().enumerate() {
            let sc = &chosen[*sc_index];
            for (slot, &vi) in vs.iter().enumerate() {
                let v = &sc.variants[vi];
                let opts = RunOptions {
                    duration: args.duration,
                    concurrency: args.concurrency.unwrap_or(sc.concurrency).max(1),
                    workers: args.workers.max(1),
                    seed: args.seed.wrapping_add(round as u64),
                };
                eprintln!(
                    "round {}/{rounds}: {} / {}: running for {:?}",
                    round + 1,
                    sc.name,
                    v.label,
                    args.duration
                );
                match run::run(sc, v, &opts) {
                    Ok(d) => {
                        let done = d.records.iter().filter(|r| r.outcome.status == 200).count();
                        eprintln!("  {} requests, {done} answered 200", d.records.len());
                        data[si][slot].push(d);
                    }
                    Err(e) => {
                        eprintln!("  run failed: {e}");
                        failed = true;
                    }
                }
            }
        }
    }
    let mut reports = Vec::new();
    for ((sc_index, vs), per_variant) in plan.iter().zip(data) {
        let sc = &chosen[*sc_index];
        let runs: Vec<stats::RunSummary> = vs
            .iter()
            .zip(per_variant)
            .filter(|(_, d)| !d.is_empty())
            .map(|(&vi, d)| {
                let v = &sc.variants[vi];
                let meta = stats::RunMeta {
                    label: v.label.clone(),
                    strategy: v.strategy.to_string(),
                    scrape: v.scrape,
                    concurrency: args.concurrency.unwrap_or(sc.concurrency).max(1),
                    workers: args.workers.max(1),
                };
                stats::summarise(sc, meta, &d)
            })
            .collect();
        if !runs.is_empty() {
            reports.push(ScenarioReport { scenario: sc, runs });
        }
    }
    let report = Report {
        command,
        machine: machine_note(),
        duration_s: args.duration.as_secs_f64(),
        rounds,
        workers: args.workers.max(1),
        scenarios: reports,
    };
    let md = report::markdown(&report);
    println!("{md}");
    if let Some(p) = &args.md {
        if let Err(e) = std::fs::write(p, &md) {
            eprintln!("cannot write {}: {e}", p.display());
            failed = true;
        }
    }
    if let Some(p) = &args.out {
        let json = serde_json::to_string_pretty(&report).expect("report serialises");
        if let Err(e) = std::fs::write(p, json + "\n") {
            eprintln!("cannot write {}: {e}", p.display());
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
