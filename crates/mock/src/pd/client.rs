//! The one outgoing call a leg makes to its peer engine (a vLLM decode's pull, an SGLang
//! decode's handshake): an HTTP/1.1 POST on a fresh monoio connection, `Connection:
//! close`, read to the end, within a time limit.
//!
//! Owns that exchange only; it must not block the runtime's thread (the connection module
//! awaits it while it watches its own client).

use std::io;
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

/// The most of a peer's answer that is read.
const MAX_ANSWER: usize = 64 * 1024;

/// POSTs a JSON `body` to `http://host:port{path}` and returns the answer's status.
pub(crate) async fn post_json(
    host: &str,
    port: u16,
    path: &str,
    body: Vec<u8>,
    limit: Duration,
) -> io::Result<u16> {
    let exchange = async {
        let mut stream = TcpStream::connect((host, port)).await?;
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let (res, _) = stream.write_all(req).await;
        res?;
        let mut answer = Vec::new();
        let mut buf = vec![0u8; 4096];
        while answer.len() < MAX_ANSWER {
            let (res, b) = stream.read(buf).await;
            buf = b;
            match res? {
                0 => break,
                n => answer.extend_from_slice(&buf[..n]),
            }
            if head_complete(&answer) {
                break;
            }
        }
        status(&answer)
    };
    match monoio::time::timeout(limit, exchange).await {
        Ok(res) => res,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")),
    }
}

/// Whether the status line and headers have arrived (the status is all that is read).
fn head_complete(answer: &[u8]) -> bool {
    answer.windows(4).any(|w| w == b"\r\n\r\n")
}

/// The status of an `HTTP/1.x NNN ...` answer.
fn status(answer: &[u8]) -> io::Result<u16> {
    let line = answer.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = std::str::from_utf8(line).unwrap_or_default();
    line.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_line() {
        assert_eq!(status(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap(), 404);
        assert_eq!(status(b"HTTP/1.0 200 OK\r\n").unwrap(), 200);
        assert!(status(b"garbage").is_err());
        assert!(head_complete(b"HTTP/1.1 200 OK\r\na: b\r\n\r\n"));
        assert!(!head_complete(b"HTTP/1.1 200 OK\r\n"));
    }
}
