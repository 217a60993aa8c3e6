use super::*;

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn dumps(v: &Value, opts: &PyJson) -> String {
    let mut out = String::new();
    write_py_json(&mut out, v, opts, 0).unwrap();
    out
}

#[test]
fn tojson_matches_python_json_dumps() {
    let v = json(r#"{"b": 1, "a": [1.5, 2.0, true, null, "é\"\n\u0001"], "c": {}, "d": []}"#);
    assert_eq!(
        dumps(&v, &PyJson::default()),
        r#"{"b": 1, "a": [1.5, 2.0, true, null, "é\"\n\u0001"], "c": {}, "d": []}"#
    );
    let pretty = PyJson {
        indent: Some(4),
        item_sep: ",".into(),
        ..PyJson::default()
    };
    assert_eq!(
        dumps(&json(r#"{"x": [1, {"y": "z"}], "e": {}}"#), &pretty),
        "{\n    \"x\": [\n        1,\n        {\n            \"y\": \"z\"\n        }\n    ],\n    \"e\": {}\n}"
    );
    let ascii = PyJson {
        ensure_ascii: true,
        sort_keys: true,
        ..PyJson::default()
    };
    assert_eq!(
        dumps(&json(r#"{"b": "é😀", "a": 1}"#), &ascii),
        r#"{"a": 1, "b": "\u00e9\ud83d\ude00"}"#
    );
    assert_eq!(
        dumps(
            &json("[1e16, 1e-5, 0.1, 18446744073709551615]"),
            &PyJson::default()
        ),
        "[1e+16, 1e-05, 0.1, 18446744073709551615]"
    );
}

#[test]
fn tojson_filter_arguments() {
    let env = environment(
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':')) }}"
            .into(),
        "test",
    )
    .unwrap();
    let out = env
        .get_template(TEMPLATE_NAME)
        .unwrap()
        .render(minijinja::context! { x => json(r#"{"k": [1, 2]}"#) })
        .unwrap();
    assert_eq!(
        out,
        "{\"k\": [1, 2]}|{\n  \"k\": [\n    1,\n    2\n  ]\n}|{\"k\":[1,2]}"
    );
}

#[test]
fn strftime_formats_utc() {
    // 2024-07-26 13:05:09 UTC, a Friday.
    let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
    assert_eq!(strftime_utc(t, "%d %b %Y"), "26 Jul 2024");
    assert_eq!(
        strftime_utc(t, "%A %B %e %H:%M:%S %j %y %m %% %q"),
        "Friday July 26 13:05:09 208 24 07 % %q"
    );
    assert_eq!(strftime_utc(0, "%a %d %b %Y"), "Thu 01 Jan 1970");
    assert_eq!(strftime_utc(951_782_400, "%d %b %Y"), "29 Feb 2000");
}

#[test]
fn raise_exception_and_loop_controls() {
    let env = environment(
        "{% for i in [1,2,3,4] %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}{% if fail %}{{ raise_exception('no ' + 'way') }}{% endif %}".into(),
        "test",
    )
    .unwrap();
    let t = env.get_template(TEMPLATE_NAME).unwrap();
    assert_eq!(
        t.render(minijinja::context! { fail => false }).unwrap(),
        "13"
    );
    let err = t.render(minijinja::context! { fail => true }).unwrap_err();
    assert!(describe(&err).contains("no way"), "{}", describe(&err));
}

#[test]
fn pycompat_methods_and_trim_blocks() {
    let env = environment(
        "{%- for k, v in d.items() %}\n  {{ k.upper() }}={{ v.strip() }}{{ ' ' if not loop.last }}\n{%- endfor %}\n{{ s.split('</think>')[-1].lstrip() }}|{{ s.startswith('a') }}".into(),
        "test",
    )
    .unwrap();
    let out = env
        .get_template(TEMPLATE_NAME)
        .unwrap()
        .render(minijinja::context! { d => json(r#"{"b": " x ", "a": "y"}"#), s => "a</think>  z" })
        .unwrap();
    // What jinja2 with the same settings renders (booleans print as Python's).
    assert_eq!(out, "  B=x   A=yz|True");
}

#[test]
fn content_format_detection() {
    assert_eq!(
        detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
        ContentFormat::String
    );
    assert_eq!(
        detect_content_format("{%- for content in message['content'] -%}{% endfor %}"),
        ContentFormat::OpenAi
    );
    assert_eq!(
        detect_content_format("{% for c in message.content | selectattr('type') %}"),
        ContentFormat::OpenAi
    );
}

#[test]
fn string_content_joins_text_and_puts_media_first() {
    let msgs = json(
        r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},"b",{"type":"text","text":null}]},
            {"role":"assistant","content":null,"tool_calls":[]},
            {"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"}]}]"#,
    );
    let conv = conversation(&msgs, ContentFormat::String, &MediaPlaceholders::default()).unwrap();
    assert_eq!(
        dumps(&conv, &PyJson::default()),
        r#"[{"role": "user", "content": "<image>\na\nb"}, {"role": "assistant", "content": ""}, {"role": "tool", "content": "r1\nr2", "tool_call_id": "c1"}]"#
    );
    let conv = conversation(&msgs, ContentFormat::OpenAi, &MediaPlaceholders::default()).unwrap();
    assert_eq!(
        dumps(&conv, &PyJson::default()),
        r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": []}, {"role": "tool", "content": "r1\nr2", "tool_call_id": "c1"}]"#
    );
}

#[test]
fn tool_calls_and_tools_are_normalised() {
    let msgs = json(
        r#"[{"role":"assistant","content":null,"name":"bot","tool_calls":[
            {"id":"1","type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": [2]}"}},
            {"id":"2","type":"function","function":{"name":"g","arguments":"not json"}}]}]"#,
    );
    let conv = conversation(&msgs, ContentFormat::String, &MediaPlaceholders::default()).unwrap();
    assert_eq!(
        dumps(&conv, &PyJson::default()),
        r#"[{"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": [2]}}}, {"id": "2", "type": "function", "function": {"name": "g", "arguments": {}}}], "name": "bot"}]"#
    );
    let tools = json(
        r#"[{"function":{"parameters":{"type":"object"},"name":"f","strict":true},"type":"function"}]"#,
    );
    assert_eq!(
        dumps(&normalise_tools(&tools).unwrap(), &PyJson::default()),
        r#"[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}, "strict": true}}]"#
    );
}

#[test]
fn bad_messages_are_request_errors() {
    for (bad, want) in [
        (r#"{"role":"user"}"#, "messages must be an array"),
        (
            r#"[{"content":"x"}]"#,
            "messages[0]: a message needs a string \"role\"",
        ),
        (
            r#"[{"role":"user","content":5}]"#,
            "messages[0]: content must be",
        ),
        (
            r#"[{"role":"user","content":[{"type":"hologram"}]}]"#,
            "unsupported content part type",
        ),
    ] {
        let err = conversation(
            &json(bad),
            ContentFormat::String,
            &MediaPlaceholders::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains(want), "{bad}: {err}");
    }
}
