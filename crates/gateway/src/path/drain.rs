//! A response read whole instead of relayed: a disaggregated route's prefill answer, which
//! the client never sees (vLLM's carries the KV transfer parameters the decode needs;
//! SGLang's is drained while the decode engine answers).
//!
//! Every read is raced against the client's disconnect and the target's idle timeout, as
//! the relay's are; the body is bounded ([`MAX_ANSWER`]). A cleanly ended answer returns
//! its connection to the pool. Owns that loop only; it must not write to the client.

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::time::Instant;

use rolter_codec::api::usage;
use rolter_codec::h1::chunked::ChunkedDecoder;
use rolter_codec::h1::response_head::RespFraming;
use rolter_codec::{GatewayError, UpstreamFailure};

use super::race::{race, Race};
use super::relay::{Outcome, Report, ResponseStart, Sending};
use super::request::{IoBufs, MIN_UPSTREAM_READ};

/// The largest answer read whole (a prefill answers one token and its parameters).
pub const MAX_ANSWER: usize = 1 << 20;

/// Reads the body of the response `start` (its head in `bufs.ubuf`, what followed it
/// after) into `bufs.body`. The failure to answer for it otherwise: a body cut short, too
/// large or malformed is a reset before the response as far as the client is concerned
/// (nothing of it reached them), so the attempt stage may retry it elsewhere.
pub async fn read_whole(
    to: Sending<'_>,
    bufs: &mut IoBufs,
    start: ResponseStart,
    report: &mut Report,
) -> Result<(), Outcome> {
    let ResponseStart { mut up, head } = start;
    let target = &to.state.config.targets[to.tid];
    let failed = |why: &str| {
        Outcome::Failed(GatewayError::upstream(
            UpstreamFailure::ClosedBeforeResponse,
            format!("target `{}` {why}", target.name),
        ))
    };
    bufs.body.clear();
    let mut decoder = ChunkedDecoder::new();
    let mut done = matches!(head.framing, RespFraming::Empty);
    let mut overrun = false;
    // The bytes that came with the head first, then each read's.
    let mut from = head.len;
    loop {
        let pending = &bufs.ubuf[from.min(bufs.ubuf.len())..];
        if !pending.is_empty() && report.first_byte.is_none() {
            report.first_byte = Some(std::time::Instant::now());
        }
        let body = &mut bufs.body;
        match head.framing {
            RespFraming::Empty => {}
            RespFraming::Length(n) => {
                let want = (n as usize).saturating_sub(body.len());
                overrun |= pending.len() > want;
                body.extend_from_slice(&pending[..pending.len().min(want)]);
                done = body.len() as u64 >= n;
            }
            RespFraming::Chunked => {
                if decoder
                    .feed(pending, |d| body.extend_from_slice(d))
                    .is_err()
                {
                    return Err(failed("sent a malformed chunked answer"));
                }
                done = decoder.is_done();
            }
            RespFraming::Close => body.extend_from_slice(pending),
        }
        if body.len() > MAX_ANSWER {
            return Err(failed(
                "answered more than the 1 MiB a prefill answer may hold",
            ));
        }
        if done {
            break;
        }
        from = 0;
        bufs.ubuf.clear();
        bufs.ubuf.reserve(MIN_UPSTREAM_READ);
        let deadline = Instant::now() + target.timeouts.idle;
        let read = up.read(std::mem::take(&mut bufs.ubuf).slice_mut(0..));
        match race(read, to.watch, deadline).await {
            Race::Done((Ok(n), b)) if n > 0 => bufs.ubuf = b.into_inner(),
            Race::Done((Ok(_), b)) if matches!(head.framing, RespFraming::Close) => {
                bufs.ubuf = b.into_inner();
                break;
            }
            Race::Done((_, b)) => {
                bufs.ubuf = b.into_inner();
                return Err(failed("closed before its answer was complete"));
            }
            Race::ClientGone => return Err(Outcome::ClientGone),
            Race::TimedOut => return Err(failed("went idle inside its answer")),
        }
    }
    bufs.ubuf.clear();
    report.completed = true;
    if (200..300).contains(&head.status) {
        report.usage = usage::scan(&bufs.body);
    }
    if head.keep_alive && !overrun && !matches!(head.framing, RespFraming::Close) {
        to.state
            .upstream
            .pool
            .put(to.tid, up, Instant::now().into_std());
    }
    Ok(())
}
