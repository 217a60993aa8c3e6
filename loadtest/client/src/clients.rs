//! The measuring clients: sequential streams (TTFB/TTFT/gaps), idle connection holder,
//! concurrent slow streams.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::{self, Event, Sse};

pub fn percentiles(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return json!({"n": 0});
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| {
        let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({"n": v.len(), "min": v[0], "p50": q(0.50), "p90": q(0.90), "p99": q(0.99),
           "p999": q(0.999), "max": v[v.len() - 1], "mean": mean})
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn write_out(out: &Option<PathBuf>, v: &Value) -> io::Result<()> {
    let s = serde_json::to_string_pretty(v).unwrap();
    match out {
        Some(p) => std::fs::write(p, s + "\n"),
        None => {
            println!("{s}");
            Ok(())
        }
    }
}

pub struct StreamArgs {
    pub addr: SocketAddr,
    pub requests: usize,
    pub warmup: usize,
    pub max_secs: f64,
    pub tokens: u32,
    pub itl_ms: u64,
    pub ttft_ms: Option<u64>,
    pub out: Option<PathBuf>,
    /// Anthropic's `/v1/messages` instead of chat completions.
    pub messages: bool,
}

struct One {
    ttfb: Duration,
    ttft: Option<Duration>,
    gaps: Vec<Duration>,
    tokens: u32,
    done: bool,
    status: u16,
    keep_alive: bool,
}

fn one_stream(s: &mut TcpStream, buf: &mut Vec<u8>, req: &[u8]) -> io::Result<One> {
    let mut sse = Sse::default();
    let mut evs = Vec::new();
    let mut last: Option<Instant> = None;
    let mut one = One {
        ttfb: Duration::ZERO,
        ttft: None,
        gaps: Vec::new(),
        tokens: 0,
        done: false,
        status: 0,
        keep_alive: false,
    };
    let t0 = Instant::now();
    http::send(s, req)?;
    let r = http::read_response(s, buf, &mut |b, t| {
        sse.feed(b, &mut evs);
        for e in evs.drain(..) {
            match e {
                Event::Content => {
                    one.tokens += 1;
                    match last {
                        None => one.ttft = Some(t - t0),
                        Some(p) => one.gaps.push(t - p),
                    }
                    last = Some(t);
                }
                Event::Done => one.done = true,
                Event::Other => {}
            }
        }
    })?;
    one.ttfb = r.first_byte.map(|t| t - t0).unwrap_or_default();
    one.status = r.status;
    one.keep_alive = r.keep_alive;
    Ok(one)
}

/// Sequential streaming requests on one keep-alive connection.
pub fn stream(a: StreamArgs) -> io::Result<()> {
    let (path, body) = if a.messages {
        ("/v1/messages", http::messages_body(true, a.tokens))
    } else {
        ("/v1/chat/completions", http::chat_body(true, a.tokens))
    };
    let mut extra = format!(
        "x-mock-itl-ms: {}\r\nx-mock-tokens: {}\r\n",
        a.itl_ms, a.tokens
    );
    if let Some(t) = a.ttft_ms {
        extra.push_str(&format!("x-mock-ttft-ms: {t}\r\n"));
    }
    let req = http::request_to(&a.addr, path, &body, &extra);
    let deadline = Instant::now() + Duration::from_secs_f64(a.max_secs);
    let (mut ttfb, mut ttft, mut gaps) = (vec![], vec![], vec![]);
    let (mut ok, mut errors, mut reconnects) = (0usize, 0usize, 0usize);
    let mut last_error = String::new();
    let mut conn: Option<TcpStream> = None;
    let mut buf = Vec::new();
    let mut i = 0usize;
    while ok < a.requests && Instant::now() < deadline {
        if conn.is_none() {
            match http::connect(&a.addr, Duration::from_secs(2)) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    errors += 1;
                    last_error = format!("connect: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            buf.clear();
            reconnects += 1;
        }
        let s = conn.as_mut().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let r = one_stream(s, &mut buf, &req);
        i += 1;
        match r {
            Ok(o) if o.status == 200 && o.done && o.tokens == a.tokens => {
                if !o.keep_alive {
                    conn = None;
                }
                if i > a.warmup {
                    ok += 1;
                    ttfb.push(us(o.ttfb));
                    ttft.push(us(o.ttft.unwrap_or_default()));
                    gaps.extend(o.gaps.iter().map(|g| us(*g)));
                }
            }
            Ok(o) => {
                errors += 1;
                last_error = format!(
                    "status {} tokens {}/{} done {}",
                    o.status, o.tokens, a.tokens, o.done
                );
                conn = None;
            }
            Err(e) => {
                errors += 1;
                last_error = e.to_string();
                conn = None;
            }
        }
    }
    let v = json!({
        "kind": "stream", "addr": a.addr.to_string(), "requests": ok, "errors": errors,
        "connections": reconnects, "last_error": last_error,
        "tokens": a.tokens, "itl_ms": a.itl_ms,
        "ttfb_us": percentiles(ttfb), "ttft_us": percentiles(ttft), "gap_us": percentiles(gaps),
    });
    write_out(&a.out, &v)
}

fn wait_release(release: &Option<PathBuf>, max: Duration) {
    let end = Instant::now() + max;
    while Instant::now() < end {
        if let Some(p) = release {
            if p.exists() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ready(path: &Option<PathBuf>, n: usize) -> io::Result<()> {
    if let Some(p) = path {
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, format!("{n}\n"))?;
        std::fs::rename(tmp, p)?;
    }
    Ok(())
}

pub struct HoldArgs {
    pub addr: SocketAddr,
    pub conns: usize,
    pub hold_secs: f64,
    pub ready_file: Option<PathBuf>,
    pub release_file: Option<PathBuf>,
    pub out: Option<PathBuf>,
}

/// Opens N keep-alive connections, one small request each, and holds them open.
pub fn hold(a: HoldArgs) -> io::Result<()> {
    let limit = http::raise_nofile();
    let req = http::request(&a.addr, &http::chat_body(false, 1), "");
    let t0 = Instant::now();
    let mut conns = Vec::with_capacity(a.conns);
    let (mut errors, mut last_error) = (0usize, String::new());
    let mut buf = Vec::new();
    while conns.len() < a.conns && errors <= a.conns / 20 + 5 {
        let r = (|| -> io::Result<TcpStream> {
            let mut s = http::connect(&a.addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            buf.clear();
            http::send(&mut s, &req)?;
            let r = http::read_response(&mut s, &mut buf, &mut |_, _| {})?;
            if r.status != 200 || !r.keep_alive {
                return Err(io::Error::other(format!(
                    "status {} keep-alive {}",
                    r.status, r.keep_alive
                )));
            }
            Ok(s)
        })();
        match r {
            Ok(s) => conns.push(s),
            Err(e) => {
                errors += 1;
                last_error = e.to_string();
            }
        }
    }
    let open_secs = t0.elapsed().as_secs_f64();
    ready(&a.ready_file, conns.len())?;
    wait_release(&a.release_file, Duration::from_secs_f64(a.hold_secs));
    // Which connections did the server keep open?
    let mut alive = 0usize;
    let mut probe = [0u8; 1];
    for s in &conns {
        s.set_nonblocking(true)?;
        match s.peek(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => alive += 1,
            _ => {}
        }
    }
    let opened = conns.len();
    for s in conns {
        http::close_rst(s);
    }
    let v = json!({"kind": "hold", "addr": a.addr.to_string(), "requested": a.conns,
        "opened": opened, "alive_at_end": alive, "errors": errors, "last_error": last_error,
        "open_secs": open_secs, "nofile_limit": limit});
    write_out(&a.out, &v)
}

pub struct SlowArgs {
    pub addr: SocketAddr,
    pub conns: usize,
    pub tokens: u32,
    pub itl_ms: u64,
    pub ready_file: Option<PathBuf>,
    pub out: Option<PathBuf>,
}

/// Starts N concurrent slow streams (one per connection), then drains them all.
pub fn slow(a: SlowArgs) -> io::Result<()> {
    let limit = http::raise_nofile();
    let extra = format!(
        "x-mock-itl-ms: {}\r\nx-mock-tokens: {}\r\n",
        a.itl_ms, a.tokens
    );
    let req = http::request(&a.addr, &http::chat_body(true, a.tokens), &extra);
    let t0 = Instant::now();
    let mut conns = Vec::with_capacity(a.conns);
    let (mut errors, mut last_error) = (0usize, String::new());
    while conns.len() < a.conns && errors <= a.conns / 20 + 5 {
        let r = (|| -> io::Result<TcpStream> {
            let mut s = http::connect(&a.addr, Duration::from_secs(2))?;
            http::send(&mut s, &req)?;
            Ok(s)
        })();
        match r {
            Ok(s) => conns.push(s),
            Err(e) => {
                errors += 1;
                last_error = e.to_string();
            }
        }
    }
    let open_secs = t0.elapsed().as_secs_f64();
    ready(&a.ready_file, conns.len())?;
    let stream_secs = (a.tokens as u64 * a.itl_ms) as f64 / 1000.0;
    let mut completed = 0usize;
    let mut buf = Vec::new();
    let opened = conns.len();
    for mut s in conns {
        s.set_read_timeout(Some(Duration::from_secs_f64(stream_secs + 30.0)))?;
        buf.clear();
        let mut sse = Sse::default();
        let mut evs = Vec::new();
        let (mut tokens, mut done) = (0u32, false);
        let r = http::read_response(&mut s, &mut buf, &mut |b, _| {
            sse.feed(b, &mut evs);
            for e in evs.drain(..) {
                match e {
                    Event::Content => tokens += 1,
                    Event::Done => done = true,
                    Event::Other => {}
                }
            }
        });
        match r {
            Ok(r) if r.status == 200 && done && tokens == a.tokens => completed += 1,
            Ok(r) => {
                errors += 1;
                last_error = format!("status {} tokens {tokens} done {done}", r.status);
            }
            Err(e) => {
                errors += 1;
                last_error = e.to_string();
            }
        }
        http::close_rst(s);
    }
    let v = json!({"kind": "slow", "addr": a.addr.to_string(), "requested": a.conns,
        "opened": opened, "completed": completed, "errors": errors, "last_error": last_error,
        "open_secs": open_secs, "total_secs": t0.elapsed().as_secs_f64(),
        "tokens": a.tokens, "itl_ms": a.itl_ms, "nofile_limit": limit});
    write_out(&a.out, &v)
}

pub fn read_json(p: &Path) -> io::Result<Value> {
    let s = std::fs::read_to_string(p)?;
    serde_json::from_str(&s)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))
}
