//! The simulator cross-check: one generated workload (from `rolter-sim`'s generators) run
//! twice per strategy: end to end, through the real gateway in front of mock engines that
//! model a prefix cache, and in the fleet simulator with the same fleet; the two prefix-cache
//! hit rates, session stickiness and load spreads are reported side by side.
//!
//! Both sides see the same sessions with every time (arrivals, think times, TTFT, prefill
//! and inter-token latency) multiplied by `time_scale`, so a long simulated workload replays
//! in seconds. The end-to-end hit rate is the mocks' own counters
//! (`vllm:prefix_cache_hits_total` ÷ `vllm:prefix_cache_queries_total`).
//!
//! Owns the replay's processes and threads for the length of one run. It must not change the
//! gateway, the mocks or the simulator; it only drives them.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolter::Gateway;
use rolter_mock::{MockConfig, PrefixCacheConfig};
use rolter_sim::engine::{EngineParams, BLOCK_TOKENS, BYTES_PER_TOKEN};
use rolter_sim::sim::{self, FleetSpec, Policy, SimConfig};
use rolter_sim::workload::{self, Kind, Session, Sizes, Workload};
use serde::Serialize;

use crate::client::{Conn, Outcome};

/// What to replay and on which fleet.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayOptions {
    pub workload: String,
    /// Workload size multiplier (`rolter-sim --scale`).
    pub scale: f64,
    /// Every duration of the workload and the fleet is multiplied by this.
    pub time_scale: f64,
    pub targets: usize,
    pub max_running: usize,
    /// Prefix-cache blocks (16 tokens) per engine.
    pub cache_blocks: usize,
    pub ttft_base_ms: f64,
    pub prefill_ms_per_token: f64,
    pub itl_ms: f64,
    /// Gateway worker threads, and the simulator's gateway cores.
    pub workers: usize,
    pub seed: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            workload: "multi-turn".to_string(),
            scale: 0.1,
            time_scale: 0.25,
            targets: 4,
            max_running: 64,
            cache_blocks: 5000,
            ttft_base_ms: 20.0,
            prefill_ms_per_token: 0.05,
            itl_ms: 10.0,
            workers: 2,
            seed: 1,
        }
    }
}

/// One side (end to end or simulated) of one strategy's replay.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    pub requests: u64,
    /// Requests without a complete 200 answer (end to end) or rejected picks (simulated).
    pub failed: u64,
    pub hit_rate: f64,
    /// Requests per target, in fleet order.
    pub per_target: Vec<u64>,
    /// Busiest target's requests ÷ the mean.
    pub load_spread: f64,
    /// Sessions of two or more turns whose turns all went to one target.
    pub sticky_sessions: Option<f64>,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplayRow {
    pub strategy: String,
    pub end_to_end: Side,
    pub simulated: Side,
    /// Wall-clock seconds of the end-to-end run.
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub command: String,
    pub machine: String,
    pub options: ReplayOptions,
    pub sessions: usize,
    pub requests: usize,
    pub rows: Vec<ReplayRow>,
}

fn scaled(d: Duration, f: f64) -> Duration {
    d.mul_f64(f)
}

/// The workload with every time multiplied by `f`.
fn time_scaled(w: &Workload, f: f64) -> Workload {
    let sessions: Vec<Session> = w
        .sessions
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.start = scaled(s.start, f);
            for t in &mut s.turns {
                t.think = scaled(t.think, f);
            }
            s
        })
        .collect();
    Workload {
        kind: w.kind,
        sessions: Arc::new(sessions),
    }
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1e3)
}

impl ReplayOptions {
    fn engine(&self) -> EngineParams {
        EngineParams {
            max_running: self.max_running,
            cache_blocks: self.cache_blocks,
            ttft_base: ms(self.ttft_base_ms * self.time_scale),
            prefill_per_token: ms(self.prefill_ms_per_token * self.time_scale),
            itl: ms(self.itl_ms * self.time_scale),
        }
    }

    /// The replayed workload (already time-scaled).
    pub fn workload(&self) -> Result<Workload, String> {
        let kind = Kind::parse(&self.workload).ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!(
                "unknown workload `{}`; valid: {}",
                self.workload,
                names.join(", ")
            )
        })?;
        if kind == Kind::Hetero {
            return Err(
                "the hetero workload needs a slow replica; replay uses equal engines".into(),
            );
        }
        let sizes = Sizes {
            scale: self.scale,
            ..Sizes::full()
        };
        Ok(time_scaled(
            &workload::generate(kind, &sizes, self.seed),
            self.time_scale,
        ))
    }
}

