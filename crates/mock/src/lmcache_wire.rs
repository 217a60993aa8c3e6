//! What crosses between an LMCache worker and its controller: the worker messages in
//! LMCache's msgpack layout (and the JSON form the controller also accepts), and the
//! chunk keys inside them, which the mock's worker and the controller stand-in must
//! compute alike.
//!
//! Encoding: LMCache's messages are msgspec Structs with `tag=True` (not `array_like`), so
//! each is a msgpack **map** whose first entry is `"type": "<ClassName>"`, followed by the
//! fields in declaration order (`lmcache/v1/cache_controller/message.py`). Integers take
//! the smallest encoding, as msgspec writes them: non-negative values as positive fixint or
//! `uint8..uint64`, negative ones as negative fixint or `int8..int64`. Decoding accepts the
//! fields in any order and ignores fields it does not know.
//!
//! Chunk keys: a token list is cut into chunks of `chunk_size` tokens, the last partial
//! chunk included (LMCache's `save_unfull_chunk=True`); each chunk's key is a hash over the
//! previous chunk's key and this chunk's tokens, so a key stands for the whole prefix up to
//! the end of its chunk. The hash is the mock's own (64-bit FNV-1a), not LMCache's, so
//! keys from real LMCache workers never match keys computed here.
//!
//! This module only encodes, decodes and hashes; it holds no state and does no I/O.

use crate::prefix::{fnv1a, FNV_OFFSET};
use serde_json::Value as Json;

/// The `type` tag, fields and values of every worker message the mock sends or the
/// controller stand-in applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerMsg {
    /// `RegisterMsg{instance_id, worker_id, ip, port, distributed_url}`.
    Register(Registration),
    /// `HeartbeatMsg`: the fields of `RegisterMsg` (a beat re-registers a worker the
    /// controller does not know).
    Heartbeat(Registration),
    /// `DeRegisterMsg{instance_id, worker_id, ip, port}`.
    DeRegister {
        instance_id: String,
        worker_id: u32,
        ip: String,
        port: u16,
    },
    /// `KVAdmitMsg{instance_id, worker_id, key, location}`: a chunk became held.
    Admit(ChunkMsg),
    /// `KVEvictMsg{instance_id, worker_id, key, location}`: a chunk was evicted.
    Evict(ChunkMsg),
}

/// The fields of `RegisterMsg` and `HeartbeatMsg`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub instance_id: String,
    pub worker_id: u32,
    /// Where the worker can be reached (LMCache: the host's IP).
    pub ip: String,
    /// LMCache: the worker's control port; the mock sends its HTTP port.
    pub port: u16,
    pub distributed_url: String,
}

/// The fields of `KVAdmitMsg` and `KVEvictMsg`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkMsg {
    pub instance_id: String,
    pub worker_id: u32,
    /// The chunk key, a Python int on LMCache's side: any value from `i64::MIN` to
    /// `u64::MAX` is kept as it is.
    pub key: i128,
    /// The storage backend, e.g. `"LocalCPUBackend"`.
    pub location: String,
}

