//! Decoder for the KV-cache event messages that vLLM (and SGLang, and engines copying their
//! wire format) publish over ZMQ.
//!
//! # Wire format
//!
//! A message is three frames: the topic (bytes, often empty), the sequence number (8 bytes,
//! big-endian, starting at 0 for each publisher) and a msgpack payload written by msgspec:
//!
//! - `EventBatch = [ts: f64, events: [...], data_parallel_rank?]`. The rank is absent in
//!   vLLM 0.9 and is SGLang's `attn_dp_rank`; fields past it are skipped.
//! - Each event is a tagged struct. vLLM declares them `array_like`, so an event is an array
//!   whose element 0 is the class name and whose trailing default fields are left out:
//!   - `["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//!     lora_id|nil, medium|nil, lora_name|nil, extra_keys?, group_idx?,
//!     kv_cache_spec_kind?, kv_cache_spec_sliding_window?, ...]`: 6 fields in v0.9 and in
//!     SGLang (through `lora_id`), 7 in v0.10 (`medium`), 8 or more since.
//!   - `["BlockRemoved", block_hashes, medium?, group_idx?, ...]`
//!   - `["AllBlocksCleared", medium?]`
//!
//!   Some builds and engines that reuse the format drop `array_like` for the events, which
//!   then arrive as maps carrying `"type": "<class name>"`; both shapes are accepted, and
//!   fields added after the ones above are skipped in either shape.
//!
//! # Block hashes
//!
//! vLLM sends either ints (the default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64
//! bits of the 32-byte digest) or the 32-byte digest as `bin`. Both are reduced to one u64
//! key space, the one of vLLM's int mode: an int of any msgpack width is taken as is, a
//! negative int (int64 writers that truncate the digest to a signed value) as its
//! two's-complement bits, i.e. the low 64 bits of the same integer, and a `bin` as its last
//! 8 bytes read big-endian (left-padded with zeros when shorter), as llm-d does. So an engine
//! switching between the two modes keeps the same keys.
//!
//! # `extra_keys`
//!
//! One entry per block (nil or a tuple). Entries are reduced to what the index needs: the
//! LoRA name (dropped, it is `lora_name`), the `cache_salt` (a string in the first block of
//! a request, exposed as [`BlockStored::cache_salt`]) and everything else (multimodal
//! identifiers, prompt-embedding hashes, unknown shapes) folded into one opaque 64-bit digest
//! per block ([`BlockStored::extra_digests`], 0 when the block has none). Typed entries
//! (`LoRAKey`, `CacheSaltKey`, other `...Key` structs, as arrays or maps) are understood too.
//!
//! # Output: owned, reusable, borrowed views
//!
//! [`decode_batch`] fills an [`EventBatch`] that owns its data in a few flat arenas (all the
//! hashes of the batch in one `Vec<u64>`, all token ids in one `Vec<u32>`, short strings in
//! one `String`); events are spans into them. The batch is cleared, not freed, on the next
//! decode, so a subscriber that keeps one batch decodes without allocating once the arenas
//! have grown to the largest batch seen. Owned storage (rather than slices borrowing the ZMQ
//! frame) lets a batch outlive its frame: held while a sequence gap is repaired, or handed
//! to another thread. Readers get borrowed views ([`KvEvent`]) with plain slices.
//!
//! # Errors
//!
//! Unknown event tags are skipped and counted ([`EventBatch::unknown_events`]). A malformed
//! payload (truncated, wrong types, values out of range, bad UTF-8, nesting deeper than
//! [`MAX_DEPTH`], trailing bytes) returns a [`DecodeError`] and leaves the batch empty; no
//! input makes the decoder panic, and declared lengths never drive an allocation larger than
//! the input.
//!
//! # Rules
//!
//! Owns nothing but the batches it fills. It must not open sockets, read clocks, log or keep
//! state between messages: sequence tracking belongs to the index.

use rmp::Marker;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::msgpack::{Cursor, Result};
pub use super::msgpack::{DecodeError, MAX_DEPTH};

/// The sequence number of the end marker a replay socket sends after the last buffered batch
/// (`-1` as a signed 64-bit integer), with an empty payload.
pub const REPLAY_END_SEQ: u64 = u64::MAX;