fn spread(per_target: &[u64]) -> f64 {
    let total: u64 = per_target.iter().sum();
    let max = per_target.iter().copied().max().unwrap_or(0);
    if total == 0 {
        return 0.0;
    }
    max as f64 * per_target.len() as f64 / total as f64
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The simulated side for `strategy`.
pub fn simulate(w: &Workload, opts: &ReplayOptions, strategy: &str) -> Result<Side, String> {
    let policy: Policy = sim::strategy_policy(strategy, toml::Table::new())?
        .ok_or_else(|| format!("strategy `{strategy}` is not registered"))?;
    let fleet = FleetSpec {
        targets: opts.targets,
        engine: opts.engine(),
        slow: None,
    };
    let cfg = SimConfig {
        cores: opts.workers.max(1),
        seed: opts.seed,
        ..SimConfig::default()
    };
    let r = sim::run(w, &fleet, &policy, &cfg);
    Ok(Side {
        requests: r.requests,
        failed: r.rejected,
        hit_rate: r.hit_rate,
        load_spread: r.load_spread,
        per_target: r.per_target,
        sticky_sessions: r.sticky_sessions,
        ttft_p50_ms: r.ttft_p50_ms,
        ttft_p99_ms: r.ttft_p99_ms,
    })
}

fn gateway_config(
    engines: &[(String, SocketAddr)],
    strategy: &str,
    workers: usize,
) -> Result<rolter::config::Config, String> {
    let mut t = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\npin_workers = false\nshutdown_grace = \"2s\"\n\n"
    );
    for (name, addr) in engines {
        let _ = write!(
            t,
            "[[targets]]\nname = \"{name}\"\nurl = \"http://{addr}\"\nmodels = [\"m\"]\n[targets.timeouts]\nfirst_byte = \"60s\"\nidle = \"30s\"\n\n"
        );
    }
    let names: Vec<String> = engines.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let _ = write!(
        t,
        "[[routes]]\nname = \"replay\"\ntargets = [{}]\nretries = 0\n\n[routes.strategy]\nname = \"{strategy}\"\n",
        names.join(", ")
    );
    rolter::config::load_str(&t, "<rolter-quality replay>").map_err(|e| format!("{e}\n{t}"))
}

/// The request bytes of one turn: the turn's messages verbatim, streaming with usage.
fn turn_request(
    addr: SocketAddr,
    session: Option<&str>,
    prompt: &[u8],
    max_tokens: u32,
) -> Vec<u8> {
    let mut body = format!(
        r#"{{"model":"m","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":{max_tokens},"messages":"#
    )
    .into_bytes();
    body.extend_from_slice(prompt);
    body.push(b'}');
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(id) = session {
        let _ = write!(req, "x-session-id: {id}\r\n");
    }
    req.push_str("\r\n");
    let mut req = req.into_bytes();
    req.extend_from_slice(&body);
    req
}

