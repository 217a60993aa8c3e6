//! Loading a LoRA adapter on the chosen target before forwarding, for `lora_aware` routes
//! with `load_from`: when the request names one of the route's `adapters` and the chosen
//! target's model list shows it is not registered there, the gateway calls vLLM's
//! `POST /v1/load_lora_adapter` (`{"lora_name","lora_path"}`, the path `load_from/<name>`)
//! first, on the core's keep-alive pool.
//!
//! Owns, per route and core, the configured adapter names and what this core loaded
//! recently (so the targets' next model-list poll is not waited for: a loaded target counts
//! as registering the adapter for `window`). It must not fail a request: a failed load is
//! counted and the request is forwarded anyway, and the engine's own answer decides.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rolter_core::{adapter_key, Residency, TargetId};
use rolter_strategy::AdapterLoading;

use crate::mesh::{Record, WorkerLinks};
use crate::upstream::Upstreams;

/// Largest answer read from the load call.
const MAX_ANSWER: usize = 64 * 1024;
/// Loads remembered per route and core.
const MAX_REMEMBERED: usize = 4096;

/// The outcome of one load call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadResult {
    /// 2xx, or vLLM's 400 saying the adapter is already loaded.
    Loaded,
    /// Any other answer, a timeout or a connect failure.
    Failed,
}

/// One route's adapter loader on one core.
pub struct AdapterLoader {
    load_from: String,
    timeout: Duration,
    window: Duration,
    /// Keys of the route's `adapters`, with their names.
    adapters: HashMap<u64, String>,
    /// (adapter key, target) → when this core loaded it there.
    loaded: RefCell<HashMap<(u64, TargetId), Instant>>,
}

impl AdapterLoader {
    /// The loader of a route whose strategy loads adapters on demand (`lora_aware` with
    /// `load_from`).
    pub fn for_route(options: Option<&AdapterLoading>) -> Option<AdapterLoader> {
        let o = options?;
        Some(AdapterLoader {
            load_from: o.load_from.clone(),
            timeout: o.timeout,
            window: o.window,
            adapters: o
                .adapters
                .iter()
                .map(|n| (adapter_key(n), n.clone()))
                .collect(),
            loaded: RefCell::new(HashMap::new()),
        })
    }

    /// Before an attempt on `target` for `model`: loads the model's adapter there when the
    /// target's model list shows it is missing (`residency`), and reports the load.
    pub async fn ensure(
        &self,
        up: &Upstreams,
        links: &WorkerLinks,
        target: TargetId,
        model: &str,
        residency: Residency,
        scratch: &mut Vec<u8>,
    ) {
        let key = adapter_key(model);
        if let Some(adapter) = self.needed(key, residency) {
            let loaded = self.load(up, target, key, adapter, scratch).await;
            links.record(Record::AdapterLoad {
                target: target as u16,
                adapter: key,
                loaded: loaded == LoadResult::Loaded,
            });
        }
    }

    /// `residency` of the model with key `key` ([`adapter_key`]) on `target`, plus `LOADED`
    /// where this core loaded it within the window.
    pub fn residency(
        &self,
        key: u64,
        target: TargetId,
        residency: Residency,
        now: Instant,
    ) -> Residency {
        if self.recently_loaded(key, target, now) {
            residency.union(Residency::LOADED)
        } else {
            residency
        }
    }

    fn recently_loaded(&self, key: u64, target: TargetId, now: Instant) -> bool {
        self.loaded
            .borrow()
            .get(&(key, target))
            .is_some_and(|&at| now.saturating_duration_since(at) < self.window)
    }

    /// The adapter name to load on a target with `residency` for the model with key `key`,
    /// when it must be loaded: a configured adapter the target's model list shows is not
    /// registered there.
    pub fn needed(&self, key: u64, residency: Residency) -> Option<&str> {
        let listed_elsewhere =
            residency.contains(Residency::LISTED) && !residency.contains(Residency::LOADED);
        if !listed_elsewhere {
            return None;
        }
        self.adapters.get(&key).map(String::as_str)
    }

