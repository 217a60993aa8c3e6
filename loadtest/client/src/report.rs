//! Parsing of wrk / oha / client outputs into run records (JSON lines) and the final
//! report: medians, spreads and ratios as a terminal/Markdown table plus JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::clients::read_json;

/// Every system a run may hold, in column order; a report shows the ones that ran
/// (`rolter_busy` is Rolter with `[server] busy_poll`).
pub const SYSTEMS: [&str; 5] = ["direct", "rolter", "rolter_busy", "nginx", "haproxy"];
const PEERS: [&str; 2] = ["nginx", "haproxy"];

fn label(system: &str) -> &str {
    match system {
        "direct" => "direct",
        "rolter" => "Rolter",
        "rolter_busy" => "Rolter busy-poll",
        "nginx" => "nginx",
        "haproxy" => "HAProxy",
        s => s,
    }
}

/// `650.00us`, `1.50ms`, `2.00s`, `1.00m` → microseconds.
pub fn wrk_duration_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let m = match unit {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    Some(v * m)
}

pub fn parse_wrk(text: &str) -> Result<Map<String, Value>, String> {
    let mut m = Map::new();
    let mut errors = 0.0;
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        match t.as_slice() {
            ["Requests/sec:", v, ..] => {
                m.insert(
                    "rps".into(),
                    json!(v.parse::<f64>().map_err(|e| e.to_string())?),
                );
            }
            ["50%", v, ..] => {
                m.insert("p50_us".into(), json!(wrk_duration_us(v).ok_or("bad 50%")?));
            }
            ["90%", v, ..] => {
                m.insert("p90_us".into(), json!(wrk_duration_us(v).ok_or("bad 90%")?));
            }
            ["99%", v, ..] => {
                m.insert("p99_us".into(), json!(wrk_duration_us(v).ok_or("bad 99%")?));
            }
            [n, "requests", "in", ..] => {
                m.insert(
                    "requests".into(),
                    json!(n.parse::<f64>().map_err(|e| e.to_string())?),
                );
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => errors += n.parse::<f64>().unwrap_or(0.0),
            ["Socket", "errors:", rest @ ..] => {
                // connect 0, read 0, write 0, timeout 0
                for w in rest.chunks(2) {
                    if let [_, n] = w {
                        errors += n.trim_end_matches(',').parse::<f64>().unwrap_or(0.0);
                    }
                }
            }
            _ => {}
        }
    }
    for k in ["rps", "p50_us", "p99_us", "requests"] {
        if !m.contains_key(k) {
            return Err(format!(
                "wrk output has no {k} (was --latency given? did wrk run?)"
            ));
        }
    }
    m.insert("errors".into(), json!(errors));
    Ok(m)
}

pub fn parse_oha(v: &Value) -> Result<Map<String, Value>, String> {
    let mut m = Map::new();
    let secs = |x: &Value| x.as_f64().map(|s| s * 1e6);
    let lp = &v["latencyPercentiles"];
    for (k, name) in [
        ("p50", "p50_us"),
        ("p90", "p90_us"),
        ("p99", "p99_us"),
        ("p99.9", "p999_us"),
    ] {
        if let Some(x) = secs(&lp[k]) {
            m.insert(name.into(), json!(x));
        }
    }
    let mut ok = 0.0;
    let mut bad = 0.0;
    if let Some(d) = v["statusCodeDistribution"].as_object() {
        for (code, n) in d {
            let n = n.as_f64().unwrap_or(0.0);
            if code.starts_with('2') {
                ok += n;
            } else {
                bad += n;
            }
        }
    }
    if let Some(d) = v["errorDistribution"].as_object() {
        // Requests cut at the end of the run ("aborted due to deadline") are not failures.
        bad += d
            .iter()
            .filter(|(k, _)| !k.contains("deadline"))
            .filter_map(|(_, n)| n.as_f64())
            .sum::<f64>();
    }
    let total = v["summary"]["total"]
        .as_f64()
        .ok_or("oha json has no summary.total")?;
    if !m.contains_key("p50_us") || ok == 0.0 {
        return Err(format!(
            "oha json: no latencies or no 2xx responses ({bad} errors)"
        ));
    }
    m.insert("requests".into(), json!(ok));
    m.insert("errors".into(), json!(bad));
    m.insert("rps".into(), json!(ok / total));
    if let Some(r) = v["summary"]["requestsPerSec"].as_f64() {
        m.insert("rps_oha".into(), json!(r));
    }
    Ok(m)
}

