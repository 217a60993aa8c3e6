//! The transport of engines' KV-cache events: ZMQ subscriptions, replay, liveness.
//!
//! vLLM (and SGLang) publish KV-cache events on a ZMQ **PUB** socket, one 3-frame
//! multipart message per batch: `[topic][seq: u64 big-endian][msgpack payload]`, and
//! serve missed batches from a **ROUTER** socket (the replay endpoint). This module owns
//! one OS thread, `rolter-kv-events`, which holds a SUB socket per configured target,
//! polls them, and hands every well-formed message to a bounded crossbeam channel as a
//! [`KvFrame`]. On request ([`KvCommand::Replay`]) it asks a target's replay endpoint for
//! the batches from a given seq on and delivers them as frames flagged `replayed`,
//! followed by one replayed frame with seq [`END_SEQ`] and an empty payload when the
//! engine's answer is complete.
//!
//! What it owns: the sockets, the thread, the per-target counters ([`KvTransportStats`]:
//! frames, malformed messages, channel drops, seq gaps, last seq and last message time,
//! connection state) and the replay exchanges.
//!
//! What it must not do: decode payloads (the msgpack decoder and the block index live
//! beside it and consume the channel), block on the channel (a full channel counts a drop
//! and moves on, so a slow consumer never stalls the subscriber or libzmq's queues), log
//! per message (only connects and disconnects are logged, at debug level), or touch the
//! workers' hot path.
//!
//! **Why the `zmq` crate (bindings to libzmq).** The engines speak through libzmq
//! (pyzmq bundles it), so the reference implementation on our side gives the same
//! reconnect, resubscribe, heartbeat and high-water-mark behaviour. `zmq` 0.10 always
//! builds the vendored libzmq 4.3.4 from source with the `cc` crate: a C++ compiler is
//! needed (Debian's build-essential has one), but no cmake, no pkg-config and no system
//! `libzmq` package. The cost is build time: building the libzmq sources takes about
//! 2 minutes of CPU in debug and in release (3 to 5 minutes of wall time on a busy
//! 2-core machine), once per target directory; incremental builds never redo it. The pure-Rust `zeromq` crate builds faster (about 1 minute of CPU, with
//! tokio) but needs an async runtime on this thread, and its SUB sockets only learned to
//! reconnect to a restarted publisher in 2026; engines restart often, so robustness
//! wins.
//!
//! **Replay uses a DEALER socket**, not REQ: the replay server answers one request with
//! many messages (one per buffered batch, then the end marker), and a libzmq REQ socket
//! accepts a single reply per request. The DEALER sends `[b"", start_seq_be8]`, which the
//! ROUTER sees exactly as a REQ request, and reads `[b"", seq_be8, payload]` replies
//! until `seq == 0xffff_ffff_ffff_ffff` with an empty payload. Replies that also carry
//! the topic (`[b"", topic, seq, payload]`, newer vLLM) are accepted too.
//!
//! Configuration, per target as `[targets.kv_events]` (see [`KvEventsEndpoint`]):
//!
//! ```toml
//! [[targets]]
//! url = "http://10.0.0.5:8000"
//! [targets.kv_events]
//! endpoint = "tcp://10.0.0.5:5557"          # the engine's PUB socket (we connect)
//! replay_endpoint = "tcp://10.0.0.5:5558"   # optional: the engine's replay ROUTER
//! topic = ""                                # optional: subscription prefix (llm-d: "kv@")
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use serde::Deserialize;

/// The seq of the replay end marker (−1 as a signed 64-bit integer).
pub const END_SEQ: u64 = u64::MAX;

/// How long one poll waits; bounds the reaction time to commands and to the stop flag.
const POLL_MS: i64 = 20;

/// Messages read from one socket per poll round before the next socket gets its turn.
const BURST: usize = 1024;

/// One target's KV-event endpoints (`[targets.kv_events]`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsEndpoint {
    /// The engine's PUB endpoint, which the gateway connects to, e.g. `tcp://10.0.0.5:5557`
    /// (vLLM's `--kv-events-config` `endpoint`, with the engine's address for `*`).
    pub endpoint: String,
    /// The engine's replay ROUTER endpoint (vLLM's `replay_endpoint`); no replay without it.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Subscription prefix: only messages whose topic starts with it are received.
    /// Empty (the default) receives every topic.
    #[serde(default)]
    pub topic: String,
}

