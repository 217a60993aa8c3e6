//! `rolter-mock` binary: runs one mock engine (or, with the `lmcache-controller`
//! subcommand, an LMCache controller stand-in) until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
#[cfg(feature = "zmq")]
use rolter_mock::{Controller, ControllerConfig};
use rolter_mock::{
    Driver, KvEventsConfig, LmcacheWorkerConfig, MockApi, MockConfig, PdConfig, PdProtocol, PdRole,
    PrefixCacheConfig,
};

#[derive(Parser, Debug)]
#[command(
    name = "rolter-mock",
    about = "A fast mock of vLLM's OpenAI-compatible server",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    engine: Args,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an LMCache controller stand-in: workers PUSH to its PULL socket, routers ask
    /// its HTTP `/lookup` which instance holds how much of a prompt.
    #[cfg(feature = "zmq")]
    LmcacheController(ControllerArgs),
}

#[derive(clap::Args, Debug)]
struct ControllerArgs {
    /// HTTP listen address (`/lookup`, `/query_instance`, `/health`).
    #[arg(long, default_value = "127.0.0.1:9000")]
    http: SocketAddr,
    /// ZMQ bind endpoint of the PULL socket the workers push to.
    #[arg(long, default_value = "tcp://127.0.0.1:9100")]
    pull: String,
    /// Tokens per chunk (must match the workers').
    #[arg(long, default_value_t = 256)]
    chunk_size: usize,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// Engine name (sent as `x-mock-engine`).
    #[arg(long, default_value = "mock")]
    name: String,
    /// Served model (repeatable; the first is the default).
    #[arg(long = "model")]
    models: Vec<String>,
    /// Time to first token, milliseconds.
    #[arg(long, default_value_t = 0)]
    ttft_ms: u64,
    /// Inter-token latency, milliseconds.
    #[arg(long, default_value_t = 0)]
    itl_ms: u64,
    /// Tokens per answer.
    #[arg(long, default_value_t = 16)]
    tokens: u32,
    /// Concurrency limit (0 = unlimited); extra requests queue FIFO.
    #[arg(long, default_value_t = 0)]
    max_running: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// I/O driver: auto, io_uring or epoll.
    #[arg(long, default_value = "auto")]
    driver: Driver,
    /// Prefix-cache size in blocks; turns the prefix-cache model on (chat and completions).
    #[arg(long)]
    prefix_cache_blocks: Option<usize>,
    /// Prefill cost per uncached prompt token, microseconds (with the prefix cache).
    #[arg(long, default_value_t = 100)]
    prefill_us_per_token: u64,
    /// Tokens per prefix-cache block.
    #[arg(long, default_value_t = 16)]
    block_tokens: u32,
    /// Prompt bytes per token, for the prefix cache's token estimate.
    #[arg(long, default_value_t = 4)]
    chars_per_token: u32,
    /// LoRA adapter registered at start (repeatable); turns LoRA serving on.
    #[arg(long = "lora-adapter")]
    lora_adapters: Vec<String>,
    /// Adapters that run at once (vLLM's --max-loras); turns LoRA serving on.
    #[arg(long)]
    max_loras: Option<usize>,
    /// Time an adapter load takes, milliseconds.
    #[arg(long, default_value_t = 0)]
    lora_load_delay_ms: u64,
    /// Publish KV-cache events as vLLM does, on a ZMQ PUB socket bound here (e.g.
    /// `tcp://127.0.0.1:5557`; port 0 picks one). Turns the prefix cache on.
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    /// Bind endpoint of the KV-event replay ROUTER (e.g. `tcp://127.0.0.1:5558`).
    #[arg(long, requires = "kv_events_endpoint")]
    kv_replay_endpoint: Option<String>,
    /// Topic frame of every KV-event message.
    #[arg(long, default_value = "")]
    kv_topic: String,
    /// KV-event messages kept for replay.
    #[arg(long, default_value_t = 10_000)]
    kv_buffer_steps: usize,
    /// Run an LMCache worker that reports its chunk store to the controller whose PULL
    /// socket is here (e.g. `tcp://127.0.0.1:9100`). Turns the prefix cache on.
    #[arg(long)]
    lmcache_controller: Option<String>,
    /// The LMCache instance id (default: the engine name).
    #[arg(long, requires = "lmcache_controller")]
    lmcache_instance_id: Option<String>,
    /// The LMCache worker id.
    #[arg(long, default_value_t = 0)]
    lmcache_worker_id: u32,
    /// Tokens per LMCache chunk (must match the controller's).
    #[arg(long, default_value_t = 256)]
    lmcache_chunk_size: usize,
    /// Chunks the LMCache CPU store holds (LRU).
    #[arg(long, default_value_t = LmcacheWorkerConfig::default().capacity_chunks)]
    lmcache_capacity_chunks: usize,
    /// Serve one leg of disaggregated prefill/decode: prefill or decode.
    #[arg(long)]
    pd_role: Option<PdRole>,
    /// The P/D proxy protocol: vllm (KV-transfer params, then a pull) or sglang (bootstrap
    /// rooms, both legs at once).
    #[arg(long, default_value = "vllm", requires = "pd_role")]
    pd_protocol: PdProtocol,
    /// The SGLang prefill's bootstrap server port (0 picks one).
    #[arg(long, default_value_t = 8998)]
    bootstrap_port: u16,
    /// How long a P/D leg waits for its peer: e.g. 5s, 500ms, 1m (a bare number is seconds).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pd_handshake_timeout: Duration,
    /// Data-parallel ranks behind the one port (vLLM's --data-parallel-size).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    dp_size: u32,
    /// The API served: any (every endpoint), openai (no Anthropic or Responses routes) or
    /// anthropic (a managed Anthropic API: messages, count_tokens and models only).
    #[arg(long, default_value = "any")]
    api: MockApi,
    /// The key clients must present: `x-api-key` with --api anthropic, else
    /// `Authorization: Bearer` on every path under /v1 (as vLLM's --api-key).
    #[arg(long)]
    api_key: Option<String>,
    /// Keep received requests in memory (tests only).
    #[arg(long, hide = true)]
    record_requests: bool,
}

