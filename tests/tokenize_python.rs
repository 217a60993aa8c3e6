//! The local tokenizer's ids for multi-turn conversations, encoded piece by piece with the
//! piece cache warm from the turns before, against Python's reference implementations: the
//! chat template rendered by jinja2 as `transformers` sets it up and the whole rendered text
//! encoded by the `tokenizers` package (tests/py/tokenize_reference.py), for both fixture
//! tokenizers.
//!
//! Needs a Python with `tokenizers` and `jinja2` (`tests/run.sh` installs them with pip).
//! `ROLTER_PYTHON` names the interpreter, otherwise `python3`; without the packages the test
//! fails and says how to install them. With `ROLTER_SKIP_PY` set the test is skipped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rolter::tokenize::{ChatRequest, LocalTokenizer};
use serde_json::{json, Value};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(name)
}

/// Conversations, each grown one message at a time by the requests below.
fn conversations() -> Vec<Vec<Value>> {
    let long = "The committee will meet on the 14th to review the budget. ".repeat(40);
    vec![
        vec![
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user", "content": "What is the weather like in Paris?"}),
            json!({"role": "assistant", "content": "Mild: 18 degrees, light rain in the afternoon."}),
            json!({"role": "user", "content": "Should I take an umbrella?"}),
            json!({"role": "assistant", "content": "Yes, take an umbrella.\n\nAnything else?"}),
            json!({"role": "user", "content": "No, thanks!"}),
        ],
        vec![
            json!({"role": "user", "content": "Write a function that returns the largest number."}),
            json!({"role": "assistant", "content": "```python\ndef largest(values):\n    best = values[0]\n    for v in values[1:]:\n        if v > best:\n            best = v\n    return best\n```\n"}),
            json!({"role": "user", "content": "  And if the list is empty?  \n\n"}),
            json!({"role": "assistant", "content": "It raises IndexError; check `if not values:` first."}),
            json!({"role": "user", "content": long}),
        ],
        vec![
            json!({"role": "system", "content": "Réponds en français. Ünïcödé: 東京, русский, 😀👍🏽, cafe\u{301}."}),
            json!({"role": "user", "content": "Traduis : \"The library opens at nine o'clock.\""}),
            json!({"role": "assistant", "content": "La bibliothèque ouvre à neuf heures."}),
            json!({"role": "user", "content": "Et « it's, we've, they'll » ?\r\n\t1234567 3.14"}),
            json!({"role": "assistant", "content": ""}),
            json!({"role": "user", "content": "<|im_start|> and <|eot_id|> typed as text"}),
        ],
    ]
}

struct Case {
    fixture: &'static str,
    messages: Vec<Value>,
    add_generation_prompt: bool,
    kwargs: Value,
}

/// Every request of every conversation, in the order a client sends them: the messages up
/// to each user turn with a generation prompt, then the whole conversation without one.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for fixture in ["chatml", "llama3"] {
        // The Llama template writes today's date unless it is given.
        let kwargs = json!({"date_string": "26 Jul 2024"});
        for conv in conversations() {
            for end in 1..=conv.len() {
                if conv[end - 1]["role"] == "user" {
                    out.push(Case {
                        fixture,
                        messages: conv[..end].to_vec(),
                        add_generation_prompt: true,
                        kwargs: kwargs.clone(),
                    });
                }
            }
            out.push(Case {
                fixture,
                messages: conv.clone(),
                add_generation_prompt: false,
                kwargs: kwargs.clone(),
            });
        }
    }
    out
}

const SETUP: &str =
    "install them with `python3 -m pip install tokenizers jinja2` (as tests/run.sh \
     does); set ROLTER_PYTHON to pick the interpreter, or ROLTER_SKIP_PY=1 to skip this test";

/// The reference texts and ids of `cases` (all of one fixture), from Python.
fn reference(python: &str, fixture: &str, cases: &[&Case]) -> Vec<(String, Vec<u32>)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/tokenize_reference.py");
    let request = json!({
        "dir": fixture_dir(fixture),
        "cases": cases.iter().map(|c| json!({
            "messages": c.messages,
            "add_generation_prompt": c.add_generation_prompt,
            "kwargs": c.kwargs,
        })).collect::<Vec<_>>(),
    });
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e}); {SETUP}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(3) => panic!("{python} lacks tokenizers or jinja2 ({stderr}); {SETUP}"),
        code => panic!("tokenize_reference.py failed (exit {code:?}):\n{stderr}"),
    }
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ids = r["ids"].as_array().unwrap();
            (
                r["text"].as_str().unwrap().to_string(),
                ids.iter().map(|i| i.as_u64().unwrap() as u32).collect(),
            )
        })
        .collect()
}

#[test]
fn incremental_ids_equal_python_full_encodes() {
    if std::env::var_os("ROLTER_SKIP_PY").is_some() {
        println!("SKIPPED tokenize_python: ROLTER_SKIP_PY is set");
        return;
    }
    let python = std::env::var("ROLTER_PYTHON").unwrap_or_else(|_| "python3".into());
    let cases = cases();
    for fixture in ["chatml", "llama3"] {
        let dir = fixture_dir(fixture);
        let tok = LocalTokenizer::from_files(
            &dir.join("tokenizer.json"),
            Some(&dir.join("tokenizer_config.json")),
        )
        .unwrap();
        assert_eq!(tok.encodes_by_segment(), Ok(()), "{fixture}");
        let mine: Vec<&Case> = cases.iter().filter(|c| c.fixture == fixture).collect();
        let want = reference(&python, fixture, &mine);
        assert_eq!(want.len(), mine.len());
        let mut hits = 0;
        for (i, (case, (text, ids))) in mine.iter().zip(&want).enumerate() {
            let messages = serde_json::to_vec(&case.messages).unwrap();
            let kwargs = case.kwargs.to_string();
            let request = ChatRequest {
                messages: &messages,
                tools: None,
                add_generation_prompt: case.add_generation_prompt,
                chat_template_kwargs: Some(kwargs.as_bytes()),
            };
            assert_eq!(
                &tok.render_chat(&request).unwrap(),
                text,
                "{fixture} case {i}"
            );
            let before = tok.cached_segments();
            let mut got = Vec::new();
            tok.chat_request_ids(&request, &mut got).unwrap();
            assert_eq!(&got, ids, "{fixture} case {i}: {text:?}");
            // A later request of the same conversation finds its history cached: it adds
            // fewer pieces than it has.
            if case.messages.len() > 1 && tok.cached_segments() < before + case.messages.len() {
                hits += 1;
            }
        }
        assert!(hits > 0, "{fixture}: no request reused a cached piece");
    }
}