/// Where a block lives, from the events' `medium` (vLLM sends `"GPU"`, offload connectors
/// e.g. `"CPU"`; compared without case). Absent means GPU (v0.9 has no field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Device memory.
    Gpu,
    /// Host memory (CPU offload).
    Cpu,
    /// Local disk.
    Disk,
    /// Any other tier name.
    Other,
}

impl Medium {
    /// The tier a `medium` string names.
    pub fn parse(name: &str) -> Self {
        if name.eq_ignore_ascii_case("gpu") {
            Self::Gpu
        } else if name.eq_ignore_ascii_case("cpu") {
            Self::Cpu
        } else if name.eq_ignore_ascii_case("disk") {
            Self::Disk
        } else {
            Self::Other
        }
    }
}

/// A decoded `BlockStored` event, borrowed from its [`EventBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BlockStored<'a> {
    /// The engine's hashes of the stored blocks, in chain order.
    pub block_hashes: &'a [u64],
    /// The engine hash of the block before the first one; `None` when the first block
    /// starts a sequence.
    pub parent_block_hash: Option<u64>,
    /// The token ids of all the blocks (`block_hashes.len() * block_size` of them), or
    /// empty when the engine stored blocks it already announced (offload tiers).
    pub token_ids: &'a [u32],
    /// Tokens per engine block.
    pub block_size: u32,
    /// Deprecated numeric LoRA id (v0.9 and SGLang carry only this).
    pub lora_id: Option<i64>,
    /// Where the blocks were stored.
    pub medium: Option<Medium>,
    /// LoRA adapter name (v0.10+).
    pub lora_name: Option<&'a str>,
    /// The request's `cache_salt`, from the first block's extra keys.
    pub cache_salt: Option<&'a str>,
    /// Per block, a digest of the extra keys other than the LoRA name and the salt
    /// (multimodal identifiers, prompt-embedding hashes), 0 for none. `None` when the event
    /// has no `extra_keys`.
    pub extra_digests: Option<&'a [u64]>,
    /// The KV-cache group (hybrid models).
    pub group_idx: Option<u32>,
    /// The group's cache spec kind.
    pub kv_cache_spec_kind: Option<&'a str>,
    /// The group's sliding window, in tokens.
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// A decoded `BlockRemoved` event, borrowed from its [`EventBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BlockRemoved<'a> {
    /// The engine hashes of the evicted blocks.
    pub block_hashes: &'a [u64],
    /// The tier they were evicted from.
    pub medium: Option<Medium>,
    /// The KV-cache group.
    pub group_idx: Option<u32>,
}

