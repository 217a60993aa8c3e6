//! Durations, unknown keys, TOML errors and how errors are reported.

use super::*;

// ------------------------------------------------------------------ durations

#[test]
fn duration_errors() {
    let text = format!(
        "[server]\nshutdown_grace = \"soon\"\n[server.limits]\nhead_timeout = \"0s\"\n\
         body_timeout = 30\nwrite_timeout = true\n{ONE_TARGET}\
         [targets.timeouts]\nconnect = \"0ms\"\nfirst_byte = \"2m\"\nidle = \"10 parsecs\"\n\
         [targets.pool]\nidle_timeout = \"0s\"\n"
    );
    let errs = errors(&text);
    assert!(error_at(&errs, "server.shutdown_grace")
        .message
        .contains("not a duration"));
    assert!(error_at(&errs, "server.limits.head_timeout")
        .message
        .contains("zero"));
    assert!(error_at(&errs, "server.limits.body_timeout")
        .fix
        .contains("\"30s\""));
    error_at(&errs, "server.limits.write_timeout");
    error_at(&errs, "targets[0].timeouts.connect");
    error_at(&errs, "targets[0].timeouts.idle");
    error_at(&errs, "targets[0].pool.idle_timeout");
    assert_eq!(errs.len(), 7, "{}", ConfigErrors { errors: errs });
}

#[test]
fn durations_parse() {
    let c = load(&format!(
        "{ONE_TARGET}[targets.timeouts]\nconnect = \"250ms\"\nfirst_byte = \"2m\"\nidle = \"1h 30m\"\n"
    ))
    .unwrap();
    let t = &c.targets[0].timeouts;
    assert_eq!(t.connect, Duration::from_millis(250));
    assert_eq!(t.first_byte, Duration::from_secs(120));
    assert_eq!(t.idle, Duration::from_secs(5400));
}

// ------------------------------------------------------------------ unknown keys

