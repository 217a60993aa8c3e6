//! LoRA adapter residency per target: what the control thread reads from an engine
//! (`vllm:lora_requests_info` in its metrics, the adapter entries of `GET /v1/models`), the
//! compact table it publishes to the workers, and the worker's side of that table.
//!
//! Adapter names never reach a worker: the control thread hashes each one with
//! [`adapter_key`], and the worker hashes the request's `model` the same way, so a lookup
//! compares integers. Owns the parsing and the table; it must not fetch or schedule
//! anything (the control thread does), and the worker side must not allocate or lock per
//! request.

use std::cell::{Ref, RefCell};
use std::sync::Arc;

use prom_text_format_parser::{Metric, Type, ValueType};

use rolter_core::Residency;
use rolter_core::TargetId;

pub use rolter_core::adapter_key;

/// One engine's `vllm:lora_requests_info`: the series with the greatest value (vLLM sets a
/// new series to the current time whenever the label values change, and old series linger).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoraInfo {
    /// `max_lora`: adapter slots in one batch. `None` when the label is missing or not a
    /// number.
    pub max_lora: Option<u32>,
    /// `running_lora_adapters`: adapters with requests running.
    pub running: Vec<String>,
    /// `waiting_lora_adapters`: adapters with requests waiting.
    pub waiting: Vec<String>,
}

/// Reads `vllm:lora_requests_info` out of parsed metric families; `None` when the engine
/// exposes no such series (LoRA off, or not vLLM).
pub fn lora_info(families: &[Metric]) -> Option<LoraInfo> {
    let mut best: Option<(f64, &prom_text_format_parser::Sample)> = None;
    for m in families {
        if m.name != "vllm:lora_requests_info" || !matches!(m.kind, Type::Gauge | Type::Untyped) {
            continue;
        }
        for s in &m.samples {
            if s.value.value_type != ValueType::Sample {
                continue;
            }
            let Ok(v) = s.value.value.parse::<f64>() else {
                continue;
            };
            if v.is_nan() {
                continue;
            }
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, s));
            }
        }
    }
    let (_, sample) = best?;
    let label = |key: &str| {
        sample
            .labels
            .iter()
            .find(|l| l.key == key)
            .map(|l| l.value.as_str())
            .unwrap_or("")
    };
    Some(LoraInfo {
        max_lora: label("max_lora").trim().parse().ok(),
        running: names(label("running_lora_adapters")),
        waiting: names(label("waiting_lora_adapters")),
    })
}

/// A comma-separated adapter list, trimmed, empty entries left out.
fn names(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// What `GET /v1/models` lists.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelList {
    /// Entries without a `parent`: base models.
    pub base: Vec<String>,
    /// Entries with a `parent`: LoRA adapters registered on the engine.
    pub adapters: Vec<String>,
}

/// Parses an OpenAI-style model list (`{"object":"list","data":[{"id":…,"parent":…},…]}`):
/// an entry with a non-null `parent` is an adapter (vLLM's `ModelCard`).
pub fn parse_models(body: &[u8]) -> Result<ModelList, String> {
    #[derive(serde::Deserialize)]
    struct Card {
        id: String,
        #[serde(default)]
        parent: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Card>,
    }
    let list: List =
        serde_json::from_slice(body).map_err(|e| format!("not an OpenAI model list: {e}"))?;
    let mut out = ModelList::default();
    for card in list.data {
        match card.parent {
            Some(p) if !p.is_empty() => out.adapters.push(card.id),
            _ => out.base.push(card.id),
        }
    }
    Ok(out)
}

/// A target's adapter slots, from a fresh `vllm:lora_requests_info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Slots {
    pub max_lora: Option<u32>,
    /// Keys of the running adapters.
    pub running: Vec<u64>,
    /// Keys of the waiting adapters.
    pub waiting: Vec<u64>,
}

impl Slots {
    pub fn from_info(info: &LoraInfo) -> Slots {
        let keys = |v: &[String]| v.iter().map(|n| adapter_key(n)).collect();
        Slots {
            max_lora: info.max_lora,
            running: keys(&info.running),
            waiting: keys(&info.waiting),
        }
    }

    /// Fewer adapters run than there are slots.
    pub fn free_slot(&self) -> bool {
        self.max_lora
            .is_some_and(|m| (self.running.len() as u64) < u64::from(m))
    }
}