/// One message as received: the three frames, and where and when they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvFrame {
    /// The target's index (as given to [`KvTransport::start`]).
    pub target: usize,
    /// Frame 1, the topic (empty for replayed frames without one).
    pub topic: Vec<u8>,
    /// Frame 2, the publisher's sequence number.
    pub seq: u64,
    /// Frame 3, the msgpack-encoded event batch, undecoded.
    pub payload: Vec<u8>,
    /// When the transport thread read it.
    pub received: Instant,
    /// True for frames returned by a replay request, false for live ones.
    pub replayed: bool,
}

/// Requests to the transport thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCommand {
    /// Ask the target's replay endpoint for the batches from `from_seq` on; they arrive
    /// as frames with `replayed: true`, then the end marker (seq [`END_SEQ`], empty
    /// payload). Ignored while a replay of that target is running.
    Replay { target: usize, from_seq: u64 },
    /// End the thread (as [`KvTransport::stop`] does).
    Stop,
}

/// Transport settings that are not per target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvTransportOptions {
    /// Capacity of the frame channel; frames beyond it are dropped and counted.
    pub channel_capacity: usize,
    /// How long one replay may take before it is abandoned (and counted as failed).
    pub replay_timeout: Duration,
    /// libzmq's receive high-water mark per SUB socket, in messages.
    pub rcvhwm: i32,
    /// ZMTP heartbeat interval: a silent dead peer is noticed (and reconnected) after
    /// three intervals. Zero turns heartbeats off.
    pub heartbeat: Duration,
}

impl Default for KvTransportOptions {
    fn default() -> Self {
        KvTransportOptions {
            channel_capacity: 65_536,
            replay_timeout: Duration::from_secs(2),
            rcvhwm: 100_000,
            heartbeat: Duration::from_secs(1),
        }
    }
}

/// Errors of starting the transport or of a replay.
#[derive(Debug, thiserror::Error)]
pub enum KvTransportError {
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    #[error("endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        source: zmq::Error,
    },
    #[error("replay from {endpoint} timed out after {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    #[error("replay from {endpoint}: malformed reply ({frames} frames)")]
    Malformed { endpoint: String, frames: usize },
    #[error("cannot start the kv-events thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// A point-in-time copy of one target's transport counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvTransportStats {
    pub target: usize,
    /// The SUB socket has a completed ZMTP handshake with the publisher.
    pub connected: bool,
    /// Handshakes completed (first connection and reconnections).
    pub connects: u64,
    /// Disconnections seen.
    pub disconnects: u64,
    /// Live frames delivered to the channel.
    pub frames: u64,
    /// Replayed frames delivered to the channel.
    pub replayed: u64,
    /// Messages skipped for their shape (not 3 frames, or a seq not 8 bytes long).
    pub malformed: u64,
    /// Frames dropped because the channel was full.
    pub dropped: u64,
    /// Live frames whose seq skipped ahead of `last_seq + 1`.
    pub gaps: u64,
    /// Seqs skipped over by those gaps, in total.
    pub missed: u64,
    /// Live frames whose seq was not above the last one (the publisher restarted).
    pub seq_resets: u64,
    /// Replays started.
    pub replays: u64,
    /// Replays that failed: no replay endpoint, timeout, or a malformed reply.
    pub replay_failures: u64,
    /// Seq of the last live frame.
    pub last_seq: Option<u64>,
    /// Arrival of the last live frame.
    pub last_message: Option<Instant>,
}

/// Counters of one target, written by the transport thread, read by snapshots.
#[derive(Default)]
struct Counters {
    connected: AtomicBool,
    connects: AtomicU64,
    disconnects: AtomicU64,
    frames: AtomicU64,
    replayed: AtomicU64,
    malformed: AtomicU64,
    dropped: AtomicU64,
    gaps: AtomicU64,
    missed: AtomicU64,
    seq_resets: AtomicU64,
    replays: AtomicU64,
    replay_failures: AtomicU64,
    /// Last live seq + 1; 0 = none yet.
    last_seq_plus1: AtomicU64,
    /// Nanoseconds from the transport's base instant to the last live frame, + 1; 0 = none.
    last_message_ns: AtomicU64,
}

