//! Choosing and building a worker's monoio runtime: io_uring, falling back to epoll.
//!
//! Owns the driver decision and the timer setup; it must not spawn tasks.

use std::future::Future;
use std::io;

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

use crate::config::DriverChoice;

/// The driver a worker actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveDriver {
    IoUring,
    Epoll,
}

impl ActiveDriver {
    pub fn label(self) -> &'static str {
        match self {
            ActiveDriver::IoUring => "io_uring",
            ActiveDriver::Epoll => "epoll",
        }
    }
}

/// Resolves a configured choice against what the kernel allows.
pub fn resolve(choice: DriverChoice) -> io::Result<ActiveDriver> {
    let uring = monoio::utils::detect_uring();
    match choice {
        DriverChoice::Auto if uring => Ok(ActiveDriver::IoUring),
        DriverChoice::Auto | DriverChoice::Epoll => Ok(ActiveDriver::Epoll),
        DriverChoice::IoUring if uring => Ok(ActiveDriver::IoUring),
        DriverChoice::IoUring => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "driver = \"io_uring\" but io_uring is unavailable here (kernel too old, disabled by \
             kernel.io_uring_disabled or seccomp, or RLIMIT_MEMLOCK too low); use driver = \"auto\"",
        )),
    }
}

/// Runs `f` to completion on a new runtime of the given driver, with timers enabled.
pub fn block_on<F: Future>(driver: ActiveDriver, f: F) -> io::Result<F::Output> {
    Ok(match driver {
        ActiveDriver::IoUring => RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(1024)
            .enable_timer()
            .build()?
            .block_on(f),
        ActiveDriver::Epoll => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .block_on(f),
    })
}
