//! Fleet load: each replica's in-flight requests per target, so load-aware strategies see
//! the fleet's and not only their own.
//!
//! A replica writes its counts to `{p}:load:<replica>` (postcard, `SET … PX ttl`: a replica
//! that stops publishing drops out after `ttl`, which is also the staleness bound) and
//! itself into the sorted set `{p}:replicas`, scored by the unix time in ms of its last
//! publication. A read runs one script that walks the set, skips the caller, reads each
//! live replica's counts and removes the replicas whose counts expired. Each publication is
//! also appended to the load stream `{p}:loads`, which `watch` follows; a change between
//! two publications may go to the stream alone ([`append`]: one command instead of five),
//! since readers that follow the stream need nothing else and the keys are only where a
//! reader starts. Owns that layout; it must not decide how strategies weigh remote load.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{ConnectionLike, Script, Value};

use crate::batch;
use crate::error::StoreError;
use crate::key_layout::Keys;

/// Entries the load stream keeps, about: readers need only the newest per replica.
const STREAM_MAXLEN: usize = 1000;

/// How long a replica that published once stays in `{p}:replicas` without its counts.
const SET_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// KEYS[1] the replicas set; ARGV[1] the load keys' prefix, ARGV[2] the caller.
/// Returns name, counts, name, counts… of the other live replicas.
pub(crate) static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local out = {}
for _, name in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if name ~= ARGV[2] then
    local counts = redis.call('GET', ARGV[1] .. name)
    if counts then
      out[#out + 1] = name
      out[#out + 1] = counts
    else
      redis.call('ZREM', KEYS[1], name)
    end
  end
end
return out
"#,
    )
});

/// Publishes `replica`'s in-flight counts for `ttl`.
pub(crate) fn publish(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    replica: &str,
    counts: &[(&str, u32)],
    ttl: Duration,
) -> Result<(), StoreError> {
    let blob = postcard::to_allocvec(counts)
        .map_err(|e| StoreError::Invalid(format!("load counts do not encode: {e}")))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let set = keys.replicas();
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(keys.load(replica))
        .arg(&blob)
        .arg("PX")
        .arg(ttl.as_millis().max(1) as u64);
    pipe.cmd("ZADD").arg(&set).arg(now).arg(replica);
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(&set)
        .arg("-inf")
        .arg(now.saturating_sub(SET_TTL_MS));
    pipe.cmd("PEXPIRE").arg(&set).arg(SET_TTL_MS);
    // The same counts on the load stream, for the replicas that follow it as it changes.
    pipe.add_command(crate::watch::load_command(
        keys,
        replica,
        &blob,
        STREAM_MAXLEN,
    ));
    batch::send_all::<Value>(link, &pipe)?;
    Ok(())
}

/// Appends `replica`'s in-flight counts to the load stream only, leaving its key as the
/// last [`publish`] wrote it.
pub(crate) fn append(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    replica: &str,
    counts: &[(&str, u32)],
) -> Result<(), StoreError> {
    let blob = postcard::to_allocvec(counts)
        .map_err(|e| StoreError::Invalid(format!("load counts do not encode: {e}")))?;
    crate::watch::load_command(keys, replica, &blob, STREAM_MAXLEN).query::<Value>(link)?;
    Ok(())
}

/// The other live replicas' in-flight counts, summed per target name (sorted by name).
pub(crate) fn read(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    replica: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    let flat: Vec<Vec<u8>> = READ_SCRIPT
        .key(keys.replicas())
        .arg(keys.load_head())
        .arg(replica)
        .invoke(link)?;
    let mut sum: BTreeMap<String, u64> = BTreeMap::new();
    for pair in flat.chunks(2) {
        let [name, blob] = pair else {
            return Err(StoreError::Decode("odd reply of the load script".into()));
        };
        let counts: Vec<(String, u32)> = postcard::from_bytes(blob).map_err(|e| {
            StoreError::Decode(format!(
                "load of replica `{}`: {e}",
                String::from_utf8_lossy(name)
            ))
        })?;
        for (target, n) in counts {
            *sum.entry(target).or_default() += u64::from(n);
        }
    }
    Ok(sum.into_iter().collect())
}
