//! The request path on a worker core, as named stages, in the order a request meets them:
//!
//! 1. [`conn`]: the client connection loop reads a head and a body ([`request`] holds them
//!    and the buffers the request is served with) and answers the gateway's own endpoints
//!    ([`local`], [`models`]) or hands an inference request to [`forward`], which runs the
//!    rest:
//! 2. [`auth`] (when `[[keys]]` are configured): the caller's API key (401 when missing or
//!    unknown); then [`route`]: the request facts, and the route whose rules hold; then
//!    [`auth`] again: the key allowed that route and model (403) and within its per-minute
//!    limits (429); then [`admit`]: the request's class, tenant and deadline;
//! 3. [`inputs`]: what the route's strategy asks for before its pick (token ids, a cache
//!    lookup, the canonical prompt);
//!    From here on the request is one [`exchange`]: what the later stages read, and the
//!    record of its attempts they write.
//! 4. [`pick`]: the candidates (eligible, serving the model, under their limit, not tried
//!    yet, under what its class may take), the strategy's choice and its admission under
//!    `max_concurrent`; [`queue`] waits for a place in the route's shared queue when the
//!    route has one and every candidate is full or others wait already, in class and
//!    fair-share order ([`release`] wakes the waiters);
//! 5. [`attempt`]: the attempt layer: one try on the chosen target (an adapter loaded
//!    first when asked), the upstream request's bytes ([`upstream_request`]; [`outgoing`]
//!    holds and writes them, a large body from where it was read), and the retry decision
//!    by the failure's kind (with [`retry`]: the reasons, the route's budget and the
//!    back-off); [`hedge`] races a second attempt against a slow first one ([`head_times`]
//!    learns the delay); on a disaggregated route [`disaggregated`] runs a prefill leg and a
//!    decode leg instead, each an exchange over its pool ([`leg_body`]: what each leg
//!    changes in the body; [`drain`]: a prefill answer read whole, not relayed);
//! 6. [`relay`]: the exchange with the target, streaming the answer to the client;
//! 7. [`record`]: what the attempt teaches, to this core's strategies and, by message, to
//!    the other cores and the control thread.
//!
//! Beside them: [`state`] (the worker's per-core state every stage reads), [`generation`]
//! (which configuration's state a new request takes, across reloads), [`client`] (the
//! client socket and writing to it), [`stream`] (the client's bytes, plaintext or TLS, and
//! the TLS handshake), [`client_tls`] (the listener's certificates per configuration),
//! [`reader`] and [`race`] (the disconnect watch), [`idle_timer`] (the coarse deadlines of
//! idle waits), [`activity`] (the notes busy polling follows).
//!
//! Owns everything that happens per request on a worker core. It must not block, take a
//! lock, or log per request; anything slow belongs to the control thread.

pub mod activity;
pub mod admit;
pub mod attempt;
pub mod auth;
pub mod client;
pub mod client_tls;
pub mod conn;
#[cfg(feature = "local-tokenizer")]
pub mod count_tokens;
pub mod disaggregated;
pub mod drain;
pub mod exchange;
pub mod forward;
pub mod generation;
pub mod head_times;
pub mod hedge;
pub mod idle_timer;
pub mod inputs;
pub mod leg_body;
pub mod local;
pub mod models;
pub mod outgoing;
pub mod pick;
pub mod queue;
pub mod race;
pub mod reader;
pub mod record;
pub mod relay;
pub mod release;
pub mod request;
pub mod retry;
pub mod route;
pub mod spans;
pub mod state;
pub mod stream;
pub mod upstream_request;