/// What the workers know about one target's adapters; `None` fields are unknown (never
/// read, or stale).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetLora {
    pub slots: Option<Slots>,
    /// Keys of the adapters the target lists in `GET /v1/models`, sorted.
    pub loaded: Option<Vec<u64>>,
}

/// Every target's adapter residency, as the control thread publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoraTable {
    /// Indexed by target id.
    pub targets: Vec<TargetLora>,
    /// Keys of every adapter some target reports (running, waiting or listed), sorted.
    pub adapters: Vec<u64>,
}

impl LoraTable {
    /// A table over `targets`; fills in the adapter set.
    pub fn new(targets: Vec<TargetLora>) -> LoraTable {
        let mut adapters = Vec::new();
        for t in &targets {
            if let Some(s) = &t.slots {
                adapters.extend_from_slice(&s.running);
                adapters.extend_from_slice(&s.waiting);
            }
            if let Some(l) = &t.loaded {
                adapters.extend_from_slice(l);
            }
        }
        adapters.sort_unstable();
        adapters.dedup();
        LoraTable { targets, adapters }
    }

    /// Whether `key` is an adapter some target reports.
    #[inline]
    pub fn is_adapter(&self, key: u64) -> bool {
        self.adapters.binary_search(&key).is_ok()
    }

    /// What target `t` holds of adapter `key`; `adapter` is [`Self::is_adapter`] of it.
    pub fn residency(&self, t: TargetId, key: u64, adapter: bool) -> Residency {
        let mut r = if adapter {
            Residency::ADAPTER
        } else {
            Residency::UNKNOWN
        };
        let Some(tl) = self.targets.get(t) else {
            return r;
        };
        if let Some(s) = &tl.slots {
            r = r.union(Residency::SLOTS_KNOWN);
            if s.running.contains(&key) {
                r = r.union(Residency::RUNNING);
            }
            if s.waiting.contains(&key) {
                r = r.union(Residency::WAITING);
            }
            if s.free_slot() {
                r = r.union(Residency::FREE_SLOT);
            }
        }
        if let Some(l) = &tl.loaded {
            r = r.union(Residency::LISTED);
            if l.binary_search(&key).is_ok() {
                r = r.union(Residency::LOADED);
            }
        }
        r
    }
}

/// A worker's latest table (replaced whole on each publication; nothing until the first).
#[derive(Debug, Default)]
pub struct LoraView {
    table: RefCell<Option<Arc<LoraTable>>>,
}

impl LoraView {
    pub fn apply(&self, table: Arc<LoraTable>) {
        *self.table.borrow_mut() = Some(table);
    }

    /// The residency lookup for one request's `model`: hashes it once, and answers per
    /// target while it lives.
    pub fn lookup(&self, model: &str) -> LoraLookup<'_> {
        let table = self.table.borrow();
        let key = adapter_key(model);
        let adapter = table.as_ref().is_some_and(|t| t.is_adapter(key));
        LoraLookup {
            table,
            key,
            adapter,
        }
    }
}

/// One request's view of the table.
pub struct LoraLookup<'a> {
    table: Ref<'a, Option<Arc<LoraTable>>>,
    key: u64,
    adapter: bool,
}