impl WorkerMsg {
    /// The msgspec tag: the LMCache class name.
    pub fn type_name(&self) -> &'static str {
        match self {
            WorkerMsg::Register(_) => "RegisterMsg",
            WorkerMsg::Heartbeat(_) => "HeartbeatMsg",
            WorkerMsg::DeRegister { .. } => "DeRegisterMsg",
            WorkerMsg::Admit(_) => "KVAdmitMsg",
            WorkerMsg::Evict(_) => "KVEvictMsg",
        }
    }

    /// Encodes the message as msgspec does: a msgpack map, `type` first. Panics when a
    /// chunk key lies outside `i64::MIN..=u64::MAX` (no msgpack integer holds it).
    pub fn to_msgpack(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        let w = &mut out;
        match self {
            WorkerMsg::Register(r) | WorkerMsg::Heartbeat(r) => {
                map_len(w, 6);
                str_field(w, "type", self.type_name());
                str_field(w, "instance_id", &r.instance_id);
                int_field(w, "worker_id", r.worker_id.into());
                str_field(w, "ip", &r.ip);
                int_field(w, "port", r.port.into());
                str_field(w, "distributed_url", &r.distributed_url);
            }
            WorkerMsg::DeRegister {
                instance_id,
                worker_id,
                ip,
                port,
            } => {
                map_len(w, 5);
                str_field(w, "type", self.type_name());
                str_field(w, "instance_id", instance_id);
                int_field(w, "worker_id", (*worker_id).into());
                str_field(w, "ip", ip);
                int_field(w, "port", (*port).into());
            }
            WorkerMsg::Admit(c) | WorkerMsg::Evict(c) => {
                map_len(w, 5);
                str_field(w, "type", self.type_name());
                str_field(w, "instance_id", &c.instance_id);
                int_field(w, "worker_id", c.worker_id.into());
                int_field(w, "key", c.key);
                str_field(w, "location", &c.location);
            }
        }
        out
    }

    /// Encodes the message as JSON (`msgspec.json.encode`: `type` first). Panics as
    /// [`WorkerMsg::to_msgpack`] does.
    pub fn to_json(&self) -> String {
        let mut fields: Vec<(&str, Json)> = vec![("type", self.type_name().into())];
        match self {
            WorkerMsg::Register(r) | WorkerMsg::Heartbeat(r) => fields.extend([
                ("instance_id", r.instance_id.as_str().into()),
                ("worker_id", r.worker_id.into()),
                ("ip", r.ip.as_str().into()),
                ("port", r.port.into()),
                ("distributed_url", r.distributed_url.as_str().into()),
            ]),
            WorkerMsg::DeRegister {
                instance_id,
                worker_id,
                ip,
                port,
            } => fields.extend([
                ("instance_id", instance_id.as_str().into()),
                ("worker_id", (*worker_id).into()),
                ("ip", ip.as_str().into()),
                ("port", (*port).into()),
            ]),
            WorkerMsg::Admit(c) | WorkerMsg::Evict(c) => {
                let key = match i64::try_from(c.key) {
                    Ok(k) => Json::from(k),
                    Err(_) => Json::from(u64::try_from(c.key).expect("key beyond u64::MAX")),
                };
                fields.extend([
                    ("instance_id", c.instance_id.as_str().into()),
                    ("worker_id", c.worker_id.into()),
                    ("key", key),
                    ("location", c.location.as_str().into()),
                ])
            }
        }
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", Json::from(*k)))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// Decodes one frame as the controller does: JSON when it starts with `{`, msgpack
    /// otherwise. Other message types (control and orchestration messages) are errors.
    pub fn decode(frame: &[u8]) -> Result<WorkerMsg, String> {
        let fields = if frame.first() == Some(&b'{') {
            json_fields(frame)?
        } else {
            msgpack_fields(frame)?
        };
        WorkerMsg::from_fields(&fields)
    }

    fn from_fields(f: &Fields) -> Result<WorkerMsg, String> {
        let ty = f.str("type")?;
        let msg = match ty.as_str() {
            "RegisterMsg" | "HeartbeatMsg" => {
                let r = Registration {
                    instance_id: f.str("instance_id")?,
                    worker_id: f.num("worker_id")?,
                    ip: f.str("ip")?,
                    port: f.num("port")?,
                    distributed_url: f.str("distributed_url")?,
                };
                if ty == "RegisterMsg" {
                    WorkerMsg::Register(r)
                } else {
                    WorkerMsg::Heartbeat(r)
                }
            }
            "DeRegisterMsg" => WorkerMsg::DeRegister {
                instance_id: f.str("instance_id")?,
                worker_id: f.num("worker_id")?,
                ip: f.str("ip")?,
                port: f.num("port")?,
            },
            "KVAdmitMsg" | "KVEvictMsg" => {
                let c = ChunkMsg {
                    instance_id: f.str("instance_id")?,
                    worker_id: f.num("worker_id")?,
                    key: f.int("key")?,
                    location: f.str("location")?,
                };
                if ty == "KVAdmitMsg" {
                    WorkerMsg::Admit(c)
                } else {
                    WorkerMsg::Evict(c)
                }
            }
            other => return Err(format!("not a worker message: {other:?}")),
        };
        Ok(msg)
    }
}

fn map_len(out: &mut Vec<u8>, n: u32) {
    rmp::encode::write_map_len(out, n).expect("writing to a Vec cannot fail");
}

fn str_field(out: &mut Vec<u8>, name: &str, value: &str) {
    rmp::encode::write_str(out, name).expect("writing to a Vec cannot fail");
    rmp::encode::write_str(out, value).expect("writing to a Vec cannot fail");
}