/// One decoded event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvEvent<'a> {
    /// Blocks became resident.
    BlockStored(BlockStored<'a>),
    /// Blocks were evicted.
    BlockRemoved(BlockRemoved<'a>),
    /// The engine dropped its whole cache (or one tier of it, when `medium` is set).
    AllBlocksCleared {
        /// The tier cleared, when the engine names one.
        medium: Option<Medium>,
    },
}

/// A range of one of a batch's arenas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    fn of<T>(items: &[T], start: usize) -> Self {
        Self {
            start: start as u32,
            end: items.len() as u32,
        }
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RawStored {
    hashes: Span,
    parent: Option<u64>,
    tokens: Span,
    block_size: u32,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<Span>,
    cache_salt: Option<Span>,
    extras: Option<Span>,
    group_idx: Option<u32>,
    spec_kind: Option<Span>,
    sliding_window: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
enum RawEvent {
    Stored(RawStored),
    Removed {
        hashes: Span,
        medium: Option<Medium>,
        group_idx: Option<u32>,
    },
    Cleared {
        medium: Option<Medium>,
    },
}

/// One decoded `EventBatch`: the header fields, and the events stored in flat arenas that
/// are reused from one decode to the next (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct EventBatch {
    /// The publisher's wall-clock timestamp (seconds since the epoch).
    pub ts: f64,
    /// vLLM's `data_parallel_rank` / SGLang's `attn_dp_rank`, when sent.
    pub data_parallel_rank: Option<i64>,
    /// Events with a tag this decoder does not know, skipped.
    pub unknown_events: u32,
    events: Vec<RawEvent>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    extras: Vec<u64>,
    text: String,
}

impl EventBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the batch, keeping its arenas' capacity.
    pub fn clear(&mut self) {
        self.ts = 0.0;
        self.data_parallel_rank = None;
        self.unknown_events = 0;
        self.events.clear();
        self.hashes.clear();
        self.tokens.clear();
        self.extras.clear();
        self.text.clear();
    }

    /// Number of known events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the batch holds no known event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events, in order.
    pub fn events(&self) -> impl ExactSizeIterator<Item = KvEvent<'_>> + '_ {
        self.events.iter().map(|raw| self.view(raw))
    }

    /// Appends a `BlockStored` event (copied into the arenas).
    pub fn push_block_stored(&mut self, ev: &BlockStored<'_>) {
        let raw = RawStored {
            hashes: push_all(&mut self.hashes, ev.block_hashes),
            parent: ev.parent_block_hash,
            tokens: push_all(&mut self.tokens, ev.token_ids),
            block_size: ev.block_size,
            lora_id: ev.lora_id,
            medium: ev.medium,
            lora_name: ev.lora_name.map(|s| self.push_text(s)),
            cache_salt: ev.cache_salt.map(|s| self.push_text(s)),
            extras: ev.extra_digests.map(|d| push_all(&mut self.extras, d)),
            group_idx: ev.group_idx,
            spec_kind: ev.kv_cache_spec_kind.map(|s| self.push_text(s)),
            sliding_window: ev.kv_cache_spec_sliding_window,
        };
        self.events.push(RawEvent::Stored(raw));
    }

    /// Appends a `BlockRemoved` event.
    pub fn push_block_removed(&mut self, ev: &BlockRemoved<'_>) {
        let hashes = push_all(&mut self.hashes, ev.block_hashes);
        self.events.push(RawEvent::Removed {
            hashes,
            medium: ev.medium,
            group_idx: ev.group_idx,
        });
    }

    /// Appends an `AllBlocksCleared` event.
    pub fn push_all_blocks_cleared(&mut self, medium: Option<Medium>) {
        self.events.push(RawEvent::Cleared { medium });
    }

    fn push_text(&mut self, s: &str) -> Span {
        let start = self.text.len();
        self.text.push_str(s);
        Span::of(self.text.as_bytes(), start)
    }

    fn text(&self, span: Span) -> &str {
        // Spans only ever cover whole strings pushed by `push_text`.
        self.text.get(span.range()).unwrap_or("")
    }

    fn view(&self, raw: &RawEvent) -> KvEvent<'_> {
        match *raw {
            RawEvent::Stored(s) => KvEvent::BlockStored(BlockStored {
                block_hashes: &self.hashes[s.hashes.range()],
                parent_block_hash: s.parent,
                token_ids: &self.tokens[s.tokens.range()],
                block_size: s.block_size,
                lora_id: s.lora_id,
                medium: s.medium,
                lora_name: s.lora_name.map(|t| self.text(t)),
                cache_salt: s.cache_salt.map(|t| self.text(t)),
                extra_digests: s.extras.map(|e| &self.extras[e.range()]),
                group_idx: s.group_idx,
                kv_cache_spec_kind: s.spec_kind.map(|t| self.text(t)),
                kv_cache_spec_sliding_window: s.sliding_window,
            }),
            RawEvent::Removed {
                hashes,
                medium,
                group_idx,
            } => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: &self.hashes[hashes.range()],
                medium,
                group_idx,
            }),
            RawEvent::Cleared { medium } => KvEvent::AllBlocksCleared { medium },
        }
    }
}

fn push_all<T: Copy>(arena: &mut Vec<T>, items: &[T]) -> Span {
    let start = arena.len();
    arena.extend_from_slice(items);
    Span::of(arena, start)
}

/// The transport header of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader<'a> {
    /// The topic frame (empty for replayed batches).
    pub topic: &'a [u8],
    /// The publisher's sequence number.
    pub seq: u64,
}

impl MessageHeader<'_> {
    /// Whether this is a replay socket's end marker rather than a batch.
    pub fn is_replay_end(&self) -> bool {
        self.seq == REPLAY_END_SEQ
    }
}

