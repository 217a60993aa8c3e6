//! `rolter-sim admission`: the overload scenarios (two priority classes at a multiple of
//! the fleet's capacity; three tenants, one sending many times the others' rate), each run
//! with and without admission features for every `queue_max` listed, on the same
//! generated requests; the report as Markdown and JSON. Parsing, scenarios and the run
//! matrix only: the model is in [`super`].

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::workload::{Class, Lengths, Stream, Tenant};
use super::{run, AdmissionResult, Mode, Scenario, Settings};

/// The `admission` command's options.
#[derive(clap::Args, Debug, Clone)]
pub struct AdmissionArgs {
    /// Scenarios, comma-separated: `classes` (interactive and batch at `--overload` × the
    /// fleet's capacity), `tenants` (three tenants, one at `--heavy-factor` × the others).
    #[arg(long, default_value = "classes,tenants")]
    pub scenarios: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulated seconds of arrivals.
    #[arg(long, default_value_t = 60.0)]
    pub duration_s: f64,
    /// Engines in the fleet.
    #[arg(long, default_value_t = 4)]
    pub engines: usize,
    /// The gateway's `max_concurrent` on every engine.
    #[arg(long, default_value_t = 16)]
    pub max_concurrent: usize,
    /// The route's `queue_max` values, comma-separated: every scenario runs with each.
    #[arg(long, default_value = "64,1024")]
    pub queue_max: String,
    /// The gateway's modes, comma-separated: `fifo` (today), `admission` (classes, fair
    /// queueing, deadlines).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "fifo,admission"
    )]
    pub modes: Vec<Mode>,
    /// The route's `queue_timeout`, milliseconds.
    #[arg(long, default_value_t = 2000.0)]
    pub queue_timeout_ms: f64,
    /// The strategy that picks among the engines with a free place.
    #[arg(long, default_value = "least_loaded")]
    pub strategy: String,
    /// A strategy option, `name.key=value`; repeatable.
    #[arg(long = "option", value_name = "NAME.KEY=VALUE")]
    pub options: Vec<String>,
    /// `classes`: offered requests ÷ the fleet's capacity.
    #[arg(long, default_value_t = 2.0)]
    pub overload: f64,
    /// `classes`: the share of requests that are interactive (the rest are batch).
    #[arg(long, default_value_t = 0.3)]
    pub interactive_share: f64,
    /// `classes`: the interactive class's reserved share of each engine's places.
    #[arg(long, default_value_t = 0.25)]
    pub reserve: f64,
    /// Queue-wait deadlines per class, `CLASS=MS`, comma-separated (`batch=1000`): a
    /// waiter past its deadline leaves with 504 (admission features only).
    #[arg(long, default_value = "")]
    pub deadline_ms: String,
    /// `tenants`: each light tenant's offered requests ÷ the fleet's capacity (above 1/3,
    /// every tenant asks for more than an equal share).
    #[arg(long, default_value_t = 0.38)]
    pub tenant_share: f64,
    /// `tenants`: the heavy tenant's rate ÷ a light tenant's.
    #[arg(long, default_value_t = 10.0)]
    pub heavy_factor: f64,
    /// Prompt tokens, `LO-HI` (uniform).
    #[arg(long, default_value = "100-700")]
    pub prompt_tokens: String,
    /// Output tokens (= `max_tokens`), `LO-HI` (uniform).
    #[arg(long, default_value = "50-150")]
    pub output_tokens: String,
    /// Constant part of TTFT, milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub ttft_base_ms: f64,
    /// Prefill cost per prompt token, milliseconds (serialised per engine).
    #[arg(long, default_value_t = 0.05)]
    pub prefill_ms_per_token: f64,
    /// Inter-token latency, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub itl_ms: f64,
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

impl Default for AdmissionArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: AdmissionArgs,
        }
        Wrap::parse_from(["admission"]).args
    }
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1e3)
}

