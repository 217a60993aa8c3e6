//! The exporter: workers hand finished spans to a [`Tracer`] (a bounded channel's
//! `try_send`, never a wait); the `rolter-traces` thread takes them in batches of up to
//! `batch` spans or `flush_interval`, encodes each batch as one OTLP request and POSTs it
//! to the collector ([`super::client`]).
//!
//! The bound: the channel holds `queue` spans and the thread at most one batch besides;
//! while an export waits on a slow collector (up to `timeout`), or after a failed one
//! (the thread then pauses, 100 ms doubling to 5 s, before it takes more), the channel
//! fills and every further span is dropped at `record` and counted. A failed export's
//! spans are dropped and counted too: `exported + dropped` is every span recorded once
//! the queue is empty.
//!
//! Owns the channel, the thread and the counters. It must not be waited on by a worker.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, unbounded, Receiver, RecvTimeoutError, Sender};
use rolter_config::Tracing;

use super::client::{OtlpClient, PostError};
use super::proto;
use super::span::SpanRecord;

/// The counters of the trace plane so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Spans the collector accepted (a 2xx answer to their export).
    pub exported: u64,
    /// Spans that will never be exported: the queue was full, the exporter was gone, or
    /// their export failed.
    pub dropped: u64,
    /// Exports that failed (no connection, a timeout, a non-2xx answer).
    pub failed_exports: u64,
}

#[derive(Debug, Default)]
struct Counters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed_exports: AtomicU64,
}

impl Counters {
    fn stats(&self) -> TraceStats {
        TraceStats {
            exported: self.exported.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            failed_exports: self.failed_exports.load(Ordering::Relaxed),
        }
    }

