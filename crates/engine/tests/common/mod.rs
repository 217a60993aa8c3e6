//! What the KV-event tests share: the reference fixture's payload and decoding helpers.
#![allow(dead_code)]

use rolter_engine::kv::events::{decode_batch, EventBatch};

/// The payload of `fixtures/kv_events_examples.txt` (ts=1718000000.5; two blocks stored, one
/// removed, then a clear; dp=0).
pub const FIXTURE: &str = "93cb41d999a6602000009398ab426c6f636b53746f72656492cf2ceabcfae6d332eacf26470bbec927f5bfc0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c093ac426c6f636b52656d6f76656491cf26470bbec927f5bfa347505591b0416c6c426c6f636b73436c656172656400";

pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

pub fn decode(payload: &[u8]) -> EventBatch {
    let mut b = EventBatch::new();
    decode_batch(payload, &mut b).unwrap();
    b
}
