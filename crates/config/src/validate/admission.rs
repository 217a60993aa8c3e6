//! Admission: `[[classes]]` (priority classes with their ranks and reserves), each route's
//! `default_class`, `priority_header`, `tenant_header` and `refuse_unmeetable`, and each
//! target's `priority_field` and `priority_values`. A key's `priority` is checked with the
//! key (`api_keys`), against the classes validated here.
//!
//! Owns these keys' checks and their defaults; the routes and targets they belong to are
//! validated by their own modules, which leave these settings at their defaults.

use super::common::*;
use super::targets::check_header_name;
use crate::raw::RawKey;

/// The route settings that pick a strategy able to predict time to first token.
const PREDICTING: &[&str] = &["predicted_latency", "fastest"];

/// `[[classes]]`: never empty (without the section, one class [`DEFAULT_CLASS`]).
pub(super) fn classes(raw: Option<Vec<RawClass>>, errs: &mut Collector) -> Vec<PriorityClass> {
    let Some(raw) = raw else {
        return vec![PriorityClass::default_class()];
    };
    if raw.is_empty() || raw.len() > MAX_CLASSES {
        errs.push(
            "classes",
            format!(
                "`classes` has {} entries; it takes 1 to {MAX_CLASSES}",
                raw.len()
            ),
            "list one [[classes]] table per priority class, e.g. name = \"interactive\", rank = 0",
        );
        return vec![PriorityClass::default_class()];
    }
    let names: Vec<Option<String>> = raw.iter().map(|c| c.name.clone()).collect();
    super::targets::check_unique_names(&names, "classes", "class", errs);
    let mut out = Vec::with_capacity(raw.len());
    for (i, c) in raw.into_iter().enumerate() {
        let at = format!("classes[{i}]");
        let name = match c.name {
            Some(n) if super::targets::check_name(&n, &join(&at, "name"), "class", errs) => n,
            Some(_) => continue,
            None => {
                errs.push(
                    join(&at, "name"),
                    "a class has no `name`",
                    "add name = \"interactive\" (the label of its requests in logs and metrics)",
                );
                continue;
            }
        };
        let rank = match c.rank {
            Some(r @ 0..=7) => r as u8,
            other => {
                errs.push(
                    join(&at, "rank"),
                    match other {
                        Some(r) => format!("rank is {r}; it must be 0 to 7"),
                        None => "a class has no `rank`".to_string(),
                    },
                    "set rank = 0 for the class admitted first, higher ranks after it",
                );
                continue;
            }
        };
        let reserve = c.reserve.unwrap_or(0.0);
        if !(0.0..=0.9).contains(&reserve) {
            errs.push(
                join(&at, "reserve"),
                format!("reserve is {reserve}; it must be between 0 and 0.9"),
                "set the share of each target's max_concurrent kept for this class and those ranked before it, e.g. reserve = 0.25",
            );
            continue;
        }
        out.push(PriorityClass {
            name,
            rank,
            reserve,
        });
    }
    let total: f64 = out.iter().map(|c| c.reserve).sum();
    if total > 0.9 {
        errs.push(
            "classes",
            format!("the classes reserve {total:.2} of every target's max_concurrent together; at most 0.9 may be reserved"),
            "lower some class's reserve, so that the lowest class keeps a place",
        );
    }
    if out.is_empty() {
        out.push(PriorityClass::default_class());
    }
    out
}

/// The class named `name` (at `key`), or an error naming the classes.
pub(super) fn class_index(
    name: &str,
    classes: &[PriorityClass],
    key: &str,
    errs: &mut Collector,
) -> Option<usize> {
    let found = classes.iter().position(|c| c.name == name);
    if found.is_none() {
        let known: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
        errs.push(
            key,
            format!("no class is named `{name}`"),
            format!(
                "name one of the classes ({}), or add a [[classes]] table named `{name}`",
                known.join(", ")
            ),
        );
    }
    found
}

/// The key written as `raw`'s `priority` (a class index) and `share`; `None` after an
/// error.
pub(super) fn key(
    raw: &RawKey,
    classes: &[PriorityClass],
    at: &str,
    errs: &mut Collector,
) -> Option<(Option<usize>, u32)> {
    let priority = match &raw.priority {
        None => Some(None),
        Some(n) => class_index(n, classes, &format!("{at}.priority"), errs).map(Some),
    };
    let share = match raw.share {
        None => Some(1),
        Some(s @ 1..=1000) => Some(s as u32),
        Some(s) => {
            errs.push(
                format!("{at}.share"),
                format!("share is {s}; it must be 1 to 1000"),
                "set the key's weight in fair queueing, e.g. share = 2 to be served twice the tokens of a key with share = 1",
            );
            None
        }
    };
    Some((priority?, share?))
}

