//! What can go wrong talking to the store, in words an operator can act on.
//!
//! Owns [`StoreError`] and the one mapping from the client crate's errors to it, which
//! decides whether the connection is still usable ([`StoreError::is_connection`]). It must
//! not retry or log: the caller (the gateway's state thread) decides and counts.

use std::fmt;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A failed store call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The server could not be reached, or the connection broke.
    Connect(String),
    /// No answer within the command (or connect) timeout; the connection is dropped, since
    /// a late answer would be read as the next command's.
    Timeout,
    /// The server refused the credentials (or asks for some and none were given).
    Auth(String),
    /// The server refused a command; the connection is still usable.
    Command(String),
    /// Settings or arguments the store cannot use (a bad URL, a lease of 70 000 members…).
    Invalid(String),
    /// A reply not shaped as this version expects.
    Decode(String),
}

impl StoreError {
    /// Whether the connection is gone: the caller connects again (`Store::connect`) before
    /// the next call. Every later call on this `Store` fails the same way.
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            StoreError::Connect(_) | StoreError::Timeout | StoreError::Auth(_)
        )
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Connect(m) => write!(f, "store unreachable: {m}"),
            StoreError::Timeout => f.write_str("store timed out"),
            StoreError::Auth(m) => write!(f, "store refused authentication: {m}"),
            StoreError::Command(m) => write!(f, "store refused a command: {m}"),
            StoreError::Invalid(m) => write!(f, "store settings or arguments: {m}"),
            StoreError::Decode(m) => write!(f, "unexpected store reply: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> StoreError {
        if e.is_timeout() {
            return StoreError::Timeout;
        }
        let text = e.to_string();
        match e.kind() {
            ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
                StoreError::Auth(text)
            }
            _ if e.code() == Some("NOAUTH") || e.code() == Some("WRONGPASS") => {
                StoreError::Auth(text)
            }
            // The server is no longer the writable master (a failover demoted it, the
            // cluster lost a slot, it is loading its data set): a new connection finds the
            // one that is.
            ErrorKind::Server(
                ServerErrorKind::ReadOnly
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::BusyLoading,
            ) => StoreError::Connect(text),
            ErrorKind::InvalidClientConfig => StoreError::Invalid(text),
            ErrorKind::UnexpectedReturnType | ErrorKind::Parse => StoreError::Decode(text),
            _ if e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_unrecoverable_error() =>
            {
                StoreError::Connect(text)
            }
            _ => StoreError::Command(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_need_a_new_connection_server_refusals_do_not() {
        let refused: StoreError =
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)).into();
        assert!(matches!(refused, StoreError::Connect(_)), "{refused:?}");
        assert!(refused.is_connection());
        let slow: StoreError =
            RedisError::from(std::io::Error::from(std::io::ErrorKind::WouldBlock)).into();
        assert_eq!(slow, StoreError::Timeout);
        assert!(slow.is_connection());
        assert!(!StoreError::Command("WRONGTYPE".into()).is_connection());
        let demoted: StoreError = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ))
        .into();
        assert!(demoted.is_connection(), "{demoted:?}");
        let wrong: StoreError = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ))
        .into();
        assert!(matches!(wrong, StoreError::Command(_)), "{wrong:?}");
        assert_eq!(StoreError::Timeout.to_string(), "store timed out");
    }
}
