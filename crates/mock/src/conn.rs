//! One client connection: the request loop, the always-armed read used for abort
//! detection and pipelining, admission, answer timing and fault injection.
//!
//! A `recv` is kept in flight on the socket for the whole life of the connection (also
//! while an answer is being generated), so a client that goes away (or half-closes) is
//! noticed at once, and bytes of a pipelined next request are appended to the read
//! buffer instead of being lost. The read op is only ever cancelled (and then awaited)
//! when the connection itself is closed.
//!
//! With P/D on, an inference request's leg waits for its peer here (a decode's pull or
//! handshake, a prefill's wait for its decode), raced against the client like every other
//! wait, so a client that goes away during one is counted as an abort. With several
//! data-parallel ranks, each request runs on its rank's admission queue and prefix cache
//! and is counted in the rank's counters too.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use monoio::io::{
    AsyncWriteRentExt, CancelableAsyncReadRent, Canceller, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use monoio::time::Instant;

use crate::admission::{Admission, Permit};
use crate::api::{self, Api, Ending, FaultBody, Gen, GenBody};
use crate::http::{self, Body, Head, Length, Overrides, Parse, Route};
#[cfg(feature = "zmq")]
use crate::lmcache_worker::LmcacheQuery;
use crate::lora::{self, LoraSlot};
use crate::pd::{self, Leg, PdRole};
use crate::prefix::{self, PrefixQuery};
use crate::stats::{inc, Stats};
use crate::{Fault, MockApi, MockConfig, Shared};

const READ_CHUNK: usize = 16 * 1024;
/// Stop reading ahead when this many unprocessed bytes are buffered.
const READ_AHEAD_LIMIT: usize = 1024 * 1024;
/// A stream's buffered events are written once they reach this size.
const STREAM_FLUSH_BYTES: usize = 64 * 1024;
/// A P/D handshake's time beyond the bootstrap server's own wait, for its answer.
const SLACK: Duration = Duration::from_secs(1);

/// Per-thread state.
pub(crate) struct Local {
    /// One admission queue per data-parallel rank.
    pub admission: Vec<Rc<Admission>>,
    conns: RefCell<HashMap<u64, RawFd>>,
    next_id: Cell<u64>,
}

impl Local {
    /// `limits`: this thread's share of each rank's `max_running`.
    pub fn new(limits: &[usize], shared: &Shared) -> Local {
        let admission = limits.iter().enumerate().map(|(r, &limit)| {
            let mut stats = vec![shared.stats.clone()];
            if shared.multi_rank() {
                stats.push(shared.ranks[r].clone());
            }
            Admission::new(limit, stats)
        });
        Local {
            admission: admission.collect(),
            conns: RefCell::new(HashMap::new()),
            next_id: Cell::new(0),
        }
    }

    /// Shuts down every open connection socket so that its task ends.
    pub fn shutdown_all(&self) {
        for fd in self.conns.borrow().values() {
            // SAFETY: the fd belongs to a live connection of this thread.
            unsafe { libc::shutdown(*fd, libc::SHUT_RDWR) };
        }
    }

    pub fn open_conns(&self) -> usize {
        self.conns.borrow().len()
    }
}

struct ConnGuard(Rc<Local>, u64);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.conns.borrow_mut().remove(&self.1);
    }
}

type ReadOut = (OwnedReadHalf<TcpStream>, Vec<u8>, io::Result<usize>);

struct Reader {
    half: Option<OwnedReadHalf<TcpStream>>,
    buf: Option<Vec<u8>>,
    fut: Option<Pin<Box<dyn Future<Output = ReadOut>>>>,
    canceller: Canceller,
    eof: bool,
}

impl Reader {
    fn arm(&mut self) {
        if self.fut.is_some() || self.eof {
            return;
        }
        let (Some(mut half), Some(buf)) = (self.half.take(), self.buf.take()) else {
            return;
        };
        let handle = self.canceller.handle();
        self.fut = Some(Box::pin(async move {
            let (res, buf) = half.cancelable_read(buf, handle).await;
            (half, buf, res)
        }));
    }

    /// Ready(true): data appended to `rbuf` (and the read re-armed); Ready(false): the
    /// client closed or half-closed, or the socket failed.
    fn poll_recv(&mut self, cx: &mut Context<'_>, rbuf: &mut Vec<u8>) -> Poll<bool> {
        if self.eof {
            return Poll::Ready(false);
        }
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Pending;
        };
        let (half, mut buf, res) = match fut.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(out) => out,
        };
        self.fut = None;
        self.half = Some(half);
        match res {
            Ok(n) if n > 0 => {
                rbuf.extend_from_slice(&buf[..n]);
                buf.clear();
                self.buf = Some(buf);
                if rbuf.len() < READ_AHEAD_LIMIT {
                    self.arm();
                }
                Poll::Ready(true)
            }
            _ => {
                self.buf = Some(buf);
                self.eof = true;
                Poll::Ready(false)
            }
        }
    }

    /// Cancels the in-flight read (if any) and waits for it, so the socket is ours alone.
    async fn disarm(&mut self) {
        if let Some(fut) = self.fut.take() {
            self.canceller = std::mem::take(&mut self.canceller).cancel();
            let (half, buf, _) = fut.await;
            self.half = Some(half);
            self.buf = Some(buf);
        }
    }
}

/// A chat or completions prompt, keyed for the prefix cache and chunked for the LMCache
/// worker (each `None` when that model is off or the request has no prompt).
struct PromptQueries {
    prefix: Option<PrefixQuery>,
    #[cfg(feature = "zmq")]
    lmcache: Option<LmcacheQuery>,
}

