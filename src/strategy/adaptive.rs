//! `adaptive` (being written).
