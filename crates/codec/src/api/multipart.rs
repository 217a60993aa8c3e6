//! The routing facts of a `multipart/form-data` body (RFC 7578), as the audio endpoints
//! send them: the boundary from `Content-Type`, and the `model` form field found by scanning
//! the delimiters and each part's headers of the already-read body.
//!
//! Owns that scan. It must not copy or rewrite the body (it is forwarded byte for byte) and
//! must not read past the body it is given.

use std::borrow::Cow;
use std::ops::Range;

use memchr::memmem;

use super::facts::RequestFacts;
use crate::error::GatewayError;

/// Longest boundary RFC 2046 §5.1.1 allows.
const MAX_BOUNDARY: usize = 70;

/// The boundary of a `multipart/form-data` content type, or `None` for any other type.
/// A form-data type without a usable boundary is a 400.
pub fn boundary(content_type: &[u8]) -> Result<Option<&[u8]>, GatewayError> {
    let mut params = content_type.split(|&b| b == b';');
    let essence = trim(params.next().unwrap_or_default());
    if !essence.eq_ignore_ascii_case(b"multipart/form-data") {
        return Ok(None);
    }
    for p in params {
        let p = trim(p);
        let Some(eq) = p.iter().position(|&b| b == b'=') else {
            continue;
        };
        if !trim(&p[..eq]).eq_ignore_ascii_case(b"boundary") {
            continue;
        }
        let mut v = trim(&p[eq + 1..]);
        if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
            v = &v[1..v.len() - 1];
        }
        if v.is_empty() || v.len() > MAX_BOUNDARY || v.iter().any(|&b| b == b'\r' || b == b'\n') {
            break;
        }
        return Ok(Some(v));
    }
    Err(invalid(
        "a multipart/form-data Content-Type needs a boundary parameter of 1 to 70 characters",
    ))
}

/// The routing facts of a form-data body: its `model` field (no prompt, no stream).
pub fn extract<'a>(body: &'a [u8], boundary: &[u8]) -> Result<RequestFacts<'a>, GatewayError> {
    let mut facts = RequestFacts::default();
    if let Some(span) = model_field(body, boundary)? {
        let value = std::str::from_utf8(&body[span.clone()])
            .map_err(|_| invalid("the `model` form field is not UTF-8").with_param("model"))?;
        facts.model = Cow::Borrowed(value);
        facts.model_span = Some(span);
        facts.model_is_json = false;
    }
    Ok(facts)
}

/// The byte range of the `model` field's value in `body`, `None` when the form has none;
/// a form that is malformed anywhere, or has two `model` fields, is a 400.
pub fn model_field(body: &[u8], boundary: &[u8]) -> Result<Option<Range<usize>>, GatewayError> {
    // CRLF, "--" and the boundary, on the stack (`boundary` checks its length).
    let mut buf = [0u8; MAX_BOUNDARY + 4];
    let len = boundary.len().min(MAX_BOUNDARY) + 4;
    buf[..4].copy_from_slice(b"\r\n--");
    buf[4..len].copy_from_slice(&boundary[..len - 4]);
    let delim = &buf[..len];
    let finder = memmem::Finder::new(delim);
    // The next delimiter at or after `from`: CRLF, `--boundary`, then `--` (the close) or
    // optional padding and CRLF. Anything else is content that merely starts alike.
    let next_delim = |from: usize| -> Option<usize> {
        let mut from = from;
        loop {
            let i = from + finder.find(&body[from..])?;
            if ends_delimiter(&body[i + delim.len()..]) {
                return Some(i);
            }
            from = i + 1;
        }
    };
    // The first delimiter may open the body (no CRLF before it) or follow a preamble.
    let mut at = if body.starts_with(&delim[2..]) {
        delim.len() - 2
    } else {
        match next_delim(0) {
            Some(i) => i + delim.len(),
            None => return Err(invalid("the body has no multipart boundary delimiter")),
        }
    };
    let head_end = memmem::Finder::new(b"\r\n\r\n");
    // The whole form is checked (it is in memory already): a form cut short, or with two
    // `model` fields, is a 400 rather than a guess.
    let mut model = None;
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return Ok(model);
        }
        // Transport padding, then the line break that ends the delimiter line.
        let pad = padding(rest);
        if !rest[pad..].starts_with(b"\r\n") {
            return Err(invalid("a multipart delimiter line does not end in CRLF"));
        }
        let headers_start = at + pad + 2;
        // A part with no headers has its blank line right away.
        let (headers, content_start) = if body[headers_start..].starts_with(b"\r\n") {
            (&body[headers_start..headers_start], headers_start + 2)
        } else {
            let Some(end) = head_end.find(&body[headers_start..]) else {
                return Err(invalid("a multipart part's headers do not end"));
            };
            (
                &body[headers_start..headers_start + end],
                headers_start + end + 4,
            )
        };
        // A part runs to the next delimiter; the last one must be closed.
        let Some(content_end) = next_delim(content_start) else {
            return Err(invalid(
                "the multipart body is not closed by its final boundary",
            ));
        };
        if part_name(headers) == Some(b"model".as_slice()) {
            if model.is_some() {
                // As with a JSON body's duplicate key: which one the engine reads is unknown.
                return Err(invalid("the form has more than one `model` field").with_param("model"));
            }
            model = Some(content_start..content_end);
        }
        at = content_end + delim.len();
    }
}

