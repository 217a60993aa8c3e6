//! Rolter's soak: a real `rolter` process in front of three mock engines, under mixed
//! streaming and non-streaming load from several clients, while the engines fail and return
//! on a schedule (one killed and restarted, one answering 503 for a while, one resetting its
//! streams mid-way), clients abandon some streams, and the configuration is reloaded in the
//! middle. Every request ends in exactly one of: answered (a complete response), failed
//! with a reason the client saw (an error status with an error body, or a stream that ends
//! with an error event), abandoned by the client on purpose, or lost (anything else: no
//! response, a truncated body, a stream that ends cleanly without its end marker). The
//! gateway's open file descriptors and resident memory are read at the start, the middle
//! and the end.
//!
//! Owns the schedule, the clients and the report. It must send traffic to loopback only.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolter_mock::{Fault, MockConfig, MockHandle};
use serde::Serialize;

/// What a soak run does.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The `rolter` binary.
    pub rolter: PathBuf,
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// The gateway's worker threads.
    pub workers: usize,
    /// Where the configuration, the gateway's log and the report go.
    pub out: PathBuf,
}

/// One reading of the gateway process.
#[derive(Debug, Clone, Serialize)]
pub struct ProcSample {
    pub at: String,
    pub seconds: f64,
    pub fds: usize,
    pub rss_kib: u64,
    /// TCP connections to the engines, and established ones from clients.
    pub upstream_sockets: usize,
    pub client_sockets: usize,
}

/// What the run came to.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub sent: u64,
    pub answered: u64,
    /// Failed with a reason the client saw, by reason (the error code, or the status).
    pub failed: BTreeMap<String, u64>,
    /// Streams the clients closed on purpose after their first event.
    pub abandoned: u64,
    /// Requests with no proper ending: must be zero.
    pub lost: u64,
    pub lost_examples: Vec<String>,
    pub process: Vec<ProcSample>,
    /// What the schedule did, and when.
    pub events: Vec<(f64, String)>,
}

impl Report {
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "soak: {:.0} s\n\n| sent | answered | failed (client saw why) | abandoned by client | lost |\n|---|---|---|---|---|\n| {} | {} | {} | {} | {} |\n\n",
            self.seconds,
            self.sent,
            self.answered,
            self.failed_total(),
            self.abandoned,
            self.lost
        );
        s.push_str("| failure | count |\n|---|---|\n");
        for (k, v) in &self.failed {
            s.push_str(&format!("| {k} | {v} |\n"));
        }
        s.push_str("\n| when | at | open fds | to engines | from clients | RSS |\n|---|---|---|---|---|---|\n");
        for p in &self.process {
            s.push_str(&format!(
                "| {} | {:.0} s | {} | {} | {} | {:.1} MiB |\n",
                p.at,
                p.seconds,
                p.fds,
                p.upstream_sockets,
                p.client_sockets,
                p.rss_kib as f64 / 1024.0
            ));
        }
        s.push_str("\n| at | event |\n|---|---|\n");
        for (t, e) in &self.events {
            s.push_str(&format!("| {t:.0} s | {e} |\n"));
        }
        if !self.lost_examples.is_empty() {
            s.push_str("\nlost:\n");
            for l in &self.lost_examples {
                s.push_str(&format!("- {l}\n"));
            }
        }
        s
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn engine(name: &str, port: u16) -> MockHandle {
    rolter_mock::spawn(MockConfig {
        name: name.into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        models: vec!["m".into()],
        ttft: Duration::from_millis(10),
        itl: Duration::from_millis(4),
        tokens: 24,
        ..MockConfig::default()
    })
    .expect("start a mock engine")
}

fn config_text(port: u16, admin: u16, workers: usize, engines: &[u16], weight: f64) -> String {
    let mut s = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = {workers}\npin_workers = false\nshutdown_grace = \"5s\"\n\
         [log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [health]\nactive = false\nfailures = 3\nejection_time = \"1s\"\nmax_ejection_time = \"4s\"\n"
    );
    for (i, p) in engines.iter().enumerate() {
        let w = if i == 1 { weight } else { 1.0 };
        s.push_str(&format!(
            "[[targets]]\nname = \"e{i}\"\nurl = \"http://127.0.0.1:{p}\"\nweight = {w}\nmodels = [\"m\"]\n\
             [targets.timeouts]\nconnect = \"500ms\"\nfirst_byte = \"5s\"\nidle = \"5s\"\n\
             [targets.pool]\nidle_timeout = \"2s\"\n"
        ));
    }
    s.push_str("[[routes]]\nname = \"r\"\ntargets = [\"e0\", \"e1\", \"e2\"]\nretries = 2\nstrategy = \"least_loaded\"\n");
    s
}