impl LoraLookup<'_> {
    /// The requested model's key ([`adapter_key`]), hashed once per request.
    #[inline]
    pub fn key(&self) -> u64 {
        self.key
    }

    #[inline]
    pub fn residency(&self, t: TargetId) -> Residency {
        match self.table.as_ref() {
            Some(table) => table.residency(t, self.key, self.adapter),
            None => Residency::UNKNOWN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolter_core::Level;

    const VLLM: &str = include_str!("../../../tests/fixtures/vllm_metrics.prom");

    fn info(text: &str) -> Option<LoraInfo> {
        lora_info(&crate::scrape::parse_families(text).unwrap())
    }

    #[test]
    fn the_fixture_line() {
        assert_eq!(
            info(VLLM),
            Some(LoraInfo {
                max_lora: Some(4),
                running: vec!["sql-lora".into(), "chat-lora".into()],
                waiting: vec![],
            })
        );
    }

    #[test]
    fn the_series_with_the_greatest_timestamp_wins() {
        let text = "\
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 1.7180000100e+09
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"b, c\",waiting_lora_adapters=\"a\"} 1.7180000300e+09
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7180000200e+09
vllm:lora_requests_info{max_lora=\"9\",running_lora_adapters=\"z\",waiting_lora_adapters=\"\"} NaN
";
        let i = info(text).unwrap();
        assert_eq!(i.max_lora, Some(2));
        assert_eq!(i.running, ["b", "c"]);
        assert_eq!(i.waiting, ["a"]);
        // In any order.
        let mut lines: Vec<&str> = text.lines().collect();
        lines[2..].reverse();
        assert_eq!(info(&lines.join("\n")), Some(i));
    }

    #[test]
    fn absent_or_odd_series() {
        assert_eq!(
            info("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n"),
            None
        );
        // Declared, no sample yet.
        assert_eq!(
            info("# HELP vllm:lora_requests_info x\n# TYPE vllm:lora_requests_info gauge\n"),
            None
        );
        // Missing labels: unknown slot count, no adapters.
        let i = info("vllm:lora_requests_info 1.0\n").unwrap();
        assert_eq!(i, LoraInfo::default());
        let i = info("vllm:lora_requests_info{max_lora=\"x\",running_lora_adapters=\",a,,\"} 2\n")
            .unwrap();
        assert_eq!((i.max_lora, i.running), (None, vec!["a".to_string()]));
    }

    #[test]
    fn model_list_adapters_have_a_parent() {
        let body = br#"{"object":"list","data":[
            {"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1,"owned_by":"vllm",
             "root":"/models/llama","parent":null,"max_model_len":8192,"permission":[]},
            {"id":"sql-lora","object":"model","created":1,"owned_by":"vllm","root":"/adapters/sql",
             "parent":"meta-llama/Llama-3.1-8B-Instruct","permission":[]},
            {"id":"plain","object":"model"}
        ]}"#;
        let m = parse_models(body).unwrap();
        assert_eq!(m.base, ["meta-llama/Llama-3.1-8B-Instruct", "plain"]);
        assert_eq!(m.adapters, ["sql-lora"]);
        assert!(parse_models(b"<html>").is_err());
        assert!(parse_models(br#"{"data":[{"parent":"x"}]}"#).is_err());
        assert_eq!(
            parse_models(br#"{"data":[]}"#).unwrap(),
            ModelList::default()
        );
    }

    #[test]
    fn table_residency() {
        let k = adapter_key;
        let t0 = TargetLora {
            slots: Some(Slots::from_info(&LoraInfo {
                max_lora: Some(2),
                running: vec!["a".into()],
                waiting: vec!["b".into()],
            })),
            loaded: Some({
                let mut v = vec![k("a"), k("b"), k("c")];
                v.sort_unstable();
                v
            }),
        };
        let t1 = TargetLora {
            slots: Some(Slots {
                max_lora: Some(1),
                running: vec![k("c")],
                waiting: vec![],
            }),
            loaded: None,
        };
        let table = LoraTable::new(vec![t0, t1, TargetLora::default()]);
        for n in ["a", "b", "c"] {
            assert!(table.is_adapter(k(n)), "{n}");
        }
        assert!(!table.is_adapter(k("base")));
        let level = |t, n| table.residency(t, k(n), table.is_adapter(k(n))).level();
        assert_eq!(level(0, "a"), Level::Running);
        // One of two slots used: b has a free slot (and waits too).
        assert_eq!(level(0, "b"), Level::FreeSlot);
        assert_eq!(level(0, "c"), Level::FreeSlot);
        assert_eq!(level(0, "d"), Level::None, "not listed there");
        assert_eq!(level(1, "c"), Level::Running);
        assert_eq!(level(1, "a"), Level::None, "its only slot is taken");
        assert_eq!(level(2, "a"), Level::Unknown);
        assert_eq!(level(9, "a"), Level::Unknown);
        assert!(table
            .residency(2, k("a"), true)
            .contains(Residency::ADAPTER));
    }

    #[test]
    fn the_worker_view_hashes_once_and_starts_unknown() {
        let v = LoraView::default();
        assert_eq!(v.lookup("a").residency(0), Residency::UNKNOWN);
        v.apply(Arc::new(LoraTable::new(vec![TargetLora {
            slots: None,
            loaded: Some(vec![adapter_key("a")]),
        }])));
        let l = v.lookup("a");
        assert_eq!(l.residency(0).level(), Level::FreeSlot);
        assert!(l.residency(0).contains(Residency::ADAPTER));
        drop(l);
        assert_eq!(v.lookup("m").residency(0).level(), Level::None);
    }
}
