//! Following the fleet as it changes: one blocking `XREAD` over the item stream
//! (`{p}:items`) and the load stream (`{p}:loads`), so another replica's pick or load change
//! reaches this replica about one round trip after it was written instead of at the next
//! periodic exchange.
//!
//! Each entry is read with its origin and the Unix time in its id (the server's clock when
//! it was appended), so the reader can tell each peer's last sync and how far behind it
//! was. Own entries are skipped. Owns the read of both streams and the loads' entry layout
//! (fields `v`, `r` the replica, `c` the counts, postcard); it must not apply what it reads
//! or decide how old a load may be (the gateway's reader does).

use std::time::Duration;

use redis::streams::StreamReadReply;
use redis::{ConnectionLike, Value};

use crate::error::StoreError;
use crate::items::{self, Item};
use crate::key_layout::Keys;

/// The load entry format this version writes and reads.
const LOAD_VERSION: &[u8] = b"1";

/// One stream entry of another replica's items.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The process that wrote it (its replica name, `#`, process id and a random word).
    pub origin: String,
    /// When the server appended it, Unix milliseconds (from the entry id).
    pub unix_ms: u64,
    pub items: Vec<Item>,
}

/// Another replica's in-flight counts per target, as it last published them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadEntry {
    pub replica: String,
    pub unix_ms: u64,
    pub counts: Vec<(String, u32)>,
}

/// Where a reader is in both streams: the last ids it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub items: String,
    pub loads: String,
}

/// What one watch returned.
#[derive(Debug, Default)]
pub struct News {
    pub entries: Vec<Entry>,
    pub loads: Vec<LoadEntry>,
}

/// The Unix milliseconds of a stream id (`<ms>-<seq>`).
fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// Up to `count` entries of each stream after `cursor`, waiting at most `block` for the
/// first (`None`: no wait). The cursor moves past everything read, own entries included.
pub(crate) fn watch(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    origin: &str,
    replica: &str,
    cursor: &mut Cursor,
    count: usize,
    block: Option<Duration>,
) -> Result<News, StoreError> {
    if count == 0 {
        return Err(StoreError::Invalid("reading zero stream entries".into()));
    }
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT").arg(count);
    if let Some(b) = block {
        cmd.arg("BLOCK").arg(b.as_millis().max(1) as u64);
    }
    cmd.arg("STREAMS")
        .arg(keys.items())
        .arg(keys.loads())
        .arg(&cursor.items)
        .arg(&cursor.loads);
    let reply: Option<StreamReadReply> = cmd.query(link)?;
    let mut news = News::default();
    let (items_key, loads_key) = (keys.items(), keys.loads());
    for stream in reply.into_iter().flat_map(|r| r.keys) {
        let is_items = stream.key == items_key;
        if !is_items && stream.key != loads_key {
            continue;
        }
        for entry in stream.ids {
            let field = |name: &str| match entry.map.get(name) {
                Some(Value::BulkString(b)) => Some(b.as_slice()),
                _ => None,
            };
            let unix_ms = id_ms(&entry.id);
            if is_items {
                if let Some((o, batch)) = items::decode(origin, &field) {
                    news.entries.push(Entry {
                        origin: o,
                        unix_ms,
                        items: batch,
                    });
                }
                cursor.items = entry.id.clone();
            } else {
                if let Some(l) = decode_load(replica, unix_ms, &field) {
                    news.loads.push(l);
                }
                cursor.loads = entry.id.clone();
            }
        }
    }
    Ok(news)
}

fn decode_load<'a>(
    replica: &str,
    unix_ms: u64,
    field: &impl Fn(&str) -> Option<&'a [u8]>,
) -> Option<LoadEntry> {
    if field("v") != Some(LOAD_VERSION) {
        return None;
    }
    let name = std::str::from_utf8(field("r")?).ok()?;
    if name == replica {
        return None;
    }
    let counts: Vec<(String, u32)> = postcard::from_bytes(field("c")?).ok()?;
    Some(LoadEntry {
        replica: name.to_string(),
        unix_ms,
        counts,
    })
}

/// Appends `replica`'s counts to the load stream, trimmed to about `maxlen` entries.
pub(crate) fn load_command(keys: &Keys, replica: &str, blob: &[u8], maxlen: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys.loads())
        .arg("MAXLEN")
        .arg("~")
        .arg(maxlen.max(1))
        .arg("*")
        .arg("v")
        .arg(LOAD_VERSION)
        .arg("r")
        .arg(replica)
        .arg("c")
        .arg(blob);
    cmd
}

/// The ids to start watching from: each stream's newest entry (`0-0` when empty), so a
/// watch yields only what is appended from now on.
pub(crate) fn cursor_now(link: &mut dyn ConnectionLike, keys: &Keys) -> Result<Cursor, StoreError> {
    Ok(Cursor {
        items: items::newest_id(link, &keys.items())?,
        loads: items::newest_id(link, &keys.loads())?,
    })
}

#[cfg(test)]
mod tests {
    use super::id_ms;

    #[test]
    fn an_ids_milliseconds_are_its_first_part() {
        assert_eq!(id_ms("1733456789012-3"), 1_733_456_789_012);
        assert_eq!(id_ms("0-0"), 0);
        assert_eq!(id_ms("junk"), 0);
    }
}
