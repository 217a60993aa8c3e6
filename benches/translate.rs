//! What translating between the APIs costs: a request's body written in the engine's API
//! (a 1 KiB Anthropic Messages request as chat; the same chat request as Messages), one
//! streamed chat chunk turned into Anthropic's events (the per-event cost a translated
//! stream adds), and a whole answer. Compare with what a passthrough relay does for the
//! same bytes: nothing but copying (`loadtest/translation_ttft.sh` measures the difference
//! end to end, `docs/benchmarks.md`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rolter::codec::translate::{self, Api, Pair, Reply};

fn system() -> String {
    "You are a helpful assistant. ".repeat(28)
}

fn messages_body() -> Vec<u8> {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":16,"system":"{}","messages":[{{"role":"user","content":"Summarise the plot of a long novel in two sentences."}}]}}"#,
        system()
    )
    .into_bytes()
}

fn chat_body() -> Vec<u8> {
    format!(
        r#"{{"model":"m","stream":true,"max_tokens":16,"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"Summarise the plot of a long novel in two sentences."}}]}}"#,
        system()
    )
    .into_bytes()
}

const CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-0123456789abcdef\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" streams\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
const FIRST: &[u8] = b"data: {\"id\":\"chatcmpl-0123456789abcdef\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
const WHOLE: &[u8] = br#"{"id":"chatcmpl-0123456789abcdef","object":"chat.completion","created":1733000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":" Hello from the mock engine, a fast stand-in for vLLM that streams short words","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":230,"total_tokens":246,"completion_tokens":16}}"#;

fn pair(client: Api, engine: Api) -> Pair {
    Pair::new(client, engine).expect("a translated pair")
}

fn requests(c: &mut Criterion) {
    let (messages, chat) = (messages_body(), chat_body());
    let mut out = Vec::with_capacity(4096);
    c.bench_function("translate/request messages→chat (1 KiB)", |b| {
        b.iter(|| {
            out.clear();
            let p = pair(Api::Messages, Api::Chat);
            black_box(translate::request(p, black_box(&messages), None, 0, "00", &mut out).is_ok())
        })
    });
    c.bench_function("translate/request chat→messages (1 KiB)", |b| {
        b.iter(|| {
            out.clear();
            let p = pair(Api::Chat, Api::Messages);
            black_box(translate::request(p, black_box(&chat), None, 0, "00", &mut out).is_ok())
        })
    });
}

fn answers(c: &mut Criterion) {
    let p = pair(Api::Messages, Api::Chat);
    let asked = translate::request(
        p,
        &messages_body(),
        None,
        0,
        "0123456789abcdef",
        &mut Vec::new(),
    )
    .expect("translates");
    let mut reply = Reply::new(p, asked.clone());
    let mut out = Vec::with_capacity(1024);
    reply.events(FIRST, &mut out);
    reply.events(CHUNK, &mut out);
    c.bench_function("translate/one streamed chunk chat→messages", |b| {
        b.iter(|| {
            out.clear();
            reply.events(black_box(CHUNK), &mut out);
            black_box(out.len())
        })
    });
    c.bench_function("translate/whole answer chat→messages", |b| {
        b.iter(|| {
            out.clear();
            let mut r = Reply::new(p, asked.clone());
            black_box(r.whole(200, black_box(WHOLE), &mut out).is_ok())
        })
    });
}

criterion_group!(benches, requests, answers);
criterion_main!(benches);