    fn drop_spans(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A worker's end of the exporter: cheap to clone, `Send + Sync`, never waits.
#[derive(Debug, Clone)]
pub struct Tracer {
    tx: Sender<Box<SpanRecord>>,
    counters: Arc<Counters>,
}

impl Tracer {
    /// Queues a finished span for export; when the queue is full (or the exporter is
    /// gone) the span is dropped and counted instead.
    pub fn record(&self, span: SpanRecord) {
        // Checked first so that a full queue costs no allocation.
        if self.tx.is_full() || self.tx.try_send(Box::new(span)).is_err() {
            self.counters.drop_spans(1);
        }
    }

    /// The counters so far (shared by every tracer of the exporter, over reloads).
    pub fn stats(&self) -> TraceStats {
        self.counters.stats()
    }
}

enum Control {
    /// New settings with the same queue, and the client built for them.
    Reconfigure(Box<Tracing>, Box<OtlpClient>),
    /// Export what is queued until the deadline, drop the rest, end.
    Stop(Instant),
}

/// The exporter thread's handle, kept by the runtime: reload its settings, stop it.
pub struct ExporterHandle {
    tracer: Tracer,
    ctl: Sender<Control>,
    settings: Tracing,
    thread: Option<JoinHandle<()>>,
    /// Threads of earlier settings, still sending what they had queued.
    retired: Vec<JoinHandle<()>>,
}

/// Starts the `rolter-traces` thread for `settings`. Fails when the thread cannot be
/// spawned or the TLS client cannot be set up; the collector is first reached by the
/// first export, so one that is away does not fail the start.
pub fn start(settings: &Tracing) -> io::Result<(Tracer, ExporterHandle)> {
    let handle = spawn(settings, Arc::new(Counters::default()))?;
    Ok((handle.tracer(), handle))
}

fn spawn(settings: &Tracing, counters: Arc<Counters>) -> io::Result<ExporterHandle> {
    let client = OtlpClient::new(settings).map_err(io::Error::other)?;
    let (tx, rx) = bounded(settings.queue);
    let (ctl, ctl_rx) = unbounded();
    let exporter = Exporter::new(settings.clone(), client, counters.clone());
    let thread = std::thread::Builder::new()
        .name("rolter-traces".into())
        .spawn(move || exporter.run(&rx, &ctl_rx))?;
    tracing::info!(endpoint = %settings.endpoint.url, sample = settings.sample, "exporting traces");
    Ok(ExporterHandle {
        tracer: Tracer { tx, counters },
        ctl,
        settings: settings.clone(),
        thread: Some(thread),
        retired: Vec::new(),
    })
}

impl ExporterHandle {
    /// A tracer for the workers.
    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// The counters so far, over every reload.
    pub fn stats(&self) -> TraceStats {
        self.tracer.stats()
    }

    /// Applies a reloaded `[tracing]`; returns the tracer the workers of the new
    /// configuration record with. The same `queue`: the thread takes the new endpoint,
    /// headers, batch, flush interval and timeout before its next export (reconnecting),
    /// and the tracer stays the same. Another `queue`: a new thread with a new queue
    /// starts, and the old one exports what it had queued (within its `timeout`) and
    /// ends; spans recorded with the old tracer after that are dropped and counted. The
    /// counters go on either way. Fails as [`start`] does, leaving the running exporter.
    pub fn reload(&mut self, settings: &Tracing) -> io::Result<Tracer> {
        if same_exporter(&self.settings, settings) {
            self.settings = settings.clone();
            return Ok(self.tracer());
        }
        if settings.queue == self.settings.queue {
            let client = OtlpClient::new(settings).map_err(io::Error::other)?;
            let msg = Control::Reconfigure(Box::new(settings.clone()), Box::new(client));
            let _ = self.ctl.send(msg);
            self.settings = settings.clone();
            return Ok(self.tracer());
        }
        let next = spawn(settings, self.tracer.counters.clone())?;
        let mut old = std::mem::replace(self, next);
        self.retired = std::mem::take(&mut old.retired);
        // Those that ended need no join.
        self.retired.retain(|t| !t.is_finished());
        self.retired.extend(old.stop());
        Ok(self.tracer())
    }

    /// Exports what is queued (for at most `timeout`), then ends the thread and waits
    /// for it (and for those of earlier settings).
    pub fn shutdown(mut self) {
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut self.retired)
            .into_iter()
            .chain(self.stop())
            .collect();
        for t in threads {
            let _ = t.join();
        }
    }

    /// Tells the thread to stop within its timeout; its handle, to join.
    fn stop(&mut self) -> Option<JoinHandle<()>> {
        let deadline = Instant::now() + self.settings.timeout;
        let _ = self.ctl.send(Control::Stop(deadline));
        self.thread.take()
    }
}

impl Drop for ExporterHandle {
    /// Without [`ExporterHandle::shutdown`], the thread still stops within its timeout.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}

/// The settings the exporter thread uses are the same (`sample` and `parent_based` are
/// the workers').
fn same_exporter(a: &Tracing, b: &Tracing) -> bool {
    a.endpoint == b.endpoint
        && a.headers == b.headers
        && a.service_name == b.service_name
        && a.queue == b.queue
        && a.batch == b.batch
        && a.flush_interval == b.flush_interval
        && a.timeout == b.timeout
}

/// How long the thread sleeps with nothing to send.
const IDLE: Duration = Duration::from_secs(3600);
/// The pause after the first failed export in a row, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// Failed exports are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What woke the thread.
enum Step {
    Span(Box<SpanRecord>),
    Control(Control),
    /// Every tracer is gone.
    Gone,
    Idle,
}

/// The exporter thread's state.
struct Exporter {
    settings: Tracing,
    client: OtlpClient,
    resource: proto::Resource,
    counters: Arc<Counters>,
    batch: Vec<SpanRecord>,
    body: Vec<u8>,
    /// Failed exports in a row, and when the pause after the last one ends.
    failures_in_row: u32,
    paused_until: Option<Instant>,
    /// Failures since the last warning, and when it was logged.
    unlogged: u64,
    warned: Option<Instant>,
}

impl Exporter {
    fn new(settings: Tracing, client: OtlpClient, counters: Arc<Counters>) -> Exporter {
        Exporter {
            resource: proto::resource(&settings.service_name),
            batch: Vec::with_capacity(settings.batch.min(4096)),
            settings,
            client,
            counters,
            body: Vec::new(),
            failures_in_row: 0,
            paused_until: None,
            unlogged: 0,
            warned: None,
        }
    }