enum Flow {
    KeepAlive,
    Close,
    Reset,
}

struct Conn {
    reader: Reader,
    w: Option<OwnedWriteHalf<TcpStream>>,
    rbuf: Vec<u8>,
    out: Vec<u8>,
    ev: Vec<u8>,
    shared: Arc<Shared>,
    local: Rc<Local>,
    /// The data-parallel rank of the request being answered (`None` before it is known).
    rank: Option<usize>,
}

fn emit(out: &mut Vec<u8>, ev: &mut Vec<u8>, chunked: bool) {
    if chunked {
        let _ = write!(out, "{:x}\r\n", ev.len());
        out.extend_from_slice(ev);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(ev);
    }
    ev.clear();
}

fn ms(v: Option<u64>, default: Duration) -> Duration {
    v.map(Duration::from_millis).unwrap_or(default)
}

/// What a route needs from the request body, taken while the body bytes are at hand.
enum RouteInput {
    /// The route reads no body.
    Nothing,
    /// An inference request's parsed body, prompt keys, P/D leg and rank.
    Inference(Box<InferenceInput>),
    /// An answer with its status (the P/D pull).
    Status(u16, Vec<u8>),
    /// `/mock/fault`'s parsed body.
    Fault(Result<FaultBody, String>),
    /// A JSON answer computed from the body (`/tokenize` and the task endpoints), or why
    /// the body was refused.
    Answer(Result<Vec<u8>, String>),
    /// The body itself (echo, LoRA load and unload).
    Bytes(Vec<u8>),
}

impl RouteInput {
    /// Reads `body` as `route` needs it.
    fn take(shared: &Shared, route: Route, body: &[u8]) -> RouteInput {
        match route {
            r if r.is_inference() => RouteInput::Inference(Box::new(InferenceInput {
                parsed: gen_body(route, body),
                queries: prompt_queries(shared, route, body),
                leg: pd_leg(shared, route, body),
                rank: Ok(0),
            })),
            Route::MockFault => RouteInput::Fault(fault_body(body)),
            Route::PdPull => match &shared.pd {
                Some(pd) if pd.cfg.role == PdRole::Prefill => match pd.pull(body) {
                    Ok(()) => RouteInput::Status(200, br#"{"status":"ok"}"#.to_vec()),
                    Err((status, msg)) => {
                        RouteInput::Status(status, shared.error_body(status, &msg))
                    }
                },
                _ => RouteInput::Status(404, shared.error_body(404, "Not Found")),
            },
            Route::Tokenize => {
                let cpt = shared.cache().map_or(
                    crate::PrefixCacheConfig::default().chars_per_token as usize,
                    |c| c.chars_per_token(),
                );
                RouteInput::Answer(api::tokenize_body(body, cpt))
            }
            r if r.is_task() => RouteInput::Answer(crate::endpoints::answer(r, body)),
            Route::Echo | Route::LoraLoad | Route::LoraUnload => RouteInput::Bytes(body.to_vec()),
            _ => RouteInput::Nothing,
        }
    }
}

/// What an inference request brings: its body, prompt keys, P/D leg and rank.
struct InferenceInput {
    parsed: Result<GenBody, String>,
    queries: PromptQueries,
    /// The P/D leg (with P/D on, for chat, completions and messages), or the 400's message.
    leg: Option<Result<Leg, String>>,
    /// The data-parallel rank it runs on, or the 400's message.
    rank: Result<u32, String>,
}

/// With P/D on, what a chat, completions or messages request's leg must do.
fn pd_leg(shared: &Shared, route: Route, body: &[u8]) -> Option<Result<Leg, String>> {
    let pd = shared.pd.as_ref()?;
    matches!(route, Route::Chat | Route::Completions | Route::Messages).then(|| pd.leg(body))
}

/// An inference request's body; required, and JSON. A generating request's tool call and
/// stop strings are decided here, while the body is at hand.
fn gen_body(route: Route, body: &[u8]) -> Result<GenBody, String> {
    if body.is_empty() {
        return Err("request body is required".to_string());
    }
    let mut gb: GenBody =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if let Some(api) = generating_api(route) {
        gb.decide(api, body);
    }
    Ok(gb)
}

/// `/mock/fault`'s body; empty (or blank) clears the fault.
fn fault_body(body: &[u8]) -> Result<FaultBody, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(FaultBody::default());
    }
    serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))
}

/// With the prefix cache on, a chat or completions prompt is keyed here (and chunked for
/// the LMCache worker) while the body bytes are at hand; the lookups themselves happen on
/// admission.
fn prompt_queries(shared: &Shared, route: Route, body: &[u8]) -> PromptQueries {
    let prompt = match (shared.cache(), route) {
        (Some(cache), Route::Chat | Route::Completions) => {
            prefix::canonical_prompt(body).map(|p| (cache, p))
        }
        _ => None,
    };
    PromptQueries {
        prefix: prompt.as_ref().map(|(cache, p)| cache.query(p)),
        #[cfg(feature = "zmq")]
        lmcache: prompt.as_ref().and_then(|(cache, p)| {
            let w = shared.lmcache.as_ref()?;
            Some(w.query(&prefix::token_ids(p, cache.chars_per_token())))
        }),
    }
}

