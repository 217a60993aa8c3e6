//! `targets[i].api`, `lacks` and `anthropic_version`: which API a target speaks, and so
//! which requests are translated on their way to it.

use super::*;
use rolter_codec::translate::Api;

fn target_with(extra: &str) -> String {
    format!("[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\n{extra}\n")
}

#[test]
fn an_openai_target_translates_only_what_it_lacks() {
    let c = load(&target_with("")).unwrap();
    let api = &c.targets[0].api;
    assert_eq!(*api, TargetApi::default());
    for client in [Api::Chat, Api::Messages, Api::Responses, Api::CountTokens] {
        assert_eq!(
            api.engine_api_for(client),
            None,
            "{client:?} goes as it came"
        );
    }
    let c = load(&target_with(
        "api = \"openai\"\nlacks = [\"messages\", \"responses\"]",
    ))
    .unwrap();
    let api = &c.targets[0].api;
    assert_eq!(api.engine_api_for(Api::Messages), Some(Api::Chat));
    assert_eq!(api.engine_api_for(Api::CountTokens), Some(Api::Tokenize));
    assert_eq!(api.engine_api_for(Api::Responses), Some(Api::Chat));
    assert_eq!(api.engine_api_for(Api::Chat), None);
}

#[test]
fn an_anthropic_target_takes_chat_as_messages_with_its_version() {
    let c = load(&target_with("api = \"anthropic\"")).unwrap();
    let api = &c.targets[0].api;
    assert_eq!(
        api.anthropic.as_ref().unwrap().version,
        DEFAULT_ANTHROPIC_VERSION
    );
    assert_eq!(api.engine_api_for(Api::Chat), Some(Api::Messages));
    assert_eq!(api.engine_api_for(Api::Messages), None);
    // A Responses request is not translated twice: the target answers it itself.
    assert_eq!(api.engine_api_for(Api::Responses), None);
    let c = load(&target_with(
        "api = \"anthropic\"\nanthropic_version = \"2024-01-01\"",
    ))
    .unwrap();
    assert_eq!(
        c.targets[0].api.anthropic.as_ref().unwrap().version,
        "2024-01-01"
    );
}

#[test]
fn every_wrong_api_setting_names_its_key_and_a_fix() {
    for (extra, key) in [
        ("api = \"gemini\"", "targets[0].api"),
        ("lacks = [\"embeddings\"]", "targets[0].lacks[0]"),
        (
            "api = \"anthropic\"\nlacks = [\"responses\"]",
            "targets[0].lacks",
        ),
        (
            "anthropic_version = \"2023-06-01\"",
            "targets[0].anthropic_version",
        ),
        (
            "api = \"anthropic\"\nanthropic_version = \"a b\"",
            "targets[0].anthropic_version",
        ),
        ("apis = \"openai\"", "targets[0].apis"),
    ] {
        let errs = errors(&target_with(extra));
        let e = error_at(&errs, key);
        assert!(!e.fix.is_empty(), "{extra}: {e}");
    }
}

#[test]
fn a_targets_streams_ask_for_usage_unless_it_says_count() {
    let usage =
        |extra: &str| load_str(&target_with(extra), "t.toml").unwrap().targets[0].stream_usage;
    assert_eq!(usage(""), StreamUsage::Ask);
    assert_eq!(usage("stream_usage = \"ask\""), StreamUsage::Ask);
    assert_eq!(usage("stream_usage = \"count\""), StreamUsage::Count);
    let errs = errors(&target_with("stream_usage = \"always\""));
    let e = error_at(&errs, "targets[0].stream_usage");
    assert!(e.fix.contains("\"count\""), "{e}");
}