impl Counters {
    fn snapshot(&self, target: usize, base: Instant) -> KvTransportStats {
        let seq = self.last_seq_plus1.load(Relaxed);
        let ns = self.last_message_ns.load(Relaxed);
        KvTransportStats {
            target,
            connected: self.connected.load(Relaxed),
            connects: self.connects.load(Relaxed),
            disconnects: self.disconnects.load(Relaxed),
            frames: self.frames.load(Relaxed),
            replayed: self.replayed.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            gaps: self.gaps.load(Relaxed),
            missed: self.missed.load(Relaxed),
            seq_resets: self.seq_resets.load(Relaxed),
            replays: self.replays.load(Relaxed),
            replay_failures: self.replay_failures.load(Relaxed),
            last_seq: (seq != 0).then(|| seq - 1),
            last_message: (ns != 0).then(|| base + Duration::from_nanos(ns - 1)),
        }
    }

    /// Records a live frame's seq and arrival.
    fn note_live(&self, seq: u64, at: Instant, base: Instant) {
        let prev = self.last_seq_plus1.load(Relaxed);
        if prev != 0 {
            let last = prev - 1;
            if seq <= last {
                self.seq_resets.fetch_add(1, Relaxed);
            } else if seq > last + 1 {
                self.gaps.fetch_add(1, Relaxed);
                self.missed.fetch_add(seq - last - 1, Relaxed);
            }
        }
        self.last_seq_plus1.store(seq.wrapping_add(1), Relaxed);
        let ns = u64::try_from(at.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX);
        self.last_message_ns.store(ns.saturating_add(1), Relaxed);
    }
}

/// The running transport: the thread, its command channel and its counters. Stops the
/// thread on [`KvTransport::stop`] or drop.
/// Reads a transport's counters from any thread (see [`KvTransport::stats_handle`]).
#[derive(Clone)]
pub struct StatsHandle {
    counters: Arc<[(usize, Counters)]>,
    base: Instant,
}

impl StatsHandle {
    /// The counters of every subscribed target.
    pub fn snapshot(&self) -> Vec<KvTransportStats> {
        self.counters
            .iter()
            .map(|(t, c)| c.snapshot(*t, self.base))
            .collect()
    }
}

pub struct KvTransport {
    thread: Option<JoinHandle<()>>,
    commands: Sender<KvCommand>,
    stop: Arc<AtomicBool>,
    counters: Arc<[(usize, Counters)]>,
    base: Instant,
}

impl KvTransport {
    /// Connects a SUB socket to every `(target index, endpoint)` and starts the
    /// `rolter-kv-events` thread. Returns the transport and the receiving end of its
    /// frame channel. Fails when an endpoint is not a valid ZMQ endpoint.
    pub fn start(
        targets: Vec<(usize, KvEventsEndpoint)>,
        opts: KvTransportOptions,
    ) -> Result<(KvTransport, Receiver<KvFrame>), KvTransportError> {
        let ctx = zmq::Context::new();
        let mut subs = Vec::with_capacity(targets.len());
        for (i, (target, ep)) in targets.into_iter().enumerate() {
            subs.push(Sub::open(&ctx, i, target, ep, &opts)?);
        }
        let counters: Arc<[(usize, Counters)]> = subs
            .iter()
            .map(|s| (s.target, Counters::default()))
            .collect();
        let (frames_tx, frames_rx) = crossbeam_channel::bounded(opts.channel_capacity.max(1));
        let (commands, commands_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let base = Instant::now();
        let mut worker = Worker {
            ctx,
            subs,
            replays: Vec::new(),
            counters: counters.clone(),
            frames: frames_tx,
            commands: commands_rx,
            stop: stop.clone(),
            replay_timeout: opts.replay_timeout,
            base,
        };
        let thread = std::thread::Builder::new()
            .name("rolter-kv-events".to_string())
            .spawn(move || worker.run())?;
        Ok((
            KvTransport {
                thread: Some(thread),
                commands,
                stop,
                counters,
                base,
            },
            frames_rx,
        ))
    }

    /// A sender of commands to the transport thread.
    pub fn commands(&self) -> Sender<KvCommand> {
        self.commands.clone()
    }

    /// Asks for a replay of `target` from `from_seq` (see [`KvCommand::Replay`]).
    pub fn request_replay(&self, target: usize, from_seq: u64) {
        let _ = self.commands.send(KvCommand::Replay { target, from_seq });
    }

    /// The counters of every subscribed target, in the order given to [`KvTransport::start`].
    pub fn stats(&self) -> Vec<KvTransportStats> {
        self.counters
            .iter()
            .map(|(t, c)| c.snapshot(*t, self.base))
            .collect()
    }

    /// A handle that reads the same counters from another thread.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            counters: self.counters.clone(),
            base: self.base,
        }
    }

    /// Stops the thread (within one poll interval, 20 ms) and joins it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        let _ = self.commands.send(KvCommand::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KvTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One target's SUB socket and the PAIR socket reading its monitor events.
