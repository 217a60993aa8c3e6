//! The answers of the engines' endpoints that generate no text, as vLLM (and SGLang, which
//! mirrors them) shapes them: rerank, score, detokenize, pooling, classify, the audio
//! transcription and translation endpoints (multipart forms), and Anthropic's
//! `count_tokens`. Scores and vectors are deterministic functions of the input, so tests
//! can check them.
//!
//! Owns those bodies only; it must not keep state (the connection records what arrived).

use serde_json::{json, Value};

use crate::http::Route;

/// The answer to a request for one of these endpoints: a JSON body, or a 400's message.
pub(crate) fn answer(route: Route, body: &[u8]) -> Result<Vec<u8>, String> {
    if matches!(route, Route::Transcription | Route::Translation) {
        return audio(route, body);
    }
    let req: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let reply = match route {
        Route::CountTokens => {
            let text = req
                .get("messages")
                .map(Value::to_string)
                .unwrap_or_default();
            let system = req.get("system").map(Value::to_string).unwrap_or_default();
            json!({"input_tokens": tokens(&text) + tokens(&system)})
        }
        Route::Rerank => rerank(&req, &model)?,
        Route::Score => score(&req, &model)?,
        Route::Detokenize => {
            let ids = req
                .get("tokens")
                .and_then(Value::as_array)
                .ok_or("the request needs `tokens` (a list of token ids)")?;
            let mut prompt = String::new();
            for id in ids {
                let id = id
                    .as_u64()
                    .ok_or("token ids must be non-negative integers")?;
                prompt.push_str(crate::api::token(id as u32));
            }
            json!({"prompt": prompt})
        }
        Route::Pooling => {
            let inputs = inputs(&req)?;
            let data: Vec<Value> = inputs
                .iter()
                .enumerate()
                .map(|(i, t)| json!({"index": i, "object": "pooling", "data": vector(t)}))
                .collect();
            list("pool", &model, data, &inputs)
        }
        Route::Classify => {
            let inputs = inputs(&req)?;
            let data: Vec<Value> = inputs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let p = (t.len() % 10) as f64 / 10.0;
                    let label = if p < 0.5 { "negative" } else { "positive" };
                    json!({"index": i, "label": label, "probs": [1.0 - p, p], "num_classes": 2})
                })
                .collect();
            list("classify", &model, data, &inputs)
        }
        _ => return Err("not an endpoint of this module".into()),
    };
    Ok(serde_json::to_vec(&reply).unwrap_or_default())
}

/// About four bytes a token, as the mock counts everywhere.
fn tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}

/// A string or a list of strings, as `input`, `text_1`, `text_2` and `documents` may be.
fn texts(v: Option<&Value>, key: &str) -> Result<Vec<String>, String> {
    match v {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|d| match d {
                Value::String(s) => Ok(s.clone()),
                // Rerank documents may be objects with a `text`.
                Value::Object(o) => o
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("each `{key}` object needs a `text`")),
                _ => Err(format!("`{key}` items must be strings")),
            })
            .collect(),
        _ => Err(format!(
            "the request needs `{key}` (a string or a list of strings)"
        )),
    }
}

fn inputs(req: &Value) -> Result<Vec<String>, String> {
    texts(req.get("input"), "input")
}

/// The share of `b`'s words that occur in `a`: 0 to 1, 1 for a perfect match.
fn overlap(a: &str, b: &str) -> f64 {
    let words: Vec<&str> = b.split_whitespace().collect();
    if words.is_empty() {
        return 0.0;
    }
    let hits = words.iter().filter(|w| a.contains(**w)).count();
    hits as f64 / words.len() as f64
}

/// A small deterministic vector for a text.
fn vector(text: &str) -> Vec<f64> {
    (0..4)
        .map(|i| ((text.len() + i) % 8) as f64 / 8.0 - 0.5)
        .collect()
}

