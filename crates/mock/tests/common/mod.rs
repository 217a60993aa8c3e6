//! Test helpers: start an engine under a given driver; the client comes from the crate.
#![allow(dead_code)]

use rolter_mock::{Driver, MockConfig, MockHandle};

/// Epoll always, io_uring where the kernel allows it.
pub fn drivers() -> Vec<Driver> {
    if monoio::utils::detect_uring() {
        vec![Driver::IoUring, Driver::Epoll]
    } else {
        eprintln!("warning: io_uring is unavailable here; I/O tests run under epoll only");
        vec![Driver::Epoll]
    }
}

pub fn start(driver: Driver, f: impl FnOnce(&mut MockConfig)) -> MockHandle {
    let mut cfg = MockConfig {
        driver,
        ..MockConfig::default()
    };
    f(&mut cfg);
    rolter_mock::spawn(cfg).expect("spawn mock")
}

pub use rolter_mock::client::*;
