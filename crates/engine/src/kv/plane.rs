//! The KV-event plane: turns the transport's frames into the shared block index and keeps
//! every target's "live" flag honest.
//!
//! One thread, `rolter-kv-index`, owns the [`KvIndex`] (the only writer) and consumes the
//! [`KvTransport`]'s frame channel. Per frame: decode the batch, apply it in sequence order.
//! - **Gap** (a batch missing): with a replay endpoint, the target is marked not live and a
//!   replay from the first missing batch is requested; replayed batches fill the hole and
//!   the target is live again once its next batch arrives in order. Without one (or when
//!   the replay does not close the hole within `repair_timeout`) the target's entries are
//!   dropped and the index starts over from the batch at hand.
//! - **Reconnect** (the publisher restarted, its sequence back at 0): the index drops the
//!   target's entries and starts over ([`ApplyOutcome::Reset`]).
//! - **Publisher gone** (the transport has been disconnected for `stale_after`): the
//!   target's entries are dropped and it is not live, so strategies fall back to load
//!   instead of trusting what it held.
//!
//! [`KvRepair`] is the decision logic alone, synchronous and clock-free, so it is tested
//! without sockets. The plane must not block the transport (it only reads its channel) and
//! logs only transitions, never per batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::kv::events::{self, EventBatch};
use crate::kv::index::{ApplyOutcome, KvIndex};
use crate::kv::transport::{KvCommand, KvFrame, KvTransport, KvTransportStats, StatsHandle};
use crate::kv::view::EngineView;

pub use super::reports::{KvReports, KvTargetReport};

/// What the plane does about one target's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Batches arrive in order (or none yet).
    InOrder,
    /// A replay from `expected` was requested at `since`.
    Repairing { expected: u64, since: Instant },
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
    repair_timeout: Duration,
    batch: EventBatch,
    /// Batches that failed to decode (skipped; a gap follows and is handled as one).
    pub undecodable: u64,
}

