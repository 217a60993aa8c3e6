use super::*;

fn t0() -> Instant {
    Instant::now()
}

fn toks(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

fn index(max: usize) -> (KvIndex, KvIndexReader) {
    let idx = KvIndex::new(KvIndexConfig {
        block_size: 16,
        max_blocks_per_target: max,
    })
    .unwrap();
    let reader = idx.reader();
    (idx, reader)
}

fn stored<'a>(hashes: &'a [u64], parent: Option<u64>, tokens: &'a [u32]) -> BlockStored<'a> {
    BlockStored {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: 16,
        ..Default::default()
    }
}

fn one(ev: BlockStored<'_>) -> EventBatch {
    let mut b = EventBatch::new();
    b.push_block_stored(&ev);
    b
}

fn removed(hashes: &[u64]) -> EventBatch {
    let mut b = EventBatch::new();
    b.push_block_removed(&BlockRemoved {
        block_hashes: hashes,
        ..Default::default()
    });
    b
}

fn scores(r: &KvIndexReader, space: KeySpace<'_>, tokens: &[u32], targets: &[u32]) -> Vec<u32> {
    let mut keys = Vec::new();
    r.request_keys(space, tokens, &mut keys);
    let mut out = vec![u32::MAX; targets.len()];
    r.longest_prefix(&keys, targets, &mut out);
    out
}

const BASE: KeySpace<'static> = KeySpace {
    lora_name: None,
    cache_salt: None,
};

#[test]
fn stored_blocks_score_their_prefix() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    let ok = idx.apply(0, 0, &one(stored(&[1, 2, 3, 4], None, &t)), t0());
    assert_eq!(ok, Ok(ApplyOutcome::Applied));
    idx.apply(1, 0, &one(stored(&[11, 12], None, &t[..32])), t0())
        .unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0, 1, 2]), [4, 2, 0]);
    // A partial tail is never keyed; a longer request still matches its prefix.
    assert_eq!(scores(&r, BASE, &t[..40], &[0, 1]), [2, 2]);
    let longer = toks(1, 100);
    assert_eq!(scores(&r, BASE, &longer, &[0, 1]), [4, 2]);
    // A different first token changes every key.
    let mut other = t.clone();
    other[0] = 999;
    assert_eq!(scores(&r, BASE, &other, &[0, 1]), [0, 0]);
    let st = idx.target_stats(0).unwrap();
    assert_eq!((st.engine_blocks, st.keys, st.next_seq), (4, 4, Some(1)));
}

#[test]
fn chained_events_continue_from_their_parent() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    idx.apply(0, 0, &one(stored(&[1, 2], None, &t[..32])), t0())
        .unwrap();
    idx.apply(0, 1, &one(stored(&[3, 4], Some(2), &t[32..])), t0())
        .unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [4]);
    // A parent this index never saw: the blocks cannot be keyed.
    idx.apply(0, 2, &one(stored(&[9], Some(777), &t[..16])), t0())
        .unwrap();
    assert_eq!(idx.target_stats(0).unwrap().counters.orphaned, 1);
}

#[test]
fn removal_makes_a_hole_that_stops_the_match() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    idx.apply(0, 0, &one(stored(&[1, 2, 3, 4], None, &t)), t0())
        .unwrap();
    idx.apply(0, 1, &removed(&[2]), t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
    idx.apply(0, 2, &removed(&[1]), t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [0]);
    let st = idx.target_stats(0).unwrap();
    assert_eq!((st.engine_blocks, st.keys), (2, 2));
    // Unknown hashes are ignored.
    idx.apply(0, 3, &removed(&[12345]), t0()).unwrap();
}

#[test]
fn clear_drops_everything_of_that_target_only() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 32);
    idx.apply(0, 0, &one(stored(&[1, 2], None, &t)), t0())
        .unwrap();
    idx.apply(1, 0, &one(stored(&[1, 2], None, &t)), t0())
        .unwrap();
    let mut b = EventBatch::new();
    b.push_all_blocks_cleared(None);
    idx.apply(0, 1, &b, t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0, 1]), [0, 2]);
    assert_eq!(idx.target_stats(0).unwrap().keys, 0);
    assert_eq!(r.slots(), 2);
}