/// The end-to-end side for `strategy`: fresh mocks and gateway, one client thread per session.
pub fn end_to_end(w: &Workload, opts: &ReplayOptions, strategy: &str) -> io::Result<(Side, f64)> {
    let engine = opts.engine();
    let mocks = (0..opts.targets)
        .map(|i| {
            rolter_mock::spawn(MockConfig {
                name: format!("engine-{i}"),
                models: vec!["m".to_string()],
                ttft: engine.ttft_base,
                itl: engine.itl,
                tokens: 1 << 16,
                max_running: opts.max_running,
                threads: 1,
                prefix_cache: Some(PrefixCacheConfig {
                    block_tokens: BLOCK_TOKENS,
                    capacity_blocks: opts.cache_blocks,
                    prefill_us_per_token: engine.prefill_per_token.as_micros() as u64,
                    chars_per_token: BYTES_PER_TOKEN as u32,
                }),
                ..MockConfig::default()
            })
        })
        .collect::<io::Result<Vec<_>>>()?;
    let named: Vec<(String, SocketAddr)> = mocks
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("engine-{i}"), m.addr()))
        .collect();
    let config = gateway_config(&named, strategy, opts.workers)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let gateway = Gateway::start(config)?;
    let addr = gateway.local_addr();
    let header = w.kind.header();

    // Per session: (turn outcomes in order).
    let results: Arc<Mutex<Vec<Vec<Outcome>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); w.sessions.len()]));
    let t0 = Instant::now();
    let mut threads = Vec::with_capacity(w.sessions.len());
    for (i, s) in w.sessions.iter().enumerate() {
        let s = s.clone();
        let results = results.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("replay-{i}"))
                .stack_size(256 * 1024)
                .spawn(move || {
                    let id = format!("session-{}", s.id);
                    let mut conn = Conn::new(addr);
                    let mut mine = Vec::with_capacity(s.turns.len());
                    let mut next = t0 + s.start;
                    for t in &s.turns {
                        next += t.think;
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let req = turn_request(
                            addr,
                            header.then_some(id.as_str()),
                            &t.prompt,
                            t.output_tokens,
                        );
                        let out = conn.exchange(&req);
                        // The next turn's think time starts when this answer ended.
                        next = Instant::now();
                        mine.push(out);
                    }
                    results.lock().expect("results")[i] = mine;
                })?,
        );
    }
    for t in threads {
        let _ = t.join();
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (mut queries, mut hits) = (0u64, 0u64);
    for m in &mocks {
        if let Some(p) = m.prefix_cache_stats() {
            queries += p.queries;
            hits += p.hits;
        }
    }
    gateway.shutdown(Duration::from_secs(2));
    for m in mocks {
        m.shutdown();
    }

    let results = std::mem::take(&mut *results.lock().expect("results"));
    let mut per_target = vec![0u64; opts.targets];
    let (mut requests, mut failed, mut multi, mut sticky) = (0u64, 0u64, 0u64, 0u64);
    let mut ttfts = Vec::new();
    for session in &results {
        let mut seen: Option<usize> = None;
        let mut one = true;
        for o in session {
            requests += 1;
            let target = o
                .target
                .as_deref()
                .and_then(|t| named.iter().position(|(n, _)| n == t));
            if o.status != 200 || !o.done || o.error.is_some() {
                failed += 1;
            }
            if let Some(d) = o.ttft {
                ttfts.push(d.as_secs_f64() * 1e3);
            }
            match (target, seen) {
                (Some(t), None) => {
                    per_target[t] += 1;
                    seen = Some(t);
                }
                (Some(t), Some(prev)) => {
                    per_target[t] += 1;
                    one &= t == prev;
                }
                (None, _) => one = false,
            }
        }
        if session.len() >= 2 {
            multi += 1;
            sticky += u64::from(one);
        }
    }
    ttfts.sort_by(|a, b| a.total_cmp(b));
    Ok((
        Side {
            requests,
            failed,
            hit_rate: if queries == 0 {
                0.0
            } else {
                hits as f64 / queries as f64
            },
            load_spread: spread(&per_target),
            per_target,
            sticky_sessions: (multi > 0).then(|| sticky as f64 / multi as f64),
            ttft_p50_ms: percentile(&ttfts, 0.5),
            ttft_p99_ms: percentile(&ttfts, 0.99),
        },
        seconds,
    ))
}

fn pct(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

fn sticky(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), pct)
}

fn per(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
}

