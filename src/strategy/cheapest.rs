//! `cheapest` (being written).
