//! `PrefixIndex`: per target, a bounded tree of the prompt bytes this core's route has sent
//! there (its own routing and what the other cores shared), for prefix-matching strategies
//! (`cache_aware`, the `prefix` scorer of `pipeline`).
//!
//! # Structure and granularity
//!
//! A prompt is cut into 64-byte chunks ([`CHUNK`]) plus a partial tail of 1..=63 bytes. Each
//! chunk is a node keyed by a chained hash, `key = xxh3(chunk, seed = parent key)`, so a key
//! names the whole prefix that ends with that chunk; one hash map per target finds a node
//! by key. The tail of a prompt is a leaf node keyed the same way (with a tag in the seed);
//! its parent records the tail lengths present below it in a 63-bit mask.
//!
//! [`matched`](PrefixIndex::matched) is therefore exact at chunk granularity and byte exact
//! at the end of a previously inserted prompt: a prompt that extends one the target saw
//! matches all of it. A prompt that diverges from (or stops short of) what the target holds
//! in the middle of a chunk loses the bytes of that chunk (fewer than 64). Two prefixes
//! whose 64-bit keys collide would be confused; the odds are negligible.
//!
//! # Memory bound and eviction
//!
//! Per target at most `max_bytes_per_target / 64` nodes and `max_bytes_per_target` held
//! prompt bytes. The bytes themselves are not stored: a node costs about 32 bytes plus
//! 16–32 bytes of hash map, so the index of a target costs roughly one byte of memory per
//! held prompt byte. When an insertion would exceed the bound, the least recently inserted
//! nodes go first. An insertion refreshes its whole path with the ancestors more recent than
//! the descendants, so the least recent node is always a leaf: the tree never orphans a
//! node, every held prefix is prefix-closed, and a system prompt shared by every request is
//! evicted last. A prompt longer than the bound keeps its leading chunks.
//!
//! # Rules
//!
//! Owns only the trees and a scratch key buffer. It must not block, lock, log or do I/O;
//! `matched` and `matched_keys` never allocate, `insert` allocates only while a tree grows
//! towards its bound. Recency is the order of insertions on this core (the `now` argument
//! is accepted for callers that have it and not needed for the order).

use std::time::Instant;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::key_map::KeyMap;
use rolter_core::TargetId;

/// Bytes per chunk: the matching granularity inside a prompt.
pub const CHUNK: usize = 64;

/// Seed of the first chunk's key (the root of every tree).
const ROOT: u64 = 0x9E37_79B9_7F4A_7C15;
/// Mixed into the seed of tail keys.
const TAIL_TAG: u64 = 0xD6E8_FEB8_6659_FD93;
/// No node.
const NIL: u32 = u32::MAX;

#[inline]
fn chunk_key(parent: u64, chunk: &[u8]) -> u64 {
    xxh3_64_with_seed(chunk, parent)
}

#[inline]
fn tail_key(parent: u64, tail: &[u8]) -> u64 {
    xxh3_64_with_seed(tail, parent ^ TAIL_TAG)
}

/// The chained keys of one prompt, computed once and used for every target
/// ([`PrefixIndex::matched_keys`], [`PrefixIndex::insert_keys`]) and as the compact form
/// shared with other cores ([`encode`](PromptKeys::encode)).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PromptKeys {
    /// One key per full chunk, in order.
    full: Vec<u64>,
    /// The tail's key when `tail_len > 0`.
    tail_key: u64,
    /// Bytes after the last full chunk (0..=63).
    tail_len: u8,
}

impl PromptKeys {
    /// Recomputes the keys for `prompt`, reusing the buffer.
    pub fn compute(&mut self, prompt: &[u8]) {
        self.full.clear();
        let mut key = ROOT;
        let chunks = prompt.chunks_exact(CHUNK);
        let rest = chunks.remainder();
        for chunk in chunks {
            key = chunk_key(key, chunk);
            self.full.push(key);
        }
        self.tail_len = rest.len() as u8;
        self.tail_key = if rest.is_empty() {
            0
        } else {
            tail_key(key, rest)
        };
    }

