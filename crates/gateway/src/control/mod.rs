//! The control plane: everything that is not request handling. The control thread's state
//! ([`thread_state`]) folds the workers' load snapshots and records into the gateway's
//! metrics and the health book, keeps the scrape results and the LoRA book, and turns them
//! into the per-target signals the workers route on; [`loops`] are its periodic scrapes,
//! health checks and model-list polls; [`probe`] is their HTTP client; [`dns`] re-resolves
//! targets' host names; [`stir`] ends the control thread's quiet tick when one of them
//! delivered a result.
//!
//! Runs on the control thread (started by the runtime); workers reach it only through the
//! mesh. It must not touch a worker's state, and nothing on the request path waits for it:
//! if it stalls, the workers keep routing on their last view.

pub mod dns;
pub mod loops;
pub mod probe;
pub mod stir;
pub mod thread_state;
