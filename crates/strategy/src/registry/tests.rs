use crate::registry::StrategySpec;
use crate::testing::validate_spec;

#[test]
fn adaptive_needs_one_weight_above_zero() {
    let t: toml::Table = toml::from_str("w_latency = 0\nw_cost = 0.0\nw_load = 0").unwrap();
    let errs = validate_spec("adaptive", &t).unwrap_err();
    assert_eq!(errs[0].0, "w_latency");
    assert!(errs[0].1.contains("at least"), "{errs:?}");
    let t: toml::Table = toml::from_str("w_latency = 0\nw_cost = 0").unwrap();
    assert_eq!(validate_spec("adaptive", &t), Ok("adaptive"));
}

#[test]
fn aliases_resolve() {
    for (alias, canonical) in [
        ("weighted", "round_robin"),
        ("weighted_round_robin", "round_robin"),
        ("smooth_weighted_round_robin", "round_robin"),
        ("round_robin", "round_robin"),
        ("random", "random"),
        ("random_weighted", "random_weighted"),
        ("p2c", "power_of_two"),
        ("power_of_two", "power_of_two"),
        ("least_loaded", "least_loaded"),
        ("active_passive", "failover"),
    ] {
        assert_eq!(validate_spec(alias, &toml::Table::new()), Ok(canonical));
    }
}

#[test]
fn failover_sub_strategy_is_checked() {
    let mut t = toml::Table::new();
    t.insert("within_tier".into(), toml::Value::String("p2c".into()));
    assert_eq!(validate_spec("failover", &t), Ok("failover"));
    t.insert(
        "within_tier".into(),
        toml::Value::String("active_passive".into()),
    );
    assert!(validate_spec("failover", &t).is_err());
    t.insert("within_tier".into(), toml::Value::String("nope".into()));
    assert!(validate_spec("failover", &t).unwrap_err()[0]
        .1
        .contains("valid names"));
}

#[test]
fn unknown_name_lists_valid_names() {
    let err = validate_spec("fastestt", &toml::Table::new()).unwrap_err();
    assert_eq!(err[0].0, "name");
    assert!(err[0].1.contains("round_robin") && err[0].1.contains("random"));
}

#[test]
fn unknown_name_suggests_the_closest() {
    for (typo, best) in [
        ("fastestt", "fastest"),
        ("round-robin", "round_robin"),
        ("least_loded", "least_loaded"),
        ("Random", "random"),
    ] {
        assert_eq!(crate::registry::closest_name(typo), Some(best), "{typo}");
        let err = StrategySpec::parse(typo, &toml::Table::new())
            .err()
            .unwrap();
        let fix = err[0].fix.as_deref().unwrap_or_default();
        assert!(
            fix.contains(&format!("did you mean `{best}`?")),
            "{typo}: {fix}"
        );
    }
    // Nothing close: no suggestion, only the list.
    assert_eq!(crate::registry::closest_name("zzzzzzzzzzzz"), None);
    let err = StrategySpec::parse("zzzzzzzzzzzz", &toml::Table::new())
        .err()
        .unwrap();
    assert_eq!(err[0].fix, None);
    assert!(err[0].message.contains("valid names"));
}

#[test]
fn options_are_checked() {
    let mut t = toml::Table::new();
    t.insert("lease".into(), toml::Value::Integer(8));
    t.insert("bogus".into(), toml::Value::Integer(1));
    let err = validate_spec("round_robin", &t).unwrap_err();
    assert_eq!(err.len(), 2, "{err:?}");
    assert!(err
        .iter()
        .any(|e| e.1.contains("only applies with atomic = true")));
    let mut t = toml::Table::new();
    t.insert("atomic".into(), toml::Value::String("no".into()));
    assert!(validate_spec("round_robin", &t).unwrap_err()[0]
        .1
        .contains("boolean"));
    let mut t = toml::Table::new();
    t.insert("atomic".into(), toml::Value::Boolean(false));
    assert_eq!(validate_spec("round_robin", &t), Ok("round_robin"));
    assert!(validate_spec("random", &t).is_err());
}

#[test]
fn every_option_has_help_and_every_help_line_an_option() {
    for info in crate::registry::all() {
        let mut fields = info.option_fields();
        let mut keys: Vec<String> = info.option_keys().map(String::from).collect();
        fields.sort_unstable();
        keys.sort_unstable();
        assert_eq!(fields, keys, "strategy {}", info.name);
    }
}

