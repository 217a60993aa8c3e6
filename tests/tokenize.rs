//! The local tokenizer against ids recorded from the reference implementations, on small
//! real tokenizers checked in under `tests/fixtures/tokenizer/` (see the README there).

use std::path::{Path, PathBuf};

use rolter::tokenize::template::MediaPlaceholders;
use rolter::tokenize::ChatRequest;
use rolter::tokenize::{LocalTokenizer, TokenizeError};

struct ChatCase {
    name: &'static str,
    fixture: &'static str,
    messages: &'static str,
    tools: Option<&'static str>,
    kwargs: Option<&'static str>,
    add_generation_prompt: bool,
    text: &'static str,
    ids: &'static [u32],
}

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name)
}

fn load(name: &str) -> LocalTokenizer {
    let dir = fixture_dir(name);
    LocalTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn chat(tok: &LocalTokenizer, messages: &str, add_generation_prompt: bool) -> Vec<u32> {
    let mut out = Vec::new();
    tok.chat_ids(messages.as_bytes(), None, add_generation_prompt, &mut out)
        .unwrap();
    out
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rolter-tokenize-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn chat_prompts_match_the_reference_text_and_ids() {
    for case in CHAT_CASES {
        let tok = load(case.fixture);
        let request = ChatRequest {
            messages: case.messages.as_bytes(),
            tools: case.tools.map(str::as_bytes),
            add_generation_prompt: case.add_generation_prompt,
            chat_template_kwargs: case.kwargs.map(str::as_bytes),
        };
        let text = tok
            .render_chat(&request)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(text, case.text, "{}: rendered text", case.name);
        let mut ids = vec![7]; // appended to, not cleared
        tok.chat_request_ids(&request, &mut ids).unwrap();
        assert_eq!(ids[0], 7);
        assert_eq!(&ids[1..], case.ids, "{}: ids", case.name);
    }
}

#[test]
fn plain_encoding_matches_the_python_library() {
    let tok = load("chatml");
    let mut out = Vec::new();
    for (text, want) in ENCODE_CASES {
        out.clear();
        tok.encode(text, false, &mut out).unwrap();
        assert_eq!(&out[..], *want, "{text:?}");
    }
}

#[test]
fn completions_prompts_add_special_tokens_or_pass_ids_through() {
    for (fixture, prompt, want) in PROMPT_CASES {
        let tok = load(fixture);
        let mut out = Vec::new();
        tok.prompt_ids(serde_json::to_string(prompt).unwrap().as_bytes(), &mut out)
            .unwrap();
        assert_eq!(&out[..], *want, "{fixture}: {prompt}");
        // A batch of strings counts by its first prompt.
        let mut batch = Vec::new();
        let body = serde_json::to_string(&[*prompt, "second"]).unwrap();
        tok.prompt_ids(body.as_bytes(), &mut batch).unwrap();
        assert_eq!(batch, out);
    }
    // The llama fixture's post-processor adds BOS for completions, the chatml one does not.
    let llama = load("llama3");
    let bos = llama.tokenizer().token_to_id("<|begin_of_text|>").unwrap();
    assert_eq!(PROMPT_CASES[1].2[0], bos);
    assert_ne!(PROMPT_CASES[0].2[0], bos);

    let tok = load("chatml");
    let mut out = vec![1];
    tok.prompt_ids(b"[5, 4, 3000000]", &mut out).unwrap();
    assert_eq!(out, [1, 5, 4, 3_000_000]);
    out.clear();
    tok.prompt_ids(b"[[9, 8], [7]]", &mut out).unwrap();
    assert_eq!(out, [9, 8]);
    for bad in [
        &b"[1, -1]"[..],
        b"[1.5]",
        b"[]",
        b"{\"a\":1}",
        b"12",
        b"\"unterminated",
    ] {
        let err = tok.prompt_ids(bad, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, TokenizeError::Request { .. }), "{err}");
    }
}

/// Prefix caching works because a conversation's next turn starts with the ids of the turn
/// before: each request's prompt, generation prompt included, is a prefix of the next one's.
#[test]
fn chatml_turns_are_prefixes_of_the_next_turn() {
    let tok = load("chatml");
    let turns = [
        ("user", "What is the weather like in Paris?"),
        (
            "assistant",
            "Mild: 18 degrees, light rain in the afternoon.",
        ),
        ("user", "Should I take an umbrella?"),
        ("assistant", "Yes, take an umbrella.\n\nAnything else?"),
        ("user", "No, thanks!"),
    ];
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut previous: Option<Vec<u32>> = None;
    for (role, content) in turns {
        messages.push(serde_json::json!({"role": role, "content": content}));
        if role != "user" {
            continue;
        }
        let body = serde_json::to_string(&messages).unwrap();
        let with_gen = chat(&tok, &body, true);
        let without_gen = chat(&tok, &body, false);
        assert!(with_gen.starts_with(&without_gen));
        assert!(with_gen.len() > without_gen.len());
        if let Some(prev) = &previous {
            assert!(
                with_gen.starts_with(prev),
                "turn with {} messages does not extend the previous prompt",
                messages.len()
            );
        }
        previous = Some(with_gen);
    }
}

#[test]
fn content_parts_join_text_and_use_a_media_placeholder() {
    let parts = r#"[{"role":"user","content":[{"type":"text","text":"one"},{"type":"input_image","image_url":"x"},{"type":"text","text":"two"}]}]"#;
    let plain = r#"[{"role":"user","content":"<image>\none\ntwo"}]"#;
    let tok = load("chatml");
    assert_eq!(chat(&tok, parts, true), chat(&tok, plain, true));

    let tok = load("chatml").with_media_placeholders(MediaPlaceholders {
        image: "<|vision_start|><|image_pad|><|vision_end|>".into(),
        ..MediaPlaceholders::default()
    });
    let req = ChatRequest {
        messages: parts.as_bytes(),
        add_generation_prompt: false,
        ..ChatRequest::default()
    };
    let text = tok.render_chat(&req).unwrap();
    assert!(
        text.contains("user\n<|vision_start|><|image_pad|><|vision_end|>\none\ntwo<|im_end|>"),
        "{text}"
    );
}

#[test]
fn tool_messages_and_kwargs_reach_the_template() {
    let tok = load("llama3");
    let messages = r#"[{"role":"user","content":"hi"}]"#;
    // With the date given, the prompt is stable; without it, strftime_now decides.
    let dated = ChatRequest {
        messages: messages.as_bytes(),
        add_generation_prompt: true,
        chat_template_kwargs: Some(br#"{"date_string": "01 Jan 2030"}"#),
        ..ChatRequest::default()
    };
    assert!(tok
        .render_chat(&dated)
        .unwrap()
        .contains("Today Date: 01 Jan 2030\n"));
    let undated = ChatRequest {
        chat_template_kwargs: None,
        ..dated
    };
    let text = tok.render_chat(&undated).unwrap();
    let today = text
        .split("Today Date: ")
        .nth(1)
        .unwrap()
        .split('\n')
        .next()
        .unwrap();
    assert_eq!(today.len(), "01 Jan 2030".len(), "{today}");

    // raise_exception from the template is a render error carrying its message.
    let two_calls = r#"[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[
        {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
        {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}]"#;
    let err = tok
        .chat_ids(two_calls.as_bytes(), None, true, &mut Vec::new())
        .unwrap_err();
    assert!(
        matches!(&err, TokenizeError::TemplateRender { message } if message.contains("only supports single tool-calls")),
        "{err}"
    );
    let bad_kwargs = ChatRequest {
        chat_template_kwargs: Some(b"[1]"),
        ..dated
    };
    assert!(matches!(
        tok.render_chat(&bad_kwargs),
        Err(TokenizeError::Request { .. })
    ));
}

#[test]
fn missing_and_broken_files_are_clear_errors() {
    let chatml = fixture_dir("chatml");
    let missing = chatml.join("nope.json");
    let err = LocalTokenizer::from_files(&missing, None).unwrap_err();
    assert!(matches!(err, TokenizeError::Io { .. }));
    assert!(err.to_string().contains("nope.json"), "{err}");

    let dir = scratch_dir("errors");
    let bad_tok = dir.join("tokenizer.json");
    std::fs::write(&bad_tok, r#"{"model": {"type": "Nonsense"}}"#).unwrap();
    let err = LocalTokenizer::from_files(&bad_tok, None).unwrap_err();
    assert!(matches!(err, TokenizeError::TokenizerFile { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&bad_tok.display().to_string()),
        "{err}"
    );

    let tok_json = chatml.join("tokenizer.json");
    let cfg = dir.join("tokenizer_config.json");
    for (body, want) in [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        (r#"{"chat_template": 5}"#, "chat_template must be"),
        (
            r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
            "neither a \"default\"",
        ),
        (
            r#"{"bos_token": 3, "chat_template": "x"}"#,
            "bos_token must be",
        ),
    ] {
        std::fs::write(&cfg, body).unwrap();
        let err = LocalTokenizer::from_files(&tok_json, Some(&cfg)).unwrap_err();
        assert!(
            matches!(err, TokenizeError::ConfigFile { .. }),
            "{body}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("tokenizer_config.json") && text.contains(want),
            "{text}"
        );
    }

    // A template that does not compile names its origin and line.
    std::fs::write(
        &cfg,
        r#"{"chat_template": "{% for m in messages %}\n{{ m.content }\n{% endfor %}"}"#,
    )
    .unwrap();
    let err = LocalTokenizer::from_files(&tok_json, Some(&cfg)).unwrap_err();
    assert!(matches!(err, TokenizeError::TemplateSyntax { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("tokenizer_config.json") && text.contains("line 2"),
        "{text}"
    );

    // No template anywhere: completions work, chats fail with the reason.
    std::fs::write(&cfg, r#"{"eos_token": "<|im_end|>"}"#).unwrap();
    let tok = LocalTokenizer::from_files(&tok_json, Some(&cfg)).unwrap();
    assert!(!tok.has_chat_template());
    tok.prompt_ids(br#""hello""#, &mut Vec::new()).unwrap();
    let err = tok
        .chat_ids(b"[]", None, true, &mut Vec::new())
        .unwrap_err();
    assert!(matches!(err, TokenizeError::NoChatTemplate { .. }));
    assert!(err.to_string().contains("chat_template.jinja"), "{err}");

    // ...until a chat_template.jinja appears beside the config.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let tok = LocalTokenizer::from_files(&tok_json, Some(&cfg)).unwrap();
    assert_eq!(
        chat(&tok, r#"[{"role":"user","content":"Hello world"}]"#, true),
        ENCODE_CASES[0].1
    );

    // Bad request JSON is a request error, not a template one.
    let tok = load("chatml");
    for bad in [&b"[{"[..], b"{}", br#"[{"role":"user","content":{"a":1}}]"#] {
        let err = tok.chat_ids(bad, None, true, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, TokenizeError::Request { .. }), "{err}");
    }
    let err = tok
        .chat_ids(
            b"[]",
            Some(br#"[{"type":"function"}]"#),
            true,
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("tools[0] needs a \"function\""),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn named_templates_pick_tool_use_when_tools_are_given() {
    let dir = scratch_dir("named");
    let cfg = dir.join("tokenizer_config.json");
    std::fs::write(
        &cfg,
        r#"{"bos_token": {"content": "<s>", "__type": "AddedToken"}, "chat_template": [
            {"name": "default", "template": "{{ bos_token }}plain"},
            {"name": "tool_use", "template": "{{ bos_token }}tools={{ tools | length }}"}]}"#,
    )
    .unwrap();
    let tok = LocalTokenizer::from_files(&fixture_dir("chatml").join("tokenizer.json"), Some(&cfg))
        .unwrap();
    let render = |tools: Option<&'static [u8]>| {
        tok.render_chat(&ChatRequest {
            messages: b"[]",
            tools,
            ..ChatRequest::default()
        })
        .unwrap()
    };
    assert_eq!(render(None), "<s>plain");
    // As transformers: any tools list, even an empty one, selects "tool_use".
    assert_eq!(render(Some(b"null")), "<s>plain");
    assert_eq!(render(Some(b"[]")), "<s>tools=0");
    assert_eq!(
        render(Some(br#"[{"function":{"name":"f"}}]"#)),
        "<s>tools=1"
    );
    let tok = tok.with_chat_template("override".into()).unwrap();
    assert_eq!(render_with(&tok), "override");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn render_with(tok: &LocalTokenizer) -> String {
    tok.render_chat(&ChatRequest {
        messages: b"[]",
        ..ChatRequest::default()
    })
    .unwrap()
}

#[test]
fn a_shared_tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LocalTokenizer>();
}

/// Chat cases. Text and ids are those of the Python `tokenizers` library on the same
/// tokenizer.json, with the template rendered by jinja2 configured as `transformers` does
/// and the messages normalised as vLLM does.
const CHAT_CASES: &[ChatCase] = &[
    ChatCase {
        name: "chatml_system_user",
        fixture: "chatml",
        messages: r#"[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello! How can I help you today?"}]"#,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
        text: r#"<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Hello! How can I help you today?<|im_end|>
<|im_start|>assistant
"#,
        ids: &[1, 85, 91, 455, 79, 201, 395, 359, 259, 635, 383, 16, 2, 201, 1, 310, 264, 201, 42, 548, 3, 557, 364, 350, 378, 493, 367, 33, 2, 201, 1, 67, 308, 362, 86, 201],
    },
    ChatCase {
        name: "chatml_default_system_no_gen",
        fixture: "chatml",
        messages: r#"[{"role": "user", "content": "What is the weather like in Paris?"}]"#,
        tools: None,
        kwargs: None,
        add_generation_prompt: false,
        text: r#"<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the weather like in Paris?<|im_end|>
"#,
        ids: &[1, 85, 91, 455, 79, 201, 395, 359, 223, 51, 89, 414, 14, 272, 262, 263, 301, 513, 476, 78, 75, 68, 67, 68, 67, 223, 37, 78, 278, 70, 16, 223, 395, 359, 259, 635, 383, 16, 2, 201, 1, 310, 264, 201, 394, 356, 268, 358, 368, 284, 377, 33, 2, 201],
    },
    ChatCase {
        name: "chatml_tools",
        fixture: "chatml",
        messages: r#"[{"role": "user", "content": "What is the weather like in Paris?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 degrees"}, {"type": "text", "text": "light rain"}]}]"#,
        tools: Some(r#"[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]"#),
        kwargs: None,
        add_generation_prompt: true,
        text: r#"<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
What is the weather like in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
18 degrees
light rain
</tool_response><|im_end|>
<|im_start|>assistant
"#,
        ids: &[1, 85, 91, 455, 79, 201, 395, 359, 223, 51, 89, 414, 14, 272, 262, 263, 301, 513, 476, 78, 75, 68, 67, 68, 67, 223, 37, 78, 278, 70, 16, 223, 395, 359, 259, 635, 383, 273, 201, 5, 223, 392, 81, 78, 85, 347, 395, 296, 300, 272, 400, 78, 223, 275, 71, 297, 84, 296, 81, 262, 295, 87, 80, 69, 460, 85, 276, 360, 269, 86, 223, 89, 270, 74, 268, 598, 479, 264, 91, 273, 201, 395, 359, 546, 88, 328, 301, 223, 89, 270, 74, 295, 87, 80, 69, 460, 282, 303, 80, 263, 87, 262, 85, 223, 89, 270, 74, 265, 223, 30, 457, 81, 78, 85, 32, 30, 17, 457, 81, 78, 85, 32, 223, 58, 47, 46, 261, 67, 73, 85, 28, 201, 30, 457, 81, 78, 85, 32, 201, 345, 86, 91, 82, 71, 286, 280, 423, 80, 69, 460, 319, 280, 423, 80, 69, 460, 286, 484, 553, 286, 280, 427, 397, 319, 280, 70, 274, 69, 84, 75, 82, 460, 286, 280, 41, 415, 268, 358, 571, 259, 272, 270, 91, 16, 319, 280, 82, 401, 67, 79, 415, 314, 286, 484, 86, 91, 82, 71, 286, 280, 81, 68, 76, 326, 86, 319, 280, 82, 306, 82, 264, 86, 75, 274, 286, 484, 586, 286, 484, 86, 91, 82, 71, 286, 280, 451, 84, 265, 73, 384, 14, 280, 465, 286, 484, 86, 91, 82, 71, 286, 280, 451, 84, 265, 73, 319, 280, 414, 279, 286, 223, 61, 4, 587, 319, 280, 72, 67, 74, 262, 80, 260, 270, 4, 63, 95, 95, 14, 280, 262, 290, 75, 262, 70, 286, 223, 61, 4, 586, 4, 63, 95, 95, 468, 30, 17, 457, 81, 78, 85, 32, 347, 40, 81, 84, 373, 295, 87, 80, 69, 460, 272, 400, 78, 14, 528, 259, 223, 76, 85, 275, 297, 68, 76, 326, 86, 223, 89, 270, 74, 295, 87, 80, 69, 460, 483, 438, 285, 259, 84, 426, 589, 223, 89, 270, 74, 265, 223, 30, 457, 81, 78, 65, 69, 400, 78, 32, 30, 17, 457, 81, 78, 65, 69, 400, 78, 32, 223, 58, 47, 46, 261, 67, 73, 85, 28, 201, 30, 457, 81, 78, 65, 69, 400, 78, 32, 201, 345, 553, 286, 223, 30, 423, 80, 69, 460, 15, 553, 32, 14, 280, 638, 286, 223, 30, 401, 73, 85, 15, 76, 85, 275, 15, 81, 68, 76, 326, 86, 32, 468, 30, 17, 457, 81, 78, 65, 69, 400, 78, 32, 2, 201, 1, 310, 264, 201, 394, 356, 268, 358, 368, 284, 377, 33, 2, 201, 1, 67, 308, 362, 86, 201, 30, 457, 81, 78, 65, 69, 400, 78, 32, 201, 345, 553, 286, 280, 427, 397, 319, 280, 638, 286, 484, 586, 286, 280, 530, 319, 280, 465, 286, 280, 587, 577, 30, 17, 457, 81, 78, 65, 69, 400, 78, 32, 2, 201, 1, 310, 264, 201, 30, 457, 81, 78, 65, 262, 85, 82, 275, 85, 71, 32, 201, 19, 26, 622, 201, 78, 303, 428, 561, 201, 30, 17, 457, 81, 78, 65, 262, 85, 82, 275, 85, 71, 32, 2, 201, 1, 67, 308, 362, 86, 201],
    },
    ChatCase {
        name: "chatml_parts",
        fixture: "chatml",
        messages: r#"[{"role": "user", "content": [{"type": "text", "text": "Describe this picture."}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, {"type": "text", "text": "Be brief."}]}]"#,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
        text: r#"<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
<|im_start|>user
<image>
Describe this picture.
Be brief.<|im_end|>
<|im_start|>assistant
"#,
        ids: &[1, 85, 91, 455, 79, 201, 395, 359, 223, 51, 89, 414, 14, 272, 262, 263, 301, 513, 476, 78, 75, 68, 67, 68, 67, 223, 37, 78, 278, 70, 16, 223, 395, 359, 259, 635, 383, 16, 2, 201, 1, 310, 264, 201, 30, 75, 79, 67, 73, 71, 32, 201, 38, 274, 69, 84, 75, 68, 71, 261, 74, 269, 298, 75, 69, 86, 87, 262, 273, 36, 71, 271, 84, 75, 71, 72, 16, 2, 201, 1, 67, 308, 362, 86, 201],
    },
    ChatCase {
        name: "chatml_unicode",
        fixture: "chatml",
        messages: r#"[{"role": "user", "content": "Émile visited Zürich 😀 — naïve café, 12345 and 3.14159\n\tdef add(a, b):\n    return a + b  "}]"#,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
        text: "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nÉmile visited Zürich 😀 — naïve café, 12345 and 3.14159\n\tdef add(a, b):\n    return a + b  <|im_end|>\n<|im_start|>assistant\n",
        ids: &[1, 85, 91, 455, 79, 201, 395, 359, 223, 51, 89, 414, 14, 272, 262, 263, 301, 513, 476, 78, 75, 68, 67, 68, 67, 223, 37, 78, 278, 70, 16, 223, 395, 359, 259, 635, 383, 16, 2, 201, 1, 310, 264, 201, 473, 593, 632, 603, 223, 175, 256, 249, 225, 485, 245, 600, 616, 14, 223, 19, 20, 21, 22, 23, 285, 223, 21, 16, 19, 22, 19, 23, 27, 201, 200, 588, 496, 320, 14, 271, 579, 565, 528, 259, 475, 271, 354, 2, 201, 1, 67, 308, 362, 86, 201],
    },
    ChatCase {
        name: "llama_basic",
        fixture: "llama3",
        messages: r#"[{"role": "system", "content": "  You are a helpful assistant.  "}, {"role": "user", "content": "Hello!"}]"#,
        tools: None,
        kwargs: Some(r#"{"date_string": "26 Jul 2024"}"#),
        add_generation_prompt: true,
        text: r#"<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>

Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>

"#,
        ids: &[0, 2, 89, 95, 459, 83, 3, 351, 41, 91, 90, 462, 77, 227, 49, 445, 93, 82, 305, 77, 75, 227, 42, 267, 75, 32, 227, 42, 330, 75, 83, 72, 268, 227, 24, 22, 24, 25, 205, 396, 329, 227, 42, 267, 75, 32, 227, 24, 28, 227, 48, 91, 82, 227, 24, 22, 24, 26, 351, 399, 363, 263, 639, 387, 20, 4, 2, 314, 268, 3, 351, 46, 552, 7, 4, 2, 71, 312, 366, 90, 3, 351],
    },
    ChatCase {
        name: "llama_tools",
        fixture: "llama3",
        messages: r#"[{"role": "user", "content": "What is the weather like in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18}"}]"#,
        tools: Some(r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#),
        kwargs: Some(r#"{"date_string": "26 Jul 2024"}"#),
        add_generation_prompt: true,
        text: r#"<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024

<|eot_id|><|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.

{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": null,
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                }
            }
        }
    }
}

What is the weather like in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"{\"temperature\": 18}"<|eot_id|><|start_header_id|>assistant<|end_header_id|>

"#,
        ids: &[0, 2, 89, 95, 459, 83, 3, 351, 43, 84, 92, 434, 279, 83, 418, 90, 32, 227, 79, 86, 95, 90, 78, 279, 205, 41, 91, 90, 462, 77, 227, 49, 445, 93, 82, 305, 77, 75, 227, 42, 267, 75, 32, 227, 42, 330, 75, 83, 72, 268, 227, 24, 22, 24, 25, 205, 396, 329, 227, 42, 267, 75, 32, 227, 24, 28, 227, 48, 91, 82, 227, 24, 22, 24, 26, 351, 4, 2, 314, 268, 3, 351, 45, 79, 92, 418, 272, 378, 82, 309, 93, 269, 77, 299, 91, 84, 73, 464, 89, 18, 302, 82, 75, 406, 75, 287, 89, 86, 279, 74, 227, 93, 274, 78, 263, 227, 48, 57, 53, 52, 575, 263, 299, 91, 84, 73, 464, 276, 404, 82, 227, 93, 274, 78, 600, 550, 86, 268, 263, 88, 430, 593, 506, 275, 278, 90, 514, 318, 272, 227, 77, 79, 92, 418, 550, 443, 90, 277, 205, 56, 278, 86, 279, 74, 288, 272, 575, 83, 267, 488, 557, 290, 299, 91, 84, 73, 464, 487, 442, 18, 284, 86, 405, 71, 83, 419, 318, 290, 297, 79, 73, 464, 405, 95, 379, 263, 88, 430, 418, 90, 487, 442, 289, 600, 635, 99, 20, 42, 85, 227, 445, 90, 484, 75, 357, 405, 79, 71, 72, 82, 278, 277, 205, 97, 205, 569, 284, 90, 95, 86, 75, 290, 284, 427, 84, 73, 464, 323, 205, 569, 284, 427, 84, 73, 464, 290, 227, 97, 205, 358, 358, 569, 284, 557, 290, 284, 431, 401, 323, 205, 358, 358, 569, 284, 74, 278, 73, 88, 79, 86, 464, 290, 227, 84, 91, 82, 82, 18, 205, 358, 358, 569, 284, 86, 405, 71, 83, 419, 318, 290, 227, 97, 205, 358, 358, 358, 358, 569, 284, 90, 95, 86, 75, 290, 284, 85, 72, 80, 330, 90, 323, 205, 358, 358, 358, 358, 569, 284, 86, 310, 86, 268, 90, 79, 278, 290, 227, 97, 205, 358, 358, 358, 358, 358, 358, 569, 284, 590, 290, 227, 97, 205, 358, 358, 358, 358, 358, 358, 358, 358, 569, 284, 90, 95, 86, 75, 290, 284, 455, 88, 269, 77, 8, 205, 358, 358, 358, 358, 358, 358, 569, 227, 472, 358, 358, 358, 358, 569, 227, 472, 358, 358, 569, 227, 472, 569, 227, 472, 99, 351, 398, 360, 272, 362, 372, 288, 381, 37, 4, 2, 71, 312, 366, 90, 3, 351, 349, 557, 290, 284, 431, 401, 323, 284, 86, 405, 71, 83, 419, 318, 290, 488, 590, 290, 284, 534, 388, 99, 4, 2, 79, 86, 95, 90, 78, 279, 3, 351, 8, 97, 66, 8, 295, 443, 268, 267, 91, 266, 66, 290, 227, 23, 30, 99, 8, 4, 2, 71, 312, 366, 90, 3, 351],
    },
];

/// Completions prompts: (fixture, prompt, ids with the tokenizer's special tokens).
const PROMPT_CASES: &[(&str, &str, &[u32])] = &[
    (
        "chatml",
        r#"Hello world! The quick brown fox jumps over the lazy dog."#,
        &[
            42, 548, 223, 89, 81, 84, 333, 3, 223, 299, 597, 615, 572, 605, 544, 268, 618, 535, 16,
        ],
    ),
    (
        "llama3",
        r#"Hello world! The quick brown fox jumps over the lazy dog."#,
        &[
            0, 46, 552, 227, 93, 85, 88, 337, 7, 227, 303, 601, 619, 576, 609, 548, 272, 622, 539,
            20,
        ],
    ),
];

/// Plain strings on the chatml fixture, without special tokens added.
const ENCODE_CASES: &[(&str, &[u32])] = &[
    (r#"Hello world"#, &[42, 548, 223, 89, 81, 84, 333]),
    (
        r#"  leading spaces and trailing  "#,
        &[
            223, 281, 71, 398, 265, 73, 282, 82, 288, 274, 285, 261, 84, 405, 265, 73, 354,
        ],
    ),
    (
        r#"Numbers 1234567 and 3.5%"#,
        &[
            580, 223, 19, 20, 21, 22, 23, 24, 25, 285, 223, 21, 16, 23, 7,
        ],
    ),
    (
        r#"Ünïcödé — “quotes” 😀 日本語"#,
        &[
            130, 253, 80, 130, 110, 69, 130, 117, 70, 472, 485, 245, 601, 290, 81, 459, 346, 254,
            223, 175, 256, 249, 225, 223, 165, 248, 101, 165, 253, 108, 167, 106, 255,
        ],
    ),
    (
        "line one\n\n\nline two\r\n\ttab",
        &[
            78, 265, 71, 223, 275, 71, 347, 201, 78, 265, 71, 261, 89, 81, 204, 201, 200, 86, 67,
            68,
        ],
    ),
    (
        r#"<|im_start|>user
hi<|im_end|>"#,
        &[1, 310, 264, 201, 74, 75, 2],
    ),
];
