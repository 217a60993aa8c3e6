//! What a leg changes in the client's body on its way upstream: a disaggregated route's
//! fields (vLLM's prefill request and the decode's `kv_transfer_params`; SGLang's bootstrap
//! fields), a data-parallel rank sent in the body (SGLang's `data_parallel_rank`), and a
//! target's upstream model name. A co-located request to a target without a body rank
//! changes nothing here, and its body goes out as it came (`upstream_request`).
//!
//! Owns which fields each leg sets or removes, as the engines' own reference proxies send
//! them (vLLM's `toy_proxy_server.py`, SGLang's `mini_lb.py`). It must not do I/O; the
//! bytes are written by `rolter_codec::api::fields`.

use rolter_codec::api::fields::{Edit, Fields};
use rolter_config::{EngineKind, Target};

/// The `kv_transfer_params` of vLLM's prefill request: prefill here, decode elsewhere.
pub const VLLM_PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The changes of vLLM's prefill request besides its transfer parameters: one token, no
/// stream, no minimum.
const VLLM_PREFILL_EDITS: [Edit<'static>; 7] = [
    Edit::Set("kv_transfer_params", VLLM_PREFILL_PARAMS),
    Edit::Set("stream", "false"),
    Edit::Set("max_tokens", "1"),
    Edit::Replace("max_completion_tokens", "1"),
    Edit::Remove("stream_options"),
    Edit::Remove("min_tokens"),
    Edit::Remove("min_completion_tokens"),
];

/// The fields one leg sets in the body (raw JSON values), and whether it is vLLM's prefill.
#[derive(Debug, Default, Clone)]
pub struct LegBody {
    /// vLLM's prefill leg (`VLLM_PREFILL_EDITS`).
    pub vllm_prefill: bool,
    /// Fields set: the decode's `kv_transfer_params`, SGLang's bootstrap fields.
    pub set: Vec<(&'static str, String)>,
}

impl LegBody {
    /// vLLM's prefill leg.
    pub fn vllm_prefill() -> LegBody {
        LegBody {
            vllm_prefill: true,
            set: Vec::new(),
        }
    }

    /// vLLM's decode leg: the client's body with the prefill's transfer parameters.
    pub fn vllm_decode(kv_transfer_params: String) -> LegBody {
        LegBody {
            vllm_prefill: false,
            set: vec![("kv_transfer_params", kv_transfer_params)],
        }
    }

    /// SGLang's legs (both get the same): the prefill engine's bootstrap host and port, and
    /// the room (`rooms`, one per request of a batch: lists then; a single one otherwise).
    pub fn sglang(host: &str, port: u16, rooms: &[u64], batch: bool) -> LegBody {
        let quoted = serde_json::to_string(host).unwrap_or_default();
        let (host, port, room) = if batch {
            let list = |one: &str| vec![one; rooms.len()].join(",");
            let rooms: Vec<String> = rooms.iter().map(u64::to_string).collect();
            (
                format!("[{}]", list(&quoted)),
                format!("[{}]", list(&port.to_string())),
                format!("[{}]", rooms.join(",")),
            )
        } else {
            (quoted, port.to_string(), rooms[0].to_string())
        };
        LegBody {
            vllm_prefill: false,
            set: vec![
                ("bootstrap_host", host),
                ("bootstrap_port", port),
                ("bootstrap_room", room),
            ],
        }
    }

    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        !self.vllm_prefill && self.set.is_empty()
    }
}

/// A random bootstrap room, in 0..2^63 as SGLang draws them.
pub fn bootstrap_room() -> u64 {
    fastrand::u64(0..1 << 63)
}

/// The host a decode engine reaches the prefill engine's bootstrap server at: the target
/// URL's host, an IPv6 address in brackets.
pub fn bootstrap_host(target: &Target) -> String {
    let host = target.server_name.as_str();
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Whether `target` takes its data-parallel rank in the body.
pub fn rank_in_body(target: &Target) -> bool {
    target.dp.is_some() && target.engine == EngineKind::Sglang
}

/// What the target changes in every leg's body.
#[derive(Debug, Clone, Copy, Default)]
pub struct Changes<'a> {
    /// Its upstream model name, quoted, when it maps the model.
    pub model: Option<&'a str>,
    /// The field it schedules by and the request's class's value (`priority_field`).
    pub priority: Option<(&'a str, &'a str)>,
    /// `stream_options` set on the client's behalf (the stream's usage asked for).
    pub stream_options: Option<&'a str>,
}

