//! `fastest` (being written).
