//! `[[classes]]`, the keys' `priority`, `set_priority` and `share`, the routes'
//! admission settings and the targets' `priority_field`.

use super::*;

const HASH: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

const CLASSES: &str = "[[classes]]\nname = \"interactive\"\nrank = 0\nreserve = 0.25\n\n[[classes]]\nname = \"batch\"\nrank = 1\n";

fn with(rest: &str) -> String {
    format!("{CLASSES}[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\nmax_concurrent = 8\npriority_field = \"priority\"\npriority_values = {{ batch = 10 }}\n{rest}")
}

#[test]
fn classes_keys_routes_and_targets_load_with_their_settings() {
    let c = load(&with(&format!(
        "[[routes]]\nname = \"r\"\ntargets = [\"a\"]\nqueue_max = 10\ndefault_class = \"batch\"\npriority_header = true\ntenant_header = \"X-Tenant\"\n\n[[keys]]\nname = \"k\"\nhash = \"{HASH}\"\npriority = \"interactive\"\nset_priority = true\nshare = 3\n"
    )))
    .unwrap();
    assert_eq!(c.classes.len(), 2);
    assert_eq!((c.classes[0].rank, c.classes[0].reserve), (0, 0.25));
    let r = &c.routes[0].admission;
    assert_eq!(r.default_class, 1);
    assert!(r.priority_header && !r.refuse_unmeetable);
    assert_eq!(r.tenant_header.as_deref(), Some("x-tenant"));
    let k = &c.keys.keys[0];
    assert_eq!((k.priority, k.set_priority, k.share), (Some(0), true, 3));
    let p = c.targets[0].priority.as_ref().unwrap();
    assert_eq!(p.field, "priority");
    assert_eq!(
        p.values,
        vec![0, 10],
        "a class's rank unless priority_values says"
    );
    // Batch may take 8 - floor(0.25 × 8) = 6 places; interactive all 8.
    assert_eq!(held_back(&c.classes, 1, 8), 2);
    assert_eq!(held_back(&c.classes, 0, 8), 0);
}

#[test]
fn without_classes_every_request_is_of_the_default_class() {
    let c = load(ONE_TARGET).unwrap();
    assert_eq!(c.classes, vec![PriorityClass::default_class()]);
    assert_eq!(c.routes[0].admission, RouteAdmission::default());
    let k = load(&format!(
        "{ONE_TARGET}[[keys]]\nname = \"k\"\nhash = \"{HASH}\"\n"
    ))
    .unwrap();
    assert_eq!((k.keys.keys[0].priority, k.keys.keys[0].share), (None, 1));
}

#[test]
fn every_wrong_admission_setting_names_its_key_and_a_fix() {
    let cases = [
        ("[[classes]]\nname = \"x\"\nrank = 9\n", "classes[0].rank"),
        ("[[classes]]\nname = \"x\"\n", "classes[0].rank"),
        ("[[classes]]\nname = \"x\"\nrank = 0\nreserve = 1.5\n", "classes[0].reserve"),
        ("[[classes]]\nname = \"x\"\nrank = 0\nreserve = 0.5\n[[classes]]\nname = \"y\"\nrank = 1\nreserve = 0.5\n", "classes"),
    ];
    for (text, key) in cases {
        let errs = errors(&format!("{text}{ONE_TARGET}"));
        let e = error_at(&errs, key);
        assert!(!e.fix.is_empty(), "{e}");
    }
    let route = |extra: &str| {
        with(&format!(
            "[[routes]]\nname = \"r\"\ntargets = [\"a\"]\n{extra}"
        ))
    };
    let e = errors(&route("default_class = \"gold\"\n"));
    assert!(error_at(&e, "routes[0].default_class")
        .fix
        .contains("interactive, batch"));
    let e = errors(&route("refuse_unmeetable = true\n"));
    assert!(error_at(&e, "routes[0].refuse_unmeetable")
        .fix
        .contains("predicted_latency"));
    assert!(load(&route("strategy = \"fastest\"\nrefuse_unmeetable = true\n")).is_ok());
    let e = errors(&route("tenant_header = \"bad header\"\n"));
    error_at(&e, "routes[0].tenant_header");
    let e = errors(&with(&format!(
        "[[keys]]\nname = \"k\"\nhash = \"{HASH}\"\npriority = \"gold\"\nshare = 0\n"
    )));
    error_at(&e, "keys[0].priority");
    error_at(&e, "keys[0].share");
    let e = errors(&format!(
        "{CLASSES}[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\npriority_field = \"model\"\n"
    ));
    error_at(&e, "targets[0].priority_field");
    let e = errors(&format!(
        "{CLASSES}[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\npriority_values = {{ batch = 1 }}\n"
    ));
    error_at(&e, "targets[0].priority_values");
    let e = errors(&format!(
        "{CLASSES}[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\npriority_field = \"priority\"\npriority_values = {{ gold = 1 }}\n"
    ));
    error_at(&e, "targets[0].priority_values.gold");
}

#[test]
fn a_prefill_pool_admits_like_its_route() {
    let c = load(&format!(
        "{CLASSES}[[targets]]\nname = \"p\"\nurl = \"http://10.0.0.1:8000\"\n[[targets]]\nname = \"d\"\nurl = \"http://10.0.0.2:8000\"\n[[routes]]\nname = \"r\"\ndefault_class = \"batch\"\ndisaggregation = \"vllm\"\nprefill = {{ targets = [\"p\"] }}\ndecode = {{ targets = [\"d\"] }}\n"
    ))
    .unwrap();
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[1].admission.default_class, 1);
}
