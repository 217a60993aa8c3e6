//! Disaggregated prefill/decode roles ([`PdConfig`]): what a prefill or decode leg of a
//! chat, completions or messages request must carry, the prefill's registry of KV blocks
//! waiting to be pulled (vLLM's KV-connector protocol) and of bootstrap rooms waiting for
//! their decode (SGLang's), and the counters ([`PdStats`]).
//!
//! - **vLLM** (NixlConnector with its toy proxy: two sequential requests). A prefill needs
//!   `kv_transfer_params` with `do_remote_decode: true`; its whole JSON answer gets a
//!   top-level `kv_transfer_params` naming its engine id, fresh block ids (one per 16
//!   prompt tokens), its HTTP host and port. The blocks wait in the registry until pulled
//!   (`POST /mock/pd/pull`, single use, the stand-in of the NIXL read) or until
//!   `handshake_timeout`. A decode needs `do_remote_prefill: true` and the prefill's
//!   names, and pulls before generating.
//! - **SGLang** (mini_lb: one request to both legs at once). Both legs carry
//!   `bootstrap_host`, `bootstrap_port`, `bootstrap_room` (when `prompt` is a list of
//!   prompts: lists of one per prompt, or scalars, the i-th prompt's room then `room + i`,
//!   as SGLang takes them). A prefill registers its rooms and waits for the
//!   decode of each to reach its bootstrap server (the crate's `bootstrap` module); a
//!   decode calls that server for each room before generating.
//!
//! Owns the state and the rules; it must not touch a connection (the connection module
//! races these waits against its client and answers).

mod client;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) use client::post_json;

/// Tokens per KV block of the vLLM protocol's block ids.
pub const KV_BLOCK_TOKENS: u64 = 16;

/// How often a leg waiting for its peer looks again.
pub(crate) const POLL: Duration = Duration::from_millis(1);

/// Which leg of a disaggregated request this engine serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdRole {
    Prefill,
    Decode,
}

/// The proxy protocol the legs speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdProtocol {
    /// vLLM's KV connector: prefill first, its `kv_transfer_params` into the decode.
    #[default]
    Vllm,
    /// SGLang's bootstrap rooms: both legs at once.
    Sglang,
}

impl std::str::FromStr for PdRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "prefill" => Ok(PdRole::Prefill),
            "decode" => Ok(PdRole::Decode),
            other => Err(format!("unknown P/D role {other:?} (prefill, decode)")),
        }
    }
}

impl std::str::FromStr for PdProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(PdProtocol::Vllm),
            "sglang" => Ok(PdProtocol::Sglang),
            other => Err(format!("unknown P/D protocol {other:?} (vllm, sglang)")),
        }
    }
}

/// The engine's part in a disaggregated prefill/decode fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdConfig {
    pub role: PdRole,
    pub protocol: PdProtocol,
    /// sglang prefill only: the bootstrap server's port (0 picks a free one); default 8998
    /// in the CLI
    pub bootstrap_port: u16,
    /// how long a leg waits for its peer (handshake / transfer) before failing; default 5 s
    pub handshake_timeout: Duration,
}

impl PdConfig {
    /// Whether the engine runs a bootstrap server (an SGLang prefill).
    pub fn serves_bootstrap(&self) -> bool {
        self.protocol == PdProtocol::Sglang && self.role == PdRole::Prefill
    }
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            role: PdRole::Prefill,
            protocol: PdProtocol::Vllm,
            bootstrap_port: 8998,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// The P/D counters (see `MockHandle::pd_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PdStats {
    /// Prefill legs that passed their checks (and handshakes) and were answered.
    pub prefills: u64,
    /// Decode legs that got their KV (pull or handshake) and generated.
    pub decodes: u64,
    /// `/mock/pd/pull` calls answered 200 (the blocks were held and are freed now).
    pub pulls_served: u64,
    /// `/mock/pd/pull` calls answered 404 (unknown, expired or already pulled blocks).
    pub pulls_refused: u64,
    /// Decodes that reached this prefill's bootstrap server for a registered room.
    pub handshakes: u64,
    /// Prefills answered 500 because no decode came for a room in time.
    pub handshake_timeouts: u64,
    /// Legs refused: missing or malformed P/D fields, or a pull or handshake that failed.
    pub refused: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub prefills: AtomicU64,
    pub decodes: AtomicU64,
    pub pulls_served: AtomicU64,
    pub pulls_refused: AtomicU64,
    pub handshakes: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub refused: AtomicU64,
}

