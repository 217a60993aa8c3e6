//! LoRA adapters, modelled on vLLM with `--enable-lora --max-loras N` and
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`.
//!
//! - **Registered adapters**: the preloaded ones ([`LoraConfig::adapters`]) plus those
//!   added by `POST /v1/load_lora_adapter` (`{"lora_name","lora_path"}`, answered after
//!   `load_delay` with vLLM's text), minus those removed by `POST /v1/unload_lora_adapter`
//!   (`{"lora_name"}`). `GET /v1/models` lists them after the base models, with `parent` =
//!   the first base model and `root` = the adapter's path.
//! - **Requests**: a `model` that is a base model is served as without LoRA; a registered
//!   adapter is served once it has a slot; anything else gets vLLM's 404 (`The model `x`
//!   does not exist.`).
//! - **Slots**: at most `max_loras` adapters run at once (have requests in flight). A
//!   request for a running adapter joins it; one for another adapter takes a free slot, or
//!   waits (counted in `vllm:num_requests_waiting`) until one frees. The GPU keeps the
//!   `max_loras` most recently run adapters; bringing in one that is not among them is a
//!   *slot load* ([`LoraStats::slot_loads`]) and delays that request by `load_delay`.
//! - **Metrics**: `vllm:lora_requests_info{max_lora,running_lora_adapters,
//!   waiting_lora_adapters}` set to the current time for the current label values, earlier
//!   label sets kept with their last time, as vLLM's gauge does.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use crate::stats::{dec, inc, Stats};

/// LoRA serving of a mock engine (`MockConfig::lora`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraConfig {
    /// Adapters that run at once (vLLM's `--max-loras`, default 1).
    pub max_loras: usize,
    /// Adapters registered at start (vLLM's `--lora-modules`), with path `/adapters/<name>`.
    pub adapters: Vec<String>,
    /// Time a load takes: `POST /v1/load_lora_adapter` answers after it, and a request
    /// that brings an adapter into the GPU waits it before its first token.
    pub load_delay: Duration,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            max_loras: 1,
            adapters: Vec::new(),
            load_delay: Duration::ZERO,
        }
    }
}

/// LoRA counters and state (see `MockHandle::lora_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoraStats {
    /// Adapters brought into a GPU slot that was not holding them.
    pub slot_loads: u64,
    /// Successful `POST /v1/load_lora_adapter` calls.
    pub api_loads: u64,
    /// Successful `POST /v1/unload_lora_adapter` calls.
    pub api_unloads: u64,
    /// Registered adapters, in registration order.
    pub registered: Vec<String>,
    /// Adapters with requests in flight, sorted.
    pub running: Vec<String>,
    /// Adapters with requests waiting for a slot, sorted.
    pub waiting: Vec<String>,
}

/// What a request's `model` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Base,
    Adapter,
    Unknown,
}

/// Label sets of `vllm:lora_requests_info` kept (the oldest dropped first).
const MAX_SERIES: usize = 8;

#[derive(Default)]
struct Inner {
    /// (name, path), in registration order.
    registered: Vec<(String, String)>,
    /// Adapter → requests in flight.
    running: BTreeMap<String, usize>,
    /// Adapter → requests waiting for a slot.
    waiting: BTreeMap<String, usize>,
    /// Adapters held by the GPU, least recently run first.
    resident: VecDeque<String>,
    /// `lora_requests_info` label sets with their last value.
    series: Vec<(String, f64)>,
}

pub(crate) struct Lora {
    cfg: LoraConfig,
    inner: Mutex<Inner>,
    slot_loads: AtomicU64,
    api_loads: AtomicU64,
    api_unloads: AtomicU64,
}

/// A reply to a load or unload call: status, content type, body.
pub(crate) type Reply = (u16, &'static str, Vec<u8>);

#[derive(Deserialize, Default)]
#[serde(default)]
struct LoadBody {
    lora_name: Option<String>,
    lora_path: Option<String>,
    lora_int_id: Option<i64>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The JSON body of a load or unload request; a parse error is vLLM's 400.
fn load_body(body: &[u8]) -> Result<LoadBody, Reply> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            400,
            "BadRequestError",
            &format!("invalid JSON body: {e}"),
            None,
        )
    })
}

