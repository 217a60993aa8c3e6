//! The `rolter` binary as operators run it: `rolter run --config <file>` as a child process
//! on free loopback ports, with its admin listener, killed when the test ends.

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rolter::config::DriverChoice;

use super::process::{free_port, Kill};
use super::{call, driver_name, request};

const BIN: &str = env!("CARGO_BIN_EXE_rolter");

/// A running `rolter run` child.
pub struct Gw {
    pub child: Kill,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl Gw {
    /// Starts the binary under `driver` with `workers` workers, an admin listener, the access
    /// log off, `server_extra` appended to `[server]`, and `rest` (targets, routes, any other
    /// table) after it.
    pub fn start(driver: DriverChoice, workers: usize, server_extra: &str, rest: &str) -> Gw {
        Gw::start_logging(driver, workers, server_extra, rest, false)
    }

    /// [`Gw::start`], with the access log written to [`Gw::access_log`] when `access`.
    pub fn start_logging(
        driver: DriverChoice,
        workers: usize,
        server_extra: &str,
        rest: &str,
        access: bool,
    ) -> Gw {
        let dir = tempfile::tempdir().unwrap();
        let log = if access {
            format!("{:?}", dir.path().join("access.log"))
        } else {
            "\"off\"".to_string()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let text = format!(
            "[server]\nlisten = \"{addr}\"\nworkers = {workers}\npin_workers = false\n\
             driver = \"{}\"\nshutdown_grace = \"1s\"\n{server_extra}\n\n\
             [log]\naccess = {log}\n\n[admin]\nlisten = \"{admin}\"\n\n{rest}",
            driver_name(driver)
        );
        let path = dir.path().join("rolter.toml");
        std::fs::write(&path, &text).unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut gw = Gw {
            child: Kill(child),
            addr,
            admin,
            dir,
        };
        let t = Instant::now();
        while TcpStream::connect(gw.addr).is_err() || TcpStream::connect(gw.admin).is_err() {
            if let Some(s) = gw.child.0.try_wait().unwrap() {
                panic!("rolter exited ({s}):\n{}\n{text}", gw.stderr());
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "rolter did not listen:\n{}",
                gw.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        gw
    }

    /// The access log's lines so far (parsed), when started with one.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// A GET on the admin listener: its body.
    pub fn admin_get(&self, path: &str) -> String {
        call(self.admin, &request("GET", path, &[], "")).text()
    }

    /// The value of one series of `/metrics`, written as rendered; `None` when absent.
    pub fn series(&self, series: &str) -> Option<f64> {
        series_at(&self.admin_get("/metrics"), series)
    }
}

/// The value of `series` (name and labels as rendered) in a `/metrics` page.
pub fn series_at(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
