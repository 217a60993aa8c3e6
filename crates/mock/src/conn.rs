//! One client connection: the request loop, the always-armed read used for abort
//! detection and pipelining, admission, answer timing and fault injection.
//!
//! A `recv` is kept in flight on the socket for the whole life of the connection (also
//! while an answer is being generated), so a client that goes away (or half-closes) is
//! noticed at once, and bytes of a pipelined next request are appended to the read
//! buffer instead of being lost. The read op is only ever cancelled (and then awaited)
//! when the connection itself is closed.

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

use crate::admission::Admission;
use crate::api::{self, Api, FaultBody, Gen, GenBody};
use crate::http::{self, Body, Head, Length, Parse, Route};
#[cfg(feature = "zmq")]
use crate::lmcache_worker::LmcacheQuery;
use crate::lora::{self, LoraSlot};
use crate::prefix::{self, PrefixQuery};
use crate::stats::{inc, Stats};
use crate::{Fault, Shared};

const READ_CHUNK: usize = 16 * 1024;
/// Stop reading ahead when this many unprocessed bytes are buffered.
const READ_AHEAD_LIMIT: usize = 1024 * 1024;
/// A stream's buffered events are written once they reach this size.
const STREAM_FLUSH_BYTES: usize = 64 * 1024;

/// Per-thread state.
pub(crate) struct Local {
    pub admission: Rc<Admission>,
    conns: RefCell<HashMap<u64, RawFd>>,
    next_id: Cell<u64>,
}