/// The `/metrics` text: each rank's counters, then LoRA's and the LMCache worker's.
fn metrics_text(shared: &Shared) -> String {
    let (max_running, dp_size) = (shared.cfg.max_running, shared.cfg.dp_size);
    let ranks: Vec<(&Stats, usize)> = (shared.ranks.iter().enumerate())
        .map(|(r, s)| (&**s, crate::dp::rank_limit(max_running, dp_size, r as u32)))
        .collect();
    let mut text = crate::stats::render_metrics(&ranks, &shared.metrics_model);
    if let Some(l) = &shared.lora {
        l.render_metrics(&mut text);
    }
    #[cfg(feature = "zmq")]
    if let Some(w) = &shared.lmcache {
        w.render_metrics(&mut text, &shared.metrics_model);
    }
    text
}

/// The API that generates text on `route`; `None` for embeddings.
fn generating_api(route: Route) -> Option<Api> {
    match route {
        Route::Chat => Some(Api::Chat),
        Route::Completions => Some(Api::Completions),
        Route::Messages => Some(Api::Messages),
        Route::Responses => Some(Api::Responses),
        _ => None,
    }
}

/// How one inference answer goes, decided before admission: its faults, timing and size.
struct Plan {
    /// Reset the connection after this many token events.
    reset_after: Option<u32>,
    /// Stop answering after this many token events.
    stall_after: Option<u32>,
    ttft: Duration,
    itl: Duration,
    /// Token events: the text's tokens (up to a stop string), or a tool call's events.
    tokens: u32,
    /// Cut short by `max_tokens` (finish reason `length`).
    length: bool,
    /// How the answer ends: naturally, at a stop string or with a tool call.
    ending: Ending,
    prompt: u64,
}

/// Why an inference request is answered before admission.
enum Refusal {
    /// An error answer: status, message and Retry-After.
    Error(u16, String, Option<u64>),
    /// A connection reset before any byte of an answer.
    Reset,
}

impl Plan {
    /// Applies the `x-mock-*` overrides and the engine-wide fault to the configured
    /// behaviour; refuses an injected error status, a bad body and `max_tokens: 0`.
    fn new(
        ov: &Overrides,
        parsed: Result<GenBody, String>,
        fault: Option<&Fault>,
        cfg: &MockConfig,
        queries: &PromptQueries,
    ) -> Result<(GenBody, Plan), Refusal> {
        let status = ov.status.or(match fault {
            Some(Fault::Status(s)) => Some(*s),
            _ => None,
        });
        if let Some(status) = status {
            let msg = format!("mock engine injected error (status {status})");
            return Err(Refusal::Error(status, msg, ov.retry_after));
        }
        let gb = parsed.map_err(|msg| Refusal::Error(400, msg, None))?;
        let reset_after = ov.reset_after.or(match fault {
            Some(Fault::ResetAfter(n)) => Some(*n),
            _ => None,
        });
        let stall_after = ov
            .stall_after
            .or(matches!(fault, Some(Fault::Stall)).then_some(0));
        if reset_after == Some(0) {
            return Err(Refusal::Reset);
        }
        let max = gb.max_tokens();
        if max == Some(0) {
            let msg = "max_tokens must be at least 1, got 0.".to_string();
            return Err(Refusal::Error(400, msg, None));
        }
        let ttft = match fault {
            Some(Fault::Slow(d)) => *d,
            _ => cfg.ttft,
        };
        let natural = ov.tokens.unwrap_or(cfg.tokens);
        let (tokens, length) = match max {
            Some(m) if m < natural as u64 => (m as u32, true),
            _ => (natural, false),
        };
        let (tokens, length, ending) = api::choose_ending(&gb, tokens, length);
        let prompt = match &queries.prefix {
            Some(q) => q.prompt_tokens,
            None => gb.prompt_tokens(),
        };
        let plan = Plan {
            reset_after,
            stall_after,
            ttft: ms(ov.ttft_ms, ttft),
            itl: ms(ov.itl_ms, cfg.itl),
            tokens,
            length,
            ending,
            prompt,
        };
        Ok((gb, plan))
    }
}

/// A request holding a running slot, since `start`.
struct Admitted {
    permit: Permit,
    start: Instant,
}

/// An admitted generation on its way out.
struct Answer {
    gen: Gen,
    plan: Plan,
    admitted: Admitted,
    /// From admission to the first token: the TTFT plus the prefill of uncached tokens.
    first_token: Duration,
    /// A vLLM-protocol prefill: the whole answer carries `kv_transfer_params`.
    kv_params: bool,
    #[cfg(feature = "zmq")]
    lmcache: Option<LmcacheQuery>,
}

impl Answer {
    /// When token `i` is due.
    fn token_time(&self, i: u32) -> Instant {
        self.admitted.start + self.first_token + self.plan.itl * i
    }
}

pub(crate) async fn serve(stream: TcpStream, shared: Arc<Shared>, local: Rc<Local>) {
    let _ = stream.set_nodelay(true);
    inc(&shared.stats.connections);
    let id = local.next_id.get();
    local.next_id.set(id + 1);
    local.conns.borrow_mut().insert(id, stream.as_raw_fd());
    let _guard = ConnGuard(local.clone(), id);
    let (r, w) = stream.into_split();
    let mut conn = Conn {
        reader: Reader {
            half: Some(r),
            buf: Some(Vec::with_capacity(READ_CHUNK)),
            fut: None,
            canceller: Canceller::new(),
            eof: false,
        },
        w: Some(w),
        rbuf: Vec::with_capacity(READ_CHUNK),
        out: Vec::with_capacity(READ_CHUNK),
        ev: Vec::with_capacity(1024),
        shared,
        local,
        rank: None,
    };
    conn.reader.arm();
    let flow = conn.run().await;
    conn.reader.disarm().await;
    if let Flow::Reset = flow {
        if let (Some(r), Some(w)) = (conn.reader.half.take(), conn.w.take()) {
            if let Ok(stream) = r.reunite(w) {
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: valid fd and a properly sized linger struct.
                unsafe {
                    libc::setsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        &linger as *const libc::linger as *const libc::c_void,
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    );
                }
                drop(stream);
            }
        }
    }
}

