//! The overload workload: priority classes, tenants, and the Poisson request streams of
//! each (class, tenant) pair, merged into one arrival list. Owns request generation only;
//! it knows nothing of the queue or the engines.

use std::time::Duration;

use serde::Serialize;

/// A priority class: lower `rank` is more important.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Class {
    pub name: String,
    pub rank: u8,
    /// Share of each engine's `max_concurrent` held back for this class and the more
    /// important ones: a less important class is admitted to an engine only below
    /// `max_concurrent − floor(reserve × max_concurrent)` (summed over the classes above it).
    pub reserve: f64,
    /// How long a request of this class may wait in the queue before it leaves with 504
    /// (`None`: only `queue_timeout` bounds the wait).
    #[serde(serialize_with = "ser_opt_ms")]
    pub deadline: Option<Duration>,
}

/// A tenant: its weight in fair queueing (the gateway's `share`, an integer: a request's
/// tag steps by its cost ÷ `share`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tenant {
    pub name: String,
    pub share: u32,
}

/// Requests of one class from one tenant, Poisson at `rate` per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stream {
    pub class: usize,
    pub tenant: usize,
    pub rate: f64,
}

/// Prompt and output lengths, uniform in `[lo, hi]` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lengths {
    pub prompt: (u32, u32),
    pub output: (u32, u32),
}

impl Lengths {
    pub fn mean_prompt(&self) -> f64 {
        (self.prompt.0 + self.prompt.1) as f64 / 2.0
    }

    pub fn mean_output(&self) -> f64 {
        (self.output.0 + self.output.1) as f64 / 2.0
    }
}

/// One request as it reaches the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub at: Duration,
    pub class: usize,
    pub tenant: usize,
    pub prompt_tokens: u32,
    /// The request's `max_tokens`, which the engine generates in full.
    pub max_tokens: u32,
}

impl Request {
    /// The gateway's estimate of the request's work: prompt tokens + `max_tokens`.
    pub fn cost(&self) -> u64 {
        self.prompt_tokens as u64 + self.max_tokens as u64
    }
}

fn ser_opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64() * 1e3),
        None => s.serialize_none(),
    }
}

fn exp(rng: &mut fastrand::Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.f64()).ln()
}

fn uniform(rng: &mut fastrand::Rng, (lo, hi): (u32, u32)) -> u32 {
    rng.u32(lo.min(hi)..=hi.max(lo))
}

/// Every stream's arrivals over `duration`, in arrival order; each stream draws from its
/// own generator (seeded from `seed` and its index), so a stream's requests do not change
/// when another stream's rate does.
pub fn generate(
    streams: &[Stream],
    lengths: &Lengths,
    duration: Duration,
    seed: u64,
) -> Vec<Request> {
    let mut out = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        if s.rate <= 0.0 {
            continue;
        }
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64);
        let mut t = exp(&mut rng, 1.0 / s.rate);
        while t < duration.as_secs_f64() {
            out.push(Request {
                at: Duration::from_secs_f64(t),
                class: s.class,
                tenant: s.tenant,
                prompt_tokens: uniform(&mut rng, lengths.prompt),
                max_tokens: uniform(&mut rng, lengths.output),
            });
            t += exp(&mut rng, 1.0 / s.rate);
        }
    }
    out.sort_by_key(|r| (r.at, r.class, r.tenant));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_arrive_at_their_rates_in_order() {
        let streams = [
            Stream {
                class: 0,
                tenant: 0,
                rate: 30.0,
            },
            Stream {
                class: 1,
                tenant: 1,
                rate: 70.0,
            },
        ];
        let lengths = Lengths {
            prompt: (10, 20),
            output: (5, 5),
        };
        let reqs = generate(&streams, &lengths, Duration::from_secs(100), 7);
        assert!(reqs.windows(2).all(|w| w[0].at <= w[1].at));
        let first = reqs.iter().filter(|r| r.class == 0).count() as f64;
        assert!((first / 3000.0 - 1.0).abs() < 0.05, "{first}");
        assert!((reqs.len() as f64 / 10_000.0 - 1.0).abs() < 0.05);
        assert!(reqs.iter().all(
            |r| (10..=20).contains(&r.prompt_tokens) && r.cost() == r.prompt_tokens as u64 + 5
        ));
        assert_eq!(
            reqs,
            generate(&streams, &lengths, Duration::from_secs(100), 7)
        );
    }
}