fn pct(v: &Value, k: &str) -> Option<f64> {
    v[k].as_f64()
}

pub struct RecordArgs {
    pub runs: PathBuf,
    pub tool: String,
    pub raw: PathBuf,
    pub round: u32,
    pub scenario: String,
    pub system: String,
    pub extra: Vec<(String, f64)>,
}

pub fn record(a: RecordArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.raw).map_err(|e| format!("{}: {e}", a.raw.display()))?;
    let mut m = match a.tool.as_str() {
        "wrk" => parse_wrk(&text)?,
        "oha" => {
            let v: Value = serde_json::from_str(&text).map_err(|e| format!("oha json: {e}"))?;
            parse_oha(&v)?
        }
        "stream" | "hold" | "slow" => {
            let v = read_json(&a.raw).map_err(|e| e.to_string())?;
            let mut m = Map::new();
            let get = |k: &str| v[k].as_f64().unwrap_or(0.0);
            m.insert("errors".into(), json!(get("errors")));
            match a.tool.as_str() {
                "stream" => {
                    m.insert("requests".into(), json!(get("requests")));
                    for (obj, p) in [("ttfb_us", "ttfb"), ("ttft_us", "ttft"), ("gap_us", "gap")] {
                        for q in ["p50", "p99", "max"] {
                            if let Some(x) = pct(&v[obj], q) {
                                m.insert(format!("{p}_{q}_us"), json!(x));
                            }
                        }
                    }
                    if get("requests") == 0.0 {
                        return Err(format!(
                            "stream client: no successful request ({})",
                            v["last_error"]
                        ));
                    }
                }
                "hold" => {
                    m.insert("opened".into(), json!(get("opened")));
                    m.insert("alive".into(), json!(get("alive_at_end")));
                    m.insert("open_secs".into(), json!(get("open_secs")));
                }
                _ => {
                    m.insert("opened".into(), json!(get("opened")));
                    m.insert("completed".into(), json!(get("completed")));
                }
            }
            if get("errors") > 0.0 {
                m.insert("last_error".into(), v["last_error"].clone());
            }
            m
        }
        t => return Err(format!("unknown tool {t}")),
    };
    let extra: BTreeMap<String, f64> = a.extra.into_iter().collect();
    for (k, v) in &extra {
        m.insert(k.clone(), json!(v));
    }
    // Derived figures.
    let f = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    if let (Some(t), Some(hz), Some(n)) = (f(&m, "cpu_ticks"), f(&m, "clk_tck"), f(&m, "requests"))
    {
        // Under 10 clock ticks (100 ms of CPU) the quantisation error exceeds 10 %.
        if n > 0.0 && t >= 10.0 {
            m.insert("cpu_us_per_req".into(), json!(t / hz * 1e6 / n));
        }
    }
    if let (Some(base), Some(n)) = (f(&m, "base_rss_kb"), f(&m, "opened")) {
        let top = f(&m, "peak_rss_kb").or(f(&m, "rss_kb"));
        if let (Some(top), true) = (top, n > 0.0) {
            m.insert("rss_per_conn_kib".into(), json!((top - base) / n));
        }
        if let (Some(mid), true) = (f(&m, "median_rss_kb"), n > 0.0) {
            m.insert("rss_median_per_conn_kib".into(), json!((mid - base) / n));
        }
    }
    let line = json!({"round": a.round, "scenario": a.scenario, "system": a.system,
        "tool": a.tool, "raw": a.raw.display().to_string(), "metrics": m});
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.runs)
        .map_err(|e| format!("{}: {e}", a.runs.display()))?;
    writeln!(f, "{line}").map_err(|e| e.to_string())?;
    // One-line summary for the terminal.
    let mut s = format!("  r{} {:<10} {:<8}", a.round, a.scenario, a.system);
    for k in [
        "rps",
        "p50_us",
        "p99_us",
        "p999_us",
        "ttfb_p50_us",
        "ttft_p50_us",
        "gap_p99_us",
        "cpu_us_per_req",
        "rss_per_conn_kib",
        "opened",
        "alive",
        "completed",
        "errors",
        "steal_pct",
    ] {
        if let Some(v) = f64_of(&m, k) {
            let _ = write!(s, " {k}={}", short(v));
        }
    }
    println!("{s}");
    Ok(())
}

