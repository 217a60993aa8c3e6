//! Several commands in one round trip, on a single server and on a cluster alike.
//!
//! The client crate's `Pipeline::query` refuses a cluster connection, and its cluster
//! pipeline cannot keep a server error in its place among the replies. Every key of a fleet
//! shares one hash tag, so a fleet's pipeline always belongs to one node: this module packs
//! the commands once and sends them as one request, which a cluster connection routes by the
//! first command's key (following redirections). It owns that, and the rule that each reply
//! stands alone (a server error in place, not failing the others); it must not know what
//! the commands are.

use redis::{ConnectionLike, FromRedisValue, Pipeline, RedisResult, Value};

use crate::error::StoreError;

/// Sends `pipe` (no `MULTI`, no ignored commands); one reply per command, in order, a
/// server's refusal as an `Err` in its place.
pub(crate) fn send(
    link: &mut dyn ConnectionLike,
    pipe: &Pipeline,
) -> Result<Vec<RedisResult<Value>>, StoreError> {
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    let replies = link.req_packed_commands(&pipe.get_packed_pipeline(), 0, pipe.len())?;
    if replies.len() != pipe.len() {
        return Err(StoreError::Decode(format!(
            "{} replies to {} pipelined commands",
            replies.len(),
            pipe.len()
        )));
    }
    Ok(replies.into_iter().map(Value::extract_error).collect())
}

/// Sends `pipe` and reads every reply as a `T`; any refusal fails the whole call.
pub(crate) fn send_all<T: FromRedisValue>(
    link: &mut dyn ConnectionLike,
    pipe: &Pipeline,
) -> Result<Vec<T>, StoreError> {
    send(link, pipe)?
        .into_iter()
        .map(|reply| parse(reply?))
        .collect()
}

/// One reply as a `T`.
pub(crate) fn parse<T: FromRedisValue>(v: Value) -> Result<T, StoreError> {
    redis::from_redis_value(v).map_err(|e| StoreError::Decode(e.to_string()))
}
