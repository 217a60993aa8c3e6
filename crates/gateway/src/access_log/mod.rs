//! The access log: one [`Entry`] per finished request, built on the worker and sent to the
//! control thread with the tick's other records; the control thread formats each as one
//! JSON line ([`line`]) and hands the tick's lines to the [`writer`] thread as one batch
//! (dropping, and counting, what does not fit its bounded buffer), which writes them to
//! stdout or a file it reopens on request.
//!
//! Owns the entry's fields, their JSON form and the writer thread. It must never see a
//! header value, a query string or a request body: entries carry only what the gateway
//! itself decided or measured, plus the method, path, model name and request id.

pub mod entry;
pub mod line;
pub mod writer;

pub use entry::{Cut, Entry, Flags};
pub use writer::{AccessLog, AccessSink};
