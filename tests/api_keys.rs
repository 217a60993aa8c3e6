//! Client API keys (`[[keys]]`, `[auth] keys_file`), under both drivers: a missing or wrong
//! key is a 401, a key not allowed the route or the model a 403, each in the shape of the
//! surface called (OpenAI's on /v1/chat/completions, Anthropic's on /v1/messages); an
//! allowed key is served through `Authorization: Bearer` and `x-api-key` alike and never
//! reaches the engine; a key over `requests_per_minute` (spread over two workers and
//! several connections) or `tokens_per_minute` gets a 429 with `Retry-After`; a reload of
//! the keys file adds a key; the key's name is in the access log and the metrics while the
//! key and its hash appear in neither, nor in `/admin/config`; the official `openai` and
//! `anthropic` Python SDKs raise their own typed errors for each refusal
//! (tests/sdk/keys_client.py; needs python3 with both packages, as the test command
//! installs them).

mod common;

use std::path::{Path, PathBuf};

use common::scripted::WAIT;
use common::*;
use rolter::config::{self, DriverChoice};
use rolter::Gateway;
use rolter_mock::MockHandle;
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";
const KEY_A: &str = "rolter_test_key_alpha_0123456789abcdef";
const KEY_B: &str = "rolter_test_key_bravo_0123456789abcdef";
const KEY_C: &str = "rolter_test_key_charlie_0123456789abcdef";
const KEY_LIMITED: &str = "rolter_test_key_limited_0123456789abcdef";

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rolter-keys-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hash(key: &str) -> String {
    config::key_hash(key)
}

/// Two targets serving models "m" and "n", two routes by model (`rm` → "m", `rn` → "n"),
/// an admin listener, and `keys` (TOML) appended.
fn rest(m: &MockHandle, n: &MockHandle, keys: &str, log: Option<&Path>) -> String {
    let log = log.map_or(String::new(), |p| {
        format!("[log]\naccess = \"{}\"\n", p.display())
    });
    format!(
        "{log}[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[targets]]\nname = \"tm\"\nurl = \"http://{}\"\nmodels = [\"m\"]\n\
         [[targets]]\nname = \"tn\"\nurl = \"http://{}\"\nmodels = [\"n\"]\n\
         [[routes]]\nname = \"rm\"\ntargets = [\"tm\"]\n[routes.match]\nmodels = [\"m\"]\n\
         [[routes]]\nname = \"rn\"\ntargets = [\"tn\"]\n[routes.match]\nmodels = [\"n\"]\n\
         {keys}",
        m.addr(),
        n.addr()
    )
}

fn mocks() -> (MockHandle, MockHandle) {
    let m = mock("m", |_| {});
    let n = mock("n", |c| c.models = vec!["n".into()]);
    (m, n)
}

fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"Hello there"}}]}}"#)
}

