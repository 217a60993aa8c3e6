//! The canonical prompt bytes that prefix matching and session keys compare: the prompt's
//! JSON (`messages`, `prompt` or `input`) with every insignificant whitespace byte removed,
//! so two clients that format the same conversation differently produce the same bytes,
//! and a conversation's earlier turns stay a byte prefix of its later ones.
//!
//! A single pass over bytes the body parser already validated: strings (with their escapes)
//! are copied verbatim, whitespace outside them is dropped. It writes into a caller's reused
//! buffer and must not allocate beyond growing it.

/// Appends the whitespace-free form of the JSON `raw` to `out` (cleared first).
pub fn minify(raw: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(raw.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, &b) in raw.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b' ' | b'\t' | b'\n' | b'\r' => {
                out.extend_from_slice(&raw[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.extend_from_slice(&raw[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        let mut out = Vec::new();
        minify(s.as_bytes(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn whitespace_outside_strings_goes_inside_stays() {
        assert_eq!(
            canon("[ {\"role\" : \"user\",\n\t\"content\": \"a  b\\\" c \" } ]"),
            "[{\"role\":\"user\",\"content\":\"a  b\\\" c \"}]"
        );
        assert_eq!(canon("\"x\\\\\" , 1"), "\"x\\\\\",1");
    }

    #[test]
    fn earlier_turns_stay_a_prefix_of_later_ones() {
        let turn1 = canon(r#"[{"role":"system","content":"S"}, {"role":"user","content":"q1"}]"#);
        let turn2 = canon(
            r#"[ {"role": "system", "content": "S"},
                 {"role": "user", "content": "q1"},
                 {"role": "assistant", "content": "a1"},
                 {"role": "user", "content": "q2"} ]"#,
        );
        let shared = turn1.trim_end_matches(']');
        assert!(turn2.starts_with(shared), "{turn2} / {shared}");
    }
}