/// `LO-HI` or `N` tokens.
pub fn parse_tokens(s: &str) -> Result<(u32, u32), String> {
    let num = |v: &str| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{s}`: expected LO-HI tokens"))
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

/// The scenarios' class names (`default`: the `tenants` scenario's one class).
const CLASSES: [&str; 3] = ["interactive", "batch", "default"];

/// `batch=1000,interactive=200` → `[("batch", 1 s), ("interactive", 200 ms)]`.
pub fn parse_deadlines(s: &str) -> Result<Vec<(String, Duration)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (class, v) = p
                .split_once('=')
                .ok_or_else(|| format!("deadline `{p}`: expected CLASS=MS"))?;
            let v: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("deadline `{p}`: milliseconds"))?;
            Ok((class.trim().to_string(), ms(v)))
        })
        .collect()
}

impl AdmissionArgs {
    /// The fleet and gateway settings with `queue_max`.
    pub fn settings(&self, queue_max: usize) -> Result<Settings, String> {
        let options = crate::parse_options(&self.options)?;
        Ok(Settings {
            engines: self.engines.max(1),
            max_concurrent: self.max_concurrent.max(1),
            queue_max,
            queue_timeout: ms(self.queue_timeout_ms),
            ttft_base: ms(self.ttft_base_ms),
            prefill_per_token: ms(self.prefill_ms_per_token),
            itl: ms(self.itl_ms),
            strategy: crate::pd::cli::spec(&self.strategy, &options)?,
            seed: self.seed,
        })
    }

    pub fn lengths(&self) -> Result<Lengths, String> {
        Ok(Lengths {
            prompt: parse_tokens(&self.prompt_tokens)?,
            output: parse_tokens(&self.output_tokens)?,
        })
    }

    pub fn queue_maxes(&self) -> Result<Vec<usize>, String> {
        self.queue_max
            .split(',')
            .map(|q| {
                q.trim()
                    .parse()
                    .map_err(|_| format!("--queue-max: `{q}` is not a count"))
            })
            .collect()
    }

    /// The scenario named `name`, sized on `capacity` requests per second.
    pub fn scenario(&self, name: &str, capacity: f64) -> Result<Scenario, String> {
        let lengths = self.lengths()?;
        let deadlines = parse_deadlines(&self.deadline_ms)?;
        let class = |name: &str, rank: u8, reserve: f64| Class {
            name: name.to_string(),
            rank,
            reserve,
            deadline: deadlines.iter().find(|(c, _)| c == name).map(|(_, d)| *d),
        };
        let tenant = |name: &str| Tenant {
            name: name.to_string(),
            share: 1,
        };
        let stream = |class, tenant, rate| Stream {
            class,
            tenant,
            rate,
        };
        let (classes, tenants, streams) = match name {
            "classes" => {
                let rate = self.overload * capacity;
                let share = self.interactive_share.clamp(0.0, 1.0);
                (
                    vec![
                        class("interactive", 0, self.reserve),
                        class("batch", 1, 0.0),
                    ],
                    vec![tenant("default")],
                    vec![
                        stream(0, 0, rate * share),
                        stream(1, 0, rate * (1.0 - share)),
                    ],
                )
            }
            "tenants" => {
                let light = self.tenant_share * capacity;
                (
                    vec![class("default", 0, 0.0)],
                    vec![tenant("heavy"), tenant("light-1"), tenant("light-2")],
                    vec![
                        stream(0, 0, light * self.heavy_factor),
                        stream(0, 1, light),
                        stream(0, 2, light),
                    ],
                )
            }
            other => {
                return Err(format!(
                    "unknown scenario `{other}`; valid: classes, tenants"
                ))
            }
        };
        if let Some((c, _)) = deadlines
            .iter()
            .find(|(c, _)| !CLASSES.contains(&c.as_str()))
        {
            return Err(format!(
                "deadline for `{c}`: the classes are {}",
                CLASSES.join(", ")
            ));
        }
        Ok(Scenario {
            name: name.to_string(),
            classes,
            tenants,
            streams,
            lengths,
            duration: Duration::from_secs_f64(self.duration_s.max(0.001)),
        })
    }
}

/// Everything one `admission` invocation produced.
#[derive(Debug, Clone, Serialize)]
pub struct AdmissionReport {
    pub seed: u64,
    pub engines: usize,
    pub max_concurrent: usize,
    pub queue_timeout_ms: f64,
    pub strategy: String,
    pub capacity_per_s: f64,
    pub scenarios: Vec<Scenario>,
    pub results: Vec<AdmissionResult>,
}

/// Runs every scenario × `queue_max` × mode of `args` (on `threads` threads, results in
/// that order); the two modes of a scenario see the same requests.
pub fn run_admission(
    args: &AdmissionArgs,
    progress: &(dyn Fn(&AdmissionResult) + Sync),
) -> Result<AdmissionReport, String> {
    let queue_maxes = args.queue_maxes()?;
    let settings: Vec<Settings> = queue_maxes
        .iter()
        .map(|&q| args.settings(q))
        .collect::<Result<_, _>>()?;
    let capacity = settings[0].capacity(&args.lengths()?);
    let scenarios: Vec<Scenario> = args
        .scenarios
        .split(',')
        .map(|s| args.scenario(s.trim(), capacity))
        .collect::<Result<_, _>>()?;
    let requests: Vec<_> = scenarios.iter().map(|s| s.requests(args.seed)).collect();
    let mut jobs = Vec::new();
    for s in 0..scenarios.len() {
        for q in 0..settings.len() {
            for &mode in &args.modes {
                jobs.push((s, q, mode));
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<AdmissionResult>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(s, q, mode)) = jobs.get(j) else {
                    break;
                };
                let r = run(&requests[s], &scenarios[s], &settings[q], mode);
                progress(&r);
                *slots[j].lock().expect("result slot") = Some(r);
            });
        }
    });
    Ok(AdmissionReport {
        seed: args.seed,
        engines: settings[0].engines,
        max_concurrent: settings[0].max_concurrent,
        queue_timeout_ms: settings[0].queue_timeout.as_secs_f64() * 1e3,
        strategy: args.strategy.clone(),
        capacity_per_s: capacity,
        scenarios,
        results: slots
            .into_iter()
            .map(|s| s.into_inner().expect("result slot").expect("every job ran"))
            .collect(),
    })
}

/// `without` / `with` as the report names the modes.
pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Fifo => "FIFO",
        Mode::Admission => "admission",
    }
}

impl AdmissionReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }

    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Admission under overload\n\nseed {}; {} engines, `max_concurrent` {} each, \
             `queue_timeout` {:.0} ms, `{}` among the engines with a free place; capacity \
             about {:.1} requests/s\n",
            self.seed,
            self.engines,
            self.max_concurrent,
            self.queue_timeout_ms,
            self.strategy,
            self.capacity_per_s
        );
        for s in &self.scenarios {
            self.scenario_section(&mut out, s);
        }
        out
    }

    fn scenario_section(&self, out: &mut String, s: &Scenario) {
        let offered: f64 = s.streams.iter().map(|st| st.rate).sum();
        let _ = writeln!(
            out,
            "## {}\n\noffered {:.1} requests/s ({:.1}× capacity) over {:.0} s; prompts {}–{} \
             tokens, outputs {}–{}\n",
            s.name,
            offered,
            offered / self.capacity_per_s.max(1e-9),
            s.duration.as_secs_f64(),
            s.lengths.prompt.0,
            s.lengths.prompt.1,
            s.lengths.output.0,
            s.lengths.output.1
        );
        let results: Vec<&AdmissionResult> = self
            .results
            .iter()
            .filter(|r| r.scenario == s.name)
            .collect();
        class_table(out, &results, s.duration.as_secs_f64());
        if s.tenants.len() > 1 {
            tenant_table(out, &results);
        }
    }
}

fn class_table(out: &mut String, results: &[&AdmissionResult], seconds: f64) {
    let _ = writeln!(
        out,
        "| queue_max | gateway | class | offered | served | served req/s | TTFT p50 ms | TTFT p99 ms | wait p99 ms | refused | displaced | timed out | deadline (504) |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results {
        for c in &r.classes {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
                r.queue_max,
                mode_name(r.mode),
                c.name,
                c.offered,
                c.served,
                c.served as f64 / seconds.max(1e-9),
                c.ttft_p50_ms,
                c.ttft_p99_ms,
                c.wait_p99_ms,
                c.refused,
                c.displaced,
                c.timed_out,
                c.deadline
            );
        }
    }
    out.push('\n');
}

fn tenant_table(out: &mut String, results: &[&AdmissionResult]) {
    let names: Vec<&str> = results[0].tenants.iter().map(|t| t.name.as_str()).collect();
    let _ = writeln!(
        out,
        "| queue_max | gateway | served req/s | Jain's index | served tokens ({}) | shares |",
        names.join(" / ")
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---|---|");
    for r in results {
        let join = |f: &dyn Fn(&super::metrics::TenantStats) -> String| {
            r.tenants.iter().map(f).collect::<Vec<_>>().join(" / ")
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.3} | {} | {} |",
            r.queue_max,
            mode_name(r.mode),
            r.served_per_s,
            r.jain,
            join(&|t| t.served_tokens.to_string()),
            join(&|t| format!("{:.0} %", t.share * 100.0)),
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        assert_eq!(parse_tokens("100-700").unwrap(), (100, 700));
        assert_eq!(parse_tokens("64").unwrap(), (64, 64));
        assert!(parse_tokens("9-1").is_err());
        let d = parse_deadlines("batch=1000, interactive=250").unwrap();
        assert_eq!(d[0], ("batch".to_string(), Duration::from_secs(1)));
        assert_eq!(d[1].1, Duration::from_millis(250));
        assert!(parse_deadlines("").unwrap().is_empty());
        assert!(parse_deadlines("batch").is_err());
        let args = AdmissionArgs::default();
        assert_eq!(args.queue_maxes().unwrap(), [64, 1024]);
        assert!(args.scenario("nope", 10.0).is_err());
    }
}
