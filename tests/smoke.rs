//! The basic proxy path under both drivers: non-streaming and streaming chat through the
//! gateway to a mock engine, byte for byte.

mod common;
use common::*;

#[test]
fn chat_streams_and_completes_through_the_gateway() {
    for d in drivers() {
        let m = mock("a", |_| {});
        let g = gateway_for(d, &[&m], "");
        let r = call(
            g.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(false)),
        );
        assert_eq!(r.status, 200, "{}", driver_name(d));
        assert_eq!(r.header("x-rolter-target"), Some("t0"));
        assert_eq!(r.json()["object"], "chat.completion");

        let r = call(
            g.local_addr(),
            &post("/v1/chat/completions", &[], &chat_body(true)),
        );
        assert_eq!(r.status, 200);
        assert!(r.chunked, "streams are re-framed chunked");
        let events = sse_events(&r.body);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        assert!(events.iter().any(|(_, d)| d.contains("\"usage\"")));
    }
}
