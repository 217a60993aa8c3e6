//! An engine's Prometheus text exposition (`GET /metrics`) read down to the load signals
//! routing uses: requests waiting, requests running, KV-cache usage.
//!
//! Owns the mapping from vLLM and SGLang metric names to [`EngineMetrics`]. It must not fetch,
//! schedule or remember anything: the control thread scrapes, calls [`parse`] and hands the
//! values on. The text is parsed by `prom_text_format_parser`, then read in one pass over the
//! families: linear in the size of the body (vLLM serves ~100 KB; about 2 ms in a release
//! build for 160 KB).
//!
//! Names (see `vllm/v1/metrics/loggers.py` and SGLang's `metrics/collector.py`):
//!
//! | signal   | vLLM                                                    | SGLang                    |
//! |----------|---------------------------------------------------------|---------------------------|
//! | waiting  | `vllm:num_requests_waiting`                             | `sglang:num_queue_reqs`   |
//! | running  | `vllm:num_requests_running`                             | `sglang:num_running_reqs` |
//! | KV usage | `vllm:kv_cache_usage_perc`, `vllm:gpu_cache_usage_perc` | `sglang:token_usage`      |
//!
//! `vllm:gpu_cache_usage_perc` is the older name (deprecated in vLLM 0.9.2, hidden from 0.11);
//! it is read only when `vllm:kv_cache_usage_perc` has no value.
//!
//! All three KV gauges are fractions already (vLLM: "1 means 100 percent usage", despite the
//! `_perc` name), so they are only clamped into 0..=1. An engine with several series of one
//! metric (data-parallel ranks, several served models) reports their sum for waiting and
//! running, and the fullest one for KV usage. NaN and infinite samples are ignored.

use prom_text_format_parser::{parse_scrape, Metric, ScrapeParseError, Type, ValueType};

/// Which engine the exposition came from, told by the metric names it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
    /// A valid exposition with none of the names this module knows.
    Unknown,
}

/// The routing signals of one scrape. A field is `None` when the metric is absent or has no
/// finite sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineMetrics {
    pub engine: Engine,
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: Option<f64>,
    /// Requests in the engine's running batch.
    pub running: Option<f64>,
    /// KV-cache usage as a fraction, 0..=1.
    pub kv_usage: Option<f64>,
}

impl EngineMetrics {
    /// What a valid exposition without any known metric gives.
    pub const UNKNOWN: EngineMetrics = EngineMetrics {
        engine: Engine::Unknown,
        waiting: None,
        running: None,
        kv_usage: None,
    };

    /// Waiting requests as a count: rounded, and never below zero.
    pub fn queue_depth(&self) -> Option<u64> {
        // `as` saturates, so a huge value cannot wrap.
        self.waiting.map(|w| w.round().max(0.0) as u64)
    }
}

/// A body that is not a Prometheus text exposition (an HTML error page, JSON, a proxy's
/// plain-text answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    #[error("not a Prometheus text exposition: {0}")]
    Syntax(String),
}

/// Longest parser message kept in a [`ScrapeError`]; the message quotes the offending line,
/// which for a minified HTML page can be the whole body.
const MAX_ERROR_CHARS: usize = 200;

/// Reads the routing signals out of an engine's `/metrics` body.
///
/// An empty body, or one with only comments, is a valid exposition and gives
/// [`EngineMetrics::UNKNOWN`]. A `# HELP`/`# TYPE` pair with no samples, as client libraries
/// write for a labelled metric that has no series yet, is accepted too.
pub fn parse(text: &str) -> Result<EngineMetrics, ScrapeError> {
    Ok(extract(&parse_families(text)?))
}

/// The metric families of an exposition, for readers of more than the load signals (the
/// LoRA residency in [`crate::lora`]); [`extract`] turns them into [`EngineMetrics`].
pub fn parse_families(text: &str) -> Result<Vec<Metric>, ScrapeError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let (metrics, error) = parse_scrape(text);
    match error {
        Some(ScrapeParseError::Parse(message)) => Err(ScrapeError::Syntax(shorten(message))),
        // Only complaints about descriptors without samples (see above): every sample that
        // was read is in `metrics`.
        Some(ScrapeParseError::Collect(_)) | None => Ok(metrics),
    }
}

