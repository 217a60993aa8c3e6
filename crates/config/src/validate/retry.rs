//! A route's retry policy keys (`retry_on`, `per_try_timeout`, `deadline`, back-off, budget,
//! `retry_after_max`) → [`RetryPolicy`]. It must not check `retries` itself (routes does).

use super::common::*;

pub(super) fn retry_policy(raw: &RawRoute, at: &str, errs: &mut Collector) -> Option<RetryPolicy> {
    let d = RetryPolicy::default();
    let on = retry_on(raw.retry_on.as_deref(), &join(at, "retry_on"), errs);
    let optional = |v: Option<&toml::Value>, key: &str, errs: &mut Collector| match v {
        None => Some(None),
        Some(v) => duration(
            Some(v),
            &join(at, key),
            Duration::from_secs(30),
            false,
            errs,
        )
        .map(Some),
    };
    let per_try_timeout = optional(raw.per_try_timeout.as_ref(), "per_try_timeout", errs);
    let deadline = optional(raw.deadline.as_ref(), "deadline", errs);
    let backoff = duration(
        raw.retry_backoff.as_ref(),
        &join(at, "retry_backoff"),
        d.backoff,
        true,
        errs,
    );
    let backoff_max = duration(
        raw.retry_backoff_max.as_ref(),
        &join(at, "retry_backoff_max"),
        d.backoff_max,
        true,
        errs,
    );
    if let (Some(b), Some(m)) = (backoff, backoff_max) {
        if m < b {
            errs.push(
                join(at, "retry_backoff_max"),
                format!(
                    "retry_backoff_max ({}) is below retry_backoff ({})",
                    humantime::format_duration(m),
                    humantime::format_duration(b)
                ),
                "set retry_backoff_max at least as large as retry_backoff (defaults 250ms and 25ms)",
            );
            return None;
        }
    }
    let budget = match raw.retry_budget {
        None => Some(d.budget),
        Some(b) if b.is_finite() && (0.0..=10.0).contains(&b) => Some(b),
        Some(b) => {
            errs.push(
                join(at, "retry_budget"),
                format!("retry_budget is {b}; it must be a share between 0.0 and 10.0"),
                "set retry_budget to the share of requests that may retry, e.g. 0.2 (the default: 20 %)",
            );
            None
        }
    };
    let budget_min = match raw.retry_budget_min {
        None => Some(d.budget_min),
        Some(n) if (0..=10_000).contains(&n) => Some(n as u32),
        Some(n) => {
            errs.push(
                join(at, "retry_budget_min"),
                format!("retry_budget_min is {n}; it must be between 0 and 10000"),
                "set retry_budget_min to the retries always allowed per window (default 3)",
            );
            None
        }
    };
    let retry_after_max = duration(
        raw.retry_after_max.as_ref(),
        &join(at, "retry_after_max"),
        d.retry_after_max,
        true,
        errs,
    );
    let hedge_after = hedge_after(raw, at, errs);
    Some(RetryPolicy {
        on: on?,
        per_try_timeout: per_try_timeout?,
        deadline: deadline?,
        backoff: backoff?,
        backoff_max: backoff_max?,
        budget: budget?,
        budget_min: budget_min?,
        retry_after_max: retry_after_max?,
        hedge_after: hedge_after?,
    })
}

/// `hedge_after`: a duration, or a percentile of the route's times to a response head
/// (`"p50"` to `"p99.9"`). Hedging needs a second target to send the hedge to.
fn hedge_after(raw: &RawRoute, at: &str, errs: &mut Collector) -> Option<Option<HedgeAfter>> {
    let key = join(at, "hedge_after");
    let Some(v) = raw.hedge_after.as_ref() else {
        return Some(None);
    };
    if raw.targets.as_ref().is_some_and(|t| t.len() < 2) {
        errs.push(
            key,
            "hedging sends a second attempt to another target, and this route has one",
            "add a second target to the route, or remove hedge_after",
        );
        return None;
    }
    if let toml::Value::String(s) = v {
        if let Some(p) = s.trim().strip_prefix('p') {
            return match p.parse::<f64>() {
                Ok(p) if (50.0..=99.9).contains(&p) => Some(Some(HedgeAfter::Percentile(p))),
                _ => {
                    errs.push(
                        key,
                        format!("`{s}` is not a percentile hedge_after takes"),
                        "write a percentile from \"p50\" to \"p99.9\" (e.g. \"p95\"), or a duration such as \"300ms\"",
                    );
                    None
                }
            };
        }
    }
    duration(Some(v), &key, Duration::from_millis(300), false, errs)
        .map(|d| Some(HedgeAfter::Delay(d)))
}

fn retry_on(list: Option<&[String]>, key: &str, errs: &mut Collector) -> Option<RetryOn> {
    let Some(list) = list else {
        return Some(RetryOn::DEFAULT);
    };
    let mut on = RetryOn::NONE;
    let mut ok = true;
    for (i, word) in list.iter().enumerate() {
        match RetryReason::parse(word) {
            Some(r) => on = on.with(r),
            None => {
                let known: Vec<&str> = RetryReason::ALL.iter().map(|r| r.name()).collect();
                errs.push(
                    format!("{key}[{i}]"),
                    format!("`{word}` is not a failure retry_on knows"),
                    format!("use any of: {} (or [] to retry nothing)", known.join(", ")),
                );
                ok = false;
            }
        }
    }
    ok.then_some(on)
}