#[test]
fn the_listed_defaults_are_the_options_defaults() {
    for info in crate::registry::all() {
        let spec = crate::registry::StrategySpec::with_defaults(info.name).unwrap();
        assert!(spec.is_default(), "{}", info.name);
        let defaults = spec.to_table();
        for line in info.options() {
            assert_eq!(
                line.default,
                defaults.get(line.key).map(crate::options::render),
                "{}.{}",
                info.name,
                line.key
            );
            // What is listed parses back to the default itself.
            if let Some(d) = &line.default {
                let t: toml::Table = toml::from_str(&format!("{} = {d}", line.key))
                    .unwrap_or_else(|e| panic!("{}.{} = {d}: {e}", info.name, line.key));
                let mut with = spec.to_table();
                with.extend(t);
                if let Ok(parsed) = crate::registry::StrategySpec::parse(info.name, &with) {
                    assert!(parsed.is_default(), "{}.{} = {d}", info.name, line.key);
                }
            }
        }
        // An empty table means the defaults (a strategy with a required option refuses it).
        if let Ok(parsed) = crate::registry::StrategySpec::parse(info.name, &toml::Table::new()) {
            assert_eq!(parsed, spec, "{}", info.name);
        }
    }
}

#[test]
fn requirements_agree_with_what_instances_ask_for() {
    let ctx = crate::testing::context(&[1.0, 1.0], &[]);
    let lmcache = "controller = \"http://127.0.0.1:9000\"";
    for info in crate::registry::all() {
        let options = if info.name == "lmcache_aware" {
            lmcache
        } else {
            ""
        };
        let spec = crate::testing::spec(info.name, options);
        let needs = spec.build(&ctx).needs();
        let req = spec.requirements();
        assert_eq!(
            needs.contains(rolter_core::Needs::TOKEN_IDS),
            req.token_ids.is_some(),
            "{}",
            info.name
        );
        assert_eq!(
            needs.contains(rolter_core::Needs::CACHE_LOOKUP),
            req.cache_lookup.is_some(),
            "{}",
            info.name
        );
    }
    // Through a wrapper, the inner strategy's needs and requirements both pass.
    for (wrapper, option) in [
        ("failover", "within_tier"),
        ("adaptive", "fallback_strategy"),
        ("fair_catchup", "base_strategy"),
    ] {
        let text =
            format!("{option} = {{ name = \"lmcache_aware\", controller = \"http://127.0.0.1:9000\" }}\nw_cost = 0");
        let text = if wrapper == "adaptive" {
            text
        } else {
            text.replace("\nw_cost = 0", "")
        };
        let spec = crate::testing::spec(wrapper, &text);
        let needs = spec.build(&ctx).needs();
        assert!(needs.contains(rolter_core::Needs::TOKEN_IDS), "{wrapper}");
        assert!(
            needs.contains(rolter_core::Needs::CACHE_LOOKUP),
            "{wrapper}"
        );
        let req = spec.requirements();
        assert!(
            req.token_ids.is_some() && req.cache_lookup.is_some(),
            "{wrapper}"
        );
    }
}

#[test]
fn price_use_is_found_through_every_wrapper() {
    let by = |name: &str, options: &str| {
        crate::testing::spec(name, options)
            .requirements()
            .prices
            .map(|p| p.by)
    };
    assert_eq!(by("cheapest", ""), Some("`cheapest`".into()));
    assert_eq!(by("round_robin", ""), None);
    assert_eq!(
        by("adaptive", ""),
        Some("`adaptive` with w_cost = 1 (the default)".into())
    );
    assert_eq!(by("adaptive", "w_cost = 0"), None);
    assert_eq!(
        by("adaptive", "w_cost = 0\nfallback_strategy = \"cheapest\""),
        Some("`adaptive` with fallback_strategy `cheapest`".into())
    );
    assert_eq!(
        by("failover", "within_tier = \"cheapest\""),
        Some("`failover` with within_tier `cheapest`".into())
    );
    assert_eq!(
        by("fair_catchup", "base_strategy = \"cheapest\""),
        Some("`fair_catchup` with base_strategy `cheapest`".into())
    );
    assert_eq!(
        by(
            "failover",
            "within_tier = { name = \"fair_catchup\", base_strategy = \"cheapest\" }"
        ),
        Some("`failover` with within_tier `fair_catchup` with base_strategy `cheapest`".into())
    );
}

#[test]
fn inner_strategies_take_their_own_options() {
    let spec = crate::testing::spec(
        "failover",
        "within_tier = { name = \"cache_aware\", threshold = 0.8 }",
    );
    let o = spec
        .options::<crate::strategies::failover::Options>()
        .unwrap();
    let inner = o
        .within_tier
        .spec()
        .options::<crate::strategies::cache_aware::Options>()
        .unwrap();
    assert_eq!(inner.threshold, 0.8);
    // Written back, the table form round-trips.
    let again = crate::registry::StrategySpec::parse("failover", &spec.to_table()).unwrap();
    assert_eq!(again, spec);
    // An inner option error names the inner option.
    let t: toml::Table =
        toml::from_str("within_tier = { name = \"cache_aware\", threshold = 2 }").unwrap();
    let err = validate_spec("failover", &t).unwrap_err();
    assert_eq!(err[0].0, "within_tier");
    assert!(err[0].1.contains("`threshold`"), "{err:?}");
    let t: toml::Table = toml::from_str("within_tier = { threshold = 0.5 }").unwrap();
    assert!(validate_spec("failover", &t).unwrap_err()[0]
        .1
        .contains("name"));
}
