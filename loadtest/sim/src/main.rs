//! `rolter-sim`: runs the gateway's strategies over generated workloads on a simulated
//! fleet and reports prefix-cache hit rate, TTFT and load spread per strategy.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rolter_sim::sim::{strategy_policy, CoreAssign, LoadView, Policy, SimConfig};
use rolter_sim::store::{Share, SyncPeriods};
use rolter_sim::workload::{Kind, Sizes};
use rolter_sim::FleetDefaults;

#[derive(Parser, Debug)]
#[command(
    name = "rolter-sim",
    about = "Fleet simulator: Rolter's strategies on modelled engines over generated workloads"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Small workloads: every workload and strategy in a few seconds.
    #[arg(long)]
    quick: bool,
    /// Workload size multiplier (overrides the --quick / full preset).
    #[arg(long)]
    scale: Option<f64>,
    /// Seed of the workloads, the strategies and the core assignment.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Workloads, comma-separated: multi-turn, multi-turn-no-header, rag, few-shot, mixed,
    /// hetero, lora (alias many-adapters), few-users, or `all`.
    #[arg(long, default_value = "all")]
    workloads: String,
    /// Strategies by registry name or alias, comma-separated, or `all` for every registered
    /// strategy; names the registry does not know are skipped with a warning.
    #[arg(
        long,
        default_value = "round_robin,least_loaded,power_of_two,consistent_hash,cache_aware,pipeline,lora_aware"
    )]
    strategies: String,
    /// A strategy option, `name.key=value` (value in TOML syntax, bare words as strings);
    /// repeatable.
    #[arg(long = "option", value_name = "NAME.KEY=VALUE")]
    options: Vec<String>,
    /// Leave out the oracle.
    #[arg(long)]
    no_oracle: bool,
    /// Gateway replicas behind an L4 balancer (each request to one at random), each with
    /// `--cores` cores of its own strategy instances.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// What replicas share through the simulated store: `none`, `all`, or a list of
    /// `sessions`, `prefixes`, `load`.
    #[arg(long, default_value = "none")]
    share: Share,
    /// How long the store takes to bring a replica's publication to the others,
    /// milliseconds (then applied at their next exchange tick).
    #[arg(long, default_value_t = 0.0)]
    store_delay_ms: f64,
    /// The replicas' sync interval, milliseconds: each replica publishes its shared items
    /// at its next sync tick and reads the others' at its own (0: as they happen, read at
    /// the next exchange tick after the store delay).
    #[arg(long, default_value_t = 0.0)]
    sync_ms: f64,
    /// How often a replica publishes and reads the fleet's load (`--share load`),
    /// milliseconds (0: every exchange tick); default: `--sync-ms`.
    #[arg(long)]
    load_sync_ms: Option<f64>,
    /// The few-users workload's think time between an answer and the next turn,
    /// milliseconds: `LO-HI` (uniform) or one value.
    #[arg(long, default_value = "20-50", value_parser = parse_range)]
    think_ms: (f64, f64),
    /// The few-users workload's shared system prompts (0: every conversation its own).
    #[arg(long, default_value_t = 4)]
    few_user_systems: usize,
    /// Simulated gateway cores (per replica), each with its own strategy instance.
    #[arg(long, default_value_t = 2)]
    cores: usize,
    /// How requests are spread over the cores.
    #[arg(long, value_enum, default_value_t = CoreAssign::RoundRobin)]
    core_assign: CoreAssign,
    /// Cross-core exchange period, milliseconds.
    #[arg(long, default_value_t = 2.0)]
    exchange_ms: f64,
    /// The load each core sees: `global` (every request in flight plus the engines' queues,
    /// exactly) or `per-core` (its own requests in flight plus the other cores' as of the
    /// last exchange; with no exchange, gateway replicas that share nothing).
    #[arg(long, value_enum, default_value_t = LoadView::Global)]
    load_view: LoadView,
    /// Engines in the fleet.
    #[arg(long, default_value_t = 4)]
    targets: usize,
    /// Running slots per engine.
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Prefix-cache blocks (16 tokens) per engine; default: sized per workload.
    #[arg(long)]
    cache_blocks: Option<usize>,
    /// Constant part of TTFT, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    ttft_base_ms: f64,
    /// Prefill cost per uncached prompt token, milliseconds.
    #[arg(long, default_value_t = 0.05)]
    prefill_ms_per_token: f64,
    /// Inter-token latency, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    itl_ms: f64,
    /// How much slower the hetero workload's slow replica is.
    #[arg(long, default_value_t = 3.0)]
    slow_factor: f64,
    /// LoRA adapter slots per engine (the lora workload).
    #[arg(long, default_value_t = 4)]
    max_loras: usize,
    /// What loading an adapter into a slot costs, milliseconds (the lora workload).
    #[arg(long, default_value_t = 200.0)]
    lora_load_ms: f64,
    /// The gateway's metrics scrape period, milliseconds: the staleness of the LoRA
    /// residency signal.
    #[arg(long, default_value_t = 1000.0)]
    scrape_ms: f64,
    /// Worker threads (runs are independent; results do not depend on this).
    #[arg(long)]
    threads: Option<usize>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Also write the Markdown report to this file.
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Disaggregated prefill/decode fleets (P prefill + D decode engines) against
    /// co-located fleets of P + D engines, per workload shape and P:D ratio.
    Pd(rolter_sim::pd::cli::PdArgs),
    /// The gateway's queue under overload, with and without admission features: priority
    /// classes, fair queueing between tenants, deadlines.
    Admission(rolter_sim::admission::cli::AdmissionArgs),
}