impl Local {
    pub fn new(limit: usize, stats: Arc<Stats>) -> Local {
        Local {
            admission: Admission::new(limit, stats),
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
                    let body = api::error_body(status, msg);
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
        let body = api::error_body(status, msg);
        self.respond(status, "application/json", &body, close, retry)
            .await
    }

    async fn handle(&mut self, mut head: Head, body: Body, consumed: usize) -> Flow {
        if let Some(r) = head.record.take() {
            self.shared.recorded.lock().unwrap().push(r);
        }
        let close = head.close;
        let body_bytes: &[u8] = match &body {
            Body::Range(a, b) => &self.rbuf[*a..*b],
            Body::Owned(v) => v,
        };
        let parsed: Option<Result<GenBody, String>> = if head.route.is_inference() {
            Some(if body_bytes.is_empty() {
                Err("request body is required".to_string())
            } else {
                serde_json::from_slice(body_bytes).map_err(|e| format!("invalid JSON body: {e}"))
            })
        } else {
            None
        };
        let fault_body: Option<Result<FaultBody, String>> =
            (head.route == Route::MockFault).then(|| {
                if body_bytes.iter().all(u8::is_ascii_whitespace) {
                    Ok(FaultBody::default())
                } else {
                    serde_json::from_slice(body_bytes)
                        .map_err(|e| format!("invalid JSON body: {e}"))
                }
            });
        let tokenized: Option<Result<Vec<u8>, String>> =
            (head.route == Route::Tokenize).then(|| {
                let cpt = self.shared.prefix.as_ref().map_or(
                    crate::PrefixCacheConfig::default().chars_per_token as usize,
                    |c| c.chars_per_token(),
                );
                api::tokenize_body(body_bytes, cpt)
            });
        // With the prefix cache on, chat and completions prompts are keyed here (and
        // chunked for the LMCache worker), while the body bytes are at hand; the lookups
        // themselves happen on admission.
        let prompt = match (&self.shared.prefix, head.route) {
            (Some(cache), Route::Chat | Route::Completions) => {
                prefix::canonical_prompt(body_bytes).map(|p| (cache, p))
            }
            _ => None,
        };
        let prefix_query = prompt.as_ref().map(|(cache, p)| cache.query(p));
        #[cfg(feature = "zmq")]
        let lmcache_query = prompt.as_ref().and_then(|(cache, p)| {
            let w = self.shared.lmcache.as_ref()?;
            Some(w.query(&prefix::token_ids(p, cache.chars_per_token())))
        });
        let task: Option<Result<Vec<u8>, String>> = head
            .route
            .is_task()
            .then(|| crate::endpoints::answer(head.route, body_bytes));
        let echo: Option<Vec<u8>> = (head.route == Route::Echo).then(|| body_bytes.to_vec());
        let lora_body: Option<Vec<u8>> =
            matches!(head.route, Route::LoraLoad | Route::LoraUnload).then(|| body_bytes.to_vec());
        drop(body);
        self.rbuf.drain(..consumed);

        let shared = self.shared.clone();
        match head.route {
            Route::Health => {
                let bad = matches!(shared.fault(), Some(Fault::Status(_)) | Some(Fault::Stall));
                let status = if bad { 503 } else { 200 };
                self.respond(status, "application/json", b"", close, None)
                    .await
            }
            Route::Models => {
                let dynamic = shared
                    .lora
                    .as_ref()
                    .map(|l| l.models_body(&shared.cfg.models));
                let body = dynamic.as_deref().unwrap_or(&shared.models_body);
                self.respond(200, "application/json", body, close, None)
                    .await
            }
            Route::LoraLoad | Route::LoraUnload => {
                let Some(l) = shared.lora.clone() else {
                    return self.respond_error(404, "Not Found", close, None).await;
                };
                let body = lora_body.unwrap_or_default();
                let (status, ctype, reply) = if head.route == Route::LoraLoad {
                    l.load(&body).await
                } else {
                    l.unload(&body)
                };
                self.respond(status, ctype, &reply, close, None).await
            }
            Route::Metrics => {
                let mut text = shared
                    .stats
                    .render_metrics(&shared.metrics_model, shared.cfg.max_running);
                if let Some(l) = &shared.lora {
                    l.render_metrics(&mut text);
                }
                #[cfg(feature = "zmq")]
                if let Some(w) = &shared.lmcache {
                    w.render_metrics(&mut text, &shared.metrics_model);
                }
                self.respond(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text.as_bytes(),
                    close,
                    None,
                )
                .await
            }
            Route::MockStats => {
                let body = serde_json::to_vec(&shared.stats.snapshot()).unwrap_or_default();
                self.respond(200, "application/json", &body, close, None)
                    .await
            }
            Route::MockFault => match fault_body.unwrap_or_else(|| Ok(FaultBody::default())) {
                Ok(fb) => {
                    let fault = if let Some(s) = fb.status {
                        Some(Fault::Status(s))
                    } else if fb.stall == Some(true) {
                        Some(Fault::Stall)
                    } else {
                        fb.reset_after.map(Fault::ResetAfter)
                    };
                    let desc = format!("{{\"fault\":{:?}}}", format!("{fault:?}"));
                    shared.set_fault(fault);
                    self.respond(200, "application/json", desc.as_bytes(), close, None)
                        .await
                }
                Err(msg) => self.respond_error(400, &msg, close, None).await,
            },
            Route::Tokenize => match tokenized.unwrap_or_else(|| Err("missing body".into())) {
                Ok(body) => {
                    self.respond(200, "application/json", &body, close, None)
                        .await
                }
                Err(msg) => self.respond_error(400, &msg, close, None).await,
            },
            route if route.is_task() => match task.unwrap_or_else(|| Err("missing body".into())) {
                Ok(body) => {
                    self.respond(200, "application/json", &body, close, None)
                        .await
                }
                Err(msg) => self.respond_error(400, &msg, close, None).await,
            },
            Route::Echo => {
                let body = echo.unwrap_or_default();
                self.respond(200, "application/octet-stream", &body, close, None)
                    .await
            }
            Route::ResetPrefixCache => {
                if let Some(cache) = &shared.prefix {
                    cache.clear();
                }
                self.respond(200, "application/json", b"", close, None)
                    .await
            }
            Route::NotFound => self.respond_error(404, "Not Found", close, None).await,
            Route::MethodNotAllowed => {
                self.respond_error(405, "Method Not Allowed", close, None)
                    .await
            }
            route => {
                let parsed = parsed.unwrap_or_else(|| Err("missing body".into()));
                let prompt = PromptQueries {
                    prefix: prefix_query,
                    #[cfg(feature = "zmq")]
                    lmcache: lmcache_query,
                };
                self.inference(route, head, parsed, prompt).await
            }
        }
    }

    fn abort(&mut self, head: &Head, emitted: u64) -> Flow {
        let stats = &self.shared.stats;
        inc(&stats.aborted);
        inc(&stats.finished_abort);
        stats.generation_tokens.fetch_add(emitted, Relaxed);
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
        let stats = &self.shared.stats;
        inc(&stats.faulted);
        stats.generation_tokens.fetch_add(emitted, Relaxed);
        Flow::Reset
    }

    async fn inference(
        &mut self,
        route: Route,
        head: Head,
        parsed: Result<GenBody, String>,
        prompt_queries: PromptQueries,
    ) -> Flow {
        let PromptQueries {
            prefix: prefix_query,
            #[cfg(feature = "zmq")]
                lmcache: lmcache_query,
        } = prompt_queries;
        let shared = self.shared.clone();
        let cfg = &shared.cfg;
        let stats = &shared.stats;
        inc(&stats.requests);
        let close = head.close;
        let ov = &head.ov;
        let engine_fault = shared.fault();
        let status = ov.status.or(match engine_fault {
            Some(Fault::Status(s)) => Some(s),
            _ => None,
        });
        if let Some(status) = status {
            inc(&stats.completed);
            let msg = format!("mock engine injected error (status {status})");
            return self
                .respond_error(status, &msg, close, ov.retry_after)
                .await;
        }
        let gb = match parsed {
            Ok(gb) => gb,
            Err(msg) => {
                inc(&stats.completed);
                return self.respond_error(400, &msg, close, None).await;
            }
        };
        let reset_after = ov.reset_after.or(match engine_fault {
            Some(Fault::ResetAfter(n)) => Some(n),
            _ => None,
        });
        let stall_after = ov
            .stall_after
            .or(matches!(engine_fault, Some(Fault::Stall)).then_some(0));
        if reset_after == Some(0) {
            return self.reset(0).await;
        }
        let max = gb.max_tokens();
        if max == Some(0) {
            inc(&stats.completed);
            return self
                .respond_error(400, "max_tokens must be at least 1, got 0.", close, None)
                .await;
        }
        let ttft = ms(
            ov.ttft_ms,
            match engine_fault {
                Some(Fault::Slow(d)) => d,
                _ => cfg.ttft,
            },
        );
        let itl = ms(ov.itl_ms, cfg.itl);
        let natural = ov.tokens.unwrap_or(cfg.tokens);
        let (tokens, length) = match max {
            Some(m) if m < natural as u64 => (m as u32, true),
            _ => (natural, false),
        };
        let model = gb.model.as_deref().unwrap_or(&shared.default_model);
        let prompt = match &prefix_query {
            Some(q) => q.prompt_tokens,
            None => gb.prompt_tokens(),
        };
        stats.prompt_tokens.fetch_add(prompt, Relaxed);

        if self.reader.eof {
            return self.abort(&head, 0);
        }
        let _lora_slot = match self.lora_admit(&head, model).await {
            Ok(slot) => slot,
            Err(flow) => return flow,
        };
        let admission = self.local.admission.clone();
        let Some(permit) = self.race(admission.acquire()).await else {
            return self.abort(&head, 0);
        };
        let start = Instant::now();
        if stall_after == Some(0) {
            return self.stall(&head, 0).await;
        }
        // Prefix-cache (and LMCache) lookup on admission, as vLLM's scheduler does; the
        // prompt tokens neither holds add their prefill time to the constant TTFT.
        let (first_token, cached_tokens) = match (&shared.prefix, &prefix_query) {
            (Some(cache), Some(q)) => {
                #[cfg_attr(not(feature = "zmq"), allow(unused_mut))]
                let mut hit = cache.lookup(q);
                stats
                    .prefix_cache_queries
                    .fetch_add(hit.prompt_tokens, Relaxed);
                stats
                    .prefix_cache_hits
                    .fetch_add(hit.cached_tokens, Relaxed);
                #[cfg(feature = "zmq")]
                if let (Some(w), Some(lq)) = (&shared.lmcache, &lmcache_query) {
                    let external = w.lookup(lq).min(hit.prompt_tokens);
                    hit.cached_tokens = hit.cached_tokens.max(external);
                }
                (cache.first_token_delay(ttft, &hit), Some(hit.cached_tokens))
            }
            _ => (ttft, None),
        };

        let api = match route {
            Route::Chat => Api::Chat,
            Route::Completions => Api::Completions,
            Route::Messages => Api::Messages,
            Route::Responses => Api::Responses,
            _ => {
                // Embeddings: one forward pass.
                if !self.wait_until(start + ttft).await {
                    return self.abort(&head, 0);
                }
                let mut body = std::mem::take(&mut self.ev);
                body.clear();
                api::embeddings_body(&mut body, model, prompt);
                // Counters first, so a client that has read the answer sees them.
                inc(&stats.completed);
                inc(&stats.finished_stop);
                drop(permit);
                let flow = self
                    .respond(200, "application/json", &body, close, None)
                    .await;
                body.clear();
                self.ev = body;
                return flow;
            }
        };
        let stream = gb.stream.unwrap_or(false);
        let include_usage = gb
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let mut gen = Gen::new(api, model, prompt, tokens, length, include_usage);
        gen.cached_tokens = cached_tokens;
        let token_time = |i: u32| start + first_token + itl * i;

        if !stream {
            let fault_at = match (reset_after, stall_after) {
                (Some(r), Some(s)) => Some(r.min(s)),
                (r, s) => r.or(s),
            }
            .filter(|&n| n <= tokens);
            let last = fault_at.unwrap_or(tokens).max(1) - 1;
            #[cfg(feature = "zmq")]
            if let Some(q) = &lmcache_query {
                if !self.wait_until(token_time(0)).await {
                    return self.abort(&head, 0);
                }
                self.lmcache_store(q);
            }
            if !self.wait_until(token_time(last)).await {
                return self.abort(&head, 0);
            }
            if let Some(n) = fault_at {
                if reset_after == Some(n) {
                    return self.reset(n as u64).await;
                }
                return self.stall(&head, n as u64).await;
            }
            let mut body = std::mem::take(&mut self.ev);
            body.clear();
            gen.full_body(&mut body);
            self.finish(tokens as u64, length, permit);
            let ok = self.flush_response(&body, close).await;
            body.clear();
            self.ev = body;
            return if ok && !close {
                Flow::KeepAlive
            } else {
                Flow::Close
            };
        }

        let chunked = !head.http10;
        let close = close || head.http10;
        let len = if chunked {
            Length::Chunked
        } else {
            Length::Close
        };
        http::write_head(
            &mut self.out,
            200,
            "text/event-stream",
            len,
            close,
            &shared.engine_header,
            None,
        );
        if !first_token.is_zero() && !self.flush().await {
            return self.abort(&head, 0);
        }
        if !self.wait_until(token_time(0)).await {
            return self.abort(&head, 0);
        }
        #[cfg(feature = "zmq")]
        if let Some(q) = &lmcache_query {
            self.lmcache_store(q);
        }
        {
            let (out, ev) = (&mut self.out, &mut self.ev);
            gen.start_events(ev, &mut |ev: &mut Vec<u8>| emit(out, ev, chunked));
        }
        let mut emitted = 0u64;
        // Zero tokens still produce one (empty) event carrying the finish reason.
        for i in 0..tokens.max(1) {
            if i > 0
                && !itl.is_zero()
                && (!self.flush().await || !self.wait_until(token_time(i)).await)
            {
                return self.abort(&head, emitted);
            }
            gen.token_event(i, &mut self.ev);
            emit(&mut self.out, &mut self.ev, chunked);
            if i < tokens {
                emitted += 1;
            }
            // Without an inter-token delay, still write as the answer grows, so a client
            // that stops reading or goes away mid-answer is seen (and counted) as an abort.
            if self.out.len() >= STREAM_FLUSH_BYTES && !self.flush().await {
                return self.abort(&head, emitted);
            }
            if reset_after == Some(emitted as u32) {
                return self.reset(emitted).await;
            }
            if stall_after == Some(emitted as u32) {
                return self.stall(&head, emitted).await;
            }
        }
        {
            let (out, ev) = (&mut self.out, &mut self.ev);
            gen.end_events(ev, &mut |ev: &mut Vec<u8>| emit(out, ev, chunked));
        }
        if chunked {
            self.out.extend_from_slice(b"0\r\n\r\n");
        }
        self.finish(emitted, length, permit);
        if self.flush().await && !close {
            Flow::KeepAlive
        } else {
            Flow::Close
        }
    }

    /// Once a prompt's prefill is done, the LMCache worker stores its chunks.
    #[cfg(feature = "zmq")]
    fn lmcache_store(&self, q: &LmcacheQuery) {
        if let Some(w) = &self.shared.lmcache {
            w.store(q);
        }
    }

    /// With LoRA on: a base model passes, a registered adapter waits for its slot (and its
    /// load into the GPU), anything else is answered with vLLM's 404.
    async fn lora_admit(&mut self, head: &Head, model: &str) -> Result<Option<LoraSlot>, Flow> {
        let Some(l) = self.shared.lora.clone() else {
            return Ok(None);
        };
        match l.classify(model, &self.shared.cfg.models) {
            lora::Kind::Base => Ok(None),
            lora::Kind::Unknown => {
                inc(&self.shared.stats.completed);
                let (status, ctype, body) = lora::unknown_model(model);
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
    fn finish(&mut self, tokens: u64, length: bool, permit: crate::admission::Permit) {
        drop(permit);
        let stats = &self.shared.stats;
        stats.generation_tokens.fetch_add(tokens, Relaxed);
        inc(&stats.completed);
        inc(if length {
            &stats.finished_length
        } else {
            &stats.finished_stop
        });
    }
}
