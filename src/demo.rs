//! `rolter demo`: three mock engines of different speeds, started in-process, with the
//! gateway in front of them on a built-in configuration; `rolter demo --pd`: a
//! disaggregated fleet instead (two prefill engines, two decode engines, one of them with
//! two data-parallel ranks) behind a vLLM-protocol P/D route.
//!
//! Owns only the demo fleets' shapes; the gateway it starts is the real one.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rolter_mock::{MockConfig, MockHandle, PdConfig, PdProtocol, PdRole, PrefixCacheConfig};

use rolter_config::{self as config, Config};
use rolter_gateway::Gateway;

/// The model name the demo fleet serves.
pub const DEMO_MODEL: &str = "demo-model";

/// A running demo: the mock engines and the gateway.
pub struct Demo {
    pub gateway: Gateway,
    pub engines: Vec<(String, MockHandle)>,
    /// The disaggregated fleet (`--pd`).
    pub pd: bool,
}

/// Which fleet the demo starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fleet {
    /// Three engines of different speeds behind `fastest`.
    Speeds,
    /// Prefill and decode pools behind a disaggregated route.
    Disaggregated,
}

/// The disaggregated demo's engines: name, role, data-parallel ranks.
const PD_ENGINES: &[(&str, PdRole, u32)] = &[
    ("prefill-a", PdRole::Prefill, 1),
    ("prefill-b", PdRole::Prefill, 1),
    ("decode-a", PdRole::Decode, 2),
    ("decode-b", PdRole::Decode, 1),
];

/// The three demo engines: name, time to first token, inter-token latency.
const ENGINES: &[(&str, u64, u64)] = &[("fast", 40, 20), ("medium", 90, 40), ("slow", 200, 80)];

/// Starts the mock fleet and the gateway on `listen`, with its admin listener on `admin`
/// (or on a free port when that one is taken).
pub fn start(
    listen: SocketAddr,
    workers: usize,
    admin: SocketAddr,
    fleet: Fleet,
) -> io::Result<Demo> {
    let engines = match fleet {
        Fleet::Speeds => speed_engines()?,
        Fleet::Disaggregated => pd_engines()?,
    };
    let admin = if std::net::TcpListener::bind(admin).is_ok() {
        admin
    } else {
        SocketAddr::new(admin.ip(), 0)
    };
    let config = demo_config(listen, workers, admin, &engines, fleet)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let gateway = Gateway::start(config).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse && e.to_string().contains(&listen.to_string()) {
            io::Error::new(
                e.kind(),
                format!(
                    "{listen} is already in use: stop what listens there, or run the demo on \
                     another port (`rolter demo --listen 127.0.0.1:8081`)"
                ),
            )
        } else {
            e
        }
    })?;
    Ok(Demo {
        gateway,
        engines,
        pd: fleet == Fleet::Disaggregated,
    })
}

/// The three engines of different speeds.
fn speed_engines() -> io::Result<Vec<(String, MockHandle)>> {
    let mut engines = Vec::new();
    for &(name, ttft, itl) in ENGINES {
        let handle = rolter_mock::spawn(MockConfig {
            name: name.to_string(),
            models: vec![DEMO_MODEL.to_string()],
            ttft: Duration::from_millis(ttft),
            itl: Duration::from_millis(itl),
            tokens: 24,
            ..MockConfig::default()
        })?;
        engines.push((name.to_string(), handle));
    }
    Ok(engines)
}

/// The disaggregated fleet: prefill engines with a prefix cache (a repeated prompt's
/// prefill is quicker where it was cached), decode engines that fetch what was prefilled.
fn pd_engines() -> io::Result<Vec<(String, MockHandle)>> {
    let mut engines = Vec::new();
    for &(name, role, dp_size) in PD_ENGINES {
        let prefill = role == PdRole::Prefill;
        let handle = rolter_mock::spawn(MockConfig {
            name: name.to_string(),
            models: vec![DEMO_MODEL.to_string()],
            ttft: Duration::from_millis(if prefill { 120 } else { 10 }),
            itl: Duration::from_millis(30),
            tokens: 24,
            prefix_cache: prefill.then(PrefixCacheConfig::default),
            pd: Some(PdConfig {
                role,
                protocol: PdProtocol::Vllm,
                ..PdConfig::default()
            }),
            dp_size,
            ..MockConfig::default()
        })?;
        engines.push((name.to_string(), handle));
    }
    Ok(engines)
}

