//! The `GET /v1/models` listing and the `GET /v1/models/{id}` objects, built once from the
//! configuration.
//!
//! Owns their JSON shapes (OpenAI's model object). It must not query engines: it reports
//! what the configuration says each target serves.

use std::borrow::Cow;
use std::collections::HashMap;

use rolter_config::Config;

/// Every model named by a target or a route, once each, in configuration order.
fn names(config: &Config) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    let all = config
        .targets
        .iter()
        .flat_map(|t| t.models.iter())
        .chain(config.routes.iter().flat_map(|r| r.matcher.models.iter()));
    for m in all {
        if !names.contains(&m.as_str()) {
            names.push(m);
        }
    }
    names
}

fn object(id: &str, created: u64) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "object": "model",
        "created": created,
        "owned_by": "rolter",
    })
}

/// Builds the OpenAI list body of every model named by a target, in configuration order.
pub fn list_body(config: &Config, created: u64) -> Vec<u8> {
    let data: Vec<serde_json::Value> = names(config).iter().map(|m| object(m, created)).collect();
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data})).unwrap_or_default()
}

/// Builds each listed model's object body, as `GET /v1/models/{id}` answers it.
pub fn object_bodies(config: &Config, created: u64) -> HashMap<String, Vec<u8>> {
    names(config)
        .into_iter()
        .map(|m| {
            let body = serde_json::to_vec(&object(m, created)).unwrap_or_default();
            (m.to_string(), body)
        })
        .collect()
}

/// The model id of a `/v1/models/{id}` path segment, percent-decoded (SDKs encode a `/`
/// in an id such as `org/model`; some send it as is). Invalid escapes stay as written.
pub fn decode_id(raw: &str) -> Cow<'_, str> {
    if !raw.contains('%') {
        return Cow::Borrowed(raw);
    }
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::decode_id;

    #[test]
    fn ids_are_percent_decoded() {
        assert_eq!(decode_id("m"), "m");
        assert_eq!(decode_id("org%2Fmodel"), "org/model");
        assert_eq!(decode_id("org/model"), "org/model");
        assert_eq!(decode_id("a%2"), "a%2");
        assert_eq!(decode_id("a%zz%41"), "a%zzA");
        assert_eq!(decode_id("%ff"), "%ff");
    }
}
