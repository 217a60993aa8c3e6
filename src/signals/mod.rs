//! The signal plane: what strategies and the candidate filter know about targets, and how
//! that knowledge moves between cores without locks.
//!
//! - [`exchange`]: the crossbeam channels between workers and the control thread, and the
//!   messages on them (load snapshots, attempt records, target snapshots).
//! - [`load`]: a worker's load view: its own exact in-flight counts, the other cores' latest
//!   snapshots, and the scraped engine queue depth.
//! - [`health`]: the control thread's health book: active check results, passive ejection on
//!   consecutive failures, the ejection cap and the growing ejection time.
//! - [`scrape`]: parsing an engine's Prometheus text into queue depth, running requests and
//!   KV-cache use (vLLM and SGLang names).
//! - [`lora`]: LoRA adapter residency per target (`vllm:lora_requests_info`, the adapters
//!   in `GET /v1/models`), the table the control thread publishes and the worker's view.
//!
//! Nothing here runs I/O on a worker; workers only push into channels and drain them with
//! `try_recv`.

pub mod exchange;
pub mod health;
pub mod load;
pub mod lora;
pub mod scrape;