/// What one leg must do besides generating, read from its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Leg {
    /// vLLM prefill: a whole answer carrying `kv_transfer_params`.
    VllmPrefill,
    /// vLLM decode: pull these blocks from the prefill first.
    VllmDecode(Remote, String, Vec<u64>),
    /// SGLang prefill: wait for the decode of each room.
    SglangPrefill(Vec<u64>),
    /// SGLang decode: hand-shake each room with the prefill's bootstrap server first.
    SglangDecode(Remote, Vec<u64>),
}

/// A peer engine's address as a leg's body names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub host: String,
    pub port: u16,
}

/// The body fields of either protocol.
#[derive(Deserialize, Default)]
#[serde(default)]
struct LegFields {
    kv_transfer_params: Option<Value>,
    bootstrap_host: Option<Value>,
    bootstrap_port: Option<Value>,
    bootstrap_room: Option<Value>,
    prompt: Option<Value>,
}

/// A block of KV held for a decode to pull.
struct Held {
    blocks: Vec<u64>,
    until: Instant,
}

/// The engine's P/D state.
pub(crate) struct Pd {
    pub cfg: PdConfig,
    /// Unique per engine instance: the name and a random suffix.
    pub engine_id: String,
    /// The HTTP address a decode pulls from (loopback when listening on any address).
    pub http: SocketAddr,
    pub counters: Counters,
    next_block: AtomicU64,
    /// First block id → the held blocks.
    held: Mutex<HashMap<u64, Held>>,
    /// Bootstrap room → whether its decode has connected.
    rooms: Mutex<HashMap<u64, bool>>,
}

/// The address to give peers for a listen address: loopback for an unspecified one.
pub(crate) fn advertised(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    a
}

impl Pd {
    pub fn new(cfg: PdConfig, name: &str, http: SocketAddr) -> Pd {
        Pd {
            cfg,
            engine_id: format!("{name}-{:016x}", fastrand::u64(..)),
            http: advertised(http),
            counters: Counters::default(),
            next_block: AtomicU64::new(1),
            held: Mutex::new(HashMap::new()),
            rooms: Mutex::new(HashMap::new()),
        }
    }

    pub fn stats(&self) -> PdStats {
        let c = &self.counters;
        PdStats {
            prefills: c.prefills.load(Relaxed),
            decodes: c.decodes.load(Relaxed),
            pulls_served: c.pulls_served.load(Relaxed),
            pulls_refused: c.pulls_refused.load(Relaxed),
            handshakes: c.handshakes.load(Relaxed),
            handshake_timeouts: c.handshake_timeouts.load(Relaxed),
            refused: c.refused.load(Relaxed),
        }
    }

    /// Reads what the leg must do from a request body; `Err` with the 400's message.
    pub fn leg(&self, body: &[u8]) -> Result<Leg, String> {
        let f: LegFields = serde_json::from_slice(body).unwrap_or_default();
        match (self.cfg.protocol, self.cfg.role) {
            (PdProtocol::Vllm, PdRole::Prefill) => vllm_prefill(&f),
            (PdProtocol::Vllm, PdRole::Decode) => vllm_decode(&f),
            (PdProtocol::Sglang, role) => {
                let (remote, rooms) = bootstrap_fields(&f)?;
                Ok(match role {
                    PdRole::Prefill => Leg::SglangPrefill(rooms),
                    PdRole::Decode => Leg::SglangDecode(remote, rooms),
                })
            }
        }
    }