/// Count of transport-padding bytes (spaces and tabs) opening `s`.
fn padding(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| b == b' ' || b == b'\t').count()
}

/// Do the bytes after `--boundary` finish a delimiter line (`--`, or padding and CRLF)?
fn ends_delimiter(after: &[u8]) -> bool {
    after.starts_with(b"--") || after[padding(after)..].starts_with(b"\r\n")
}

/// The `name` parameter of a part's `Content-Disposition: form-data` header.
fn part_name(headers: &[u8]) -> Option<&[u8]> {
    for line in headers.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !trim(&line[..colon]).eq_ignore_ascii_case(b"content-disposition") {
            continue;
        }
        return disposition_name(&line[colon + 1..]);
    }
    None
}

/// `form-data; name="model"; filename="a.wav"` → `model` (quoted or token values; a quoted
/// value may hold `;`).
fn disposition_name(v: &[u8]) -> Option<&[u8]> {
    let mut i = v.iter().position(|&b| b == b';')? + 1;
    while i < v.len() {
        while i < v.len() && (v[i] == b' ' || v[i] == b'\t') {
            i += 1;
        }
        let eq = i + v[i..].iter().position(|&b| b == b'=')?;
        let key = trim(&v[i..eq]);
        let mut j = eq + 1;
        while j < v.len() && (v[j] == b' ' || v[j] == b'\t') {
            j += 1;
        }
        let value;
        if v.get(j) == Some(&b'"') {
            let start = j + 1;
            let mut k = start;
            while k < v.len() && v[k] != b'"' {
                k += if v[k] == b'\\' { 2 } else { 1 };
            }
            value = &v[start..k.min(v.len())];
            j = (k + 1).min(v.len());
            j += v[j..]
                .iter()
                .position(|&b| b == b';')
                .unwrap_or(v.len() - j);
        } else {
            let end = j + v[j..]
                .iter()
                .position(|&b| b == b';')
                .unwrap_or(v.len() - j);
            value = trim(&v[j..end]);
            j = end;
        }
        if key.eq_ignore_ascii_case(b"name") {
            return Some(value);
        }
        i = j + 1;
    }
    None
}

fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

