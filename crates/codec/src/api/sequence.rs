//! The Responses API numbers its stream's events (`"sequence_number": N`); an error event
//! the gateway adds to a cut stream follows the last number the client saw.
//!
//! Owns the scan for that number in relayed bytes. It must not parse whole events.

use memchr::memmem;

const KEY: &[u8] = b"\"sequence_number\":";

/// The last `"sequence_number": N` in `payload`, if any (a number split across two reads
/// is missed; the next event carries a higher one).
pub fn last_sequence_number(payload: &[u8]) -> Option<u64> {
    let at = memmem::rfind(payload, KEY)? + KEY.len();
    let rest = &payload[at..];
    let digits = rest.iter().skip_while(|b| **b == b' ');
    let mut n: u64 = 0;
    let mut any = false;
    for &b in digits {
        if !b.is_ascii_digit() {
            break;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(n)
}

#[cfg(test)]
mod tests {
    use super::last_sequence_number as last;

    #[test]
    fn finds_the_last_number() {
        assert_eq!(last(b""), None);
        assert_eq!(
            last(br#"data: {"type":"response.created","sequence_number":0}"#),
            Some(0)
        );
        let two = b"data: {\"sequence_number\": 7}\n\ndata: {\"sequence_number\":12,\"x\":1}\n\n";
        assert_eq!(last(two), Some(12));
        assert_eq!(last(b"data: {\"sequence_number\":"), None);
        assert_eq!(last(b"{\"sequence_number\":99999999999999999999999}"), None);
    }
}