fn messages(model: &str) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"Hello there"}}]}}"#
    )
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// The OpenAI error body's `code`.
fn openai_code(r: &Response) -> String {
    let j = r.json();
    assert!(j["error"]["message"].is_string(), "{}", r.text());
    j["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// Asserts an Anthropic-shaped error of `kind`.
fn assert_anthropic(r: &Response, status: u16, kind: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let j = r.json();
    assert_eq!(j["type"], "error", "{}", r.text());
    assert_eq!(j["error"]["type"], kind, "{}", r.text());
    assert!(j["error"]["message"].is_string(), "{}", r.text());
}

const KEYS: &str = "[[keys]]\nname = \"alpha\"\nhash = \"HASH_A\"\n\
                    [[keys]]\nname = \"bravo\"\nhash = \"HASH_B\"\nroutes = [\"rm\"]\n\
                    [[keys]]\nname = \"charlie\"\nhash = \"HASH_C\"\nmodels = [\"n\"]\n";

fn keys_toml() -> String {
    KEYS.replace("HASH_A", &hash(KEY_A))
        .replace("HASH_B", &hash(KEY_B))
        .replace("HASH_C", &hash(KEY_C))
}

#[test]
fn missing_wrong_and_not_allowed_keys_are_refused_in_the_surfaces_shape() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let g = gateway(d, &rest(&m, &n, &keys_toml(), None));
        let a = g.local_addr();

        // No key: 401 on both surfaces, each in its own shape.
        let r = call(a, &post(CHAT, &[], &chat("m")));
        assert_eq!(r.status, 401, "{ctx}: {}", r.text());
        assert_eq!(openai_code(&r), "missing_api_key", "{ctx}");
        assert!(
            r.text().contains("Authorization: Bearer") && r.text().contains("x-api-key"),
            "{ctx}: the message names the accepted headers: {}",
            r.text()
        );
        let r = call(a, &post("/v1/messages", &[], &messages("m")));
        assert_anthropic(&r, 401, "authentication_error");

        // A wrong key, by either header.
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer("nope"))], &chat("m")),
        );
        assert_eq!(r.status, 401, "{ctx}: {}", r.text());
        assert_eq!(openai_code(&r), "invalid_api_key", "{ctx}");
        let r = call(
            a,
            &post("/v1/messages", &[("x-api-key", "nope")], &messages("m")),
        );
        assert_anthropic(&r, 401, "authentication_error");

        // bravo may use route rm only: rn (model "n") is a 403.
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer(KEY_B))], &chat("n")),
        );
        assert_eq!(r.status, 403, "{ctx}: {}", r.text());
        assert_eq!(openai_code(&r), "route_not_allowed", "{ctx}");
        let r = call(
            a,
            &post("/v1/messages", &[("x-api-key", KEY_B)], &messages("n")),
        );
        assert_anthropic(&r, 403, "permission_error");

        // charlie may use model "n" only.
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer(KEY_C))], &chat("m")),
        );
        assert_eq!(r.status, 403, "{ctx}: {}", r.text());
        assert_eq!(openai_code(&r), "model_not_allowed", "{ctx}");

        // None of those reached an engine.
        assert!(m.requests().is_empty() && n.requests().is_empty(), "{ctx}");

        // The model list needs a key as well; the liveness check does not.
        for path in ["/v1/models", "/v1/models/m"] {
            let r = call(a, &request("GET", path, &[], ""));
            assert_eq!(r.status, 401, "{ctx} {path}: {}", r.text());
            assert_eq!(openai_code(&r), "missing_api_key", "{ctx} {path}");
            let auth = bearer(KEY_A);
            let r = call(a, &request("GET", path, &[("authorization", &auth)], ""));
            assert_eq!(r.status, 200, "{ctx} {path}: {}", r.text());
        }
        assert_eq!(
            call(a, &request("GET", "/health", &[], "")).status,
            200,
            "{ctx}"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn an_allowed_key_is_served_by_either_header_and_never_reaches_the_engine() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let g = gateway(d, &rest(&m, &n, &keys_toml(), None));
        let a = g.local_addr();
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer(KEY_A))], &chat("m")),
        );
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let r = call(a, &post(CHAT, &[("x-api-key", KEY_B)], &chat("m")));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer(KEY_C))], &chat("n")),
        );
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let seen: Vec<_> = m.requests().into_iter().chain(n.requests()).collect();
        assert_eq!(seen.len(), 3, "{ctx}");
        for req in &seen {
            assert_eq!(req.header("authorization"), None, "{ctx}: {req:?}");
            assert_eq!(req.header("x-api-key"), None, "{ctx}: {req:?}");
            for (_, v) in &req.headers {
                assert!(!v.contains("rolter_test_key"), "{ctx}: {req:?}");
            }
        }
        g.shutdown(SHORT);
    }
}

