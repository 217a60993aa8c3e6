//! The scenarios: for each, a fleet of mock engines (speed, queue limit, price), a closed-loop
//! workload (clients, prompt mix, answer length) and the strategy variants compared on it;
//! and the gateway configuration text one variant runs with.
//!
//! Owns only descriptions and the configuration text. It must not start anything (that is
//! `run`) or compute results (that is `stats`).

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;

/// One mock engine of a fleet.
#[derive(Clone, Debug, Serialize)]
pub struct Engine {
    pub name: &'static str,
    /// Time from admission to the first token (the mock's `ttft`).
    pub ttft_ms: u64,
    /// Inter-token latency.
    pub itl_ms: u64,
    /// Requests the engine runs at once; the rest wait in its FIFO queue.
    pub max_running: usize,
    /// Price per 1M tokens (input, output), set on the gateway target as `price`.
    pub price: Option<(f64, f64)>,
}

/// A share of the workload's requests with one prompt size.
#[derive(Clone, Debug, Serialize)]
pub struct PromptClass {
    pub name: &'static str,
    /// Relative weight in the mix.
    pub weight: u32,
    /// Size of the system prompt in bytes (about 4 bytes per token).
    pub system_bytes: usize,
}

/// One strategy configuration to compare.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    /// Row label in the report, unique within the scenario.
    pub label: String,
    /// The strategy's canonical name.
    pub strategy: &'static str,
    /// Extra lines of the `[routes.strategy]` table (options).
    pub options: &'static str,
    /// Run with `[metrics_scrape]` (interval 100 ms) so load includes the engine's queue.
    pub scrape: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    /// One sentence: what the scenario asks of the strategies.
    pub question: &'static str,
    pub engines: Vec<Engine>,
    pub concurrency: usize,
    /// Tokens per answer (`max_tokens`, and the engines' natural answer length).
    pub tokens: u32,
    pub prompts: Vec<PromptClass>,
    pub variants: Vec<Variant>,
}

fn variant(strategy: &'static str) -> Variant {
    Variant {
        label: strategy.to_string(),
        strategy,
        options: "",
        scrape: false,
    }
}

fn with_options(label: &str, strategy: &'static str, options: &'static str) -> Variant {
    Variant {
        label: label.to_string(),
        strategy,
        options,
        scrape: false,
    }
}

fn scraped(strategy: &'static str) -> Variant {
    Variant {
        label: format!("{strategy} + scrape"),
        strategy,
        options: "",
        scrape: true,
    }
}

fn engine(name: &'static str, ttft_ms: u64, itl_ms: u64, max_running: usize) -> Engine {
    Engine {
        name,
        ttft_ms,
        itl_ms,
        max_running,
        price: None,
    }
}

fn short_prompts() -> Vec<PromptClass> {
    vec![PromptClass {
        name: "short",
        weight: 1,
        system_bytes: 400,
    }]
}

/// Every scenario, in report order.
pub fn all() -> Vec<Scenario> {
    vec![mixed_speed(), queue_limited(), prices(), prompt_mix()]
}

pub fn names() -> Vec<&'static str> {
    all().iter().map(|s| s.name).collect()
}

fn mixed_speed() -> Scenario {
    Scenario {
        name: "mixed-speed",
        question: "three replicas of different speed: does measuring TTFT beat spreading by count?",
        engines: vec![
            engine("fast", 20, 10, 8),
            engine("medium", 60, 20, 8),
            engine("slow", 150, 40, 8),
        ],
        concurrency: 12,
        tokens: 16,
        prompts: short_prompts(),
        variants: vec![
            variant("round_robin"),
            variant("random"),
            variant("least_loaded"),
            variant("power_of_two"),
            variant("fastest"),
            with_options("adaptive 1/0/1", "adaptive", "w_cost = 0.0"),
            with_options(
                "adaptive 2/0/1",
                "adaptive",
                "w_latency = 2.0\nw_cost = 0.0",
            ),
            variant("predicted_latency"),
        ],
    }
}

fn queue_limited() -> Scenario {
    Scenario {
        name: "queue-limited",
        question: "equal speed, two engines that run only 2 requests at once: does folding the engine queue into load help?",
        engines: vec![
            engine("small-a", 50, 20, 2),
            engine("small-b", 50, 20, 2),
            engine("big", 50, 20, 16),
        ],
        concurrency: 16,
        tokens: 16,
        prompts: short_prompts(),
        variants: vec![
            variant("round_robin"),
            variant("least_loaded"),
            scraped("least_loaded"),
            variant("power_of_two"),
            scraped("power_of_two"),
        ],
    }
}