fn demo_config(
    listen: SocketAddr,
    workers: usize,
    admin: SocketAddr,
    engines: &[(String, MockHandle)],
    fleet: Fleet,
) -> Result<Config, config::ConfigErrors> {
    let mut text = format!(
        "[server]\nlisten = \"{listen}\"\nworkers = {workers}\n\n\
         [admin]\nlisten = \"{admin}\"\n\n\
         [health]\ninterval = \"2s\"\n\n\
         [metrics_scrape]\ninterval = \"1s\"\n\n"
    );
    for (name, h) in engines {
        text.push_str(&format!(
            "[[targets]]\nname = \"{name}\"\nurl = \"http://{}\"\nmodels = [\"{DEMO_MODEL}\"]\n",
            h.addr()
        ));
        if h.dp_size() > 1 {
            text.push_str(&format!("dp_size = {}\n", h.dp_size()));
        }
        text.push('\n');
    }
    if fleet == Fleet::Disaggregated {
        text.push_str(
            "[[routes]]\nname = \"demo\"\ndisaggregation = \"vllm\"\n\
             prefill = { targets = [\"prefill-a\", \"prefill-b\"], strategy = \"cache_aware\" }\n\
             decode = { targets = [\"decode-a\", \"decode-b\"], strategy = \"least_loaded\" }\n",
        );
        return config::load_str(&text, "<demo --pd>");
    }
    text.push_str("[[routes]]\nname = \"demo\"\ntargets = [");
    let names: Vec<String> = engines.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    text.push_str(&names.join(", "));
    // `fastest` measures every engine first, then sends traffic to the quickest.
    text.push_str("]\nstrategy = \"fastest\"\n");
    config::load_str(&text, "<demo>")
}

/// The banner `rolter demo` prints.
pub fn banner(demo: &Demo) -> String {
    let addr = demo.gateway.local_addr();
    let mut s = format!(
        "rolter demo: gateway on http://{addr} ({} driver) in front of {} mock engines:\n",
        demo.gateway.driver().label(),
        demo.engines.len()
    );
    if demo.pd {
        for ((name, h), (_, role, dp)) in demo.engines.iter().zip(PD_ENGINES) {
            let role = if *role == PdRole::Prefill {
                "prefill"
            } else {
                "decode"
            };
            let ranks = if *dp > 1 {
                format!(", {dp} data-parallel ranks")
            } else {
                String::new()
            };
            s.push_str(&format!(
                "  {name:<9} http://{}  ({role}{ranks})\n",
                h.addr()
            ));
        }
    }
    for ((name, h), (_, ttft, itl)) in demo.engines.iter().zip(ENGINES).filter(|_| !demo.pd) {
        s.push_str(&format!(
            "  {name:<7} http://{}  (first token {ttft} ms, then one every {itl} ms)\n",
            h.addr()
        ));
    }
    if let (Some(admin), true) = (demo.gateway.admin_addr(), demo.pd) {
        s.push_str(&format!(
            "\nThe route is disaggregated (vLLM's protocol): each request is prefilled on a prefill engine\n\
             (cache_aware: a conversation's next turn goes where its prefix is cached), then decoded\n\
             on a decode engine or rank (least_loaded) with the prefill's kv_transfer_params.\n\
             Watch both pools (route demo/prefill is the prefill pool):\n  curl http://{admin}/admin/targets\n  curl http://{admin}/metrics\n"
        ));
    } else if let Some(admin) = demo.gateway.admin_addr() {
        s.push_str(&format!(
            "\nThe route uses `fastest`: each engine is measured, then traffic goes to the quickest.\n\
             Watch it on the admin listener:\n  curl http://{admin}/admin/targets\n  curl http://{admin}/metrics\n"
        ));
    }
    s.push_str(&format!(
        "\nStream a completion (tokens arrive one by one):\n  curl -N http://{addr}/v1/chat/completions \\\n    -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{DEMO_MODEL}\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'\n\nList models:  curl http://{addr}/v1/models\nStop with Ctrl-C.\n"
    ));
    s
}
