//! `[catalog]` and the price checks of price-ranked routes.

use super::*;

// ------------------------------------------------------------------ [catalog]

#[test]
fn catalog_values() {
    let c = load(&format!(
        "[catalog]\n\"meta-llama/Llama-3.1-8B\" = {{ input = 0.05, output = 0.08 }}\n\
         free = {{ input = 0, output = 0 }}\n{ONE_TARGET}"
    ))
    .unwrap();
    assert_eq!(c.catalog.len(), 2);
    assert_eq!(
        c.catalog["meta-llama/Llama-3.1-8B"],
        Price {
            input_per_mtok: 0.05,
            output_per_mtok: 0.08
        }
    );
    assert_eq!(c.catalog["free"].output_per_mtok, 0.0);
}

#[test]
fn catalog_errors() {
    let errs = errors(&format!(
        "[catalog]\na = {{ input = -1.0, output = 1.0 }}\nb = {{ input = 1.0 }}\n\
         \"c/d\" = {{ input = nan, output = inf }}\n\"\" = {{ input = 1.0, output = 1.0 }}\n{ONE_TARGET}"
    ));
    let e = error_at(&errs, "catalog.a.input");
    assert!(e.message.contains(">= 0"), "{e}");
    let e = error_at(&errs, "catalog.b.output");
    assert!(e.message.contains("no `output`"), "{e}");
    assert!(
        e.fix.contains("\"b\" = { input = 0.15, output = 0.60 }"),
        "{e}"
    );
    error_at(&errs, "catalog.\"c/d\".input");
    error_at(&errs, "catalog.\"c/d\".output");
    let e = error_at(&errs, "catalog.\"\"");
    assert!(e.message.contains("model name is empty"), "{e}");
    assert_eq!(errs.len(), 5, "{}", ConfigErrors { errors: errs });

    // An entry that is not a table is a type error at its key.
    let errs = errors(&format!("[catalog]\nm = 5\n{ONE_TARGET}"));
    let e = error_at(&errs, "catalog.m");
    assert!(e.message.contains("expected a table"), "{e}");
}

#[test]
fn catalog_overrides_resolve_through_price_book() {
    let c = load(&format!(
        "[catalog]\n\"gpt-4o-mini\" = {{ input = 1.0, output = 2.0 }}\n\
         private-llama = {{ input = 0.01, output = 0.02 }}\n\
         {ONE_TARGET}models = [\"mini\", \"4o\", \"llama\", \"mystery\"]\n\
         upstream_models = {{ mini = \"gpt-4o-mini\", 4o = \"gpt-4o\", llama = \"private-llama\" }}\n\
         [[targets]]\nname = \"b\"\nurl = \"http://10.0.0.2\"\nmodels = [\"gpt-4o-mini\"]\n\
         price = {{ input = 9.0, output = 9.5 }}\n\
         [[targets]]\nname = \"c\"\nurl = \"http://10.0.0.3\"\nmodels = [\"gpt-4o-mini\", \"gpt-4o\"]\n"
    ))
    .unwrap();
    let p = |i: f64, o: f64| Price {
        input_per_mtok: i,
        output_per_mtok: o,
    };
    let book = price_book(&c);
    // [catalog] beats the built-in price of gpt-4o-mini (0.15 / 0.60).
    assert_eq!(book.price(0, "mini"), Some(p(1.0, 2.0)));
    assert_eq!(book.price(2, "gpt-4o-mini"), Some(p(1.0, 2.0)));
    // Models [catalog] does not name keep their built-in price.
    assert_eq!(book.price(0, "4o"), rolter_core::builtin("gpt-4o"));
    assert_eq!(book.price(2, "gpt-4o"), Some(p(2.5, 10.0)));
    // Private models are priced by [catalog] alone; unknown ones have no price.
    assert_eq!(book.price(0, "llama"), Some(p(0.01, 0.02)));
    assert_eq!(book.price(0, "mystery"), None);
    // A target's own price beats both.
    assert_eq!(book.price(1, "gpt-4o-mini"), Some(p(9.0, 9.5)));
}

// ------------------------------------------------------------------ price checks for price-ranked routes

/// A strategy spec with `options` written as TOML.
pub(super) fn spec(name: &'static str, options: &str) -> StrategySpec {
    StrategySpec::parse(name, &options.parse::<toml::Table>().unwrap()).unwrap()
}

/// The errors `check_prices` reports for a loaded configuration.
pub(super) fn price_errors(c: &Config) -> Vec<ConfigError> {
    let routes: Vec<Option<Route>> = c.routes.iter().cloned().map(Some).collect();
    let targets: Vec<Option<Target>> = c.targets.iter().cloned().map(Some).collect();
    let mut errs = Collector::new("test.toml");
    let catalog = c.catalog.clone().into_iter().collect();
    check_prices(&routes, &targets, &catalog, &mut errs);
    errs.into_errors().errors
}

