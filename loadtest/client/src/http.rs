//! A minimal blocking HTTP/1.1 client: writes a request, reads the response with a
//! timestamp per `read()` and hands body bytes (de-chunked) to a callback as they arrive.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The chat body used by every request of the client: about 1 KiB, like the wrk/oha body.
pub fn chat_body(stream: bool, max_tokens: u32) -> String {
    let system = "You are a helpful assistant. ".repeat(28);
    format!(
        concat!(
            r#"{{"model":"m","stream":{},"max_tokens":{},"messages":["#,
            r#"{{"role":"system","content":"{}"}},"#,
            r#"{{"role":"user","content":"Summarise the plot of a long novel in two sentences."}}]}}"#
        ),
        stream, max_tokens, system
    )
}

/// The Anthropic Messages twin of [`chat_body`]: the same system prompt and question.
pub fn messages_body(stream: bool, max_tokens: u32) -> String {
    let system = "You are a helpful assistant. ".repeat(28);
    format!(
        concat!(
            r#"{{"model":"m","stream":{},"max_tokens":{},"system":"{}","messages":["#,
            r#"{{"role":"user","content":"Summarise the plot of a long novel in two sentences."}}]}}"#
        ),
        stream, max_tokens, system
    )
}

/// A full request, `extra` being additional header lines (each ending in CRLF).
pub fn request(host: &SocketAddr, body: &str, extra: &str) -> Vec<u8> {
    request_to(host, "/v1/chat/completions", body, extra)
}

