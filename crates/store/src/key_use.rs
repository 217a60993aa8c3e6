//! What each client API key used in one minute over the whole fleet (`[auth]
//! share_limits`): requests admitted and tokens, per key name.
//!
//! One hash per minute of the Unix clock, `{p}:keyuse:<minute>`: fields `<key>:r` (requests)
//! and `<key>:t` (tokens). Replicas add their own counts with `HINCRBY` (additions commute)
//! and every write renews the hash's TTL, so old minutes age out. Owns that layout; it must
//! not hold the limits (the gateway does) nor subtract a replica's own share.

use std::collections::HashMap;
use std::time::Duration;

use redis::ConnectionLike;

use crate::batch;
use crate::error::StoreError;
use crate::key_layout::Keys;

/// A key's requests and tokens of a minute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUse {
    pub key: String,
    pub requests: u64,
    pub tokens: u64,
}

/// Adds `rows` (this replica's new counts) to `minute`, then reads the minute back: the
/// fleet's totals per key, sorted by name. One round trip.
pub(crate) fn add_and_read(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    minute: u64,
    rows: &[KeyUse],
    ttl: Duration,
) -> Result<Vec<KeyUse>, StoreError> {
    let key = keys.key_use(minute);
    let mut pipe = redis::pipe();
    let mut wrote = false;
    for row in rows {
        for (field, n) in [("r", row.requests), ("t", row.tokens)] {
            if n > 0 {
                let n = i64::try_from(n)
                    .map_err(|_| StoreError::Invalid(format!("key use {n} above i64")))?;
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg(format!("{}:{field}", row.key))
                    .arg(n);
                wrote = true;
            }
        }
    }
    if wrote {
        pipe.cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl.as_millis().max(1) as u64);
    }
    pipe.cmd("HGETALL").arg(&key);
    let mut replies = batch::send(link, &pipe)?;
    let last = replies.pop().expect("the read is the last command")?;
    for r in replies {
        r?;
    }
    let all: HashMap<String, u64> = batch::parse(last)?;
    let mut by_key: HashMap<String, KeyUse> = HashMap::new();
    for (field, n) in all {
        let Some((name, kind)) = field.rsplit_once(':') else {
            continue;
        };
        let e = by_key.entry(name.to_string()).or_insert_with(|| KeyUse {
            key: name.to_string(),
            ..KeyUse::default()
        });
        match kind {
            "r" => e.requests = n,
            "t" => e.tokens = n,
            _ => {}
        }
    }
    let mut out: Vec<KeyUse> = by_key.into_values().collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
