//! The shared smooth weighted round-robin: one server-side script advances a route's
//! cursor by `lease` positions and returns the members it picked.
//!
//! The rule is nginx's, the same as the gateway's local cursor: per position, add every
//! member's weight to its current weight, pick the largest (the first one wins ties),
//! subtract the total weight from it. The state is a hash `{p}:rr:<route>` of member name →
//! current weight, written with 17 significant digits so it reads back as the same `f64`,
//! and kept for a day after its last use. Members the caller does not list (ejected,
//! removed by a reload) keep their stored weight untouched, so they rejoin where they left.
//! [`swrr_reference`] is the same rule in Rust, the reference the tests compare against.
//!
//! A lease of N hands one replica N consecutive positions of the one fleet-wide sequence
//! in one round trip (the cost of a call barely grows with N). The positions the fleet
//! takes are still exactly the smooth weighted sequence; what a lease gives up is the
//! interleaving of the requests that use them: a replica serves its N positions in its
//! own time, so the order in which targets see requests can be out by up to N positions
//! per replica, and positions leased but never used (a replica stops, the members change)
//! are skipped, which shifts the shares of what was served by at most those positions.
//!
//! Owns the script, its arguments and its reply; it must not decide when to fall back to
//! the local cursor (the caller does, on any error).

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use redis::{ConnectionLike, Script};

use crate::batch;
use crate::error::StoreError;
use crate::key_layout::Keys;

/// How long a rotation outlives its last pick.
const TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Most members of one rotation (the script's argument list stays small).
pub const MAX_MEMBERS: usize = 1024;
/// Most positions one call takes (the script's run time stays in microseconds).
pub const MAX_LEASE: u32 = 4096;

/// KEYS[1] the rotation hash; ARGV: lease, ttl (ms), then name, weight per member.
/// Returns the 0-based member index of each position taken.
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local lease = tonumber(ARGV[1])
local n = (#ARGV - 2) / 2
local names, weights, cur = {}, {}, {}
local total = 0
for i = 1, n do
  names[i] = ARGV[1 + 2 * i]
  weights[i] = tonumber(ARGV[2 + 2 * i])
  total = total + weights[i]
end
local stored = redis.call('HMGET', KEYS[1], unpack(names))
for i = 1, n do
  cur[i] = tonumber(stored[i]) or 0
end
local picks = {}
for p = 1, lease do
  local best, best_w = 1, nil
  for i = 1, n do
    cur[i] = cur[i] + weights[i]
    if best_w == nil or cur[i] > best_w then
      best, best_w = i, cur[i]
    end
  end
  cur[best] = cur[best] - total
  picks[p] = best - 1
end
local flat = {}
for i = 1, n do
  flat[2 * i - 1] = names[i]
  flat[2 * i] = string.format('%.17g', cur[i])
end
redis.call('HSET', KEYS[1], unpack(flat))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return picks
"#,
    )
});

/// One rotation to advance: `lease` positions of `route` over `members` (name, weight).
#[derive(Debug, Clone, Copy)]
pub struct RotateAsk<'a> {
    pub route: &'a str,
    pub members: &'a [(&'a str, f64)],
    pub lease: u32,
}

/// The rule of the script, on a local map of current weights: the reference the tests hold
/// the store to, and what a caller may use to replay a lease.
pub fn swrr_reference(
    current: &mut HashMap<String, f64>,
    members: &[(&str, f64)],
    lease: u32,
) -> Vec<u16> {
    if members.is_empty() {
        return Vec::new();
    }
    let total: f64 = members.iter().fold(0.0, |t, (_, w)| t + w);
    let mut cur: Vec<f64> = members
        .iter()
        .map(|(n, _)| current.get(*n).copied().unwrap_or(0.0))
        .collect();
    let mut picks = Vec::with_capacity(lease as usize);
    for _ in 0..lease {
        let mut best = 0;
        let mut best_w = f64::NEG_INFINITY;
        for (i, (_, w)) in members.iter().enumerate() {
            cur[i] += w;
            if cur[i] > best_w {
                best = i;
                best_w = cur[i];
            }
        }
        cur[best] -= total;
        picks.push(best as u16);
    }
    for ((name, _), c) in members.iter().zip(cur) {
        current.insert((*name).to_string(), c);
    }
    picks
}