/// A duration such as `5s`, `500ms` or `1m`; a bare number is seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("invalid duration {s:?} (e.g. 5s, 500ms, 1m)")),
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT/SIGTERM handler.
fn on_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

fn wait_for_signal() {
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(feature = "zmq")]
        Some(Command::LmcacheController(c)) => run_controller(c),
        None => run_engine(cli.engine),
    }
}

#[cfg(feature = "zmq")]
fn run_controller(args: ControllerArgs) {
    let controller = match Controller::start(ControllerConfig {
        http: args.http,
        pull: args.pull,
        chunk_size: args.chunk_size,
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rolter-mock lmcache-controller: cannot start: {e}");
            std::process::exit(1);
        }
    };
    on_signals();
    println!(
        "lmcache controller stand-in: http on {}, pull on {} (chunk size {})",
        controller.http_addr(),
        controller.pull_endpoint(),
        args.chunk_size
    );
    wait_for_signal();
    controller.shutdown();
}

fn run_engine(args: Args) {
    #[cfg(feature = "zmq")]
    let lmcache_controller = args.lmcache_controller.clone();
    let mut models = args.models;
    if models.is_empty() {
        models.push("mock-model".to_string());
    }
    let cfg = MockConfig {
        name: args.name,
        listen: args.listen,
        threads: args.threads,
        models,
        ttft: Duration::from_millis(args.ttft_ms),
        itl: Duration::from_millis(args.itl_ms),
        tokens: args.tokens,
        max_running: args.max_running,
        driver: args.driver,
        record_requests: args.record_requests,
        prefix_cache: match (
            args.prefix_cache_blocks,
            args.kv_events_endpoint.is_some() || args.lmcache_controller.is_some(),
        ) {
            (None, false) => None,
            (blocks, _) => Some(PrefixCacheConfig {
                block_tokens: args.block_tokens,
                capacity_blocks: blocks.unwrap_or(PrefixCacheConfig::default().capacity_blocks),
                prefill_us_per_token: args.prefill_us_per_token,
                chars_per_token: args.chars_per_token,
            }),
        },
        kv_events: args.kv_events_endpoint.map(|endpoint| KvEventsConfig {
            endpoint,
            replay_endpoint: args.kv_replay_endpoint,
            topic: args.kv_topic,
            buffer_steps: args.kv_buffer_steps,
        }),
        lmcache: args
            .lmcache_controller
            .map(|controller| LmcacheWorkerConfig {
                controller,
                instance_id: args.lmcache_instance_id.unwrap_or_default(),
                worker_id: args.lmcache_worker_id,
                chunk_size: args.lmcache_chunk_size,
                capacity_chunks: args.lmcache_capacity_chunks,
                ..LmcacheWorkerConfig::default()
            }),
        pd: args.pd_role.map(|role| PdConfig {
            role,
            protocol: args.pd_protocol,
            bootstrap_port: args.bootstrap_port,
            handshake_timeout: args.pd_handshake_timeout,
        }),
        dp_size: args.dp_size,
        api: args.api,
        api_key: args.api_key,
        lora: (args.max_loras.is_some() || !args.lora_adapters.is_empty()).then(|| {
            rolter_mock::LoraConfig {
                max_loras: args.max_loras.unwrap_or(1),
                adapters: args.lora_adapters,
                load_delay: Duration::from_millis(args.lora_load_delay_ms),
            }
        }),
    };
    let handle = match rolter_mock::spawn(cfg) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("rolter-mock: cannot start: {e}");
            std::process::exit(1);
        }
    };
    on_signals();
    println!(
        "rolter-mock {} listening on {} (driver: {})",
        handle.name(),
        handle.addr(),
        handle.driver()
    );
    if let Some(b) = handle.bootstrap_addr() {
        println!("bootstrap server on {b}");
    }
    #[cfg(feature = "zmq")]
    if let Some(ep) = handle.kv_events_endpoint() {
        match handle.kv_replay_endpoint() {
            Some(replay) => println!("kv events on {ep} (replay on {replay})"),
            None => println!("kv events on {ep}"),
        }
    }
    #[cfg(feature = "zmq")]
    if let (Some(id), Some(controller)) = (handle.lmcache_instance_id(), &lmcache_controller) {
        println!("lmcache worker {id} reporting to {controller}");
    }
    wait_for_signal();
    handle.shutdown();
}
