//! The KV-event plane: turns the transport's frames into the shared block index and keeps
//! every target's "live" flag honest.
//!
//! One thread, `rolter-kv-index`, owns the [`KvIndex`] (the only writer) and consumes the
//! [`KvTransport`]'s frame channel. Per frame: decode the batch, apply it in sequence order.
//!
//! **Consistent** means the target's index entries are what its engine's cache holds as
//! far as the engine can tell: they come from batches applied in order, with no hole,
//! since a point where the cache content was known. Such a point is
//! - the publisher's first batch, seq 0 (a fresh engine: its cache starts empty);
//! - a batch with an `AllBlocksCleared` for every medium (the cache was emptied);
//! - a full replay: every batch the engine still retains, from the first one on (blocks
//!   stored before its replay buffer began are missing, so the entries are a subset of the
//!   cache and never claim a block the engine does not hold);
//! - the gateway's first contact with a publisher that has no replay endpoint (nothing
//!   better exists; the entries are a subset of the cache in the same way).
//!
//! A target is **live** (strategies use its entries) only while consistent. The faults:
//! - **Gap** (a live batch past the next expected one) and **long outage** (the publisher
//!   disconnected for `stale_after`, then back): the target is not live; the entries and
//!   the last applied batch (its seq and a fingerprint of its payload) are kept, and a
//!   replay from that last seq is requested. The engine's first replayed batch must be
//!   that very batch: then the missing ones are applied and the target is live again at
//!   the replay's end. Live batches arriving meanwhile are held (up to
//!   [`MAX_HELD`]) and applied after it.
//! - **The engine no longer has those batches** (its first replayed batch is later): the
//!   entries are dropped and rebuilt from that replay, a full replay by construction.
//! - **Another publisher** (the replayed batch differs from the one applied, or the engine
//!   replays nothing from that seq: it restarted), or a live seq going backwards: the
//!   entries are dropped; seq 0 is a fresh start; otherwise a full replay from seq 0 is
//!   requested.
//! - **Replay impossible** (no replay endpoint, a replay that fails, times out after
//!   `repair_timeout` or has a hole, an engine that retains nothing): the entries are
//!   dropped and the target is not live until a consistent point (seq 0 or an
//!   `AllBlocksCleared`); batches meanwhile are applied but not trusted. With a replay
//!   endpoint a full replay is tried again every [`RETRY_FULL_REPLAY`].
//! - **Publisher gone** (disconnected for `stale_after`): not live, entries kept for the
//!   repair above, so strategies fall back to load instead of trusting what it held.
//!
//! [`KvRepair`] is the decision logic alone, synchronous and clock-free, so it is tested
//! without sockets. The plane must not block the transport (it only reads its channel) and
//! logs only transitions, never per batch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::kv::events::{self, EventBatch, KvEvent};
use crate::kv::index::{ApplyOutcome, KvIndex};
use crate::kv::transport::{
    KvCommand, KvFrame, KvTransport, KvTransportStats, StatsHandle, END_SEQ,
};
use crate::kv::view::EngineView;

pub use super::reports::{KvReports, KvTargetReport};

/// Live batches held per target while a replay runs; beyond it they are left out (the
/// gap they leave is repaired by the next replay).
pub const MAX_HELD: usize = 4096;

/// How often a target left without a consistent index asks for a full replay again.
pub const RETRY_FULL_REPLAY: Duration = Duration::from_secs(10);

/// What a replay in progress is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repair {
    /// From the last applied batch `last`, kept with the entries; `verified` once the
    /// engine replayed that same batch.
    Resume { last: u64, verified: bool },
    /// The engine is not the publisher the entries came from: this replay is ignored and
    /// a full one follows at its end.
    Restarted,
    /// Everything the engine retains, from seq 0 on (entries dropped); `started` once its
    /// first batch was applied.
    Full { started: bool },
}

/// What the plane does about one target's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Consistent: batches arrive in order (or none yet).
    InOrder,
    /// The publisher has been away for `stale_after`: entries kept, not trusted.
    Stale,
    /// A replay was requested at `since`.
    Repairing { repair: Repair, since: Instant },
    /// Entries dropped and no replay to rebuild them (since `since`): batches are applied,
    /// not trusted until a consistent point.
    Untrusted { since: Instant },
}

/// What the caller must do after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    /// Ask the transport to replay `target` from `from_seq`.
    Replay {
        from_seq: u64,
    },
}