    /// Loads `adapter` (key `key`) on `target`; remembers a success for the window.
    pub async fn load(
        &self,
        up: &Upstreams,
        target: TargetId,
        key: u64,
        adapter: &str,
        scratch: &mut Vec<u8>,
    ) -> LoadResult {
        let body = serde_json::json!({
            "lora_name": adapter,
            "lora_path": format!("{}/{adapter}", self.load_from),
        })
        .to_string();
        let result = match up
            .post_json(
                target,
                "/v1/load_lora_adapter",
                body.as_bytes(),
                self.timeout,
                MAX_ANSWER,
                scratch,
            )
            .await
        {
            Ok(r) if (200..300).contains(&r.status) => LoadResult::Loaded,
            Ok(r) if r.status == 400 && already_loaded(&r.body) => LoadResult::Loaded,
            _ => LoadResult::Failed,
        };
        if result == LoadResult::Loaded {
            let now = Instant::now();
            let mut loaded = self.loaded.borrow_mut();
            if loaded.len() >= MAX_REMEMBERED {
                let window = self.window;
                loaded.retain(|_, at| now.saturating_duration_since(*at) < window);
                if loaded.len() >= MAX_REMEMBERED {
                    loaded.clear();
                }
            }
            loaded.insert((key, target), now);
        }
        result
    }
}

/// vLLM's answer to loading an adapter it already has: 400 with "has already been loaded".
fn already_loaded(body: &[u8]) -> bool {
    body.windows(b"already been loaded".len())
        .any(|w| w == b"already been loaded")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loader(options: &str) -> Option<AdapterLoader> {
        let text = format!(
            "[[targets]]\nname = \"a\"\nurl = \"http://127.0.0.1:8000\"\n\n[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\nname = \"lora_aware\"\n{options}\n"
        );
        let c = rolter_config::load_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        AdapterLoader::for_route(c.routes[0].strategy.requirements().adapter_loading.as_ref())
    }

    #[test]
    fn only_routes_with_load_from_load() {
        assert!(loader("adapters = \"sql-lora\"").is_none());
        let l = loader("adapters = \"sql-lora\"\nload_from = \"/models/loras/\"").unwrap();
        assert_eq!(l.load_from, "/models/loras");
        assert_eq!(l.timeout, Duration::from_secs(30));
    }

    #[test]
    fn a_configured_adapter_the_target_does_not_list_is_loaded() {
        let l = loader("adapters = \"sql-lora, chat-lora\"\nload_from = \"/loras\"").unwrap();
        let listed = Residency::LISTED.union(Residency::SLOTS_KNOWN);
        let k = adapter_key;
        assert_eq!(l.needed(k("sql-lora"), listed), Some("sql-lora"));
        assert_eq!(l.needed(k("chat-lora"), listed), Some("chat-lora"));
        // Registered there, or nothing known about its model list: no load.
        assert_eq!(
            l.needed(k("sql-lora"), listed.union(Residency::LOADED)),
            None
        );
        assert_eq!(l.needed(k("sql-lora"), Residency::SLOTS_KNOWN), None);
        // Not one of the route's adapters (a base model, a typo): no load.
        assert_eq!(l.needed(k("base-model"), listed), None);
    }

    #[test]
    fn a_load_counts_as_registered_for_the_window() {
        let l = loader("adapters = \"sql-lora\"\nload_from = \"/loras\"\nwindow = \"5s\"").unwrap();
        let t0 = Instant::now();
        l.loaded
            .borrow_mut()
            .insert((adapter_key("sql-lora"), 1), t0);
        let listed = Residency::LISTED;
        let key = adapter_key("sql-lora");
        let r = l.residency(key, 1, listed, t0 + Duration::from_secs(4));
        assert!(r.contains(Residency::LOADED));
        assert_eq!(l.needed(key, r), None);
        assert_eq!(l.residency(key, 0, listed, t0), listed, "another target");
        assert_eq!(
            l.residency(key, 1, listed, t0 + Duration::from_secs(5)),
            listed,
            "expired"
        );
    }

    #[test]
    fn vllms_already_loaded_answer_is_recognised() {
        assert!(already_loaded(
            br#"{"object":"error","message":"The lora adapter 'sql-lora' has already been loaded.","type":"InvalidUserInput","code":400}"#
        ));
        assert!(!already_loaded(br#"{"message":"No adapter found"}"#));
    }
}
