//! `rolter-loadclient`: the measuring client and reporter of `loadtest/run.sh`.
//!
//! - `stream`: sequential streaming requests on one keep-alive connection (blocking std
//!   TCP, TCP_NODELAY), timestamps per `read()`: time to first byte, time to first token,
//!   gaps between token events.
//! - `hold`: N keep-alive connections, one request each, then held open idle.
//! - `slow`: N concurrent slow streams, then drained.
//! - `record`: parses a wrk / oha / client output into one JSON line of a runs file.
//! - `rate`: the open-loop rate from recorded runs.
//! - `report`: medians, spreads and ratios as Markdown (stdout + file) and JSON.

mod clients;
mod http;
mod report;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rolter-loadclient",
    about = "Rolter's load-test client and reporter"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

fn kv_f64(s: &str) -> Result<(String, f64), String> {
    let (k, v) = s.split_once('=').ok_or("expected KEY=NUMBER")?;
    Ok((
        k.to_string(),
        v.trim()
            .parse()
            .map_err(|_| format!("{k}: not a number: {v}"))?,
    ))
}

fn kv(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or("expected KEY=VALUE")?;
    Ok((k.to_string(), v.to_string()))
}

#[derive(Subcommand)]
enum Cmd {
    /// Sequential streaming requests: TTFB, TTFT, inter-token gaps.
    Stream {
        #[arg(long)]
        addr: SocketAddr,
        /// Measured requests (after warm-up).
        #[arg(long, default_value_t = 100)]
        requests: usize,
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Stop after this long even if fewer requests were made.
        #[arg(long, default_value_t = 30.0)]
        max_secs: f64,
        #[arg(long, default_value_t = 16)]
        tokens: u32,
        #[arg(long, default_value_t = 3)]
        itl_ms: u64,
        #[arg(long)]
        ttft_ms: Option<u64>,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Anthropic's `/v1/messages` (its events) instead of chat completions.
        #[arg(long)]
        messages: bool,
    },
    /// Open N keep-alive connections (one request each) and hold them.
    Hold {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 10_000)]
        conns: usize,
        /// Longest hold; the release file ends it earlier.
        #[arg(long, default_value_t = 30.0)]
        hold_secs: f64,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        release_file: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Start N concurrent slow streams, then drain them.
    Slow {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 1000)]
        conns: usize,
        #[arg(long, default_value_t = 100)]
        tokens: u32,
        #[arg(long, default_value_t = 50)]
        itl_ms: u64,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Parse one tool output and append a run record (JSON line) to the runs file.
    Record {
        #[arg(long)]
        runs: PathBuf,
        /// wrk, oha, stream, hold or slow.
        #[arg(long)]
        tool: String,
        #[arg(long)]
        raw: PathBuf,
        #[arg(long)]
        round: u32,
        #[arg(long)]
        scenario: String,
        #[arg(long)]
        system: String,
        /// Extra numeric fields (cpu_ticks, clk_tck, steal_pct, rss_kb, hwm_kb, …).
        #[arg(long = "set", value_parser = kv_f64)]
        set: Vec<(String, f64)>,
    },
    /// Print FRACTION × the lowest proxy req/s recorded for SCENARIO.
    Rate {
        #[arg(long)]
        runs: PathBuf,
        #[arg(long)]
        scenario: String,
        #[arg(long, default_value_t = 0.6)]
        fraction: f64,
    },
    /// Print the table and write it as Markdown and JSON.
    Report {
        #[arg(long)]
        runs: PathBuf,
        #[arg(long)]
        md: PathBuf,
        #[arg(long)]
        json: PathBuf,
        #[arg(long = "meta", value_parser = kv)]
        meta: Vec<(String, String)>,
    },
}

fn main() -> ExitCode {
    let r: Result<(), String> = match Cli::parse().cmd {
        Cmd::Stream {
            addr,
            requests,
            warmup,
            max_secs,
            tokens,
            itl_ms,
            ttft_ms,
            out,
            messages,
        } => clients::stream(clients::StreamArgs {
            messages,
            addr,
            requests,
            warmup,
            max_secs,
            tokens,
            itl_ms,
            ttft_ms,
            out,
        })
        .map_err(report::io_err),
        Cmd::Hold {
            addr,
            conns,
            hold_secs,
            ready_file,
            release_file,
            out,
        } => clients::hold(clients::HoldArgs {
            addr,
            conns,
            hold_secs,
            ready_file,
            release_file,
            out,
        })
        .map_err(report::io_err),
        Cmd::Slow {
            addr,
            conns,
            tokens,
            itl_ms,
            ready_file,
            out,
        } => clients::slow(clients::SlowArgs {
            addr,
            conns,
            tokens,
            itl_ms,
            ready_file,
            out,
        })
        .map_err(report::io_err),
        Cmd::Record {
            runs,
            tool,
            raw,
            round,
            scenario,
            system,
            set,
        } => report::record(report::RecordArgs {
            runs,
            tool,
            raw,
            round,
            scenario,
            system,
            extra: set,
        }),
        Cmd::Rate {
            runs,
            scenario,
            fraction,
        } => report::rate(&runs, &scenario, fraction).map(|r| println!("{r}")),
        Cmd::Report {
            runs,
            md,
            json,
            meta,
        } => report::report(&runs, meta, &md, &json),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rolter-loadclient: {e}");
            ExitCode::FAILURE
        }
    }
}