/// Advances every ask in one pipeline (one round trip); one pick list per ask, in order.
/// An ask with no members or a zero lease takes nothing and sends nothing.
pub(crate) fn rotate_many(
    link: &mut dyn ConnectionLike,
    keys: &Keys,
    asks: &[RotateAsk<'_>],
) -> Result<Vec<Vec<u16>>, StoreError> {
    let mut out = vec![Vec::new(); asks.len()];
    let mut pending = Vec::with_capacity(asks.len());
    for (i, ask) in asks.iter().enumerate() {
        check(ask)?;
        if ask.lease > 0 && !ask.members.is_empty() {
            pending.push(i);
        }
    }
    // A NOSCRIPT answer means that call did nothing: load the script and send those again
    // (once; a second NOSCRIPT is an error).
    for attempt in 0..2 {
        if pending.is_empty() {
            break;
        }
        let mut pipe = redis::pipe();
        for &i in &pending {
            pipe.add_command(call(keys, &asks[i]));
        }
        let replies = batch::send(link, &pipe)?;
        let mut again = Vec::new();
        for (&i, reply) in pending.iter().zip(replies) {
            match reply {
                Ok(picks) => out[i] = batch::parse(picks)?,
                Err(e)
                    if attempt == 0
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    again.push(i)
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !again.is_empty() {
            SCRIPT.load(link)?;
        }
        pending = again;
    }
    Ok(out)
}

fn check(ask: &RotateAsk<'_>) -> Result<(), StoreError> {
    if ask.members.len() > MAX_MEMBERS {
        return Err(StoreError::Invalid(format!(
            "route `{}`: {} members in one rotation, at most {MAX_MEMBERS}",
            ask.route,
            ask.members.len()
        )));
    }
    if ask.lease > MAX_LEASE {
        return Err(StoreError::Invalid(format!(
            "route `{}`: lease {} above the most one call takes, {MAX_LEASE}",
            ask.route, ask.lease
        )));
    }
    if let Some((name, w)) = ask
        .members
        .iter()
        .find(|(_, w)| !(w.is_finite() && *w >= 0.0))
    {
        return Err(StoreError::Invalid(format!(
            "route `{}`: member `{name}` has weight {w}; weights are finite and not negative",
            ask.route
        )));
    }
    let mut seen = HashSet::with_capacity(ask.members.len());
    if let Some((name, _)) = ask.members.iter().find(|(n, _)| !seen.insert(*n)) {
        return Err(StoreError::Invalid(format!(
            "route `{}`: member `{name}` listed twice in one rotation",
            ask.route
        )));
    }
    Ok(())
}

/// `EVALSHA <sha> 1 <key> <lease> <ttl> name weight …`
fn call(keys: &Keys, ask: &RotateAsk<'_>) -> redis::Cmd {
    let mut c = redis::cmd("EVALSHA");
    c.arg(SCRIPT.get_hash())
        .arg(1)
        .arg(keys.rotation(ask.route))
        .arg(ask.lease)
        .arg(TTL_MS);
    for (name, w) in ask.members {
        // Rust prints the shortest text that reads back as the same f64.
        c.arg(*name).arg(w.to_string());
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(picks: &[u16]) -> String {
        picks.iter().map(|&i| (b'a' + i as u8) as char).collect()
    }

    #[test]
    fn reference_is_nginx_smooth_weighted_round_robin() {
        let mut cur = HashMap::new();
        let m = [("a", 5.0), ("b", 1.0), ("c", 1.0)];
        assert_eq!(letters(&swrr_reference(&mut cur, &m, 7)), "aabacaa");
        // A full cycle brings every current weight back to zero.
        assert!(cur.values().all(|&c| c == 0.0), "{cur:?}");
        let mut cur = HashMap::new();
        let eq = [("a", 1.0), ("b", 1.0), ("c", 1.0)];
        assert_eq!(letters(&swrr_reference(&mut cur, &eq, 7)), "abcabca");
    }

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        let bad = [("a", f64::NAN)];
        let e = check(&RotateAsk {
            route: "r",
            members: &bad,
            lease: 1,
        })
        .unwrap_err();
        assert!(e.to_string().contains("member `a`"), "{e}");
        let twice = [("a", 1.0), ("a", 2.0)];
        let e = check(&RotateAsk {
            route: "r",
            members: &twice,
            lease: 1,
        })
        .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        let one = [("a", 1.0)];
        let e = check(&RotateAsk {
            route: "r",
            members: &one,
            lease: MAX_LEASE + 1,
        })
        .unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)));
    }
}