fn prices() -> Scenario {
    let priced = |name, input, output| Engine {
        price: Some((input, output)),
        ..engine(name, 40, 15, 8)
    };
    Scenario {
        name: "prices",
        question: "three equal engines at different prices: what does spend cost in latency?",
        engines: vec![
            priced("cheap", 0.15, 0.60),
            priced("mid", 0.50, 1.50),
            priced("premium", 2.50, 10.00),
        ],
        concurrency: 12,
        tokens: 32,
        prompts: vec![PromptClass {
            name: "1k",
            weight: 1,
            system_bytes: 1024,
        }],
        variants: vec![
            variant("round_robin"),
            variant("cheapest"),
            with_options(
                "adaptive 1/1/1",
                "adaptive",
                "w_cost = 1.0\nw_latency = 1.0\nw_load = 1.0",
            ),
            with_options("adaptive 1/3/1", "adaptive", "w_cost = 3.0"),
        ],
    }
}

fn prompt_mix() -> Scenario {
    Scenario {
        name: "prompt-mix",
        question: "a quick engine with a short queue limit and a slow one with a long one, short and long prompts mixed",
        engines: vec![engine("quick-q2", 30, 15, 2), engine("slow-q16", 150, 15, 16)],
        concurrency: 10,
        tokens: 16,
        prompts: vec![
            PromptClass {
                name: "short",
                weight: 3,
                system_bytes: 400,
            },
            PromptClass {
                name: "long",
                weight: 1,
                system_bytes: 24 * 1024,
            },
        ],
        variants: vec![
            variant("least_loaded"),
            variant("predicted_latency"),
            variant("fastest"),
        ],
    }
}

impl Scenario {
    /// The fleet in one line, for reports.
    pub fn fleet_line(&self) -> String {
        let mut s = String::new();
        for (i, e) in self.engines.iter().enumerate() {
            if i > 0 {
                s.push_str("; ");
            }
            let _ = write!(
                s,
                "`{}` TTFT {} ms, ITL {} ms, max_running {}",
                e.name, e.ttft_ms, e.itl_ms, e.max_running
            );
            if let Some((i, o)) = e.price {
                let _ = write!(s, ", ${i:.2}/${o:.2} per 1M in/out");
            }
        }
        s
    }

    /// The workload in one line, for reports.
    pub fn workload_line(&self) -> String {
        let total: u32 = self.prompts.iter().map(|p| p.weight).sum();
        let mix: Vec<String> = self
            .prompts
            .iter()
            .map(|p| {
                format!(
                    "{} % {} (~{} prompt tokens)",
                    p.weight * 100 / total.max(1),
                    p.name,
                    p.system_bytes / 4 + 15
                )
            })
            .collect();
        format!(
            "{} closed-loop streaming clients, {} tokens per answer, prompts: {}",
            self.concurrency,
            self.tokens,
            mix.join(", ")
        )
    }
}

/// The gateway configuration for `variant` in front of `engines` (name, address).
pub fn gateway_config(
    scenario: &Scenario,
    variant: &Variant,
    engines: &[(&str, SocketAddr)],
    workers: usize,
) -> String {
    let mut t = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\npin_workers = false\nshutdown_grace = \"2s\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n"
    );
    for ((name, addr), spec) in engines.iter().zip(&scenario.engines) {
        let _ = writeln!(
            t,
            "[[targets]]\nname = \"{name}\"\nurl = \"http://{addr}\"\nmodels = [\"m\"]"
        );
        if let Some((i, o)) = spec.price {
            let _ = writeln!(t, "price = {{ input = {i:?}, output = {o:?} }}");
        }
        t.push_str("[targets.timeouts]\nfirst_byte = \"60s\"\nidle = \"30s\"\n\n");
    }
    if variant.scrape {
        t.push_str("[metrics_scrape]\ninterval = \"100ms\"\ntimeout = \"100ms\"\n\n");
    }
    let names: Vec<String> = engines.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let _ = write!(
        t,
        "[[routes]]\nname = \"bench\"\ntargets = [{}]\nretries = 0\n\n[routes.strategy]\nname = \"{}\"\n{}\n",
        names.join(", "),
        variant.strategy,
        variant.options
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_configuration_loads() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for s in all() {
            let engines: Vec<(&str, SocketAddr)> =
                s.engines.iter().map(|e| (e.name, addr)).collect();
            for v in &s.variants {
                let text = gateway_config(&s, v, &engines, 1);
                if let Err(e) = rolter::config::load_str(&text, "<quality>") {
                    panic!("{} / {}: {e}\n{text}", s.name, v.label);
                }
            }
        }
    }

    #[test]
    fn labels_are_unique_within_a_scenario() {
        for s in all() {
            let mut labels: Vec<&str> = s.variants.iter().map(|v| v.label.as_str()).collect();
            labels.sort();
            labels.dedup();
            assert_eq!(labels.len(), s.variants.len(), "{}", s.name);
            // --strategies splits on commas, so a label must not contain one.
            assert!(labels.iter().all(|l| !l.contains(',')), "{}", s.name);
        }
    }
}
