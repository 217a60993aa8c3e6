//! `discover` entries: one target per looked-up member, routes over them, the errors, and
//! a new member set put in the group's place.

use super::*;

const GROUP: &str = "[[targets]]\nname = \"solo\"\nurl = \"http://192.0.2.9:8000\"\n\n\
    [[targets]]\nname = \"vllm\"\ndiscover = { dns = \"vllm.svc\", port = 8000 }\nmax_concurrent = 4\n\n\
    [[targets]]\nname = \"last\"\nurl = \"http://192.0.2.10:8000\"\n\n\
    [[routes]]\nname = \"main\"\ntargets = [\"vllm\", \"last\"]\n\n\
    [[routes]]\nname = \"all\"\ntargets = [\"solo\", \"vllm\"]\n";

fn names(c: &Config, targets: &[usize]) -> Vec<String> {
    targets.iter().map(|&t| c.targets[t].name.clone()).collect()
}

#[test]
fn an_entry_becomes_one_target_per_address_with_its_settings_and_routes_get_them_all() {
    let c = load(GROUP).unwrap();
    let all: Vec<&str> = c.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        all,
        ["solo", "vllm/192.0.2.1:8000", "vllm/192.0.2.2:8000", "last"]
    );
    let m = &c.targets[2];
    assert_eq!(m.addr, "192.0.2.2:8000".parse().unwrap());
    assert_eq!(m.url, "http://192.0.2.2:8000");
    assert_eq!(m.host_header, "vllm.svc:8000");
    assert_eq!(
        m.max_concurrent,
        Some(4),
        "members inherit the entry's settings"
    );
    assert_eq!(m.member_of.as_deref(), Some("vllm"));
    assert_eq!(m.dns_name, None, "a member is its address");
    assert_eq!(
        names(&c, &c.routes[0].targets),
        ["vllm/192.0.2.1:8000", "vllm/192.0.2.2:8000", "last"]
    );
    assert_eq!(
        names(&c, &c.routes[1].targets),
        ["solo", "vllm/192.0.2.1:8000", "vllm/192.0.2.2:8000"]
    );
    assert_eq!(c.discovery.len(), 1);
    assert_eq!(c.discovery[0].members.len(), 2);
}

#[test]
fn a_new_member_set_takes_the_groups_place_and_keeps_every_other_target() {
    let c = load(GROUP).unwrap();
    let mut members = c.discovery[0].members.clone();
    members.remove(0);
    members.push(crate::discover::Member {
        host: "192.0.2.3".into(),
        addr: "192.0.2.3:8000".parse().unwrap(),
        priority: 0,
        weight: 1,
    });
    let n = c.rediscovered("vllm", members).unwrap();
    let all: Vec<&str> = n.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        all,
        ["solo", "vllm/192.0.2.2:8000", "vllm/192.0.2.3:8000", "last"]
    );
    assert_eq!(
        names(&n, &n.routes[0].targets),
        ["vllm/192.0.2.2:8000", "vllm/192.0.2.3:8000", "last"]
    );
    assert_eq!(
        names(&n, &n.routes[1].targets),
        ["solo", "vllm/192.0.2.2:8000", "vllm/192.0.2.3:8000"]
    );
    let kept = crate::reload::unchanged_targets(&c.targets, &n.targets);
    assert_eq!(
        kept,
        [Some(0), Some(2), None, Some(3)],
        "unchanged targets carry over"
    );
    assert!(
        c.rediscovered("vllm", Vec::new()).is_none(),
        "never an empty group"
    );
    assert!(c
        .rediscovered("other", c.discovery[0].members.clone())
        .is_none());
}

#[test]
fn srv_records_give_ports_weights_and_tiers() {
    let c = load(
        "[[targets]]\nname = \"pool\"\nweight = 2.0\n\
         discover = { srv = \"_http._tcp.vllm.svc\", https = true, path = \"/v1\" }\n",
    )
    .unwrap();
    let t: Vec<(&str, f64, u32, &str)> = c
        .targets
        .iter()
        .map(|t| (t.name.as_str(), t.weight, t.tier, t.url.as_str()))
        .collect();
    assert_eq!(
        t,
        [
            ("pool/a.vllm.svc:8000", 1.0, 0, "https://192.0.2.1:8000/v1"),
            ("pool/b.vllm.svc:8001", 2.0, 0, "https://192.0.2.2:8001/v1"),
            ("pool/c.vllm.svc:8002", 2.0, 1, "https://192.0.2.3:8002/v1"),
        ]
    );
    assert_eq!(
        c.targets[0].server_name, "a.vllm.svc",
        "TLS verifies the SRV target's name"
    );
    assert_eq!(c.targets[0].base_path, "/v1");
}

#[test]
fn a_wrong_discover_entry_names_its_key_and_the_fix() {
    let cases = [
        (
            "discover = { dns = \"vllm.svc\" }",
            "targets[0].discover.port",
            "needs the engines' port",
        ),
        (
            "discover = { srv = \"_x._tcp.vllm.svc\", port = 80 }",
            "targets[0].discover.port",
            "carries its own port",
        ),
        (
            "discover = { dns = \"a\", srv = \"b\" }",
            "targets[0].discover",
            "exactly one of",
        ),
        (
            "url = \"http://192.0.2.1:8000\"\ndiscover = { dns = \"vllm.svc\", port = 1 }",
            "targets[0].discover",
            "both `url` and `discover`",
        ),
        (
            "dp_size = 2\ndiscover = { dns = \"vllm.svc\", port = 1 }",
            "targets[0].discover",
            "`dp_size` names one engine",
        ),
        (
            "discover = { dns = \"vllm.svc\", port = 1, path = \"v1\" }",
            "targets[0].discover.path",
            "start with /",
        ),
        (
            "discover = { dns = \"missing.svc\", port = 8000 }",
            "targets[0].discover",
            "looking up A/AAAA missing.svc (port 8000) failed: no such name",
        ),
        (
            "discover = { dns = \"vllm.svc\", port = 1, prot = 2 }",
            "targets[0].discover.prot",
            "",
        ),
    ];
    for (entry, key, message) in cases {
        let errs = errors(&format!("[[targets]]\nname = \"g\"\n{entry}\n"));
        let e = error_at(&errs, key);
        assert!(e.message.contains(message), "{entry}: {e}");
        assert!(!e.fix.is_empty(), "{entry}: {e}");
    }
    let errs = errors(&format!(
        "[server]\nnameservers = [\"dns.local\"]\n{}",
        "[[targets]]\nname = \"e\"\nurl = \"http://192.0.2.1:8000\"\n"
    ));
    error_at(&errs, "server.nameservers[0]");
    let c = load(
        "[server]\nnameservers = [\"10.96.0.10\", \"127.0.0.1:5353\"]\n\
         [[targets]]\nname = \"e\"\nurl = \"http://192.0.2.1:8000\"\n",
    )
    .unwrap();
    assert_eq!(
        c.server.nameservers,
        [
            "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        ]
    );
}