fn int_field(out: &mut Vec<u8>, name: &str, value: i128) {
    rmp::encode::write_str(out, name).expect("writing to a Vec cannot fail");
    write_int(out, value);
}

/// The smallest msgpack encoding of an integer, as msgspec picks it.
fn write_int(out: &mut Vec<u8>, v: i128) {
    let res = if v >= 0 {
        let v = u64::try_from(v).expect("key beyond u64::MAX");
        rmp::encode::write_uint(out, v).map(|_| ())
    } else {
        let v = i64::try_from(v).expect("key below i64::MIN");
        rmp::encode::write_sint(out, v).map(|_| ())
    };
    res.expect("writing to a Vec cannot fail");
}

/// A decoded map's scalar fields; other values are kept as `Other`.
#[derive(Debug)]
enum Scalar {
    Str(String),
    Int(i128),
    Other,
}

struct Fields(Vec<(String, Scalar)>);

impl Fields {
    fn get(&self, name: &str) -> Result<&Scalar, String> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("missing field {name:?}"))
    }

    fn str(&self, name: &str) -> Result<String, String> {
        match self.get(name)? {
            Scalar::Str(s) => Ok(s.clone()),
            other => Err(format!("field {name:?} is not a string: {other:?}")),
        }
    }

    fn int(&self, name: &str) -> Result<i128, String> {
        match self.get(name)? {
            Scalar::Int(v) => Ok(*v),
            other => Err(format!("field {name:?} is not an integer: {other:?}")),
        }
    }

    fn num<T: TryFrom<i128>>(&self, name: &str) -> Result<T, String> {
        let v = self.int(name)?;
        T::try_from(v).map_err(|_| format!("field {name:?} out of range: {v}"))
    }
}

fn msgpack_fields(frame: &[u8]) -> Result<Fields, String> {
    let mut rd = frame;
    let value =
        rmpv::decode::read_value(&mut rd).map_err(|e| format!("invalid msgpack frame: {e}"))?;
    if !rd.is_empty() {
        return Err(format!("{} trailing bytes after the message", rd.len()));
    }
    let rmpv::Value::Map(entries) = value else {
        return Err("a message must be a msgpack map (msgspec tag=True)".into());
    };
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let rmpv::Value::String(k) = k else {
            return Err("a message's keys must be strings".into());
        };
        let Some(k) = k.into_str() else {
            return Err("a message key is not UTF-8".into());
        };
        let v = match v {
            rmpv::Value::String(s) => match s.into_str() {
                Some(s) => Scalar::Str(s),
                None => Scalar::Other,
            },
            rmpv::Value::Integer(i) => match (i.as_i64(), i.as_u64()) {
                (Some(v), _) => Scalar::Int(v.into()),
                (None, Some(v)) => Scalar::Int(v.into()),
                (None, None) => Scalar::Other,
            },
            _ => Scalar::Other,
        };
        out.push((k, v));
    }
    Ok(Fields(out))
}

fn json_fields(frame: &[u8]) -> Result<Fields, String> {
    let value: Json =
        serde_json::from_slice(frame).map_err(|e| format!("invalid JSON frame: {e}"))?;
    let Json::Object(map) = value else {
        return Err("a JSON message must be an object".into());
    };
    let out = map
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Json::String(s) => Scalar::Str(s),
                Json::Number(n) => match (n.as_i64(), n.as_u64()) {
                    (Some(v), _) => Scalar::Int(v.into()),
                    (None, Some(v)) => Scalar::Int(v.into()),
                    (None, None) => Scalar::Other,
                },
                _ => Scalar::Other,
            };
            (k, v)
        })
        .collect();
    Ok(Fields(out))
}

/// One chunk of a token list: its end (exclusive token index) and its chained key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub end: usize,
    pub key: i64,
}

/// The key before the first chunk (LMCache's `NONE_HASH`).
fn root_key() -> u64 {
    fnv1a(FNV_OFFSET, b"rolter-mock lmcache chunk")
}

