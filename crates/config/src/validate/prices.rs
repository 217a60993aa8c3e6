//! `[catalog]` and the price checks of routes that rank by price.

use super::common::*;
use super::targets::price;

pub(super) fn catalog(
    raw: Option<OrderedPrices>,
    errs: &mut Collector,
) -> Option<HashMap<String, Price>> {
    let Some(OrderedPrices(raw)) = raw else {
        return Some(HashMap::new());
    };
    let mut out = HashMap::with_capacity(raw.len());
    let mut ok = true;
    for (name, p) in raw {
        let key = if is_bare_key(&name) {
            format!("catalog.{name}")
        } else {
            format!("catalog.{name:?}")
        };
        if name.is_empty() {
            errs.push(
                &key,
                "model name is empty",
                "name the entry after the model name the upstream expects, e.g. \"gpt-4o-mini\" = { input = 0.15, output = 0.60 }",
            );
            ok = false;
            continue;
        }
        let example = format!("{name:?} = {{ input = 0.15, output = 0.60 }}");
        match price(p, &key, &example, errs) {
            Some(p) => {
                out.insert(name, p);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Every route whose strategy ranks by price (its requirements say so, through any wrapper)
/// must know a price for every model each of its targets can serve on it, resolved as
/// [`price_book`](crate::prices::price_book) does: the
/// target's `price`, else `[catalog]` by upstream model name, else the built-in catalog.
/// `routes` and `targets` are indexed as in the file; `None` entries (invalid, already
/// reported) are skipped.
pub(crate) fn check_prices(
    routes: &[Option<Route>],
    targets: &[Option<Target>],
    catalog: &HashMap<String, Price>,
    errs: &mut Collector,
) {
    for (ri, route) in routes.iter().enumerate() {
        let Some(route) = route else { continue };
        let Some(use_) = route.strategy.requirements().prices else {
            continue;
        };
        let need = format!("strategy {}", use_.by);
        let route_key = format!("routes[{ri}].strategy");
        let extra = match &use_.instead {
            Some(instead) => format!("; or {instead} in {route_key} to rank without cost"),
            None => String::new(),
        };
        for &id in &route.targets {
            let Some(t) = targets.get(id).and_then(Option::as_ref) else {
                continue;
            };
            if t.price.is_some() {
                continue;
            }
            let key = format!("targets[{id}].price");
            if t.models.is_empty() {
                errs.push(
                    &key,
                    format!(
                        "route `{}` uses {need} ({route_key}), which needs a price for every target, but target `{}` has no `price` and no `models` list, so it may serve any model at an unknown price",
                        route.name, t.name
                    ),
                    format!(
                        "add price = {{ input = 0.15, output = 0.60 }} (per 1M tokens) to target \"{}\", or list its `models` and give each a [catalog] entry such as \"model-name\" = {{ input = 0.15, output = 0.60 }}{extra}",
                        t.name
                    ),
                );
                continue;
            }
            for model in &t.models {
                if !route.matcher.models.is_empty() && !route.matcher.models.contains(model) {
                    continue;
                }
                let upstream = t.upstream_models.get(model).unwrap_or(model);
                if catalog.contains_key(upstream) || rolter_core::builtin(upstream).is_some() {
                    continue;
                }
                let upstream_note = if upstream == model {
                    String::new()
                } else {
                    format!(" (upstream name `{upstream}`)")
                };
                errs.push(
                    &key,
                    format!(
                        "route `{}` uses {need} ({route_key}), which needs a price for every model, but target `{}` has no `price` and model `{model}`{upstream_note} is neither in [catalog] nor in the built-in catalog",
                        route.name, t.name
                    ),
                    format!(
                        "add price = {{ input = 0.15, output = 0.60 }} (per 1M tokens) to target \"{}\", or a [catalog] entry {upstream:?} = {{ input = ..., output = ... }}{extra}",
                        t.name
                    ),
                );
            }
        }
    }
}