impl Conn {
    async fn run(&mut self) -> Flow {
        let record = self.shared.cfg.record_requests;
        let mut sent_continue = false;
        loop {
            match http::parse(&self.rbuf, record) {
                Parse::Done(head, body, consumed) => {
                    sent_continue = false;
                    match self.handle(head, body, consumed).await {
                        Flow::KeepAlive => {}
                        other => return other,
                    }
                }
                Parse::Partial(expect) => {
                    if expect && !sent_continue {
                        sent_continue = true;
                        self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        if !self.flush().await {
                            return Flow::Close;
                        }
                    }
                    if !self.recv().await {
                        return Flow::Close;
                    }
                }
                Parse::Error(status, msg) => {
                    self.rbuf.clear();
                    let body = self.shared.error_body(status, msg);
                    let _ = self
                        .respond(status, "application/json", &body, true, None)
                        .await;
                    return Flow::Close;
                }
            }
        }
    }

    /// Waits for more request bytes; false when the client is gone.
    async fn recv(&mut self) -> bool {
        self.reader.arm();
        let (reader, rbuf) = (&mut self.reader, &mut self.rbuf);
        poll_fn(|cx| reader.poll_recv(cx, rbuf)).await
    }

    /// Runs `fut` while watching the client; `None` when the client went away first.
    async fn race<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        let mut fut = pin!(fut);
        let (reader, rbuf) = (&mut self.reader, &mut self.rbuf);
        poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            loop {
                match reader.poll_recv(cx, rbuf) {
                    Poll::Ready(true) => continue,
                    Poll::Ready(false) => return Poll::Ready(None),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await
    }

    /// Sleeps until `t` while watching the client; false when it went away.
    async fn wait_until(&mut self, t: Instant) -> bool {
        if t <= Instant::now() {
            return !self.reader.eof;
        }
        self.race(monoio::time::sleep_until(t)).await.is_some()
    }

    async fn flush(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let Some(w) = self.w.as_mut() else {
            return false;
        };
        let buf = std::mem::take(&mut self.out);
        let (res, mut buf) = w.write_all(buf).await;
        buf.clear();
        self.out = buf;
        res.is_ok()
    }

    async fn respond(
        &mut self,
        status: u16,
        ctype: &str,
        body: &[u8],
        close: bool,
        retry_after: Option<u64>,
    ) -> Flow {
        http::write_head(
            &mut self.out,
            status,
            ctype,
            Length::Fixed(body.len()),
            close,
            &self.shared.engine_header,
            retry_after,
        );
        self.out.extend_from_slice(body);
        if !self.flush().await || close {
            Flow::Close
        } else {
            Flow::KeepAlive
        }
    }

    async fn respond_error(
        &mut self,
        status: u16,
        msg: &str,
        close: bool,
        retry: Option<u64>,
    ) -> Flow {
        let body = self.shared.error_body(status, msg);
        self.respond(status, "application/json", &body, close, retry)
            .await
    }

    /// Answers one parsed request: takes what its route needs from the body, frees the
    /// request's bytes from the read buffer, then answers.
    async fn handle(&mut self, mut head: Head, body: Body, consumed: usize) -> Flow {
        if let Some((status, reply)) = crate::modes::refusal(&self.shared.cfg, &head) {
            drop(body);
            self.rbuf.drain(..consumed);
            self.keep_record(head.record.take());
            return self
                .respond(status, "application/json", &reply, head.close, None)
                .await;
        }
        let mut input = {
            let body_bytes: &[u8] = match &body {
                Body::Range(a, b) => &self.rbuf[*a..*b],
                Body::Owned(v) => v,
            };
            RouteInput::take(&self.shared, head.route, body_bytes)
        };
        drop(body);
        self.rbuf.drain(..consumed);
        let mut record = head.record.take();
        if let RouteInput::Inference(inf) = &mut input {
            let body_rank = inf.parsed.as_ref().ok().and_then(|g| g.data_parallel_rank);
            let (asked, rank) = crate::dp::choose(
                head.dp_rank.as_deref(),
                body_rank,
                self.shared.cfg.dp_size,
                &self.shared.rank_turn,
            );
            if let Some(r) = record.as_mut() {
                r.dp_rank = asked;
                r.ran_on_rank = *rank.as_ref().unwrap_or(&0);
            }
            inf.rank = rank;
        }
        self.keep_record(record);
        let close = head.close;
        match input {
            RouteInput::Inference(inf) => self.inference(head.route, head, *inf).await,
            RouteInput::Status(status, body) => {
                self.respond(status, "application/json", &body, close, None)
                    .await
            }
            RouteInput::Fault(fault_body) => self.set_fault(fault_body, close).await,
            RouteInput::Answer(Ok(body)) => {
                self.respond(200, "application/json", &body, close, None)
                    .await
            }
            RouteInput::Answer(Err(msg)) => self.respond_error(400, &msg, close, None).await,
            RouteInput::Bytes(body) if head.route == Route::Echo => {
                self.respond(200, "application/octet-stream", &body, close, None)
                    .await
            }
            RouteInput::Bytes(body) => self.lora_admin(head.route, &body, close).await,
            RouteInput::Nothing => self.answer_bodiless(head.route, close).await,
        }
    }

    /// Keeps a recorded request (when recording is on).
    fn keep_record(&self, record: Option<crate::RecordedRequest>) {
        if let Some(r) = record {
            self.shared.recorded.lock().unwrap().push(r);
        }
    }

    /// Answers a route that reads no body: health, models, metrics, stats, the prefix
    /// cache reset, and 404 / 405.
    async fn answer_bodiless(&mut self, route: Route, close: bool) -> Flow {
        let shared = self.shared.clone();
        match route {
            Route::Health => {
                let bad = matches!(shared.fault(), Some(Fault::Status(_)) | Some(Fault::Stall));
                let status = if bad { 503 } else { 200 };
                self.respond(status, "application/json", b"", close, None)
                    .await
            }
            Route::Models => {
                // An Anthropic engine lists its models in Anthropic's shape, adapters aside.
                let anthropic = shared.cfg.api == MockApi::Anthropic;
                let lora = shared.lora.as_ref().filter(|_| !anthropic);
                let dynamic = lora.map(|l| l.models_body(&shared.cfg.models));
                let body = dynamic.as_deref().unwrap_or(&shared.models_body);
                self.respond(200, "application/json", body, close, None)
                    .await
            }
            Route::Metrics => {
                let text = metrics_text(&shared);
                let ctype = "text/plain; version=0.0.4; charset=utf-8";
                self.respond(200, ctype, text.as_bytes(), close, None).await
            }
            Route::MockStats => {
                let body = serde_json::to_vec(&shared.stats.snapshot()).unwrap_or_default();
                self.respond(200, "application/json", &body, close, None)
                    .await
            }
            Route::ResetPrefixCache => {
                for cache in &shared.caches {
                    cache.clear();
                }
                self.respond(200, "application/json", b"", close, None)
                    .await
            }
            Route::MethodNotAllowed => {
                self.respond_error(405, "Method Not Allowed", close, None)
                    .await
            }
            // Route::NotFound: every other route takes an input from its body.
            _ => self.respond_error(404, "Not Found", close, None).await,
        }
    }

    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`; 404 with LoRA off.
    async fn lora_admin(&mut self, route: Route, body: &[u8], close: bool) -> Flow {
        let Some(l) = self.shared.lora.clone() else {
            return self.respond_error(404, "Not Found", close, None).await;
        };
        let (status, ctype, reply) = if route == Route::LoraLoad {
            l.load(body).await
        } else {
            l.unload(body)
        };
        self.respond(status, ctype, &reply, close, None).await
    }

    /// `POST /mock/fault`: sets (or clears) the engine-wide fault and answers with it.
    async fn set_fault(&mut self, fault_body: Result<FaultBody, String>, close: bool) -> Flow {
        let fb = match fault_body {
            Ok(fb) => fb,
            Err(msg) => return self.respond_error(400, &msg, close, None).await,
        };
        let fault = if let Some(s) = fb.status {
            Some(Fault::Status(s))
        } else if fb.stall == Some(true) {
            Some(Fault::Stall)
        } else {
            fb.reset_after.map(Fault::ResetAfter)
        };
        let desc = format!("{{\"fault\":{:?}}}", format!("{fault:?}"));
        self.shared.set_fault(fault);
        self.respond(200, "application/json", desc.as_bytes(), close, None)
            .await
    }

    /// Applies `f` to the engine's counters and, with several ranks, to the current
    /// request's rank's.
    fn count(&self, f: impl Fn(&Stats)) {
        f(&self.shared.stats);
        if let (true, Some(r)) = (self.shared.multi_rank(), self.rank) {
            f(&self.shared.ranks[r]);
        }
    }

    fn abort(&mut self, head: &Head, emitted: u64) -> Flow {
        self.count(|stats| {
            inc(&stats.aborted);
            inc(&stats.finished_abort);
            stats.generation_tokens.fetch_add(emitted, Relaxed);
        });
        self.shared
            .aborted_ids
            .lock()
            .unwrap()
            .push(head.request_id.clone().unwrap_or_default());
        Flow::Close
    }

    /// Holds the connection without answering until the client goes away.
    async fn stall(&mut self, head: &Head, emitted: u64) -> Flow {
        let _ = self.flush().await;
        inc(&self.shared.stats.faulted);
        self.race(std::future::pending::<()>()).await;
        self.abort(head, emitted)
    }

    async fn reset(&mut self, emitted: u64) -> Flow {
        let _ = self.flush().await;
        inc(&self.shared.stats.faulted);
        self.count(|stats| {
            stats.generation_tokens.fetch_add(emitted, Relaxed);
        });
        Flow::Reset
    }

    /// Answers an inference request: the refusals decided up front, the P/D leg's wait for
    /// its peer, then admission, the prefix-cache lookup, and the answer (an embedding, a
    /// whole body or a stream).
    async fn inference(&mut self, route: Route, head: Head, input: InferenceInput) -> Flow {
        let shared = self.shared.clone();
        let (gb, plan, leg, queries) = match self.prepare(&head, input) {
            Ok(prepared) => prepared,
            Err(Refusal::Reset) => return self.reset(0).await,
            Err(Refusal::Error(status, msg, retry_after)) => {
                self.count(|s| inc(&s.completed));
                return self
                    .respond_error(status, &msg, head.close, retry_after)
                    .await;
            }
        };
        let model = gb.model.as_deref().unwrap_or(&shared.default_model);
        self.count(|s| {
            s.prompt_tokens.fetch_add(plan.prompt, Relaxed);
        });
        if let Some(leg) = &leg {
            if let Err(flow) = self.pd_gate(&head, leg).await {
                return flow;
            }
        }
        let (admitted, _lora_slot) = match self.admit(&head, model).await {
            Ok(admitted) => admitted,
            Err(flow) => return flow,
        };
        if plan.stall_after == Some(0) {
            return self.stall(&head, 0).await;
        }
        let decode = matches!(leg, Some(Leg::VllmDecode(..) | Leg::SglangDecode(..)));
        // A decode's prompt was prefilled elsewhere: all of it counts as cached.
        let (first_token, cached_tokens) = match decode {
            true => (plan.ttft, Some(plan.prompt)),
            false => self.cache_lookup(plan.ttft, &queries),
        };
        let Some(api) = generating_api(route) else {
            return self.embeddings(&head, model, &plan, admitted).await;
        };
        let include_usage = gb
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let mut gen = Gen::new(
            api,
            model,
            plan.prompt,
            plan.tokens,
            plan.length,
            include_usage,
        )
        .with_ending(plan.ending.clone());
        gen.cached_tokens = cached_tokens;
        gen.ping = shared.cfg.api == MockApi::Anthropic;
        let kv_params = leg == Some(Leg::VllmPrefill);
        let answer = Answer {
            gen,
            plan,
            admitted,
            first_token,
            kv_params,
            #[cfg(feature = "zmq")]
            lmcache: queries.lmcache.filter(|_| !decode),
        };
        if gb.stream.unwrap_or(false) && !kv_params {
            self.answer_stream(&head, answer).await
        } else {
            self.answer_whole(&head, answer).await
        }
    }

    /// The refusals decided before anything waits: a rank out of range, the overrides and
    /// faults of [`Plan::new`], and a P/D leg without its fields (counted as refused).
    fn prepare(
        &mut self,
        head: &Head,
        input: InferenceInput,
    ) -> Result<(GenBody, Plan, Option<Leg>, PromptQueries), Refusal> {
        let InferenceInput {
            parsed,
            queries,
            leg,
            rank,
        } = input;
        self.rank = None;
        inc(&self.shared.stats.requests);
        let rank = rank.map_err(|msg| Refusal::Error(400, msg, None))?;
        self.rank = Some(rank as usize);
        if self.shared.multi_rank() {
            inc(&self.shared.ranks[rank as usize].requests);
        }
        let fault = self.shared.fault();
        let (gb, plan) = Plan::new(&head.ov, parsed, fault.as_ref(), &self.shared.cfg, &queries)?;
        let leg = match leg {
            Some(Err(msg)) => {
                if let Some(pd) = &self.shared.pd {
                    inc(&pd.counters.refused);
                }
                return Err(Refusal::Error(400, msg, None));
            }
            Some(Ok(leg)) => Some(leg),
            None => None,
        };
        Ok((gb, plan, leg, queries))
    }

    /// A P/D leg's wait for its peer, raced against the client: a vLLM decode pulls its
    /// blocks, an SGLang prefill waits for the decode of each room, an SGLang decode
    /// hand-shakes each room. `Err`: the flow of the refusal or of the abort.
    async fn pd_gate(&mut self, head: &Head, leg: &Leg) -> Result<(), Flow> {
        let Some(pd) = self.shared.pd.clone() else {
            return Ok(());
        };
        let limit = pd.cfg.handshake_timeout;
        match leg {
            Leg::VllmPrefill => {}
            Leg::VllmDecode(remote, engine_id, blocks) => {
                let body = serde_json::json!({
                    "engine_id": engine_id, "block_ids": blocks, "request_id": head.request_id,
                });
                let body = body.to_string().into_bytes();
                let pull = pd::post_json(&remote.host, remote.port, "/mock/pd/pull", body, limit);
                match self.race(pull).await {
                    None => return Err(self.abort(head, 0)),
                    Some(Ok(200)) => {}
                    Some(_) => return Err(self.pd_refuse(head, 400, "unknown blocks").await),
                }
            }
            Leg::SglangPrefill(rooms) => {
                pd.register_rooms(rooms);
                match self.race(pd.await_decodes(rooms)).await {
                    None => {
                        pd.forget_rooms(rooms);
                        return Err(self.abort(head, 0));
                    }
                    Some(Ok(())) => {}
                    Some(Err(room)) => {
                        inc(&pd.counters.handshake_timeouts);
                        self.count(|s| inc(&s.completed));
                        let msg = format!("no decode connected for bootstrap_room {room}");
                        return Err(self.respond_error(500, &msg, head.close, None).await);
                    }
                }
            }
            Leg::SglangDecode(remote, rooms) => {
                for room in rooms {
                    self.handshake(head, remote, *room, limit).await?;
                }
            }
        }
        inc(match pd.cfg.role {
            PdRole::Prefill => &pd.counters.prefills,
            PdRole::Decode => &pd.counters.decodes,
        });
        Ok(())
    }

    /// An SGLang decode's handshake for one room with the prefill's bootstrap server (which
    /// itself waits up to the time limit for the prefill's request).
    async fn handshake(
        &mut self,
        head: &Head,
        remote: &pd::Remote,
        room: u64,
        limit: Duration,
    ) -> Result<(), Flow> {
        let body = serde_json::json!({ "room": room }).to_string().into_bytes();
        let (host, port) = (remote.host.as_str(), remote.port);
        // The server waits up to its own limit for the prefill: allow for its answer.
        let call = pd::post_json(host, port, "/mock/bootstrap", body, limit + SLACK);
        let (status, msg) = match self.race(call).await {
            None => return Err(self.abort(head, 0)),
            Some(Ok(200)) => return Ok(()),
            Some(Ok(status)) => (
                400,
                format!("bootstrap_room {room} is unknown to the prefill at {host}:{port} (status {status})"),
            ),
            Some(Err(e)) => (
                500,
                format!("cannot hand-shake bootstrap_room {room} with {host}:{port}: {e}"),
            ),
        };
        Err(self.pd_refuse(head, status, &msg).await)
    }

    /// Answers a P/D leg whose peer failed it, counted as refused.
    async fn pd_refuse(&mut self, head: &Head, status: u16, msg: &str) -> Flow {
        if let Some(pd) = &self.shared.pd {
            inc(&pd.counters.refused);
        }
        self.count(|s| inc(&s.completed));
        self.respond_error(status, msg, head.close, None).await
    }

    /// Admits the request while watching the client: a LoRA adapter's slot (with LoRA on),
    /// then a running slot. `Err`: the flow when the client went away first, or when the
    /// model was answered as unknown.
    async fn admit(
        &mut self,
        head: &Head,
        model: &str,
    ) -> Result<(Admitted, Option<LoraSlot>), Flow> {
        if self.reader.eof {
            return Err(self.abort(head, 0));
        }
        let lora_slot = self.lora_admit(head, model).await?;
        let admission = self.local.admission[self.rank.unwrap_or(0)].clone();
        let Some(permit) = self.race(admission.acquire()).await else {
            return Err(self.abort(head, 0));
        };
        let start = Instant::now();
        Ok((Admitted { permit, start }, lora_slot))
    }

    /// Prefix-cache (and LMCache) lookup on admission, as vLLM's scheduler does: the prompt
    /// tokens neither holds add their prefill time to the constant TTFT. Returns the delay
    /// to the first token and, with the cache on, the cached prompt tokens.
    fn cache_lookup(&self, ttft: Duration, queries: &PromptQueries) -> (Duration, Option<u64>) {
        let shared = &self.shared;
        let cache = shared.caches.get(self.rank.unwrap_or(0));
        let (Some(cache), Some(q)) = (cache, &queries.prefix) else {
            return (ttft, None);
        };
        #[cfg_attr(not(feature = "zmq"), allow(unused_mut))]
        let mut hit = cache.lookup(q);
        self.count(|stats| {
            stats
                .prefix_cache_queries
                .fetch_add(hit.prompt_tokens, Relaxed);
            stats
                .prefix_cache_hits
                .fetch_add(hit.cached_tokens, Relaxed);
        });
        #[cfg(feature = "zmq")]
        if let (Some(w), Some(lq)) = (&shared.lmcache, &queries.lmcache) {
            let external = w.lookup(lq).min(hit.prompt_tokens);
            hit.cached_tokens = hit.cached_tokens.max(external);
        }
        (cache.first_token_delay(ttft, &hit), Some(hit.cached_tokens))
    }

    /// An embeddings answer: one forward pass, due a TTFT after admission.
    async fn embeddings(&mut self, head: &Head, model: &str, plan: &Plan, a: Admitted) -> Flow {
        if !self.wait_until(a.start + plan.ttft).await {
            return self.abort(head, 0);
        }
        let mut body = std::mem::take(&mut self.ev);
        body.clear();
        api::embeddings_body(&mut body, model, plan.prompt);
        // Counters first, so a client that has read the answer sees them.
        self.count(|stats| {
            inc(&stats.completed);
            inc(&stats.finished_stop);
        });
        drop(a.permit);
        let flow = self
            .respond(200, "application/json", &body, head.close, None)
            .await;
        body.clear();
        self.ev = body;
        flow
    }

    /// A whole (non-streamed) answer: written once its last token is due, unless a reset
    /// or stall fault comes first.
    async fn answer_whole(&mut self, head: &Head, a: Answer) -> Flow {
        let plan = &a.plan;
        let tokens = plan.tokens;
        let fault_at = match (plan.reset_after, plan.stall_after) {
            (Some(r), Some(s)) => Some(r.min(s)),
            (r, s) => r.or(s),
        }
        .filter(|&n| n <= tokens);
        let last = fault_at.unwrap_or(tokens).max(1) - 1;
        #[cfg(feature = "zmq")]
        if let Some(q) = &a.lmcache {
            if !self.wait_until(a.token_time(0)).await {
                return self.abort(head, 0);
            }
            self.lmcache_store(q);
        }
        if !self.wait_until(a.token_time(last)).await {
            return self.abort(head, 0);
        }
        if let Some(n) = fault_at {
            if plan.reset_after == Some(n) {
                return self.reset(n as u64).await;
            }
            return self.stall(head, n as u64).await;
        }
        let mut body = std::mem::take(&mut self.ev);
        body.clear();
        a.gen.full_body(&mut body);
        if let (true, Some(pd)) = (a.kv_params, &self.shared.pd) {
            // The answer's top-level `kv_transfer_params`, before its closing brace.
            let params = pd.hold_blocks(plan.prompt);
            if body.pop() == Some(b'}') {
                let _ = write!(body, ",\"kv_transfer_params\":{params}}}");
            }
        }
        self.finish(a.gen.completion_tokens(), plan.length, a.admitted.permit);
        let close = head.close;
        let ok = self.flush_response(&body, close).await;
        body.clear();
        self.ev = body;
        if ok && !close {
            Flow::KeepAlive
        } else {
            Flow::Close
        }
    }

    /// A streamed answer: the opening events, one event per token, the closing events and
    /// (chunked) the last chunk. An HTTP/1.0 client gets a close-delimited stream.
    async fn answer_stream(&mut self, head: &Head, mut a: Answer) -> Flow {
        let chunked = !head.http10;
        let close = head.close || head.http10;
        if let Err(flow) = self.open_stream(head, &mut a, chunked, close).await {
            return flow;
        }
        if let Err(flow) = self.stream_tokens(head, &mut a, chunked).await {
            return flow;
        }
        {
            let (out, ev) = (&mut self.out, &mut self.ev);
            a.gen
                .end_events(ev, &mut |ev: &mut Vec<u8>| emit(out, ev, chunked));
        }
        if chunked {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.finish(a.gen.completion_tokens(), a.plan.length, a.admitted.permit);
        if self.flush().await && !close {
            Flow::KeepAlive
        } else {
            Flow::Close
        }
    }

    /// Writes the stream's head (at once when the first token is not immediate), waits for
    /// the first token and emits the events before it.
    async fn open_stream(
        &mut self,
        head: &Head,
        a: &mut Answer,
        chunked: bool,
        close: bool,
    ) -> Result<(), Flow> {
        let len = if chunked {
            Length::Chunked
        } else {
            Length::Close
        };
        let engine_header = &self.shared.engine_header;
        http::write_head(
            &mut self.out,
            200,
            "text/event-stream",
            len,
            close,
            engine_header,
            None,
        );
        if !a.first_token.is_zero() && !self.flush().await {
            return Err(self.abort(head, 0));
        }
        if !self.wait_until(a.token_time(0)).await {
            return Err(self.abort(head, 0));
        }
        #[cfg(feature = "zmq")]
        if let Some(q) = &a.lmcache {
            self.lmcache_store(q);
        }
        let (out, ev) = (&mut self.out, &mut self.ev);
        a.gen
            .start_events(ev, &mut |ev: &mut Vec<u8>| emit(out, ev, chunked));
        Ok(())
    }

    /// Emits one event per token (or tool-call piece) as each is due; `Err` with the flow
    /// when the client went away or a reset or stall fault cut the stream.
    async fn stream_tokens(
        &mut self,
        head: &Head,
        a: &mut Answer,
        chunked: bool,
    ) -> Result<(), Flow> {
        let (tokens, itl) = (a.plan.tokens, a.plan.itl);
        let mut emitted = 0u64;
        // Zero tokens still produce one (empty) event carrying the finish reason.
        for i in 0..tokens.max(1) {
            if i > 0
                && !itl.is_zero()
                && (!self.flush().await || !self.wait_until(a.token_time(i)).await)
            {
                return Err(self.abort(head, emitted));
            }
            a.gen.token_event(i, &mut self.ev);
            emit(&mut self.out, &mut self.ev, chunked);
            if i < tokens {
                emitted += 1;
            }
            // Without an inter-token delay, still write as the answer grows, so a client
            // that stops reading or goes away mid-answer is seen (and counted) as an abort.
            if self.out.len() >= STREAM_FLUSH_BYTES && !self.flush().await {
                return Err(self.abort(head, emitted));
            }
            if a.plan.reset_after == Some(emitted as u32) {
                return Err(self.reset(emitted).await);
            }
            if a.plan.stall_after == Some(emitted as u32) {
                return Err(self.stall(head, emitted).await);
            }
        }
        Ok(())
    }

    /// Once a prompt's prefill is done, the LMCache worker stores its chunks.
    #[cfg(feature = "zmq")]
    fn lmcache_store(&self, q: &LmcacheQuery) {
        if let Some(w) = &self.shared.lmcache {
            w.store(q);
        }
    }

    /// With LoRA on: a base model passes, a registered adapter waits for its slot (and its
    /// load into the GPU), anything else is answered with vLLM's 404 (an Anthropic
    /// engine's `not_found_error`).
    async fn lora_admit(&mut self, head: &Head, model: &str) -> Result<Option<LoraSlot>, Flow> {
        let Some(l) = self.shared.lora.clone() else {
            return Ok(None);
        };
        match l.classify(model, &self.shared.cfg.models) {
            lora::Kind::Base => Ok(None),
            lora::Kind::Unknown => {
                self.count(|s| inc(&s.completed));
                let (status, ctype, mut body) = lora::unknown_model(model);
                if self.shared.cfg.api == MockApi::Anthropic {
                    body = self.shared.error_body(status, &format!("model: {model}"));
                }
                Err(self.respond(status, ctype, &body, head.close, None).await)
            }
            lora::Kind::Adapter => {
                let stats = self.shared.stats.clone();
                let Some(slot) = self.race(l.clone().acquire(model.to_string(), stats)).await
                else {
                    return Err(self.abort(head, 0));
                };
                let delay = l.load_delay();
                if slot.loaded && !delay.is_zero() && !self.wait_until(Instant::now() + delay).await
                {
                    return Err(self.abort(head, 0));
                }
                Ok(Some(slot))
            }
        }
    }

    async fn flush_response(&mut self, body: &[u8], close: bool) -> bool {
        http::write_head(
            &mut self.out,
            200,
            "application/json",
            Length::Fixed(body.len()),
            close,
            &self.shared.engine_header,
            None,
        );
        self.out.extend_from_slice(body);
        self.flush().await
    }

    /// Accounts a completed answer (before its last bytes are written, so a client that
    /// has read the answer sees the counters updated) and frees its slot.
    fn finish(&mut self, tokens: u64, length: bool, permit: Permit) {
        drop(permit);
        self.count(|stats| {
            stats.generation_tokens.fetch_add(tokens, Relaxed);
            inc(&stats.completed);
            inc(if length {
                &stats.finished_length
            } else {
                &stats.finished_stop
            });
        });
    }
}