/// Each `[[routes]]` table's admission settings and each `[[targets]]` table's engine
/// priority, in the file's order.
pub(super) fn from_raw(
    routes: Option<&Vec<RawRoute>>,
    targets: &[RawTarget],
    classes: &[PriorityClass],
    errs: &mut Collector,
) -> (Vec<RouteAdmission>, Vec<Option<EnginePriority>>) {
    let routes = routes
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| route(r, classes, &format!("routes[{i}]"), errs))
        .collect();
    let targets = targets
        .iter()
        .enumerate()
        .map(|(i, t)| target(t, classes, &format!("targets[{i}]"), errs))
        .collect();
    (routes, targets)
}

/// The admission settings of the route written as `raw` (at `at`).
pub(super) fn route(
    raw: &RawRoute,
    classes: &[PriorityClass],
    at: &str,
    errs: &mut Collector,
) -> RouteAdmission {
    let default_class = raw
        .default_class
        .as_deref()
        .and_then(|n| class_index(n, classes, &join(at, "default_class"), errs))
        .unwrap_or(0);
    let tenant_header = raw.tenant_header.as_ref().map(|h| h.to_ascii_lowercase());
    if let Some(h) = &tenant_header {
        check_header_name(h, &join(at, "tenant_header"), errs);
    }
    let refuse_unmeetable = raw.refuse_unmeetable.unwrap_or(false);
    if refuse_unmeetable {
        let name = raw
            .strategy
            .as_ref()
            .and_then(|s| s.as_str().or_else(|| s.get("name")?.as_str()));
        if !name.is_some_and(|n| PREDICTING.contains(&n)) {
            errs.push(
                join(at, "refuse_unmeetable"),
                "refuse_unmeetable needs a prediction of time to first token, which only the `predicted_latency` and `fastest` strategies make",
                "use strategy = \"predicted_latency\" (or \"fastest\") on this route, or remove refuse_unmeetable",
            );
        }
    }
    RouteAdmission {
        default_class,
        priority_header: raw.priority_header.unwrap_or(false),
        tenant_header,
        refuse_unmeetable,
    }
}

/// Gives each file route its admission settings (`admission`, one per `[[routes]]` table)
/// and each prefill pool its route's.
pub(super) fn apply_to_routes(routes: &mut [Option<Route>], admission: Vec<RouteAdmission>) {
    for (r, a) in routes.iter_mut().zip(admission) {
        if let Some(r) = r {
            r.admission = a;
        }
    }
    for i in 0..routes.len() {
        let of = routes[i].as_ref().and_then(|r| r.prefill_of);
        let main = of
            .and_then(|o| routes[o].as_ref())
            .map(|m| m.admission.clone());
        if let (Some(a), Some(r)) = (main, routes[i].as_mut()) {
            r.admission = a;
        }
    }
}

/// The engine priority of the target written as `raw` (at `at`): `None` without
/// `priority_field`.
pub(super) fn target(
    raw: &RawTarget,
    classes: &[PriorityClass],
    at: &str,
    errs: &mut Collector,
) -> Option<EnginePriority> {
    let Some(field) = &raw.priority_field else {
        if raw.priority_values.is_some() {
            errs.push(
                join(at, "priority_values"),
                "priority_values is set but the target has no priority_field",
                "add priority_field = \"priority\" (vLLM's field), or remove priority_values",
            );
        }
        return None;
    };
    const TAKEN: &[&str] = &["model", "messages", "prompt", "stream", "input"];
    let valid = !field.is_empty()
        && field.len() <= 64
        && field
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid || TAKEN.contains(&field.as_str()) {
        errs.push(
            join(at, "priority_field"),
            format!("`{field}` cannot be the body field that carries the class"),
            "name the engine's scheduling field, e.g. priority_field = \"priority\" (vLLM with --scheduling-policy priority)",
        );
        return None;
    }
    let mut values: Vec<i64> = classes.iter().map(|c| i64::from(c.rank)).collect();
    for (name, v) in raw.priority_values.iter().flatten() {
        let key = format!("{at}.priority_values.{name}");
        if let Some(i) = class_index(name, classes, &key, errs) {
            values[i] = *v;
        }
    }
    Some(EnginePriority {
        field: field.clone(),
        values,
    })
}
