//! One request's access-log entry and its response flags (in the spirit of Envoy's).
//!
//! Stored inline (fixed-size strings, truncated) so building one costs a single allocation
//! on the worker, and only for requests that are logged.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use rolter_codec::h1::request_id::RequestId;
use rolter_codec::{GatewayError, UpstreamFailure};

/// Response flags: what went wrong, if anything, in a request's final outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flags(u16);

impl Flags {
    /// Upstream connection failure (connect refused, connect timeout, TLS handshake).
    pub const UF: Flags = Flags(1);
    /// Upstream timeout: no first byte within `first_byte`, or idle past `idle` mid-stream.
    pub const UT: Flags = Flags(1 << 1);
    /// Upstream connection terminated: closed or reset before or during the answer, or a
    /// malformed response.
    pub const UC: Flags = Flags(1 << 2);
    /// Downstream connection termination: the client went away.
    pub const DC: Flags = Flags(1 << 3);
    /// No route: no route serves the requested model.
    pub const NR: Flags = Flags(1 << 4);
    /// Overflow: every candidate target is at its `max_concurrent` limit.
    pub const UO: Flags = Flags(1 << 5);
    /// No healthy upstream: every candidate target is unhealthy or ejected.
    pub const UH: Flags = Flags(1 << 6);
    /// Retries exhausted: the request failed after more than one attempt.
    pub const URX: Flags = Flags(1 << 7);
    /// The answer was cut off by the gateway's shutdown.
    pub const SD: Flags = Flags(1 << 8);

    const NAMES: [(Flags, &'static str); 9] = [
        (Flags::UF, "UF"),
        (Flags::UT, "UT"),
        (Flags::UC, "UC"),
        (Flags::DC, "DC"),
        (Flags::NR, "NR"),
        (Flags::UO, "UO"),
        (Flags::UH, "UH"),
        (Flags::URX, "URX"),
        (Flags::SD, "SD"),
    ];

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }

    pub fn insert(&mut self, f: Flags) {
        self.0 |= f.0;
    }

    /// The flags' names, comma-separated (`-` when none), as Envoy writes them.
    pub fn names(self) -> String {
        if self.is_empty() {
            return "-".to_string();
        }
        let mut out = String::new();
        for (f, name) in Self::NAMES {
            if self.contains(f) {
                if !out.is_empty() {
                    out.push(',');
                }
                out.push_str(name);
            }
        }
        out
    }

    /// The flag an error response of the gateway's carries: by the kind of an upstream
    /// failure, `NR` for a model no route serves.
    pub fn for_error(e: &GatewayError) -> Flags {
        use UpstreamFailure as F;
        match e.upstream {
            Some(F::ConnectFailed | F::ConnectTimeout | F::TlsFailed) => Flags::UF,
            Some(F::FirstByteTimeout) => Flags::UT,
            Some(F::ClosedBeforeResponse | F::ClosedInHead | F::WriteFailed | F::BadResponse) => {
                Flags::UC
            }
            Some(F::Refused(_) | F::StreamInterrupted) => Flags::default(),
            None if e.code == "model_not_found" => Flags::NR,
            None => Flags::default(),
        }
    }
}

/// How a response that had started reaching the client was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The upstream closed or reset the connection, or sent a malformed body.
    UpstreamReset,
    /// The upstream went idle past the target's `idle` timeout.
    UpstreamTimeout,
    /// The client went away.
    ClientGone,
    /// The gateway's shutdown grace ended.
    Shutdown,
}

impl Cut {
    /// The `cause` label of `rolter_stream_interrupted_total`.
    pub fn label(self) -> &'static str {
        match self {
            Cut::UpstreamReset => "upstream_reset",
            Cut::UpstreamTimeout => "upstream_timeout",
            Cut::ClientGone => "client_gone",
            Cut::Shutdown => "shutdown",
        }
    }

    pub fn flag(self) -> Flags {
        match self {
            Cut::UpstreamReset => Flags::UC,
            Cut::UpstreamTimeout => Flags::UT,
            Cut::ClientGone => Flags::DC,
            Cut::Shutdown => Flags::SD,
        }
    }
}

/// A string of at most `N` bytes, stored inline (longer input is cut at `N`).
#[derive(Clone, Copy)]
pub struct Inline<const N: usize> {
    bytes: [u8; N],
    len: u16,
}

impl<const N: usize> Default for Inline<N> {
    fn default() -> Self {
        Inline {
            bytes: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> Inline<N> {
    pub fn new(v: &[u8]) -> Self {
        let mut s = Self::default();
        let n = v.len().min(N);
        s.bytes[..n].copy_from_slice(&v[..n]);
        s.len = n as u16;
        s
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as text (invalid UTF-8, e.g. a cut character, replaced).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes[..self.len as usize])
    }
}

impl<const N: usize> std::fmt::Debug for Inline<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.text())
    }
}

