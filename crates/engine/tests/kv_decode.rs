//! KV-event decoding against the reference fixture and hand-built payloads of every layout,
//! and malformed input.

mod common;
use common::{decode, hex, FIXTURE};
use rmp::encode as enc;
use rolter_engine::kv::events::{
    decode_batch, decode_message, BlockStored, DecodeError, EventBatch, KvEvent, Medium,
};

const BLOCK0: u64 = 3236607068019569386;
const BLOCK1: u64 = 2758186210834249151;

/// A msgpack value to encode.
#[derive(Debug, Clone)]
enum V {
    Nil,
    U(u64),
    I(i64),
    F(f64),
    S(&'static str),
    B(Vec<u8>),
    A(Vec<V>),
    M(Vec<(V, V)>),
    /// Pre-encoded bytes.
    Raw(Vec<u8>),
}

use V::*;

fn encode(v: &V, out: &mut Vec<u8>) {
    match v {
        Nil => enc::write_nil(out).unwrap(),
        U(x) => {
            enc::write_uint(out, *x).unwrap();
        }
        I(x) => {
            enc::write_sint(out, *x).unwrap();
        }
        F(x) => enc::write_f64(out, *x).unwrap(),
        S(x) => enc::write_str(out, x).unwrap(),
        B(x) => enc::write_bin(out, x).unwrap(),
        A(items) => {
            enc::write_array_len(out, items.len() as u32).unwrap();
            items.iter().for_each(|i| encode(i, out));
        }
        M(pairs) => {
            enc::write_map_len(out, pairs.len() as u32).unwrap();
            for (k, v) in pairs {
                encode(k, out);
                encode(v, out);
            }
        }
        Raw(bytes) => out.extend_from_slice(bytes),
    }
}

fn bytes(v: &V) -> Vec<u8> {
    let mut out = Vec::new();
    encode(v, &mut out);
    out
}

fn ints(values: impl IntoIterator<Item = u64>) -> V {
    A(values.into_iter().map(U).collect())
}

/// `[ts, events]` plus the trailing header fields given.
fn batch(events: Vec<V>, rest: Vec<V>) -> Vec<u8> {
    let mut fields = vec![F(1.25), A(events)];
    fields.extend(rest);
    bytes(&A(fields))
}

fn stored(b: &EventBatch, i: usize) -> BlockStored<'_> {
    match b.events().nth(i) {
        Some(KvEvent::BlockStored(s)) => s,
        other => panic!("event {i} is {other:?}"),
    }
}

/// A v0.9 BlockStored (6 fields): tag, hashes, parent, tokens, block_size, lora_id.
fn v09(hashes: V, parent: V, tokens: V, lora_id: V) -> Vec<V> {
    vec![S("BlockStored"), hashes, parent, tokens, U(16), lora_id]
}

