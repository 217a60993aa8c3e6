//! The controller stand-in's state: which instance holds which chunk (`kv_pool`), the
//! registered workers, and the lookups over them, as LMCache's `KVController` and
//! `RegistrationController` keep and answer them.
//!
//! It applies decoded worker messages and answers queries; it does no I/O and knows
//! nothing of HTTP or ZMQ.

use std::collections::{BTreeMap, HashMap};

use crate::lmcache_wire::{chunk_keys, ChunkMsg, Registration, WorkerMsg};

/// One holder of a chunk (LMCache's `KVChunkMetadata`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Holder {
    instance_id: String,
    worker_id: u32,
    location: String,
}

/// One entry of a lookup's `layout_info`: an instance, the location of its chunks, and the
/// end (exclusive token index) of the last chunk it was the first holder of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutEntry {
    pub instance_id: String,
    pub location: String,
    pub matched_end: usize,
}

pub(crate) struct Pool {
    chunk_size: usize,
    /// Chunk key → holders, in admit order.
    kv: HashMap<i128, Vec<Holder>>,
    /// (instance_id, worker_id) → its registration.
    workers: BTreeMap<(String, u32), Registration>,
    /// IP → the instance last registered from it (LMCache's `instance_mapping`).
    by_ip: HashMap<String, String>,
}

impl Pool {
    pub fn new(chunk_size: usize) -> Pool {
        Pool {
            chunk_size: chunk_size.max(1),
            kv: HashMap::new(),
            workers: BTreeMap::new(),
            by_ip: HashMap::new(),
        }
    }

    /// Applies one worker message.
    pub fn apply(&mut self, msg: WorkerMsg) {
        match msg {
            WorkerMsg::Register(r) | WorkerMsg::Heartbeat(r) => {
                self.by_ip.insert(r.ip.clone(), r.instance_id.clone());
                self.workers.insert((r.instance_id.clone(), r.worker_id), r);
            }
            WorkerMsg::DeRegister {
                instance_id,
                worker_id,
                ip,
                ..
            } => {
                if self.by_ip.get(&ip) == Some(&instance_id) {
                    self.by_ip.remove(&ip);
                }
                self.workers.remove(&(instance_id.clone(), worker_id));
                self.kv.retain(|_, holders| {
                    holders.retain(|h| !(h.instance_id == instance_id && h.worker_id == worker_id));
                    !holders.is_empty()
                });
            }
            WorkerMsg::Admit(c) => {
                let (key, holder) = split(c);
                self.kv.entry(key).or_default().push(holder);
            }
            WorkerMsg::Evict(c) => {
                let (key, gone) = split(c);
                if let Some(holders) = self.kv.get_mut(&key) {
                    holders.retain(|h| *h != gone);
                    if holders.is_empty() {
                        self.kv.remove(&key);
                    }
                }
            }
        }
    }

    /// LMCache's `KVController.lookup`: walks the tokens' chunks in order and stops at the
    /// first chunk no one holds; for each chunk held, its first holder's instance is
    /// (re)set to this chunk's end. Instances keep the order they first appeared in.
    pub fn lookup(&self, tokens: &[i64]) -> Vec<LayoutEntry> {
        let mut layout: Vec<LayoutEntry> = Vec::new();
        for chunk in chunk_keys(tokens, self.chunk_size) {
            let Some(first) = self.kv.get(&chunk.key.into()).and_then(|h| h.first()) else {
                break;
            };
            match layout
                .iter_mut()
                .find(|e| e.instance_id == first.instance_id)
            {
                Some(e) => {
                    e.location.clone_from(&first.location);
                    e.matched_end = chunk.end;
                }
                None => layout.push(LayoutEntry {
                    instance_id: first.instance_id.clone(),
                    location: first.location.clone(),
                    matched_end: chunk.end,
                }),
            }
        }
        layout
    }

    /// The instance registered from `ip` (LMCache's `get_instance_id`); `ip:port` of a
    /// registered worker is accepted too, to tell apart engines sharing one host.
    pub fn query_instance(&self, ip: &str) -> Option<String> {
        if let Some(id) = self.by_ip.get(ip) {
            return Some(id.clone());
        }
        self.workers
            .values()
            .find(|r| format!("{}:{}", r.ip, r.port) == ip)
            .map(|r| r.instance_id.clone())
    }

    /// Registered workers, by instance id then worker id.
    pub fn workers(&self) -> Vec<Registration> {
        self.workers.values().cloned().collect()
    }

    /// Chunk keys held by at least one instance.
    pub fn keys(&self) -> usize {
        self.kv.len()
    }
}

