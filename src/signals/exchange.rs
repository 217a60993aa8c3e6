//! The channels between cores: every worker sends its load snapshot and its attempt records
//! to every other worker and to the control thread; the control thread sends each worker the
//! targets' eligibility and queue depth.
//!
//! Owns the messages and the worker side of the mesh. Sends never block (bounded channels,
//! `try_send`: a full inbox drops the message, and a later snapshot supersedes it) and
//! receives never wait (`try_recv` on the signal tick and before each pick). It must not
//! hold a lock or do I/O.

use std::cell::RefCell;
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use super::load::{LoadView, TargetSignal};
use crate::strategy::{Sample, ShareBatch};

/// Messages a worker receives.
pub enum ToWorker {
    /// Another core's in-flight counts per target.
    Load { from: usize, snapshot: Arc<[u32]> },
    /// Attempts that finished on another core.
    Samples(Arc<[Sample]>),
    /// What another core's strategies learned from their routing (prefixes, sessions).
    Shared(Arc<ShareBatch>),
    /// The control thread's eligibility and queue depth per target.
    Targets(Arc<[TargetSignal]>),
    /// LoRA adapter residency per target (only while some route reads it).
    Lora(Arc<super::lora::LoraTable>),
}

/// Messages the control thread receives.
pub enum ToControl {
    Load { from: usize, snapshot: Arc<[u32]> },
    Records(Vec<Record>),
}

/// How an attempt ended, for health and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A 2xx response relayed to its end.
    Success,
    /// The target failed: connect error, timeout, reset, malformed or 5xx response, or a
    /// stream cut off by the upstream.
    TargetFailed,
    /// The target answered, not with success, but not at fault either (4xx, 429).
    Answered,
    /// The client went away first; says nothing about the target.
    ClientGone,
}

/// What a worker reports to the control thread.
#[derive(Debug, Clone, Copy)]
pub enum Record {
    /// One upstream attempt of a request on `route`.
    Attempt {
        route: u16,
        sample: Sample,
        verdict: Verdict,
    },
    /// A strategy could not use its signal and fell back.
    Fallback { route: u16, reason: &'static str },
    /// A route asked its cache controller before picking: `result` is the lookup's
    /// outcome label; `unknown_instances` counts instance ids in the answer that named no
    /// target of the route.
    CacheLookup {
        route: u16,
        result: &'static str,
        unknown_instances: u32,
    },
    /// A route loaded a LoRA adapter on `target` before forwarding (`load_from`).
    /// `adapter` is the adapter's key (`signals::lora::adapter_key`).
    AdapterLoad {
        target: u16,
        adapter: u64,
        loaded: bool,
    },
    /// The gateway answered a request itself (no target reached).
    Gateway { status: u16, code: &'static str },
}

/// Capacity of every inbox. At one snapshot and one batch per core per tick this holds far
/// more than a tick's traffic; a core that stops draining loses messages instead of memory.
const INBOX: usize = 4096;

/// The worker side of the mesh.
pub struct WorkerLinks {
    pub id: usize,
    inbox: Receiver<ToWorker>,
    /// Senders to every other worker (`None` at this worker's own index).
    peers: Vec<Option<Sender<ToWorker>>>,
    control: Sender<ToControl>,
    /// Records of this tick, sent as one batch.
    outbox: RefCell<Vec<Record>>,
}

/// The control thread's side of the mesh.
pub struct ControlLinks {
    pub inbox: Receiver<ToControl>,
    pub workers: Vec<Sender<ToWorker>>,
}

/// Builds the channels for `workers` workers and one control thread.
pub fn mesh(workers: usize) -> (Vec<WorkerLinks>, ControlLinks) {
    let (worker_tx, worker_rx): (Vec<_>, Vec<_>) = (0..workers).map(|_| bounded(INBOX)).unzip();
    let (control_tx, control_rx) = bounded(INBOX);
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
            outbox: RefCell::new(Vec::with_capacity(256)),
        })
        .collect();
    (
        links,
        ControlLinks {
            inbox: control_rx,
            workers: worker_tx,
        },
    )
}

impl WorkerLinks {
    /// Queues a record for the next tick's batch.
    #[inline]
    pub fn record(&self, r: Record) {
        self.outbox.borrow_mut().push(r);
    }

    /// Sends this core's load snapshot (if it changed) and the tick's records.
    pub fn publish(&self, view: &LoadView) {
        if let Some(snapshot) = view.take_snapshot() {
            for p in self.peers.iter().flatten() {
                send(
                    p,
                    ToWorker::Load {
                        from: self.id,
                        snapshot: snapshot.clone(),
                    },
                );
            }
            send(
                &self.control,
                ToControl::Load {
                    from: self.id,
                    snapshot,
                },
            );
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
                    send(p, ToWorker::Samples(samples.clone()));
                }
            }
        }
        let keep = outbox.capacity();
        let batch = std::mem::replace(&mut *outbox, Vec::with_capacity(keep));
        send(&self.control, ToControl::Records(batch));
    }

    /// Sends this core's shared routing state of the tick to every other core.
    pub fn share(&self, batch: ShareBatch) {
        if batch.is_empty() || !self.peers.iter().any(Option::is_some) {
            return;
        }
        let batch = Arc::new(batch);
        for p in self.peers.iter().flatten() {
            send(p, ToWorker::Shared(batch.clone()));
        }
    }

    /// Applies everything waiting in the inbox: peers' snapshots and the control thread's
    /// target view go into `view`; peers' samples go to `learn`, their shared routing state
    /// to `apply`.
    pub fn drain(
        &self,
        view: &LoadView,
        mut learn: impl FnMut(&Sample),
        mut apply: impl FnMut(&ShareBatch),
    ) {
        while let Ok(msg) = self.inbox.try_recv() {
            match msg {
                ToWorker::Load { from, snapshot } => view.apply_peer(from, snapshot),
                ToWorker::Samples(samples) => samples.iter().for_each(&mut learn),
                ToWorker::Shared(batch) => apply(&batch),
                ToWorker::Targets(targets) => view.apply_targets(&targets),
                ToWorker::Lora(table) => view.lora.apply(table),
            }
        }
    }

    /// Whether anything is waiting (one atomic load; no message is taken).
    #[inline]
    pub fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }
}