fn wait_listening(addr: SocketAddr, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Remote and local ports and state of every TCP socket on the machine, by inode.
fn tcp_sockets() -> std::collections::HashMap<u64, (u16, u16, u8)> {
    let mut map = std::collections::HashMap::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 {
                continue;
            }
            let port = |c: &str| {
                c.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    .unwrap_or(0)
            };
            let state = u8::from_str_radix(cols[3], 16).unwrap_or(0);
            if let Ok(inode) = cols[9].parse::<u64>() {
                map.insert(inode, (port(cols[1]), port(cols[2]), state));
            }
        }
    }
    map
}

fn sample(pid: u32, at: &str, start: Instant, gateway: u16, engines: &[u16]) -> ProcSample {
    let sockets = tcp_sockets();
    let (mut upstream_sockets, mut client_sockets) = (0, 0);
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            let Ok(link) = std::fs::read_link(e.path()) else {
                continue;
            };
            let link = link.to_string_lossy().to_string();
            let Some(inode) = link
                .strip_prefix("socket:[")
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|l| l.parse::<u64>().ok())
            else {
                continue;
            };
            // State 1: established.
            if let Some(&(local, remote, 1)) = sockets.get(&inode) {
                if engines.contains(&remote) {
                    upstream_sockets += 1;
                } else if local == gateway {
                    client_sockets += 1;
                }
            }
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    ProcSample {
        at: at.into(),
        seconds: start.elapsed().as_secs_f64(),
        fds,
        rss_kib,
        upstream_sockets,
        client_sockets,
    }
}

/// `GET /readyz` on the admin listener answers 200.
fn ready(admin: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", admin)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut b = [0u8; 16];
    matches!(s.read(&mut b), Ok(n) if n >= 12 && &b[9..12] == b"200")
}

/// How one request ended.
enum End {
    Answered,
    Failed(String),
    Abandoned,
    Lost(String),
}

/// One request on a new connection.
fn one_request(addr: SocketAddr, stream: bool, abandon: bool) -> End {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"soak"}}]}}"#
    );
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(s) => s,
        Err(e) => return End::Lost(format!("connect: {e}")),
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    if let Err(e) = s.write_all(req.as_bytes()) {
        return End::Lost(format!("send: {e}"));
    }
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    // The head.
    let (status, head_len, chunked, length) = loop {
        match s.read(&mut chunk) {
            Ok(0) => return End::Lost(format!("closed before a response ({} bytes)", buf.len())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return End::Lost(format!("reading the head: {e}")),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(len)) = r.parse(&buf) {
            let status = r.code.unwrap_or(0);
            let mut chunked = false;
            let mut length = None;
            for h in r.headers.iter() {
                if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = String::from_utf8_lossy(h.value).contains("chunked");
                }
                if h.name.eq_ignore_ascii_case("content-length") {
                    length = String::from_utf8_lossy(h.value)
                        .trim()
                        .parse::<usize>()
                        .ok();
                }
            }
            break (status, len, chunked, length);
        }
    };
    if abandon && status == 200 && stream {
        // Close after the first event has (most likely) arrived.
        if buf.len() > head_len || s.read(&mut chunk).is_ok_and(|n| n > 0) {
            return End::Abandoned;
        }
    }
    // The body.
    let mut body = buf.split_off(head_len);
    loop {
        let done = match (chunked, length) {
            (true, _) => body.windows(5).any(|w| w == b"0\r\n\r\n"),
            (false, Some(l)) => body.len() >= l,
            (false, None) => false,
        };
        if done {
            break;
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) => return End::Lost(format!("reading the body (status {status}): {e}")),
        }
    }
    // A stream the gateway cuts ends with an error event and no final chunk (so no HTTP
    // client takes it for a complete answer): judged by its last event below.
    let (text, complete) = if chunked {
        match dechunk(&body) {
            Some(d) => d,
            None => return End::Lost(format!("status {status}: malformed chunked body")),
        }
    } else {
        (body, true)
    };
    let text = String::from_utf8_lossy(&text).to_string();
    if let Some(l) = length {
        if text.len() < l {
            return End::Lost(format!("status {status}: {} of {l} body bytes", text.len()));
        }
    }
    if status != 200 {
        let code = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|j| j["error"]["code"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("status {status} without an error body"));
        return End::Failed(format!("{status} {code}"));
    }
    if !stream {
        return match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(j) if j["choices"].is_array() => End::Answered,
            _ => End::Lost(format!("a 200 whose body is not a completion: {text:.80}")),
        };
    }
    // A stream: its last data event is [DONE], or an error the client can see.
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or("");
    if last == "[DONE]" && complete {
        return End::Answered;
    }
    match serde_json::from_str::<serde_json::Value>(last) {
        Ok(j) if j.get("error").is_some() => End::Failed(format!(
            "stream cut with an error event: {}",
            j["error"]["code"].as_str().unwrap_or("?")
        )),
        _ => End::Lost(format!(
            "a stream that ended without [DONE] or an error: {last:.80}"
        )),
    }
}

