//! The top-level fields of a JSON request or answer body, borrowed, and the body written
//! again with some of them set or removed: what a disaggregated route's legs need (the
//! prefill's `kv_transfer_params`, one token, no stream; the bootstrap fields of SGLang),
//! and a data-parallel rank sent in the body.
//!
//! One `serde_json` pass over the top-level object; the values are not parsed (they are
//! borrowed [`RawValue`]s) and are written back byte for byte. Only the top level is
//! touched, and a field set on the way replaces the one of that name where it stood, or
//! comes last. Owns that mapping; it must not do I/O or decide which edits a request gets.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer as _, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A body's top-level fields, in order.
pub struct Fields<'a> {
    entries: Vec<(Cow<'a, str>, &'a RawValue)>,
}

/// A body that is not a JSON object (or has a field twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnObject(pub String);

impl fmt::Display for NotAnObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the body is not a JSON object: {}", self.0)
    }
}

/// One change to a body's top-level fields.
#[derive(Debug, Clone, Copy)]
pub enum Edit<'e> {
    /// The field gets this JSON value (raw bytes), where it stood or last.
    Set(&'e str, &'e str),
    /// The field, when the body has it, gets this JSON value.
    Replace(&'e str, &'e str),
    /// The field goes.
    Remove(&'e str),
}

impl Edit<'_> {
    fn key(&self) -> &str {
        match self {
            Edit::Set(k, _) | Edit::Replace(k, _) | Edit::Remove(k) => k,
        }
    }
}

impl<'a> Fields<'a> {
    /// The top-level fields of `body`.
    pub fn parse(body: &'a [u8]) -> Result<Fields<'a>, NotAnObject> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let entries = de
            .deserialize_map(EntriesVisitor)
            .and_then(|e| de.end().map(|()| e))
            .map_err(|e| NotAnObject(e.to_string()))?;
        for (i, (k, _)) in entries.iter().enumerate() {
            if entries[..i].iter().any(|(o, _)| o == k) {
                return Err(NotAnObject(format!("the field `{k}` appears twice")));
            }
        }
        Ok(Fields { entries })
    }

    /// The raw JSON value of field `key`.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// How many requests a batched SGLang `/generate` body holds: `text` a list, or
    /// `input_ids` a list of lists (as SGLang's `mini_lb` counts them); `None` for one.
    pub fn batch_size(&self) -> Option<usize> {
        if let Some(text) = self.get("text").filter(|v| v.get() != "null") {
            return list_len(text);
        }
        let ids = self.get("input_ids").filter(|v| v.get() != "null")?;
        let items: Vec<&RawValue> = serde_json::from_str(ids.get()).ok()?;
        match items.first() {
            Some(first) if first.get().starts_with('[') => Some(items.len()),
            _ => None,
        }
    }

    /// Writes the object again into `out` (appended), with `edits` applied.
    pub fn write(&self, edits: &[Edit<'_>], out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        let mut field = |out: &mut Vec<u8>, key: &str, value: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_key(out, key);
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        };
        for (k, v) in &self.entries {
            match edits.iter().find(|e| e.key() == k.as_ref()) {
                None => field(out, k, v.get()),
                Some(Edit::Set(_, value) | Edit::Replace(_, value)) => field(out, k, value),
                Some(Edit::Remove(_)) => {}
            }
        }
        for e in edits {
            if let Edit::Set(k, value) = e {
                if self.get(k).is_none() {
                    field(out, k, value);
                }
            }
        }
        out.push(b'}');
    }
}

/// The length of a JSON list (`None` for anything else).
fn list_len(v: &RawValue) -> Option<usize> {
    if !v.get().starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<&RawValue>>(v.get())
        .ok()
        .map(|l| l.len())
}

/// A key as a JSON string.
fn write_key(out: &mut Vec<u8>, key: &str) {
    if key
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
    } else {
        // serde_json escapes what must be.
        let _ = serde_json::to_writer(&mut *out, key);
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(12));
        while let Some(k) = map.next_key::<Cow<'de, str>>()? {
            let v: &'de RawValue = map.next_value()?;
            out.push((k, v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edited(body: &str, edits: &[Edit<'_>]) -> String {
        let f = Fields::parse(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        f.write(edits, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_pass_byte_for_byte_and_edits_apply_in_place_or_last() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"h\u00e9 \"x\""}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64}"#;
        let out = edited(
            body,
            &[
                Edit::Set("stream", "false"),
                Edit::Set("max_tokens", "1"),
                Edit::Replace("max_completion_tokens", "1"),
                Edit::Remove("stream_options"),
                Edit::Remove("min_tokens"),
                Edit::Set("kv_transfer_params", r#"{"do_remote_decode":true}"#),
            ],
        );
        assert_eq!(
            out,
            r#"{"model":"m","messages":[{"role":"user","content":"h\u00e9 \"x\""}],"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}"#
        );
        // The output is the same JSON as serde_json's own edit of the input.
        let mut want: serde_json::Value = serde_json::from_str(body).unwrap();
        let o = want.as_object_mut().unwrap();
        o.insert("stream".into(), false.into());
        o.insert("max_tokens".into(), 1.into());
        o.remove("stream_options");
        o.insert(
            "kv_transfer_params".into(),
            serde_json::json!({"do_remote_decode": true}),
        );
        let got: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn replace_touches_only_a_present_field() {
        let out = edited(
            r#"{"max_completion_tokens":50, "a" : 1 }"#,
            &[
                Edit::Replace("max_completion_tokens", "1"),
                Edit::Replace("b", "2"),
            ],
        );
        assert_eq!(out, r#"{"max_completion_tokens":1,"a":1}"#);
    }

    #[test]
    fn escaped_keys_are_written_escaped() {
        let out = edited(r#"{"a\"b":1,"\u0001":2}"#, &[]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["a\"b"], 1);
        assert_eq!(v["\u{1}"], 2);
    }

    #[test]
    fn get_reads_a_raw_top_level_value() {
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[1,2]}}"#;
        let f = Fields::parse(answer).unwrap();
        assert_eq!(
            f.get("kv_transfer_params").unwrap().get(),
            r#"{"remote_engine_id":"e1","remote_block_ids":[1,2]}"#
        );
        assert!(f.get("remote_engine_id").is_none());
    }

    #[test]
    fn not_an_object_or_a_repeated_field_is_refused() {
        for body in [
            &b"[1,2]"[..],
            b"{\"a\":1",
            b"",
            b"{\"a\":1}x",
            b"{\"a\":1,\"a\":2}",
        ] {
            assert!(
                Fields::parse(body).is_err(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn batch_size_counts_as_sglang_does() {
        let size = |b: &str| Fields::parse(b.as_bytes()).unwrap().batch_size();
        assert_eq!(size(r#"{"text":"one"}"#), None);
        assert_eq!(size(r#"{"text":["a","b","c"]}"#), Some(3));
        assert_eq!(size(r#"{"input_ids":[1,2,3]}"#), None);
        assert_eq!(size(r#"{"input_ids":[[1,2],[3]]}"#), Some(2));
        assert_eq!(
            size(r#"{"messages":[{"role":"user","content":"x"}]}"#),
            None
        );
        assert_eq!(size(r#"{"text":null,"input_ids":[[1]]}"#), Some(1));
    }
}
