//! Choosing and building a worker's monoio runtime: io_uring, falling back to epoll.
//!
//! Owns the driver decision and the timer setup; it must not spawn tasks.

use std::future::Future;
use std::io;
use std::sync::OnceLock;

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

/// Resolves a configured choice against what the kernel allows. `auto` falls back to
/// epoll with a warning naming the cause; an explicit `io_uring` fails with it.
pub fn resolve(choice: DriverChoice) -> io::Result<ActiveDriver> {
    if choice == DriverChoice::Epoll {
        return Ok(ActiveDriver::Epoll);
    }
    match uring_unavailable() {
        None => Ok(ActiveDriver::IoUring),
        Some(cause) if choice == DriverChoice::Auto => {
            tracing::warn!(
                "io_uring is unavailable ({cause}); falling back to epoll (set \
                 server.driver = \"epoll\" to choose it and silence this warning)"
            );
            Ok(ActiveDriver::Epoll)
        }
        Some(cause) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "server.driver = \"io_uring\" but io_uring is unavailable: {cause}; use \
                 driver = \"auto\" to fall back to epoll"
            ),
        )),
    }
}

/// Why this process cannot run an io_uring worker, or `None` when it can: found once per
/// process, on a thread of its own. (A ring's teardown can queue kernel work to the thread
/// that made it, which interrupts that thread's blocking socket calls with EINTR; the
/// caller of `Gateway::start` must not get that.)
fn uring_unavailable() -> Option<String> {
    static CAUSE: OnceLock<Option<String>> = OnceLock::new();
    CAUSE
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("rolter-uring-probe".into())
                .spawn(probe_uring)
                .ok()
                .and_then(|t| t.join().ok())
                .unwrap_or_else(|| Some("the io_uring probe thread failed".to_string()))
        })
        .clone()
}

/// Creating a small ring first gives the error number (seccomp filters and
/// `kernel.io_uring_disabled` answer EPERM, old kernels ENOSYS); monoio's probe then checks
/// the operations it uses.
fn probe_uring() -> Option<String> {
    if let Err(e) = io_uring::IoUring::new(2) {
        return Some(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => format!(
                "io_uring_setup was denied ({e}): a seccomp filter (a container runtime's \
                 default profile, or a systemd unit's SystemCallFilter= without \
                 io_uring_setup io_uring_enter io_uring_register) or the sysctl \
                 kernel.io_uring_disabled"
            ),
            Some(libc::ENOSYS) => format!(
                "io_uring_setup is not implemented ({e}): a kernel older than 5.1 or built \
                 without io_uring, or a seccomp filter answering ENOSYS"
            ),
            Some(libc::ENOMEM) => format!(
                "io_uring_setup could not allocate its ring ({e}): raise RLIMIT_MEMLOCK \
                 (LimitMEMLOCK= in the unit; kernels before 5.12 charge rings to it)"
            ),
            _ => format!("io_uring_setup failed: {e}"),
        });
    }
    if monoio::utils::detect_uring() {
        return None;
    }
    Some(
        if std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER").is_some() {
            "MONOIO_FORCE_LEGACY_DRIVER is set in the environment".to_string()
        } else {
            "the kernel's io_uring lacks operations the runtime uses (kernel too old)".to_string()
        },
    )
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