/// Per-target repair state and the index it feeds.
pub struct KvRepair {
    index: KvIndex,
    view: EngineView,
    streams: Vec<Stream>,
    /// Per target: a replay endpoint is configured.
    can_replay: Vec<bool>,
    /// Per target: the last applied batch (seq, payload fingerprint), kept while the
    /// entries are.
    last: Vec<Option<(u64, u64)>>,
    /// Per target: live batches held while a replay runs.
    held: Vec<VecDeque<(u64, Vec<u8>)>>,
    repair_timeout: Duration,
    batch: EventBatch,
    /// Batches that failed to decode (skipped; a gap follows and is handled as one).
    pub undecodable: u64,
}

fn fingerprint(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

impl KvRepair {
    pub fn new(
        index: KvIndex,
        view: EngineView,
        can_replay: Vec<bool>,
        repair_timeout: Duration,
    ) -> Self {
        let n = can_replay.len();
        KvRepair {
            index,
            view,
            streams: vec![Stream::InOrder; n],
            can_replay,
            last: vec![None; n],
            held: vec![VecDeque::new(); n],
            repair_timeout,
            batch: EventBatch::new(),
            undecodable: 0,
        }
    }

    pub fn index(&self) -> &KvIndex {
        &self.index
    }

    /// The report of the target behind transport counters `s`.
    pub fn report(&self, s: &KvTransportStats) -> KvTargetReport {
        let index = self.index.target_stats(s.target as u32);
        let counters = index.map(|i| i.counters).unwrap_or_default();
        KvTargetReport {
            target: s.target,
            connected: s.connected,
            live: self.view.kv_live(s.target),
            frames: s.frames,
            replayed: s.replayed,
            malformed: s.malformed,
            dropped: s.dropped,
            gaps: s.gaps,
            replays: s.replays,
            replay_failures: s.replay_failures,
            seq_resets: s.seq_resets,
            drops: counters.drops,
            blocks: index.map_or(0, |i| i.engine_blocks as u64),
            evicted: counters.evicted,
        }
    }

    fn next_seq(&self, t: usize) -> Option<u64> {
        self.index.target_stats(t as u32).and_then(|s| s.next_seq)
    }

    /// Applies one frame received at `now`.
    pub fn frame(
        &mut self,
        t: usize,
        seq: u64,
        payload: &[u8],
        replayed: bool,
        now: Instant,
    ) -> Action {
        if t >= self.streams.len() {
            return Action::None;
        }
        if replayed && seq == END_SEQ {
            return self.replay_end(t, now);
        }
        if replayed {
            self.replayed(t, seq, payload, now);
            Action::None
        } else {
            self.live(t, seq, payload, now)
        }
    }

    fn decode(&mut self, payload: &[u8]) -> bool {
        let ok = events::decode_batch(payload, &mut self.batch).is_ok();
        if !ok {
            self.undecodable += 1;
        }
        ok
    }

    /// Applies the decoded batch and remembers it as the last applied one.
    fn apply(&mut self, t: usize, seq: u64, fp: u64, now: Instant) -> Option<ApplyOutcome> {
        let outcome = self.index.apply(t as u32, seq, &self.batch, now).ok()?;
        if !matches!(outcome, ApplyOutcome::Gap { .. }) {
            self.last[t] = Some((seq, fp));
        }
        Some(outcome)
    }

    /// Forgets the target's entries and its last batch.
    fn drop_entries(&mut self, t: usize) {
        self.index.drop_target(t as u32);
        self.last[t] = None;
    }

    fn set_live(&mut self, t: usize) {
        self.streams[t] = Stream::InOrder;
        self.view.set_kv_live(t, true);
    }

    fn start_repair(&mut self, t: usize, repair: Repair, now: Instant) -> Action {
        let from_seq = match repair {
            Repair::Resume { last, .. } => last,
            Repair::Restarted | Repair::Full { .. } => {
                self.drop_entries(t);
                0
            }
        };
        self.streams[t] = Stream::Repairing { repair, since: now };
        self.view.set_kv_live(t, false);
        Action::Replay { from_seq }
    }

    /// No replay can make the index consistent: drop it, trust nothing until a consistent
    /// point, then apply the held batches.
    fn give_up(&mut self, t: usize, now: Instant, why: &str) -> Action {
        tracing::warn!(
            target = t,
            "KV events: {why}; the target's index entries were dropped and it is not trusted until its engine restarts or clears its cache"
        );
        self.drop_entries(t);
        self.streams[t] = Stream::Untrusted { since: now };
        self.view.set_kv_live(t, false);
        self.apply_held(t, now)
    }

    fn hold(&mut self, t: usize, seq: u64, payload: &[u8]) {
        if self.held[t].len() < MAX_HELD {
            self.held[t].push_back((seq, payload.to_vec()));
        }
    }

    /// Applies the live batches held during a replay; the first repair one of them starts
    /// is returned (the rest is held again).
    fn apply_held(&mut self, t: usize, now: Instant) -> Action {
        let held = std::mem::take(&mut self.held[t]);
        let mut action = Action::None;
        for (seq, payload) in held {
            if self.next_seq(t).is_some_and(|n| seq < n) {
                continue; // the replay brought it already
            }
            if let Action::Replay { from_seq } = self.live(t, seq, &payload, now) {
                action = Action::Replay { from_seq };
            }
        }
        action
    }

    /// The publisher is back after `stale_after`: repair from the last applied batch.
    fn reconnected(&mut self, t: usize, now: Instant) -> Action {
        if !self.can_replay[t] {
            return self.give_up(
                t,
                now,
                "publisher back after stale_after without replay_endpoint",
            );
        }
        tracing::info!(
            target = t,
            "KV events reconnected; replaying what was missed"
        );
        match self.last[t] {
            Some((last, _)) => self.start_repair(
                t,
                Repair::Resume {
                    last,
                    verified: false,
                },
                now,
            ),
            None => self.start_repair(t, Repair::Full { started: false }, now),
        }
    }

    fn live(&mut self, t: usize, seq: u64, payload: &[u8], now: Instant) -> Action {
        match self.streams[t] {
            Stream::Repairing { .. } => {
                self.hold(t, seq, payload);
                return Action::None;
            }
            Stream::Stale => {
                // Back before the transport said so: the batch waits for the repair.
                self.hold(t, seq, payload);
                return self.reconnected(t, now);
            }
            Stream::InOrder | Stream::Untrusted { .. } => {}
        }
        if !self.decode(payload) {
            return Action::None;
        }
        let fp = fingerprint(payload);
        if let Stream::Untrusted { .. } = self.streams[t] {
            return self.untrusted(t, seq, fp, now);
        }
        let can_replay = self.can_replay[t];
        match self.next_seq(t) {
            // The first batch seen: seq 0 is a fresh engine; a later one is an engine
            // that ran before the gateway subscribed.
            None if seq != 0 && can_replay => {
                self.hold(t, seq, payload);
                self.start_repair(t, Repair::Full { started: false }, now)
            }
            None => {
                self.apply(t, seq, fp, now);
                self.set_live(t);
                Action::None
            }
            Some(n) if seq == n => {
                self.apply(t, seq, fp, now);
                self.set_live(t);
                Action::None
            }
            Some(n) if seq > n => {
                if can_replay {
                    tracing::info!(
                        target = t,
                        expected = n,
                        got = seq,
                        "KV event gap; replaying"
                    );
                    self.hold(t, seq, payload);
                    let last = n.wrapping_sub(1);
                    self.start_repair(
                        t,
                        Repair::Resume {
                            last,
                            verified: false,
                        },
                        now,
                    )
                } else {
                    let why = format!("gap (expected seq {n}, got {seq}) without replay_endpoint");
                    self.hold(t, seq, payload);
                    self.give_up(t, now, &why)
                }
            }
            Some(_) if seq == 0 => {
                tracing::info!(
                    target = t,
                    "KV events restarted at seq 0; the target's index entries were dropped"
                );
                self.drop_entries(t);
                self.apply(t, seq, fp, now);
                self.set_live(t);
                Action::None
            }
            Some(n) => {
                tracing::info!(
                    target = t,
                    expected = n,
                    got = seq,
                    "KV events restarted; the target's index entries were dropped"
                );
                if can_replay {
                    self.hold(t, seq, payload);
                    self.start_repair(t, Repair::Full { started: false }, now)
                } else {
                    self.hold(t, seq, payload);
                    self.give_up(
                        t,
                        now,
                        "publisher restarted past seq 0 without replay_endpoint",
                    )
                }
            }
        }
    }

    /// A decoded live batch while the index is not consistent: applied; consistent again
    /// at seq 0 or a full `AllBlocksCleared`.
    fn untrusted(&mut self, t: usize, seq: u64, fp: u64, now: Instant) -> Action {
        let cleared = self
            .batch
            .events()
            .any(|e| matches!(e, KvEvent::AllBlocksCleared { medium: None }));
        if seq == 0 {
            self.drop_entries(t);
        }
        if let Some(ApplyOutcome::Gap { .. }) = self.apply(t, seq, fp, now) {
            self.drop_entries(t);
            self.apply(t, seq, fp, now);
        }
        if seq == 0 || cleared {
            tracing::info!(
                target = t,
                seq,
                "KV events consistent again; the target is trusted"
            );
            self.set_live(t);
        }
        Action::None
    }

    fn replayed(&mut self, t: usize, seq: u64, payload: &[u8], now: Instant) {
        let Stream::Repairing { repair, since } = self.streams[t] else {
            return; // a replay that arrives after the stream healed by other means
        };
        if repair == Repair::Restarted || !self.decode(payload) {
            return;
        }
        let fp = fingerprint(payload);
        let repair = match repair {
            Repair::Resume {
                last,
                verified: false,
            } => {
                if seq < last {
                    return;
                }
                if seq == last {
                    if self.last[t] == Some((last, fp)) {
                        Repair::Resume {
                            last,
                            verified: true,
                        }
                    } else {
                        tracing::info!(target = t, seq, "KV events: the engine's batch differs from the one applied (it restarted); rebuilding");
                        self.drop_entries(t);
                        Repair::Restarted
                    }
                } else {
                    tracing::info!(target = t, from = last, first = seq, "KV events: the engine no longer has the missed batches; rebuilding from what it retains");
                    self.drop_entries(t);
                    self.apply(t, seq, fp, now);
                    Repair::Full { started: true }
                }
            }
            Repair::Full { started: false } => {
                self.apply(t, seq, fp, now);
                Repair::Full { started: true }
            }
            Repair::Resume { verified: true, .. } | Repair::Full { started: true } => {
                if self.next_seq(t).is_some_and(|n| seq < n) {
                    return; // already applied
                }
                if let Some(ApplyOutcome::Gap { .. }) = self.apply(t, seq, fp, now) {
                    // A hole in the replay itself (frames dropped on the way).
                    let _ = self.give_up(t, now, "the replay has a hole");
                    return;
                }
                repair
            }
            Repair::Restarted => return,
        };
        self.streams[t] = Stream::Repairing { repair, since };
    }

    /// The engine finished answering a replay of `t`.
    fn replay_end(&mut self, t: usize, now: Instant) -> Action {
        let Stream::Repairing { repair, .. } = self.streams[t] else {
            return Action::None;
        };
        match repair {
            Repair::Resume { verified: true, .. } | Repair::Full { started: true } => {
                tracing::info!(
                    target = t,
                    "KV events repaired from the replay; the target is trusted"
                );
                self.set_live(t);
                self.apply_held(t, now)
            }
            Repair::Resume {
                verified: false, ..
            } => {
                tracing::info!(target = t, "KV events: the engine replayed nothing from the last applied batch (it restarted); rebuilding");
                self.start_repair(t, Repair::Full { started: false }, now)
            }
            Repair::Restarted => self.start_repair(t, Repair::Full { started: false }, now),
            Repair::Full { started: false } => {
                self.give_up(t, now, "the engine retains no batch to rebuild from")
            }
        }
    }

    /// The transport says target `t`'s publisher is connected or not; `down_for` is how long
    /// it has been down. Also expires replays that take longer than `repair_timeout` and
    /// retries full replays every [`RETRY_FULL_REPLAY`].
    pub fn connection(
        &mut self,
        t: usize,
        connected: bool,
        down_for: Duration,
        stale_after: Duration,
        now: Instant,
    ) -> Action {
        if t >= self.streams.len() {
            return Action::None;
        }
        match self.streams[t] {
            Stream::Repairing { since, .. }
                if now.saturating_duration_since(since) >= self.repair_timeout =>
            {
                return self.give_up(t, now, "the replay did not finish within repair_timeout");
            }
            Stream::Untrusted { since }
                if connected
                    && self.can_replay[t]
                    && now.saturating_duration_since(since) >= RETRY_FULL_REPLAY =>
            {
                return self.start_repair(t, Repair::Full { started: false }, now);
            }
            _ => {}
        }
        if connected {
            match self.streams[t] {
                Stream::Stale => return self.reconnected(t, now),
                Stream::InOrder if !self.view.kv_live(t) => {
                    tracing::info!(target = t, "KV events connected");
                    self.view.set_kv_live(t, true);
                }
                _ => {}
            }
        } else if down_for >= stale_after
            && self.streams[t] == Stream::InOrder
            && (self.view.kv_live(t) || self.last[t].is_some())
        {
            tracing::warn!(target = t, "KV event publisher gone; routing ignores the target's index entries (kept for the repair) and falls back to load");
            self.streams[t] = Stream::Stale;
            self.view.set_kv_live(t, false);
        }
        Action::None
    }
}

/// The running plane: the transport and the index thread.
pub struct KvPlane {
    reports: KvReports,
    transport: Option<KvTransport>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

/// Settings of the plane.
#[derive(Debug, Clone, Copy)]
pub struct KvPlaneOptions {
    pub stale_after: Duration,
    pub repair_timeout: Duration,
}

impl KvPlane {
    /// Starts the index thread over `transport`'s frames. `targets[i]` is the target id of
    /// the transport's i-th subscription.
    pub fn start(
        transport: KvTransport,
        frames: Receiver<KvFrame>,
        repair: KvRepair,
        opts: KvPlaneOptions,
    ) -> std::io::Result<KvPlane> {
        let stop = Arc::new(AtomicBool::new(false));
        let commands = transport.commands();
        let stats_source = transport.stats_handle();
        let flag = stop.clone();
        let reports = KvReports::default();
        let sink = reports.clone();
        let thread = std::thread::Builder::new()
            .name("rolter-kv-index".into())
            .spawn(move || run(repair, frames, commands, stats_source, sink, flag, opts))?;
        Ok(KvPlane {
            reports,
            transport: Some(transport),
            thread: Some(thread),
            stop,
        })
    }

    /// The handle `/metrics` reads the per-target reports from.
    pub fn reports(&self) -> KvReports {
        self.reports.clone()
    }

    /// The transport's counters, per subscription.
    pub fn stats(&self) -> Vec<KvTransportStats> {
        self.transport
            .as_ref()
            .map(|t| t.stats())
            .unwrap_or_default()
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.transport.take() {
            t.stop();
        }
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

impl Drop for KvPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(
    mut repair: KvRepair,
    frames: Receiver<KvFrame>,
    commands: crossbeam_channel::Sender<KvCommand>,
    stats: StatsHandle,
    reports: KvReports,
    stop: Arc<AtomicBool>,
    opts: KvPlaneOptions,
) {
    let mut down_since: Vec<Option<Instant>> = Vec::new();
    let mut next_check = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match frames.recv_timeout(Duration::from_millis(50)) {
            Ok(f) => {
                if let Action::Replay { from_seq } =
                    repair.frame(f.target, f.seq, &f.payload, f.replayed, f.received)
                {
                    let _ = commands.send(KvCommand::Replay {
                        target: f.target,
                        from_seq,
                    });
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_millis(100);
            let snapshot = stats.snapshot();
            reports.publish(snapshot.iter().map(|s| repair.report(s)).collect());
            for s in snapshot {
                if down_since.len() <= s.target {
                    down_since.resize(s.target + 1, None);
                }
                let since = &mut down_since[s.target];
                if s.connected {
                    *since = None;
                } else if since.is_none() {
                    *since = Some(now);
                }
                let down_for = since.map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
                if let Action::Replay { from_seq } =
                    repair.connection(s.target, s.connected, down_for, opts.stale_after, now)
                {
                    let _ = commands.send(KvCommand::Replay {
                        target: s.target,
                        from_seq,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::index::{KeySpace, KvIndexConfig};

    /// A vLLM EventBatch with one BlockStored of `blocks` blocks (16 tokens each, tokens
    /// `base..`), engine hashes `hash..`, chained to `parent`.
    fn stored(hash: u64, parent: Option<u64>, base: u32, blocks: u32) -> Vec<u8> {
        use rmp::encode::*;
        let mut b = Vec::new();
        write_array_len(&mut b, 3).unwrap();
        write_f64(&mut b, 1.0).unwrap();
        write_array_len(&mut b, 1).unwrap();
        write_array_len(&mut b, 8).unwrap();
        write_str(&mut b, "BlockStored").unwrap();
        write_array_len(&mut b, blocks).unwrap();
        for i in 0..u64::from(blocks) {
            write_uint(&mut b, hash + i).unwrap();
        }
        match parent {
            Some(p) => drop(write_uint(&mut b, p).unwrap()),
            None => write_nil(&mut b).unwrap(),
        }
        write_array_len(&mut b, blocks * 16).unwrap();
        for t in 0..blocks * 16 {
            write_uint(&mut b, u64::from(base + t)).unwrap();
        }
        write_uint(&mut b, 16).unwrap();
        write_nil(&mut b).unwrap();
        write_str(&mut b, "GPU").unwrap();
        write_nil(&mut b).unwrap();
        write_uint(&mut b, 0).unwrap();
        b
    }

    fn repair(can_replay: bool) -> KvRepair {
        let index = KvIndex::new(KvIndexConfig::default()).unwrap();
        let view = EngineView::with_kv(index.reader(), 2);
        KvRepair::new(index, view, vec![can_replay; 2], Duration::from_secs(2))
    }

    /// Leading blocks of tokens `0..16*n` that target `t` holds.
    fn held(r: &KvRepair, t: u32, n: u32) -> u32 {
        let reader = r.index().reader();
        let tokens: Vec<u32> = (0..16 * n).collect();
        let mut keys = Vec::new();
        reader.request_keys(KeySpace::default(), &tokens, &mut keys);
        let mut scores = [0u32];
        reader.longest_prefix(&keys, &[t], &mut scores);
        scores[0]
    }

    /// A batch with one `AllBlocksCleared` (every medium).
    fn cleared() -> Vec<u8> {
        use rmp::encode::*;
        let mut b = Vec::new();
        write_array_len(&mut b, 3).unwrap();
        write_f64(&mut b, 2.0).unwrap();
        write_array_len(&mut b, 1).unwrap();
        write_array_len(&mut b, 1).unwrap();
        write_str(&mut b, "AllBlocksCleared").unwrap();
        write_uint(&mut b, 0).unwrap();
        b
    }

    /// The replay's end marker.
    fn end(r: &mut KvRepair, t: usize, now: Instant) -> Action {
        r.frame(t, END_SEQ, &[], true, now)
    }

    const STALE: Duration = Duration::from_secs(10);

    #[test]
    fn in_order_batches_are_applied_and_the_target_is_live() {
        let mut r = repair(false);
        let now = Instant::now();
        assert_eq!(
            r.frame(0, 0, &stored(100, None, 0, 2), false, now),
            Action::None
        );
        assert_eq!(
            r.frame(0, 1, &stored(102, Some(101), 32, 2), false, now),
            Action::None
        );
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 4), 4);
        assert_eq!(held(&r, 1, 4), 0);
    }

    #[test]
    fn a_gap_is_repaired_by_a_replay_from_the_last_applied_batch() {
        let mut r = repair(true);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, now);
        // Seq 1 was lost; seq 2 arrives.
        let a = r.frame(0, 2, &stored(102, Some(101), 32, 1), false, now);
        assert_eq!(a, Action::Replay { from_seq: 0 });
        assert!(!r.view.kv_live(0), "not trusted while the hole is open");
        // A live batch during the replay waits for it.
        r.frame(0, 3, &stored(103, Some(102), 48, 1), false, now);
        // The replay brings 0 (the batch applied last, the same), 1 and 2.
        r.frame(0, 0, &stored(100, None, 0, 1), true, now);
        r.frame(0, 1, &stored(101, Some(100), 16, 1), true, now);
        r.frame(0, 2, &stored(102, Some(101), 32, 1), true, now);
        assert!(!r.view.kv_live(0));
        assert_eq!(end(&mut r, 0, now), Action::None);
        assert!(r.view.kv_live(0));
        assert_eq!(
            held(&r, 0, 4),
            4,
            "the held batch is applied after the replay"
        );
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(4));
        r.frame(0, 4, &stored(104, Some(103), 64, 1), false, now);
        assert_eq!(held(&r, 0, 5), 5);
    }

    #[test]
    fn a_gap_without_replay_is_not_trusted_until_a_consistent_point() {
        let mut r = repair(false);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 2), false, now);
        assert_eq!(held(&r, 0, 2), 2);
        let a = r.frame(0, 5, &stored(500, None, 0, 1), false, now);
        assert_eq!(a, Action::None);
        assert!(!r.view.kv_live(0));
        // Entries from before the gap are gone; later batches are applied, not trusted.
        assert_eq!(r.index().target_stats(0).unwrap().engine_blocks, 1);
        r.frame(0, 6, &stored(501, Some(500), 16, 1), false, now);
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(7));
        assert!(!r.view.kv_live(0));
        // A reconnect without replay changes nothing.
        r.connection(0, true, Duration::ZERO, STALE, now);
        assert!(!r.view.kv_live(0));
        // The engine clears its cache: consistent again.
        r.frame(0, 7, &cleared(), false, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 2), 0);
        r.frame(0, 8, &stored(100, None, 0, 2), false, now);
        assert_eq!(held(&r, 0, 2), 2);

        // A fresh start (seq 0) is a consistent point too.
        let mut r = repair(false);
        r.frame(1, 0, &stored(100, None, 0, 1), false, now);
        r.frame(1, 3, &stored(103, None, 0, 1), false, now);
        assert!(!r.view.kv_live(1));
        r.frame(1, 0, &stored(200, None, 0, 1), false, now);
        assert!(r.view.kv_live(1));
        assert_eq!(r.index().target_stats(1).unwrap().engine_blocks, 1);
    }

    #[test]
    fn a_replay_that_never_ends_gives_up_after_the_timeout_and_retries_later() {
        let mut r = repair(true);
        let t0 = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, t0);
        let a = r.frame(0, 2, &stored(102, Some(101), 32, 1), false, t0);
        assert_eq!(a, Action::Replay { from_seq: 0 });
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            r.connection(0, true, Duration::ZERO, STALE, at(500)),
            Action::None
        );
        assert!(!r.view.kv_live(0));
        assert_eq!(held(&r, 0, 1), 1, "kept while the replay may come");
        // After repair_timeout (2 s): entries dropped; the held batch applied, not trusted.
        assert_eq!(
            r.connection(0, true, Duration::ZERO, STALE, at(2_100)),
            Action::None
        );
        assert!(!r.view.kv_live(0));
        assert_eq!(held(&r, 0, 1), 0);
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(3));
        // A late end changes nothing; a full replay is tried again later.
        assert_eq!(end(&mut r, 0, at(2_200)), Action::None);
        assert!(!r.view.kv_live(0));
        let retry = at(2_100) + RETRY_FULL_REPLAY;
        assert_eq!(
            r.connection(0, true, Duration::ZERO, STALE, retry),
            Action::Replay { from_seq: 0 }
        );
        for (seq, batch) in [
            (0, stored(100, None, 0, 1)),
            (1, stored(101, Some(100), 16, 1)),
            (2, stored(102, Some(101), 32, 1)),
        ] {
            r.frame(0, seq, &batch, true, retry);
        }
        end(&mut r, 0, retry);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 3), 3);
    }

    #[test]
    fn a_long_outage_keeps_the_entries_and_replays_what_was_missed_on_reconnect() {
        let mut r = repair(true);
        let now = Instant::now();
        r.frame(1, 0, &stored(100, None, 0, 1), false, now);
        r.frame(1, 1, &stored(101, Some(100), 16, 1), false, now);
        r.connection(1, false, Duration::from_secs(3), STALE, now);
        assert!(r.view.kv_live(1), "a short disconnect is tolerated");
        r.connection(1, false, Duration::from_secs(11), STALE, now);
        assert!(
            !r.view.kv_live(1),
            "not trusted while the publisher is away"
        );
        assert_eq!(held(&r, 1, 2), 2, "entries kept for the repair");
        // Back: a replay from the last applied batch, seq 1.
        assert_eq!(
            r.connection(1, true, Duration::ZERO, STALE, now),
            Action::Replay { from_seq: 1 }
        );
        assert!(!r.view.kv_live(1));
        // The engine stored a block during the outage (seq 2).
        r.frame(1, 1, &stored(101, Some(100), 16, 1), true, now);
        r.frame(1, 2, &stored(102, Some(101), 32, 1), true, now);
        end(&mut r, 1, now);
        assert!(r.view.kv_live(1));
        assert_eq!(
            held(&r, 1, 3),
            3,
            "blocks from before and during the outage"
        );
        r.frame(1, 3, &stored(103, Some(102), 48, 1), false, now);
        assert_eq!(held(&r, 1, 4), 4);
    }

    #[test]
    fn a_long_outage_without_replay_is_trusted_again_only_after_a_restart() {
        let mut r = repair(false);
        let now = Instant::now();
        r.frame(1, 0, &stored(100, None, 0, 2), false, now);
        r.connection(1, false, Duration::from_secs(11), STALE, now);
        assert!(!r.view.kv_live(1));
        assert_eq!(
            r.connection(1, true, Duration::ZERO, STALE, now),
            Action::None
        );
        assert!(!r.view.kv_live(1), "what was missed cannot be known");
        assert_eq!(held(&r, 1, 2), 0);
        r.frame(1, 5, &stored(105, None, 0, 1), false, now);
        assert!(!r.view.kv_live(1));
        // The engine restarts: seq 0, a fresh cache.
        r.frame(1, 0, &stored(100, None, 0, 1), false, now);
        assert!(r.view.kv_live(1));
        assert_eq!(held(&r, 1, 1), 1);
    }

    #[test]
    fn an_engine_without_the_missed_batches_is_rebuilt_from_what_it_retains() {
        let mut r = repair(true);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, now);
        r.frame(0, 1, &stored(900, None, 5000, 1), false, now);
        let a = r.frame(0, 9, &stored(109, Some(108), 128, 1), false, now);
        assert_eq!(a, Action::Replay { from_seq: 1 });
        // Its buffer starts at seq 7: the entries are dropped and rebuilt from there.
        r.frame(0, 7, &stored(200, None, 0, 2), true, now);
        r.frame(0, 8, &stored(202, Some(201), 32, 1), true, now);
        r.frame(0, 9, &stored(109, Some(108), 128, 1), true, now);
        end(&mut r, 0, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 3), 3);
        let tokens: Vec<u32> = (5000..5016).collect();
        let reader = r.index().reader();
        let mut keys = Vec::new();
        reader.request_keys(KeySpace::default(), &tokens, &mut keys);
        let mut scores = [0u32];
        reader.longest_prefix(&keys, &[0], &mut scores);
        assert_eq!(scores[0], 0, "the block from before the rebuild is gone");
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(10));
    }

    #[test]
    fn a_restarted_engine_is_told_apart_by_its_batch_and_replayed_in_full() {
        let mut r = repair(true);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, now);
        r.frame(0, 1, &stored(101, Some(100), 16, 1), false, now);
        r.connection(0, false, STALE, STALE, now);
        assert_eq!(
            r.connection(0, true, Duration::ZERO, STALE, now),
            Action::Replay { from_seq: 1 }
        );
        // The restarted engine's seq 1 is another batch.
        r.frame(0, 1, &stored(301, Some(300), 3000, 1), true, now);
        r.frame(0, 2, &stored(302, Some(301), 3016, 1), true, now);
        assert_eq!(end(&mut r, 0, now), Action::Replay { from_seq: 0 });
        assert_eq!(held(&r, 0, 2), 0, "the old engine's entries are gone");
        r.frame(0, 0, &stored(300, None, 0, 1), true, now);
        r.frame(0, 1, &stored(301, Some(300), 16, 1), true, now);
        assert!(!r.view.kv_live(0));
        end(&mut r, 0, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 2), 2);
        // Replaying nothing from the last applied batch is a restart too.
        r.connection(0, false, STALE, STALE, now);
        assert_eq!(
            r.connection(0, true, Duration::ZERO, STALE, now),
            Action::Replay { from_seq: 1 }
        );
        assert_eq!(end(&mut r, 0, now), Action::Replay { from_seq: 0 });
        // ... and an engine that retains nothing is not trusted until a consistent point.
        assert_eq!(end(&mut r, 0, now), Action::None);
        assert!(!r.view.kv_live(0));
        r.frame(0, 0, &stored(400, None, 0, 1), false, now);
        assert!(r.view.kv_live(0));
    }

    #[test]
    fn a_first_batch_past_zero_is_completed_by_a_full_replay() {
        let mut r = repair(true);
        let now = Instant::now();
        let a = r.frame(0, 4, &stored(104, Some(103), 64, 1), false, now);
        assert_eq!(a, Action::Replay { from_seq: 0 });
        for (seq, batch) in [
            (3, stored(100, None, 0, 4)),
            (4, stored(104, Some(103), 64, 1)),
        ] {
            r.frame(0, seq, &batch, true, now);
        }
        end(&mut r, 0, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 5), 5);
        // Without a replay endpoint the first batch is accepted as it is.
        let mut r = repair(false);
        r.frame(0, 4, &stored(100, None, 0, 1), false, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 1), 1);
    }

    #[test]
    fn undecodable_payloads_are_counted_and_skipped() {
        let mut r = repair(false);
        assert_eq!(
            r.frame(0, 0, b"\xc1garbage", false, Instant::now()),
            Action::None
        );
        assert_eq!(r.undecodable, 1);
        assert!(r.index().target_stats(0).is_none());
    }
}
