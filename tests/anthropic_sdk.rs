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