impl ReplayReport {
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut s = format!(
            "# Simulator cross-check: `{}`\n\n`{}`\n\n{}\n\n{} sessions, {} requests (scale {}), every time × {}; {} engines × {} slots, cache {} blocks of {} tokens each, TTFT {:.0} ms + {:.3} ms per uncached token, ITL {:.1} ms (before time scaling); {} gateway workers. End to end: the real gateway and mock engines on loopback, hit rate from the mocks' counters. Simulated: `rolter-sim` on the same sessions and fleet.\n\n",
            o.workload,
            self.command,
            self.machine,
            self.sessions,
            self.requests,
            o.scale,
            o.time_scale,
            o.targets,
            o.max_running,
            o.cache_blocks,
            BLOCK_TOKENS,
            o.ttft_base_ms,
            o.prefill_ms_per_token,
            o.itl_ms,
            o.workers
        );
        s.push_str("| strategy | hit rate e2e | hit rate sim | Δ points | sticky e2e | sticky sim | spread e2e | spread sim | per target e2e | per target sim | failed e2e |\n");
        s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n");
        for r in &self.rows {
            let (e, m) = (&r.end_to_end, &r.simulated);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:+.1} | {} | {} | {:.2} | {:.2} | {} | {} | {} |",
                r.strategy,
                pct(e.hit_rate),
                pct(m.hit_rate),
                (e.hit_rate - m.hit_rate) * 100.0,
                sticky(e.sticky_sessions),
                sticky(m.sticky_sessions),
                e.load_spread,
                m.load_spread,
                per(&e.per_target),
                per(&m.per_target),
                e.failed
            );
        }
        s
    }

    /// The largest hit-rate gap between the two sides, in points.
    pub fn max_gap_points(&self) -> f64 {
        self.rows
            .iter()
            .map(|r| (r.end_to_end.hit_rate - r.simulated.hit_rate).abs() * 100.0)
            .fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_requests_carry_the_messages_verbatim() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let prompt = br#"[{"role":"system","content":"s"},{"role":"user","content":"q"}]"#;
        let req = turn_request(addr, Some("session-7"), prompt, 12);
        let text = String::from_utf8(req).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("\r\nx-session-id: session-7"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["max_tokens"], 12);
        assert_eq!(v["messages"][1]["content"], "q");
        let no_header = String::from_utf8(turn_request(addr, None, prompt, 1)).unwrap();
        assert!(!no_header.contains("x-session-id"));
    }

    #[test]
    fn time_scaling_scales_arrivals_and_think_times_only() {
        let opts = ReplayOptions {
            scale: 0.02,
            ..ReplayOptions::default()
        };
        let w = opts.workload().unwrap();
        let full = workload::generate(
            Kind::MultiTurn,
            &Sizes {
                scale: 0.02,
                ..Sizes::full()
            },
            opts.seed,
        );
        assert_eq!(w.sessions.len(), full.sessions.len());
        for (a, b) in w.sessions.iter().zip(full.sessions.iter()) {
            assert_eq!(a.start, b.start.mul_f64(0.25));
            for (ta, tb) in a.turns.iter().zip(&b.turns) {
                assert_eq!(ta.think, tb.think.mul_f64(0.25));
                assert_eq!(ta.prompt, tb.prompt);
            }
        }
        assert!(ReplayOptions {
            workload: "hetero".to_string(),
            ..opts
        }
        .workload()
        .is_err());
    }

    #[test]
    fn the_replay_gateway_configuration_loads() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let engines = vec![
            ("engine-0".to_string(), addr),
            ("engine-1".to_string(), addr),
        ];
        for s in ["round_robin", "cache_aware", "pipeline", "consistent_hash"] {
            gateway_config(&engines, s, 2).unwrap();
        }
    }
}

#[cfg(test)]
mod agreement {
    use super::*;

    /// A small replay (40 sessions, times × 0.05): the end-to-end hit rate, read from the
    /// mocks' counters, must agree with the simulator's on the same sessions and fleet.
    #[test]
    fn end_to_end_hit_rates_agree_with_the_simulator() {
        let opts = ReplayOptions {
            scale: 0.02,
            time_scale: 0.05,
            cache_blocks: 1000,
            ..ReplayOptions::default()
        };
        let w = opts.workload().unwrap();
        let mut rates = Vec::new();
        for strategy in ["round_robin", "cache_aware"] {
            let simulated = simulate(&w, &opts, strategy).unwrap();
            let (e2e, _) = end_to_end(&w, &opts, strategy).unwrap();
            eprintln!("{strategy}: end to end {e2e:?}\nsimulated {simulated:?}");
            assert_eq!(e2e.requests as usize, w.requests(), "{strategy}");
            assert_eq!(e2e.failed, 0, "{strategy}");
            let gap = (e2e.hit_rate - simulated.hit_rate).abs();
            assert!(
                gap <= 0.05,
                "{strategy}: end to end {:.3}, simulated {:.3}",
                e2e.hit_rate,
                simulated.hit_rate
            );
            rates.push(e2e.hit_rate);
        }
        // And the difference they both show is real.
        assert!(rates[1] > 1.5 * rates[0], "{rates:?}");
    }
}