/// Longest path kept in an entry.
pub const MAX_PATH: usize = 256;
/// Longest model name kept in an entry.
pub const MAX_MODEL: usize = 128;
/// Longest header-named tenant kept in an entry.
pub const MAX_TENANT: usize = 32;

/// One request, as the access log shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// When the request was read.
    pub time: SystemTime,
    pub request_id: RequestId,
    pub client: SocketAddr,
    pub method: &'static str,
    /// The path without its query (a query can carry a key).
    pub path: Inline<MAX_PATH>,
    /// Route index, once routed.
    pub route: Option<u16>,
    /// The last target tried.
    pub target: Option<u16>,
    pub model: Inline<MAX_MODEL>,
    /// The status the client received (0: none, the client went away first).
    pub status: u16,
    /// The last upstream response status (0: none).
    pub upstream_status: u16,
    pub attempts: u8,
    pub flags: Flags,
    /// The gateway's error code when it answered with an error itself.
    pub error: Option<&'static str>,
    /// From the request being read to the first response body byte from the target.
    pub ttft: Option<Duration>,
    pub duration: Duration,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    /// The completion tokens were counted from the stream's deltas (no usage reported).
    pub tokens_estimated: bool,
    /// The fallback the route's strategy took for the last pick.
    pub fallback: Option<&'static str>,
    /// The client API key's index in `[[keys]]`, once identified (its name is logged).
    pub key: Option<u32>,
    /// The request's priority class (an index in `config.classes`), once classified.
    pub class: Option<u8>,
    /// The tenant a route's `tenant_header` named (empty: the tenant is the key).
    pub tenant: Inline<MAX_TENANT>,
    /// How long the request waited in its route's queue, in µs (0: it did not wait; at
    /// least 1 when it did).
    pub queue_wait_us: u32,
    /// On a disaggregated route: what the prefill legs came to (`target` and the fields
    /// above are the decode's).
    pub prefill: Option<PrefillLeg>,
}

/// The prefill side of a disaggregated request, for its access-log line.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefillLeg {
    /// The last prefill target tried.
    pub target: Option<u16>,
    /// Its response status (0: none).
    pub status: u16,
    pub attempts: u8,
    /// How long the last prefill leg took, from its request being written to its end.
    pub time: Option<Duration>,
}

impl Entry {
    /// A request that has not been answered yet.
    pub fn new(
        time: SystemTime,
        request_id: RequestId,
        client: SocketAddr,
        method: &'static str,
        path: &[u8],
    ) -> Entry {
        Entry {
            time,
            request_id,
            client,
            method,
            path: Inline::new(path),
            route: None,
            target: None,
            model: Inline::default(),
            status: 0,
            upstream_status: 0,
            attempts: 0,
            flags: Flags::default(),
            error: None,
            ttft: None,
            duration: Duration::ZERO,
            bytes_in: 0,
            bytes_out: 0,
            prompt_tokens: None,
            completion_tokens: None,
            tokens_estimated: false,
            fallback: None,
            key: None,
            class: None,
            tenant: Inline::default(),
            queue_wait_us: 0,
            prefill: None,
        }
    }

    /// Written even when sampling skips successes: an error, a flag, a non-2xx answer.
    pub fn always_logged(&self) -> bool {
        !self.flags.is_empty() || !(200..300).contains(&self.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_named_like_envoys() {
        assert_eq!(Flags::default().names(), "-");
        let mut f = Flags::UF;
        f.insert(Flags::URX);
        assert_eq!(f.names(), "UF,URX");
        let up = |f| GatewayError::upstream(f, "x");
        assert_eq!(
            Flags::for_error(&up(UpstreamFailure::FirstByteTimeout)),
            Flags::UT
        );
        assert_eq!(Flags::for_error(&up(UpstreamFailure::TlsFailed)), Flags::UF);
        assert_eq!(
            Flags::for_error(&up(UpstreamFailure::ClosedInHead)),
            Flags::UC
        );
        assert!(Flags::for_error(&up(UpstreamFailure::Refused(503))).is_empty());
        let e = |code| GatewayError::client(404, code, "x");
        assert_eq!(Flags::for_error(&e("model_not_found")), Flags::NR);
        assert!(Flags::for_error(&e("bad_request")).is_empty());
        assert_eq!(Cut::ClientGone.flag(), Flags::DC);
    }

    #[test]
    fn inline_strings_are_cut_at_their_size() {
        let s: Inline<4> = Inline::new(b"abcdef");
        assert_eq!(s.text(), "abcd");
        let s: Inline<4> = Inline::new("é".as_bytes());
        assert_eq!(s.text(), "é");
    }
}
