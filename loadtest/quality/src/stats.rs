//! Turns the raw records of a variant's runs (one per round) into its summary: success and
//! error counts, TTFT and total-latency distributions over every round's requests (overall
//! and per prompt class), the share of requests per target, the estimated spend, and the
//! headline figures of each round so the spread between rounds stays visible.
//!
//! Owns the arithmetic only. It must not touch sockets, clocks or files.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::client::Outcome;
use crate::scenario::Scenario;

/// One finished request of a run.
pub struct Record {
    /// Index into the scenario's prompt classes.
    pub class: usize,
    /// Estimated prompt tokens of the request (bytes / 4), used when no usage came back.
    pub prompt_estimate: u64,
    pub outcome: Outcome,
}

/// A latency distribution in milliseconds (nearest-rank percentiles).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Dist {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    pub fn of(values: &mut [f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        values.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[i]
        };
        Dist {
            n: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            max: values[values.len() - 1],
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One target's share of the successful requests.
#[derive(Clone, Debug, Serialize)]
pub struct Share {
    pub target: String,
    pub requests: u64,
    pub fraction: f64,
}

/// What one run (one round of one variant) produced.
pub struct RunData {
    pub records: Vec<Record>,
    /// Wall time from the first request to the last response.
    pub elapsed: Duration,
    /// Mean requests waiting in each engine's own queue, sampled every 50 ms.
    pub engine_waiting_mean: BTreeMap<String, f64>,
    /// Gateway picks made by the strategy's fallback path, per reason.
    pub fallbacks: BTreeMap<String, u64>,
}

/// The headline figures of one round, to show the spread between rounds.
#[derive(Clone, Debug, Serialize)]
pub struct RoundBrief {
    pub completed: u64,
    pub errors: u64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p95_ms: f64,
    /// Completed requests per target, fleet order, as fractions.
    pub shares: Vec<f64>,
    pub cost_per_1k_usd: Option<f64>,
}

/// Everything the report shows about one variant: every round's requests pooled, plus a
/// brief per round.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub scenario: String,
    pub label: String,
    pub strategy: String,
    pub scrape: bool,
    pub concurrency: usize,
    pub workers: usize,
    /// Wall time of all rounds, each from its first request to its last response.
    pub elapsed_s: f64,
    /// Requests answered 200 with every token and `[DONE]`.
    pub completed: u64,
    /// Non-200 answers, transport failures and cut streams.
    pub errors: u64,
    /// Up to five distinct error descriptions.
    pub error_examples: Vec<String>,
    pub throughput_rps: f64,
    /// Request written → first token event, completed requests only.
    pub ttft_ms: Dist,
    /// Request written → end of the response, completed requests only.
    pub total_ms: Dist,
    /// TTFT per prompt class (only filled when the workload has more than one class).
    pub ttft_by_class_ms: BTreeMap<String, Dist>,
    /// Completed requests per target, in fleet order.
    pub shares: Vec<Share>,
    /// Estimated spend per 1,000 completed requests (USD), when the fleet has prices.
    pub cost_per_1k_usd: Option<f64>,
    /// Completed requests whose cost came from the usage event (the rest: estimate).
    pub cost_from_usage: u64,
    /// Mean requests waiting in each engine's own queue (mean over rounds).
    pub engine_waiting_mean: BTreeMap<String, f64>,
    /// Gateway picks made by a strategy's fallback path, per reason, summed over rounds
    /// (`rolter_strategy_fallbacks_total`).
    pub fallbacks: BTreeMap<String, u64>,
    pub rounds: Vec<RoundBrief>,
}

/// The variant's identity and load, for the summary.
pub struct RunMeta {
    pub label: String,
    pub strategy: String,
    pub scrape: bool,
    pub concurrency: usize,
    pub workers: usize,
}

fn is_complete(o: &Outcome, tokens: u32) -> bool {
    o.status == 200 && o.error.is_none() && o.done && o.tokens == tokens && o.ttft.is_some()
}

fn describe_error(o: &Outcome, tokens: u32) -> String {
    if let Some(e) = &o.error {
        format!("status {} after {} tokens: {e}", o.status, o.tokens)
    } else if o.status != 200 {
        format!("status {}", o.status)
    } else {
        format!(
            "cut stream: {} of {tokens} tokens, [DONE] {}",
            o.tokens, o.done
        )
    }
}

/// Pooled figures over a set of records.
struct Pool {
    completed: u64,
    errors: u64,
    examples: Vec<String>,
    ttft: Vec<f64>,
    total: Vec<f64>,
    by_class: Vec<Vec<f64>>,
    per_target: BTreeMap<String, u64>,
    spend: f64,
    from_usage: u64,
}

