//! A small blocking HTTP/1.1 client over `std::net`, for tests and load tools: raw requests,
//! strict chunked decoding, SSE event splitting, and a Prometheus value reader.
//!
//! Owns nothing of the engine; it is public so the gateway's integration tests speak to the
//! gateway with the same client the mock's own tests use.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut s = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        s.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    s.push_str("\r\n");
    s.push_str(body);
    s
}

pub fn post(path: &str, headers: &[(&str, &str)], body: &str) -> String {
    request("POST", path, headers, body)
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Chunk payloads when the body was chunked.
    pub chunks: Vec<Vec<u8>>,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad json {e}: {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

pub struct Client {
    pub r: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            r: BufReader::new(s),
        }
    }
    pub fn stream(&self) -> &TcpStream {
        self.r.get_ref()
    }
    pub fn send(&mut self, raw: &str) {
        self.r.get_mut().write_all(raw.as_bytes()).unwrap();
    }
    pub fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        let n = self.r.read_line(&mut l)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l)
    }
    pub fn head(&mut self) -> std::io::Result<(u16, Vec<(String, String)>)> {
        let status_line = self.line()?;
        assert!(
            status_line.starts_with("HTTP/1.1 "),
            "status line {status_line:?}"
        );
        let status: u16 = status_line[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let l = self.line()?;
            let l = l.trim_end_matches("\r\n");
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header colon");
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        Ok((status, headers))
    }
    /// Reads one chunk strictly; None at the terminating chunk.
    pub fn chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let l = self.line()?;
        assert!(l.ends_with("\r\n"), "chunk size line {l:?}");
        let size = usize::from_str_radix(l.trim_end(), 16).expect("hex chunk size");
        let mut data = vec![0; size + 2];
        self.r.read_exact(&mut data)?;
        assert_eq!(&data[size..], b"\r\n", "chunk terminator");
        data.truncate(size);
        if size == 0 {
            return Ok(None);
        }
        Ok(Some(data))
    }
    pub fn response(&mut self) -> std::io::Result<Response> {
        let (status, headers) = self.head()?;
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let mut resp = Response {
            status,
            headers: headers.clone(),
            body: Vec::new(),
            chunks: Vec::new(),
            chunked: false,
        };
        if get("transfer-encoding").as_deref() == Some("chunked") {
            resp.chunked = true;
            while let Some(c) = self.chunk()? {
                resp.body.extend_from_slice(&c);
                resp.chunks.push(c);
            }
        } else if let Some(len) = get("content-length") {
            let mut body = vec![0; len.parse().unwrap()];
            self.r.read_exact(&mut body)?;
            resp.body = body;
        } else {
            self.r.read_to_end(&mut resp.body)?;
        }
        Ok(resp)
    }
}

/// One request on a fresh connection.
pub fn call(addr: SocketAddr, raw: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(raw);
    c.response().unwrap()
}

/// Splits an SSE body into events: (event type, data).
pub fn sse_events(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(
        text.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut ev = None;
            let mut data = None;
            for line in e.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    ev = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(v.to_string());
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (ev, data.expect("data line"))
        })
        .collect()
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A metric value from `/metrics`.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let r = call(addr, &request("GET", "/metrics", &[], ""));
    let text = r.text();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("metric {name} missing"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
