//! One engine of the disaggregated model, iteration by iteration: a GPU that runs one
//! iteration at a time, either the prefill of one request (serial, FIFO, cost per uncached
//! prompt token after an LRU prefix-cache lookup) or one decode step over its running batch
//! (a step's time grows with the batch, and running sequences hold KV memory up to a
//! bound). Its [`Role`] says which of the two it does: a prefill engine only prefills, a
//! decode engine only decodes what was transferred to it, a co-located engine does both,
//! and a prefill there stalls every running decode for its whole compute time (prefill
//! first, no chunking).
//!
//! It owns no clock and no routing: the caller starts an iteration ([`Node::start`]) when
//! the engine is idle, and completes it ([`Node::complete`]) at the end time it was told.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::engine::{PrefixCache, BLOCK_TOKENS};

/// What an engine does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Prefills only; the KV cache then goes to a decode engine.
    Prefill,
    /// Decodes requests prefilled elsewhere.
    Decode,
    /// Prefills and decodes its own requests.
    Colocated,
}

/// Timing and capacity of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NodeParams {
    /// Sequences decoding at once.
    pub max_running: usize,
    /// Prefix-cache capacity in blocks (prefill and co-located engines).
    pub cache_blocks: usize,
    /// KV memory for running sequences in blocks: a sequence holds its prompt and output
    /// blocks from admission to its last token (decode and co-located engines).
    pub kv_blocks: usize,
    /// Constant part of one prefill.
    #[serde(serialize_with = "ser_ms")]
    pub prefill_base: Duration,
    /// Prefill cost of one uncached prompt token.
    #[serde(serialize_with = "ser_ms")]
    pub prefill_per_token: Duration,
    /// Time of a decode step with one running sequence.
    #[serde(serialize_with = "ser_ms")]
    pub itl: Duration,
    /// What every further running sequence adds to a decode step.
    #[serde(serialize_with = "ser_ms")]
    pub itl_per_seq: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl NodeParams {
    /// The time of one decode step over `batch` sequences.
    pub fn step(&self, batch: usize) -> Duration {
        self.itl + self.itl_per_seq * batch.saturating_sub(1) as u32
    }

    /// The time of prefilling `uncached` prompt tokens.
    pub fn prefill(&self, uncached: u32) -> Duration {
        self.prefill_base + self.prefill_per_token * uncached
    }
}

/// One request as an engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub req: usize,
    pub blocks: Arc<[u64]>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

impl Job {
    /// KV blocks the sequence holds while it decodes (prompt and output).
    fn kv_need(&self) -> usize {
        (self.prompt_tokens + self.output_tokens.max(1)).div_ceil(BLOCK_TOKENS) as usize
    }
}

#[derive(Debug)]
struct Seq {
    req: usize,
    /// Tokens still to generate.
    left: u32,
    /// Whether it has produced its first token.
    started: bool,
    kv: usize,
}

#[derive(Debug)]
enum Busy {
    Prefill(Job),
    Decode,
}

/// An iteration just started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iteration {
    /// When it ends.
    pub end: Duration,
    /// The request it prefills, with its prompt tokens served from the prefix cache.
    pub prefill: Option<(usize, u32)>,
}

/// What an iteration produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// A prefill engine's finished prefill, ready for its KV transfer.
    pub prefilled: Option<Job>,
    /// Requests whose first token this iteration produced.
    pub first_tokens: Vec<usize>,
    /// Requests whose last token this iteration produced.
    pub finished: Vec<usize>,
}

/// One engine.
#[derive(Debug)]
pub struct Node {
    pub role: Role,
    pub params: NodeParams,
    pub cache: PrefixCache,
    prefill_queue: VecDeque<Job>,
    decode_wait: VecDeque<Job>,
    running: Vec<Seq>,
    kv_used: usize,
    busy: Option<Busy>,
    steps: u64,
}

impl Node {
    pub fn new(role: Role, params: NodeParams) -> Self {
        Node {
            role,
            params,
            cache: PrefixCache::new(params.cache_blocks),
            prefill_queue: VecDeque::new(),
            decode_wait: VecDeque::new(),
            running: Vec::new(),
            kv_used: 0,
            busy: None,
            steps: 0,
        }
    }

