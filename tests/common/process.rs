//! Running the `rolter` binary in tests: a child killed if the test fails first, a free
//! loopback port, signals, and waiting for it to listen or exit.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Kills the child if the test fails before it exits.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Waits until `addr` accepts connections.
pub fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the child to exit, at most `within`.
pub fn wait_exit(child: &mut Kill, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "the process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}