#[test]
fn gaps_are_reported_and_repaired_by_replay_or_drop() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 48);
    let b0 = one(stored(&[1], None, &t[..16]));
    let b1 = one(stored(&[2], Some(1), &t[16..32]));
    let b2 = one(stored(&[3], Some(2), &t[32..]));
    assert_eq!(idx.apply(0, 0, &b0, t0()), Ok(ApplyOutcome::Applied));
    assert_eq!(
        idx.apply(0, 2, &b2, t0()),
        Ok(ApplyOutcome::Gap {
            expected: 1,
            got: 2
        })
    );
    assert_eq!(scores(&r, BASE, &t, &[0]), [1], "gap batch not applied");
    // Replay the missing batch, then the held one.
    assert_eq!(idx.apply(0, 1, &b1, t0()), Ok(ApplyOutcome::Applied));
    assert_eq!(idx.apply(0, 2, &b2, t0()), Ok(ApplyOutcome::Applied));
    assert_eq!(scores(&r, BASE, &t, &[0]), [3]);
    let c = idx.target_stats(0).unwrap().counters;
    assert_eq!((c.gaps, c.missed_batches, c.batches), (1, 1, 3));

    // Without replay: drop the target, then the next batch is a fresh start.
    let b9 = one(stored(&[1], None, &t[..16]));
    assert!(matches!(
        idx.apply(0, 9, &b9, t0()),
        Ok(ApplyOutcome::Gap {
            expected: 3,
            got: 9
        })
    ));
    idx.drop_target(0);
    assert_eq!(scores(&r, BASE, &t, &[0]), [0]);
    assert_eq!(idx.apply(0, 9, &b9, t0()), Ok(ApplyOutcome::Applied));
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
    assert_eq!(idx.target_stats(0).unwrap().counters.drops, 1);
}

#[test]
fn sequence_restart_is_a_reconnect() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 32);
    idx.apply(0, 0, &one(stored(&[1, 2], None, &t)), t0())
        .unwrap();
    idx.apply(0, 1, &EventBatch::new(), t0()).unwrap();
    // The publisher restarted: its new cache holds only block 7.
    let again = idx.apply(0, 0, &one(stored(&[7], None, &t[..16])), t0());
    assert_eq!(again, Ok(ApplyOutcome::Reset));
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
    let st = idx.target_stats(0).unwrap();
    assert_eq!(
        (st.engine_blocks, st.counters.resets, st.next_seq),
        (1, 1, Some(1))
    );
}

#[test]
fn lora_and_salt_separate_key_spaces() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 32);
    let mut ev = stored(&[1, 2], None, &t);
    ev.lora_name = Some("sql");
    idx.apply(0, 0, &one(ev), t0()).unwrap();
    let mut ev = stored(&[1, 2], None, &t);
    ev.cache_salt = Some("tenant-a");
    idx.apply(1, 0, &one(ev), t0()).unwrap();
    let mut ev = stored(&[1, 2], None, &t);
    ev.lora_id = Some(3);
    idx.apply(2, 0, &one(ev), t0()).unwrap();
    idx.apply(3, 0, &one(stored(&[1, 2], None, &t)), t0())
        .unwrap();
    let all = [0, 1, 2, 3];
    assert_eq!(scores(&r, BASE, &t, &all), [0, 0, 0, 2]);
    let lora = KeySpace {
        lora_name: Some("sql"),
        cache_salt: None,
    };
    assert_eq!(scores(&r, lora, &t, &all), [2, 0, 0, 0]);
    let other = KeySpace {
        lora_name: Some("chat"),
        cache_salt: None,
    };
    assert_eq!(scores(&r, other, &t, &all), [0, 0, 0, 0]);
    let salted = KeySpace {
        lora_name: None,
        cache_salt: Some("tenant-a"),
    };
    assert_eq!(scores(&r, salted, &t, &all), [0, 2, 0, 0]);
    let both = KeySpace {
        lora_name: Some("sql"),
        cache_salt: Some("tenant-a"),
    };
    assert_eq!(scores(&r, both, &t, &all), [0, 0, 0, 0]);
}