/// The chunks of `tokens` (full ones, then the last partial one) with their chained keys.
/// Each key hashes the previous chunk's key and this chunk's token ids (as little-endian
/// i64), and is reinterpreted as i64, as Python's `hash` gives signed values.
/// `chunk_size` 0 is taken as 1.
pub fn chunk_keys<T: Copy + Into<i64>>(tokens: &[T], chunk_size: usize) -> Vec<Chunk> {
    let size = chunk_size.max(1);
    let mut prefix = root_key();
    let mut end = 0;
    tokens
        .chunks(size)
        .map(|chunk| {
            let mut h = fnv1a(FNV_OFFSET, &prefix.to_le_bytes());
            for &t in chunk {
                h = fnv1a(h, &t.into().to_le_bytes());
            }
            prefix = h;
            end += chunk.len();
            Chunk { end, key: h as i64 }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn admit(instance_id: &str, worker_id: u32, key: i128) -> WorkerMsg {
        WorkerMsg::Admit(ChunkMsg {
            instance_id: instance_id.into(),
            worker_id,
            key,
            location: "LocalCPUBackend".into(),
        })
    }

    fn registration() -> Registration {
        Registration {
            instance_id: "e".into(),
            worker_id: 0,
            ip: "127.0.0.1".into(),
            port: 8000,
            distributed_url: "127.0.0.1:8000".into(),
        }
    }

    /// Bytes written by `msgspec.msgpack.encode` (msgspec 0.23.0) for LMCache's classes.
    const MSGSPEC: [(&str, &str); 6] = [
        (
            "admit engine-a 0 -8646911284551352321",
            "85a474797065aa4b5641646d69744d7367ab696e7374616e63655f6964a8656e67696e652d61a9776f726b65725f696400a36b6579d387ffffffffffffffa86c6f636174696f6eaf4c6f63616c4350554261636b656e64",
        ),
        (
            "admit a 3 1234567890123",
            "85a474797065aa4b5641646d69744d7367ab696e7374616e63655f6964a161a9776f726b65725f696403a36b6579cf0000011f71fb04cba86c6f636174696f6eaf4c6f63616c4350554261636b656e64",
        ),
        (
            "register",
            "86a474797065ab52656769737465724d7367ab696e7374616e63655f6964a165a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1f40af64697374726962757465645f75726cae3132372e302e302e313a38303030",
        ),
        (
            "heartbeat",
            "86a474797065ac4865617274626561744d7367ab696e7374616e63655f6964a165a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1f40af64697374726962757465645f75726cae3132372e302e302e313a38303030",
        ),
        (
            "deregister",
            "85a474797065ad446552656769737465724d7367ab696e7374616e63655f6964a165a9776f726b65725f696400a26970a93132372e302e302e31a4706f7274cd1f40",
        ),
        (
            "evict e 1 -5",
            "85a474797065aa4b5645766963744d7367ab696e7374616e63655f6964a165a9776f726b65725f696401a36b6579fba86c6f636174696f6eaf4c6f63616c4350554261636b656e64",
        ),
    ];

    fn fixture_msg(name: &str) -> WorkerMsg {
        match name {
            "admit engine-a 0 -8646911284551352321" => admit("engine-a", 0, -8646911284551352321),
            "admit a 3 1234567890123" => admit("a", 3, 1234567890123),
            "register" => WorkerMsg::Register(registration()),
            "heartbeat" => WorkerMsg::Heartbeat(registration()),
            "deregister" => WorkerMsg::DeRegister {
                instance_id: "e".into(),
                worker_id: 0,
                ip: "127.0.0.1".into(),
                port: 8000,
            },
            "evict e 1 -5" => WorkerMsg::Evict(ChunkMsg {
                instance_id: "e".into(),
                worker_id: 1,
                key: -5,
                location: "LocalCPUBackend".into(),
            }),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn encodes_as_msgspec_and_decodes_back() {
        for (name, bytes) in MSGSPEC {
            let msg = fixture_msg(name);
            assert_eq!(msg.to_msgpack(), hex(bytes), "{name}");
            assert_eq!(WorkerMsg::decode(&hex(bytes)).unwrap(), msg, "{name}");
            assert_eq!(WorkerMsg::decode(msg.to_json().as_bytes()).unwrap(), msg);
        }
    }

    #[test]
    fn json_matches_msgspec_and_keys_keep_their_range() {
        let evict = fixture_msg("evict e 1 -5");
        assert_eq!(
            evict.to_json(),
            r#"{"type":"KVEvictMsg","instance_id":"e","worker_id":1,"key":-5,"location":"LocalCPUBackend"}"#
        );
        for key in [0, 127, 128, -32, -33, i64::MIN as i128, u64::MAX as i128] {
            let m = admit("x", 0, key);
            assert_eq!(WorkerMsg::decode(&m.to_msgpack()).unwrap(), m, "{key}");
            assert_eq!(
                WorkerMsg::decode(m.to_json().as_bytes()).unwrap(),
                m,
                "{key}"
            );
        }
    }

    #[test]
    fn decoding_tolerates_order_and_extra_fields_and_rejects_the_rest() {
        let json = br#"{"location":"cpu","key":7,"seq_num":3,"worker_id":0,"instance_id":"i","type":"KVAdmitMsg"}"#;
        assert_eq!(
            WorkerMsg::decode(json).unwrap(),
            WorkerMsg::Admit(ChunkMsg {
                instance_id: "i".into(),
                worker_id: 0,
                key: 7,
                location: "cpu".into(),
            })
        );
        // msgpack with an extra nested field.
        let mut b = Vec::new();
        rmp::encode::write_map_len(&mut b, 6).unwrap();
        for (k, v) in [("type", "KVEvictMsg"), ("instance_id", "i")] {
            rmp::encode::write_str(&mut b, k).unwrap();
            rmp::encode::write_str(&mut b, v).unwrap();
        }
        rmp::encode::write_str(&mut b, "extra").unwrap();
        rmp::encode::write_array_len(&mut b, 1).unwrap();
        rmp::encode::write_nil(&mut b).unwrap();
        rmp::encode::write_str(&mut b, "worker_id").unwrap();
        rmp::encode::write_uint(&mut b, 2).unwrap();
        rmp::encode::write_str(&mut b, "key").unwrap();
        rmp::encode::write_sint(&mut b, -1).unwrap();
        rmp::encode::write_str(&mut b, "location").unwrap();
        rmp::encode::write_str(&mut b, "cpu").unwrap();
        assert!(matches!(
            WorkerMsg::decode(&b).unwrap(),
            WorkerMsg::Evict(ChunkMsg {
                key: -1,
                worker_id: 2,
                ..
            })
        ));

        // An array_like encoding, a missing field, a wrong type, an orchestration message.
        assert!(WorkerMsg::decode(&hex("92aa4b5641646d69744d736701")).is_err());
        assert!(WorkerMsg::decode(br#"{"type":"KVAdmitMsg","instance_id":"i"}"#).is_err());
        assert!(WorkerMsg::decode(
            br#"{"type":"KVAdmitMsg","instance_id":"i","worker_id":0,"key":"7","location":"cpu"}"#
        )
        .is_err());
        assert!(WorkerMsg::decode(br#"{"type":"LookupMsg","event_id":"e","tokens":[]}"#).is_err());
        assert!(WorkerMsg::decode(b"{not json").is_err());
        assert!(WorkerMsg::decode(b"").is_err());
    }

    #[test]
    fn chunk_keys_chain_and_include_the_partial_chunk() {
        let tokens: Vec<u32> = (0..600).collect();
        let c = chunk_keys(&tokens, 256);
        assert_eq!(c.iter().map(|c| c.end).collect::<Vec<_>>(), [256, 512, 600]);
        // Same prefix, same keys; a change in chunk 1 changes keys 1.. only.
        let mut other = tokens.clone();
        other[300] = 99_999;
        let d = chunk_keys(&other, 256);
        assert_eq!(d[0], c[0]);
        assert_ne!(d[1].key, c[1].key);
        assert_ne!(d[2].key, c[2].key);
        // A later chunk's key depends on the chunks before it.
        let shifted = chunk_keys(&tokens[256..], 256);
        assert_ne!(shifted[0].key, c[1].key);
        // u32 and i64 token ids hash alike; a prefix of a partial chunk is another key.
        let wide: Vec<i64> = tokens.iter().map(|&t| t.into()).collect();
        assert_eq!(chunk_keys(&wide, 256), c);
        assert_ne!(chunk_keys(&tokens[..599], 256)[2].key, c[2].key);
        assert!(chunk_keys::<u32>(&[], 256).is_empty());
        assert_eq!(chunk_keys(&tokens[..3], 0).len(), 3);
    }
}
