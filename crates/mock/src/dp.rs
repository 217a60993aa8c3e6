//! Data-parallel ranks (`MockConfig::dp_size`): which rank serves a request, and each
//! rank's share of `max_running`.
//!
//! As vLLM run with `--data-parallel-size N`, the engine is N ranks behind one HTTP port.
//! A request asks for a rank with the header `X-data-parallel-rank: r` (vLLM's form, the
//! name in any case) or the body field `"data_parallel_rank": r` (SGLang's); the header
//! wins. Without either, ranks take turns (round-robin). A rank outside `0..dp_size` is
//! refused (400). Each rank has its own admission queue, prefix cache and counters.
//!
//! Owns the choice only; it must not keep per-rank state (the engine's shared state does).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The rank a request asked for (`None`: neither header nor body field) and the rank it
/// runs on, or the 400's message.
pub(crate) fn choose(
    header: Option<&str>,
    body: Option<u64>,
    dp_size: u32,
    turn: &AtomicU32,
) -> (Option<u32>, Result<u32, String>) {
    let asked = match header {
        Some(h) => match h.trim().parse::<u32>() {
            Ok(r) => Some(r),
            Err(_) => {
                let msg = format!("invalid X-data-parallel-rank header {h:?}");
                return (None, Err(msg));
            }
        },
        None => body.map(|r| u32::try_from(r).unwrap_or(u32::MAX)),
    };
    let dp_size = dp_size.max(1);
    let rank = match asked {
        Some(r) if r >= dp_size => Err(format!(
            "data_parallel_rank {r} is out of range: the engine has {dp_size} ranks (0 to {})",
            dp_size - 1
        )),
        Some(r) => Ok(r),
        None => Ok(turn.fetch_add(1, Relaxed) % dp_size),
    };
    (asked, rank)
}

/// Rank `rank`'s share of `max_running` (0 = unlimited): an even split, the remainder to
/// the first ranks, at least 1 each.
pub(crate) fn rank_limit(max_running: usize, dp_size: u32, rank: u32) -> usize {
    if max_running == 0 {
        return 0;
    }
    let n = dp_size.max(1) as usize;
    let extra = usize::from((rank as usize) < max_running % n);
    (max_running / n + extra).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_wins_then_body_then_turns() {
        let t = AtomicU32::new(0);
        assert_eq!(choose(Some("1"), Some(0), 2, &t), (Some(1), Ok(1)));
        assert_eq!(choose(None, Some(0), 2, &t), (Some(0), Ok(0)));
        assert_eq!(choose(None, None, 2, &t), (None, Ok(0)));
        assert_eq!(choose(None, None, 2, &t), (None, Ok(1)));
        assert!(choose(Some("2"), None, 2, &t).1.is_err());
        assert!(choose(Some("x"), None, 2, &t).1.is_err());
        assert_eq!(choose(None, None, 1, &t), (None, Ok(0)));
    }

    #[test]
    fn max_running_splits_over_ranks() {
        assert_eq!(rank_limit(5, 2, 0), 3);
        assert_eq!(rank_limit(5, 2, 1), 2);
        assert_eq!(rank_limit(1, 4, 3), 1);
        assert_eq!(rank_limit(0, 4, 3), 0);
        assert_eq!(rank_limit(7, 1, 0), 7);
    }
}
