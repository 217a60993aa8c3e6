//! The durable ledger of `fair_catchup`: per route and wall-clock bucket, how many picks
//! the fleet made and how many each target received.
//!
//! One hash per bucket, `{p}:fc:<route>:<bucket>`: field `#` holds the picks, a field per
//! target name its received count. Replicas add with `HINCRBY` (additions commute, so no
//! script is needed) and every write renews the bucket's TTL, so old buckets age out on
//! their own. Owns the layout of a bucket and the pipelines that add and read; it must not
//! hold the catch-up rule (the strategy does) nor choose bucket sizes.

use std::collections::HashMap;
use std::time::Duration;

use redis::{ConnectionLike, Value};

use crate::batch;
use crate::error::StoreError;
use crate::key_layout::Keys;

/// The field of a bucket that counts picks; no target may be named so.
pub const PICKS_FIELD: &str = "#";
/// Most buckets one read covers.
pub const MAX_READ_BUCKETS: u64 = 10_000;

/// Counts to add to one bucket of one route.
#[derive(Debug, Clone, Copy)]
pub struct LedgerRow<'a> {
    pub route: &'a str,
    pub bucket: u64,
    pub picks: u64,
    /// (target name, requests it received) to add.
    pub received: &'a [(&'a str, u64)],
}

/// What the store holds for one bucket of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerBucket {
    pub bucket: u64,
    pub picks: u64,
    /// (target name, received), sorted by name.
    pub received: Vec<(String, u64)>,
}

/// Adds every row in one pipeline; zero counts send nothing, and a bucket written to has its
/// TTL set to `ttl`.
pub(crate) fn add(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    rows: &[LedgerRow<'_>],
    ttl: Duration,
) -> Result<(), StoreError> {
    let ttl_ms = ttl.as_millis().max(1) as u64;
    let mut pipe = redis::pipe();
    for row in rows {
        let key = keys.ledger(row.route, row.bucket);
        let mut wrote = false;
        if row.picks > 0 {
            pipe.cmd("HINCRBY")
                .arg(&key)
                .arg(PICKS_FIELD)
                .arg(signed(row.picks)?);
            wrote = true;
        }
        for (target, n) in row.received {
            if *target == PICKS_FIELD {
                return Err(StoreError::Invalid(format!(
                    "route `{}`: a target named `{PICKS_FIELD}` clashes with the ledger's picks field",
                    row.route
                )));
            }
            if *n > 0 {
                pipe.cmd("HINCRBY").arg(&key).arg(*target).arg(signed(*n)?);
                wrote = true;
            }
        }
        if wrote {
            pipe.cmd("PEXPIRE").arg(&key).arg(ttl_ms);
        }
    }
    batch::send_all::<Value>(link, &pipe)?;
    Ok(())
}

/// The buckets `first..=last` of `route` the store holds, in bucket order (a bucket nobody
/// wrote to, or one that expired, is left out).
pub(crate) fn read(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    route: &str,
    first: u64,
    last: u64,
) -> Result<Vec<LedgerBucket>, StoreError> {
    if last < first {
        return Ok(Vec::new());
    }
    if last - first >= MAX_READ_BUCKETS {
        return Err(StoreError::Invalid(format!(
            "route `{route}`: {} ledger buckets in one read, at most {MAX_READ_BUCKETS}",
            last - first + 1
        )));
    }
    let mut pipe = redis::pipe();
    for bucket in first..=last {
        pipe.cmd("HGETALL").arg(keys.ledger(route, bucket));
    }
    let hashes: Vec<HashMap<String, u64>> = batch::send_all(link, &pipe)?;
    Ok((first..=last)
        .zip(hashes)
        .filter(|(_, h)| !h.is_empty())
        .map(|(bucket, mut h)| {
            let picks = h.remove(PICKS_FIELD).unwrap_or(0);
            let mut received: Vec<(String, u64)> = h.into_iter().collect();
            received.sort();
            LedgerBucket {
                bucket,
                picks,
                received,
            }
        })
        .collect())
}

fn signed(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n)
        .map_err(|_| StoreError::Invalid(format!("ledger count {n} above what Redis counts")))
}