/// The series this module reads, as indices into the accumulators.
#[derive(Clone, Copy)]
enum Slot {
    VllmWaiting,
    VllmRunning,
    VllmKv,
    VllmKvOld,
    SglangWaiting,
    SglangRunning,
    SglangKv,
}

const SLOTS: usize = 7;

fn slot(name: &str) -> Option<Slot> {
    Some(match name {
        "vllm:num_requests_waiting" => Slot::VllmWaiting,
        "vllm:num_requests_running" => Slot::VllmRunning,
        "vllm:kv_cache_usage_perc" => Slot::VllmKv,
        "vllm:gpu_cache_usage_perc" => Slot::VllmKvOld,
        "sglang:num_queue_reqs" => Slot::SglangWaiting,
        "sglang:num_running_reqs" => Slot::SglangRunning,
        "sglang:token_usage" => Slot::SglangKv,
        _ => return None,
    })
}

/// One metric's samples folded together: summed, or the largest for KV usage.
#[derive(Clone, Copy, Default)]
struct Acc {
    /// A series of this metric exists (even if none of its values is finite).
    present: bool,
    value: Option<f64>,
}

impl Acc {
    fn add(&mut self, v: f64) {
        self.value = Some(self.value.map_or(v, |sum| sum + v));
    }

    fn max(&mut self, v: f64) {
        self.value = Some(self.value.map_or(v, |m| m.max(v)));
    }
}

/// The routing signals in parsed metric families.
pub fn extract(metrics: &[Metric]) -> EngineMetrics {
    extract_where(metrics, |_| true)
}

/// The labels that name a data-parallel rank: vLLM's `engine`, SGLang's `dp_rank`.
pub const RANK_LABELS: [&str; 2] = ["engine", "dp_rank"];

/// The routing signals of one data-parallel rank of an engine: only its series (labelled
/// `engine="rank"` by vLLM, `dp_rank="rank"` by SGLang); a series without a rank label is
/// the whole engine's, and counts for every rank.
pub fn extract_rank(metrics: &[Metric], rank: u32) -> EngineMetrics {
    let want = rank.to_string();
    extract_where(metrics, |s| {
        s.labels
            .iter()
            .find(|l| RANK_LABELS.contains(&l.key.as_str()))
            .is_none_or(|l| l.value == want)
    })
}

fn extract_where(
    metrics: &[Metric],
    keep: impl Fn(&prom_text_format_parser::Sample) -> bool,
) -> EngineMetrics {
    let mut acc = [Acc::default(); SLOTS];
    for metric in metrics {
        let Some(slot) = slot(&metric.name) else {
            continue;
        };
        // These are gauges; a family of another type under the same name is not ours.
        if !matches!(metric.kind, Type::Gauge | Type::Untyped) {
            continue;
        }
        let a = &mut acc[slot as usize];
        for sample in metric.samples.iter().filter(|s| keep(s)) {
            if sample.value.value_type != ValueType::Sample {
                continue;
            }
            a.present = true;
            let Ok(v) = sample.value.value.parse::<f64>() else {
                continue;
            };
            if !v.is_finite() {
                continue;
            }
            match slot {
                Slot::VllmKv | Slot::VllmKvOld | Slot::SglangKv => a.max(v),
                _ => a.add(v),
            }
        }
    }

    let get = |s: Slot| acc[s as usize];
    let vllm = [
        Slot::VllmWaiting,
        Slot::VllmRunning,
        Slot::VllmKv,
        Slot::VllmKvOld,
    ];
    let sglang = [Slot::SglangWaiting, Slot::SglangRunning, Slot::SglangKv];
    if vllm.iter().any(|&s| get(s).present) {
        // The newer name wins; the older one is used only when the newer has no value.
        let kv = get(Slot::VllmKv).value.or(get(Slot::VllmKvOld).value);
        EngineMetrics {
            engine: Engine::Vllm,
            waiting: get(Slot::VllmWaiting).value,
            running: get(Slot::VllmRunning).value,
            kv_usage: kv.map(fraction),
        }
    } else if sglang.iter().any(|&s| get(s).present) {
        EngineMetrics {
            engine: Engine::Sglang,
            waiting: get(Slot::SglangWaiting).value,
            running: get(Slot::SglangRunning).value,
            kv_usage: get(Slot::SglangKv).value.map(fraction),
        }
    } else {
        EngineMetrics::UNKNOWN
    }
}

