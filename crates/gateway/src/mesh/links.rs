//! Both ends of the mesh's channels: every worker sends its load snapshot and its records to
//! every other worker and to the control thread; the control thread sends each worker the
//! targets' signals.
//!
//! Sends never block (bounded channels, `try_send`): a full inbox drops the message and
//! counts the drop ([`MeshDrops`], shown on `/metrics`). Load snapshots go out when the
//! counts changed and, on a slow heartbeat, regardless, so a dropped snapshot heals within
//! [`HEARTBEAT_TICKS`] ticks. Receives never wait (`try_recv` on the tick and before each
//! pick). Nothing here does I/O; a send that finds the control thread asleep through a quiet
//! tick rings its bell, which takes the bell's lock once (on the worker's tick, never per
//! request).

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use rolter_core::{RouteLedger, Sample, ShareBatch};

use super::bell::{Bell, Doorbell};
use super::load::LoadView;
use super::messages::{Record, ToControl, ToWorker};

/// Capacity of every inbox. At one snapshot and one batch per core per tick this holds far
/// more than a tick's traffic; a core that stops draining loses messages instead of memory.
pub const INBOX: usize = 4096;

/// A worker sends its full load snapshot every this many ticks even when nothing changed
/// (100 ms at the 2 ms tick), so a snapshot lost to a full inbox is replaced.
pub const HEARTBEAT_TICKS: u32 = 50;

/// The kinds of message the mesh can drop, as `/metrics` labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A worker's load snapshot (to another worker or to the control thread).
    Load,
    /// A batch of attempt samples to another worker.
    Samples,
    /// Shared routing state (prefixes, session pins) to another worker.
    Shared,
    /// A worker's records to the control thread.
    Records,
    /// The control thread's target signals (and address tables) to a worker.
    Targets,
    /// The control thread's LoRA table to a worker.
    Lora,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Load,
        Kind::Samples,
        Kind::Shared,
        Kind::Records,
        Kind::Targets,
        Kind::Lora,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Load => "load",
            Kind::Samples => "samples",
            Kind::Shared => "shared",
            Kind::Records => "records",
            Kind::Targets => "targets",
            Kind::Lora => "lora",
        }
    }
}

/// Messages dropped because an inbox was full, per kind. One set per sender, written only
/// by that sender's thread (relaxed adds off the request path) and read by the control
/// thread when `/metrics` is rendered.
#[derive(Debug, Default)]
pub struct MeshDrops([AtomicU64; 6]);

impl MeshDrops {
    fn count(&self, kind: Kind) {
        self.0[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, kind: Kind) -> u64 {
        self.0[kind as usize].load(Ordering::Relaxed)
    }
}

/// The worker side of the mesh.
pub struct WorkerLinks {
    pub id: usize,
    inbox: Receiver<ToWorker>,
    /// Senders to every other worker (`None` at this worker's own index).
    peers: Vec<Option<Sender<ToWorker>>>,
    control: Sender<ToControl>,
    /// Wakes the control thread when it sleeps through a quiet tick.
    control_bell: Arc<Bell>,
    /// Records of this tick, sent as one batch.
    outbox: RefCell<Vec<Record>>,
    /// Ticks since the last full snapshot.
    since_full: Cell<u32>,
    drops: Arc<MeshDrops>,
}

/// The control thread's side of the mesh.
pub struct ControlLinks {
    pub inbox: Receiver<ToControl>,
    workers: Vec<Sender<ToWorker>>,
    /// What each sender dropped: every worker's, then the control thread's own.
    pub drops: Vec<Arc<MeshDrops>>,
    /// Rung by a worker that sent while the control thread sleeps through a quiet tick.
    pub bell: Doorbell,
}

/// Builds the channels for `workers` workers and one control thread.
pub fn mesh(workers: usize) -> (Vec<WorkerLinks>, ControlLinks) {
    let (worker_tx, worker_rx): (Vec<_>, Vec<_>) = (0..workers).map(|_| bounded(INBOX)).unzip();
    let (control_tx, control_rx) = bounded(INBOX);
    let drops: Vec<Arc<MeshDrops>> = (0..=workers).map(|_| Arc::default()).collect();
    let (control_bell, bell) = Doorbell::new();
    let links = worker_rx
        .into_iter()
        .enumerate()
        .map(|(id, inbox)| WorkerLinks {
            id,
            inbox,
            peers: worker_tx
                .iter()
                .enumerate()
                .map(|(j, tx)| (j != id).then(|| tx.clone()))
                .collect(),
            control: control_tx.clone(),
            control_bell: control_bell.clone(),
            outbox: RefCell::new(Vec::with_capacity(256)),
            since_full: Cell::new(0),
            drops: drops[id].clone(),
        })
        .collect();
    (
        links,
        ControlLinks {
            inbox: control_rx,
            workers: worker_tx,
            drops,
            bell,
        },
    )
}

impl WorkerLinks {
    /// Queues a record for the next tick's batch.
    #[inline]
    pub fn record(&self, r: Record) {
        self.outbox.borrow_mut().push(r);
    }