    /// A request to prefill (prefill and co-located engines).
    pub fn push_prefill(&mut self, job: Job) {
        debug_assert!(self.role != Role::Decode);
        self.prefill_queue.push_back(job);
    }

    /// A request whose KV cache arrived, to decode (decode engines).
    pub fn push_decode(&mut self, job: Job) {
        debug_assert!(self.role == Role::Decode);
        self.decode_wait.push_back(job);
    }

    /// Requests waiting: for a prefill, or for a decode slot and KV memory.
    pub fn queue_depth(&self) -> usize {
        self.prefill_queue.len() + self.decode_wait.len()
    }

    /// Sequences decoding.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Share of the KV memory running sequences hold, in [0, 1].
    pub fn kv_usage(&self) -> f32 {
        if self.params.kv_blocks == 0 {
            return 0.0;
        }
        (self.kv_used as f64 / self.params.kv_blocks as f64).min(1.0) as f32
    }

    pub fn is_busy(&self) -> bool {
        self.busy.is_some()
    }

    /// Decode steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Whether a sequence of `kv` blocks may start decoding now (a sequence larger than
    /// the whole memory runs alone rather than never).
    fn fits(&self, kv: usize) -> bool {
        self.running.len() < self.params.max_running
            && (self.kv_used + kv <= self.params.kv_blocks || self.running.is_empty())
    }

    /// Starts the next iteration at `now` if the engine is idle and has work.
    pub fn start(&mut self, now: Duration) -> Option<Iteration> {
        if self.busy.is_some() {
            return None;
        }
        let prefill_next = match self.role {
            Role::Prefill => !self.prefill_queue.is_empty(),
            Role::Decode => false,
            Role::Colocated => self
                .prefill_queue
                .front()
                .is_some_and(|j| self.fits(j.kv_need())),
        };
        if prefill_next {
            let job = self.prefill_queue.pop_front().expect("checked");
            let hit =
                (self.cache.matched(&job.blocks) as u32 * BLOCK_TOKENS).min(job.prompt_tokens);
            self.cache.touch(&job.blocks);
            if self.role == Role::Colocated {
                self.kv_used += job.kv_need();
            }
            let end = now + self.params.prefill(job.prompt_tokens - hit);
            let prefill = Some((job.req, hit));
            self.busy = Some(Busy::Prefill(job));
            return Some(Iteration { end, prefill });
        }
        while let Some(job) = self.decode_wait.front() {
            if !self.fits(job.kv_need()) {
                break;
            }
            let job = self.decode_wait.pop_front().expect("checked");
            let kv = job.kv_need();
            self.kv_used += kv;
            self.running.push(Seq {
                req: job.req,
                left: job.output_tokens.max(1),
                started: false,
                kv,
            });
        }
        if self.running.is_empty() {
            return None;
        }
        self.busy = Some(Busy::Decode);
        Some(Iteration {
            end: now + self.params.step(self.running.len()),
            prefill: None,
        })
    }

