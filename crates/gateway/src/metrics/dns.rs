//! `rolter_dns_resolutions_total{target,result}`: the control thread's lookups of targets
//! named by a host name, by outcome (`unchanged`, `changed`, `failed`), from the counts it
//! keeps and hands over at render time.
//!
//! Owns the series name and its labels. It keeps no state between renders and must not be
//! used from worker threads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// One target's lookups so far, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DnsCounts {
    /// The current address was among the answers.
    pub unchanged: u64,
    /// The current address was gone; new connections moved to a new one.
    pub changed: u64,
    /// An error or an empty answer; the last good address was kept.
    pub failed: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    target: String,
    result: &'static str,
}

/// Appends the series of `counts` (`(target index, counts)`, names from `target_names`) to
/// `out`; nothing when no target is resolved by name.
pub fn render(target_names: &[String], counts: &[(usize, DnsCounts)], out: &mut String) {
    if counts.is_empty() {
        return;
    }
    let family = Family::<Labels, Counter>::default();
    for &(t, c) in counts {
        let Some(name) = target_names.get(t) else {
            continue;
        };
        for (result, n) in [
            ("unchanged", c.unchanged),
            ("changed", c.changed),
            ("failed", c.failed),
        ] {
            family
                .get_or_create(&Labels {
                    target: name.clone(),
                    result,
                })
                .inc_by(n);
        }
    }
    let mut r = Registry::default();
    r.register(
        "rolter_dns_resolutions",
        "Lookups of targets' host names (every server.dns_refresh and after attempts without a response), by result: unchanged, changed (new connections use the new address), failed (the last good address is kept)",
        family,
    );
    super::text::append(out, &r);
}