/// Reads a sequence frame (8 bytes, big-endian).
pub fn parse_seq(frame: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqLength(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes one multipart message: `[topic, seq, payload]` from the PUB socket, or
/// `[seq, payload]` from a replay reply. A replay end marker yields an empty batch and a
/// header whose [`is_replay_end`](MessageHeader::is_replay_end) is true.
pub fn decode_message<'a>(frames: &[&'a [u8]], out: &mut EventBatch) -> Result<MessageHeader<'a>> {
    let (topic, seq, payload): (&'a [u8], &[u8], &[u8]) = match *frames {
        [topic, seq, payload] => (topic, seq, payload),
        [seq, payload] => (&[], seq, payload),
        _ => {
            out.clear();
            return Err(DecodeError::FrameCount(frames.len()));
        }
    };
    let seq = match parse_seq(seq) {
        Ok(seq) => seq,
        Err(e) => {
            out.clear();
            return Err(e);
        }
    };
    if seq == REPLAY_END_SEQ && payload.is_empty() {
        out.clear();
    } else {
        decode_batch(payload, out)?;
    }
    Ok(MessageHeader { topic, seq })
}

/// Decodes a msgpack `EventBatch` payload into `out`, replacing its content. On error `out`
/// is left empty.
pub fn decode_batch(payload: &[u8], out: &mut EventBatch) -> Result<()> {
    out.clear();
    let result = decode_into(&mut Cursor::new(payload), out);
    if result.is_err() {
        out.clear();
    }
    result
}

fn decode_into(c: &mut Cursor<'_>, out: &mut EventBatch) -> Result<()> {
    let fields = c.array_len("EventBatch")?;
    if fields < 2 {
        return Err(DecodeError::Missing("EventBatch.events"));
    }
    out.ts = c.f64("ts")?;
    let events = c.array_len("events")?;
    out.events.reserve(events.min(c.remaining()));
    for _ in 0..events {
        decode_event(c, out)?;
    }
    if fields >= 3 && !c.nil() {
        out.data_parallel_rank = Some(c.int_in("data_parallel_rank")?);
    }
    for _ in 3..fields {
        c.skip(1)?;
    }
    match c.remaining() {
        0 => Ok(()),
        n => Err(DecodeError::Trailing(n)),
    }
}

/// The kinds of event this decoder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

impl Kind {
    fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "BlockStored" => Some(Self::Stored),
            "BlockRemoved" => Some(Self::Removed),
            "AllBlocksCleared" => Some(Self::Cleared),
            _ => None,
        }
    }

    /// The field at `index` of the array form (after the tag).
    fn positional(self, index: usize) -> Field {
        const STORED: [Field; 11] = [
            Field::BlockHashes,
            Field::Parent,
            Field::TokenIds,
            Field::BlockSize,
            Field::LoraId,
            Field::Medium,
            Field::LoraName,
            Field::ExtraKeys,
            Field::GroupIdx,
            Field::SpecKind,
            Field::SlidingWindow,
        ];
        const REMOVED: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];
        const CLEARED: [Field; 1] = [Field::Medium];
        let table: &[Field] = match self {
            Self::Stored => &STORED,
            Self::Removed => &REMOVED,
            Self::Cleared => &CLEARED,
        };
        table.get(index).copied().unwrap_or(Field::Skip)
    }

    /// The field a key of the map form names.
    fn named(self, name: &str) -> Field {
        let field = match name {
            "block_hashes" => Field::BlockHashes,
            "parent_block_hash" => Field::Parent,
            "token_ids" => Field::TokenIds,
            "block_size" => Field::BlockSize,
            "lora_id" => Field::LoraId,
            "medium" => Field::Medium,
            "lora_name" => Field::LoraName,
            "extra_keys" => Field::ExtraKeys,
            "group_idx" => Field::GroupIdx,
            "kv_cache_spec_kind" => Field::SpecKind,
            "kv_cache_spec_sliding_window" => Field::SlidingWindow,
            _ => Field::Skip,
        };
        // Only the fields the positional form of this kind has.
        if (0..11).any(|i| self.positional(i) == field) {
            field
        } else {
            Field::Skip
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    Skip,
}

/// The fields of one event as they are read, before they are committed to the batch.
#[derive(Default)]
struct Fields<'a> {
    hashes: Option<Span>,
    parent: Option<u64>,
    tokens: Option<Span>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<&'a str>,
    extra_keys: Option<&'a [u8]>,
    group_idx: Option<u32>,
    spec_kind: Option<&'a str>,
    sliding_window: Option<u32>,
}

