//! The access-log writer thread: lines arrive from the control thread in batches, one per
//! control tick ([`AccessSink::send`] never waits: past [`CAPACITY`] lines waiting, a batch
//! is dropped and its lines counted, for `rolter_access_log_dropped_total`), are written to
//! stdout or appended to a file, and the file is reopened on request
//! ([`AccessLog::reopen`], for logrotate).
//!
//! Owns the destination. Only this thread ever waits on the disk.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use rolter_config::AccessLogDest;

/// Lines buffered between the control thread and the writer.
pub const CAPACITY: usize = 8192;

enum Msg {
    /// Lines, each ending with a newline, and how many.
    Lines(Vec<u8>, usize),
    /// Wakes the writer to look at the reopen flag.
    Reopen,
    /// Write what came before, then end.
    Stop,
}

/// The control thread's end: sends lines without ever waiting.
#[derive(Clone)]
pub struct AccessSink {
    tx: Sender<Msg>,
    /// Lines sent and not yet written, bounded by `capacity`.
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl AccessSink {
    /// Queues `count` lines (each ending with a newline); `false` when they would take the
    /// lines waiting past the capacity (or the writer is gone) and were dropped.
    pub fn send(&self, lines: Vec<u8>, count: usize) -> bool {
        if self.queued.load(Ordering::Acquire) + count > self.capacity {
            return false;
        }
        self.queued.fetch_add(count, Ordering::AcqRel);
        if self.tx.send(Msg::Lines(lines, count)).is_err() {
            self.queued.fetch_sub(count, Ordering::AcqRel);
            return false;
        }
        true
    }
}

/// The writer thread's handle: reopen the file, stop after the last line.
pub struct AccessLog {
    tx: Option<Sender<Msg>>,
    reopen: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

enum Out {
    Stdout(BufWriter<io::Stdout>),
    File(BufWriter<File>, PathBuf),
}

impl Out {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Out::Stdout(w) => w,
            Out::File(w, _) => w,
        }
    }
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl AccessLog {
    /// Starts the writer for `dest`; `None` when the access log is off. A file that cannot
    /// be opened fails the start, naming `log.access`.
    pub fn start(dest: &AccessLogDest) -> io::Result<Option<(AccessLog, AccessSink)>> {
        Self::start_with(dest, CAPACITY)
    }

    /// [`Self::start`] with a given buffer size (tests).
    pub fn start_with(
        dest: &AccessLogDest,
        capacity: usize,
    ) -> io::Result<Option<(AccessLog, AccessSink)>> {
        let out = match dest {
            AccessLogDest::Off => return Ok(None),
            AccessLogDest::Stdout => Out::Stdout(BufWriter::new(io::stdout())),
            AccessLogDest::File(p) => {
                let f = open(p).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "log.access: cannot open the access log {}: {e}; create its directory and make it writable by rolter's user, or set access = \"stdout\"",
                            p.display()
                        ),
                    )
                })?;
                Out::File(BufWriter::new(f), p.clone())
            }
        };
        let (tx, rx) = unbounded();
        let reopen = Arc::new(AtomicBool::new(false));
        let queued = Arc::new(AtomicUsize::new(0));
        let flag = reopen.clone();
        let written = queued.clone();
        let thread = std::thread::Builder::new()
            .name("rolter-access-log".into())
            .spawn(move || run(rx, out, &flag, &written))?;
        Ok(Some((
            AccessLog {
                tx: Some(tx.clone()),
                reopen,
                thread: Some(thread),
            },
            AccessSink {
                tx,
                queued,
                capacity,
            },
        )))
    }

    /// Makes the writer reopen its file (after logrotate moved it) before its next line.
    /// Never waits; a no-op for stdout.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Reopen);
        }
    }

    /// Waits for the writer to write every line queued so far, then stops it (call it once
    /// the control thread, which sends the lines, has stopped).
    pub fn stop(mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Write errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

fn run(rx: Receiver<Msg>, mut out: Out, reopen: &AtomicBool, queued: &AtomicUsize) {
    let mut last_error: Option<Instant> = None;
    let mut failed: u64 = 0;
    let mut stopping = false;
    while let Ok(first) = rx.recv() {
        let mut msg = Some(first);
        while let Some(m) = msg.take() {
            if matches!(m, Msg::Stop) {
                stopping = true;
                break;
            }
            // Looked at before every line: a line queued after `reopen` goes to the new file.
            if reopen.swap(false, Ordering::AcqRel) {
                reopen_file(&mut out);
            }
            if let Msg::Lines(lines, count) = m {
                if out.writer().write_all(&lines).is_err() {
                    failed += 1;
                }
                queued.fetch_sub(count, Ordering::AcqRel);
            }
            msg = rx.try_recv().ok();
        }
        if out.writer().flush().is_err() {
            failed += 1;
        }
        if failed > 0 && last_error.is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY) {
            last_error = Some(Instant::now());
            tracing::warn!(
                writes = failed,
                "writing the access log failed; check the disk and the file's permissions"
            );
            failed = 0;
        }
        if stopping {
            break;
        }
    }
    let _ = out.writer().flush();
}

