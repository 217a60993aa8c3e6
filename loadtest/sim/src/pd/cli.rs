//! `rolter-sim pd`: P/D fleets of P prefill + D decode engines against co-located fleets
//! of P + D engines, per workload shape and P:D ratio, on the same generated workload;
//! the report as Markdown and JSON. Parsing and the run matrix only: the model is in
//! [`super`] and [`super::node`].

use std::fmt::Write;
use std::time::Duration;

use rolter::strategy::StrategySpec;
use serde::Serialize;

use super::node::NodeParams;
use super::shapes::Shape;
use super::{run, PdParams, PdResult, Pool, Protocol, Setup, Slo, Transfer};
use crate::sim::{strategy_policy, Policy};

/// The `pd` command's options.
#[derive(clap::Args, Debug, Clone)]
pub struct PdArgs {
    /// Workload shapes, comma-separated: long-prompt, long-output, chat.
    #[arg(long, default_value = "long-prompt,long-output")]
    pub shapes: String,
    /// P:D ratios, comma-separated (prefill engines:decode engines); each also runs a
    /// co-located fleet of P + D engines.
    #[arg(long, default_value = "2:2,1:3,3:1")]
    pub ratios: String,
    /// The prefill pool's strategy.
    #[arg(long, default_value = "cache_aware")]
    pub prefill: String,
    /// The decode pool's strategy.
    #[arg(long, default_value = "least_loaded")]
    pub decode: String,
    /// The co-located route's strategy.
    #[arg(long, default_value = "cache_aware")]
    pub colocated: String,
    /// A strategy option, `name.key=value`, for that strategy wherever it runs; repeatable.
    #[arg(long = "option", value_name = "NAME.KEY=VALUE")]
    pub options: Vec<String>,
    /// The P/D wire protocol: `vllm` picks the decode engine when the prefill answered,
    /// `sglang` picks both on arrival.
    #[arg(long, value_enum, default_value_t = Protocol::Vllm)]
    pub protocol: Protocol,
    /// Also run a co-located fleet of the P prefill engines alone (the same prefix caches
    /// as the P/D prefill pool).
    #[arg(long)]
    pub same_prefill_engines: bool,
    /// Requests carry `x-session-id` (off: strategies hash the conversation).
    #[arg(long)]
    pub session_header: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Multiplies the number of users (not their arrival rate).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Multiplies the shapes' arrival rates.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Sequences decoding at once per engine.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Prefix-cache blocks (16 tokens) per prefilling engine.
    #[arg(long, default_value_t = 16000)]
    pub cache_blocks: usize,
    /// KV-memory blocks for running sequences per decoding engine.
    #[arg(long, default_value_t = 24000)]
    pub kv_blocks: usize,
    /// Constant part of a prefill, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub prefill_base_ms: f64,
    /// Prefill cost per uncached prompt token, milliseconds.
    #[arg(long, default_value_t = 0.05)]
    pub prefill_ms_per_token: f64,
    /// A decode step with one sequence, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub itl_ms: f64,
    /// What each further sequence in the batch adds to a decode step, milliseconds.
    #[arg(long, default_value_t = 0.1)]
    pub itl_ms_per_seq: f64,
    /// Fixed part of a KV transfer, milliseconds.
    #[arg(long, default_value_t = 2.0)]
    pub transfer_latency_ms: f64,
    /// KV transfer bandwidth in prompt tokens per second.
    #[arg(long, default_value_t = 200_000.0)]
    pub transfer_tokens_per_s: f64,
    /// Goodput's TTFT objective, milliseconds.
    #[arg(long, default_value_t = 2000.0)]
    pub slo_ttft_ms: f64,
    /// Goodput's TPOT objective, milliseconds.
    #[arg(long, default_value_t = 25.0)]
    pub slo_tpot_ms: f64,
    /// Worker threads (runs are independent; results do not depend on this).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Also write the Markdown report to this file.
    #[arg(long)]
    pub markdown: Option<std::path::PathBuf>,
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1e3)
}

/// One shape as run.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeInfo {
    pub shape: Shape,
    pub requests: usize,
    pub sessions: usize,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    pub offered_per_s: f64,
}

/// Everything one `pd` invocation produced.
#[derive(Debug, Clone, Serialize)]
pub struct PdReport {
    pub params: PdParams,
    pub protocol: Protocol,
    pub session_header: bool,
    pub scale: f64,
    pub rate: f64,
    pub shapes: Vec<ShapeInfo>,
    pub results: Vec<PdResult>,
}

/// A registry strategy with the options given for its name.
pub fn spec(name: &str, options: &[(String, toml::Table)]) -> Result<StrategySpec, String> {
    let opts = options
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    match strategy_policy(name, opts)? {
        Some(Policy::Strategy(s)) => Ok(s),
        _ => Err(format!("strategy `{name}` is not in the registry")),
    }
}