/// A full request to `path`.
pub fn request_to(host: &SocketAddr, path: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: */*\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn connect(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(addr, timeout)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Close with RST (SO_LINGER 0) so that tens of thousands of closes leave no TIME_WAIT.
pub fn close_rst(s: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid fd, valid pointer and length.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls with a valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
    }
    r.rlim_cur
}

#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    pub first_byte: Option<Instant>,
    pub keep_alive: bool,
    pub body_bytes: usize,
}

enum BodyMode {
    Length(usize),
    Chunked,
    Close,
}

enum Chunk {
    Size,
    Data(usize),
    DataEnd,
    Trailers,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Reads one response from `s`. `buf` holds bytes carried over between responses on a
/// keep-alive connection. `on_body(bytes, t)` gets de-chunked body bytes and the time of
/// the read that delivered them.
pub fn read_response(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    on_body: &mut dyn FnMut(&[u8], Instant),
) -> io::Result<Response> {
    let mut resp = Response::default();
    let mut tmp = vec![0u8; 64 * 1024];
    let mut now = Instant::now();
    // Head.
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp)?;
        now = Instant::now();
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before response head",
            ));
        }
        resp.first_byte.get_or_insert(now);
        buf.extend_from_slice(&tmp[..n]);
        if buf.len() > 64 * 1024 {
            return Err(bad("response head too large"));
        }
    };
    if resp.first_byte.is_none() {
        // The head was already buffered (pipelined leftovers): count "now".
        resp.first_byte = Some(now);
    }
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("non-UTF-8 head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split(' ');
    let version = parts.next().unwrap_or("");
    resp.status = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    resp.keep_alive = version == "HTTP/1.1";
    let mut mode = BodyMode::Close;
    for l in lines {
        let Some((n, v)) = l.split_once(':') else {
            continue;
        };
        let (n, v) = (n.trim(), v.trim());
        if n.eq_ignore_ascii_case("content-length") {
            if !matches!(mode, BodyMode::Chunked) {
                mode = BodyMode::Length(v.parse().map_err(|_| bad("bad content-length"))?);
            }
        } else if n.eq_ignore_ascii_case("transfer-encoding") {
            if v.to_ascii_lowercase().contains("chunked") {
                mode = BodyMode::Chunked;
            }
        } else if n.eq_ignore_ascii_case("connection") {
            let v = v.to_ascii_lowercase();
            if v.contains("close") {
                resp.keep_alive = false;
            } else if v.contains("keep-alive") {
                resp.keep_alive = true;
            }
        }
    }
    if matches!(mode, BodyMode::Close) {
        resp.keep_alive = false;
    }
    buf.drain(..head_end);

    let mut chunk = Chunk::Size;
    loop {
        // Consume what is buffered.
        let done = match mode {
            BodyMode::Length(ref mut left) => {
                let n = (*left).min(buf.len());
                if n > 0 {
                    on_body(&buf[..n], now);
                    resp.body_bytes += n;
                    buf.drain(..n);
                    *left -= n;
                }
                *left == 0
            }
            BodyMode::Close => {
                if !buf.is_empty() {
                    on_body(buf, now);
                    resp.body_bytes += buf.len();
                    buf.clear();
                }
                false
            }
            BodyMode::Chunked => {
                let mut pos = 0;
                let mut done = false;
                loop {
                    match chunk {
                        Chunk::Size => {
                            let Some(i) = find(&buf[pos..], b"\r\n") else {
                                break;
                            };
                            let line = std::str::from_utf8(&buf[pos..pos + i])
                                .map_err(|_| bad("bad chunk"))?;
                            let hex = line.split(';').next().unwrap_or("").trim();
                            let size = usize::from_str_radix(hex, 16)
                                .map_err(|_| bad("bad chunk size"))?;
                            pos += i + 2;
                            chunk = if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Chunk::Data(left) => {
                            let n = left.min(buf.len() - pos);
                            if n == 0 {
                                break;
                            }
                            on_body(&buf[pos..pos + n], now);
                            resp.body_bytes += n;
                            pos += n;
                            chunk = if n == left {
                                Chunk::DataEnd
                            } else {
                                Chunk::Data(left - n)
                            };
                        }
                        Chunk::DataEnd => {
                            if buf.len() - pos < 2 {
                                break;
                            }
                            if &buf[pos..pos + 2] != b"\r\n" {
                                return Err(bad("chunk not followed by CRLF"));
                            }
                            pos += 2;
                            chunk = Chunk::Size;
                        }
                        Chunk::Trailers => {
                            let Some(i) = find(&buf[pos..], b"\r\n") else {
                                break;
                            };
                            pos += i + 2;
                            if i == 0 {
                                done = true;
                                break;
                            }
                        }
                    }
                }
                buf.drain(..pos);
                done
            }
        };
        if done {
            return Ok(resp);
        }
        let n = s.read(&mut tmp)?;
        now = Instant::now();
        if n == 0 {
            if matches!(mode, BodyMode::Close) {
                return Ok(resp);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-response",
            ));
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Splits an SSE byte stream into events (blank-line separated) and reports, per event,
/// whether it carried content, and whether it was `[DONE]`.
#[derive(Default)]
pub struct Sse {
    pending: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Content,
    Other,
    Done,
}

impl Sse {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        self.pending.extend_from_slice(bytes);
        loop {
            let lf = find(&self.pending, b"\n\n").map(|i| (i, 2));
            let crlf = find(&self.pending, b"\r\n\r\n").map(|i| (i, 4));
            let cut = match (lf, crlf) {
                (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
                (a, b) => a.or(b),
            };
            let Some((i, sep)) = cut else { break };
            let ev: Vec<u8> = self.pending.drain(..i + sep).collect();
            out.push(classify(&ev[..i]));
        }
    }
}

fn classify(ev: &[u8]) -> Event {
    let text = String::from_utf8_lossy(ev);
    let mut data = String::new();
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    let data = data.trim();
    if data == "[DONE]" {
        return Event::Done;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
        return Event::Other;
    };
    // Anthropic's Messages events: text deltas, and the stream's end.
    match v["type"].as_str() {
        Some("message_stop") => return Event::Done,
        Some("content_block_delta") => {
            return match v["delta"]["text"].as_str() {
                Some(t) if !t.is_empty() => Event::Content,
                _ => Event::Other,
            }
        }
        Some(_) => return Event::Other,
        None => {}
    }
    let c = &v["choices"][0];
    let content = c["delta"]["content"]
        .as_str()
        .or_else(|| c["text"].as_str())
        .unwrap_or("");
    if content.is_empty() {
        Event::Other
    } else {
        Event::Content
    }
}

/// Writes the whole request.
pub fn send(s: &mut TcpStream, req: &[u8]) -> io::Result<()> {
    s.write_all(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn sse_split_and_classify() {
        let mut p = Sse::default();
        let mut out = vec![];
        p.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" Hi\"}}]}\n", &mut out);
        assert_eq!(out, vec![Event::Other]);
        p.feed(b"\ndata: [DONE]\r\n\r\n", &mut out);
        assert_eq!(out, vec![Event::Other, Event::Content, Event::Done]);
    }

    #[test]
    fn chunked_response_split_reads() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let parts: [&[u8]; 4] = [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe",
                b"llo\r\n6\r\n world\r",
                b"\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                b"",
            ];
            for p in parts {
                c.write_all(p).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let mut s = connect(&addr, Duration::from_secs(1)).unwrap();
        let mut buf = vec![];
        let mut body = vec![];
        let r = read_response(&mut s, &mut buf, &mut |b, _| body.extend_from_slice(b)).unwrap();
        assert_eq!((r.status, r.keep_alive), (200, true));
        assert_eq!(body, b"hello world");
        body.clear();
        let r = read_response(&mut s, &mut buf, &mut |b, _| body.extend_from_slice(b)).unwrap();
        assert_eq!((r.status, &body[..]), (200, &b"ok"[..]));
        t.join().unwrap();
    }
}
