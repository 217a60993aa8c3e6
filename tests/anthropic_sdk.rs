//! The official `anthropic` Python SDK against the gateway's `/v1/messages`, under both
//! drivers: a message whole and streamed, its tokens counted (`count_tokens`), the
//! gateway's own error raised as the SDK's typed `NotFoundError`, and a stream cut mid-way
//! raised as an `APIStatusError` carrying Anthropic's error event; checked by
//! tests/sdk/anthropic_client.py.
//!
//! Needs `python3` with the `anthropic` package (`pip install anthropic`); without them the
//! test fails and says so, it never skips.

mod common;

use common::sdk::run_script;
use common::*;

const SETUP: &str = "run the test command from the README (`./tests/run.sh`, which installs the `anthropic` package)";

#[test]
fn anthropic_python_sdk_works_through_the_gateway() {
    for d in drivers() {
        let m = mock("a", |c| c.tokens = 6);
        let g = gateway_for(d, &[&m], "retries = 0");
        let (code, output) = run_script(
            "anthropic_client.py",
            &[&format!("http://{}", g.local_addr())],
            SETUP,
        );
        match code {
            Some(0) => {}
            Some(3) => panic!("the `anthropic` Python package is missing; {SETUP}\n{output}"),
            _ => panic!(
                "anthropic_client.py failed under {} (exit {code:?})\n{output}",
                driver_name(d)
            ),
        }
        assert!(output.contains("all checks passed"), "{output}");
        // Whole, streamed, counted and cut reached the engine; the unknown model did not.
        let paths: Vec<String> = m.requests().into_iter().map(|r| r.path).collect();
        assert_eq!(paths.len(), 4, "{output}");
        assert_eq!(paths[2], "/v1/messages/count_tokens", "{output}");
    }
}

/// A vLLM disaggregated route (prefill `p0`, decode `d0`, mock engines in those roles):
/// the script's messages (whole, streamed and cut) are prefilled and decoded; counting
/// tokens goes to the decode engine alone.
#[test]
fn anthropic_python_sdk_works_through_a_disaggregated_route() {
    use rolter_mock::{PdConfig, PdProtocol, PdRole};
    let role = |role| {
        move |c: &mut rolter_mock::MockConfig| {
            c.tokens = 6;
            c.pd = Some(PdConfig {
                role,
                protocol: PdProtocol::Vllm,
                ..PdConfig::default()
            });
        }
    };
    for d in drivers() {
        let ctx = driver_name(d);
        let p = mock("p0", role(PdRole::Prefill));
        let dm = mock("d0", role(PdRole::Decode));
        let rest = format!(
            "{}{}[[routes]]\nname = \"chat\"\ndisaggregation = \"vllm\"\nretries = 0\n\
             prefill = {{ targets = [\"p0\"] }}\ndecode = {{ targets = [\"d0\"] }}\n",
            target("p0", p.addr(), ""),
            target("d0", dm.addr(), ""),
        );
        let g = gateway(d, &rest);
        let (code, output) = run_script(
            "anthropic_client.py",
            &[&format!("http://{}", g.local_addr())],
            SETUP,
        );
        match code {
            Some(0) => {}
            Some(3) => panic!("the `anthropic` Python package is missing; {SETUP}\n{output}"),
            _ => panic!("anthropic_client.py through a P/D route failed under {ctx} (exit {code:?})\n{output}"),
        }
        assert!(output.contains("all checks passed"), "{output}");
        let paths = |m: &rolter_mock::MockHandle| -> Vec<String> {
            let recs = m
                .requests()
                .into_iter()
                .filter(|r| r.path.starts_with("/v1/"));
            recs.map(|r| r.path).collect()
        };
        assert_eq!(
            paths(&p),
            ["/v1/messages"; 3],
            "{ctx}: messages are prefilled\n{output}"
        );
        assert_eq!(
            paths(&dm),
            [
                "/v1/messages",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/v1/messages"
            ],
            "{ctx}\n{output}"
        );
        let (ps, ds) = (p.pd_stats(), dm.pd_stats());
        assert_eq!(
            (ps.prefills, ps.pulls_served, ps.refused),
            (3, 3, 0),
            "{ctx}: {ps:?}"
        );
        assert_eq!((ds.decodes, ds.refused), (3, 0), "{ctx}: {ds:?}");
    }
}