/// Targets: 0 "priced" (own price, any model), 1 "listed" (builtin, catalog and mapped
/// models), 2 "any" (no models, no price), 3 "private" (a model with no known price).
/// Route 0 "all" uses every target; route 1 "known" only the first two; route 2 "matched"
/// only serves model "known" of target 3.
const PRICE_FIXTURE: &str = "\
[catalog]
house-model = { input = 0.5, output = 1.0 }
[[targets]]
name = \"priced\"
url = \"http://10.0.0.1\"
price = { input = 0.2, output = 0.4 }
[[targets]]
name = \"listed\"
url = \"http://10.0.0.2\"
models = [\"gpt-4o-mini\", \"house\", \"claude\"]
upstream_models = { house = \"house-model\", claude = \"claude-3-5-haiku-latest\" }
[[targets]]
name = \"any\"
url = \"http://10.0.0.3\"
[[targets]]
name = \"private\"
url = \"http://10.0.0.4\"
models = [\"known\", \"secret\"]
upstream_models = { known = \"house-model\", secret = \"org/secret-7b\" }
[[routes]]
name = \"all\"
targets = [\"priced\", \"listed\", \"any\", \"private\"]
[[routes]]
name = \"known\"
targets = [\"priced\", \"listed\"]
[[routes]]
name = \"matched\"
targets = [\"private\"]
[routes.match]
models = [\"known\"]
";

fn price_fixture(strategy: StrategySpec) -> Config {
    let mut c = load(PRICE_FIXTURE).unwrap_or_else(|e| panic!("{e}"));
    for r in &mut c.routes {
        r.strategy = strategy.clone();
    }
    c
}

#[test]
fn check_prices_cheapest_names_route_target_and_model() {
    let errs = price_errors(&price_fixture(spec("cheapest", "")));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    // Route "all": target "any" has neither models nor price.
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("route `all`"), "{e}");
    assert!(e.message.contains("routes[0].strategy"), "{e}");
    assert!(e.message.contains("target `any`"), "{e}");
    assert!(e.message.contains("no `models` list"), "{e}");
    assert!(
        e.fix.contains(
            "add price = { input = 0.15, output = 0.60 } (per 1M tokens) to target \"any\""
        ),
        "{e}"
    );
    assert!(!e.fix.contains("w_cost"), "{e}");
    // Route "all": model "secret" of "private" maps to an unpriced upstream name; route
    // "matched" only serves "known", which is priced by [catalog].
    let e = error_at(&errs, "targets[3].price");
    assert!(e.message.contains("route `all`"), "{e}");
    assert!(e.message.contains("target `private`"), "{e}");
    assert!(e.message.contains("model `secret`"), "{e}");
    assert!(e.message.contains("upstream name `org/secret-7b`"), "{e}");
    assert!(e.fix.contains("to target \"private\""), "{e}");
    assert!(
        e.fix.contains("[catalog] entry \"org/secret-7b\" = {"),
        "{e}"
    );
    for e in &errs {
        assert_eq!(e.file, "test.toml");
        assert!(!e.fix.is_empty());
    }
}

#[test]
fn check_prices_skips_routes_that_do_not_rank_by_price() {
    for s in [
        spec("round_robin", ""),
        spec("least_loaded", ""),
        spec("adaptive", "w_cost = 0.0"),
        spec("adaptive", "w_cost = 0"),
        spec(
            "adaptive",
            "w_cost = 0.0\nfallback_strategy = \"least_loaded\"",
        ),
        spec("failover", "within_tier = \"p2c\""),
        spec("failover", ""),
    ] {
        let errs = price_errors(&price_fixture(s.clone()));
        assert!(errs.is_empty(), "{s:?}: {}", ConfigErrors { errors: errs });
    }
}

#[test]
fn check_prices_adaptive_with_cost_weight() {
    for (options, needle) in [
        ("", "w_cost = 1 (the default)"),
        ("w_cost = 0.25", "w_cost = 0.25"),
        ("w_cost = 2", "w_cost = 2"),
    ] {
        let errs = price_errors(&price_fixture(spec("adaptive", options)));
        assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
        let e = error_at(&errs, "targets[2].price");
        assert!(e.message.contains(needle), "{options}: {e}");
        assert!(
            e.fix
                .contains("or set w_cost = 0 in routes[0].strategy to rank without cost"),
            "{e}"
        );
    }
    // No cost weight, but cheapest as the fallback: prices are still needed.
    let errs = price_errors(&price_fixture(spec(
        "adaptive",
        "w_cost = 0.0\nfallback_strategy = \"cheapest\"",
    )));
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("fallback_strategy `cheapest`"), "{e}");
    assert!(!e.fix.contains("w_cost"), "{e}");
}

#[test]
fn check_prices_failover_within_cheapest() {
    let errs = price_errors(&price_fixture(spec(
        "failover",
        "within_tier = \"cheapest\"",
    )));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    assert!(error_at(&errs, "targets[2].price")
        .message
        .contains("within_tier `cheapest`"));
}

#[test]
fn check_prices_fair_catchup_over_cheapest() {
    let errs = price_errors(&price_fixture(spec(
        "fair_catchup",
        "base_strategy = \"cheapest\"",
    )));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let e = error_at(&errs, "targets[2].price");
    assert!(
        e.message
            .contains("strategy `fair_catchup` with base_strategy `cheapest`"),
        "{e}"
    );
    // Nested: the price need is found through every wrapper on the way.
    let errs = price_errors(&price_fixture(spec(
        "failover",
        "within_tier = { name = \"fair_catchup\", base_strategy = \"cheapest\" }",
    )));
    assert!(error_at(&errs, "targets[2].price")
        .message
        .contains("within_tier `fair_catchup` with base_strategy `cheapest`"));
}

#[test]
fn load_rejects_fair_catchup_over_cheapest_without_prices() {
    let text = PRICE_FIXTURE.replace(
        "name = \"all\"\n",
        "name = \"all\"\nstrategy = { name = \"fair_catchup\", base_strategy = \"cheapest\" }\n",
    );
    let errs = errors(&text);
    let e = error_at(&errs, "targets[2].price");
    assert!(
        e.message.contains("route `all`") && e.message.contains("target `any`"),
        "{e}"
    );
    assert!(e.message.contains("base_strategy `cheapest`"), "{e}");
}

#[test]
fn check_prices_without_gaps_is_quiet() {
    // Route "known" alone: own price, builtin, [catalog] through upstream_models.
    let mut c = price_fixture(spec("cheapest", ""));
    c.routes.remove(0);
    assert!(price_errors(&c).is_empty());
    // A [catalog] entry for the missing upstream name and a price on "any" close both gaps.
    let text = PRICE_FIXTURE
        .replace(
            "[catalog]\n",
            "[catalog]\n\"org/secret-7b\" = { input = 0.0, output = 0.0 }\n",
        )
        .replace(
            "name = \"any\"\n",
            "name = \"any\"\nprice = { input = 1.0, output = 1.0 }\n",
        );
    let mut c = load(&text).unwrap();
    for r in &mut c.routes {
        r.strategy = spec("cheapest", "");
    }
    assert!(price_errors(&c).is_empty());
}

#[test]
fn check_prices_skips_invalid_routes_and_targets() {
    let c = price_fixture(spec("cheapest", ""));
    let routes: Vec<Option<Route>> = vec![None, Some(c.routes[0].clone())];
    // Targets 2 and 3 were invalid (already reported): nothing more to say about them.
    let targets: Vec<Option<Target>> = vec![
        Some(c.targets[0].clone()),
        Some(c.targets[1].clone()),
        None,
        None,
    ];
    let mut errs = Collector::new("test.toml");
    let catalog = c.catalog.clone().into_iter().collect();
    check_prices(&routes, &targets, &catalog, &mut errs);
    assert!(errs.is_empty(), "{}", errs.into_errors());
}

// ------------------------------------------------------------------ price checks at load

#[test]
fn load_rejects_cheapest_route_without_prices() {
    let text = PRICE_FIXTURE.replace(
        "name = \"all\"\n",
        "name = \"all\"\nstrategy = \"cheapest\"\n",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let e = error_at(&errs, "targets[2].price");
    assert!(
        e.message.contains("route `all`") && e.message.contains("target `any`"),
        "{e}"
    );
    let e = error_at(&errs, "targets[3].price");
    assert!(e.message.contains("model `secret`"), "{e}");
    assert!(e.fix.contains("\"org/secret-7b\""), "{e}");
}

#[test]
fn load_accepts_cheapest_route_with_known_prices() {
    // Route "known" (own price, builtin, [catalog]) and route "matched" (only the priced
    // model of "private") load; route "all" keeps round_robin.
    let text = PRICE_FIXTURE
        .replace(
            "name = \"known\"\n",
            "name = \"known\"\nstrategy = \"cheapest\"\n",
        )
        .replace(
            "name = \"matched\"\n",
            "name = \"matched\"\nstrategy = \"cheapest\"\n",
        );
    let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[1].strategy.name(), "cheapest");
    let book = price_book(&c);
    for (target, model) in [
        (0, "anything"),
        (1, "gpt-4o-mini"),
        (1, "house"),
        (1, "claude"),
    ] {
        assert!(book.price(target, model).is_some(), "{target} {model}");
    }
}

#[test]
fn load_checks_adaptive_route_prices_unless_cost_is_off() {
    let with = |strategy: &str| {
        PRICE_FIXTURE.replace("name = \"all\"\n", &format!("name = \"all\"\n{strategy}\n"))
    };
    // Default w_cost (1.0): the same two gaps as for cheapest, with the w_cost hint.
    let errs = errors(&with("strategy = \"adaptive\""));
    assert_eq!(errs.len(), 2, "{}", ConfigErrors { errors: errs });
    let e = error_at(&errs, "targets[2].price");
    assert!(e.message.contains("strategy `adaptive`"), "{e}");
    assert!(e.fix.contains("w_cost = 0"), "{e}");
    // w_cost = 0: cost is not used, no price is needed.
    let c = load(&with("strategy = { name = \"adaptive\", w_cost = 0.0 }"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].strategy.name(), "adaptive");
}