/// Writes the body whose top-level fields are `fields` with the leg's changes, the
/// target's body rank, its upstream model name and its priority field into `out`.
pub fn write(
    fields: &Fields<'_>,
    leg: &LegBody,
    target: &Target,
    changes: Changes<'_>,
    out: &mut Vec<u8>,
) {
    let Changes {
        model,
        priority,
        stream_options,
    } = changes;
    let rank = target
        .dp
        .as_ref()
        .filter(|_| rank_in_body(target))
        .map(|d| d.rank.to_string());
    let mut edits: Vec<Edit<'_>> = Vec::with_capacity(12);
    if leg.vllm_prefill {
        edits.extend_from_slice(&VLLM_PREFILL_EDITS);
    }
    edits.extend(leg.set.iter().map(|(k, v)| Edit::Set(k, v)));
    if let Some(r) = &rank {
        edits.push(Edit::Set("data_parallel_rank", r));
    }
    if let Some(m) = model {
        edits.push(Edit::Replace("model", m));
    }
    if let Some((field, value)) = priority {
        edits.push(Edit::Set(field, value));
    }
    if let Some(options) = stream_options {
        edits.push(Edit::Set("stream_options", options));
    }
    fields.write(&edits, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(dp: Option<u32>, engine: EngineKind) -> Target {
        let c = rolter_config::load_str(
            "[[targets]]\nname = \"t\"\nurl = \"http://[::1]:8000\"\n",
            "t.toml",
        )
        .unwrap();
        let mut t = c.targets[0].clone();
        t.engine = engine;
        t.dp = dp.map(|rank| rolter_config::DpRank {
            rank,
            size: 4,
            engine_name: "t".into(),
        });
        t
    }

    fn json(leg: &LegBody, t: &Target, body: &str) -> serde_json::Value {
        let mut out = Vec::new();
        let fields = Fields::parse(body.as_bytes()).unwrap();
        write(&fields, leg, t, Changes::default(), &mut out);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn the_priority_field_is_set_over_what_the_client_sent() {
        let t = target(None, EngineKind::Vllm);
        let fields = Fields::parse(br#"{"model":"m","priority":-100,"prompt":"x"}"#).unwrap();
        let mut out = Vec::new();
        let changes = Changes {
            model: None,
            priority: Some(("priority", "5")),
            stream_options: None,
        };
        write(&fields, &LegBody::default(), &t, changes, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "m", "priority": 5, "prompt": "x"})
        );
    }

    #[test]
    fn the_vllm_prefill_request_is_the_toy_proxys() {
        let body = r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"max_completion_tokens":100,"min_tokens":5,"min_completion_tokens":5,"temperature":0}"#;
        let v = json(
            &LegBody::vllm_prefill(),
            &target(None, EngineKind::Vllm),
            body,
        );
        assert_eq!(
            v,
            serde_json::json!({
                "model": "m", "messages": [], "stream": false, "max_tokens": 1,
                "max_completion_tokens": 1, "temperature": 0,
                "kv_transfer_params": {
                    "do_remote_decode": true, "do_remote_prefill": false,
                    "remote_engine_id": null, "remote_block_ids": null,
                    "remote_host": null, "remote_port": null
                }
            })
        );
        // No max_completion_tokens is added when the client sent none.
        let v = json(
            &LegBody::vllm_prefill(),
            &target(None, EngineKind::Vllm),
            r#"{"model":"m","prompt":"x"}"#,
        );
        assert!(v.get("max_completion_tokens").is_none());
        assert_eq!(v["max_tokens"], 1);
    }

    #[test]
    fn the_decode_request_is_the_clients_with_the_prefills_params() {
        let params =
            r#"{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[3,4]}"#;
        let body = r#"{"model":"m","stream":true,"max_tokens":100}"#;
        let v = json(
            &LegBody::vllm_decode(params.into()),
            &target(None, EngineKind::Vllm),
            body,
        );
        let mut want: serde_json::Value = serde_json::from_str(body).unwrap();
        want["kv_transfer_params"] = serde_json::from_str(params).unwrap();
        assert_eq!(v, want);
    }

    #[test]
    fn sglang_bootstrap_fields_single_and_batched() {
        let t = target(None, EngineKind::Sglang);
        let host = bootstrap_host(&t);
        assert_eq!(host, "[::1]");
        let v = json(
            &LegBody::sglang(&host, 8998, &[7], false),
            &t,
            r#"{"text":"x"}"#,
        );
        assert_eq!(v["bootstrap_host"], "[::1]");
        assert_eq!(v["bootstrap_port"], 8998);
        assert_eq!(v["bootstrap_room"], 7);
        let v = json(
            &LegBody::sglang(&host, 9000, &[1, 2], true),
            &t,
            r#"{"text":["a","b"]}"#,
        );
        assert_eq!(v["bootstrap_host"], serde_json::json!(["[::1]", "[::1]"]));
        assert_eq!(v["bootstrap_port"], serde_json::json!([9000, 9000]));
        assert_eq!(v["bootstrap_room"], serde_json::json!([1, 2]));
        assert!(bootstrap_room() < 1 << 63);
    }

    #[test]
    fn an_sglang_rank_goes_in_the_body_and_a_vllm_rank_does_not() {
        let v = json(
            &LegBody::default(),
            &target(Some(2), EngineKind::Sglang),
            r#"{"a":1}"#,
        );
        assert_eq!(v["data_parallel_rank"], 2);
        assert!(rank_in_body(&target(Some(2), EngineKind::Sglang)));
        assert!(!rank_in_body(&target(Some(2), EngineKind::Vllm)));
        assert!(!rank_in_body(&target(None, EngineKind::Sglang)));
        let v = json(
            &LegBody::default(),
            &target(Some(2), EngineKind::Vllm),
            r#"{"a":1}"#,
        );
        assert!(v.get("data_parallel_rank").is_none());
    }

    #[test]
    fn the_upstream_model_name_replaces_the_clients() {
        let mut out = Vec::new();
        let t = target(None, EngineKind::Vllm);
        let fields = Fields::parse(br#"{"model":"pub","x":1}"#).unwrap();
        write(
            &fields,
            &LegBody::vllm_prefill(),
            &t,
            Changes {
                model: Some("\"real\""),
                priority: None,
                stream_options: None,
            },
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "real");
    }
}