    /// Number of full chunks.
    pub fn chunks(&self) -> usize {
        self.full.len()
    }

    /// Prompt length these keys stand for.
    pub fn prompt_len(&self) -> usize {
        self.full.len() * CHUNK + usize::from(self.tail_len)
    }

    /// Appends the shared encoding to `out`: one byte of tail length, then every full-chunk
    /// key as 8 little-endian bytes, then the tail key when the tail length is not 0. An
    /// eighth of the prompt's size, and the receiving core does not hash again.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.tail_len);
        for k in &self.full {
            out.extend_from_slice(&k.to_le_bytes());
        }
        if self.tail_len > 0 {
            out.extend_from_slice(&self.tail_key.to_le_bytes());
        }
    }

    /// Reads what [`encode`](PromptKeys::encode) wrote; false (and empty keys) when `data`
    /// is malformed.
    pub fn decode(&mut self, data: &[u8]) -> bool {
        self.full.clear();
        self.tail_len = 0;
        self.tail_key = 0;
        let Some((&tail_len, rest)) = data.split_first() else {
            return false;
        };
        if usize::from(tail_len) >= CHUNK || rest.len() % 8 != 0 {
            return false;
        }
        let mut keys = rest
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let n = rest.len() / 8;
        let full = if tail_len > 0 {
            if n == 0 {
                return false;
            }
            n - 1
        } else {
            n
        };
        self.full.extend(keys.by_ref().take(full));
        if tail_len > 0 {
            self.tail_key = keys.next().expect("counted");
            self.tail_len = tail_len;
        }
        true
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    key: u64,
    /// Bit `t` set: a tail of `t` bytes was inserted below this node.
    tails: u64,
    /// Parent node, `NIL` for a child of the root.
    parent: u32,
    /// Recency list: the next more recent node, `NIL` at the head.
    newer: u32,
    /// Recency list: the next less recent node, `NIL` at the tail.
    older: u32,
    /// Prompt bytes this node stands for: `CHUNK` for a chunk, 1..=63 for a tail.
    len: u8,
    /// Known only from another gateway replica's insertion (through the store): this
    /// replica has not routed this prefix to the target itself.
    fleet: bool,
}

/// One target's tree.
#[derive(Debug, Default)]
struct Tree {
    map: KeyMap<u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recent node.
    head: u32,
    /// Least recent node.
    tail: u32,
    count: usize,
    held: usize,
    /// Tail lengths present directly below the root.
    root_tails: u64,
    /// Nodes known only from another replica: while there are none (a route that shares
    /// nothing, or whose fleet has not routed here), an insertion skips marking its path.
    fleet_nodes: usize,
}

impl Tree {
    fn new() -> Self {
        Tree {
            head: NIL,
            tail: NIL,
            ..Tree::default()
        }
    }

    fn clear(&mut self) {
        *self = Tree::new();
    }

    #[inline]
    fn mask_of(&self, parent: u32) -> u64 {
        if parent == NIL {
            self.root_tails
        } else {
            self.nodes[parent as usize].tails
        }
    }