fn send<T>(tx: &Sender<T>, msg: T) {
    match tx.try_send(msg) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => {}
        Err(TrySendError::Full(_)) => {
            tracing::debug!("signal inbox full; a message was dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With N cores each holding some requests, after one publish/drain round every core's
    /// view equals the true total, and later changes replace rather than add up.
    #[test]
    fn every_core_converges_to_the_true_total_after_one_round() {
        let n = 4;
        let targets = 3;
        let (links, control) = mesh(n);
        let views: Vec<LoadView> = (0..n).map(|_| LoadView::new(targets, n)).collect();
        let mut guards = Vec::new();
        // Core i holds i+1 requests on target i % 3.
        for (i, v) in views.iter().enumerate() {
            for _ in 0..=i {
                guards.push(v.enter(i % targets));
            }
        }
        let truth = |t: usize| -> u64 {
            (0..n)
                .filter(|i| i % targets == t)
                .map(|i| i as u64 + 1)
                .sum()
        };
        for (l, v) in links.iter().zip(&views) {
            l.publish(v);
        }
        for (l, v) in links.iter().zip(&views) {
            l.drain(v, |_| {}, |_| {});
        }
        for v in &views {
            for t in 0..targets {
                assert_eq!(v.in_flight(t), truth(t), "target {t}");
            }
        }
        // The control thread got one snapshot per core.
        let loads = control
            .inbox
            .try_iter()
            .filter(|m| matches!(m, ToControl::Load { .. }))
            .count();
        assert_eq!(loads, n);
        // Everything finishes: the next round brings every view back to zero.
        drop(guards);
        for (l, v) in links.iter().zip(&views) {
            l.publish(v);
        }
        for (l, v) in links.iter().zip(&views) {
            l.drain(v, |_| {}, |_| {});
        }
        for v in &views {
            for t in 0..targets {
                assert_eq!(v.in_flight(t), 0);
            }
        }
    }

    #[test]
    fn samples_reach_every_other_core_and_records_reach_control() {
        let (links, control) = mesh(3);
        let views: Vec<LoadView> = (0..3).map(|_| LoadView::new(1, 3)).collect();
        let sample = crate::strategy::testing::sample(0, 25, 1, 10);
        links[0].record(Record::Attempt {
            route: 0,
            sample,
            verdict: Verdict::Success,
        });
        links[0].record(Record::Gateway {
            status: 404,
            code: "model_not_found",
        });
        links[0].publish(&views[0]);
        let mut seen = [0; 3];
        for (i, (l, v)) in links.iter().zip(&views).enumerate() {
            l.drain(
                v,
                |s| {
                    assert_eq!(s.ttft, sample.ttft);
                    seen[i] += 1;
                },
                |_| {},
            );
        }
        assert_eq!(seen, [0, 1, 1], "the sender learned locally already");
        let records: Vec<Record> = control
            .inbox
            .try_iter()
            .flat_map(|m| match m {
                ToControl::Records(r) => r,
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn a_full_inbox_drops_instead_of_blocking() {
        let (links, _control) = mesh(2);
        let view = LoadView::new(1, 2);
        for _ in 0..INBOX + 10 {
            let _g = view.enter(0);
            links[0].publish(&view);
        }
        assert!(links[1].has_mail());
        let v1 = LoadView::new(1, 2);
        links[1].drain(&v1, |_| {}, |_| {});
        // The inbox held INBOX snapshots (each saying one request); the rest were dropped
        // without blocking the sender.
        assert_eq!(v1.in_flight(0), 1);
        assert!(!links[1].has_mail());
    }

    #[test]
    fn shared_routing_state_reaches_every_other_core() {
        let (links, _control) = mesh(3);
        let views: Vec<LoadView> = (0..3).map(|_| LoadView::new(2, 3)).collect();
        let mut sink = crate::strategy::ShareSink::default();
        sink.for_route(1).prefix(1, b"[{\"role\":\"system\"");
        sink.for_route(0).session_pin(42, 0);
        links[2].share(sink.take_batch());
        assert!(sink.is_empty());
        let mut got = vec![Vec::new(); 3];
        for (i, (l, v)) in links.iter().zip(&views).enumerate() {
            l.drain(
                v,
                |_| {},
                |b| {
                    for (route, item) in b.iter() {
                        got[i].push(format!("{route}:{item:?}"));
                    }
                },
            );
        }
        assert!(got[2].is_empty(), "not sent back to its sender");
        assert_eq!(got[0], got[1]);
        assert_eq!(got[0].len(), 2);
        assert!(
            got[0][0].starts_with("1:Prefix { target: 1"),
            "{:?}",
            got[0]
        );
        assert!(got[0][1].starts_with("0:SessionPin { key: 42, target: 0"));
    }
}