fn usage(prompt: usize) -> Value {
    json!({"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0})
}

fn list(kind: &str, model: &str, data: Vec<Value>, inputs: &[String]) -> Value {
    let prompt: usize = inputs.iter().map(|t| tokens(t)).sum();
    json!({
        "id": format!("{kind}-{:032x}", fastrand::u128(..)),
        "object": "list",
        "created": now(),
        "model": model,
        "data": data,
        "usage": usage(prompt),
    })
}

/// `/rerank`, `/v1/rerank`: the documents by relevance to the query, best first.
fn rerank(req: &Value, model: &str) -> Result<Value, String> {
    let query = req
        .get("query")
        .and_then(Value::as_str)
        .ok_or("the request needs `query` (a string)")?;
    let docs = texts(req.get("documents"), "documents")?;
    let mut results: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (i, overlap(d, query)))
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(n) = req.get("top_n").and_then(Value::as_u64) {
        results.truncate(n as usize);
    }
    let total: usize = tokens(query) + docs.iter().map(|d| tokens(d)).sum::<usize>();
    let results: Vec<Value> = results
        .iter()
        .map(|&(i, s)| json!({"index": i, "document": {"text": docs[i]}, "relevance_score": s}))
        .collect();
    Ok(json!({
        "id": format!("rerank-{:032x}", fastrand::u128(..)),
        "model": model,
        "usage": {"total_tokens": total},
        "results": results,
    }))
}

/// `/score`, `/v1/score`: one score per `text_2` against `text_1` (one, or one each).
fn score(req: &Value, model: &str) -> Result<Value, String> {
    let first = texts(req.get("text_1"), "text_1")?;
    let second = texts(req.get("text_2"), "text_2")?;
    if first.len() != 1 && first.len() != second.len() {
        return Err("`text_1` must hold one text or as many as `text_2`".into());
    }
    let data: Vec<Value> = second
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let q = if first.len() == 1 {
                &first[0]
            } else {
                &first[i]
            };
            json!({"index": i, "object": "score", "score": overlap(t, q)})
        })
        .collect();
    let all: Vec<String> = first.into_iter().chain(second).collect();
    Ok(list("score", model, data, &all))
}

/// `/v1/audio/transcriptions` and `/translations`: the text "heard" in the file, which the
/// mock reports as the file part's size.
fn audio(route: Route, body: &[u8]) -> Result<Vec<u8>, String> {
    if !body.starts_with(b"--") {
        return Err("the request must be a multipart/form-data body".into());
    }
    let verb = if route == Route::Transcription {
        "transcribed"
    } else {
        "translated"
    };
    let text = format!("{verb} {} bytes of form data", body.len());
    Ok(serde_json::to_vec(&json!({"text": text})).unwrap_or_default())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(route: Route, body: &str) -> Value {
        serde_json::from_slice(&answer(route, body.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn rerank_orders_by_relevance() {
        let r = reply(
            Route::Rerank,
            r#"{"model":"m","query":"red apple","documents":["a red apple",{"text":"blue sky"},"red car"],"top_n":2}"#,
        );
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 0);
        assert_eq!(results[0]["relevance_score"], 1.0);
        assert_eq!(results[1]["index"], 2);
        assert_eq!(results[1]["document"]["text"], "red car");
        assert_eq!(r["model"], "m");
    }

    #[test]
    fn score_pooling_classify_detokenize_count_tokens() {
        let s = reply(
            Route::Score,
            r#"{"model":"m","text_1":"a b","text_2":["a b","c"]}"#,
        );
        assert_eq!(s["object"], "list");
        assert_eq!(s["data"][0]["score"], 1.0);
        assert_eq!(s["data"][1]["score"], 0.0);
        let p = reply(Route::Pooling, r#"{"model":"m","input":["x","yy"]}"#);
        assert_eq!(p["data"][1]["object"], "pooling");
        assert_eq!(p["data"][1]["data"].as_array().unwrap().len(), 4);
        let c = reply(Route::Classify, r#"{"model":"m","input":"hello"}"#);
        assert_eq!(c["data"][0]["label"], "positive");
        assert_eq!(c["data"][0]["num_classes"], 2);
        let d = reply(Route::Detokenize, r#"{"model":"m","tokens":[0,1]}"#);
        assert_eq!(d["prompt"], " Hello from");
        let n = reply(
            Route::CountTokens,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert!(n["input_tokens"].as_u64().unwrap() > 0);
        assert!(answer(Route::Score, br#"{"text_1":["a","b"],"text_2":["c"]}"#).is_err());
        assert!(answer(Route::Rerank, b"{}").is_err());
        assert!(answer(Route::Transcription, b"{}").is_err());
    }
}