fn decode_event<'a>(c: &mut Cursor<'a>, out: &mut EventBatch) -> Result<()> {
    let at = c.pos;
    let byte = c.peek()?;
    let mut fields = Fields::default();
    let kind = match Marker::from_u8(byte) {
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            let n = c.array_len("event")?;
            if n == 0 {
                return Err(DecodeError::Missing("event tag"));
            }
            let kind = Kind::from_tag(c.str("event tag")?);
            for index in 0..n - 1 {
                match kind {
                    Some(kind) => read_field(c, kind.positional(index), out, &mut fields)?,
                    None => c.skip(1)?,
                }
            }
            kind
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let n = c.map_len("event")?;
            let start = c.pos;
            let mut tag = None;
            for _ in 0..n {
                if c.key()? == Some("type") {
                    tag = Some(c.str("event tag")?);
                } else {
                    c.skip(1)?;
                }
            }
            let kind = Kind::from_tag(tag.ok_or(DecodeError::Missing("event type"))?);
            if let Some(kind) = kind {
                let end = c.pos;
                c.pos = start;
                for _ in 0..n {
                    match c.key()? {
                        Some(name) => read_field(c, kind.named(name), out, &mut fields)?,
                        None => c.skip(1)?,
                    }
                }
                debug_assert_eq!(c.pos, end);
            }
            kind
        }
        _ => {
            return Err(DecodeError::Type {
                field: "event",
                marker: byte,
                at,
            })
        }
    };
    match kind {
        None => out.unknown_events += 1,
        Some(Kind::Stored) => commit_stored(fields, out)?,
        Some(Kind::Removed) => {
            let hashes = fields.hashes.ok_or(DecodeError::Missing("block_hashes"))?;
            out.events.push(RawEvent::Removed {
                hashes,
                medium: fields.medium,
                group_idx: fields.group_idx,
            });
        }
        Some(Kind::Cleared) => out.events.push(RawEvent::Cleared {
            medium: fields.medium,
        }),
    }
    Ok(())
}

fn read_field<'a>(
    c: &mut Cursor<'a>,
    field: Field,
    out: &mut EventBatch,
    f: &mut Fields<'a>,
) -> Result<()> {
    if field != Field::Skip && c.nil() {
        return Ok(());
    }
    match field {
        Field::BlockHashes => {
            let n = c.array_len("block_hashes")?;
            let start = out.hashes.len();
            out.hashes.reserve(n.min(c.remaining()));
            for _ in 0..n {
                let hash = c.hash("block_hashes")?;
                out.hashes.push(hash);
            }
            f.hashes = Some(Span::of(&out.hashes, start));
        }
        Field::Parent => f.parent = Some(c.hash("parent_block_hash")?),
        Field::TokenIds => {
            let n = c.array_len("token_ids")?;
            let start = out.tokens.len();
            out.tokens.reserve(n.min(c.remaining()));
            for _ in 0..n {
                let token = c.token()?;
                out.tokens.push(token);
            }
            f.tokens = Some(Span::of(&out.tokens, start));
        }
        Field::BlockSize => f.block_size = Some(c.int_in("block_size")?),
        Field::LoraId => f.lora_id = Some(c.int_in("lora_id")?),
        Field::Medium => f.medium = Some(Medium::parse(c.str("medium")?)),
        Field::LoraName => f.lora_name = Some(c.str("lora_name")?),
        Field::ExtraKeys => f.extra_keys = Some(c.skip_raw()?),
        Field::GroupIdx => f.group_idx = Some(c.int_in("group_idx")?),
        Field::SpecKind => f.spec_kind = Some(c.str("kv_cache_spec_kind")?),
        Field::SlidingWindow => {
            f.sliding_window = Some(c.int_in("kv_cache_spec_sliding_window")?);
        }
        Field::Skip => c.skip(1)?,
    }
    Ok(())
}

