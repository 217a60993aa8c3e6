//! The threads that rebuild the engines' state beside the data plane: with
//! `[targets.kv_events]` on some target, the KV-event subscriber (`rolter-kv-events`) and
//! the index thread (`rolter-kv-index`); the view the strategies read comes with them.
//! Built without the `kv-events` feature there are none (the configuration refuses
//! `[targets.kv_events]` then).
//!
//! Owns starting and stopping those threads. It must not be on the request path: workers
//! only read the view.

use std::io;

use rolter_config::Config;
use rolter_core::KvView;
use rolter_engine::kv::reports::KvReports;

/// The running engine-state threads.
pub struct EngineThreads {
    #[cfg(feature = "kv-events")]
    kv: Option<rolter_engine::kv::index_thread::KvPlane>,
}

impl EngineThreads {
    /// Starts what `config` asks for; returns the KV-cache view the strategies read (`None`
    /// when no target publishes KV events). Fails before any port is bound.
    pub fn start(config: &Config) -> io::Result<(EngineThreads, Option<KvView>)> {
        #[cfg(feature = "kv-events")]
        {
            let (kv, view) = kv::start(config)?;
            Ok((EngineThreads { kv }, view))
        }
        #[cfg(not(feature = "kv-events"))]
        {
            debug_assert!(config.targets.iter().all(|t| t.kv_events.is_none()));
            Ok((EngineThreads {}, None))
        }
    }

    /// The KV-event plane's reports for `/metrics`, when it runs.
    pub fn kv_reports(&self) -> Option<KvReports> {
        #[cfg(feature = "kv-events")]
        {
            self.kv.as_ref().map(|p| p.reports())
        }
        #[cfg(not(feature = "kv-events"))]
        {
            None
        }
    }

    /// Stops the threads and waits for them.
    pub fn stop(self) {
        #[cfg(feature = "kv-events")]
        if let Some(p) = self.kv {
            p.stop();
        }
    }
}

#[cfg(feature = "kv-events")]
mod kv {
    use std::io;
    use std::sync::Arc;

    use rolter_config::Config;
    use rolter_core::KvView;
    use rolter_engine::kv::index::{KvIndex, KvIndexConfig};
    use rolter_engine::kv::index_thread::{KvPlane, KvPlaneOptions, KvRepair};
    use rolter_engine::kv::transport::{KvEventsEndpoint, KvTransport, KvTransportOptions};
    use rolter_engine::kv::view::EngineView;

    /// Starts the KV-event plane when some target has `[targets.kv_events]`.
    pub fn start(config: &Config) -> io::Result<(Option<KvPlane>, Option<KvView>)> {
        let subscriptions: Vec<(usize, KvEventsEndpoint)> = config
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                t.kv_events.as_ref().map(|k| {
                    (
                        i,
                        KvEventsEndpoint {
                            endpoint: k.endpoint.clone(),
                            replay_endpoint: k.replay_endpoint.clone(),
                            topic: k.topic.clone(),
                        },
                    )
                })
            })
            .collect();
        if subscriptions.is_empty() {
            return Ok((None, None));
        }
        let cfg = &config.kv_events;
        let index = KvIndex::new(KvIndexConfig {
            block_size: cfg.block_size as usize,
            max_blocks_per_target: cfg.max_blocks_per_target as usize,
        })
        .map_err(io::Error::other)?;
        let view = EngineView::with_kv(index.reader(), config.targets.len());
        let can_replay = config
            .targets
            .iter()
            .map(|t| {
                t.kv_events
                    .as_ref()
                    .is_some_and(|k| k.replay_endpoint.is_some())
            })
            .collect();
        let repair_timeout = cfg.repair_timeout;
        let transport_opts = KvTransportOptions {
            replay_timeout: repair_timeout,
            ..KvTransportOptions::default()
        };
        let (transport, frames) = KvTransport::start(subscriptions, transport_opts)
            .map_err(|e| io::Error::other(format!("KV events: {e}")))?;
        let repair = KvRepair::new(index, view.clone(), can_replay, repair_timeout);
        let plane = KvPlane::start(
            transport,
            frames,
            repair,
            KvPlaneOptions {
                stale_after: cfg.stale_after,
                repair_timeout,
            },
        )?;
        let view: KvView = Arc::new(view);
        Ok((Some(plane), Some(view)))
    }
}