fn f64_of(m: &Map<String, Value>, k: &str) -> Option<f64> {
    m.get(k).and_then(Value::as_f64)
}

fn short(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

pub fn load_runs(p: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{}: {e}", p.display())))
        .collect()
}

fn values(runs: &[Value], scenario: &str, system: &str, metric: &str) -> Vec<f64> {
    runs.iter()
        .filter(|r| r["scenario"] == scenario && r["system"] == system)
        .filter_map(|r| r["metrics"][metric].as_f64())
        .collect()
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// The rate for the open-loop scenario: `fraction` × the lowest proxy req/s in `scenario`.
pub fn rate(runs: &Path, scenario: &str, fraction: f64) -> Result<u64, String> {
    let runs = load_runs(runs)?;
    let min = PEERS
        .iter()
        .chain(std::iter::once(&"rolter"))
        .filter_map(|s| median(&values(&runs, scenario, s, "rps")))
        .fold(f64::INFINITY, f64::min);
    let min = if min.is_finite() {
        min
    } else {
        // Only the direct system ran: half of the physical limit.
        median(&values(&runs, scenario, "direct", "rps")).map_or(f64::INFINITY, |d| d * 0.5)
    };
    if !min.is_finite() {
        return Err(format!("no {scenario} req/s recorded for any proxy"));
    }
    Ok(((min * fraction) as u64).max(1))
}

struct Row {
    scenario: &'static str,
    metric: &'static str,
    label: &'static str,
    unit: &'static str,
    higher_better: bool,
}

const fn row(
    scenario: &'static str,
    metric: &'static str,
    label: &'static str,
    unit: &'static str,
    higher_better: bool,
) -> Row {
    Row {
        scenario,
        metric,
        label,
        unit,
        higher_better,
    }
}

const ROWS: &[Row] = &[
    row(
        "s1_wrk",
        "rps",
        "1 non-streaming, wrk: req/s",
        "req/s",
        true,
    ),
    row("s1_wrk", "p50_us", "1 non-streaming, wrk: p50", "µs", false),
    row("s1_wrk", "p99_us", "1 non-streaming, wrk: p99", "µs", false),
    row(
        "s1_wrk",
        "cpu_us_per_req",
        "5 proxy CPU per request (1, wrk)",
        "µs",
        false,
    ),
    row(
        "s1_oha",
        "rps",
        "1 non-streaming, oha: req/s",
        "req/s",
        true,
    ),
    row("s1_oha", "p50_us", "1 non-streaming, oha: p50", "µs", false),
    row("s1_oha", "p99_us", "1 non-streaming, oha: p99", "µs", false),
    row(
        "s1_oha",
        "cpu_us_per_req",
        "5 proxy CPU per request (1, oha)",
        "µs",
        false,
    ),
    row(
        "s2_stream",
        "rps",
        "2 streaming 64 tokens: req/s",
        "req/s",
        true,
    ),
    row(
        "s2_stream",
        "p99_us",
        "2 streaming 64 tokens: p99",
        "µs",
        false,
    ),
    row(
        "s2_stream",
        "cpu_us_per_req",
        "5 proxy CPU per stream (2)",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "ttfb_p50_us",
        "3 time to first byte p50",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "ttfb_p99_us",
        "3 time to first byte p99",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "ttft_p50_us",
        "3 time to first token p50",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "ttft_p99_us",
        "3 time to first token p99",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "gap_p50_us",
        "3 inter-token gap p50",
        "µs",
        false,
    ),
    row(
        "s3_ttfb",
        "gap_p99_us",
        "3 inter-token gap p99",
        "µs",
        false,
    ),
    row(
        "s4_open",
        "rps",
        "4 open loop: achieved req/s",
        "req/s",
        true,
    ),
    row("s4_open", "p50_us", "4 open loop: p50", "µs", false),
    row("s4_open", "p99_us", "4 open loop: p99", "µs", false),
    row("s4_open", "p999_us", "4 open loop: p99.9", "µs", false),
    row(
        "s4_open",
        "cpu_us_per_req",
        "5 proxy CPU per request (4)",
        "µs",
        false,
    ),
    row(
        "s6_idle",
        "rss_per_conn_kib",
        "6 RSS per idle keep-alive conn",
        "KiB",
        false,
    ),
    row(
        "s6_slow",
        "rss_per_conn_kib",
        "6 RSS per concurrent slow stream",
        "KiB",
        false,
    ),
    row(
        "s6_slow",
        "rss_median_per_conn_kib",
        "6 RSS per slow stream, median while they run",
        "KiB",
        false,
    ),
    row(
        "s6_idle",
        "alive",
        "6 idle connections still open at the end",
        "n",
        true,
    ),
    row(
        "s6_slow",
        "completed",
        "6 slow streams completed",
        "n",
        true,
    ),
];

fn fmt(v: f64, unit: &str) -> String {
    match unit {
        "req/s" => {
            let n = v.round() as i64;
            let s = n.abs().to_string();
            let mut out = String::new();
            for (i, c) in s.chars().enumerate() {
                if i > 0 && (s.len() - i).is_multiple_of(3) {
                    out.push(',');
                }
                out.push(c);
            }
            if n < 0 {
                out.insert(0, '-');
            }
            out
        }
        "µs" if v.abs() >= 1000.0 => format!("{:.2} ms", v / 1000.0),
        "µs" if v.abs() >= 100.0 => format!("{v:.0} µs"),
        "µs" => format!("{v:.1} µs"),
        "KiB" => format!("{v:.1} KiB"),
        "MiB" => format!("{v:.1} MiB"),
        "%" => format!("{v:.1} %"),
        "n" => format!("{v:.0}"),
        u => format!("{v:.2} {u}"),
    }
}

fn stats(v: &[f64]) -> Option<Value> {
    let med = median(v)?;
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    Some(json!({"median": med, "min": min, "max": max, "n": v.len(), "values": v}))
}

pub fn report(
    runs_path: &Path,
    meta: Vec<(String, String)>,
    md: &Path,
    json_out: &Path,
) -> Result<(), String> {
    let runs = load_runs(runs_path)?;
    let mut rows_json = Vec::new();
    let mut table: Vec<Vec<String>> = Vec::new();
    // The columns: the systems that ran, and Rolter's (each Rolter's) ratio to the peers.
    let systems: Vec<&str> = SYSTEMS
        .iter()
        .copied()
        .filter(|s| *s != "rolter_busy" || runs.iter().any(|r| r["system"] == *s))
        .collect();
    let rolters: Vec<&str> = systems
        .iter()
        .copied()
        .filter(|s| s.starts_with("rolter"))
        .collect();
    let mut header = vec!["metric".to_string()];
    header.extend(systems.iter().map(|s| label(s).to_string()));
    header.extend(rolters.iter().map(|s| format!("{} ÷ best peer", label(s))));
    for r in ROWS {
        let mut sys = Map::new();
        let mut cells = vec![r.label.to_string()];
        let direct = median(&values(&runs, r.scenario, "direct", r.metric));
        let mut any = false;
        for &s in &systems {
            let v = values(&runs, r.scenario, s, r.metric);
            match stats(&v) {
                Some(mut st) => {
                    any = true;
                    let med = st["median"].as_f64().unwrap();
                    let mut cell = fmt(med, r.unit);
                    if v.len() > 1 {
                        let _ = write!(
                            cell,
                            " ({}–{})",
                            fmt(st["min"].as_f64().unwrap(), r.unit),
                            fmt(st["max"].as_f64().unwrap(), r.unit)
                        );
                    }
                    if let (Some(d), true) = (direct, s != "direct") {
                        if d != 0.0 {
                            st["ratio_to_direct"] = json!(med / d);
                            let _ = write!(cell, " ×{:.2}", med / d);
                        }
                    }
                    sys.insert(s.to_string(), st);
                    cells.push(cell);
                }
                None => cells.push("–".into()),
            }
        }
        if !any {
            continue;
        }
        let peers: Vec<(&str, f64)> = PEERS
            .iter()
            .filter_map(|p| median(&values(&runs, r.scenario, p, r.metric)).map(|m| (*p, m)))
            .collect();
        let best = peers.iter().cloned().reduce(|a, b| {
            let better = if r.higher_better {
                b.1 > a.1
            } else {
                b.1 < a.1
            };
            if better {
                b
            } else {
                a
            }
        });
        let mut j = json!({"scenario": r.scenario, "metric": r.metric, "label": r.label,
            "unit": r.unit, "higher_better": r.higher_better, "systems": sys});
        for &ours in &rolters {
            let ro = median(&values(&runs, r.scenario, ours, r.metric));
            match (ro, best) {
                (Some(ro), Some((bp, bv))) if bv != 0.0 => {
                    j["best_peer"] = json!(bp);
                    j[format!("{ours}_over_best_peer")] = json!(ro / bv);
                    cells.push(format!("{:.2} (vs {})", ro / bv, label(bp)));
                }
                _ => cells.push("–".into()),
            }
        }
        rows_json.push(j);
        table.push(cells);
    }

    // Added latency over direct (medians).
    let mut added = Map::new();
    let mut added_table: Vec<Vec<String>> = Vec::new();
    for (sc, m, l) in [
        ("s3_ttfb", "ttfb_p50_us", "TTFB p50"),
        ("s3_ttfb", "ttfb_p99_us", "TTFB p99"),
        ("s3_ttfb", "ttft_p50_us", "TTFT p50"),
        ("s3_ttfb", "gap_p50_us", "gap p50"),
        ("s3_ttfb", "gap_p99_us", "gap p99"),
        ("s1_wrk", "p50_us", "non-streaming p50 (wrk)"),
        ("s4_open", "p99_us", "open loop p99"),
    ] {
        let Some(d) = median(&values(&runs, sc, "direct", m)) else {
            continue;
        };
        let mut cells = vec![l.to_string()];
        let mut o = Map::new();
        for s in &systems[1..] {
            match median(&values(&runs, sc, s, m)) {
                Some(v) => {
                    o.insert(s.to_string(), json!(v - d));
                    cells.push(format!("{:+.0} µs", v - d));
                }
                None => cells.push("–".into()),
            }
        }
        added.insert(format!("{sc}.{m}"), Value::Object(o));
        added_table.push(cells);
    }

    // Memory: peak RSS and RSS growth across the repeated scenario-1 runs (leak check).
    let mut mem = Map::new();
    let mut mem_table: Vec<Vec<String>> = Vec::new();
    for s in &systems[1..] {
        let hwm = runs
            .iter()
            .filter(|r| {
                r["system"] == *s && r["scenario"] != "s6_idle" && r["scenario"] != "s6_slow"
            })
            .filter_map(|r| r["metrics"]["hwm_kb"].as_f64())
            .fold(f64::NAN, f64::max);
        let hwm_all = runs
            .iter()
            .filter(|r| r["system"] == *s)
            .filter_map(|r| r["metrics"]["hwm_kb"].as_f64())
            .fold(f64::NAN, f64::max);
        let mut series: Vec<(u64, f64)> = runs
            .iter()
            .filter(|r| r["system"] == *s && r["scenario"] == "s1_wrk")
            .filter_map(|r| Some((r["round"].as_u64()?, r["metrics"]["rss_kb"].as_f64()?)))
            .collect();
        series.sort_by_key(|x| x.0);
        let growth = match (series.first(), series.last()) {
            (Some(a), Some(b)) if series.len() > 1 => Some(b.1 - a.1),
            _ => None,
        };
        let base = median(&values(&runs, "s6_idle", s, "base_rss_kb"));
        mem.insert(s.to_string(), json!({"peak_rss_kb_load": if hwm.is_nan() {Value::Null} else {json!(hwm)},
            "peak_rss_kb_all": if hwm_all.is_nan() {Value::Null} else {json!(hwm_all)},
            "rss_kb_after_s1_by_round": series.iter().map(|x| json!({"round": x.0, "rss_kb": x.1})).collect::<Vec<_>>(),
            "rss_growth_kib_s1": growth, "idle_baseline_rss_kb": base}));
        let opt = |v: f64| {
            if v.is_nan() {
                "–".to_string()
            } else {
                fmt(v / 1024.0, "MiB")
            }
        };
        mem_table.push(vec![
            label(s).to_string(),
            opt(hwm),
            opt(hwm_all),
            series
                .iter()
                .map(|x| format!("{:.1}", x.1 / 1024.0))
                .collect::<Vec<_>>()
                .join(" → ")
                + " MiB",
            growth.map(|g| format!("{g:+.0} KiB")).unwrap_or("–".into()),
        ]);
    }

    // Errors and steal.
    let mut errs = Map::new();
    let mut err_notes = Vec::new();
    for &s in &systems {
        let e: f64 = runs
            .iter()
            .filter(|r| r["system"] == s)
            .filter_map(|r| r["metrics"]["errors"].as_f64())
            .sum();
        errs.insert(s.to_string(), json!(e));
        if e > 0.0 {
            err_notes.push(format!("{}: {e:.0}", label(s)));
        }
    }
    let steal: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["metrics"]["steal_pct"].as_f64())
        .collect();
    let steal_s = stats(&steal);

    // Render.
    let mut out = String::new();
    let _ = writeln!(out, "# Rolter load test\n");
    for (k, v) in &meta {
        let _ = writeln!(out, "- **{k}**: {v}");
    }
    if let Some(st) = &steal_s {
        let _ = writeln!(
            out,
            "- **steal time** per run (all CPUs): median {:.1} %, max {:.1} %",
            st["median"].as_f64().unwrap(),
            st["max"].as_f64().unwrap()
        );
    }
    let _ = writeln!(
        out,
        "- **errors** (non-2xx, socket errors, failed streams/connections): {}",
        if err_notes.is_empty() {
            "none".to_string()
        } else {
            err_notes.join(", ")
        }
    );
    let _ = writeln!(out, "\nCells: median over rounds (min–max) ×ratio to direct. Last column: Rolter's median ÷ the better of nginx and HAProxy (for req/s higher is better; for times, CPU and memory lower is better).\n");
    md_table(&mut out, &header, &table);
    let _ = writeln!(out, "\nAdded over direct (median proxy − median direct):\n");
    let mut added_header = vec!["metric".to_string()];
    added_header.extend(systems[1..].iter().map(|s| label(s).to_string()));
    md_table(&mut out, &added_header, &added_table);
    let _ = writeln!(out, "\nMemory (peak RSS is VmHWM; growth is RSS after scenario 1 in the last round minus the first):\n");
    md_table(
        &mut out,
        &[
            "system",
            "peak RSS (load rounds)",
            "peak RSS (incl. scenario 6)",
            "RSS after scenario 1 by round",
            "growth",
        ]
        .map(String::from),
        &mem_table,
    );

    print!("{out}");
    std::fs::write(md, &out).map_err(|e| format!("{}: {e}", md.display()))?;
    let meta_obj: Map<String, Value> = meta.into_iter().map(|(k, v)| (k, json!(v))).collect();
    let j = json!({"meta": meta_obj, "rows": rows_json, "added_over_direct_us": added,
        "memory": mem, "errors": errs, "steal_pct": steal_s, "runs": runs});
    std::fs::write(json_out, serde_json::to_string_pretty(&j).unwrap() + "\n")
        .map_err(|e| format!("{}: {e}", json_out.display()))?;
    Ok(())
}

fn md_table(out: &mut String, header: &[String], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let sep: Vec<&str> = header
        .iter()
        .enumerate()
        .map(|(i, _)| if i == 0 { "---" } else { "---:" })
        .collect();
    let _ = writeln!(out, "|{}|", sep.join("|"));
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
}

pub fn io_err(e: io::Error) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests;
