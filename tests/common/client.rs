//! The blocking HTTP/1.1 test client, shared with the mock engine's own tests.
pub use rolter_mock::client::*;