/// vLLM's error body, with its `type`.
fn error(status: u16, kind: &str, message: &str, param: Option<&str>) -> Reply {
    let body = serde_json::to_vec(&serde_json::json!({
        "error": {"message": message, "type": kind, "param": param, "code": status}
    }))
    .unwrap_or_default();
    (status, "application/json", body)
}

fn text(message: String) -> Reply {
    (200, "text/plain; charset=utf-8", message.into_bytes())
}

/// vLLM's answer to a request for a model it does not serve.
pub(crate) fn unknown_model(model: &str) -> Reply {
    error(
        404,
        "NotFoundError",
        &format!("The model `{model}` does not exist."),
        Some("model"),
    )
}

impl Lora {
    pub fn new(cfg: LoraConfig) -> Lora {
        let mut inner = Inner::default();
        for a in &cfg.adapters {
            if !inner.registered.iter().any(|(n, _)| n == a) {
                inner.registered.push((a.clone(), format!("/adapters/{a}")));
            }
        }
        Lora {
            cfg: LoraConfig {
                max_loras: cfg.max_loras.max(1),
                ..cfg
            },
            inner: Mutex::new(inner),
            slot_loads: AtomicU64::new(0),
            api_loads: AtomicU64::new(0),
            api_unloads: AtomicU64::new(0),
        }
    }

    pub fn load_delay(&self) -> Duration {
        self.cfg.load_delay
    }

    pub fn classify(&self, model: &str, base: &[String]) -> Kind {
        if base.iter().any(|b| b == model) {
            Kind::Base
        } else if self
            .inner
            .lock()
            .unwrap()
            .registered
            .iter()
            .any(|(n, _)| n == model)
        {
            Kind::Adapter
        } else {
            Kind::Unknown
        }
    }

    /// Runs one request of `name` now if it can: `Some(true)` when that brought the
    /// adapter into the GPU (a slot load).
    fn try_run(&self, name: &str) -> Option<bool> {
        let mut g = self.inner.lock().unwrap();
        if let Some(n) = g.running.get_mut(name) {
            *n += 1;
            return Some(false);
        }
        if g.running.len() >= self.cfg.max_loras {
            return None;
        }
        g.running.insert(name.to_string(), 1);
        let loaded = match g.resident.iter().position(|a| a == name) {
            Some(i) => {
                let a = g.resident.remove(i).expect("present");
                g.resident.push_back(a);
                false
            }
            None => {
                g.resident.push_back(name.to_string());
                // Evict the least recently run adapter that is not running.
                while g.resident.len() > self.cfg.max_loras {
                    let Some(i) = g.resident.iter().position(|a| !g.running.contains_key(a)) else {
                        break;
                    };
                    g.resident.remove(i);
                }
                self.slot_loads.fetch_add(1, Relaxed);
                true
            }
        };
        Some(loaded)
    }

