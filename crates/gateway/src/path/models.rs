//! The `GET /v1/models` listing, built once from the configuration.
//!
//! Owns the list's JSON shape. It must not query engines: it reports what the
//! configuration says each target serves.

use rolter_config::Config;

/// Builds the OpenAI list body of every model named by a target, in configuration order.
pub fn list_body(config: &Config, created: u64) -> Vec<u8> {
    let mut names: Vec<&str> = Vec::new();
    for t in &config.targets {
        for m in &t.models {
            if !names.contains(&m.as_str()) {
                names.push(m);
            }
        }
    }
    for r in &config.routes {
        for m in &r.matcher.models {
            if !names.contains(&m.as_str()) {
                names.push(m);
            }
        }
    }
    let data: Vec<serde_json::Value> = names
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": "rolter",
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data})).unwrap_or_default()
}