    fn run(mut self, rx: &Receiver<Box<SpanRecord>>, ctl: &Receiver<Control>) {
        // When the oldest span of the batch has waited `flush_interval`.
        let mut due: Option<Instant> = None;
        loop {
            match self.next_step(rx, ctl, due) {
                Step::Span(span) => {
                    if self.batch.is_empty() {
                        due = Some(Instant::now() + self.settings.flush_interval);
                    }
                    self.batch.push(*span);
                }
                Step::Control(Control::Reconfigure(settings, client)) => {
                    self.resource = proto::resource(&settings.service_name);
                    self.settings = *settings;
                    self.client = *client;
                    self.paused_until = None;
                }
                Step::Control(Control::Stop(deadline)) => return self.drain(rx, deadline),
                Step::Gone => {
                    let deadline = Instant::now() + self.settings.timeout;
                    return self.drain(rx, deadline);
                }
                Step::Idle => {}
            }
            let late = due.is_some_and(|d| Instant::now() >= d);
            if !self.batch.is_empty() && (late || self.batch.len() >= self.settings.batch) {
                self.export(Instant::now() + self.settings.timeout);
                due = None;
            }
        }
    }

    /// Waits for a span, a control message or the batch's due time; while paused after a
    /// failure, for a control message only (spans wait in the queue, or are dropped).
    fn next_step(
        &self,
        rx: &Receiver<Box<SpanRecord>>,
        ctl: &Receiver<Control>,
        due: Option<Instant>,
    ) -> Step {
        let now = Instant::now();
        if let Some(until) = self.paused_until.filter(|u| *u > now) {
            return match ctl.recv_timeout(until - now) {
                Ok(m) => Step::Control(m),
                Err(RecvTimeoutError::Timeout) => Step::Idle,
                Err(RecvTimeoutError::Disconnected) => Step::Gone,
            };
        }
        let wait = due.map_or(IDLE, |d| d.saturating_duration_since(now));
        select! {
            recv(rx) -> span => span.map_or(Step::Gone, Step::Span),
            recv(ctl) -> msg => msg.map_or(Step::Gone, Step::Control),
            default(wait) => Step::Idle,
        }
    }

    /// Exports what is queued, batch by batch, until `deadline`; what is left then is
    /// dropped and counted.
    fn drain(mut self, rx: &Receiver<Box<SpanRecord>>, deadline: Instant) {
        loop {
            while self.batch.len() < self.settings.batch {
                match rx.try_recv() {
                    Ok(span) => self.batch.push(*span),
                    Err(_) => break,
                }
            }
            if self.batch.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let left = self.batch.len() + rx.try_iter().count();
                self.counters.drop_spans(left);
                return;
            }
            self.export(deadline.min(Instant::now() + self.settings.timeout));
        }
    }

    /// Sends the batch (emptied) by `deadline`, and counts the outcome.
    fn export(&mut self, deadline: Instant) {
        let n = self.batch.len();
        proto::encode_request(&self.resource, &mut self.batch, &mut self.body);
        match self.client.post(&self.body, deadline) {
            Ok(()) => {
                self.counters
                    .exported
                    .fetch_add(n as u64, Ordering::Relaxed);
                self.failures_in_row = 0;
                self.paused_until = None;
            }
            Err(e) => {
                self.counters.failed_exports.fetch_add(1, Ordering::Relaxed);
                self.counters.drop_spans(n);
                let pause = FIRST_PAUSE.saturating_mul(1 << self.failures_in_row.min(6));
                self.failures_in_row = self.failures_in_row.saturating_add(1);
                self.paused_until = Some(Instant::now() + pause.min(MAX_PAUSE));
                self.warn(&e, n);
            }
        }
    }

    /// Logs a failed export: the first at once, later ones at most every [`WARN_EVERY`].
    fn warn(&mut self, e: &PostError, spans: usize) {
        self.unlogged += 1;
        if self.warned.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            return;
        }
        tracing::warn!(
            endpoint = %self.settings.endpoint.url,
            error = %e,
            failed_exports = self.unlogged,
            spans,
            "exporting traces failed; the spans were dropped (rolter_trace_spans_dropped_total)"
        );
        self.warned = Some(Instant::now());
        self.unlogged = 0;
    }
}