fn split(c: ChunkMsg) -> (i128, Holder) {
    (
        c.key,
        Holder {
            instance_id: c.instance_id,
            worker_id: c.worker_id,
            location: c.location,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(instance: &str, key: i64) -> ChunkMsg {
        ChunkMsg {
            instance_id: instance.into(),
            worker_id: 0,
            key: key.into(),
            location: "LocalCPUBackend".into(),
        }
    }

    fn admit_all(p: &mut Pool, instance: &str, tokens: &[i64]) {
        for c in chunk_keys(tokens, 4) {
            p.apply(WorkerMsg::Admit(chunk(instance, c.key)));
        }
    }

    fn layout(p: &Pool, tokens: &[i64]) -> Vec<(String, usize)> {
        p.lookup(tokens)
            .into_iter()
            .map(|e| (e.instance_id, e.matched_end))
            .collect()
    }

    fn reg(instance: &str, ip: &str, port: u16) -> Registration {
        Registration {
            instance_id: instance.into(),
            worker_id: 0,
            ip: ip.into(),
            port,
            distributed_url: String::new(),
        }
    }

    #[test]
    fn lookup_follows_the_first_holder_of_each_chunk() {
        let mut p = Pool::new(4);
        let t: Vec<i64> = (0..10).collect(); // chunks end at 4, 8, 10
        assert!(p.lookup(&t).is_empty());
        admit_all(&mut p, "a", &t[..8]);
        // a holds the first two chunks; the third is unknown.
        assert_eq!(layout(&p, &t), [("a".to_string(), 8)]);
        // b holds all of t; a stays the first holder of chunks 1 and 2.
        admit_all(&mut p, "b", &t);
        assert_eq!(layout(&p, &t), [("a".into(), 8), ("b".into(), 10)]);
        // A prompt sharing the first chunk only.
        let other = [0, 1, 2, 3, 50, 51];
        assert_eq!(layout(&p, &other), [("a".to_string(), 4)]);
        // a evicts its second chunk: b is the first holder left; a keeps chunk 1.
        let keys = chunk_keys(&t, 4);
        p.apply(WorkerMsg::Evict(chunk("a", keys[1].key)));
        assert_eq!(layout(&p, &t), [("a".into(), 4), ("b".into(), 10)]);
        // An evict with another location removes nothing.
        let mut wrong = chunk("a", keys[0].key);
        wrong.location = "LocalDiskBackend".into();
        p.apply(WorkerMsg::Evict(wrong));
        assert_eq!(layout(&p, &t)[0], ("a".to_string(), 4));
        // b evicts its first chunk: a still holds it, so the walk goes on to b's chunks.
        p.apply(WorkerMsg::Evict(chunk("b", keys[0].key)));
        assert_eq!(layout(&p, &t), [("a".into(), 4), ("b".into(), 10)]);
        // a evicts chunk 0 too: no one holds it, the walk stops at once.
        p.apply(WorkerMsg::Evict(chunk("a", keys[0].key)));
        assert!(p.lookup(&t).is_empty());
        assert_eq!(p.keys(), 2);
    }

    #[test]
    fn registration_deregistration_and_query_instance() {
        let mut p = Pool::new(4);
        p.apply(WorkerMsg::Register(reg("a", "10.0.0.1", 8000)));
        p.apply(WorkerMsg::Heartbeat(reg("b", "10.0.0.2", 8000)));
        let t: Vec<i64> = (0..8).collect();
        admit_all(&mut p, "a", &t);
        admit_all(&mut p, "b", &t);
        assert_eq!(p.query_instance("10.0.0.1").as_deref(), Some("a"));
        assert_eq!(p.query_instance("10.0.0.2:8000").as_deref(), Some("b"));
        assert_eq!(p.query_instance("10.0.0.3"), None);
        assert_eq!(p.workers().len(), 2);
        p.apply(WorkerMsg::DeRegister {
            instance_id: "a".into(),
            worker_id: 0,
            ip: "10.0.0.1".into(),
            port: 8000,
        });
        assert_eq!(p.query_instance("10.0.0.1"), None);
        assert_eq!(layout(&p, &t), [("b".to_string(), 8)]);
        assert_eq!(p.workers(), [reg("b", "10.0.0.2", 8000)]);
        // Two engines on one host: the IP maps to the last one, ip:port to each.
        p.apply(WorkerMsg::Register(reg("c", "10.0.0.2", 8001)));
        assert_eq!(p.query_instance("10.0.0.2").as_deref(), Some("c"));
        assert_eq!(p.query_instance("10.0.0.2:8000").as_deref(), Some("b"));
    }
}