fn invalid(msg: &str) -> GatewayError {
    GatewayError::client(400, "invalid_multipart", msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (headers, content) in parts {
            b.extend_from_slice(format!("--{boundary}\r\n{headers}\r\n\r\n").as_bytes());
            b.extend_from_slice(content);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        b
    }

    #[test]
    fn boundary_from_content_type() {
        assert_eq!(
            boundary(b"multipart/form-data; boundary=abc").unwrap(),
            Some(&b"abc"[..])
        );
        assert_eq!(
            boundary(b"Multipart/Form-Data;charset=utf-8; Boundary=\"a b\"").unwrap(),
            Some(&b"a b"[..])
        );
        assert_eq!(boundary(b"application/json").unwrap(), None);
        assert_eq!(boundary(b"multipart/form-data").unwrap_err().status, 400);
        assert_eq!(
            boundary(b"multipart/form-data; boundary=")
                .unwrap_err()
                .status,
            400
        );
        let long = format!("multipart/form-data; boundary={}", "x".repeat(71));
        assert_eq!(boundary(long.as_bytes()).unwrap_err().status, 400);
    }

    #[test]
    fn finds_the_model_after_a_binary_file_part() {
        // The file holds bytes that look like part headers and a near-miss delimiter.
        let audio: &[u8] = b"RIFF\x00\xff\r\n--bound\x01\r\nname=\"model\"\r\n\r\n\x00";
        let body = form(
            "bound",
            &[
                (
                    "Content-Disposition: form-data; name=\"file\"; filename=\"model\"\r\nContent-Type: audio/wav",
                    audio,
                ),
                ("Content-Disposition: form-data; name=\"language\"", b"en"),
                ("content-disposition: form-data; name=model", b"whisper-1"),
            ],
        );
        let span = model_field(&body, b"bound").unwrap().unwrap();
        assert_eq!(&body[span], b"whisper-1");
        let f = extract(&body, b"bound").unwrap();
        assert_eq!(f.model, "whisper-1");
        assert!(!f.model_is_json);
    }

    #[test]
    fn preamble_padding_and_quoted_semicolons() {
        let mut body = b"preamble\r\n".to_vec();
        body.extend_from_slice(b"--b \t\r\nContent-Disposition: form-data; filename=\"x;name=model\"; name=\"f\"\r\n\r\ndata\r\n");
        body.extend_from_slice(
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--",
        );
        let span = model_field(&body, b"b").unwrap().unwrap();
        assert_eq!(&body[span], b"m");
    }

    #[test]
    fn a_form_without_a_model_has_none() {
        let body = form(
            "b",
            &[("Content-Disposition: form-data; name=\"file\"", b"x")],
        );
        assert_eq!(model_field(&body, b"b").unwrap(), None);
        assert_eq!(extract(&body, b"b").unwrap().model, "");
        assert_eq!(model_field(b"--b--\r\n", b"b").unwrap(), None);
    }

    #[test]
    fn malformed_forms_are_400() {
        for bad in [
            &b""[..],
            b"no delimiter here",
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm",
            b"--b\r\nContent-Disposition: form-data; name=\"model\"",
            b"--bX\r\n\r\nm\r\n--b--",
            b"--b junk\r\n\r\nm\r\n--b--",
        ] {
            let e = model_field(bad, b"b").unwrap_err();
            assert_eq!(e.status, 400, "{:?}", String::from_utf8_lossy(bad));
            assert_eq!(e.code, "invalid_multipart");
        }
        let body = form(
            "b",
            &[("Content-Disposition: form-data; name=\"model\"", b"\xff")],
        );
        assert_eq!(extract(&body, b"b").unwrap_err().status, 400);
        // Found early but cut short later, or named twice.
        let model = ("Content-Disposition: form-data; name=\"model\"", &b"m"[..]);
        let body = form(
            "b",
            &[model, ("Content-Disposition: form-data; name=\"f\"", b"x")],
        );
        let cut = &body[..body.len() - 7];
        assert_eq!(
            model_field(cut, b"b").unwrap_err().code,
            "invalid_multipart"
        );
        let twice = form("b", &[model, model]);
        assert_eq!(model_field(&twice, b"b").unwrap_err().status, 400);
    }
}
