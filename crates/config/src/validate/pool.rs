//! One pool of targets with its strategy, as a route or a disaggregated route's `prefill`
//! and `decode` name them: the target list (every name known, none twice) and the strategy
//! (a name, or a table of its name and options, checked by the strategy crate).
//!
//! A leaf of the route checks: `routes` and `pd` import it, it imports neither.

use super::common::*;
use super::targets::raw_close;

pub(super) fn route_targets(
    raw: Option<Vec<String>>,
    key: &str,
    names: &[Option<String>],
    errs: &mut Collector,
) -> Option<Vec<TargetId>> {
    let mut known: Vec<&str> = Vec::new();
    for n in names.iter().flatten() {
        if !n.is_empty() && !known.contains(&n.as_str()) {
            known.push(n);
        }
    }
    let known_list = if known.is_empty() {
        "none".to_string()
    } else {
        known.join(", ")
    };
    let list = match raw {
        None => {
            errs.push(
                key,
                "route has no `targets`",
                format!("add targets = [\"…\"] naming one or more targets (known targets: {known_list})"),
            );
            return None;
        }
        Some(l) if l.is_empty() => {
            errs.push(
                key,
                "route `targets` is empty",
                format!("name one or more targets (known targets: {known_list})"),
            );
            return None;
        }
        Some(l) => l,
    };
    let mut out = Vec::with_capacity(list.len());
    let mut ok = true;
    for (i, n) in list.iter().enumerate() {
        let k = format!("{key}[{i}]");
        match names.iter().position(|t| t.as_deref() == Some(n.as_str())) {
            Some(id) if out.contains(&id) => {
                errs.push(
                    k,
                    format!("target `{n}` is listed twice"),
                    format!("list `{n}` only once"),
                );
                ok = false;
            }
            Some(id) => out.push(id),
            None => {
                let hint = match closest(n, &known) {
                    Some(best) if raw_close(n, best) => format!(" (did you mean `{best}`?)"),
                    _ => String::new(),
                };
                errs.push(
                    k,
                    format!("no target is named `{n}`"),
                    format!("use one of the known targets: {known_list}{hint}"),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

pub(super) fn strategy(
    raw: Option<toml::Value>,
    key: &str,
    errs: &mut Collector,
) -> Option<StrategySpec> {
    let (name, options, name_key) = match raw {
        None => (
            DEFAULT_STRATEGY.to_string(),
            toml::Table::new(),
            key.to_string(),
        ),
        Some(toml::Value::String(s)) => (s, toml::Table::new(), key.to_string()),
        Some(toml::Value::Table(mut t)) => match t.remove("name") {
            Some(toml::Value::String(s)) => (s, t, join(key, "name")),
            Some(other) => {
                errs.push(
                    join(key, "name"),
                    format!(
                        "strategy name must be a string, found a {}",
                        other.type_str()
                    ),
                    "write name = \"round_robin\" (or another strategy name)",
                );
                return None;
            }
            None => {
                errs.push(
                    join(key, "name"),
                    "strategy table has no `name`",
                    "add name = \"…\" to the strategy table, e.g. name = \"round_robin\"",
                );
                return None;
            }
        },
        Some(other) => {
            errs.push(
                key,
                format!("strategy must be a string or a table, found a {}", other.type_str()),
                "write strategy = \"round_robin\", or a [routes.strategy] table with `name` and options",
            );
            return None;
        }
    };
    if name.is_empty() {
        errs.push(
            &name_key,
            "strategy name is empty",
            "name a strategy, e.g. \"round_robin\"",
        );
        return None;
    }
    match StrategySpec::parse(&name, &options) {
        Ok(spec) => Some(spec),
        Err(problems) => {
            for p in problems {
                if p.key == "name" {
                    let fix = p.fix.unwrap_or_else(|| {
                        "use one of the valid strategy names listed in the message".into()
                    });
                    errs.push(&name_key, p.message, fix);
                } else {
                    let k = join(key, &p.key);
                    let fix = p.fix.unwrap_or_else(|| {
                        format!(
                            "correct or remove `{k}`; see the options documented for strategy `{name}` (`rolter strategies`)"
                        )
                    });
                    errs.push(k, p.message, fix);
                }
            }
            None
        }
    }
}
