//! `[kv_events]` and each target's `[targets.kv_events]` publisher.

use super::common::*;

/// A ZMQ endpoint the gateway connects to: `tcp://host:port`, `ipc://path` or `inproc://name`.
pub(super) fn zmq_endpoint(
    v: Option<String>,
    key: &str,
    required: bool,
    errs: &mut Collector,
) -> Option<Option<String>> {
    match v {
        None if required => {
            errs.push(
                key,
                "[kv_events] has no `endpoint`",
                "set endpoint = \"tcp://<engine host>:5557\" (the engine's --kv-events-config endpoint, with its host instead of *)",
            );
            None
        }
        None => Some(None),
        Some(e) => {
            let ok = ["tcp://", "ipc://", "inproc://"]
                .iter()
                .any(|p| e.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
                && !e.contains('*');
            if ok {
                Some(Some(e))
            } else {
                errs.push(
                    key,
                    format!("`{e}` is not a ZMQ endpoint the gateway can connect to"),
                    "write tcp://host:port (no *: that is the engine's bind address), ipc://path or inproc://name",
                );
                None
            }
        }
    }
}

pub(super) fn target_kv_events(
    raw: Option<RawTargetKvEvents>,
    at: &str,
    errs: &mut Collector,
) -> Option<Option<TargetKvEvents>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    if !cfg!(feature = "kv-events") {
        errs.push(
            at,
            "this build of rolter cannot subscribe to KV-cache events (built without the `kv-events` feature)",
            "remove [targets.kv_events], or use a build with the default features",
        );
        return None;
    }
    let endpoint = zmq_endpoint(raw.endpoint, &join(at, "endpoint"), true, errs);
    let replay = zmq_endpoint(
        raw.replay_endpoint,
        &join(at, "replay_endpoint"),
        false,
        errs,
    );
    Some(Some(TargetKvEvents {
        endpoint: endpoint??,
        replay_endpoint: replay?,
        topic: raw.topic.unwrap_or_default(),
    }))
}

pub(super) fn kv_events(raw: Option<RawKvEvents>, errs: &mut Collector) -> Option<KvEventsConfig> {
    let d = KvEventsConfig::default();
    let Some(raw) = raw else {
        return Some(d);
    };
    let block_size = count(
        raw.block_size,
        "kv_events.block_size",
        d.block_size,
        1..=256,
        "tokens per index key",
        errs,
    );
    let max_blocks = count(
        raw.max_blocks_per_target,
        "kv_events.max_blocks_per_target",
        d.max_blocks_per_target,
        1..=u32::MAX,
        "engine blocks remembered per target",
        errs,
    );
    let stale_after = nonzero_duration(
        raw.stale_after.as_ref(),
        "kv_events.stale_after",
        d.stale_after,
        errs,
    );
    let repair_timeout = nonzero_duration(
        raw.repair_timeout.as_ref(),
        "kv_events.repair_timeout",
        d.repair_timeout,
        errs,
    );
    Some(KvEventsConfig {
        block_size: block_size?,
        max_blocks_per_target: max_blocks?,
        stale_after: stale_after?,
        repair_timeout: repair_timeout?,
    })
}