#[test]
fn fixture_payload_decodes() {
    let payload = hex(FIXTURE);
    assert_eq!(payload.len(), 133);
    let mut b = EventBatch::new();
    let topic = b"kv@10.0.0.5:8000@Qwen/Qwen3-8B";
    let seq = 0u64.to_be_bytes();
    let head = decode_message(&[&topic[..], &seq[..], &payload[..]], &mut b).unwrap();
    assert_eq!((head.topic, head.seq), (&topic[..], 0));
    assert!(!head.is_replay_end());
    assert_eq!(b.ts, 1718000000.5);
    assert_eq!(b.data_parallel_rank, Some(0));
    assert_eq!((b.len(), b.unknown_events), (3, 0));
    let events: Vec<_> = b.events().collect();
    let tokens: Vec<u32> = (1..=32).collect();
    assert_eq!(
        events[0],
        KvEvent::BlockStored(BlockStored {
            block_hashes: &[BLOCK0, BLOCK1],
            parent_block_hash: None,
            token_ids: &tokens,
            block_size: 16,
            lora_id: None,
            medium: Some(Medium::Gpu),
            lora_name: None,
            ..Default::default()
        })
    );
    match events[1] {
        KvEvent::BlockRemoved(r) => {
            assert_eq!(r.block_hashes, [BLOCK1]);
            assert_eq!(r.medium, Some(Medium::Gpu));
            assert_eq!(r.group_idx, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events[2], KvEvent::AllBlocksCleared { medium: None });
}

fn sha256(data: &[u8]) -> [u8; 32] {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .try_into()
        .unwrap()
}

/// Canonical CBOR of vLLM's `(parent_hash, tuple(tokens), None)`.
fn cbor_block(parent: &[u8; 32], tokens: &[u32]) -> Vec<u8> {
    let mut out = vec![0x83, 0x58, 0x20];
    out.extend_from_slice(parent);
    assert!(tokens.len() < 24);
    out.push(0x80 + tokens.len() as u8);
    for &t in tokens {
        match t {
            0..=23 => out.push(t as u8),
            24..=255 => out.extend_from_slice(&[0x18, t as u8]),
            _ => unreachable!(),
        }
    }
    out.push(0xf6);
    out
}

fn low64(digest: &[u8; 32]) -> u64 {
    u64::from_be_bytes(digest[24..].try_into().unwrap())
}

/// The fixture's hash vectors (sha256_cbor): recomputed here, and their int form is what
/// the decoder makes of the 32-byte `bin` form.
#[test]
fn fixture_hash_vectors() {
    let vectors = [
        (
            &b"0"[..],
            "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
            "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea",
            "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf",
            (BLOCK0, BLOCK1),
        ),
        (
            &b"vllm-none-hash"[..],
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
            "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682",
            "2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf",
            (8866452693264111234, 807986237951177663),
        ),
    ];
    let first: Vec<u32> = (1..=16).collect();
    let second: Vec<u32> = (17..=32).collect();
    for (seed, none, b0, b1, (i0, i1)) in vectors {
        let mut cbor_seed = vec![0x60 + seed.len() as u8];
        cbor_seed.extend_from_slice(seed);
        let none_hash = sha256(&cbor_seed);
        assert_eq!(none_hash.to_vec(), hex(none));
        let block0 = sha256(&cbor_block(&none_hash, &first));
        assert_eq!(block0.to_vec(), hex(b0));
        let block1 = sha256(&cbor_block(&block0, &second));
        assert_eq!(block1.to_vec(), hex(b1));
        assert_eq!((low64(&block0), low64(&block1)), (i0, i1));

        // The bin form decodes to the int form.
        let ev = v09(
            A(vec![B(block0.to_vec()), B(block1.to_vec())]),
            Nil,
            ints(1..=32),
            Nil,
        );
        let b = decode(&batch(vec![A(ev)], vec![]));
        assert_eq!(stored(&b, 0).block_hashes, [i0, i1]);
    }
    let input = cbor_block(&sha256(&[0x61, 0x30]), &first);
    assert_eq!(input, hex("8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e900102030405060708090a0b0c0d0e0f10f6"));
}

#[test]
fn hashes_in_every_integer_width_and_bin() {
    let mut w = Vec::new();
    enc::write_array_len(&mut w, 8).unwrap();
    enc::write_pfix(&mut w, 5).unwrap();
    enc::write_u8(&mut w, 5).unwrap();
    enc::write_u16(&mut w, 5).unwrap();
    enc::write_u32(&mut w, 5).unwrap();
    enc::write_u64(&mut w, 5).unwrap();
    enc::write_i64(&mut w, -2).unwrap();
    enc::write_i8(&mut w, -2).unwrap();
    enc::write_u64(&mut w, u64::MAX).unwrap();
    let hashes = Raw(w);
    let parent = B(vec![1, 2, 3]);
    let ev = v09(hashes, parent, ints((0..128).map(|i| i % 7)), Nil);
    let b = decode(&batch(vec![A(ev)], vec![]));
    let s = stored(&b, 0);
    let m2 = (-2i64) as u64;
    assert_eq!(s.block_hashes, [5, 5, 5, 5, 5, m2, m2, u64::MAX]);
    assert_eq!(s.parent_block_hash, Some(0x010203));

    // 40 bytes: the last 8 count.
    let mut long = vec![0xee; 32];
    long.extend_from_slice(&7u64.to_be_bytes());
    let ev = v09(A(vec![B(long)]), Nil, ints(0..16), Nil);
    assert_eq!(
        stored(&decode(&batch(vec![A(ev)], vec![])), 0).block_hashes,
        [7]
    );

    for bad in [B(vec![]), S("abc"), F(1.0), Nil] {
        let ev = v09(A(vec![bad.clone()]), Nil, ints(0..16), Nil);
        let mut out = EventBatch::new();
        let err = decode_batch(&batch(vec![A(ev)], vec![]), &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Range {
                    field: "block_hashes",
                    ..
                } | DecodeError::Type {
                    field: "block_hashes",
                    ..
                }
            ),
            "{bad:?}: {err:?}"
        );
        assert!(out.is_empty());
    }
}

#[test]
fn v0_9_layout_without_rank() {
    let ev = v09(ints([1, 2]), Nil, ints(1..=32), Nil);
    let removed = A(vec![S("BlockRemoved"), ints([2])]);
    let b = decode(&batch(vec![A(ev), removed], vec![]));
    assert_eq!(b.data_parallel_rank, None);
    let s = stored(&b, 0);
    assert_eq!(
        (s.block_hashes, s.block_size, s.medium, s.lora_id),
        (&[1, 2][..], 16, None, None)
    );
    assert_eq!(
        (s.lora_name, s.extra_digests, s.group_idx),
        (None, None, None)
    );
    let second = b.events().nth(1).unwrap();
    match second {
        KvEvent::BlockRemoved(r) => assert_eq!((r.block_hashes, r.medium), (&[2][..], None)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn v0_10_layout_with_medium() {
    let mut ev = v09(ints([1]), U(99), ints(0..16), U(4));
    ev.push(S("CPU"));
    let removed = A(vec![S("BlockRemoved"), ints([1]), S("cpu")]);
    let b = decode(&batch(vec![A(ev), removed], vec![U(1)]));
    let s = stored(&b, 0);
    assert_eq!(
        (s.parent_block_hash, s.lora_id, s.medium),
        (Some(99), Some(4), Some(Medium::Cpu))
    );
    assert_eq!(b.data_parallel_rank, Some(1));
    let second = b.events().nth(1).unwrap();
    match second {
        KvEvent::BlockRemoved(r) => assert_eq!(r.medium, Some(Medium::Cpu)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn current_layout_with_extra_keys_groups_and_unknown_trailing_fields() {
    let extra = A(vec![
        A(vec![S("sql"), S("salt-1")]),
        A(vec![S("sql"), A(vec![S("mm-hash"), U(0)])]),
        Nil,
        A(vec![S("sql"), B(vec![1, 2, 3])]),
    ]);
    let ev = vec![
        S("BlockStored"),
        ints([1, 2, 3, 4]),
        Nil,
        ints(0..64),
        U(16),
        Nil,
        S("GPU"),
        S("sql"),
        extra,
        U(1),
        S("full_attention"),
        U(4096),
        S("LOCAL"),
        M(vec![(S("future"), A(vec![Nil, U(1)]))]),
    ];
    let removed = A(vec![
        S("BlockRemoved"),
        ints([3]),
        S("GPU"),
        U(1),
        S("LOCAL"),
    ]);
    let b = decode(&batch(
        vec![A(ev), removed],
        vec![U(0), S("future header field")],
    ));
    let s = stored(&b, 0);
    assert_eq!(
        (s.lora_name, s.cache_salt, s.group_idx),
        (Some("sql"), Some("salt-1"), Some(1))
    );
    assert_eq!(
        (s.kv_cache_spec_kind, s.kv_cache_spec_sliding_window),
        (Some("full_attention"), Some(4096))
    );
    let d = s.extra_digests.unwrap();
    assert_eq!(d.len(), 4);
    assert_eq!(
        (d[0], d[2]),
        (0, 0),
        "LoRA name and salt are not opaque extras"
    );
    assert!(d[1] != 0 && d[3] != 0 && d[1] != d[3]);
    let second = b.events().nth(1).unwrap();
    match second {
        KvEvent::BlockRemoved(r) => assert_eq!((r.block_hashes, r.group_idx), (&[3][..], Some(1))),
        other => panic!("{other:?}"),
    }

    // With a parent, a string in the first block is not the request's salt.
    let ev = vec![
        S("BlockStored"),
        ints([5]),
        U(4),
        ints(0..16),
        U(16),
        Nil,
        Nil,
        Nil,
        A(vec![A(vec![S("x")])]),
    ];
    let b = decode(&batch(vec![A(ev)], vec![]));
    let s = stored(&b, 0);
    assert_eq!(s.cache_salt, None);
    assert_ne!(s.extra_digests.unwrap()[0], 0);
}

#[test]
fn sglang_layout_with_attn_dp_rank() {
    let ev = v09(ints([10, 11]), Nil, ints(0..32), U(7));
    let b = decode(&batch(vec![A(ev)], vec![U(2)]));
    assert_eq!(b.data_parallel_rank, Some(2));
    let s = stored(&b, 0);
    assert_eq!((s.lora_id, s.lora_name, s.medium), (Some(7), None, None));
}

#[test]
fn nil_and_missing_optional_fields() {
    let ev = vec![
        S("BlockStored"),
        ints([1]),
        Nil,
        ints(0..16),
        U(16),
        Nil,
        Nil,
        Nil,
        Nil,
        Nil,
    ];
    let cleared = A(vec![S("AllBlocksCleared"), S("CPU")]);
    let b = decode(&batch(
        vec![A(ev), cleared, A(vec![S("AllBlocksCleared")])],
        vec![Nil],
    ));
    assert_eq!(b.data_parallel_rank, None);
    let s = stored(&b, 0);
    assert_eq!(
        (s.parent_block_hash, s.medium, s.lora_name, s.extra_digests),
        (None, None, None, None)
    );
    let events: Vec<_> = b.events().collect();
    assert_eq!(
        events[1],
        KvEvent::AllBlocksCleared {
            medium: Some(Medium::Cpu)
        }
    );
    assert_eq!(events[2], KvEvent::AllBlocksCleared { medium: None });
    // An empty batch.
    assert!(decode(&batch(vec![], vec![])).is_empty());
}

#[test]
fn map_form_events_and_typed_extra_keys() {
    let typed = A(vec![A(vec![
        M(vec![(S("type"), S("LoRAKey")), (S("name"), S("sql"))]),
        M(vec![
            (S("type"), S("CacheSaltKey")),
            (S("salt"), S("s-map")),
        ]),
        M(vec![
            (S("type"), S("MultiModalKey")),
            (S("hash"), S("h")),
            (S("block_offset"), U(0)),
        ]),
    ])]);
    let ev = M(vec![
        (S("block_hashes"), ints([1])),
        (S("extra_keys"), typed),
        (S("type"), S("BlockStored")),
        (S("parent_block_hash"), Nil),
        (S("token_ids"), ints(0..16)),
        (S("block_size"), U(16)),
        (S("lora_id"), Nil),
        (S("medium"), S("GPU")),
        (S("lora_name"), S("sql")),
        (S("event_version"), U(1)),
        (U(5), S("a non-string key")),
        (S("group_idx"), U(2)),
    ]);
    let removed = M(vec![
        (S("type"), S("BlockRemoved")),
        (S("block_hashes"), ints([1])),
        (S("medium"), Nil),
    ]);
    let unknown = M(vec![
        (S("type"), S("BlockTransferred")),
        (S("block_hashes"), ints([1])),
    ]);
    let b = decode(&batch(vec![ev, removed, unknown], vec![]));
    assert_eq!((b.len(), b.unknown_events), (2, 1));
    let s = stored(&b, 0);
    assert_eq!(
        (s.lora_name, s.cache_salt, s.group_idx),
        (Some("sql"), Some("s-map"), Some(2))
    );
    assert_ne!(
        s.extra_digests.unwrap()[0],
        0,
        "the multimodal key is opaque"
    );

    // Typed keys in array form.
    let typed = A(vec![A(vec![
        A(vec![S("CacheSaltKey"), S("s-arr")]),
        A(vec![S("LoRAKey"), S("sql")]),
    ])]);
    let ev = vec![
        S("BlockStored"),
        ints([1]),
        Nil,
        ints(0..16),
        U(16),
        Nil,
        Nil,
        S("sql"),
        typed,
    ];
    let b = decode(&batch(vec![A(ev)], vec![]));
    let s = stored(&b, 0);
    assert_eq!(
        (s.cache_salt, s.extra_digests),
        (Some("s-arr"), Some(&[0][..]))
    );

    let no_type = M(vec![(S("block_hashes"), ints([1]))]);
    let mut out = EventBatch::new();
    let err = decode_batch(&batch(vec![no_type], vec![]), &mut out).unwrap_err();
    assert_eq!(err, DecodeError::Missing("event type"));
}

#[test]
fn unknown_tags_are_skipped_and_counted() {
    let events = vec![
        A(vec![
            S("TierBlocksCleared"),
            S("CPU"),
            M(vec![(S("x"), ints([1, 2]))]),
        ]),
        A(v09(ints([1]), Nil, ints(0..16), Nil)),
        A(vec![S("SomethingNew")]),
    ];
    let b = decode(&batch(events, vec![]));
    assert_eq!((b.len(), b.unknown_events), (1, 2));
    assert_eq!(stored(&b, 0).block_hashes, [1]);
}

/// Whether an error is the one expected.
type Check = fn(&DecodeError) -> bool;

#[test]
fn malformed_payloads_are_typed_errors() {
    let good = v09(ints([1]), Nil, ints(0..16), Nil);
    let with = |f: &dyn Fn(&mut Vec<V>)| {
        let mut ev = good.clone();
        f(&mut ev);
        batch(vec![A(ev)], vec![])
    };
    let cases: Vec<(Vec<u8>, Check)> = vec![
        (with(&|e| e[3] = A(vec![I(-1)])), |e| {
            matches!(
                e,
                DecodeError::Range {
                    field: "token_ids",
                    ..
                }
            )
        }),
        (with(&|e| e[3] = A(vec![U(1 << 32)])), |e| {
            matches!(
                e,
                DecodeError::Range {
                    field: "token_ids",
                    ..
                }
            )
        }),
        (with(&|e| e[4] = S("16")), |e| {
            matches!(
                e,
                DecodeError::Type {
                    field: "block_size",
                    ..
                }
            )
        }),
        (with(&|e| e[0] = U(1)), |e| {
            matches!(
                e,
                DecodeError::Type {
                    field: "event tag",
                    ..
                }
            )
        }),
        (with(&|e| e.truncate(4)), |e| {
            *e == DecodeError::Missing("block_size")
        }),
        (with(&|e| e.push(Raw(vec![0xa2, 0xff, 0xfe]))), |e| {
            matches!(
                e,
                DecodeError::Utf8 {
                    field: "medium",
                    ..
                }
            )
        }),
        (with(&|e| e.push(Raw(vec![0xc1]))), |e| {
            matches!(
                e,
                DecodeError::Type {
                    field: "medium",
                    marker: 0xc1,
                    ..
                }
            )
        }),
        (batch(vec![U(3)], vec![]), |e| {
            matches!(e, DecodeError::Type { field: "event", .. })
        }),
        (batch(vec![A(vec![])], vec![]), |e| {
            *e == DecodeError::Missing("event tag")
        }),
        (bytes(&A(vec![F(1.0)])), |e| {
            *e == DecodeError::Missing("EventBatch.events")
        }),
        (bytes(&M(vec![])), |e| {
            matches!(
                e,
                DecodeError::Type {
                    field: "EventBatch",
                    ..
                }
            )
        }),
        (bytes(&A(vec![S("x"), A(vec![])])), |e| {
            matches!(e, DecodeError::Type { field: "ts", .. })
        }),
        ([batch(vec![], vec![]), vec![0]].concat(), |e| {
            *e == DecodeError::Trailing(1)
        }),
        (vec![], |e| *e == DecodeError::Truncated(0)),
        // An array claiming 2^32-1 events in a few bytes.
        (
            vec![
                0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x91,
            ],
            |e| matches!(e, DecodeError::Truncated(_) | DecodeError::Missing(_)),
        ),
    ];
    for (i, (payload, check)) in cases.iter().enumerate() {
        let mut out = decode(&hex(FIXTURE));
        let err = decode_batch(payload, &mut out).unwrap_err();
        assert!(check(&err), "case {i}: {err:?}");
        assert!(out.is_empty() && out.unknown_events == 0, "case {i}");
        assert!(!err.to_string().is_empty());
    }

    // Nesting deeper than MAX_DEPTH in a skipped field.
    let deep = [vec![0x91; 100], vec![0xc0]].concat();
    let payload = with(&|e| {
        e.truncate(6);
        e.extend([Nil, Nil, Nil, Nil, Nil, Nil, Raw(deep.clone())]);
    });
    let mut out = EventBatch::new();
    assert!(matches!(
        decode_batch(&payload, &mut out),
        Err(DecodeError::TooDeep(_))
    ));

    // Every strict prefix of a valid payload is an error.
    let fixture = hex(FIXTURE);
    for n in 0..fixture.len() {
        assert!(decode_batch(&fixture[..n], &mut out).is_err(), "prefix {n}");
    }
}

#[test]
fn message_frames() {
    let payload = hex(FIXTURE);
    let mut b = EventBatch::new();
    let seq = 7u64.to_be_bytes();
    let err = decode_message(&[&payload[..]], &mut b).unwrap_err();
    assert_eq!(err, DecodeError::FrameCount(1));
    let err = decode_message(&[&b"t"[..], &seq[..7], &payload[..]], &mut b).unwrap_err();
    assert_eq!(err, DecodeError::SeqLength(7));
    // A replay reply: [seq, payload], then the end marker.
    let head = decode_message(&[&seq[..], &payload[..]], &mut b).unwrap();
    assert_eq!((head.seq, head.topic, b.len()), (7, &b""[..], 3));
    let end = u64::MAX.to_be_bytes();
    let head = decode_message(&[&end[..], &b""[..]], &mut b).unwrap();
    assert!(head.is_replay_end() && b.is_empty());
}

#[test]
fn batches_are_reused() {
    let mut b = EventBatch::new();
    decode_batch(&hex(FIXTURE), &mut b).unwrap();
    let small = batch(vec![A(v09(ints([42]), Nil, ints(100..116), Nil))], vec![]);
    decode_batch(&small, &mut b).unwrap();
    assert_eq!(b.len(), 1);
    let s = stored(&b, 0);
    assert_eq!(
        (s.block_hashes, s.token_ids[0], s.medium),
        (&[42][..], 100, None)
    );
}

/// Random mutations of valid payloads never panic, and a failed decode leaves the batch
/// empty.
#[test]
fn mutated_payloads_never_panic() {
    let extra = A(vec![
        A(vec![S("sql"), S("salt"), A(vec![S("mm"), U(3)])]),
        Nil,
    ]);
    let current = vec![
        S("BlockStored"),
        A(vec![B(vec![7; 32]), U(u64::MAX)]),
        I(-5),
        ints(0..32),
        U(16),
        U(1),
        S("GPU"),
        S("sql"),
        extra,
        U(0),
        S("full_attention"),
        Nil,
    ];
    let map = M(vec![
        (S("type"), S("BlockRemoved")),
        (S("block_hashes"), ints([1, 2])),
    ]);
    let seeds = [
        hex(FIXTURE),
        batch(
            vec![A(current), map, A(vec![S("AllBlocksCleared")])],
            vec![U(3)],
        ),
        batch(vec![A(v09(ints([1, 2]), Nil, ints(0..32), Nil))], vec![]),
    ];
    let mut rng = fastrand::Rng::with_seed(0x6b76);
    let mut out = EventBatch::new();
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..30_000 {
        let mut p = seeds[rng.usize(..seeds.len())].clone();
        for _ in 0..rng.usize(1..=4) {
            if p.is_empty() {
                break;
            }
            let i = rng.usize(..p.len());
            match rng.u8(..6) {
                0 => p[i] ^= 1 << rng.u8(..8),
                1 => p[i] = rng.u8(..),
                2 => p.truncate(i),
                3 => p.insert(i, rng.u8(..)),
                4 => {
                    p.remove(i);
                }
                _ => {
                    p[i] = [0xc0, 0xc1, 0xdc, 0xdd, 0xde, 0xdf, 0xdb, 0xc6, 0xff, 0x00]
                        [rng.usize(..10)]
                }
            }
        }
        match decode_batch(&p, &mut out) {
            Ok(()) => {
                ok += 1;
                for ev in out.events() {
                    if let KvEvent::BlockStored(s) = ev {
                        let _ = (
                            s.block_hashes.len(),
                            s.token_ids.len(),
                            s.lora_name,
                            s.cache_salt,
                        );
                    }
                }
            }
            Err(_) => {
                failed += 1;
                assert!(out.is_empty());
            }
        }
    }
    assert!(ok > 100 && failed > 100, "ok {ok}, failed {failed}");
}