struct Sub {
    target: usize,
    endpoint: KvEventsEndpoint,
    socket: zmq::Socket,
    monitor: zmq::Socket,
}

impl Sub {
    fn open(
        ctx: &zmq::Context,
        slot: usize,
        target: usize,
        endpoint: KvEventsEndpoint,
        opts: &KvTransportOptions,
    ) -> Result<Sub, KvTransportError> {
        let socket = ctx.socket(zmq::SUB)?;
        socket.set_linger(0)?;
        socket.set_rcvhwm(opts.rcvhwm)?;
        socket.set_reconnect_ivl(100)?;
        socket.set_reconnect_ivl_max(5_000)?;
        let hb = i32::try_from(opts.heartbeat.as_millis()).unwrap_or(i32::MAX);
        if hb > 0 {
            socket.set_heartbeat_ivl(hb)?;
            socket.set_heartbeat_timeout(hb.saturating_mul(3))?;
        }
        socket.set_subscribe(endpoint.topic.as_bytes())?;
        let monitor_ep = format!("inproc://rolter-kv-monitor-{slot}");
        let events = (zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw()
            | zmq::SocketEvent::DISCONNECTED.to_raw()) as i32;
        socket.monitor(&monitor_ep, events)?;
        let monitor = ctx.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(&monitor_ep)?;
        socket
            .connect(&endpoint.endpoint)
            .map_err(|source| KvTransportError::Endpoint {
                endpoint: endpoint.endpoint.clone(),
                source,
            })?;
        Ok(Sub {
            target,
            endpoint,
            socket,
            monitor,
        })
    }
}

/// A replay in flight on the transport thread.
struct Pending {
    slot: usize,
    socket: zmq::Socket,
    deadline: Instant,
}

/// The transport thread's state.
struct Worker {
    ctx: zmq::Context,
    subs: Vec<Sub>,
    replays: Vec<Pending>,
    counters: Arc<[(usize, Counters)]>,
    frames: Sender<KvFrame>,
    commands: Receiver<KvCommand>,
    stop: Arc<AtomicBool>,
    replay_timeout: Duration,
    base: Instant,
}

/// What to do with a frame read from a socket.
enum Outcome {
    Continue,
    /// The frame channel's receiver is gone: nothing left to do.
    Closed,
}

impl Worker {
    fn run(&mut self) {
        for s in &self.subs {
            tracing::debug!(target_index = s.target, endpoint = %s.endpoint.endpoint, "kv events: subscribing");
        }
        let mut ready = Vec::new();
        while !self.stop.load(Relaxed) {
            if !self.poll(&mut ready) {
                break;
            }
            if matches!(self.read_ready(&ready), Outcome::Closed) {
                break;
            }
            self.expire_replays();
            if !self.handle_commands() {
                break;
            }
        }
    }

    /// Polls every socket; `ready` gets one flag per socket (subs, monitors, replays).
    /// False on a fatal poll error.
    fn poll(&self, ready: &mut Vec<bool>) -> bool {
        let mut items: Vec<zmq::PollItem> =
            Vec::with_capacity(self.subs.len() * 2 + self.replays.len());
        for s in &self.subs {
            items.push(s.socket.as_poll_item(zmq::POLLIN));
        }
        for s in &self.subs {
            items.push(s.monitor.as_poll_item(zmq::POLLIN));
        }
        for r in &self.replays {
            items.push(r.socket.as_poll_item(zmq::POLLIN));
        }
        ready.clear();
        match zmq::poll(&mut items, POLL_MS) {
            Ok(_) => {
                ready.extend(items.iter().map(|i| i.is_readable()));
                true
            }
            Err(zmq::Error::EINTR) => {
                ready.resize(items.len(), false);
                true
            }
            Err(e) => {
                tracing::warn!("kv events: poll failed, stopping: {e}");
                false
            }
        }
    }

    fn read_ready(&mut self, ready: &[bool]) -> Outcome {
        let n = self.subs.len();
        for slot in 0..n {
            if ready[slot] && matches!(self.read_sub(slot), Outcome::Closed) {
                return Outcome::Closed;
            }
            if ready[n + slot] {
                self.read_monitor(slot);
            }
        }
        // Replays finish (and leave the list) as they are read: walk from the end.
        for i in (0..self.replays.len()).rev() {
            if ready.get(2 * n + i) == Some(&true) {
                match self.read_replay(i) {
                    Outcome::Closed => return Outcome::Closed,
                    Outcome::Continue => {}
                }
            }
        }
        Outcome::Continue
    }

