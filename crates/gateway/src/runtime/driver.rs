//! Choosing and building a worker's monoio runtime: io_uring, falling back to epoll.
//!
//! Owns the driver decision and the timer setup; it must not spawn tasks.

use std::future::Future;
use std::io;

use monoio::blocking::DefaultThreadPool;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

use rolter_config::DriverChoice;

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

/// Ring setup for a worker: only this thread submits (SINGLE_ISSUER) and completions raise
/// no inter-processor interrupt (COOP_TASKRUN): the worker collects them whenever it enters
/// the kernel, which it does each time it has nothing left to run. (DEFER_TASKRUN was
/// measured too: no change in time to first byte, and it delays completions while the
/// worker is busy, so it is not used.)
fn uring_setup() -> io_uring::Builder {
    let mut b = io_uring::IoUring::builder();
    b.setup_coop_taskrun().setup_single_issuer();
    b
}

/// Runs `f` to completion on a new runtime of the given driver, with timers enabled.
pub fn block_on<F: Future>(driver: ActiveDriver, f: F) -> io::Result<F::Output> {
    block_on_with(driver, None, f)
}

/// As [`block_on`], with `pool` attached for `monoio::spawn_blocking` (CPU-heavy work a
/// worker hands off, such as local tokenization); without one, `spawn_blocking` panics.
pub fn block_on_with<F: Future>(
    driver: ActiveDriver,
    pool: Option<DefaultThreadPool>,
    f: F,
) -> io::Result<F::Output> {
    let attach = |b: RuntimeBuilder<monoio::time::TimeDriver<IoUringDriver>>| match &pool {
        Some(p) => b.attach_thread_pool(Box::new(p.clone())),
        None => b,
    };
    Ok(match driver {
        ActiveDriver::IoUring => {
            let tuned = attach(
                RuntimeBuilder::<IoUringDriver>::new()
                    .with_entries(1024)
                    .uring_builder(uring_setup())
                    .enable_timer(),
            )
            .build();
            // Kernels before 6.0 reject the setup flags: fall back to a plain ring.
            let mut runtime = match tuned {
                Ok(r) => r,
                Err(_) => attach(
                    RuntimeBuilder::<IoUringDriver>::new()
                        .with_entries(1024)
                        .enable_timer(),
                )
                .build()?,
            };
            runtime.block_on(f)
        }
        ActiveDriver::Epoll => {
            let b = RuntimeBuilder::<LegacyDriver>::new().enable_timer();
            let b = match &pool {
                Some(p) => b.attach_thread_pool(Box::new(p.clone())),
                None => b,
            };
            b.build()?.block_on(f)
        }
    })
}