    /// Waits for a slot for adapter `name` (polling every millisecond; the waiting request
    /// counts in `stats.waiting` meanwhile). Dropping the future gives up the wait.
    pub async fn acquire(self: Arc<Self>, name: String, stats: Arc<Stats>) -> LoraSlot {
        let mut wait: Option<Waiting> = None;
        loop {
            if let Some(loaded) = self.try_run(&name) {
                drop(wait);
                return LoraSlot {
                    lora: self,
                    name,
                    loaded,
                };
            }
            if wait.is_none() {
                *self
                    .inner
                    .lock()
                    .unwrap()
                    .waiting
                    .entry(name.clone())
                    .or_default() += 1;
                inc(&stats.waiting);
                wait = Some(Waiting {
                    lora: self.clone(),
                    name: name.clone(),
                    stats: stats.clone(),
                });
            }
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `GET /v1/models` with the adapters after the base models.
    pub fn models_body(&self, base: &[String]) -> Vec<u8> {
        let created = unix_now() as u64;
        let parent = base.first().cloned().unwrap_or_default();
        let mut data: Vec<serde_json::Value> = base
            .iter()
            .map(|m| {
                serde_json::json!({"id": m, "object": "model", "created": created,
                    "owned_by": "vllm", "root": m, "parent": null, "max_model_len": 8192,
                    "permission": []})
            })
            .collect();
        for (name, path) in &self.inner.lock().unwrap().registered {
            data.push(
                serde_json::json!({"id": name, "object": "model", "created": created,
                "owned_by": "vllm", "root": path, "parent": parent, "permission": []}),
            );
        }
        serde_json::to_vec(&serde_json::json!({"object": "list", "data": data})).unwrap_or_default()
    }

    /// Appends `vllm:lora_requests_info` to a `/metrics` text.
    pub fn render_metrics(&self, out: &mut String) {
        let now = unix_now();
        let mut g = self.inner.lock().unwrap();
        let join = |m: &BTreeMap<String, usize>| m.keys().cloned().collect::<Vec<_>>().join(",");
        let labels = format!(
            "max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"",
            self.cfg.max_loras,
            join(&g.running),
            join(&g.waiting)
        );
        match g.series.iter_mut().find(|(l, _)| *l == labels) {
            Some(s) => s.1 = now,
            None => {
                if g.series.len() >= MAX_SERIES {
                    g.series.remove(0);
                }
                g.series.push((labels, now));
            }
        }
        g.series.sort_by(|a, b| a.1.total_cmp(&b.1));
        let _ = write!(
            out,
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
             # TYPE vllm:lora_requests_info gauge\n"
        );
        for (labels, at) in &g.series {
            let _ = writeln!(out, "vllm:lora_requests_info{{{labels}}} {at:?}");
        }
    }

    /// `POST /v1/load_lora_adapter`.
    pub async fn load(&self, body: &[u8]) -> Reply {
        let b = match load_body(body) {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        let (Some(name), Some(path)) = (
            b.lora_name.filter(|s| !s.is_empty()),
            b.lora_path.filter(|s| !s.is_empty()),
        ) else {
            return error(
                400,
                "InvalidUserInput",
                "Both 'lora_name' and 'lora_path' must be provided.",
                None,
            );
        };
        let loaded = |name: &str| {
            self.inner
                .lock()
                .unwrap()
                .registered
                .iter()
                .any(|(n, _)| n == name)
        };
        let already = || {
            error(
                400,
                "InvalidUserInput",
                &format!("The lora adapter '{name}' has already been loaded."),
                None,
            )
        };
        if loaded(&name) {
            return already();
        }
        if !self.cfg.load_delay.is_zero() {
            monoio::time::sleep(self.cfg.load_delay).await;
        }
        {
            let mut g = self.inner.lock().unwrap();
            if g.registered.iter().any(|(n, _)| *n == name) {
                drop(g);
                return already();
            }
            g.registered.push((name.clone(), path));
        }
        self.api_loads.fetch_add(1, Relaxed);
        text(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    }

    /// `POST /v1/unload_lora_adapter`.
    pub fn unload(&self, body: &[u8]) -> Reply {
        let b = match load_body(body) {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        let name = b.lora_name.unwrap_or_default();
        if name.is_empty() && b.lora_int_id.is_none() {
            return error(
                400,
                "InvalidUserInput",
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                None,
            );
        }
        let mut g = self.inner.lock().unwrap();
        let Some(i) = g.registered.iter().position(|(n, _)| *n == name) else {
            return error(
                404,
                "NotFoundError",
                &format!("The lora adapter '{name}' cannot be found."),
                None,
            );
        };
        g.registered.remove(i);
        g.resident.retain(|a| *a != name);
        drop(g);
        self.api_unloads.fetch_add(1, Relaxed);
        text(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    }

    pub fn stats(&self) -> LoraStats {
        let g = self.inner.lock().unwrap();
        LoraStats {
            slot_loads: self.slot_loads.load(Relaxed),
            api_loads: self.api_loads.load(Relaxed),
            api_unloads: self.api_unloads.load(Relaxed),
            registered: g.registered.iter().map(|(n, _)| n.clone()).collect(),
            running: g.running.keys().cloned().collect(),
            waiting: g.waiting.keys().cloned().collect(),
        }
    }
}

/// A request's hold on its adapter's slot; released on drop.
pub(crate) struct LoraSlot {
    lora: Arc<Lora>,
    name: String,
    /// Getting the slot brought the adapter into the GPU.
    pub loaded: bool,
}

impl Drop for LoraSlot {
    fn drop(&mut self) {
        let mut g = self.lora.inner.lock().unwrap();
        if let Some(n) = g.running.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                g.running.remove(&self.name);
            }
        }
    }
}

/// A request waiting for a slot; leaves the waiting count on drop.
struct Waiting {
    lora: Arc<Lora>,
    name: String,
    stats: Arc<Stats>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        dec(&self.stats.waiting);
        let mut g = self.lora.inner.lock().unwrap();
        if let Some(n) = g.waiting.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                g.waiting.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora(max: usize, adapters: &[&str]) -> Arc<Lora> {
        Arc::new(Lora::new(LoraConfig {
            max_loras: max,
            adapters: adapters.iter().map(|s| s.to_string()).collect(),
            load_delay: Duration::ZERO,
        }))
    }

    #[test]
    fn slots_join_take_and_evict() {
        let l = lora(2, &["a", "b", "c"]);
        assert_eq!(l.try_run("a"), Some(true));
        assert_eq!(l.try_run("a"), Some(false), "joins the running adapter");
        assert_eq!(l.try_run("b"), Some(true));
        assert_eq!(l.try_run("c"), None, "both slots taken");
        assert_eq!(l.stats().running, ["a", "b"]);
        // b finishes: c takes its slot and evicts b from the GPU (a still runs).
        l.inner.lock().unwrap().running.remove("b");
        assert_eq!(l.try_run("c"), Some(true));
        assert_eq!(
            l.inner.lock().unwrap().resident,
            ["a".to_string(), "c".to_string()]
        );
        l.inner.lock().unwrap().running.clear();
        assert_eq!(l.try_run("a"), Some(false), "still resident: no load");
        assert_eq!(l.stats().slot_loads, 3);
    }

    #[test]
    fn classify_and_list() {
        let l = lora(1, &["sql"]);
        let base = ["m".to_string()];
        assert_eq!(l.classify("m", &base), Kind::Base);
        assert_eq!(l.classify("sql", &base), Kind::Adapter);
        assert_eq!(l.classify("x", &base), Kind::Unknown);
        let v: serde_json::Value = serde_json::from_slice(&l.models_body(&base)).unwrap();
        assert_eq!(v["data"][0]["parent"], serde_json::Value::Null);
        assert_eq!(v["data"][1]["id"], "sql");
        assert_eq!(v["data"][1]["parent"], "m");
        assert_eq!(v["data"][1]["root"], "/adapters/sql");
        let (status, _, body) = unknown_model("x");
        assert_eq!(status, 404);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], "The model `x` does not exist.");
    }

    #[test]
    fn metrics_keep_earlier_series() {
        let l = lora(2, &["a"]);
        let mut first = String::new();
        l.render_metrics(&mut first);
        assert!(first.contains(
            "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} "
        ));
        l.try_run("a");
        let mut second = String::new();
        l.render_metrics(&mut second);
        let series: Vec<&str> = second
            .lines()
            .filter(|s| s.starts_with("vllm:lora_requests_info{"))
            .collect();
        assert_eq!(series.len(), 2);
        assert!(
            series[1].contains("running_lora_adapters=\"a\""),
            "{second}"
        );
    }
}