#[test]
fn opaque_extra_keys_keep_blocks_apart() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 48);
    let mut ev = stored(&[1, 2, 3], None, &t);
    ev.extra_digests = Some(&[0, 0xabc, 0]);
    idx.apply(0, 0, &one(ev), t0()).unwrap();
    // Block 1 carries an image: a text request matches block 0 only.
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
}

#[test]
fn engine_blocks_spanning_several_gateway_blocks() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    let mut ev = stored(&[1, 2], None, &t);
    ev.block_size = 32;
    idx.apply(0, 0, &one(ev), t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [4]);
    idx.apply(0, 1, &removed(&[2]), t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [2]);
    // 24 is not a multiple of 16; a token count that does not match is inconsistent.
    let mut ev = stored(&[5], None, &t[..24]);
    ev.block_size = 24;
    idx.apply(0, 2, &one(ev), t0()).unwrap();
    idx.apply(0, 3, &one(stored(&[6], None, &t[..20])), t0())
        .unwrap();
    assert_eq!(idx.target_stats(0).unwrap().counters.inconsistent, 2);
}

#[test]
fn tiers_and_groups_are_reference_counted() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 32);
    idx.apply(0, 0, &one(stored(&[1, 2], None, &t)), t0())
        .unwrap();
    // Offload copies block 2 to CPU (token-less re-announcement); an unknown block is
    // unresolved.
    let mut cpu = stored(&[2, 99], None, &[]);
    cpu.medium = Some(Medium::Cpu);
    idx.apply(0, 1, &one(cpu), t0()).unwrap();
    assert_eq!(idx.target_stats(0).unwrap().counters.unresolved, 1);
    idx.apply(0, 2, &removed(&[2]), t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [2], "still on CPU");
    let mut b = EventBatch::new();
    b.push_block_removed(&BlockRemoved {
        block_hashes: &[2],
        medium: Some(Medium::Cpu),
        group_idx: None,
    });
    idx.apply(0, 3, &b, t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);

    // The same blocks in two KV-cache groups: evicting one group keeps the keys.
    let mut g1 = stored(&[1], None, &t[..16]);
    g1.group_idx = Some(1);
    idx.apply(0, 4, &one(g1), t0()).unwrap();
    let mut b = EventBatch::new();
    b.push_block_removed(&BlockRemoved {
        block_hashes: &[1],
        medium: None,
        group_idx: Some(1),
    });
    idx.apply(0, 5, &b, t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
    // Clearing one tier leaves the others.
    let mut b = EventBatch::new();
    b.push_all_blocks_cleared(Some(Medium::Cpu));
    idx.apply(0, 6, &b, t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [1]);
    let mut b = EventBatch::new();
    b.push_all_blocks_cleared(Some(Medium::Gpu));
    idx.apply(0, 7, &b, t0()).unwrap();
    assert_eq!(scores(&r, BASE, &t, &[0]), [0]);
    assert_eq!(r.slots(), 0);
}