/// The bytes of a chunked body, and whether its final chunk arrived; `None` when the
/// framing is broken (not merely cut short at a chunk boundary).
fn dechunk(mut b: &[u8]) -> Option<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    loop {
        if b.is_empty() {
            return Some((out, false));
        }
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).ok()?.trim(), 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some((out, true));
        }
        if b.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Runs the soak and writes `report.json` and `report.md` in `cfg.out`.
pub fn run(cfg: &SoakConfig) -> std::io::Result<Report> {
    std::fs::create_dir_all(&cfg.out)?;
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut engines: Vec<Option<MockHandle>> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| Some(engine(&format!("e{i}"), p)))
        .collect();
    let (port, admin) = (free_port(), free_port());
    let config = cfg.out.join("rolter.toml");
    std::fs::write(&config, config_text(port, admin, cfg.workers, &ports, 1.0))?;
    let log = std::fs::File::create(cfg.out.join("rolter.log"))?;
    let mut child: Child = Command::new(&cfg.rolter)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUNTIME_DIRECTORY", &cfg.out)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    if !wait_listening(addr, Duration::from_secs(10)) {
        let _ = child.kill();
        return Err(std::io::Error::other(
            "the gateway did not start (see rolter.log)",
        ));
    }
    // The baseline once every worker runs: the admin listener says ready.
    let ready_by = Instant::now() + Duration::from_secs(10);
    while !ready(admin) && Instant::now() < ready_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let report = Arc::new(Mutex::new(Report::default()));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let mut r = report.lock().unwrap();
        r.process
            .push(sample(child.id(), "start", start, port, &ports));
    }
    let clients: Vec<_> = (0..cfg.clients)
        .map(|c| {
            let (report, stop) = (report.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(c as u64);
                let mut local = Report::default();
                while !stop.load(Ordering::Relaxed) {
                    let stream = rng.bool();
                    let abandon = stream && rng.u32(..20) == 0;
                    local.sent += 1;
                    match one_request(addr, stream, abandon) {
                        End::Answered => local.answered += 1,
                        End::Failed(why) => *local.failed.entry(why).or_default() += 1,
                        End::Abandoned => local.abandoned += 1,
                        End::Lost(why) => {
                            local.lost += 1;
                            if local.lost_examples.len() < 5 {
                                local.lost_examples.push(why);
                            }
                        }
                    }
                }
                let mut r = report.lock().unwrap();
                r.sent += local.sent;
                r.answered += local.answered;
                r.abandoned += local.abandoned;
                r.lost += local.lost;
                for (k, v) in local.failed {
                    *r.failed.entry(k).or_default() += v;
                }
                r.lost_examples.extend(local.lost_examples);
            })
        })
        .collect();
    // The schedule, as fractions of the run.
    let at = |f: f64| start + cfg.duration.mul_f64(f);
    let note = |what: String| {
        report
            .lock()
            .unwrap()
            .events
            .push((start.elapsed().as_secs_f64(), what));
    };
    let until = |t: Instant| {
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
    };
    until(at(0.10));
    if let Some(e) = engines[0].take() {
        e.shutdown();
    }
    note("engine e0 stopped (connections refused, streams cut)".into());
    until(at(0.25));
    engines[0] = Some(engine("e0", ports[0]));
    note("engine e0 back".into());
    until(at(0.40));
    std::fs::write(&config, config_text(port, admin, cfg.workers, &ports, 2.0))?;
    // SIGHUP: reload (e1's weight doubles).
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    note("reload (SIGHUP): e1's weight 1 -> 2".into());
    until(at(0.50));
    report
        .lock()
        .unwrap()
        .process
        .push(sample(child.id(), "middle", start, port, &ports));
    engines[1]
        .as_ref()
        .unwrap()
        .set_fault(Some(Fault::Status(503)));
    note("engine e1 answers 503".into());
    until(at(0.65));
    engines[1].as_ref().unwrap().set_fault(None);
    note("engine e1 healthy".into());
    until(at(0.75));
    engines[2]
        .as_ref()
        .unwrap()
        .set_fault(Some(Fault::ResetAfter(3)));
    note("engine e2 resets its streams after 3 events".into());
    until(at(0.85));
    engines[2].as_ref().unwrap().set_fault(None);
    note("engine e2 healthy".into());
    until(at(1.0));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    note("load stopped".into());
    // Idle: pooled upstream connections time out (the pool's idle_timeout is 2 s here).
    std::thread::sleep(Duration::from_secs(5));
    let end = sample(child.id(), "end (idle)", start, port, &ports);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let mut r = report.lock().unwrap().clone();
    r.process.push(end);
    r.seconds = cfg.duration.as_secs_f64();
    write_report(&cfg.out, &r)?;
    Ok(r)
}

fn write_report(dir: &Path, r: &Report) -> std::io::Result<()> {
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(dir.join("report.md"), r.markdown())
}