    /// Holds fresh blocks for a prompt of `prompt_tokens` and returns the answer's
    /// `kv_transfer_params` value naming them.
    pub fn hold_blocks(&self, prompt_tokens: u64) -> Value {
        let n = prompt_tokens.div_ceil(KV_BLOCK_TOKENS).max(1);
        let first = self.next_block.fetch_add(n, Relaxed);
        let blocks: Vec<u64> = (first..first + n).collect();
        let now = Instant::now();
        let mut held = self.held.lock().unwrap();
        held.retain(|_, h| h.until > now);
        held.insert(
            first,
            Held {
                blocks: blocks.clone(),
                until: now + self.cfg.handshake_timeout,
            },
        );
        serde_json::json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": blocks,
            "remote_engine_id": self.engine_id,
            "remote_host": self.http.ip().to_string(),
            "remote_port": self.http.port(),
            "tp_size": 1,
        })
    }

    /// `POST /mock/pd/pull`: `Ok` (and the blocks freed) when exactly these blocks are
    /// held for this engine id; else the status (404, or 400 for a body that is not a
    /// pull) and message of the refusal.
    pub fn pull(&self, body: &[u8]) -> Result<(), (u16, String)> {
        #[derive(Deserialize)]
        struct Pull {
            engine_id: String,
            block_ids: Vec<u64>,
        }
        let p: Pull = match serde_json::from_slice(body) {
            Ok(p) => p,
            Err(e) => return Err((400, format!("invalid pull body: {e}"))),
        };
        let now = Instant::now();
        let mut held = self.held.lock().unwrap();
        let found = p.engine_id == self.engine_id
            && p.block_ids.first().is_some_and(|first| {
                held.get(first)
                    .is_some_and(|h| h.blocks == p.block_ids && h.until > now)
            });
        if found {
            held.remove(&p.block_ids[0]);
            self.counters.pulls_served.fetch_add(1, Relaxed);
            Ok(())
        } else {
            self.counters.pulls_refused.fetch_add(1, Relaxed);
            Err((404, "unknown blocks".to_string()))
        }
    }

    /// Registers a prefill's rooms (a decode that came first stays connected).
    pub fn register_rooms(&self, rooms: &[u64]) {
        let mut r = self.rooms.lock().unwrap();
        for room in rooms {
            r.entry(*room).or_insert(false);
        }
    }

    /// Forgets a prefill's rooms (answered, timed out or aborted).
    pub fn forget_rooms(&self, rooms: &[u64]) {
        let mut r = self.rooms.lock().unwrap();
        for room in rooms {
            r.remove(room);
        }
    }

    /// Waits until the decode of every room has connected; `Err` with the first room
    /// still alone after `handshake_timeout`. The rooms are forgotten either way.
    pub async fn await_decodes(&self, rooms: &[u64]) -> Result<(), u64> {
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        loop {
            let alone = {
                let r = self.rooms.lock().unwrap();
                rooms
                    .iter()
                    .find(|room| r.get(room) != Some(&true))
                    .copied()
            };
            match alone {
                None => {
                    self.forget_rooms(rooms);
                    return Ok(());
                }
                Some(room) if Instant::now() >= deadline => {
                    self.forget_rooms(rooms);
                    return Err(room);
                }
                Some(_) => monoio::time::sleep(POLL).await,
            }
        }
    }

    /// A decode's handshake for `room`: true (and the room's prefill woken) when a prefill
    /// request holds the room.
    pub fn connect_room(&self, room: u64) -> bool {
        match self.rooms.lock().unwrap().get_mut(&room) {
            Some(connected) => {
                if !*connected {
                    *connected = true;
                    self.counters.handshakes.fetch_add(1, Relaxed);
                }
                true
            }
            None => false,
        }
    }
}

fn vllm_prefill(f: &LegFields) -> Result<Leg, String> {
    let asks = f
        .kv_transfer_params
        .as_ref()
        .and_then(|p| p.get("do_remote_decode"))
        .and_then(Value::as_bool);
    if asks == Some(true) {
        Ok(Leg::VllmPrefill)
    } else {
        Err(
            "kv_transfer_params with do_remote_decode: true is missing (this engine is a prefill)"
                .into(),
        )
    }
}