fn commit_stored(f: Fields<'_>, out: &mut EventBatch) -> Result<()> {
    let hashes = f.hashes.ok_or(DecodeError::Missing("block_hashes"))?;
    let block_size = f.block_size.ok_or(DecodeError::Missing("block_size"))?;
    let tokens = f.tokens.unwrap_or(Span {
        start: out.tokens.len() as u32,
        end: out.tokens.len() as u32,
    });
    let (extras, cache_salt) = match f.extra_keys {
        None => (None, None),
        Some(raw) => {
            let start = out.extras.len();
            let salt = parse_extra_keys(raw, f.lora_name, f.parent.is_none(), &mut out.extras)?;
            (Some(Span::of(&out.extras, start)), salt)
        }
    };
    let raw = RawStored {
        hashes,
        parent: f.parent,
        tokens,
        block_size,
        lora_id: f.lora_id,
        medium: f.medium,
        lora_name: f.lora_name.map(|s| out.push_text(s)),
        cache_salt: cache_salt.map(|s| out.push_text(s)),
        extras,
        group_idx: f.group_idx,
        spec_kind: f.spec_kind.map(|s| out.push_text(s)),
        sliding_window: f.sliding_window,
    };
    out.events.push(RawEvent::Stored(raw));
    Ok(())
}

/// One item of a block's extra keys, classified.
enum ExtraItem<'a> {
    /// A bare string: the LoRA name, the cache salt, or (newer builds) a multimodal hash.
    Str(&'a str),
    /// A typed `LoRAKey`.
    Lora,
    /// A typed `CacheSaltKey`.
    Salt(&'a str),
    /// Anything else.
    Opaque,
}

/// Splits `extra_keys` (one entry per block) into the request's cache salt (returned) and a
/// digest per block of the remaining items (pushed to `digests`).
fn parse_extra_keys<'a>(
    raw: &'a [u8],
    lora_name: Option<&str>,
    starts_request: bool,
    digests: &mut Vec<u64>,
) -> Result<Option<&'a str>> {
    let mut c = Cursor::new(raw);
    let blocks = c.array_len("extra_keys")?;
    digests.reserve(blocks.min(raw.len()));
    let mut salt = None;
    for block in 0..blocks {
        if c.nil() {
            digests.push(0);
            continue;
        }
        let items = c.array_len("extra_keys entry")?;
        let mut digest = 0u64;
        for _ in 0..items {
            let start = c.pos;
            let first = block == 0 && starts_request;
            match extra_item(&mut c)? {
                ExtraItem::Lora => {}
                ExtraItem::Str(s) if Some(s) == lora_name => {}
                ExtraItem::Str(s) | ExtraItem::Salt(s) if first && salt.is_none() => {
                    salt = Some(s);
                }
                _ => {
                    let seed = digest ^ 0x9E37_79B9_7F4A_7C15;
                    digest = xxh3_64_with_seed(&raw[start..c.pos], seed).max(1);
                }
            }
        }
        digests.push(digest);
    }
    Ok(salt)
}

fn extra_item<'a>(c: &mut Cursor<'a>) -> Result<ExtraItem<'a>> {
    let start = c.pos;
    let typed = |tag: Option<&str>, salt: Option<&'a str>| match (tag, salt) {
        (Some("LoRAKey"), _) => ExtraItem::Lora,
        (Some("CacheSaltKey"), Some(salt)) => ExtraItem::Salt(salt),
        _ => ExtraItem::Opaque,
    };
    let item = match Marker::from_u8(c.peek()?) {
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
            ExtraItem::Str(c.str("extra key")?)
        }
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
            // `[tag, fields...]` when typed and array-like; `[mm_hash, offset]` when legacy.
            let n = c.array_len("extra key")?;
            let mut strs = [None, None];
            for slot in strs.iter_mut().take(n) {
                *slot = c.opt_str();
                if slot.is_none() {
                    break;
                }
            }
            c.pos = start;
            c.skip(1)?;
            typed(strs[0], strs[1])
        }
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
            let n = c.map_len("extra key")?;
            let (mut tag, mut salt) = (None, None);
            for _ in 0..n {
                let key = c.key()?;
                let value = c.opt_str();
                match (key, value) {
                    (Some("type"), Some(v)) => tag = Some(v),
                    (Some("salt"), Some(v)) => salt = Some(v),
                    (_, None) => c.skip(1)?,
                    _ => {}
                }
            }
            typed(tag, salt)
        }
        _ => {
            c.skip(1)?;
            ExtraItem::Opaque
        }
    };
    Ok(item)
}