/// `2:2,1:3` → `[(2, 2), (1, 3)]`.
pub fn parse_ratios(s: &str) -> Result<Vec<(usize, usize)>, String> {
    s.split(',')
        .map(|r| {
            let (p, d) = r
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("ratio `{r}`: expected P:D"))?;
            let p: usize = p.trim().parse().map_err(|_| format!("ratio `{r}`: P"))?;
            let d: usize = d.trim().parse().map_err(|_| format!("ratio `{r}`: D"))?;
            if p == 0 || d == 0 {
                return Err(format!("ratio `{r}`: both pools need an engine"));
            }
            Ok((p, d))
        })
        .collect()
}

/// The setups of one ratio list, in report order: per ratio the P/D fleet, then the
/// co-located fleets not listed yet (P + D engines, and with `same_prefill`, P).
pub fn setups(
    ratios: &[(usize, usize)],
    specs: [&StrategySpec; 3],
    protocol: Protocol,
    same_prefill: bool,
) -> Vec<Setup> {
    let [prefill, decode, colocated] = specs;
    let mut out = Vec::new();
    let mut colo: Vec<usize> = Vec::new();
    for &(p, d) in ratios {
        out.push(Setup::Disaggregated {
            prefill: Pool {
                engines: p,
                strategy: prefill.clone(),
            },
            decode: Pool {
                engines: d,
                strategy: decode.clone(),
            },
            protocol,
        });
        let sizes = if same_prefill {
            vec![p + d, p]
        } else {
            vec![p + d]
        };
        for n in sizes {
            if !colo.contains(&n) {
                colo.push(n);
                out.push(Setup::Colocated(Pool {
                    engines: n,
                    strategy: colocated.clone(),
                }));
            }
        }
    }
    out
}

impl PdArgs {
    /// The engine, link and objective settings.
    pub fn params(&self) -> PdParams {
        PdParams {
            node: NodeParams {
                max_running: self.max_running.max(1),
                cache_blocks: self.cache_blocks,
                kv_blocks: self.kv_blocks,
                prefill_base: ms(self.prefill_base_ms),
                prefill_per_token: ms(self.prefill_ms_per_token),
                itl: ms(self.itl_ms),
                itl_per_seq: ms(self.itl_ms_per_seq),
            },
            transfer: Transfer {
                latency: ms(self.transfer_latency_ms),
                tokens_per_s: self.transfer_tokens_per_s,
            },
            slo: Slo {
                ttft: ms(self.slo_ttft_ms),
                tpot: ms(self.slo_tpot_ms),
            },
            seed: self.seed,
        }
    }

    fn shapes(&self) -> Result<Vec<Shape>, String> {
        use clap::ValueEnum;
        self.shapes
            .split(',')
            .map(|s| Shape::from_str(s.trim(), false).map_err(|_| format!("unknown shape `{s}`")))
            .collect()
    }
}

/// Runs every shape × setup of `args` (on `threads` threads, results in order).
pub fn run_pd(args: &PdArgs, progress: &(dyn Fn(&PdResult) + Sync)) -> Result<PdReport, String> {
    if !(args.scale > 0.0 && args.rate > 0.0) {
        return Err("--scale and --rate must be positive".into());
    }
    let options = crate::parse_options(&args.options)?;
    let specs = [
        spec(&args.prefill, &options)?,
        spec(&args.decode, &options)?,
        spec(&args.colocated, &options)?,
    ];
    let ratios = parse_ratios(&args.ratios)?;
    let setups = setups(
        &ratios,
        [&specs[0], &specs[1], &specs[2]],
        args.protocol,
        args.same_prefill_engines,
    );
    let params = args.params();
    let shapes = args.shapes()?;
    let workloads: Vec<_> = shapes
        .iter()
        .map(|s| s.generate(args.scale, args.rate, args.seed, args.session_header))
        .collect();
    let jobs: Vec<(usize, usize)> = (0..workloads.len())
        .flat_map(|w| (0..setups.len()).map(move |s| (w, s)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<PdResult>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(w, s)) = jobs.get(j) else { break };
                let mut r = run(&workloads[w], &setups[s], &params).result;
                r.workload = shapes[w].name().to_string();
                progress(&r);
                *slots[j].lock().expect("result slot") = Some(r);
            });
        }
    });
    Ok(PdReport {
        params,
        protocol: args.protocol,
        session_header: args.session_header,
        scale: args.scale,
        rate: args.rate,
        shapes: shapes
            .iter()
            .zip(&workloads)
            .map(|(&shape, w)| shape_info(shape, w))
            .collect(),
        results: slots
            .into_iter()
            .map(|s| s.into_inner().expect("result slot").expect("every job ran"))
            .collect(),
    })
}