fn vllm_decode(f: &LegFields) -> Result<Leg, String> {
    let none = || "kv_transfer_params name no prefill".to_string();
    let p = f.kv_transfer_params.as_ref().ok_or_else(none)?;
    if p.get("do_remote_prefill").and_then(Value::as_bool) != Some(true) {
        return Err(none());
    }
    let engine = p.get("remote_engine_id").and_then(Value::as_str);
    let host = p.get("remote_host").and_then(Value::as_str);
    let port = p.get("remote_port").and_then(Value::as_u64);
    let blocks = p.get("remote_block_ids").and_then(Value::as_array);
    let (Some(engine), Some(host), Some(port), Some(blocks)) = (engine, host, port, blocks) else {
        return Err(none());
    };
    let blocks: Option<Vec<u64>> = blocks.iter().map(Value::as_u64).collect();
    let port = u16::try_from(port).map_err(|_| none())?;
    let blocks = blocks.filter(|b| !b.is_empty()).ok_or_else(none)?;
    let remote = Remote {
        host: host.to_string(),
        port,
    };
    Ok(Leg::VllmDecode(remote, engine.to_string(), blocks))
}

/// The prompts of a body: a list of strings or of token-id lists is a batch.
fn batch_size(prompt: Option<&Value>) -> Option<usize> {
    let items = prompt?.as_array()?;
    let batch = !items.is_empty() && items.iter().all(|i| i.is_string() || i.is_array());
    batch.then_some(items.len())
}

