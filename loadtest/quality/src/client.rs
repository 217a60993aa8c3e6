//! The measuring client: one blocking HTTP/1.1 keep-alive connection per load thread
//! (std TCP, TCP_NODELAY), one streaming chat request at a time, a timestamp per `read()`.
//!
//! Owns the wire side of a measurement: it writes a request, de-chunks the response, splits
//! the SSE events and records what the run needs (status, `x-rolter-target`, time to the
//! first event with content, time to the end of the body, token events, `[DONE]`, the
//! usage event). It must not interpret results (that is `stats`), retry, or sleep: a failed
//! exchange is reported as it happened and the connection is dropped.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest silence tolerated on a response before it counts as cut.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Token usage as the engine reported it in the stream's usage event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What one request did, seen from the client.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Response status, 0 when no head arrived.
    pub status: u16,
    /// The `x-rolter-target` response header.
    pub target: Option<String>,
    /// Request written → the read that completed the first event with content.
    pub ttft: Option<Duration>,
    /// Request written → the end of the response body (or the failure).
    pub total: Duration,
    /// Events with content.
    pub tokens: u32,
    /// `data: [DONE]` seen.
    pub done: bool,
    pub usage: Option<Usage>,
    /// Transport or framing failure (connect, reset, timeout, EOF mid-body).
    pub error: Option<String>,
}

/// A streaming chat completion body for model "m": a system prompt of `system_bytes`
/// bytes and a short question, `max_tokens` as given, with the usage event requested.
pub fn chat_body(system_bytes: usize, max_tokens: u32, tag: &str) -> String {
    const SENTENCE: &str = "You answer questions about the attached document carefully. ";
    let mut system = String::with_capacity(system_bytes + SENTENCE.len());
    while system.len() < system_bytes {
        system.push_str(SENTENCE);
    }
    system.truncate(system_bytes);
    format!(
        concat!(
            r#"{{"model":"m","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":{},"#,
            r#""messages":[{{"role":"system","content":"{}"}},"#,
            r#"{{"role":"user","content":"Question {}: summarise the document in two sentences."}}]}}"#
        ),
        max_tokens, system, tag
    )
}

/// The full request bytes for `body`.
pub fn request(addr: SocketAddr, body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A keep-alive connection to the gateway, reopened after any failure.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    tmp: Vec<u8>,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            stream: None,
            buf: Vec::new(),
            tmp: vec![0; 64 * 1024],
        }
    }

    /// Sends `req` and reads the whole response.
    pub fn exchange(&mut self, req: &[u8]) -> Outcome {
        let mut out = Outcome::default();
        let t0 = Instant::now();
        let result = self.try_exchange(req, t0, &mut out);
        out.total = t0.elapsed();
        match result {
            Ok(keep_alive) => {
                if !keep_alive {
                    self.stream = None;
                }
            }
            Err(e) => {
                out.error = Some(e.to_string());
                self.stream = None;
            }
        }
        out
    }

    fn connect(&mut self) -> io::Result<&mut TcpStream> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(READ_TIMEOUT))?;
            self.buf.clear();
            self.stream = Some(s);
        }
        Ok(self.stream.as_mut().expect("connected above"))
    }

    /// Reads more bytes into `buf`; the time of the read.
    fn fill(&mut self) -> io::Result<Instant> {
        let s = self.stream.as_mut().ok_or_else(|| bad("not connected"))?;
        let n = s.read(&mut self.tmp)?;
        let now = Instant::now();
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        self.buf.extend_from_slice(&self.tmp[..n]);
        Ok(now)
    }

    /// Ok(keep_alive) when the response was read completely.
    fn try_exchange(&mut self, req: &[u8], t0: Instant, out: &mut Outcome) -> io::Result<bool> {
        self.connect()?.write_all(req)?;
        let mut now = t0;
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if self.buf.len() > 64 * 1024 {
                return Err(bad("response head too large"));
            }
            now = self.fill()?;
        };
        let head = parse_head(&self.buf[..head_end])?;
        self.buf.drain(..head_end);
        out.status = head.status;
        out.target = head.target;
        let mut sse = Sse::default();
        let mut on_body = |bytes: &[u8], at: Instant, out: &mut Outcome| {
            sse.feed(bytes, &mut |ev| match ev {
                Event::Content => {
                    out.tokens += 1;
                    if out.ttft.is_none() {
                        out.ttft = Some(at - t0);
                    }
                }
                Event::Usage(u) => out.usage = Some(u),
                Event::Done => out.done = true,
                Event::Other => {}
            });
        };
        match head.framing {
            Framing::Length(mut left) => loop {
                let n = left.min(self.buf.len());
                on_body(&self.buf[..n], now, out);
                self.buf.drain(..n);
                left -= n;
                if left == 0 {
                    return Ok(head.keep_alive);
                }
                now = self.fill()?;
            },
            Framing::Close => loop {
                on_body(&self.buf, now, out);
                self.buf.clear();
                match self.fill() {
                    Ok(t) => now = t,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                    Err(e) => return Err(e),
                }
            },
            Framing::Chunked => {
                let mut chunk = Chunk::Size;
                loop {
                    let (consumed, finished) = dechunk(&self.buf, &mut chunk, &mut |b| {
                        on_body(b, now, out);
                    })?;
                    self.buf.drain(..consumed);
                    if finished {
                        return Ok(head.keep_alive);
                    }
                    now = self.fill()?;
                }
            }
        }
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