    #[inline]
    fn mask_mut(&mut self, parent: u32) -> &mut u64 {
        if parent == NIL {
            &mut self.root_tails
        } else {
            &mut self.nodes[parent as usize].tails
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { newer, older, .. } = self.nodes[i as usize];
        if newer == NIL {
            self.head = older;
        } else {
            self.nodes[newer as usize].older = older;
        }
        if older == NIL {
            self.tail = newer;
        } else {
            self.nodes[older as usize].newer = newer;
        }
    }

    /// Links `i` as the most recent node.
    fn link_front(&mut self, i: u32) {
        let old_head = self.head;
        {
            let n = &mut self.nodes[i as usize];
            n.newer = NIL;
            n.older = old_head;
        }
        if old_head == NIL {
            self.tail = i;
        } else {
            self.nodes[old_head as usize].newer = i;
        }
        self.head = i;
    }

    /// Links `i` just less recent than `anchor`, or as the most recent node when `anchor`
    /// is `NIL`.
    fn link_after(&mut self, anchor: u32, i: u32) {
        if anchor == NIL {
            return self.link_front(i);
        }
        let below = self.nodes[anchor as usize].older;
        {
            let n = &mut self.nodes[i as usize];
            n.newer = anchor;
            n.older = below;
        }
        self.nodes[anchor as usize].older = i;
        if below == NIL {
            self.tail = i;
        } else {
            self.nodes[below as usize].newer = i;
        }
    }

    /// An insertion walked over node `i`: this replica's own makes it its own. Nothing to
    /// do (not even a read) while the tree holds no node from the fleet.
    #[inline]
    fn own(&mut self, i: u32, fleet: bool) {
        if fleet || self.fleet_nodes == 0 {
            return;
        }
        if let Some(n) = self.nodes.get_mut(i as usize).filter(|n| n.fleet) {
            n.fleet = false;
            self.fleet_nodes -= 1;
        }
    }

    /// Moves the existing node `i` just below `anchor` (the front when `NIL`).
    fn touch_after(&mut self, anchor: u32, i: u32) {
        // Already there: a path refreshed again in the same order (a conversation's next
        // turn, a shared system prompt) costs one read per node and no write.
        let in_place = if anchor == NIL {
            self.head == i
        } else {
            anchor == i || self.nodes[anchor as usize].older == i
        };
        if in_place {
            return;
        }
        self.unlink(i);
        self.link_after(anchor, i);
    }

    fn evict_oldest(&mut self) {
        let i = self.tail;
        debug_assert!(i != NIL);
        let node = self.nodes[i as usize];
        self.unlink(i);
        self.map.remove(&node.key);
        if node.fleet {
            self.fleet_nodes -= 1;
        }
        if usize::from(node.len) < CHUNK {
            *self.mask_mut(node.parent) &= !(1u64 << node.len);
        }
        self.count -= 1;
        self.held -= usize::from(node.len);
        self.free.push(i);
    }

    /// Evicts the least recent nodes until `extra_nodes` more nodes of `extra_bytes` fit,
    /// never touching the `protected` most recent nodes. False when they cannot fit.
    fn make_room(
        &mut self,
        extra_nodes: usize,
        extra_bytes: usize,
        protected: usize,
        max_nodes: usize,
        max_bytes: usize,
    ) -> bool {
        while self.count + extra_nodes > max_nodes || self.held + extra_bytes > max_bytes {
            if self.count <= protected {
                return false;
            }
            self.evict_oldest();
        }
        true
    }

    /// Creates a node below `anchor` in the recency order.
    fn create(&mut self, key: u64, parent: u32, len: u8, anchor: u32, fleet: bool) -> u32 {
        let node = Node {
            key,
            tails: 0,
            parent,
            newer: NIL,
            older: NIL,
            len,
            fleet,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.map.insert(key, i);
        self.link_after(anchor, i);
        self.count += 1;
        self.fleet_nodes += usize::from(fleet);
        self.held += usize::from(len);
        i
    }

    /// The longest tail recorded below `parent` (key `parent_key`) that `rest` starts with.
    #[inline]
    fn tail_match(&self, parent: u32, parent_key: u64, rest: &[u8]) -> usize {
        let mut mask = self.mask_of(parent);
        if rest.len() < CHUNK - 1 {
            mask &= (1u64 << (rest.len() + 1)) - 1;
        }
        while mask != 0 {
            let t = 63 - mask.leading_zeros() as usize;
            if self.map.contains_key(&tail_key(parent_key, &rest[..t])) {
                return t;
            }
            mask &= !(1u64 << t);
        }
        0
    }
}

/// Per-target prefix trees with a memory bound per target. See the module documentation.
#[derive(Debug)]
pub struct PrefixIndex {
    trees: Vec<Tree>,
    max_bytes: usize,
    max_nodes: usize,
    scratch: PromptKeys,
}

impl PrefixIndex {
    /// Trees for targets `0..target_count`, each bounded to `max_bytes_per_target` prompt
    /// bytes (and `max_bytes_per_target / 64` nodes). Allocates nothing per target until
    /// the target receives a prompt.
    pub fn new(target_count: usize, max_bytes_per_target: usize) -> Self {
        PrefixIndex {
            trees: (0..target_count).map(|_| Tree::new()).collect(),
            max_bytes: max_bytes_per_target,
            max_nodes: max_bytes_per_target / CHUNK,
            scratch: PromptKeys::default(),
        }
    }

    /// The index for a configuration whose targets moved (`map[new] = Some(old)`): a kept
    /// target keeps its tree, a new one starts empty.
    pub fn remap(&mut self, map: &[Option<TargetId>]) {
        let mut old = std::mem::take(&mut self.trees);
        self.trees = map
            .iter()
            .map(|from| match from.and_then(|o| old.get_mut(o)) {
                Some(tree) => std::mem::replace(tree, Tree::new()),
                None => Tree::new(),
            })
            .collect();
    }

    /// Records that `prompt` was sent to `target` and makes its path the most recent.
    /// Unknown targets are ignored.
    pub fn insert(&mut self, target: TargetId, prompt: &[u8], now: Instant) {
        self.insert_as(target, prompt, now, false);
    }

    /// [`insert`](PrefixIndex::insert), or (`fleet`) as another gateway replica routed it
    /// (see [`insert_keys_as`](PrefixIndex::insert_keys_as)).
    pub fn insert_as(&mut self, target: TargetId, prompt: &[u8], now: Instant, fleet: bool) {
        let mut keys = std::mem::take(&mut self.scratch);
        keys.compute(prompt);
        self.insert_keys_as(target, &keys, now, fleet);
        self.scratch = keys;
    }

    /// [`insert`](PrefixIndex::insert) from keys computed (or decoded) beforehand.
    pub fn insert_keys(&mut self, target: TargetId, keys: &PromptKeys, now: Instant) {
        self.insert_keys_as(target, keys, now, false);
    }

    /// [`insert_keys`](PrefixIndex::insert_keys), or (`fleet`) for another gateway
    /// replica's insertion: the nodes it adds are marked as known only from the fleet
    /// (nodes this replica inserted itself stay its own).
    pub fn insert_keys_as(
        &mut self,
        target: TargetId,
        keys: &PromptKeys,
        _now: Instant,
        fleet: bool,
    ) {
        let (max_nodes, max_bytes) = (self.max_nodes, self.max_bytes);
        let Some(tree) = self.trees.get_mut(target) else {
            return;
        };
        let full = keys.full.len().min(max_nodes);
        // Walk the existing prefix, refreshing it so each node sits just below its parent
        // and the first chunk is the most recent node of the tree.
        let mut parent = NIL;
        let mut depth = 0;
        while depth < full {
            let Some(&i) = tree.map.get(&keys.full[depth]) else {
                break;
            };
            tree.touch_after(parent, i);
            tree.own(i, fleet);
            parent = i;
            depth += 1;
        }
        // The rest of the chunks are new (the tree is prefix-closed): room first, sparing
        // the path just refreshed (it is the most recent `depth` nodes).
        if depth < full {
            let fits = tree.make_room(
                full - depth,
                (full - depth) * CHUNK,
                depth,
                max_nodes,
                max_bytes,
            );
            debug_assert!(fits, "full chunks are capped to the bound");
            for &key in &keys.full[depth..full] {
                parent = match tree.map.get(&key) {
                    // A colliding key: reuse it rather than corrupt the map.
                    Some(&i) => {
                        tree.touch_after(parent, i);
                        tree.own(i, fleet);
                        i
                    }
                    None => tree.create(key, parent, CHUNK as u8, parent, fleet),
                };
            }
        }
        if keys.tail_len == 0 || full < keys.full.len() {
            return;
        }
        let t = keys.tail_len;
        match tree.map.get(&keys.tail_key) {
            Some(&i) => {
                tree.touch_after(parent, i);
                tree.own(i, fleet);
            }
            None => {
                if !tree.make_room(1, usize::from(t), full, max_nodes, max_bytes) {
                    return;
                }
                tree.create(keys.tail_key, parent, t, parent, fleet);
            }
        }
        *tree.mask_mut(parent) |= 1u64 << t;
    }

    /// How many leading bytes of `prompt` the target's tree holds (see the module
    /// documentation for the granularity). Never allocates.
    pub fn matched(&self, target: TargetId, prompt: &[u8]) -> usize {
        let Some(tree) = self.trees.get(target) else {
            return 0;
        };
        if tree.count == 0 {
            return 0;
        }
        let mut key = ROOT;
        let mut node = NIL;
        let mut pos = 0;
        for chunk in prompt.chunks_exact(CHUNK) {
            let k = chunk_key(key, chunk);
            match tree.map.get(&k) {
                Some(&i) => {
                    key = k;
                    node = i;
                    pos += CHUNK;
                }
                None => break,
            }
        }
        pos + tree.tail_match(node, key, &prompt[pos..])
    }

    /// [`matched`](PrefixIndex::matched) with the prompt's keys computed once for every
    /// target: a binary search over the chunks (the tree is prefix-closed), so about
    /// log2(chunks) + 1 lookups per target. `keys` must be computed from `prompt`.
    #[inline]
    pub fn matched_keys(&self, target: TargetId, keys: &PromptKeys, prompt: &[u8]) -> usize {
        self.matched_keys_with_origin(target, keys, prompt).0
    }

    /// [`matched_keys`](PrefixIndex::matched_keys), and whether the longest held chunk of
    /// the match is known only from another gateway replica (false when no whole chunk
    /// matched).
    #[inline]
    pub fn matched_keys_with_origin(
        &self,
        target: TargetId,
        keys: &PromptKeys,
        prompt: &[u8],
    ) -> (usize, bool) {
        debug_assert_eq!(keys.prompt_len(), prompt.len());
        let Some(tree) = self.trees.get(target) else {
            return (0, false);
        };
        if tree.count == 0 {
            return (0, false);
        }
        let full = &keys.full;
        let present = |c: usize| tree.map.get(&full[c - 1]).copied();
        let n = full.len();
        // `c`: the number of leading chunks held.
        let (c, node) = if n == 0 {
            (0, None)
        } else if let Some(i) = present(n) {
            (n, Some(i))
        } else if let Some(first) = present(1) {
            let (mut lo, mut hi, mut node) = (1, n - 1, first);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                match present(mid) {
                    Some(i) => {
                        lo = mid;
                        node = i;
                    }
                    None => hi = mid - 1,
                }
            }
            (lo, Some(node))
        } else {
            (0, None)
        };
        let (node, key) = match node {
            Some(i) => (i, full[c - 1]),
            None => (NIL, ROOT),
        };
        // Read only by callers that ask (inlined, the load goes where the flag is unused).
        let fleet = tree.nodes.get(node as usize).is_some_and(|n| n.fleet);
        let pos = c * CHUNK;
        (
            pos + tree.tail_match(node, key, &prompt[pos.min(prompt.len())..]),
            fleet,
        )
    }

    /// Prompt bytes held for `target`: how warm it is.
    pub fn held(&self, target: TargetId) -> usize {
        self.trees.get(target).map_or(0, |t| t.held)
    }

    /// Nodes (chunks and tails) held for `target`.
    pub fn nodes(&self, target: TargetId) -> usize {
        self.trees.get(target).map_or(0, |t| t.count)
    }

    /// Forgets everything held for `target`.
    pub fn clear_target(&mut self, target: TargetId) {
        if let Some(t) = self.trees.get_mut(target) {
            t.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(seed: u64, len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.alphanumeric() as u8).collect()
    }

    /// Every node's parent is present and the recency list is consistent.
    fn check_tree(ix: &PrefixIndex, target: TargetId) {
        let tree = &ix.trees[target];
        let mut seen = 0;
        let mut held = 0;
        let mut i = tree.head;
        let mut prev = NIL;
        let mut rank = vec![usize::MAX; tree.nodes.len()];
        while i != NIL {
            let n = tree.nodes[i as usize];
            assert_eq!(n.newer, prev);
            assert_eq!(tree.map.get(&n.key), Some(&i));
            rank[i as usize] = seen;
            seen += 1;
            held += usize::from(n.len);
            prev = i;
            i = n.older;
        }
        assert_eq!(tree.tail, prev);
        assert_eq!(seen, tree.count);
        assert_eq!(seen, tree.map.len());
        assert_eq!(held, tree.held);
        // Ancestors are more recent than their descendants, and never missing.
        let mut i = tree.head;
        while i != NIL {
            let n = tree.nodes[i as usize];
            if n.parent != NIL {
                let p = n.parent as usize;
                assert_ne!(rank[p], usize::MAX, "orphaned node");
                assert!(rank[p] < rank[i as usize], "parent older than child");
            }
            i = n.older;
        }
    }

    #[test]
    fn exact_partial_and_no_match() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(3, 1 << 20);
        let p = prompt(1, 1000);
        ix.insert(1, &p, now);
        assert_eq!(ix.matched(1, &p), 1000, "exact, tail included");
        assert_eq!(ix.held(1), 1000);
        assert_eq!(ix.nodes(1), 15 + 1);
        assert_eq!(ix.matched(0, &p), 0, "other target");
        assert_eq!(ix.matched(7, &p), 0, "unknown target");
        // An extension of the prompt matches all of it.
        let mut longer = p.clone();
        longer.extend_from_slice(&prompt(2, 500));
        assert_eq!(ix.matched(1, &longer), 1000);
        // Diverging at byte 700: chunks 0..10 (640 bytes) match.
        let mut diverge = p.clone();
        diverge[700] ^= 1;
        assert_eq!(ix.matched(1, &diverge), 640);
        // A shorter prompt: whole chunks only.
        assert_eq!(ix.matched(1, &p[..300]), 256);
        // Nothing in common.
        assert_eq!(ix.matched(1, &prompt(3, 1000)), 0);
        assert_eq!(ix.matched(1, b""), 0);
        // A short prompt is all tail.
        ix.insert(2, b"hello", now);
        assert_eq!(ix.matched(2, b"hello"), 5);
        assert_eq!(ix.matched(2, b"hello world"), 5);
        assert_eq!(ix.matched(2, b"hell"), 0);
        check_tree(&ix, 1);
        check_tree(&ix, 2);
    }

    #[test]
    fn matched_keys_agrees_with_matched() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(2, 1 << 20);
        let base = prompt(5, 4096);
        ix.insert(0, &base[..3000], now);
        ix.insert(0, &base[..1234], now);
        let mut keys = PromptKeys::default();
        for len in [0, 1, 63, 64, 65, 1000, 1234, 1300, 2999, 3000, 3001, 4096] {
            keys.compute(&base[..len]);
            let want = ix.matched(0, &base[..len]);
            assert_eq!(ix.matched_keys(0, &keys, &base[..len]), want, "len {len}");
            assert_eq!(ix.matched_keys(1, &keys, &base[..len]), 0);
        }
        keys.compute(&base[..1234]);
        assert_eq!(ix.matched_keys(0, &keys, &base[..1234]), 1234);
        let other = prompt(6, 2000);
        keys.compute(&other);
        assert_eq!(ix.matched_keys(0, &keys, &other), 0);
    }

