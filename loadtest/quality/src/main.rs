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
mod replay;
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
    /// Instead of the scenarios: replay a `rolter-sim` workload (multi-turn,
    /// multi-turn-no-header, rag, few-shot, mixed) end to end and in the simulator, and
    /// compare prefix-cache hit rates. `--strategies` chooses the strategies (default:
    /// round_robin, least_loaded, consistent_hash, cache_aware, pipeline; any registered
    /// name, e.g. precise_cache_aware).
    #[arg(long)]
    replay: Option<String>,
    /// Replay: workload size multiplier.
    #[arg(long, default_value_t = 0.1)]
    replay_scale: f64,
    /// Replay: every time of the workload and the fleet is multiplied by this.
    #[arg(long, default_value_t = 0.25)]
    time_scale: f64,
    /// Replay: prefix-cache blocks (16 tokens) per engine, for the mocks and the simulator
    /// alike; smaller caches make the engines evict.
    #[arg(long, default_value_t = 5000)]
    cache_blocks: usize,
    /// Replay: independent gateway replicas in front of the same engines, sharing nothing;
    /// each request goes to one chosen at random (a load balancer without session
    /// affinity). The simulator runs as many gateway cores that never exchange what they
    /// learn, a random core per request.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Replay: the mocks publish KV-cache events and every gateway subscribes, for every
    /// strategy (always so for strategies that read them, such as precise_cache_aware).
    #[arg(long)]
    kv_events: bool,
    /// Replay: a strategy option, `NAME.KEY=VALUE` (value in TOML syntax, bare words as
    /// strings), for the gateways and the simulator alike; repeatable.
    #[arg(long = "option", value_name = "NAME.KEY=VALUE")]
    options: Vec<String>,
    /// Replay: fail (exit 1) when a strategy's end-to-end hit rate differs from the
    /// simulated one by more than this many percentage points.
    #[arg(long)]
    max_gap: Option<f64>,
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
    if let Some(workload) = args.replay.clone() {
        return replay_main(&args, workload);
    }
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
    if !publish(&args, &md, &report) {
        failed = true;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--replay`: every strategy end to end and simulated on the same workload.
fn replay_main(args: &Args, workload: String) -> ExitCode {
    let opts = replay::ReplayOptions {
        workload,
        scale: args.replay_scale,
        time_scale: args.time_scale,
        cache_blocks: args.cache_blocks,
        workers: args.workers.max(1),
        replicas: args.replicas,
        kv_events: args.kv_events,
        options: args.options.clone(),
        seed: args.seed,
        ..replay::ReplayOptions::default()
    };
    if !(opts.scale > 0.0 && opts.time_scale > 0.0) {
        eprintln!("--replay-scale and --time-scale must be positive");
        return ExitCode::from(2);
    }
    if opts.replicas == 0 || opts.cache_blocks == 0 {
        eprintln!("--replicas and --cache-blocks must be at least 1");
        return ExitCode::from(2);
    }
    let w = match opts.workload() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("--replay: {e}");
            return ExitCode::from(2);
        }
    };
    let strategies: Vec<String> = if args.strategies.is_empty() {
        [
            "round_robin",
            "least_loaded",
            "consistent_hash",
            "cache_aware",
            "pipeline",
        ]
        .map(String::from)
        .to_vec()
    } else {
        args.strategies
            .iter()
            .map(|s| s.trim().to_string())
            .collect()
    };
    let mut rows = Vec::new();
    let mut failed = false;
    for s in &strategies {
        let simulated = match replay::simulate(&w, &opts, s) {
            Ok(side) => side,
            Err(e) => {
                eprintln!("--strategies / --option: {e}");
                return ExitCode::from(2);
            }
        };
        eprintln!(
            "replay {} / {s}: end to end ({} requests)",
            opts.workload,
            w.requests()
        );
        match replay::end_to_end(&w, &opts, s) {
            Ok((end_to_end, seconds)) => {
                eprintln!(
                    "  hit rate {:.1} % end to end, {:.1} % simulated, {} fallbacks end to end, {seconds:.1} s",
                    end_to_end.hit_rate * 100.0,
                    simulated.hit_rate * 100.0,
                    end_to_end.fallbacks
                );
                rows.push(replay::ReplayRow {
                    strategy: opts.label(s),
                    end_to_end,
                    simulated,
                    seconds,
                });
            }
            Err(e) => {
                eprintln!("  run failed: {e}");
                failed = true;
            }
        }
    }
    let report = replay::ReplayReport {
        command: format!(
            "rolter-quality {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        ),
        machine: machine_note(),
        sessions: w.sessions.len(),
        requests: w.requests(),
        options: opts,
        rows,
    };
    let md = report.markdown();
    if !publish(args, &md, &report) {
        failed = true;
    }
    let failures: u64 = report.rows.iter().map(|r| r.end_to_end.failed).sum();
    if failures > 0 {
        eprintln!("{failures} end-to-end requests failed");
        failed = true;
    }
    if let Some(limit) = args.max_gap {
        let gap = report.max_gap_points();
        if gap > limit {
            eprintln!("hit rates differ by {gap:.1} points (limit {limit})");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints the Markdown report and writes it (`--md`) and the JSON one (`--out`); false when
/// a file could not be written.
fn publish(args: &Args, md: &str, report: &impl serde::Serialize) -> bool {
    println!("{md}");
    let mut ok = true;
    if let Some(p) = &args.md {
        if let Err(e) = std::fs::write(p, md) {
            eprintln!("cannot write {}: {e}", p.display());
            ok = false;
        }
    }
    if let Some(p) = &args.out {
        let json = serde_json::to_string_pretty(report).expect("report serialises");
        if let Err(e) = std::fs::write(p, json + "\n") {
            eprintln!("cannot write {}: {e}", p.display());
            ok = false;
        }
    }
    ok
}
