//! The W3C Trace Context `traceparent` header: parsing a client's value and writing the
//! value the gateway sends upstream (<https://www.w3.org/TR/trace-context/>).
//!
//! Owns the header's byte format only: version 00 is parsed strictly (55 characters,
//! lowercase hex, non-zero ids), a higher version by its first four fields as the
//! specification asks, version `ff` never. It must not decide sampling or hold ids: the
//! gateway's trace plane does.

use super::trim_ows;

/// The length of a version-00 value: `00-` + 32 + `-` + 16 + `-` + 2.
pub const LEN: usize = 55;

/// What a valid `traceparent` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace's id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's span, the parent of the gateway's span (never all zero).
    pub parent_id: [u8; 8],
    /// The `sampled` flag (bit 0 of the trace flags).
    pub sampled: bool,
}

/// Parses a `traceparent` value (optional whitespace around it is ignored); `None` when it
/// is not valid, in which case the caller starts a new trace.
pub fn parse(value: &[u8]) -> Option<TraceParent> {
    let v = trim_ows(value);
    if v.len() < LEN {
        return None;
    }
    let version = hex_byte(v[0], v[1])?;
    if version == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    // Version 00 has exactly four fields; a later version may append fields after a dash.
    if (version == 0 && v.len() != LEN) || (v.len() > LEN && v[LEN] != b'-') {
        return None;
    }
    let mut trace_id = [0u8; 16];
    decode_hex(&v[3..35], &mut trace_id)?;
    let mut parent_id = [0u8; 8];
    decode_hex(&v[36..52], &mut parent_id)?;
    let flags = hex_byte(v[53], v[54])?;
    if trace_id == [0; 16] || parent_id == [0; 8] {
        return None;
    }
    Some(TraceParent {
        trace_id,
        parent_id,
        sampled: flags & 1 == 1,
    })
}

/// Appends the version-00 value for `span_id` in `trace_id` to `out` (what the gateway
/// sends upstream: its own span becomes the engine's parent).
pub fn write(out: &mut Vec<u8>, trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) {
    out.reserve(LEN);
    out.extend_from_slice(b"00-");
    write_hex(out, trace_id);
    out.push(b'-');
    write_hex(out, span_id);
    out.extend_from_slice(if sampled { b"-01" } else { b"-00" });
}

/// Appends `bytes` as lowercase hex.
pub fn write_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0x0f)]);
    }
}

/// Decodes lowercase hex into `out` (`hex` is twice as long as `out`).
fn decode_hex(hex: &[u8], out: &mut [u8]) -> Option<()> {
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = hex_byte(pair[0], pair[1])?;
    }
    Some(())
}

/// Two lowercase hex digits as a byte.
fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    Some(hex_digit(hi)? << 4 | hex_digit(lo)?)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's example value.
    const EXAMPLE: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    const TRACE: [u8; 16] = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    const PARENT: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

    #[test]
    fn the_specifications_examples_parse() {
        assert_eq!(
            parse(EXAMPLE),
            Some(TraceParent {
                trace_id: TRACE,
                parent_id: PARENT,
                sampled: true
            })
        );
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(parse(unsampled).map(|t| t.sampled), Some(false));
        // Flags other than `sampled` (e.g. the level-2 `random` bit) are ignored.
        let random = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03";
        assert_eq!(parse(random).map(|t| t.sampled), Some(true));
        let random_only = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02";
        assert_eq!(parse(random_only).map(|t| t.sampled), Some(false));
        // Whitespace around the value is not part of it.
        let padded = b" \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ";
        assert_eq!(parse(padded), parse(EXAMPLE));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let v = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse(v).map(|t| (t.trace_id, t.parent_id)),
            Some((TRACE, PARENT))
        );
        let more =
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-brings";
        assert_eq!(parse(more).map(|t| t.sampled), Some(true));
        // What follows the flags must start with a dash.
        let glued = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(parse(glued), None);
    }

    #[test]
    fn invalid_values_are_refused() {
        let cases: &[&[u8]] = &[
            b"",
            // Version ff is never valid.
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Version 00 has no fields past the flags.
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-010",
            // Uppercase hex.
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            b"0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
            // All-zero ids.
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Too short, too long a field, wrong separators, non-hex.
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e47366-0f067aa0ba902b7-01",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
            b"0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            // A later version shorter than 55 characters.
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ];
        for c in cases {
            assert_eq!(parse(c), None, "{}", String::from_utf8_lossy(c));
        }
    }

    #[test]
    fn write_gives_the_version_00_value_and_parses_back() {
        let mut out = b"traceparent: ".to_vec();
        write(&mut out, &TRACE, &PARENT, true);
        assert_eq!(&out[13..], EXAMPLE);
        let mut unsampled = Vec::new();
        write(&mut unsampled, &TRACE, &PARENT, false);
        assert_eq!(
            unsampled,
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".to_vec()
        );
        assert_eq!(
            parse(&unsampled),
            Some(TraceParent {
                trace_id: TRACE,
                parent_id: PARENT,
                sampled: false
            })
        );
    }
}