    #[test]
    fn keys_round_trip_and_insert_keys_equals_insert() {
        let now = Instant::now();
        let mut keys = PromptKeys::default();
        let p = prompt(9, 777);
        keys.compute(&p);
        let mut buf = Vec::new();
        keys.encode(&mut buf);
        assert_eq!(buf.len(), 1 + 8 * 13);
        let mut back = PromptKeys::default();
        assert!(back.decode(&buf));
        assert_eq!(back, keys);
        let mut ix = PrefixIndex::new(1, 1 << 20);
        ix.insert_keys(0, &back, now);
        assert_eq!(ix.matched(0, &p), 777);
        assert!(!back.decode(b""));
        assert!(!back.decode(&[64]));
        assert!(!back.decode(&[3]), "a tail needs its key");
        assert!(!back.decode(&[0, 1, 2]));
        assert!(back.decode(&[0]));
        assert_eq!(back.prompt_len(), 0);
    }

    #[test]
    fn a_million_prompts_stay_under_the_bound() {
        let now = Instant::now();
        let bound = 64 * 1024;
        let mut ix = PrefixIndex::new(1, bound);
        let system = prompt(11, 320);
        let mut p = system.clone();
        p.resize(system.len() + 40, b'x');
        for i in 0u64..1_000_000 {
            // A shared system prompt, then 40 distinct bytes.
            let tail = &mut p[system.len()..];
            tail[..8].copy_from_slice(&i.to_le_bytes());
            tail[8..16].copy_from_slice(&i.wrapping_mul(0x9E37_79B9).to_le_bytes());
            ix.insert(0, &p, now);
            assert!(ix.held(0) <= bound);
            assert!(ix.nodes(0) <= bound / CHUNK);
        }
        // The shared system prompt survived a million distinct requests.
        assert_eq!(ix.matched(0, &system), system.len());
        // The slab never grew beyond the bound.
        assert!(ix.trees[0].nodes.len() <= bound / CHUNK);
        check_tree(&ix, 0);
        // Distinct long prompts too: the held bytes stay bounded and the latest survives.
        for i in 0..2_000u64 {
            let q = prompt(1000 + i, 3000 + (i as usize % 200));
            ix.insert(0, &q, now);
            assert!(ix.held(0) <= bound);
            assert!(ix.nodes(0) <= bound / CHUNK);
            assert_eq!(ix.matched(0, &q), q.len());
        }
        check_tree(&ix, 0);
    }

