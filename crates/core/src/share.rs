//! What a core's strategies learned from routing, passed to the same route's strategy on
//! every other core (and, for routes that share through the state store, to the other
//! gateway replicas): collected in reused buffers during a signal tick, sent as one batch.

use crate::TargetId;

/// Learned routing state one core passes to the same route's strategy on every other core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared<'a> {
    /// A prompt prefix is now warm on `target`; `data` is in the strategy's own encoding
    /// (canonical prompt bytes, or block hashes).
    Prefix { target: TargetId, data: &'a [u8] },
    /// Session `key` was last served by `target`.
    SessionPin { key: u64, target: TargetId },
    /// `count` picks of the route landed on `target` (the books of `fair_catchup` with
    /// `durable = true`).
    Assigned { target: TargetId, count: u32 },
}

#[derive(Debug, Clone, Copy)]
enum SharedKind {
    Prefix,
    SessionPin,
    Assigned,
}

#[derive(Debug, Clone, Copy)]
struct SharedEntry {
    route: u16,
    kind: SharedKind,
    target: TargetId,
    key: u64,
    start: u32,
    end: u32,
}

/// Collects what a core's strategies share during one signal tick, in reused buffers.
#[derive(Debug, Default)]
pub struct ShareSink {
    route: u16,
    entries: Vec<SharedEntry>,
    bytes: Vec<u8>,
}

impl ShareSink {
    /// Sets the route whose strategy writes next (done by the worker).
    pub fn for_route(&mut self, route: usize) -> &mut Self {
        self.route = route as u16;
        self
    }

    pub fn prefix(&mut self, target: TargetId, data: &[u8]) {
        let start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(data);
        self.entries.push(SharedEntry {
            route: self.route,
            kind: SharedKind::Prefix,
            target,
            key: 0,
            start,
            end: self.bytes.len() as u32,
        });
    }

    pub fn session_pin(&mut self, key: u64, target: TargetId) {
        self.entries.push(SharedEntry {
            route: self.route,
            kind: SharedKind::SessionPin,
            target,
            key,
            start: 0,
            end: 0,
        });
    }

    pub fn assigned(&mut self, target: TargetId, count: u32) {
        self.entries.push(SharedEntry {
            route: self.route,
            kind: SharedKind::Assigned,
            target,
            key: u64::from(count),
            start: 0,
            end: 0,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tick's batch, leaving the sink empty with its capacity kept.
    pub fn take_batch(&mut self) -> ShareBatch {
        let (ne, nb) = (self.entries.capacity(), self.bytes.capacity());
        let entries = std::mem::replace(&mut self.entries, Vec::with_capacity(ne));
        let bytes = std::mem::replace(&mut self.bytes, Vec::with_capacity(nb));
        ShareBatch { entries, bytes }
    }
}

/// One core's shared items of one tick, sent to every other core.
#[derive(Debug, Default)]
pub struct ShareBatch {
    entries: Vec<SharedEntry>,
    bytes: Vec<u8>,
}

impl ShareBatch {
    /// Every item with the index of the route whose strategy shared it.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Shared<'_>)> {
        self.entries.iter().map(|e| {
            let item = match e.kind {
                SharedKind::Prefix => Shared::Prefix {
                    target: e.target,
                    data: &self.bytes[e.start as usize..e.end as usize],
                },
                SharedKind::SessionPin => Shared::SessionPin {
                    key: e.key,
                    target: e.target,
                },
                SharedKind::Assigned => Shared::Assigned {
                    target: e.target,
                    count: e.key as u32,
                },
            };
            (e.route as usize, item)
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
