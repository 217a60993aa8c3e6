//! `rolter-soak`: runs the soak (see the library) and prints its report.
//!
//!   rolter-soak [--duration 30m] [--clients 16] [--workers 2] [--rolter PATH] [--out DIR]

use std::path::PathBuf;
use std::time::Duration;

fn main() {
    let mut cfg = rolter_soak::SoakConfig {
        rolter: PathBuf::from("target/release/rolter"),
        duration: Duration::from_secs(60),
        clients: 16,
        workers: 2,
        out: std::env::temp_dir().join(format!("rolter-soak-{}", std::process::id())),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("rolter-soak: {a} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--duration" => {
                cfg.duration = humantime::parse_duration(&value()).unwrap_or_else(|e| {
                    eprintln!("rolter-soak: --duration: {e}");
                    std::process::exit(2)
                })
            }
            "--clients" => cfg.clients = value().parse().expect("--clients: a number"),
            "--workers" => cfg.workers = value().parse().expect("--workers: a number"),
            "--rolter" => cfg.rolter = PathBuf::from(value()),
            "--out" => cfg.out = PathBuf::from(value()),
            "-h" | "--help" => {
                println!("rolter-soak [--duration 30m] [--clients 16] [--workers 2] [--rolter PATH] [--out DIR]");
                return;
            }
            other => {
                eprintln!("rolter-soak: unknown option {other}");
                std::process::exit(2)
            }
        }
    }
    match rolter_soak::run(&cfg) {
        Ok(r) => {
            println!("{}", r.markdown());
            println!("(report: {})", cfg.out.display());
            if r.lost > 0 {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("rolter-soak: {e}");
            std::process::exit(1);
        }
    }
}
