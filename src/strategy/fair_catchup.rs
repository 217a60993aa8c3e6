//! `fair_catchup` (being written).
