//! One engine's LoRA adapter slots, modelled on vLLM with `--enable-lora --max-loras N` (and
//! on the mock engine's model of it): at most `max_loras` adapters run at once (have
//! requests holding a slot), the GPU keeps the `max_loras` most recently used adapters, and
//! bringing in one it does not hold is a *slot load* that delays the request by
//! `load_delay`.
//!
//! - A request for a running adapter joins it (once that adapter's load is done).
//! - One for another adapter takes a free slot: if the GPU holds the adapter it runs at
//!   once, else it is loaded, evicting the least recently used adapter with no running
//!   request.
//! - When every slot holds an adapter with running requests, it waits (FIFO); a slot freed
//!   goes to the first waiting request, and the waiting requests for the adapter that took
//!   it join.
//!
//! Owns the slot state, the waiting list and the load counter; it must not time prefill or
//! decode (the [`crate::engine`] does) nor read a clock (times come in as offsets).

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

/// Adapter slots and load cost of one engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoraParams {
    /// Adapters that run at once (vLLM's `--max-loras`).
    pub max_loras: usize,
    /// Time a slot load adds before the request's prefill.
    #[serde(serialize_with = "ser_ms")]
    pub load_delay: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// An adapter the GPU holds.
#[derive(Debug, Clone, Copy)]
struct Resident {
    adapter: u32,
    /// Requests holding its slot (0: idle, may be evicted).
    running: usize,
    /// When its load is done (requests for it start no earlier).
    ready: Duration,
}

/// The adapter slots of one engine.
#[derive(Debug)]
pub struct AdapterSlots {
    params: LoraParams,
    /// Adapters held by the GPU, least recently used first (an adapter counts as used
    /// until its last running request finishes).
    resident: VecDeque<Resident>,
    /// Requests waiting for a slot, oldest first: (request id, adapter).
    waiting: VecDeque<(usize, u32)>,
    loads: u64,
}

impl AdapterSlots {
    pub fn new(params: LoraParams) -> Self {
        let params = LoraParams {
            max_loras: params.max_loras.max(1),
            ..params
        };
        AdapterSlots {
            params,
            resident: VecDeque::with_capacity(params.max_loras + 1),
            waiting: VecDeque::new(),
            loads: 0,
        }
    }

    pub fn params(&self) -> LoraParams {
        self.params
    }

    /// Slot loads so far.
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// Requests waiting for a slot.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    fn running_count(&self) -> usize {
        self.resident.iter().filter(|r| r.running > 0).count()
    }

    /// Adapters with running requests, in slot order.
    pub fn running(&self) -> impl Iterator<Item = u32> + '_ {
        self.resident
            .iter()
            .filter(|r| r.running > 0)
            .map(|r| r.adapter)
    }

    /// Adapters with requests waiting for a slot, each once, oldest first.
    pub fn waiting(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for &(_, a) in &self.waiting {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }

    /// Runs a request for `adapter` at `now` if a slot allows: when it may start.
    fn try_run(&mut self, adapter: u32, now: Duration) -> Option<Duration> {
        if let Some(r) = self
            .resident
            .iter_mut()
            .find(|r| r.adapter == adapter && r.running > 0)
        {
            r.running += 1;
            return Some(r.ready.max(now));
        }
        if self.running_count() >= self.params.max_loras {
            return None;
        }
        if let Some(r) = self.resident.iter_mut().find(|r| r.adapter == adapter) {
            r.running = 1;
            return Some(r.ready.max(now));
        }
        // A slot load: evict the least recently used idle adapter when the GPU is full.
        if self.resident.len() >= self.params.max_loras {
            let i = self
                .resident
                .iter()
                .position(|r| r.running == 0)
                .expect("fewer running adapters than slots: one is idle");
            self.resident.remove(i);
        }
        let ready = now + self.params.load_delay;
        self.resident.push_back(Resident {
            adapter,
            running: 1,
            ready,
        });
        self.loads += 1;
        Some(ready)
    }

    /// Request `id` for `adapter` arrives at `now`: when it may start, or `None` when it
    /// waits for a slot (it is handed out by a later [`Self::release`]).
    pub fn acquire(&mut self, id: usize, adapter: u32, now: Duration) -> Option<Duration> {
        let got = self.try_run(adapter, now);
        if got.is_none() {
            self.waiting.push_back((id, adapter));
        }
        got
    }

    /// A request for `adapter` finished at `now`: the waiting requests that got a slot,
    /// with when each may start.
    pub fn release(&mut self, adapter: u32, now: Duration) -> Vec<(usize, Duration)> {
        let i = self
            .resident
            .iter()
            .position(|r| r.adapter == adapter && r.running > 0)
            .expect("a finishing request holds its adapter's slot");
        self.resident[i].running -= 1;
        if self.resident[i].running > 0 {
            return Vec::new();
        }
        // Idle now: the most recently used.
        let r = self.resident.remove(i).expect("present");
        self.resident.push_back(r);
        let mut started = Vec::new();
        let mut k = 0;
        while k < self.waiting.len() {
            let (id, a) = self.waiting[k];
            match self.try_run(a, now) {
                Some(ready) => {
                    self.waiting.remove(k);
                    started.push((id, ready));
                }
                None => k += 1,
            }
        }
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn slots(max: usize) -> AdapterSlots {
        AdapterSlots::new(LoraParams {
            max_loras: max,
            load_delay: ms(200),
        })
    }

    #[test]
    fn join_take_wait_and_evict_the_least_recently_used_idle_adapter() {
        let mut s = slots(2);
        assert_eq!(s.acquire(0, 1, ms(0)), Some(ms(200)), "a load");
        assert_eq!(s.acquire(1, 1, ms(50)), Some(ms(200)), "joins once loaded");
        assert_eq!(s.acquire(2, 2, ms(60)), Some(ms(260)));
        assert_eq!(s.acquire(3, 3, ms(70)), None, "both slots run");
        assert_eq!(s.waiting(), vec![3]);
        assert_eq!(s.running().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s.release(1, ms(300)), vec![], "adapter 1 still runs");
        // Adapter 2 goes idle: 3 takes the slot and evicts 2 (1 still runs).
        assert_eq!(s.release(2, ms(400)), vec![(3, ms(600))]);
        assert_eq!(s.loads(), 3);
        assert_eq!(s.waiting_len(), 0);
        // 1 goes idle, then 2 comes back: 1 is the least recently used idle one.
        assert_eq!(s.release(1, ms(700)), vec![]);
        assert_eq!(s.release(3, ms(800)), vec![]);
        assert_eq!(s.acquire(4, 2, ms(900)), Some(ms(1100)));
        assert_eq!(s.acquire(5, 3, ms(900)), Some(ms(900)), "3 is still held");
        assert_eq!(s.loads(), 4);
    }

    #[test]
    fn a_freed_slot_goes_to_the_first_waiter_and_its_adapter_joins() {
        let mut s = slots(1);
        assert_eq!(s.acquire(0, 1, ms(0)), Some(ms(200)));
        assert_eq!(s.acquire(1, 2, ms(1)), None);
        assert_eq!(s.acquire(2, 3, ms(2)), None);
        assert_eq!(s.acquire(3, 2, ms(3)), None);
        assert_eq!(s.waiting(), vec![2, 3]);
        assert_eq!(s.release(1, ms(500)), vec![(1, ms(700)), (3, ms(700))]);
        assert_eq!(s.waiting(), vec![3]);
    }
}