fn pool<'a>(scenario: &Scenario, records: impl Iterator<Item = &'a Record>) -> Pool {
    let tokens = scenario.tokens;
    let mut p = Pool {
        completed: 0,
        errors: 0,
        examples: Vec::new(),
        ttft: Vec::new(),
        total: Vec::new(),
        by_class: vec![Vec::new(); scenario.prompts.len()],
        per_target: BTreeMap::new(),
        spend: 0.0,
        from_usage: 0,
    };
    for r in records {
        let o = &r.outcome;
        if !is_complete(o, tokens) {
            p.errors += 1;
            let e = describe_error(o, tokens);
            if p.examples.len() < 5 && !p.examples.contains(&e) {
                p.examples.push(e);
            }
            continue;
        }
        p.completed += 1;
        let t = ms(o.ttft.unwrap_or_default());
        p.ttft.push(t);
        p.by_class[r.class].push(t);
        p.total.push(ms(o.total));
        let target = o.target.as_deref().unwrap_or("(none)");
        *p.per_target.entry(target.to_string()).or_default() += 1;
        let price = scenario
            .engines
            .iter()
            .find(|e| e.name == target)
            .and_then(|e| e.price);
        if let Some((input, output)) = price {
            let (pt, ct) = match o.usage {
                Some(u) => {
                    p.from_usage += 1;
                    (u.prompt_tokens, u.completion_tokens)
                }
                None => (r.prompt_estimate, u64::from(tokens)),
            };
            p.spend += (pt as f64 * input + ct as f64 * output) / 1e6;
        }
    }
    p
}

impl Pool {
    /// Shares in fleet order, then anything the fleet does not name (a missing header).
    fn shares(&self, scenario: &Scenario) -> Vec<Share> {
        let mut rest = self.per_target.clone();
        let mut shares: Vec<Share> = scenario
            .engines
            .iter()
            .map(|e| Share {
                target: e.name.to_string(),
                requests: rest.remove(e.name).unwrap_or(0),
                fraction: 0.0,
            })
            .collect();
        shares.extend(rest.into_iter().map(|(target, requests)| Share {
            target,
            requests,
            fraction: 0.0,
        }));
        for s in &mut shares {
            s.fraction = s.requests as f64 / self.completed.max(1) as f64;
        }
        shares
    }

    fn cost_per_1k(&self, scenario: &Scenario) -> Option<f64> {
        let priced = scenario.engines.iter().any(|e| e.price.is_some());
        (priced && self.completed > 0).then(|| self.spend / self.completed as f64 * 1e3)
    }
}

pub fn summarise(scenario: &Scenario, meta: RunMeta, runs: &[RunData]) -> RunSummary {
    let rounds: Vec<RoundBrief> = runs
        .iter()
        .map(|run| {
            let mut p = pool(scenario, run.records.iter());
            let d = Dist::of(&mut p.ttft);
            RoundBrief {
                completed: p.completed,
                errors: p.errors,
                ttft_mean_ms: d.mean,
                ttft_p50_ms: d.p50,
                ttft_p95_ms: d.p95,
                shares: p
                    .shares(scenario)
                    .iter()
                    .take(scenario.engines.len())
                    .map(|s| s.fraction)
                    .collect(),
                cost_per_1k_usd: p.cost_per_1k(scenario),
            }
        })
        .collect();
    let mut p = pool(scenario, runs.iter().flat_map(|r| r.records.iter()));
    let ttft_by_class_ms = if scenario.prompts.len() > 1 {
        scenario
            .prompts
            .iter()
            .zip(p.by_class.iter_mut())
            .map(|(c, v)| (c.name.to_string(), Dist::of(v)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut engine_waiting_mean: BTreeMap<String, f64> = BTreeMap::new();
    let mut fallbacks: BTreeMap<String, u64> = BTreeMap::new();
    for run in runs {
        for (k, v) in &run.engine_waiting_mean {
            *engine_waiting_mean.entry(k.clone()).or_default() += v / runs.len() as f64;
        }
        for (k, v) in &run.fallbacks {
            *fallbacks.entry(k.clone()).or_default() += v;
        }
    }
    let secs: f64 = runs.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    RunSummary {
        scenario: scenario.name.to_string(),
        label: meta.label,
        strategy: meta.strategy,
        scrape: meta.scrape,
        concurrency: meta.concurrency,
        workers: meta.workers,
        elapsed_s: secs,
        completed: p.completed,
        errors: p.errors,
        error_examples: std::mem::take(&mut p.examples),
        throughput_rps: if secs > 0.0 {
            p.completed as f64 / secs
        } else {
            0.0
        },
        ttft_ms: Dist::of(&mut p.ttft),
        total_ms: Dist::of(&mut p.total),
        ttft_by_class_ms,
        shares: p.shares(scenario),
        cost_per_1k_usd: p.cost_per_1k(scenario),
        cost_from_usage: p.from_usage,
        engine_waiting_mean,
        fallbacks,
        rounds,
    }
}

/// `rolter_strategy_fallbacks_total` per reason, from the admin listener's metrics text.
pub fn parse_fallbacks(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("rolter_strategy_fallbacks_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let reason = labels
            .split(',')
            .find_map(|kv| kv.trim().strip_prefix("reason="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(reason).or_default() += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let d = Dist::of(&mut v);
        assert_eq!(
            (d.n, d.p50, d.p95, d.p99, d.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(d.mean, 50.5);
        assert_eq!(Dist::of(&mut []).n, 0);
    }

    #[test]
    fn fallbacks_are_summed_per_reason() {
        let text = "# TYPE rolter_strategy_fallbacks counter\n\
            rolter_strategy_fallbacks_total{route=\"bench\",strategy=\"fastest\",reason=\"cold\"} 9\n\
            rolter_strategy_fallbacks_total{route=\"other\",strategy=\"fastest\",reason=\"cold\"} 1\n\
            rolter_requests_total{route=\"bench\"} 5\n";
        let f = parse_fallbacks(text);
        assert_eq!(f.get("cold"), Some(&10));
        assert_eq!(f.len(), 1);
    }
}
