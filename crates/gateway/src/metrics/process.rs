//! The process's own series, read from `/proc/self` when `/metrics` is rendered
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`, `process_threads`,
//! named and typed as every Prometheus client library writes them), and
//! `rolter_build_info`, the constant 1 labelled with the version and compiled-in features.
//!
//! Owns those names and the small `/proc` parser. It reads files, so it must only run on the
//! control thread's scrape, never on a worker. A value that cannot be read (another OS, a
//! restricted `/proc`) leaves its series out rather than writing a wrong one.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

/// What `/proc/self` says about the process at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    /// Unix time the process started, seconds.
    pub start_time_seconds: Option<f64>,
    pub threads: Option<u64>,
}

/// The fields of `/proc/self/stat` the series need (see proc(5)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatFields {
    /// User and system CPU time, clock ticks.
    pub utime: u64,
    pub stime: u64,
    pub num_threads: u64,
    /// Start time after boot, clock ticks.
    pub starttime: u64,
    /// Virtual memory size, bytes.
    pub vsize: u64,
    /// Resident set size, pages.
    pub rss: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<StatFields> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first one after the name.
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatFields {
        utime: field(14)?,
        stime: field(15)?,
        num_threads: field(20)?,
        starttime: field(22)?,
        vsize: field(23)?,
        rss: field(24)?,
    })
}

/// The boot time (`btime`, Unix seconds) from `/proc/stat`.
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

impl ProcessStats {
    /// Reads this process's figures. Blocking file reads: control thread only.
    pub fn read() -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t));
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_btime(&t));
        // SAFETY: sysconf only reads a configuration value.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let ticks = (ticks > 0).then_some(ticks as f64);
        let page = u64::try_from(page).ok().filter(|&p| p > 0);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            // The directory handle being read is one of the entries; it is not the
            // process's own, so it is not counted.
            .map(|d| (d.count() as u64).saturating_sub(1));
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct given, which outlives the call.
        let max_fds = (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
            && limit.rlim_cur != libc::RLIM_INFINITY)
            .then_some(limit.rlim_cur);
        ProcessStats {
            cpu_seconds: stat.zip(ticks).map(|(s, t)| (s.utime + s.stime) as f64 / t),
            resident_bytes: stat.zip(page).map(|(s, p)| s.rss.saturating_mul(p)),
            virtual_bytes: stat.map(|s| s.vsize),
            open_fds,
            max_fds,
            start_time_seconds: stat
                .zip(ticks)
                .zip(btime)
                .map(|((s, t), b)| b as f64 + s.starttime as f64 / t),
            threads: stat.map(|s| s.num_threads),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    /// Compiled-in optional features, comma-separated ("" for the lean build).
    features: &'static str,
}

/// The optional features this build has, as `rolter_build_info`'s `features` label.
pub fn features() -> &'static str {
    match (
        cfg!(feature = "kv-events"),
        cfg!(feature = "local-tokenizer"),
    ) {
        (true, true) => "kv-events,local-tokenizer",
        (true, false) => "kv-events",
        (false, true) => "local-tokenizer",
        (false, false) => "",
    }
}

type IntGauge = Gauge<u64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Appends the process series for `stats` and `rolter_build_info` to `out`.
pub fn render(stats: &ProcessStats, out: &mut String) {
    let mut r = Registry::default();
    if let Some(v) = stats.cpu_seconds {
        let c = Counter::<f64, AtomicU64>::default();
        c.inc_by(v);
        r.register_with_unit(
            "process_cpu",
            "Total user and system CPU time spent in seconds",
            Unit::Seconds,
            c,
        );
    }
    let gauge = |r: &mut Registry, name: &str, help: &str, unit: Option<Unit>, v: Option<u64>| {
        if let Some(v) = v {
            let g = IntGauge::default();
            g.set(v);
            match unit {
                Some(u) => r.register_with_unit(name, help, u, g),
                None => r.register(name, help, g),
            }
        }
    };
    gauge(
        &mut r,
        "process_resident_memory",
        "Resident memory size in bytes",
        Some(Unit::Bytes),
        stats.resident_bytes,
    );
    gauge(
        &mut r,
        "process_virtual_memory",
        "Virtual memory size in bytes",
        Some(Unit::Bytes),
        stats.virtual_bytes,
    );
    gauge(
        &mut r,
        "process_open_fds",
        "Number of open file descriptors",
        None,
        stats.open_fds,
    );
    gauge(
        &mut r,
        "process_max_fds",
        "Maximum number of open file descriptors (the soft RLIMIT_NOFILE)",
        None,
        stats.max_fds,
    );
    gauge(
        &mut r,
        "process_threads",
        "Number of OS threads in the process",
        None,
        stats.threads,
    );
    if let Some(v) = stats.start_time_seconds {
        let g = FloatGauge::default();
        g.set(v);
        r.register_with_unit(
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Unit::Seconds,
            g,
        );
    }
    let info = Family::<BuildLabels, IntGauge>::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION"),
        features: features(),
    })
    .set(1);
    r.register(
        "rolter_build_info",
        "Always 1; labelled with the gateway's version and compiled-in optional features",
        info,
    );
    super::text::append(out, &r);
}

#[cfg(test)]
mod tests {
    use prom_text_format_parser::{Scrape, Type};

    use super::*;

    fn value(s: &Scrape, name: &str) -> Option<f64> {
        s.metrics
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.samples.first())
            .map(|x| x.value.value.as_f64())
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own.
        let text = "4242 (rolter (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 150 0 0 20 0 7 0 123456 104857600 2560 18446744073709551615 \
                    1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
        let f = parse_stat(text).expect("parsed");
        assert_eq!(
            f,
            StatFields {
                utime: 250,
                stime: 150,
                num_threads: 7,
                starttime: 123456,
                vsize: 104857600,
                rss: 2560,
            }
        );
        assert_eq!(parse_stat("4242 (truncated"), None);
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
    }

    #[test]
    fn btime_is_read_from_proc_stat() {
        let text = "cpu  1 2 3 4\nintr 5\nbtime 1764547200\nprocesses 99\n";
        assert_eq!(parse_btime(text), Some(1_764_547_200));
        assert_eq!(parse_btime("cpu 1 2 3\n"), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let s = ProcessStats::read();
        assert!(s.cpu_seconds.is_some_and(|v| v >= 0.0), "{s:?}");
        assert!(s.resident_bytes.is_some_and(|v| v > 0), "{s:?}");
        assert!(s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.threads.is_some_and(|v| v >= 1), "{s:?}");
        // stdin, stdout and stderr at least.
        assert!(s.open_fds.is_some_and(|v| v >= 3), "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.expect("start time");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{s:?}"
        );
    }

    #[test]
    fn series_follow_the_prometheus_client_names_and_types() {
        let stats = ProcessStats {
            cpu_seconds: Some(1.5),
            resident_bytes: Some(4096),
            virtual_bytes: Some(8192),
            open_fds: Some(12),
            max_fds: Some(1024),
            start_time_seconds: Some(1_764_547_200.25),
            threads: Some(5),
        };
        let mut out = String::new();
        render(&stats, &mut out);
        let s = Scrape::parse(&out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
        let kind = |n: &str| s.metrics.iter().find(|m| m.name == n).map(|m| m.kind);
        assert_eq!(
            kind("process_cpu_seconds_total"),
            Some(Type::Counter),
            "{out}"
        );
        assert_eq!(value(&s, "process_cpu_seconds_total"), Some(1.5));
        for (name, v) in [
            ("process_resident_memory_bytes", 4096.0),
            ("process_virtual_memory_bytes", 8192.0),
            ("process_open_fds", 12.0),
            ("process_max_fds", 1024.0),
            ("process_start_time_seconds", 1_764_547_200.25),
            ("process_threads", 5.0),
        ] {
            assert_eq!(kind(name), Some(Type::Gauge), "{name}\n{out}");
            assert_eq!(value(&s, name), Some(v), "{name}\n{out}");
        }
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            out.contains(&format!(
                "rolter_build_info{{version=\"{version}\",features=\"{}\"}} 1\n",
                features()
            )),
            "{out}"
        );
        assert!(s.metrics.iter().all(|m| m.help_desc.is_some()), "{out}");
    }

    #[test]
    fn unknown_values_leave_their_series_out() {
        let mut out = String::new();
        render(&ProcessStats::default(), &mut out);
        assert!(!out.contains("process_"), "{out}");
        assert!(out.contains("# TYPE rolter_build_info gauge\n"), "{out}");
    }
}