    #[test]
    fn least_recent_prompts_are_evicted_first() {
        let now = Instant::now();
        // Room for 40 chunks: four prompts of 10 chunks.
        let mut ix = PrefixIndex::new(1, 40 * CHUNK);
        let ps: Vec<Vec<u8>> = (0..5).map(|i| prompt(20 + i, 10 * CHUNK)).collect();
        for p in &ps[..4] {
            ix.insert(0, p, now);
        }
        ix.insert(0, &ps[0], now); // refresh the first
        ix.insert(0, &ps[4], now); // evicts the second, the least recent
        assert_eq!(ix.matched(0, &ps[0]), 10 * CHUNK);
        assert_eq!(ix.matched(0, &ps[1]), 0);
        for p in &ps[2..] {
            assert_eq!(ix.matched(0, p), 10 * CHUNK);
        }
        check_tree(&ix, 0);
    }

    #[test]
    fn a_prompt_longer_than_the_bound_keeps_its_head() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(1, 8 * CHUNK + 10);
        let p = prompt(30, 20 * CHUNK + 5);
        ix.insert(0, &p, now);
        assert_eq!(ix.matched(0, &p), 8 * CHUNK);
        assert_eq!(ix.nodes(0), 8);
        let tiny = PrefixIndex::new(1, 10);
        assert_eq!(tiny.matched(0, &p), 0);
        let mut tiny = tiny;
        tiny.insert(0, &p, now);
        tiny.insert(0, b"abc", now);
        assert_eq!(tiny.nodes(0), 0, "no whole node fits 10 bytes");
        check_tree(&ix, 0);
    }

    #[test]
    fn fleet_prefixes_are_the_fleets_until_this_replica_routes_them() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(1, 1 << 16);
        let mut keys = PromptKeys::default();
        let base = prompt(41, 1000);
        let mut longer = base.clone();
        longer.extend_from_slice(&prompt(42, 500));
        keys.compute(&longer);
        ix.insert_keys_as(0, &keys, now, true);
        let origin = |ix: &PrefixIndex, p: &[u8]| {
            let mut k = PromptKeys::default();
            k.compute(p);
            ix.matched_keys_with_origin(0, &k, p)
        };
        assert!(origin(&ix, &longer).1, "known only from the fleet");
        assert_eq!(ix.trees[0].fleet_nodes, ix.nodes(0));
        // This replica routes the first part: that part is its own, the rest still the fleet's.
        ix.insert(0, &base, now);
        let (m, fleet) = origin(&ix, &base);
        assert!(m >= base.len() - CHUNK && !fleet, "{m}");
        assert!(origin(&ix, &longer).1);
        // A fleet insertion over its own nodes leaves them its own.
        ix.insert_as(0, &base, now, true);
        assert!(!origin(&ix, &base).1);
        // Evicting every node leaves no fleet node counted.
        let before = ix.trees[0].fleet_nodes;
        assert!(before > 0);
        ix.clear_target(0);
        assert_eq!(ix.trees[0].fleet_nodes, 0);
        // Evictions keep the count: a small tree filled from the fleet, then by this replica.
        let mut small = PrefixIndex::new(1, 8 * CHUNK);
        for seed in 0..5 {
            small.insert_as(0, &prompt(50 + seed, 6 * CHUNK), now, true);
            assert_eq!(small.trees[0].fleet_nodes, small.nodes(0));
        }
        for seed in 0..5 {
            small.insert(0, &prompt(60 + seed, 3 * CHUNK), now);
            let marked = small.trees[0].nodes.iter().filter(|n| n.fleet).count();
            assert!(small.trees[0].fleet_nodes <= marked.max(small.nodes(0)));
        }
        // A matched count is the same whichever way it is asked.
        ix.insert_as(0, &longer, now, true);
        let mut k = PromptKeys::default();
        k.compute(&longer);
        assert_eq!(ix.matched_keys(0, &k, &longer), origin(&ix, &longer).0);
    }

    #[test]
    fn clear_target_forgets() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(2, 1 << 16);
        let p = prompt(40, 500);
        ix.insert(0, &p, now);
        ix.insert(1, &p, now);
        ix.clear_target(0);
        ix.clear_target(9);
        assert_eq!((ix.held(0), ix.matched(0, &p)), (0, 0));
        assert_eq!(ix.matched(1, &p), 500);
        ix.insert(0, &p, now);
        assert_eq!(ix.matched(0, &p), 500);
    }

    #[test]
    fn sibling_tails_of_different_lengths_both_match() {
        let now = Instant::now();
        let mut ix = PrefixIndex::new(1, 1 << 16);
        let base = prompt(50, 128);
        let mut a = base.clone();
        a.extend_from_slice(b"tail-a");
        let mut b = base.clone();
        b.extend_from_slice(b"tail-bb");
        ix.insert(0, &a, now);
        ix.insert(0, &b, now);
        assert_eq!(ix.matched(0, &a), 134);
        assert_eq!(ix.matched(0, &b), 135);
        check_tree(&ix, 0);
    }
}