    /// Completes the iteration in progress.
    pub fn complete(&mut self) -> Outcome {
        let mut out = Outcome::default();
        match self.busy.take().expect("an iteration is in progress") {
            Busy::Prefill(job) if self.role == Role::Prefill => out.prefilled = Some(job),
            Busy::Prefill(job) => {
                // Co-located: the prefill produced the first token; the rest is decoded here.
                out.first_tokens.push(job.req);
                let kv = job.kv_need();
                match job.output_tokens.saturating_sub(1) {
                    0 => {
                        self.kv_used -= kv;
                        out.finished.push(job.req);
                    }
                    left => self.running.push(Seq {
                        req: job.req,
                        left,
                        started: true,
                        kv,
                    }),
                }
            }
            Busy::Decode => {
                self.steps += 1;
                for s in &mut self.running {
                    s.left -= 1;
                    if !s.started {
                        s.started = true;
                        out.first_tokens.push(s.req);
                    }
                    if s.left == 0 {
                        out.finished.push(s.req);
                    }
                }
                let mut freed = 0;
                self.running.retain(|s| {
                    if s.left == 0 {
                        freed += s.kv;
                    }
                    s.left > 0
                });
                self.kv_used -= freed;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> NodeParams {
        NodeParams {
            max_running: 4,
            cache_blocks: 100,
            kv_blocks: 20,
            prefill_base: Duration::from_millis(5),
            prefill_per_token: Duration::from_micros(100),
            itl: Duration::from_millis(10),
            itl_per_seq: Duration::from_millis(1),
        }
    }

    fn job(req: usize, blocks: &[u64], output: u32) -> Job {
        Job {
            req,
            blocks: blocks.into(),
            prompt_tokens: blocks.len() as u32 * BLOCK_TOKENS,
            output_tokens: output,
        }
    }

    #[test]
    fn a_prefill_engine_prefills_in_order_and_hits_its_cache() {
        let mut n = Node::new(Role::Prefill, params());
        n.push_prefill(job(0, &[1, 2, 3], 5));
        n.push_prefill(job(1, &[1, 2, 4], 5));
        let a = n.start(Duration::ZERO).unwrap();
        assert_eq!(a.prefill, Some((0, 0)));
        // 5 ms + 48 tokens × 0.1 ms.
        assert_eq!(a.end, Duration::from_micros(9800));
        assert!(n.start(a.end).is_none(), "busy");
        assert_eq!(n.complete().prefilled.unwrap().req, 0);
        let b = n.start(a.end).unwrap();
        assert_eq!(b.prefill, Some((1, 2 * BLOCK_TOKENS)));
        assert_eq!(b.end - a.end, Duration::from_micros(6600));
        assert_eq!(n.complete().prefilled.unwrap().req, 1);
        assert!(n.start(b.end).is_none(), "idle");
    }

    #[test]
    fn decode_steps_slow_with_the_batch_and_kv_bounds_it() {
        let mut n = Node::new(Role::Decode, params());
        // 3 blocks of prompt + 2 tokens: 4 blocks each; 20 blocks hold 5, slots hold 4.
        for r in 0..6 {
            n.push_decode(job(r, &[1, 2, 3], 2));
        }
        let it = n.start(Duration::ZERO).unwrap();
        assert_eq!(n.running(), 4);
        assert_eq!(n.queue_depth(), 2);
        assert_eq!(it.end, Duration::from_millis(13));
        let o = n.complete();
        assert_eq!(o.first_tokens, vec![0, 1, 2, 3]);
        assert!(o.finished.is_empty());
        n.start(it.end).unwrap();
        assert_eq!(n.complete().finished, vec![0, 1, 2, 3]);
        assert_eq!(n.kv_usage(), 0.0);
        let it = n.start(Duration::ZERO).unwrap();
        assert_eq!(it.end, Duration::from_millis(11));
        assert_eq!(n.steps(), 2);
    }

    #[test]
    fn a_colocated_prefill_stalls_its_running_decodes() {
        let mut n = Node::new(Role::Colocated, params());
        n.push_prefill(job(0, &[1], 3));
        let p = n.start(Duration::ZERO).unwrap();
        let o = n.complete();
        assert_eq!(o.first_tokens, vec![0]);
        assert_eq!(n.running(), 1);
        // A new prefill arrives: it runs before the next decode step.
        n.push_prefill(job(1, &[7, 8, 9, 10], 3));
        let q = n.start(p.end).unwrap();
        assert_eq!(q.prefill, Some((1, 0)));
        assert_eq!(q.end - p.end, Duration::from_micros(5000 + 6400));
        n.complete();
        let d = n.start(q.end).unwrap();
        assert_eq!(d.prefill, None);
        assert_eq!(d.end - q.end, Duration::from_millis(11));
        assert!(n.complete().first_tokens.is_empty());
        n.start(d.end).unwrap();
        assert_eq!(n.complete().finished, vec![0, 1]);
        assert_eq!(n.kv_usage(), 0.0);
    }
}
