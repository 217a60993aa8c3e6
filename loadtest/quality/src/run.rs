//! One measured run: a fresh fleet of in-process mock engines, a fresh gateway in front of it
//! (so every strategy starts cold), closed-loop client threads for the run's duration, an
//! engine-queue sampler, then teardown.
//!
//! Owns process-local resources for the length of one run and gives all of them back before
//! it returns. It must not judge results (`stats`), print reports (`report`), or pin
//! threads to cores.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use rolter::Gateway;
use rolter_mock::{MockConfig, MockHandle};

use crate::client::{self, Conn};
use crate::scenario::{self, Scenario, Variant};
use crate::stats::{self, Record, RunData};

/// How often the engines' own queues are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

pub struct RunOptions {
    pub duration: Duration,
    pub concurrency: usize,
    pub workers: usize,
    pub seed: u64,
}

fn start_engines(scenario: &Scenario, tokens: u32) -> io::Result<Vec<MockHandle>> {
    scenario
        .engines
        .iter()
        .map(|e| {
            rolter_mock::spawn(MockConfig {
                name: e.name.to_string(),
                models: vec!["m".to_string()],
                ttft: Duration::from_millis(e.ttft_ms),
                itl: Duration::from_millis(e.itl_ms),
                tokens,
                max_running: e.max_running,
                threads: 1,
                ..MockConfig::default()
            })
        })
        .collect()
}

/// The admin listener's metrics text ("" when it cannot be read).
fn admin_metrics(addr: Option<SocketAddr>) -> String {
    let Some(addr) = addr else {
        return String::new();
    };
    let raw = rolter_mock::client::request("GET", "/metrics", &[("connection", "close")], "");
    let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut c = rolter_mock::client::Client {
        r: std::io::BufReader::new(s),
    };
    c.send(&raw);
    match c.response() {
        Ok(r) if r.status == 200 => String::from_utf8_lossy(&r.body).into_owned(),
        _ => String::new(),
    }
}

/// Runs `variant` of `scenario` once and returns what the clients and the sampler saw.
pub fn run(scenario: &Scenario, variant: &Variant, opts: &RunOptions) -> io::Result<RunData> {
    let engines = start_engines(scenario, scenario.tokens)?;
    let named: Vec<(&str, SocketAddr)> = scenario
        .engines
        .iter()
        .zip(&engines)
        .map(|(e, h)| (e.name, h.addr()))
        .collect();
    let text = scenario::gateway_config(scenario, variant, &named, opts.workers);
    let config = rolter::config::load_str(&text, "<rolter-quality>")
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e}\n{text}")))?;
    let gateway = Gateway::start(config)?;
    let addr = gateway.local_addr();

    // Request bodies per prompt class, built once; a per-request tag is not needed because
    // none of the compared strategies reads the prompt's content.
    let bodies: Vec<(Vec<u8>, u64)> = scenario
        .prompts
        .iter()
        .map(|p| {
            let body = client::chat_body(p.system_bytes, scenario.tokens, "1");
            let estimate = (p.system_bytes as u64 + 60).div_ceil(4);
            (client::request(addr, &body), estimate)
        })
        .collect();
    let weights: Vec<u32> = scenario.prompts.iter().map(|p| p.weight).collect();
    let total_weight: u32 = weights.iter().sum::<u32>().max(1);

    // Engine queue sampler.
    let stop = Arc::new(AtomicBool::new(false));
    let waiting_sums = Arc::new(Mutex::new((vec![0u64; engines.len()], 0u64)));
    let engines = Arc::new(engines);
    let sampler = {
        let (stop, sums, engines) = (stop.clone(), waiting_sums.clone(), engines.clone());
        std::thread::Builder::new()
            .name("quality-sampler".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    {
                        let mut s = sums.lock().unwrap();
                        for (i, e) in engines.iter().enumerate() {
                            s.0[i] += e.stats().waiting;
                        }
                        s.1 += 1;
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })?
    };

    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let barrier = Arc::new(Barrier::new(opts.concurrency + 1));
    let bodies = Arc::new(bodies);
    let mut threads = Vec::with_capacity(opts.concurrency);
    for i in 0..opts.concurrency {
        let (records, barrier, bodies) = (records.clone(), barrier.clone(), bodies.clone());
        let weights = weights.clone();
        let seed = opts.seed.wrapping_mul(1000).wrapping_add(i as u64);
        let duration = opts.duration;
        threads.push(
            std::thread::Builder::new()
                .name(format!("quality-client-{i}"))
                .spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(seed);
                    let mut conn = Conn::new(addr);
                    let mut mine = Vec::new();
                    barrier.wait();
                    let deadline = Instant::now() + duration;
                    while Instant::now() < deadline {
                        let mut pick = rng.u32(..total_weight);
                        let class = weights
                            .iter()
                            .position(|&w| {
                                if pick < w {
                                    true
                                } else {
                                    pick -= w;
                                    false
                                }
                            })
                            .unwrap_or(0);
                        let (req, estimate) = &bodies[class];
                        let outcome = conn.exchange(req);
                        mine.push(Record {
                            class,
                            prompt_estimate: *estimate,
                            outcome,
                        });
                    }
                    records.lock().unwrap().extend(mine);
                })?,
        );
    }
    barrier.wait();
    let started = Instant::now();
    for t in threads {
        let _ = t.join();
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();

    let fallbacks = stats::parse_fallbacks(&admin_metrics(gateway.admin_addr()));
    gateway.shutdown(Duration::from_secs(2));
    let engines =
        Arc::try_unwrap(engines).map_err(|_| io::Error::other("sampler still running"))?;
    for e in engines {
        e.shutdown();
    }

    let (sums, samples) = std::mem::take(&mut *waiting_sums.lock().unwrap());
    let engine_waiting_mean: BTreeMap<String, f64> = scenario
        .engines
        .iter()
        .zip(sums)
        .map(|(e, s)| (e.name.to_string(), s as f64 / samples.max(1) as f64))
        .collect();
    let records = std::mem::take(&mut *records.lock().unwrap());
    Ok(RunData {
        records,
        elapsed,
        engine_waiting_mean,
        fallbacks,
    })
}