#[test]
fn bound_evicts_the_oldest_blocks() {
    let (mut idx, r) = index(100);
    let mut hashes = Vec::new();
    for i in 0..1000u32 {
        let t = toks(i * 16, 16);
        hashes.push(u64::from(i) + 1);
        idx.apply(
            0,
            u64::from(i),
            &one(stored(&[u64::from(i) + 1], None, &t)),
            t0(),
        )
        .unwrap();
    }
    let st = idx.target_stats(0).unwrap();
    assert_eq!(
        (st.engine_blocks, st.keys, st.counters.evicted),
        (100, 100, 900)
    );
    assert_eq!(r.slots(), 100);
    assert_eq!(scores(&r, BASE, &toks(0, 16), &[0]), [0], "oldest evicted");
    assert_eq!(scores(&r, BASE, &toks(999 * 16, 16), &[0]), [1]);
    // Re-storing a block refreshes it: it survives the next evictions.
    idx.apply(
        0,
        1000,
        &one(stored(&[901], None, &toks(900 * 16, 16))),
        t0(),
    )
    .unwrap();
    for i in 1000..1050u32 {
        idx.apply(
            0,
            u64::from(i) + 1,
            &one(stored(&[u64::from(i) + 1], None, &toks(i * 16, 16))),
            t0(),
        )
        .unwrap();
    }
    assert_eq!(scores(&r, BASE, &toks(900 * 16, 16), &[0]), [1]);
    assert_eq!(scores(&r, BASE, &toks(901 * 16, 16), &[0]), [0]);
    assert!(idx.targets[0].as_ref().unwrap().fifo.len() <= 2 * 100 + 64);
}

#[test]
fn repeated_stores_of_known_blocks_keep_the_queue_small() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    let batch = one(stored(&[1, 2, 3, 4], None, &t));
    for seq in 0..1000 {
        idx.apply(0, seq, &batch, t0()).unwrap();
    }
    assert!(idx.targets[0].as_ref().unwrap().fifo.len() <= 2 * 4 + 64);
    assert_eq!(scores(&r, BASE, &t, &[0]), [4]);
    assert_eq!(idx.target_stats(0).unwrap().keys, 4);
}

#[test]
fn many_targets_across_words() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 64);
    let ids = [0u32, 63, 64, 200, 4095];
    for (n, &id) in ids.iter().enumerate() {
        let hashes: Vec<u64> = (1..=n as u64 + 1).collect();
        let tokens = &t[..16 * (n + 1).min(4)];
        let hashes = &hashes[..tokens.len() / 16];
        idx.apply(id, 0, &one(stored(hashes, None, tokens)), t0())
            .unwrap();
    }
    let candidates = [4095, 200, 5000, 64, 63, 0, 1];
    assert_eq!(scores(&r, BASE, &t, &candidates), [4, 4, 0, 3, 2, 1, 0]);
    assert_eq!(
        idx.apply(MAX_TARGETS, 0, &EventBatch::new(), t0()),
        Err(IndexError::Target(MAX_TARGETS))
    );
    let mut keys = Vec::new();
    r.request_keys(BASE, &t, &mut keys);
    let mut short = [7u32; 2];
    r.longest_prefix(&keys, &candidates, &mut short);
    assert_eq!(short, [4, 4]);
    r.longest_prefix(&[], &candidates, &mut short);
    assert_eq!(short, [0, 0]);
}

#[test]
fn idle_targets_are_dropped() {
    let (mut idx, r) = index(1000);
    let t = toks(1, 16);
    let start = Instant::now();
    idx.apply(0, 0, &one(stored(&[1], None, &t)), start)
        .unwrap();
    idx.apply(
        1,
        0,
        &one(stored(&[1], None, &t)),
        start + Duration::from_secs(50),
    )
    .unwrap();
    let now = start + Duration::from_secs(70);
    assert_eq!(idx.drop_idle(now, Duration::from_secs(60)), 1);
    assert_eq!(scores(&r, BASE, &t, &[0, 1]), [0, 1]);
    assert_eq!(idx.drop_idle(now, Duration::from_secs(60)), 0);
    let stats = idx.stats();
    assert_eq!(stats.targets.len(), 2);
    assert_eq!(stats.slots, 1);
}

#[test]
fn config_is_validated() {
    let bad = KvIndexConfig {
        block_size: 0,
        ..Default::default()
    };
    assert_eq!(KvIndex::new(bad).err(), Some(IndexError::BlockSize(0)));
    let bad = KvIndexConfig {
        max_blocks_per_target: 0,
        ..Default::default()
    };
    assert_eq!(KvIndex::new(bad).err(), Some(IndexError::Bound));
}

#[test]
fn reader_is_send_sync_and_cheap_to_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<KvIndexReader>();
    fn send<T: Send>() {}
    send::<KvIndex>();
}
