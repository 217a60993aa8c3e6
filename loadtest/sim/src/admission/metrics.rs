//! What an overload run counts: how each request's wait ended (served with its TTFT,
//! refused at the door, displaced, timed out, past its deadline), per class and per
//! tenant, and the summaries (TTFT percentiles per class, served tokens per tenant,
//! Jain's fairness index). Owns counting only.

use serde::Serialize;

use super::workload::{Class, Request, Tenant};

/// How a request's time at the gateway ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Admitted to an engine; TTFT from arrival at the gateway (queue wait included), ms.
    Served { ttft_ms: f64, wait_ms: f64 },
    /// The queue was full: 503 at once.
    Refused,
    /// Pushed out of a full queue by a newcomer in line before it (of a more important
    /// class, or of its class with an earlier finish tag): 503.
    Displaced,
    /// Waited `queue_timeout`: 503.
    TimedOut,
    /// Its wait reached its deadline: 504.
    Deadline,
}

/// One class's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ClassStats {
    pub name: String,
    pub offered: u64,
    pub served: u64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Queue wait of the served requests.
    pub wait_p99_ms: f64,
    pub refused: u64,
    pub displaced: u64,
    pub timed_out: u64,
    pub deadline: u64,
}

/// One tenant's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TenantStats {
    pub name: String,
    pub offered: u64,
    pub served: u64,
    /// Prompt tokens + `max_tokens` of its served requests.
    pub served_tokens: u64,
    /// Its share of every tenant's served tokens.
    pub share: f64,
}

#[derive(Debug, Default, Clone)]
struct ClassTally {
    offered: u64,
    ttfts: Vec<f64>,
    waits: Vec<f64>,
    refused: u64,
    displaced: u64,
    timed_out: u64,
    deadline: u64,
}

/// Outcomes as they happen.
#[derive(Debug, Clone)]
pub struct Tally {
    classes: Vec<ClassTally>,
    /// Per tenant: offered, served, served tokens.
    tenants: Vec<(u64, u64, u64)>,
}

impl Tally {
    pub fn new(classes: usize, tenants: usize) -> Self {
        Tally {
            classes: vec![ClassTally::default(); classes],
            tenants: vec![(0, 0, 0); tenants],
        }
    }

    pub fn record(&mut self, r: &Request, outcome: Outcome) {
        let c = &mut self.classes[r.class];
        let t = &mut self.tenants[r.tenant];
        c.offered += 1;
        t.0 += 1;
        match outcome {
            Outcome::Served { ttft_ms, wait_ms } => {
                c.ttfts.push(ttft_ms);
                c.waits.push(wait_ms);
                t.1 += 1;
                t.2 += r.cost();
            }
            Outcome::Refused => c.refused += 1,
            Outcome::Displaced => c.displaced += 1,
            Outcome::TimedOut => c.timed_out += 1,
            Outcome::Deadline => c.deadline += 1,
        }
    }

    /// The per-class and per-tenant figures.
    pub fn summarize(
        self,
        classes: &[Class],
        tenants: &[Tenant],
    ) -> (Vec<ClassStats>, Vec<TenantStats>) {
        let per_class = self
            .classes
            .into_iter()
            .zip(classes)
            .map(|(mut t, c)| {
                t.ttfts.sort_by(f64::total_cmp);
                t.waits.sort_by(f64::total_cmp);
                ClassStats {
                    name: c.name.clone(),
                    offered: t.offered,
                    served: t.ttfts.len() as u64,
                    ttft_p50_ms: percentile(&t.ttfts, 0.50),
                    ttft_p99_ms: percentile(&t.ttfts, 0.99),
                    wait_p99_ms: percentile(&t.waits, 0.99),
                    refused: t.refused,
                    displaced: t.displaced,
                    timed_out: t.timed_out,
                    deadline: t.deadline,
                }
            })
            .collect();
        let total: u64 = self.tenants.iter().map(|t| t.2).sum();
        let per_tenant = self
            .tenants
            .into_iter()
            .zip(tenants)
            .map(|((offered, served, tokens), t)| TenantStats {
                name: t.name.clone(),
                offered,
                served,
                served_tokens: tokens,
                share: tokens as f64 / total.max(1) as f64,
            })
            .collect();
        (per_class, per_tenant)
    }
}

/// The `q` quantile of ascending `sorted` (nearest rank; 0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's fairness index, `(Σx)² / (n · Σx²)`: 1 when every `x` is equal, `1/n` when one
/// has everything (1 for an empty or all-zero list).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taker() {
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        // 10 : 1 : 1.
        assert!((jain(&[10.0, 1.0, 1.0]) - 144.0 / 306.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