#[test]
fn with_forward_client_auth_only_the_gateway_keys_header_is_withheld() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let keys = format!("[[keys]]\nname = \"alpha\"\nhash = \"{}\"\n", hash(KEY_A));
        let text = rest(&m, &n, &keys, None).replace(
            "name = \"rm\"\n",
            "name = \"rm\"\nforward_client_auth = true\n",
        );
        let g = gateway(d, &text);
        let a = g.local_addr();
        let r = call(
            a,
            &post(
                CHAT,
                &[
                    ("authorization", &bearer(KEY_A)),
                    ("x-api-key", "upstream-own-key"),
                ],
                &chat("m"),
            ),
        );
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let r = call(
            a,
            &post(
                CHAT,
                &[
                    ("x-api-key", KEY_A),
                    ("authorization", "Basic dXBzdHJlYW0="),
                ],
                &chat("m"),
            ),
        );
        assert_eq!(r.status, 200, "{ctx}: no Bearer, so the key is x-api-key's");
        let seen = m.requests();
        assert_eq!(seen.len(), 2, "{ctx}");
        assert_eq!(
            seen[0].header("authorization"),
            None,
            "{ctx}: {:?}",
            seen[0]
        );
        assert_eq!(
            seen[0].header("x-api-key"),
            Some("upstream-own-key"),
            "{ctx}"
        );
        assert_eq!(seen[1].header("x-api-key"), None, "{ctx}: {:?}", seen[1]);
        assert_eq!(
            seen[1].header("authorization"),
            Some("Basic dXBzdHJlYW0="),
            "{ctx}"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn a_key_over_requests_per_minute_gets_429_with_retry_after_across_workers() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let keys = format!(
            "[[keys]]\nname = \"limited\"\nhash = \"{}\"\nrequests_per_minute = 2\n",
            hash(KEY_A)
        );
        let g = gateway_with(d, 2, &rest(&m, &n, &keys, None));
        let a = g.local_addr();
        let auth = bearer(KEY_A);
        // Eight connections, which the kernel spreads over both workers: the first two
        // admitted and the other six refused however they spread. Should the minute turn
        // during the burst, the new window starts over: the burst is sent once more.
        let mut served = 0;
        let mut retry_after = None;
        let mut statuses = Vec::new();
        for _round in 0..2 {
            statuses.clear();
            for _ in 0..8 {
                let r = call(a, &post(CHAT, &[("authorization", &auth)], &chat("m")));
                if r.status == 429 {
                    retry_after = r.header("retry-after").map(str::to_string);
                    assert_eq!(openai_code(&r), "rate_limit_exceeded", "{ctx}");
                }
                statuses.push(r.status);
            }
            served += statuses.iter().filter(|&&s| s == 200).count();
            if statuses[..2] == [200, 200] && statuses[2..].iter().all(|&s| s == 429) {
                break;
            }
        }
        assert_eq!(statuses[..2], [200, 200], "{ctx}: {statuses:?}");
        assert!(
            statuses[2..].iter().all(|&s| s == 429),
            "{ctx}: {statuses:?}"
        );
        let secs: u64 = retry_after
            .expect("Retry-After on the 429")
            .parse()
            .unwrap();
        assert!((1..=60).contains(&secs), "{ctx}: Retry-After {secs}");
        assert_eq!(
            m.requests().len(),
            served,
            "{ctx}: refused requests never reached it"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn a_key_over_tokens_per_minute_is_refused_until_the_window_ends() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let keys = format!(
            "[[keys]]\nname = \"tokens\"\nhash = \"{}\"\ntokens_per_minute = 1\n",
            hash(KEY_A)
        );
        let g = gateway(d, &rest(&m, &n, &keys, None));
        let a = g.local_addr();
        let auth = bearer(KEY_A);
        let mut refused = None;
        // The first request of a window is admitted and its usage uses the window's one
        // token up; the next one in the same window is refused.
        for _ in 0..3 {
            let r = call(a, &post(CHAT, &[("authorization", &auth)], &chat("m")));
            if r.status == 429 {
                refused = Some(r);
                break;
            }
            assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        }
        let r = refused.expect("a 429 once the window's tokens are used");
        assert_eq!(openai_code(&r), "rate_limit_exceeded", "{ctx}");
        assert!(r.header("retry-after").is_some(), "{ctx}");
        g.shutdown(SHORT);
    }
}