    /// The tick's sends: this core's load snapshot (when it changed, and on the heartbeat
    /// regardless) and the tick's records.
    pub fn publish(&self, view: &LoadView) {
        let ticks = self.since_full.get() + 1;
        let heartbeat = ticks >= HEARTBEAT_TICKS;
        self.since_full.set(if heartbeat { 0 } else { ticks });
        if let Some(snapshot) = view.take_snapshot(heartbeat) {
            for p in self.peers.iter().flatten() {
                let msg = ToWorker::Load {
                    from: self.id,
                    snapshot: snapshot.clone(),
                };
                send(p, msg, Kind::Load, &self.drops);
            }
            let msg = ToControl::Load {
                from: self.id,
                snapshot,
            };
            send(&self.control, msg, Kind::Load, &self.drops);
            self.control_bell.ring_if_asleep();
        }
        let mut outbox = self.outbox.borrow_mut();
        if outbox.is_empty() {
            return;
        }
        if self.peers.iter().any(Option::is_some) {
            let samples: Arc<[Sample]> = outbox
                .iter()
                .filter_map(|r| match r {
                    Record::Attempt { sample, .. } => Some(*sample),
                    _ => None,
                })
                .collect();
            if !samples.is_empty() {
                for p in self.peers.iter().flatten() {
                    let msg = ToWorker::Samples(samples.clone());
                    send(p, msg, Kind::Samples, &self.drops);
                }
            }
        }
        let keep = outbox.capacity();
        let batch = std::mem::replace(&mut *outbox, Vec::with_capacity(keep));
        send(
            &self.control,
            ToControl::Records(batch),
            Kind::Records,
            &self.drops,
        );
        self.control_bell.ring_if_asleep();
    }

    /// Sends this core's shared routing state of the tick to every other core.
    pub fn share(&self, batch: &Arc<ShareBatch>) {
        if batch.is_empty() {
            return;
        }
        for p in self.peers.iter().flatten() {
            send(
                p,
                ToWorker::Shared(batch.clone()),
                Kind::Shared,
                &self.drops,
            );
        }
    }

    /// Applies everything waiting in the inbox: peers' snapshots and the control thread's
    /// target view go into `view`; peers' samples go to `learn`, their shared routing state
    /// to `apply`, the control thread's address table to `addrs` and the store's books to
    /// `books`.
    pub fn drain(
        &self,
        view: &LoadView,
        mut learn: impl FnMut(&Sample),
        mut apply: impl FnMut(&ShareBatch, bool),
        mut addrs: impl FnMut(&[SocketAddr]),
        mut books: impl FnMut(&[(usize, RouteLedger)]),
    ) {
        while let Ok(msg) = self.inbox.try_recv() {
            match msg {
                ToWorker::Load { from, snapshot } => view.apply_peer(from, snapshot),
                ToWorker::Samples(samples) => samples.iter().for_each(&mut learn),
                ToWorker::Shared(batch) => apply(&batch, false),
                ToWorker::FleetShared(batch) => apply(&batch, true),
                ToWorker::Targets(targets) => view.apply_targets(&targets),
                ToWorker::Lora(table) => view.lora.apply(table),
                ToWorker::Addrs(table) => addrs(&table),
                ToWorker::Ledger(ledgers) => books(&ledgers),
                ToWorker::FleetLoad(counts) => view.apply_fleet(&counts),
            }
        }
    }

    /// Whether anything is waiting (one atomic load; no message is taken).
    #[inline]
    pub fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }
}

impl ControlLinks {
    /// Sends `msg` (made once per worker) to every worker; a full inbox counts a drop.
    pub fn broadcast(&self, kind: Kind, msg: impl Fn() -> ToWorker) {
        let own = &self.drops[self.workers.len()];
        for w in &self.workers {
            send(w, msg(), kind, own);
        }
    }

    /// Messages of `kind` dropped so far, over every sender.
    pub fn dropped(&self, kind: Kind) -> u64 {
        self.drops.iter().map(|d| d.get(kind)).sum()
    }
}

fn send<T>(tx: &Sender<T>, msg: T, kind: Kind, drops: &MeshDrops) {
    match tx.try_send(msg) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => {}
        Err(TrySendError::Full(_)) => drops.count(kind),
    }
}