fn reopen_file(out: &mut Out) {
    let Out::File(w, path) = out else {
        return;
    };
    let _ = w.flush();
    match open(path) {
        Ok(f) => {
            *w = BufWriter::new(f);
            tracing::info!(path = %path.display(), "access log reopened");
        }
        Err(e) => tracing::warn!(
            path = %path.display(),
            error = %e,
            "reopening the access log failed; still writing to the previous file"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rolter-al-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn lines_go_to_the_file_and_reopen_follows_a_rename() {
        let dir = temp("reopen");
        let path = dir.join("access.log");
        let (log, sink) = AccessLog::start(&AccessLogDest::File(path.clone()))
            .unwrap()
            .unwrap();
        assert!(sink.send(b"one\n".to_vec(), 1));
        // Lines are written in order; a round trip through the channel orders the rename.
        while std::fs::read_to_string(&path).unwrap() != "one\n" {
            std::thread::yield_now();
        }
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        log.reopen();
        assert!(sink.send(b"two\n".to_vec(), 1));
        drop(sink);
        log.stop();
        assert_eq!(
            std::fs::read_to_string(dir.join("access.log.1")).unwrap(),
            "one\n"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
    }

    #[test]
    fn lines_past_the_capacity_are_dropped_instead_of_waiting() {
        let (tx, _rx) = unbounded();
        let sink = AccessSink {
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            capacity: 3,
        };
        assert!(sink.send(b"a\nb\n".to_vec(), 2));
        assert!(!sink.send(b"c\nd\n".to_vec(), 2), "4 lines waiting > 3");
        assert!(sink.send(b"c\n".to_vec(), 1));
        assert!(!sink.send(b"d\n".to_vec(), 1));
    }

    #[test]
    fn written_lines_make_room_again() {
        let dir = temp("room");
        let path = dir.join("access.log");
        let (log, sink) = AccessLog::start_with(&AccessLogDest::File(path.clone()), 2)
            .unwrap()
            .unwrap();
        assert!(sink.send(b"a\nb\n".to_vec(), 2));
        while std::fs::read_to_string(&path).unwrap() != "a\nb\n" {
            std::thread::yield_now();
        }
        while sink.queued.load(Ordering::Acquire) != 0 {
            std::thread::yield_now();
        }
        assert!(sink.send(b"c\n".to_vec(), 1));
        drop(sink);
        log.stop();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\nc\n");
    }

    #[test]
    fn an_unopenable_file_names_the_key() {
        let e = AccessLog::start(&AccessLogDest::File("/nonexistent-dir/x/access.log".into()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("log.access"), "{e}");
    }

    #[test]
    fn off_starts_nothing() {
        assert!(AccessLog::start(&AccessLogDest::Off).unwrap().is_none());
    }
}