fn shape_info(shape: Shape, w: &crate::workload::Workload) -> ShapeInfo {
    let turns: Vec<_> = w.sessions.iter().flat_map(|s| s.turns.iter()).collect();
    let n = turns.len().max(1) as f64;
    let span = w.sessions.iter().map(|s| s.start).max().unwrap_or_default();
    ShapeInfo {
        shape,
        requests: turns.len(),
        sessions: w.sessions.len(),
        mean_prompt_tokens: turns.iter().map(|t| t.prompt_tokens as f64).sum::<f64>() / n,
        mean_output_tokens: turns.iter().map(|t| t.output_tokens as f64).sum::<f64>() / n,
        offered_per_s: turns.len() as f64 / span.as_secs_f64().max(1e-9),
    }
}

impl PdReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }

    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let p = &self.params;
        let _ = writeln!(
            out,
            "# P/D against co-located\n\nseed {}, scale {}, rate ×{}, {} protocol, x-session-id {}; \
             per engine: {} decode slots, {} KV blocks, {} prefix-cache blocks; prefill {:.0} ms + \
             {:.3} ms/uncached token; decode step {:.1} ms + {:.2} ms per further sequence; \
             KV transfer {:.1} ms + {:.0} tokens/s; goodput: TTFT ≤ {:.0} ms and TPOT ≤ {:.0} ms\n",
            p.seed,
            self.scale,
            self.rate,
            match self.protocol {
                Protocol::Vllm => "vllm",
                Protocol::Sglang => "sglang",
            },
            if self.session_header { "sent" } else { "absent" },
            p.node.max_running,
            p.node.kv_blocks,
            p.node.cache_blocks,
            p.node.prefill_base.as_secs_f64() * 1e3,
            p.node.prefill_per_token.as_secs_f64() * 1e3,
            p.node.itl.as_secs_f64() * 1e3,
            p.node.itl_per_seq.as_secs_f64() * 1e3,
            p.transfer.latency.as_secs_f64() * 1e3,
            p.transfer.tokens_per_s,
            p.slo.ttft.as_secs_f64() * 1e3,
            p.slo.tpot.as_secs_f64() * 1e3,
        );
        for s in &self.shapes {
            let _ = writeln!(
                out,
                "## {}\n\n{} requests in {} sessions, about {:.1} per second; prompts {:.0} tokens \
                 and outputs {:.0} tokens on average\n",
                s.shape.name(),
                s.requests,
                s.sessions,
                s.offered_per_s,
                s.mean_prompt_tokens,
                s.mean_output_tokens
            );
            self.table(&mut out, s.shape.name());
        }
        out
    }

    fn table(&self, out: &mut String, shape: &str) {
        let _ = writeln!(
            out,
            "| setup | strategies | requests | prefill hit rate | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | req/s | output tok/s | goodput req/s | prefill spread | decode spread | per engine (prefill / decode) |"
        );
        let _ = writeln!(
            out,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        let join = |v: &[u64]| {
            v.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join("/")
        };
        for r in self.results.iter().filter(|r| r.workload == shape) {
            let decode = !r.decode_per_target.is_empty();
            let _ = writeln!(
                out,
                "| {} | {} | {}{} | {:.1}% | {:.0} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0} | {:.2} ({:.0}%) | {:.2} | {} | {}{} |",
                r.layout,
                r.strategies,
                r.requests,
                if r.rejected > 0 { format!(" ({} rejected)", r.rejected) } else { String::new() },
                r.hit_rate * 100.0,
                r.ttft_p50_ms,
                r.ttft_p99_ms,
                r.tpot_p50_ms,
                r.tpot_p99_ms,
                r.requests_per_s,
                r.output_tokens_per_s,
                r.goodput_per_s,
                r.slo_met * 100.0,
                r.prefill_spread,
                if decode { format!("{:.2}", r.decode_spread) } else { "–".into() },
                join(&r.prefill_per_target),
                if decode { format!(" / {}", join(&r.decode_per_target)) } else { String::new() },
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_parse_and_reject_empty_pools() {
        assert_eq!(parse_ratios("2:2, 1:3").unwrap(), vec![(2, 2), (1, 3)]);
        assert!(parse_ratios("2:0").is_err());
        assert!(parse_ratios("22").is_err());
    }

    #[test]
    fn each_colocated_fleet_runs_once() {
        let s = spec("cache_aware", &[]).unwrap();
        let l = spec("least_loaded", &[]).unwrap();
        let layouts: Vec<String> = setups(
            &[(2, 2), (1, 3), (3, 1)],
            [&s, &l, &s],
            Protocol::Vllm,
            true,
        )
        .iter()
        .map(Setup::layout)
        .collect();
        assert_eq!(
            layouts,
            [
                "P/D 2:2",
                "co-located 4",
                "co-located 2",
                "P/D 1:3",
                "co-located 1",
                "P/D 3:1",
                "co-located 3"
            ]
        );
    }
}
