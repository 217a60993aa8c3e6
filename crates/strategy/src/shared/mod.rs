//! Pieces several strategies share: the random tie-break and the least-loaded fallback,
//! the balance guard, the TTFT average, the pre-hashed key map, the prefix index, session
//! pins, the strategy made of a generator and a rule over the candidates alone, and the
//! wrapper that forwards every hook to an inner strategy.

pub mod balance;
pub mod choose;
pub mod ewma;
pub mod key_map;
pub mod prefix_index;
pub mod seeded;
pub mod sessions;
pub mod wrap;

pub use balance::{BalanceGuard, IMBALANCE};
pub use choose::{choose_least_loaded, choose_least_loaded_among, choose_uniform};