enum Framing {
    Length(usize),
    Chunked,
    Close,
}

struct Head {
    status: u16,
    target: Option<String>,
    framing: Framing,
    keep_alive: bool,
}

fn parse_head(raw: &[u8]) -> io::Result<Head> {
    let text = std::str::from_utf8(raw).map_err(|_| bad("non-UTF-8 response head"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let status = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut head = Head {
        status,
        target: None,
        framing: Framing::Close,
        keep_alive: version == "HTTP/1.1",
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            if !matches!(head.framing, Framing::Chunked) {
                let n = value.parse().map_err(|_| bad("bad content-length"))?;
                head.framing = Framing::Length(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().contains("chunked") {
                head.framing = Framing::Chunked;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                head.keep_alive = false;
            }
        } else if name.eq_ignore_ascii_case("x-rolter-target") {
            head.target = Some(value.to_string());
        }
    }
    if matches!(head.framing, Framing::Close) {
        head.keep_alive = false;
    }
    Ok(head)
}

enum Chunk {
    Size,
    Data(usize),
    DataEnd,
    Trailers,
}

/// Consumes what it can of `buf`; (bytes consumed, body finished).
fn dechunk(
    buf: &[u8],
    state: &mut Chunk,
    emit: &mut dyn FnMut(&[u8]),
) -> io::Result<(usize, bool)> {
    let mut pos = 0;
    loop {
        match *state {
            Chunk::Size => {
                let Some(i) = find(&buf[pos..], b"\r\n") else {
                    return Ok((pos, false));
                };
                let line = std::str::from_utf8(&buf[pos..pos + i]).map_err(|_| bad("bad chunk"))?;
                let hex = line.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
                pos += i + 2;
                *state = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(left) => {
                let n = left.min(buf.len() - pos);
                if n == 0 {
                    return Ok((pos, false));
                }
                emit(&buf[pos..pos + n]);
                pos += n;
                *state = if n == left {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left - n)
                };
            }
            Chunk::DataEnd => {
                if buf.len() - pos < 2 {
                    return Ok((pos, false));
                }
                if &buf[pos..pos + 2] != b"\r\n" {
                    return Err(bad("chunk not followed by CRLF"));
                }
                pos += 2;
                *state = Chunk::Size;
            }
            Chunk::Trailers => {
                let Some(i) = find(&buf[pos..], b"\r\n") else {
                    return Ok((pos, false));
                };
                pos += i + 2;
                if i == 0 {
                    return Ok((pos, true));
                }
            }
        }
    }
}

/// One SSE event, classified.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// A chunk whose first choice carries non-empty content.
    Content,
    /// The usage chunk (`stream_options.include_usage`).
    Usage(Usage),
    Done,
    Other,
}

/// Splits an SSE byte stream into events (blank-line separated).
#[derive(Default)]
struct Sse {
    pending: Vec<u8>,
}

impl Sse {
    fn feed(&mut self, bytes: &[u8], out: &mut dyn FnMut(Event)) {
        self.pending.extend_from_slice(bytes);
        while let Some(i) = find(&self.pending, b"\n\n") {
            let ev: Vec<u8> = self.pending.drain(..i + 2).collect();
            out(classify(&ev[..i]));
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
    let choice = &v["choices"][0];
    let content = choice["delta"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or("");
    if !content.is_empty() {
        return Event::Content;
    }
    let usage = &v["usage"];
    match (
        usage["prompt_tokens"].as_u64(),
        usage["completion_tokens"].as_u64(),
    ) {
        (Some(p), Some(c)) => Event::Usage(Usage {
            prompt_tokens: p,
            completion_tokens: c,
        }),
        _ => Event::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_content_usage_and_done() {
        let mut sse = Sse::default();
        let mut seen = Vec::new();
        sse.feed(
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" Hi\"}}]}\n\n",
            &mut |e| seen.push(e),
        );
        sse.feed(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n",
            &mut |e| seen.push(e),
        );
        sse.feed(b"\ndata: [DONE]\n\n", &mut |e| seen.push(e));
        assert_eq!(
            seen,
            vec![
                Event::Other,
                Event::Content,
                Event::Usage(Usage {
                    prompt_tokens: 7,
                    completion_tokens: 3
                }),
                Event::Done
            ]
        );
    }

    #[test]
    fn dechunks_across_reads() {
        let mut state = Chunk::Size;
        let mut body = Vec::new();
        let (used, done) =
            dechunk(b"5\r\nhel", &mut state, &mut |b| body.extend_from_slice(b)).unwrap();
        assert_eq!((used, done), (6, false));
        let (_, done) = dechunk(b"lo\r\n0\r\n\r\n", &mut state, &mut |b| {
            body.extend_from_slice(b)
        })
        .unwrap();
        assert!(done);
        assert_eq!(body, b"hello");
    }

    #[test]
    fn head_reads_target_and_framing() {
        let h = parse_head(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-rolter-target: fast\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (h.status, h.target.as_deref(), h.keep_alive),
            (200, Some("fast"), true)
        );
        assert!(matches!(h.framing, Framing::Chunked));
    }

    #[test]
    fn body_has_the_requested_prompt_size() {
        let b = chat_body(1000, 16, "1");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["messages"][0]["content"].as_str().unwrap().len(), 1000);
        assert_eq!(v["max_tokens"], 16);
    }
}