/// The SGLang fields: scalars for one prompt; for a batch, lists of one per prompt, or
/// scalars that SGLang spreads over it (the host and port for every prompt, the room
/// `room + i` for the i-th, as its `mini_lb` relies on).
fn bootstrap_fields(f: &LegFields) -> Result<(Remote, Vec<u64>), String> {
    let missing = || {
        "bootstrap_host, bootstrap_port and bootstrap_room are required (this engine serves \
         a disaggregated leg)"
            .to_string()
    };
    let (Some(host), Some(port), Some(room)) =
        (&f.bootstrap_host, &f.bootstrap_port, &f.bootstrap_room)
    else {
        return Err(missing());
    };
    let (hosts, ports, rooms) = match batch_size(f.prompt.as_ref()) {
        Some(n) => {
            let list = |v: &Value, name: &str| match v.as_array() {
                Some(a) if a.len() == n => Ok(a.clone()),
                Some(_) => Err(format!("{name} must be a list of {n}, one per prompt")),
                None if name == "bootstrap_room" => Ok((0..n as u64)
                    .map(|i| v.as_u64().map_or(Value::Null, |r| (r + i).into()))
                    .collect()),
                None => Ok(vec![v.clone(); n]),
            };
            (
                list(host, "bootstrap_host")?,
                list(port, "bootstrap_port")?,
                list(room, "bootstrap_room")?,
            )
        }
        None => (vec![host.clone()], vec![port.clone()], vec![room.clone()]),
    };
    let host = hosts[0].as_str().ok_or("bootstrap_host must be a string")?;
    if hosts.iter().any(|h| h.as_str() != Some(host)) {
        return Err("a batch's bootstrap_host values must name one prefill".into());
    }
    let port = ports[0].as_u64().and_then(|p| u16::try_from(p).ok());
    let port = port.ok_or("bootstrap_port must be a port number")?;
    if ports.iter().any(|p| p.as_u64() != Some(port as u64)) {
        return Err("a batch's bootstrap_port values must name one prefill".into());
    }
    let rooms: Option<Vec<u64>> = rooms
        .iter()
        .map(|r| r.as_u64().filter(|r| *r < 1 << 63))
        .collect();
    let rooms = rooms.ok_or("bootstrap_room must be an integer in 0..2^63")?;
    let remote = Remote {
        host: host.to_string(),
        port,
    };
    Ok((remote, rooms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pd(protocol: PdProtocol, role: PdRole) -> Pd {
        let cfg = PdConfig {
            role,
            protocol,
            ..PdConfig::default()
        };
        Pd::new(cfg, "e", "0.0.0.0:7000".parse().unwrap())
    }

    #[test]
    fn held_blocks_are_pulled_once() {
        let p = pd(PdProtocol::Vllm, PdRole::Prefill);
        assert_eq!(p.http.to_string(), "127.0.0.1:7000");
        let params = p.hold_blocks(33);
        let blocks = params["remote_block_ids"].clone();
        assert_eq!(blocks.as_array().unwrap().len(), 3);
        let body = serde_json::json!({"engine_id": p.engine_id, "block_ids": blocks});
        let body = body.to_string();
        assert_eq!(p.pull(body.as_bytes()), Ok(()));
        assert_eq!(p.pull(body.as_bytes()).unwrap_err().0, 404);
        let other = serde_json::json!({"engine_id": "x", "block_ids": [1]}).to_string();
        assert_eq!(p.pull(other.as_bytes()).unwrap_err().0, 404);
        assert_eq!(p.pull(b"nope").unwrap_err().0, 400);
        let s = p.stats();
        assert_eq!((s.pulls_served, s.pulls_refused), (1, 2));
    }

    #[test]
    fn held_blocks_expire_after_the_handshake_timeout() {
        let cfg = PdConfig {
            handshake_timeout: Duration::from_millis(1),
            ..PdConfig::default()
        };
        let p = Pd::new(cfg, "e", "127.0.0.1:7000".parse().unwrap());
        let params = p.hold_blocks(1);
        assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 1);
        std::thread::sleep(Duration::from_millis(20));
        let body = serde_json::json!({"engine_id": p.engine_id,
            "block_ids": params["remote_block_ids"]});
        assert_eq!(p.pull(body.to_string().as_bytes()).unwrap_err().0, 404);
    }

    #[test]
    fn legs_read_their_fields() {
        let p = pd(PdProtocol::Vllm, PdRole::Decode);
        assert!(p.leg(br#"{"prompt":"x"}"#).is_err());
        let ok = br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e",
            "remote_block_ids":[4,5],"remote_host":"h","remote_port":9}}"#;
        let remote = Remote {
            host: "h".into(),
            port: 9,
        };
        assert_eq!(
            p.leg(ok).unwrap(),
            Leg::VllmDecode(remote.clone(), "e".into(), vec![4, 5])
        );
        let s = pd(PdProtocol::Sglang, PdRole::Decode);
        let one = br#"{"prompt":"x","bootstrap_host":"h","bootstrap_port":9,"bootstrap_room":7}"#;
        assert_eq!(
            s.leg(one).unwrap(),
            Leg::SglangDecode(remote.clone(), vec![7])
        );
        let spread =
            br#"{"prompt":["a","b"],"bootstrap_host":"h","bootstrap_port":9,"bootstrap_room":7}"#;
        assert_eq!(
            s.leg(spread).unwrap(),
            Leg::SglangDecode(
                Remote {
                    host: "h".into(),
                    port: 9
                },
                vec![7, 8]
            )
        );
        let batch = br#"{"prompt":["a","b"],"bootstrap_host":["h","h"],"bootstrap_port":[9,9],
            "bootstrap_room":[1,2]}"#;
        assert_eq!(s.leg(batch).unwrap(), Leg::SglangDecode(remote, vec![1, 2]));
        let short = br#"{"prompt":["a","b"],"bootstrap_host":["h"],"bootstrap_port":[9,9],
            "bootstrap_room":[1,2]}"#;
        assert!(s.leg(short).is_err());
        assert!(s.leg(br#"{"prompt":"x","bootstrap_host":"h"}"#).is_err());
    }

    #[test]
    fn a_room_connects_once_registered() {
        let p = pd(PdProtocol::Sglang, PdRole::Prefill);
        assert!(!p.connect_room(3));
        p.register_rooms(&[3]);
        assert!(p.connect_room(3));
        assert!(p.connect_room(3));
        assert_eq!(p.stats().handshakes, 1);
        p.forget_rooms(&[3]);
        assert!(!p.connect_room(3));
    }
}
