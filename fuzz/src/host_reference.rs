//! A reference Host validator written from the grammar of RFC 9112 §3.2 and RFC 3986
//! §3.2.2–3.2.3, kept deliberately plain (no shared code with the gateway's `valid_host`),
//! so the `host` target can check that the two agree on every input.
//!
//! ```text
//! Host        = uri-host [ ":" port ]                       ; RFC 9112 §3.2
//! uri-host    = IP-literal / IPv4address / reg-name         ; RFC 3986 §3.2.2
//! IP-literal  = "[" ( IPv6address / IPvFuture ) "]"
//! reg-name    = *( unreserved / pct-encoded / sub-delims )  ; IPv4address is a reg-name too
//! port        = *DIGIT
//! ```
//!
//! Where the gateway is stricter than the grammar, on purpose, the reference says so: a
//! comma is refused (a list of hosts), a port has at most 5 digits, and an IPvFuture literal
//! (`[v1.x]`) is refused. Optional whitespace around the field value (RFC 9110 §5.5) is not
//! part of it.

/// Whether `v` is a Host field value the gateway must accept.
pub fn valid(v: &[u8]) -> bool {
    let v = trim_ows(v);
    let (host_ok, port) = match v.first() {
        Some(b'[') => match v.iter().position(|&b| b == b']') {
            Some(close) => (ip_literal(&v[1..close]), &v[close + 1..]),
            None => return false,
        },
        _ => match v.iter().position(|&b| b == b':') {
            Some(colon) => (reg_name(&v[..colon]), &v[colon..]),
            None => (reg_name(v), &v[v.len()..]),
        },
    };
    host_ok && port_part(port)
}

/// Nothing, or `:` and at most 5 digits.
fn port_part(p: &[u8]) -> bool {
    match p.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// `unreserved = ALPHA / DIGIT / "-" / "." / "_" / "~"`
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// `sub-delims = "!" / "$" / "&" / "'" / "(" / ")" / "*" / "+" / "," / ";" / "="`, less
/// the comma: RFC 9110 §5.3 lets a recipient read a comma-joined value as a list, and a
/// Host list is more than one host (RFC 9112 §3.2 wants exactly one).
fn sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b';' | b'='
    )
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`, `pct-encoded = "%" HEXDIG HEXDIG`.
fn reg_name(s: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            match s.get(i + 1..i + 3) {
                Some([a, b]) if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => i += 3,
                _ => return false,
            }
        } else if unreserved(s[i]) || sub_delim(s[i]) {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

/// The inside of `[...]`: an IPv6address (IPvFuture is refused, see the module doc).
fn ip_literal(s: &[u8]) -> bool {
    ipv6(s)
}

/// RFC 3986's IPv6address: eight 16-bit pieces, or fewer with one `::` standing for at least
/// one zero piece; the last two pieces may be written as an IPv4address (`ls32`).
fn ipv6(s: &[u8]) -> bool {
    let double = s.windows(2).position(|w| w == b"::");
    let (head, tail) = match double {
        Some(i) => (&s[..i], Some(&s[i + 2..])),
        None => (s, None),
    };
    match tail {
        None => pieces(head, true) == Some(8),
        Some(tail) => {
            if tail.windows(2).any(|w| w == b"::") {
                return false;
            }
            match (pieces(head, false), pieces(tail, true)) {
                (Some(h), Some(t)) => h + t <= 7,
                _ => false,
            }
        }
    }
}

/// The number of 16-bit pieces of `h16 *( ":" h16 )` (empty: none), the last of which may be
/// an IPv4address (two pieces) when `v4_last`.
fn pieces(s: &[u8], v4_last: bool) -> Option<usize> {
    if s.is_empty() {
        return Some(0);
    }
    let parts: Vec<&[u8]> = s.split(|&b| b == b':').collect();
    let mut n = 0;
    for (i, part) in parts.iter().enumerate() {
        if v4_last && i + 1 == parts.len() && part.contains(&b'.') {
            if !ipv4(part) {
                return None;
            }
            n += 2;
        } else if (1..=4).contains(&part.len()) && part.iter().all(u8::is_ascii_hexdigit) {
            n += 1;
        } else {
            return None;
        }
    }
    Some(n)
}

/// `IPv4address = dec-octet "." dec-octet "." dec-octet "." dec-octet`, where a dec-octet is
/// 0 to 255 without leading zeros.
fn ipv4(s: &[u8]) -> bool {
    let octets: Vec<&[u8]> = s.split(|&b| b == b'.').collect();
    octets.len() == 4
        && octets.iter().all(|o| {
            (1..=3).contains(&o.len())
                && o.iter().all(u8::is_ascii_digit)
                && (o.len() == 1 || o[0] != b'0')
                && o.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) <= 255
        })
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn the_reference_follows_the_grammar() {
        for ok in [
            "a",
            "",
            ":80",
            "a:",
            "api.example.com:8443",
            "10.0.0.1",
            "999.1.1.1",
            "a%2Db",
            "a_b~c!$&'()*+;=",
            "[::]",
            "[::1]",
            "[::1]:",
            "[2001:db8::1]:8080",
            "[1:2:3:4:5:6:7:8]",
            "[1:2:3:4:5:6:7::]",
            "[::2:3:4:5:6:7:8]",
            "[::ffff:10.0.0.1]",
            "[1:2:3:4:5:6:1.2.3.4]",
            "[1::1.2.3.4]",
            " \ta\t ",
        ] {
            assert!(valid(ok.as_bytes()), "{ok:?}");
        }
        for bad in [
            "a,b",
            "a b",
            "user@host",
            "host:80:81",
            "host:123456",
            "a%2",
            "a%g0",
            "[]",
            "[1]",
            "[:]",
            "[:::]",
            "[1::2::3]",
            "[1:2:3:4:5:6:7:8:9]",
            "[1:2:3:4:5:6:7::8]",
            "[12345::]",
            "[::1.2.3]",
            "[::01.2.3.4]",
            "[::256.2.3.4]",
            "[1.2.3.4::]",
            "[1:2:3:4:5:6:7:1.2.3.4]",
            "[1:2:3:4:5:6::1.2.3.4]",
            "[v1.x]",
            "[::1]x",
            "[::1",
            "a]",
        ] {
            assert!(!valid(bad.as_bytes()), "{bad:?}");
        }
    }
}