    fn counters(&self, slot: usize) -> &Counters {
        &self.counters[slot].1
    }

    /// Reads up to [`BURST`] messages from one SUB socket.
    fn read_sub(&mut self, slot: usize) -> Outcome {
        for _ in 0..BURST {
            let parts = match self.subs[slot].socket.recv_multipart(zmq::DONTWAIT) {
                Ok(p) => p,
                Err(_) => break, // EAGAIN: drained
            };
            let received = Instant::now();
            let c = self.counters(slot);
            let Some((topic, seq, payload)) = split_message(parts) else {
                c.malformed.fetch_add(1, Relaxed);
                continue;
            };
            c.note_live(seq, received, self.base);
            let frame = KvFrame {
                target: self.subs[slot].target,
                topic,
                seq,
                payload,
                received,
                replayed: false,
            };
            match self.frames.try_send(frame) {
                Ok(()) => {
                    c.frames.fetch_add(1, Relaxed);
                }
                Err(TrySendError::Full(_)) => {
                    c.dropped.fetch_add(1, Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => return Outcome::Closed,
            }
        }
        Outcome::Continue
    }

    fn read_monitor(&mut self, slot: usize) {
        while let Ok(parts) = self.subs[slot].monitor.recv_multipart(zmq::DONTWAIT) {
            let Some(event) = parts
                .first()
                .and_then(|f| f.get(..2))
                .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            else {
                continue;
            };
            let sub = &self.subs[slot];
            let c = &self.counters[slot].1;
            if event == zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw() {
                c.connected.store(true, Relaxed);
                c.connects.fetch_add(1, Relaxed);
                tracing::debug!(target_index = sub.target, endpoint = %sub.endpoint.endpoint, "kv events: connected");
            } else if event == zmq::SocketEvent::DISCONNECTED.to_raw() {
                c.connected.store(false, Relaxed);
                c.disconnects.fetch_add(1, Relaxed);
                tracing::debug!(target_index = sub.target, endpoint = %sub.endpoint.endpoint, "kv events: disconnected");
            }
        }
    }

    /// Reads the replies of replay `i`; removes it when the end marker came or the reply
    /// was malformed.
    fn read_replay(&mut self, i: usize) -> Outcome {
        let slot = self.replays[i].slot;
        let target = self.subs[slot].target;
        loop {
            let parts = match self.replays[i].socket.recv_multipart(zmq::DONTWAIT) {
                Ok(p) => p,
                Err(_) => return Outcome::Continue,
            };
            let c = &self.counters[slot].1;
            let reply = match split_reply(parts) {
                Some(Reply::Frame(topic, seq, payload)) => (topic, seq, payload),
                Some(Reply::End) => {
                    // The end is a frame too, so the consumer knows the replay is complete
                    // (and may ask for another one).
                    self.replays.swap_remove(i);
                    let end = KvFrame {
                        target,
                        topic: Vec::new(),
                        seq: END_SEQ,
                        payload: Vec::new(),
                        received: Instant::now(),
                        replayed: true,
                    };
                    return match self.frames.try_send(end) {
                        Err(TrySendError::Disconnected(_)) => Outcome::Closed,
                        Err(TrySendError::Full(_)) => {
                            c.dropped.fetch_add(1, Relaxed);
                            Outcome::Continue
                        }
                        Ok(()) => Outcome::Continue,
                    };
                }
                None => {
                    c.replay_failures.fetch_add(1, Relaxed);
                    self.replays.swap_remove(i);
                    return Outcome::Continue;
                }
            };
            let frame = KvFrame {
                target,
                topic: reply.0,
                seq: reply.1,
                payload: reply.2,
                received: Instant::now(),
                replayed: true,
            };
            match self.frames.try_send(frame) {
                Ok(()) => {
                    c.replayed.fetch_add(1, Relaxed);
                }
                Err(TrySendError::Full(_)) => {
                    c.dropped.fetch_add(1, Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => return Outcome::Closed,
            }
        }
    }

    fn expire_replays(&mut self) {
        let now = Instant::now();
        let counters = &self.counters;
        self.replays.retain(|r| {
            let live = r.deadline > now;
            if !live {
                counters[r.slot].1.replay_failures.fetch_add(1, Relaxed);
            }
            live
        });
    }

    /// Applies queued commands; false when the thread should end.
    fn handle_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(KvCommand::Replay { target, from_seq }) => self.start_replay(target, from_seq),
                Ok(KvCommand::Stop) | Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    fn start_replay(&mut self, target: usize, from_seq: u64) {
        let Some(slot) = self.subs.iter().position(|s| s.target == target) else {
            return;
        };
        if self.replays.iter().any(|r| r.slot == slot) {
            return;
        }
        let c = &self.counters[slot].1;
        c.replays.fetch_add(1, Relaxed);
        let started = self.subs[slot]
            .endpoint
            .replay_endpoint
            .as_deref()
            .ok_or(zmq::Error::EINVAL)
            .and_then(|ep| open_replay(&self.ctx, ep, from_seq));
        match started {
            Ok(socket) => self.replays.push(Pending {
                slot,
                socket,
                deadline: Instant::now() + self.replay_timeout,
            }),
            Err(_) => {
                c.replay_failures.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Splits a live message into topic, seq and payload; `None` when it is not 3 frames
/// with an 8-byte seq.
fn split_message(parts: Vec<Vec<u8>>) -> Option<(Vec<u8>, u64, Vec<u8>)> {
    let [topic, seq, payload]: [Vec<u8>; 3] = parts.try_into().ok()?;
    let seq = u64::from_be_bytes(seq.as_slice().try_into().ok()?);
    Some((topic, seq, payload))
}

/// One message of a replay answer.
enum Reply {
    /// A buffered batch: topic (empty when the server sends none), seq, payload.
    Frame(Vec<u8>, u64, Vec<u8>),
    /// The end marker.
    End,
}

/// Parses a replay answer as read by a DEALER: `[b"", seq, payload]`, or
/// `[b"", topic, seq, payload]` from servers that add the topic.
fn split_reply(mut parts: Vec<Vec<u8>>) -> Option<Reply> {
    if parts.first().is_some_and(|f| f.is_empty()) && parts.len() > 2 {
        parts.remove(0);
    }
    let (topic, seq, payload) = match parts.len() {
        2 => {
            let payload = parts.pop()?;
            (Vec::new(), parts.pop()?, payload)
        }
        3 => split_message(parts).map(|(t, s, p)| (t, s.to_be_bytes().to_vec(), p))?,
        _ => return None,
    };
    let seq = u64::from_be_bytes(seq.as_slice().try_into().ok()?);
    if seq == END_SEQ {
        return Some(Reply::End);
    }
    Some(Reply::Frame(topic, seq, payload))
}

/// Opens a DEALER to a replay endpoint and sends the request for `from_seq` on.
fn open_replay(ctx: &zmq::Context, endpoint: &str, from_seq: u64) -> zmq::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::DEALER)?;
    socket.set_linger(0)?;
    socket.connect(endpoint)?;
    // Queued by libzmq until the connection is up.
    socket.send_multipart([&[][..], &from_seq.to_be_bytes()[..]], zmq::DONTWAIT)?;
    Ok(socket)
}

/// Asks a replay endpoint for every buffered batch from `from_seq` on and waits (at most
/// `timeout` in all) for the end marker. Returns `(seq, payload)` pairs in the order the
/// server sent them. Blocking: for tools and tests; the transport thread runs replays
/// without blocking (see [`KvCommand::Replay`]).
pub fn replay(
    endpoint: &str,
    from_seq: u64,
    timeout: Duration,
) -> Result<Vec<(u64, Vec<u8>)>, KvTransportError> {
    let ctx = zmq::Context::new();
    let socket =
        open_replay(&ctx, endpoint, from_seq).map_err(|source| KvTransportError::Endpoint {
            endpoint: endpoint.to_string(),
            source,
        })?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || socket.poll(zmq::POLLIN, left.as_millis().max(1) as i64)? == 0 {
            return Err(KvTransportError::Timeout {
                endpoint: endpoint.to_string(),
                timeout,
            });
        }
        let parts = socket.recv_multipart(0)?;
        let n = parts.len();
        match split_reply(parts) {
            Some(Reply::Frame(_, seq, payload)) => out.push((seq, payload)),
            Some(Reply::End) => return Ok(out),
            None => {
                return Err(KvTransportError::Malformed {
                    endpoint: endpoint.to_string(),
                    frames: n,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