impl KvRepair {
    pub fn new(
        index: KvIndex,
        view: EngineView,
        can_replay: Vec<bool>,
        repair_timeout: Duration,
    ) -> Self {
        KvRepair {
            index,
            view,
            streams: vec![Stream::InOrder; can_replay.len()],
            can_replay,
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
        if events::decode_batch(payload, &mut self.batch).is_err() {
            self.undecodable += 1;
            return Action::None;
        }
        let next = self.next_seq(t);
        if let Stream::Repairing { expected, since } = self.streams[t] {
            if replayed {
                // Fill the hole in order; anything already applied is a duplicate.
                if next.is_some_and(|n| seq < n) {
                    return Action::None;
                }
            } else if next == Some(seq) {
                // The hole is closed and the live stream continues in order.
                self.streams[t] = Stream::InOrder;
                self.view.set_kv_live(t, true);
            } else if now.saturating_duration_since(since) < self.repair_timeout && seq > expected {
                // Still waiting for the replay: the live batch will come back with it.
                return Action::None;
            } else {
                // The replay did not close the hole in time: start over from here.
                self.index.drop_target(t as u32);
                self.streams[t] = Stream::InOrder;
                self.view.set_kv_live(t, true);
            }
        } else if replayed {
            // A replay that arrives after the stream healed by other means.
            return Action::None;
        }
        match self.index.apply(t as u32, seq, &self.batch, now) {
            Ok(ApplyOutcome::Applied) => {
                if matches!(self.streams[t], Stream::Repairing { .. }) {
                    return Action::None;
                }
                self.view.set_kv_live(t, true);
                Action::None
            }
            Ok(ApplyOutcome::Reset) => {
                tracing::info!(
                    target = t,
                    seq,
                    "KV events restarted; the target's index entries were dropped"
                );
                self.streams[t] = Stream::InOrder;
                self.view.set_kv_live(t, true);
                Action::None
            }
            Ok(ApplyOutcome::Gap { expected, got }) => {
                if self.can_replay[t] && !replayed {
                    tracing::info!(target = t, expected, got, "KV event gap; replaying");
                    self.streams[t] = Stream::Repairing {
                        expected,
                        since: now,
                    };
                    self.view.set_kv_live(t, false);
                    Action::Replay { from_seq: expected }
                } else {
                    tracing::info!(
                        target = t,
                        expected,
                        got,
                        "KV event gap; the target's index entries were dropped"
                    );
                    self.index.drop_target(t as u32);
                    let _ = self.index.apply(t as u32, seq, &self.batch, now);
                    self.streams[t] = Stream::InOrder;
                    self.view.set_kv_live(t, true);
                    Action::None
                }
            }
            Err(_) => Action::None,
        }
    }

    /// The transport says target `t`'s publisher is connected or not; `down_for` is how long
    /// it has been down.
    pub fn connection(
        &mut self,
        t: usize,
        connected: bool,
        down_for: Duration,
        stale_after: Duration,
    ) {
        if t >= self.streams.len() {
            return;
        }
        if connected {
            if matches!(self.streams[t], Stream::InOrder) && !self.view.kv_live(t) {
                tracing::info!(target = t, "KV events connected");
                self.view.set_kv_live(t, true);
            }
        } else if down_for >= stale_after && self.view.kv_live(t) {
            tracing::warn!(target = t, "KV event publisher gone; the target's index entries were dropped and routing falls back to load");
            self.index.drop_target(t as u32);
            self.streams[t] = Stream::InOrder;
            self.view.set_kv_live(t, false);
        }
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
                repair.connection(s.target, s.connected, down_for, opts.stale_after);
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
    fn a_gap_is_repaired_by_replay() {
        let mut r = repair(true);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, now);
        // Seq 1 was lost; seq 2 arrives.
        let a = r.frame(0, 2, &stored(102, Some(101), 32, 1), false, now);
        assert_eq!(a, Action::Replay { from_seq: 1 });
        assert!(!r.view.kv_live(0), "not trusted while the hole is open");
        // The replay brings 1 and 2 (and a duplicate 0); then the live stream continues.
        r.frame(0, 0, &stored(100, None, 0, 1), true, now);
        r.frame(0, 1, &stored(101, Some(100), 16, 1), true, now);
        r.frame(0, 2, &stored(102, Some(101), 32, 1), true, now);
        assert_eq!(held(&r, 0, 3), 3);
        r.frame(0, 3, &stored(103, Some(102), 48, 1), false, now);
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 4), 4);
    }

    #[test]
    fn a_gap_without_replay_drops_the_target_and_starts_over() {
        let mut r = repair(false);
        let now = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 2), false, now);
        assert_eq!(held(&r, 0, 2), 2);
        let a = r.frame(0, 5, &stored(500, None, 1000, 1), false, now);
        assert_eq!(a, Action::None);
        assert_eq!(held(&r, 0, 2), 0, "entries from before the gap are gone");
        assert!(r.view.kv_live(0));
        r.frame(0, 6, &stored(501, Some(500), 1016, 1), false, now);
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(7));
    }

    #[test]
    fn a_replay_that_never_comes_gives_up_after_the_timeout() {
        let mut r = repair(true);
        let t0 = Instant::now();
        r.frame(0, 0, &stored(100, None, 0, 1), false, t0);
        r.frame(0, 2, &stored(102, Some(101), 32, 1), false, t0);
        // Live frames within the timeout wait for the replay.
        r.frame(
            0,
            3,
            &stored(103, Some(102), 48, 1),
            false,
            t0 + Duration::from_millis(500),
        );
        assert!(!r.view.kv_live(0));
        // After it, the index starts over from the live stream.
        r.frame(
            0,
            4,
            &stored(700, None, 5000, 1),
            false,
            t0 + Duration::from_secs(3),
        );
        assert!(r.view.kv_live(0));
        assert_eq!(held(&r, 0, 1), 0);
        assert_eq!(r.index().target_stats(0).unwrap().next_seq, Some(5));
    }

    #[test]
    fn a_publisher_gone_for_stale_after_loses_its_entries() {
        let mut r = repair(false);
        let now = Instant::now();
        r.frame(1, 0, &stored(100, None, 0, 2), false, now);
        let stale = Duration::from_secs(10);
        r.connection(1, false, Duration::from_secs(3), stale);
        assert!(r.view.kv_live(1), "a short disconnect is tolerated");
        assert_eq!(held(&r, 1, 2), 2);
        r.connection(1, false, Duration::from_secs(11), stale);
        assert!(!r.view.kv_live(1));
        assert_eq!(held(&r, 1, 2), 0);
        // Back: live again; the publisher restarts its sequence.
        r.connection(1, true, Duration::ZERO, stale);
        assert!(r.view.kv_live(1));
        r.frame(1, 0, &stored(100, None, 0, 1), false, now);
        assert_eq!(held(&r, 1, 1), 1);
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