/// `LO-HI` or `V` (both bounds V), non-negative, LO ≤ HI.
fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let num = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("`{v}` is not a non-negative number"))
    };
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (num(lo)?, num(hi)?),
        None => (num(s)?, num(s)?),
    };
    if lo > hi {
        return Err(format!("`{s}`: the lower bound is above the upper"));
    }
    Ok((lo, hi))
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1e3)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let done = match &args.command {
        Some(Command::Pd(pd)) => run_pd(pd),
        Some(Command::Admission(a)) => run_admission(a),
        None => run(args),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rolter-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    if let Some(s) = args.scale {
        if !s.is_finite() || s <= 0.0 {
            return Err("--scale must be positive".into());
        }
        sizes.scale = s;
    }
    sizes.think_ms = args.think_ms;
    sizes.few_user_systems = args.few_user_systems;
    let kinds: Vec<Kind> = if args.workloads == "all" {
        Kind::ALL.to_vec()
    } else {
        args.workloads
            .split(',')
            .map(|s| {
                Kind::parse(s.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                    format!("unknown workload `{s}`; valid: {}", names.join(", "))
                })
            })
            .collect::<Result<_, _>>()?
    };
    let policies = policies(&args)?;
    let fleet = FleetDefaults {
        targets: args.targets.max(1),
        max_running: args.max_running.max(1),
        ttft_base: ms(args.ttft_base_ms),
        prefill_per_token: ms(args.prefill_ms_per_token),
        itl: ms(args.itl_ms),
        cache_blocks: args.cache_blocks,
        slow_factor: args.slow_factor,
        max_loras: args.max_loras.max(1),
        lora_load_delay: ms(args.lora_load_ms),
    };
    if args.replicas == 0 {
        return Err("--replicas must be at least 1".into());
    }
    if args.replicas == 1 && args.share != Share::NONE {
        eprintln!("warning: --share has no effect with one replica (set --replicas)");
    }
    let cfg = SimConfig {
        replicas: args.replicas,
        share: args.share,
        store_delay: ms(args.store_delay_ms),
        sync: SyncPeriods {
            items: ms(args.sync_ms),
            load: ms(args.load_sync_ms.unwrap_or(args.sync_ms)),
        },
        cores: args.cores.max(1),
        core_assign: args.core_assign,
        exchange: ms(args.exchange_ms),
        scrape: ms(args.scrape_ms.max(1.0)),
        load_view: args.load_view,
        seed: args.seed,
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let started = Instant::now();
    let report = rolter_sim::run_matrix(&kinds, &policies, &sizes, &fleet, &cfg, threads, &|r| {
        eprintln!(
            "  {:<22} {:<28} hit {:>5.1}%  ttft p99 {:>7.0} ms{}",
            r.workload,
            r.policy,
            r.hit_rate * 100.0,
            r.ttft_p99_ms,
            r.adapter_loads
                .map(|l| format!("  adapter loads {l}"))
                .unwrap_or_default()
        )
    });
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    let md = report.to_markdown();
    print!("{md}");
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, report.to_json()).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

/// The strategies named on the command line with their options, and the oracle.
fn policies(args: &Args) -> Result<Vec<Policy>, String> {
    let options = rolter_sim::parse_options(&args.options)?;
    let names: Vec<String> = if args.strategies == "all" {
        rolter::strategy::registry::all()
            .iter()
            .filter(|i| {
                // The simulator has no LMCache controller to ask.
                let asks_a_controller = rolter::strategy::StrategySpec::with_defaults(i.name)
                    .is_some_and(|s| s.requirements().cache_lookup.is_some());
                if asks_a_controller {
                    eprintln!(
                        "rolter-sim: skipping {} (it asks an LMCache controller, which the simulator does not model; rolter-quality --replay runs it against one)",
                        i.name
                    );
                }
                !asks_a_controller
            })
            .map(|i| i.name.to_string())
            .collect()
    } else {
        args.strategies
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "oracle")
            .collect()
    };
    let mut policies = Vec::new();
    for name in &names {
        let opts = options
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        match strategy_policy(name, opts)? {
            Some(p) => policies.push(p),
            None => eprintln!("warning: strategy `{name}` is not in the registry; skipped"),
        }
    }
    for (name, _) in &options {
        if !names.contains(name) {
            eprintln!("warning: options given for `{name}`, which is not being run");
        }
    }
    if !args.no_oracle {
        policies.push(Policy::Oracle);
    }
    if policies.is_empty() {
        return Err("no policy to run".into());
    }
    Ok(policies)
}

fn run_pd(args: &rolter_sim::pd::cli::PdArgs) -> Result<(), String> {
    let started = Instant::now();
    let report = rolter_sim::pd::cli::run_pd(args, &|r| {
        eprintln!(
            "  {:<12} {:<14} {:<28} hit {:>5.1}%  ttft p99 {:>7.0} ms  tpot p99 {:>5.1} ms",
            r.workload,
            r.layout,
            r.strategies,
            r.hit_rate * 100.0,
            r.ttft_p99_ms,
            r.tpot_p99_ms
        )
    })?;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    let md = report.to_markdown();
    print!("{md}");
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, report.to_json()).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

fn run_admission(args: &rolter_sim::admission::cli::AdmissionArgs) -> Result<(), String> {
    use rolter_sim::admission::cli::{mode_name, run_admission};
    let started = Instant::now();
    let report = run_admission(args, &|r| {
        let first = &r.classes[0];
        eprintln!(
            "  {:<8} queue_max {:<5} {:<9} {} ttft p99 {:>6.0} ms  Jain {:.3}  displaced {}",
            r.scenario,
            r.queue_max,
            mode_name(r.mode),
            first.name,
            first.ttft_p99_ms,
            r.jain,
            r.displaced
        )
    })?;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    let md = report.to_markdown();
    print!("{md}");
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, report.to_json()).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}
