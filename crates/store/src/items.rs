//! Shared routing items (session pins, prefix insertions, fair-catchup assignments) on one
//! stream, `{p}:items`.
//!
//! A call appends one entry holding its whole batch: fields `v` (format version, `1`), `o`
//! (the origin replica) and `b` (the items, postcard-encoded), trimmed with `MAXLEN ~`. A
//! reader keeps the id of the last entry it saw and reads after it without blocking, so a
//! replica that starts late or reconnects catches up on what the stream still holds; it
//! skips its own entries, and entries of another format version (a fleet mid-upgrade).
//! (`watch` follows the stream as it grows, blocking.) Owns the entry layout and its
//! encoding; it must not apply items (the gateway does).

use redis::streams::{StreamRangeReply, StreamReadReply};
use redis::{ConnectionLike, Value};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::key_layout::Keys;

/// The entry format this version writes and reads.
const VERSION: &[u8] = b"1";

/// One piece of routing state another replica may want.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Item {
    /// A session key of `route` was pinned to `target`.
    SessionPin {
        route: String,
        key: u64,
        target: String,
    },
    /// A prompt prefix (`data`: the strategy's encoding of it) was inserted for `target`.
    Prefix {
        route: String,
        target: String,
        data: Vec<u8>,
    },
    /// `count` requests of `route` were assigned to `target`.
    Assigned {
        route: String,
        target: String,
        count: u32,
    },
}

/// Appends `items` as one entry from `origin`, trimming the stream to about `maxlen`
/// entries; returns the entry's id.
pub(crate) fn append(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    origin: &str,
    items: &[Item],
    maxlen: usize,
) -> Result<String, StoreError> {
    if maxlen == 0 {
        return Err(StoreError::Invalid(
            "the item stream's length bound is zero".into(),
        ));
    }
    let blob = postcard::to_allocvec(items)
        .map_err(|e| StoreError::Invalid(format!("items do not encode: {e}")))?;
    Ok(redis::cmd("XADD")
        .arg(keys.items())
        .arg("MAXLEN")
        .arg("~")
        .arg(maxlen)
        .arg("*")
        .arg("v")
        .arg(VERSION)
        .arg("o")
        .arg(origin)
        .arg("b")
        .arg(blob)
        .query(link)?)
}

/// Up to `count` entries after `last_id`: the id to read after next time and the items of
/// the entries that other origins wrote.
pub(crate) fn read(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    origin: &str,
    last_id: &str,
    count: usize,
) -> Result<(String, Vec<Item>), StoreError> {
    if count == 0 {
        return Err(StoreError::Invalid("reading zero stream entries".into()));
    }
    let reply: Option<StreamReadReply> = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(keys.items())
        .arg(last_id)
        .query(link)?;
    let mut last = last_id.to_string();
    let mut items = Vec::new();
    for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
        last = entry.id;
        let field = |name: &str| match entry.map.get(name) {
            Some(Value::BulkString(b)) => Some(b.as_slice()),
            _ => None,
        };
        if let Some((_, batch)) = decode(origin, &field) {
            items.extend(batch);
        }
    }
    Ok((last, items))
}

/// An entry's origin and items, unless it is `origin`'s own or of another format version.
/// An entry that does not decode is another writer's bug; readers move past it.
pub(crate) fn decode<'a>(
    origin: &str,
    field: &impl Fn(&str) -> Option<&'a [u8]>,
) -> Option<(String, Vec<Item>)> {
    if field("v") != Some(VERSION) {
        return None;
    }
    let from = field("o")?;
    if from == origin.as_bytes() {
        return None;
    }
    let batch = postcard::from_bytes::<Vec<Item>>(field("b")?).ok()?;
    Some((String::from_utf8_lossy(from).into_owned(), batch))
}

/// The id of the stream's newest entry, `0-0` when it is empty: reading after it yields
/// only what is appended from now on.
pub(crate) fn last_id(link: &mut dyn ConnectionLike, keys: &Keys) -> Result<String, StoreError> {
    newest_id(link, &keys.items())
}

/// The id of `stream`'s newest entry, `0-0` when it is empty or absent.
pub(crate) fn newest_id(link: &mut dyn ConnectionLike, stream: &str) -> Result<String, StoreError> {
    let reply: StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(link)?;
    Ok(reply
        .ids
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_string(), |e| e.id))
}