#[test]
fn unknown_keys_everywhere_with_suggestions() {
    let text = "\
servr = 1
[server]
listn = \"127.0.0.1:1\"
[server.limits]
max_body_byte = 10
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
price = { input = 1.0, output = 2.0, ouput = 3.0 }
[targets.timeouts]
conect = \"1s\"
[targets.pool]
max_idel = 3
[[targets]]
name = \"b\"
url = \"http://10.0.0.2\"
wieght = 2.0
[[routes]]
name = \"r\"
targets = [\"a\"]
retry = 2
[routes.match]
pathz = [\"/v1/completions\"]
header = { name = \"x\", value = \"y\", vlaue = \"z\" }
";
    let errs = errors(text);
    let expect = [
        ("servr", "server"),
        ("server.listn", "listen"),
        ("server.limits.max_body_byte", "max_body_bytes"),
        ("targets[0].price.ouput", "output"),
        ("targets[0].timeouts.conect", "connect"),
        ("targets[0].pool.max_idel", "max_idle"),
        ("targets[1].wieght", "weight"),
        ("routes[0].retry", "retries"),
        ("routes[0].match.pathz", "paths"),
        ("routes[0].match.header.vlaue", "value"),
    ];
    for (key, suggestion) in expect {
        let e = error_at(&errs, key);
        assert!(e.message.contains("unknown key"), "{e}");
        assert!(
            e.fix.contains(&format!("did you mean `{suggestion}`?")),
            "{e}"
        );
    }
    assert_eq!(
        errs.len(),
        expect.len(),
        "{}",
        ConfigErrors { errors: errs }
    );
}

#[test]
fn misspelled_table_is_an_unknown_key() {
    let errs = errors(&format!("[server.limts]\nmax_headers = 5\n{ONE_TARGET}"));
    let e = error_at(&errs, "server.limts");
    assert!(e.fix.contains("`limits`"), "{e}");
}

#[test]
fn known_keys_match_structs() {
    // Every key listed as valid is accepted by the serde types (no unknown-key error).
    let tables: [(&str, &[&str]); 23] = [
        ("", raw::TOP_KEYS),
        ("[server]\n", raw::SERVER_KEYS),
        ("[server.limits]\n", raw::LIMITS_KEYS),
        ("[[targets]]\n", raw::TARGET_KEYS),
        ("[[targets]]\n[targets.price]\n", raw::PRICE_KEYS),
        ("[[targets]]\n[targets.timeouts]\n", raw::TIMEOUTS_KEYS),
        ("[[targets]]\n[targets.pool]\n", raw::POOL_KEYS),
        (
            "[[targets]]\n[targets.kv_events]\n",
            raw::TARGET_KV_EVENTS_KEYS,
        ),
        ("[[routes]]\n", raw::ROUTE_KEYS),
        ("[[routes]]\n[routes.match]\n", raw::MATCH_KEYS),
        ("[[routes]]\n[routes.prefill]\n", raw::PD_POOL_KEYS),
        ("[[routes]]\n[routes.decode]\n", raw::PD_POOL_KEYS),
        (
            "[[routes]]\n[routes.match.header]\n",
            raw::HEADER_MATCH_KEYS,
        ),
        ("[health]\n", raw::HEALTH_KEYS),
        ("[metrics_scrape]\n", raw::SCRAPE_KEYS),
        ("[admin]\n", raw::ADMIN_KEYS),
        ("[adaptive]\n", raw::ADAPTIVE_KEYS),
        ("[kv_events]\n", raw::KV_EVENTS_KEYS),
        ("[log]\n", raw::LOG_KEYS),
        ("[state]\n", raw::STATE_KEYS),
        ("[auth]\n", raw::AUTH_KEYS),
        ("[[keys]]\n", raw::KEY_KEYS),
        ("[catalog.m]\n", raw::PRICE_KEYS),
    ];
    for (header, keys) in tables {
        for key in keys {
            let text = format!("{header}{key} = 1\n");
            if let Err(errs) = load(&text) {
                for e in &errs {
                    assert!(!e.message.contains("unknown key"), "{text}: {e}");
                }
            }
        }
        // And an unlisted key is reported.
        let text = format!("{header}zzz_unlisted = 1\n");
        let errs = load(&text).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.message.contains("unknown key `zzz_unlisted`")),
            "{text}: {errs}"
        );
    }
}

#[test]
fn strategy_options_are_not_unknown_keys() {
    let text = format!(
        "{ONE_TARGET}[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n[routes.strategy]\n\
         name = \"round_robin\"\nzzz_not_an_option = 3\n"
    );
    let errs = errors(&text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    let e = error_at(&errs, "routes[0].strategy.zzz_not_an_option");
    assert!(!e.message.contains("unknown key"));
}

// ------------------------------------------------------------------ serde / TOML errors

#[test]
fn type_error_has_line_column_and_key() {
    let text = format!("{ONE_TARGET}[[targets]]\nname = \"b\"\nurl = 5\n");
    let errs = errors(&text);
    assert_eq!(
        errs.len(),
        1,
        "{}",
        ConfigErrors {
            errors: errs.clone()
        }
    );
    let e = &errs[0];
    assert_eq!(e.key, "targets[1].url");
    assert!(e.message.starts_with("line 6, column 7: "), "{e}");
    assert!(e.message.contains("string"), "{e}");
}

#[test]
fn type_error_in_server() {
    let errs = errors(&format!("[server]\nworkers = \"four\"\n{ONE_TARGET}"));
    let e = &errs[0];
    assert_eq!(e.key, "server.workers");
    assert!(e.message.starts_with("line 2, column 11"), "{e}");
}

#[test]
fn unknown_keys_reported_alongside_type_error() {
    let errs = errors(&format!(
        "[server]\nlistn = \"x\"\nworkers = \"four\"\n{ONE_TARGET}"
    ));
    error_at(&errs, "server.listn");
    error_at(&errs, "server.workers");
}

#[test]
fn type_error_reported_with_every_other_error() {
    // `weight` wants a number: serde stops at it, yet the other target and the route are
    // still validated, and each error names its key and the fix.
    let text = "\
[[targets]]
name = \"a\"
url = \"http://10.0.0.1:8000\"
weight = \"2\"
[[targets]]
name = \"b\"
url = \"gopher://x\"
[[routes]]
name = \"r\"
targets = [\"a\", \"b\"]
strategy = \"fastestt\"
";
    let errs = errors(text);
    let all = ConfigErrors {
        errors: errs.clone(),
    };
    let e = error_at(&errs, "targets[0].weight");
    assert!(e.message.starts_with("line 4, column 10: "), "{e}");
    assert!(e.message.contains("expected a number"), "{e}");
    assert_eq!(e.fix, "write a number at line 4, column 10", "{e}");
    assert!(
        error_at(&errs, "targets[1].url").message.contains("gopher"),
        "{all}"
    );
    assert!(
        error_at(&errs, "routes[0].strategy")
            .message
            .contains("fastestt"),
        "{all}"
    );
    assert_eq!(errs.len(), 3, "{all}");
    assert!(
        all.to_string()
            .lines()
            .all(|l| l.starts_with("test.toml: ")),
        "{all}"
    );
}

#[test]
fn every_type_error_is_reported() {
    // Two in one target, one in [server], one in an array and one in an inline table, with an
    // unknown key and a validation error besides.
    let text = "\
[server]
workers = \"four\"
listn = \"x\"
[[targets]]
name = \"a\"
url = \"http://10.0.0.1:8000\"
weight = \"2\"
max_concurrent = true
models = [\"m\", 3]
headers = { x = 1 }
[targets.timeouts]
connect = \"0s\"
";
    let errs = errors(text);
    let all = ConfigErrors {
        errors: errs.clone(),
    };
    for key in [
        "server.workers",
        "targets[0].weight",
        "targets[0].max_concurrent",
        "targets[0].models[1]",
        "targets[0].headers.x",
    ] {
        let e = error_at(&errs, key);
        assert!(e.message.contains("invalid type"), "{e}");
        assert!(e.fix.starts_with("write "), "{e}");
    }
    error_at(&errs, "server.listn");
    error_at(&errs, "targets[0].timeouts.connect");
    assert_eq!(errs.len(), 7, "{all}");
}

#[test]
fn dropped_value_is_not_reported_again() {
    // `name = 5` is a type error; the target is then validated without a name, which is
    // not a second error at the same key.
    let errs = errors("[[targets]]\nname = 5\nurl = \"http://10.0.0.1\"\n");
    let e = error_at(&errs, "targets[0].name");
    assert!(e.message.contains("expected a string"), "{e}");
    assert_eq!(errs.len(), 1, "{}", ConfigErrors { errors: errs });
    // A whole section of the wrong type is one error too.
    let errs = errors(&format!("server = 5\n{ONE_TARGET}"));
    error_at(&errs, "server");
    assert_eq!(errs.len(), 1, "{}", ConfigErrors { errors: errs });
}

#[test]
fn syntax_errors_have_line_and_column() {
    let errs = errors("[[targets]]\nname = \"a\nurl = \"http://10.0.0.1\"\n");
    let e = &errs[0];
    assert!(e.message.starts_with("line 2, column"), "{e}");
    assert!(e.fix.contains("line 2"), "{e}");
    // Each error renders on exactly one line.
    let all = ConfigErrors { errors: errs }.to_string();
    assert_eq!(all.lines().count(), all.matches("(fix: ").count());
}

#[test]
fn duplicate_key_is_a_syntax_error() {
    let errs = errors("[[targets]]\nname = \"a\"\nname = \"b\"\nurl = \"http://10.0.0.1\"\n");
    assert!(errs[0].message.starts_with("line 3"), "{}", errs[0]);
}

// ------------------------------------------------------------------ reporting

#[test]
fn many_errors_reported_at_once() {
    let text = "\
[server]
workers = -4
drivr = \"epoll\"
[[targets]]
name = \"a\"
url = \"gopher://x\"
[[targets]]
name = \"a\"
url = \"http://10.0.0.2\"
headers = { x = \"${NOT_SET_ANYWHERE}\" }
[targets.timeouts]
connect = \"0s\"
[[routes]]
name = \"r\"
targets = [\"zzz\"]
retries = 50
";
    let errs = load(text).unwrap_err();
    let keys: Vec<&str> = errs.iter().map(|e| e.key.as_str()).collect();
    for key in [
        "server.drivr",
        "server.workers",
        "targets[0].url",
        "targets[1].headers.x",
        "targets[1].timeouts.connect",
        "targets[1].name",
        "routes[0].targets[0]",
        "routes[0].retries",
    ] {
        assert!(keys.contains(&key), "missing {key} in {keys:?}");
    }
    assert_eq!(errs.len(), 8, "{errs}");
    let shown = errs.to_string();
    assert_eq!(shown.lines().count(), 8);
    for line in shown.lines() {
        assert!(line.starts_with("test.toml: "), "{line}");
        assert!(line.ends_with(')') && line.contains(" (fix: "), "{line}");
    }
}

#[test]
fn error_display_format() {
    let e = ConfigError {
        file: "f.toml".into(),
        key: "targets[1].url".into(),
        message: "bad".into(),
        fix: "do better".into(),
    };
    assert_eq!(
        e.to_string(),
        "f.toml: targets[1].url: bad (fix: do better)"
    );
    let all = ConfigErrors {
        errors: vec![e.clone(), e],
    };
    assert_eq!(all.to_string().lines().count(), 2);
    let _: &dyn std::error::Error = &all;
}

#[test]
fn load_file_missing_file() {
    let errs = load_file(std::path::Path::new("/nonexistent/rolter.toml")).unwrap_err();
    assert_eq!(errs.errors[0].file, "/nonexistent/rolter.toml");
    assert!(errs.errors[0].message.contains("cannot read"));
}

#[test]
fn every_error_has_a_fix() {
    let texts = [
        FLEET.replace("round_robin", "bogus"),
        "x = [".to_string(),
        "[[targets]]\nname = 1\n".to_string(),
    ];
    for t in &texts {
        for e in &load(t).unwrap_err() {
            assert!(!e.message.is_empty() && !e.fix.is_empty(), "{e}");
            assert!(!e.key.is_empty(), "{e}");
        }
    }
}

#[test]
fn config_is_plain_data() {
    fn assert_plain<T: Clone + Send + Sync + 'static>() {}
    assert_plain::<Config>();
    assert_plain::<ConfigErrors>();
}

#[test]
fn edit_distance_basics() {
    assert_eq!(raw::edit_distance("listen", "listen"), 0);
    assert_eq!(raw::edit_distance("listn", "listen"), 1);
    assert_eq!(raw::edit_distance("Weight", "wieght"), 2);
    assert_eq!(raw::closest("conect", raw::TIMEOUTS_KEYS), Some("connect"));
}

// ------------------------------------------------------------------ unknown keys in the new tables

#[test]
fn unknown_keys_in_new_tables_with_suggestions() {
    let text = "\
helth = 1
metric_scrape = 2
[health]
intervl = \"5s\"
[metrics_scrape]
enabeld = true
[admin]
tokn = \"x\"
[adaptive]
enable = false
[catalog]
m = { input = 1.0, output = 2.0, ouptut = 3.0 }
\"org/model\" = { input = 1.0, output = 2.0, inptu = 3.0 }
[[targets]]
name = \"a\"
url = \"http://10.0.0.1\"
helth_path = \"/h\"
scrap = false
metrics_pth = \"/m\"
";
    let errs = errors(text);
    let expect = [
        ("helth", "health"),
        ("metric_scrape", "metrics_scrape"),
        ("health.intervl", "interval"),
        ("metrics_scrape.enabeld", "enabled"),
        ("admin.tokn", "token"),
        ("adaptive.enable", "enabled"),
        ("catalog.m.ouptut", "output"),
        ("catalog.\"org/model\".inptu", "input"),
        ("targets[0].helth_path", "health_path"),
        ("targets[0].scrap", "scrape"),
        ("targets[0].metrics_pth", "metrics_path"),
    ];
    for (key, suggestion) in expect {
        let e = error_at(&errs, key);
        assert!(e.message.contains("unknown key"), "{e}");
        assert!(
            e.fix.contains(&format!("did you mean `{suggestion}`?")),
            "{e}"
        );
    }
    assert_eq!(
        errs.len(),
        expect.len(),
        "{}",
        ConfigErrors { errors: errs }
    );
}