/// The whole configuration as a file (for reloads), with the keys in `keys_file`.
fn write_config(
    dir: &Path,
    d: DriverChoice,
    m: &MockHandle,
    n: &MockHandle,
    log: &Path,
) -> PathBuf {
    let path = dir.join("rolter.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\npin_workers = false\ndriver = \"{}\"\nshutdown_grace = \"2s\"\n{TEST_LIMITS}\n\
         [auth]\nkeys_file = \"keys.toml\"\n{}",
        driver_name(d),
        rest(m, n, "", Some(log))
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    call(addr, &request("GET", path, &[], "")).text()
}

#[test]
fn a_reload_adds_a_key_and_only_names_appear_in_logs_metrics_and_admin() {
    for d in drivers() {
        let ctx = driver_name(d);
        let dir = temp_dir(ctx);
        let log = dir.join("access.log");
        let (m, n) = mocks();
        let keys_file = dir.join("keys.toml");
        std::fs::write(
            &keys_file,
            format!("[[keys]]\nname = \"alpha\"\nhash = \"{}\"\n", hash(KEY_A)),
        )
        .unwrap();
        let path = write_config(&dir, d, &m, &n, &log);
        let g = Gateway::start(config::load_file(&path).unwrap()).unwrap();
        let a = g.local_addr();
        let admin = g.admin_addr().unwrap();

        let r = call(a, &post(CHAT, &[("x-api-key", KEY_B)], &chat("m")));
        assert_eq!(r.status, 401, "{ctx}: bravo is not known yet");
        std::fs::write(
            &keys_file,
            format!(
                "[[keys]]\nname = \"alpha\"\nhash = \"{}\"\n[[keys]]\nname = \"bravo\"\nhash = \"{}\"\n",
                hash(KEY_A),
                hash(KEY_B)
            ),
        )
        .unwrap();
        g.reload().expect("reload");
        let r = call(a, &post(CHAT, &[("x-api-key", KEY_B)], &chat("m")));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer(KEY_A))], &chat("m")),
        );
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let r = call(
            a,
            &post(CHAT, &[("authorization", &bearer("nope"))], &chat("m")),
        );
        assert_eq!(r.status, 401, "{ctx}");

        // The access log names the keys.
        let mut lines: Vec<Value> = Vec::new();
        wait_for("four access-log lines", WAIT, || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            lines = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            lines.len() >= 4
        });
        let named: Vec<(Option<&str>, u64)> = lines
            .iter()
            .map(|l| (l["key"].as_str(), l["status"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            named,
            [
                (None, 401),
                (Some("bravo"), 200),
                (Some("alpha"), 200),
                (None, 401)
            ],
            "{ctx}"
        );

        // The metrics count by name.
        wait_for("the key series", WAIT, || {
            admin_series(
                &g,
                r#"rolter_key_requests_total{key="bravo",result="served"}"#,
            ) == Some(1.0)
        });
        assert_eq!(
            admin_series(
                &g,
                r#"rolter_key_requests_total{key="-",result="unauthorized"}"#
            ),
            Some(2.0),
            "{ctx}"
        );
        let prompt = admin_series(&g, r#"rolter_key_tokens_total{key="alpha",kind="prompt"}"#);
        assert!(prompt.is_some_and(|p| p > 0.0), "{ctx}: {prompt:?}");

        // Neither a key nor its hash appears anywhere an operator looks.
        let metrics = get(admin, "/metrics");
        if let Some((ok, said)) = promtool_check(&metrics) {
            assert!(ok, "{ctx}: promtool: {said}");
        }
        let admin_config = get(admin, "/admin/config");
        let log_text = std::fs::read_to_string(&log).unwrap();
        let cfg: Value = serde_json::from_str(&admin_config).unwrap();
        let names: Vec<&str> = cfg["auth"]["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["alpha", "bravo"], "{ctx}: {admin_config}");
        for (what, text) in [
            ("/metrics", &metrics),
            ("/admin/config", &admin_config),
            ("access log", &log_text),
        ] {
            for secret in [KEY_A, KEY_B] {
                let h = hash(secret);
                let hex = h.trim_start_matches("sha256:");
                assert!(!text.contains(secret), "{ctx}: the key is in {what}");
                assert!(!text.contains(hex), "{ctx}: a hash is in {what}");
            }
        }

        // A reload that removes bravo: refused at once, and no longer reported.
        std::fs::write(
            &keys_file,
            format!("[[keys]]\nname = \"alpha\"\nhash = \"{}\"\n", hash(KEY_A)),
        )
        .unwrap();
        g.reload().expect("reload");
        let r = call(a, &post(CHAT, &[("x-api-key", KEY_B)], &chat("m")));
        assert_eq!(r.status, 401, "{ctx}: bravo was removed");
        assert_eq!(
            admin_series(
                &g,
                r#"rolter_key_requests_total{key="bravo",result="served"}"#
            ),
            None,
            "{ctx}"
        );
        g.shutdown(SHORT);
    }
}

#[test]
fn without_keys_the_gateway_is_open_and_says_so() {
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let g = gateway(d, &rest(&m, &n, "", None));
        let r = call(g.local_addr(), &post(CHAT, &[], &chat("m")));
        assert_eq!(r.status, 200, "{ctx}: {}", r.text());
        let cfg: Value =
            serde_json::from_str(&get(g.admin_addr().unwrap(), "/admin/config")).unwrap();
        assert_eq!(cfg["auth"], "open", "{ctx}");
        g.shutdown(SHORT);
    }
}

#[test]
fn the_official_sdks_raise_their_typed_errors_for_each_refusal() {
    const SETUP: &str = "run the test command from the README (`./tests/run.sh`, which installs the `openai` and `anthropic` packages)";
    for d in drivers() {
        let ctx = driver_name(d);
        let (m, n) = mocks();
        let keys = format!(
            "{}[[keys]]\nname = \"limited\"\nhash = \"{}\"\nrequests_per_minute = 1\n",
            keys_toml(),
            hash(KEY_LIMITED)
        );
        let g = gateway(d, &rest(&m, &n, &keys, None));
        let base = format!("http://{}", g.local_addr());
        let (code, output) =
            common::sdk::run_script("keys_client.py", &[&base, KEY_A, KEY_C, KEY_LIMITED], SETUP);
        match code {
            Some(0) => {}
            Some(3) => panic!("a Python SDK package is missing; {SETUP}\n{output}"),
            _ => panic!("keys_client.py failed under {ctx} (exit {code:?})\n{output}"),
        }
        assert!(output.contains("all checks passed"), "{output}");
        g.shutdown(SHORT);
    }
}
