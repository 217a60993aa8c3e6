//! `predicted_latency` (being written).