fn fraction(v: f64) -> f64 {
    v.clamp(0.0, 1.0)
}

fn shorten(mut message: String) -> String {
    if let Some((cut, _)) = message.char_indices().nth(MAX_ERROR_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = include_str!("../../../tests/fixtures/vllm_metrics.prom");
    const SGLANG: &str = include_str!("../../../tests/fixtures/sglang_metrics.prom");

    fn ok(text: &str) -> EngineMetrics {
        parse(text).unwrap_or_else(|e| panic!("{e}\n--- input ---\n{text}"))
    }

    #[test]
    fn a_rank_reads_its_own_series_and_the_engines_unlabelled_ones() {
        let text = "\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=\"m\"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75
";
        let f = parse_families(text).unwrap();
        let r1 = extract_rank(&f, 1);
        assert_eq!(
            (r1.running, r1.waiting, r1.kv_usage),
            (Some(5.0), Some(2.0), Some(0.75))
        );
        let r0 = extract_rank(&f, 0);
        assert_eq!((r0.running, r0.kv_usage), (Some(3.0), Some(0.25)));
        // The whole engine: the ranks summed, the fullest cache.
        let all = extract(&f);
        assert_eq!((all.running, all.kv_usage), (Some(8.0), Some(0.75)));
        let sglang = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{dp_rank=\"0\"} 1\nsglang:num_running_reqs{dp_rank=\"1\"} 4\n";
        let f = parse_families(sglang).unwrap();
        assert_eq!(extract_rank(&f, 1).running, Some(4.0));
        // A rank the engine does not report has no value.
        assert_eq!(extract_rank(&f, 7).running, None);
    }

    #[test]
    fn vllm_fixture() {
        let m = ok(VLLM);
        assert_eq!(
            m,
            EngineMetrics {
                engine: Engine::Vllm,
                waiting: Some(1.0),
                running: Some(3.0),
                kv_usage: Some(0.4213),
            }
        );
        assert_eq!(m.queue_depth(), Some(1));
    }

    #[test]
    fn sglang_fixture() {
        let m = ok(SGLANG);
        assert_eq!(
            m,
            EngineMetrics {
                engine: Engine::Sglang,
                waiting: Some(2.0),
                running: Some(4.0),
                kv_usage: Some(0.37),
            }
        );
        assert_eq!(m.queue_depth(), Some(2));
    }

    /// The parser reads every family of both fixtures, histogram parts and label values with
    /// commas included, with no complaint.
    #[test]
    fn fixtures_parse_completely() {
        let (metrics, error) = parse_scrape(VLLM);
        assert!(error.is_none(), "{error:?}");
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total",
                "vllm:lora_requests_info",
                "vllm:cache_config_info",
                "vllm:time_to_first_token_seconds",
            ]
        );
        let lora = &metrics[5].samples[0].labels;
        let running = lora.iter().find(|l| l.key == "running_lora_adapters");
        assert_eq!(
            running.map(|l| l.value.as_str()),
            Some("sql-lora,chat-lora")
        );
        let ttft = &metrics[7];
        assert_eq!(ttft.kind, Type::Histogram);
        let kinds: Vec<(ValueType, &str)> = ttft
            .samples
            .iter()
            .map(|s| (s.value.value_type, s.value.value.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (ValueType::Sample, "140.0"),
                (ValueType::Sample, "150.0"),
                (ValueType::Count, "150.0"),
                (ValueType::Sum, "9.87"),
            ]
        );

        let (metrics, error) = parse_scrape(SGLANG);
        assert!(error.is_none(), "{error:?}");
        assert_eq!(metrics.len(), 4);
        assert!(metrics.iter().all(|m| m.kind == Type::Gauge));
    }

    #[test]
    fn data_parallel_series_are_summed_and_kv_takes_the_fullest() {
        let text = "\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 4.0
vllm:num_requests_waiting{engine=\"0\",model_name=\"lora-a\"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 8.0
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.2
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.9
";
        let m = ok(text);
        assert_eq!(m.waiting, Some(7.0));
        assert_eq!(m.running, Some(15.0));
        assert_eq!(m.kv_usage, Some(0.9));
        assert_eq!(m.queue_depth(), Some(7));
    }

    #[test]
    fn sglang_ranks_are_summed() {
        let text = "\
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"} 3.0
sglang:num_queue_reqs{dp_rank=\"1\",engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"} 0.5
sglang:token_usage{dp_rank=\"1\",engine_type=\"unified\",model_name=\"q\",pp_rank=\"0\",tp_rank=\"0\"} 0.25
";
        let m = ok(text);
        assert_eq!(m.engine, Engine::Sglang);
        assert_eq!(m.waiting, Some(8.0));
        assert_eq!(m.running, None);
        assert_eq!(m.kv_usage, Some(0.5));
    }

    #[test]
    fn old_kv_name_alone_is_used() {
        let text = "\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.125
";
        let m = ok(text);
        assert_eq!(m.engine, Engine::Vllm);
        assert_eq!(m.kv_usage, Some(0.125));
        assert_eq!(m.waiting, None);
        assert_eq!(m.queue_depth(), None);
    }

    #[test]
    fn new_kv_name_wins_over_old_in_either_order() {
        let new_first = "\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\"} 0.3
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\"} 0.7
";
        let old_first = "\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\"} 0.7
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\"} 0.3
";
        assert_eq!(ok(new_first).kv_usage, Some(0.3));
        assert_eq!(ok(old_first).kv_usage, Some(0.3));
    }

    #[test]
    fn old_kv_name_fills_in_when_the_new_one_has_no_finite_value() {
        let text = "\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\"} NaN
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\"} 0.6
";
        assert_eq!(ok(text).kv_usage, Some(0.6));
    }

    #[test]
    fn nan_and_infinite_samples_are_ignored() {
        let text = "\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\"} NaN
vllm:num_requests_waiting{engine=\"1\"} +Inf
vllm:num_requests_waiting{engine=\"2\"} 2.0
vllm:num_requests_waiting{engine=\"3\"} -Inf
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\"} NaN
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\"} +Inf
";
        let m = ok(text);
        assert_eq!(m.engine, Engine::Vllm);
        assert_eq!(m.waiting, Some(2.0));
        assert_eq!(m.running, None);
        assert_eq!(m.kv_usage, None);
    }

    #[test]
    fn kv_usage_is_clamped_to_a_fraction() {
        let over = "# TYPE sglang:token_usage gauge\nsglang:token_usage 1.02\n";
        let under = "# TYPE sglang:token_usage gauge\nsglang:token_usage -0.1\n";
        assert_eq!(ok(over).kv_usage, Some(1.0));
        assert_eq!(ok(under).kv_usage, Some(0.0));
    }

    #[test]
    fn queue_depth_rounds_and_clamps() {
        let with = |w| EngineMetrics {
            waiting: w,
            ..EngineMetrics::UNKNOWN
        };
        assert_eq!(with(Some(2.4)).queue_depth(), Some(2));
        assert_eq!(with(Some(2.5)).queue_depth(), Some(3));
        assert_eq!(with(Some(-3.0)).queue_depth(), Some(0));
        assert_eq!(with(Some(1e30)).queue_depth(), Some(u64::MAX));
        assert_eq!(with(None).queue_depth(), None);
    }

    /// Escaped quotes and backslashes, and commas, braces and `=` inside label values, do not
    /// split a sample; the series still counts.
    #[test]
    fn label_escaping() {
        let text = "\
# HELP vllm:num_requests_waiting Waiting with a \\\\ backslash and a \\n newline in the help.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"a \\\"quoted\\\" \\\\ name\\n\"} 1.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"x,y}z=w {\"} 2.0
";
        assert_eq!(ok(text).waiting, Some(3.0));
    }

    /// What prometheus_client writes around the gauges: counters with `_created` gauges,
    /// histograms (sum before buckets too), families declared without samples, untyped
    /// series, timestamps, blank lines and comments.
    #[test]
    fn real_world_exposition_shapes() {
        let text = "\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation=\"0\"} 1234.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 52480.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine=\"0\",model_name=\"m\"} 1.7180000125e+09

# a free comment
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine=\"0\",model_name=\"m\"} 12.5
vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"m\"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 3.0
vllm:e2e_request_latency_seconds_count{engine=\"0\",model_name=\"m\"} 3.0
# HELP vllm:e2e_request_latency_seconds_created Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds_created gauge
vllm:e2e_request_latency_seconds_created{engine=\"0\",model_name=\"m\"} 1.7180000125e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5.0 1718000000000
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 6
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge";
        let m = ok(text);
        assert_eq!(m.engine, Engine::Vllm);
        assert_eq!(m.running, Some(5.0));
        assert_eq!(m.waiting, Some(6.0));
        assert_eq!(m.kv_usage, None);
    }

    #[test]
    fn a_histogram_under_a_gauge_name_is_not_read_as_the_gauge() {
        let text = "\
# TYPE vllm:num_requests_waiting histogram
vllm:num_requests_waiting_bucket{le=\"+Inf\"} 9.0
vllm:num_requests_waiting_sum 9.0
vllm:num_requests_waiting_count 9.0
";
        assert_eq!(ok(text), EngineMetrics::UNKNOWN);
    }

    #[test]
    fn valid_exposition_without_engine_metrics_is_unknown() {
        let text = "# HELP up Whether up.\n# TYPE up gauge\nup 1\nprocess_open_fds 12\n";
        assert_eq!(ok(text), EngineMetrics::UNKNOWN);
        assert_eq!(ok(""), EngineMetrics::UNKNOWN);
        assert_eq!(ok("\n\n"), EngineMetrics::UNKNOWN);
        assert_eq!(ok("# only a comment\n"), EngineMetrics::UNKNOWN);
    }

    #[test]
    fn non_prometheus_text_is_an_error() {
        for body in [
            "<html><body><h1>404 Not Found</h1></body></html>\n",
            "{\"object\":\"error\",\"message\":\"Not Found\"}",
            "Not Found",
            "upstream connect error or disconnect/reset before headers\n",
            "vllm:num_requests_waiting{engine=\"0\" 1.0\n",
            "vllm:num_requests_waiting{engine=\"0\"} one\n",
        ] {
            assert!(
                matches!(parse(body), Err(ScrapeError::Syntax(_))),
                "accepted {body:?}"
            );
        }
    }

    #[test]
    fn error_message_is_bounded() {
        let body = format!("<html>{}</html>", "x".repeat(100_000));
        let Err(ScrapeError::Syntax(message)) = parse(&body) else {
            panic!("accepted html");
        };
        assert!(message.chars().count() <= MAX_ERROR_CHARS + 1, "{message}");
    }

    /// A body the size of vLLM's real endpoint: dozens of histogram families for two
    /// data-parallel ranks with `_created` gauges, the routing gauges at the end.
    #[test]
    fn full_size_vllm_body() {
        let mut text = String::from(VLLM);
        let les = [
            "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
            "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0",
            "+Inf",
        ];
        let model = "model_name=\"meta-llama/Llama-3.1-8B-Instruct\"";
        for family in 0..20 {
            let name = format!("vllm:histogram_{family}_seconds");
            text.push_str(&format!(
                "# HELP {name} A histogram.\n# TYPE {name} histogram\n"
            ));
            for engine in 0..2 {
                for (i, le) in les.iter().enumerate() {
                    text.push_str(&format!(
                        "{name}_bucket{{engine=\"{engine}\",le=\"{le}\",{model}}} {}.0\n",
                        i * 3
                    ));
                }
                text.push_str(&format!(
                    "{name}_count{{engine=\"{engine}\",{model}}} 66.0\n"
                ));
                text.push_str(&format!("{name}_sum{{engine=\"{engine}\",{model}}} 12.5\n"));
            }
            text.push_str(&format!(
                "# HELP {name}_created A histogram.\n# TYPE {name}_created gauge\n"
            ));
            for engine in 0..2 {
                text.push_str(&format!(
                    "{name}_created{{engine=\"{engine}\",{model}}} 1.7180000125e+09\n"
                ));
            }
        }
        text.push_str(&format!(
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"1\",{model}}} 4.0\n"
        ));
        assert!(text.len() > 100_000, "{}", text.len());
        let m = ok(&text);
        assert_eq!(m.engine, Engine::Vllm);
        // The fixture's engine 0 plus the second declaration's engine 1.
        assert_eq!(m.waiting, Some(5.0));
        assert_eq!(m.running, Some(3.0));
        assert_eq!(m.kv_usage, Some(0.4213));
    }
}
