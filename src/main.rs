//! The `rolter` command: run, check, demo (feature `demo`), strategies.
//!
//! Exit codes: 0 success, 1 runtime failure (cannot bind, cannot start), 2 configuration
//! error (reported before any port is bound). Output to a closed pipe (`rolter strategies |
//! head -1`) ends the command quietly.

use std::io::{self, Write};
#[cfg(feature = "demo")]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
#[cfg(feature = "demo")]
use std::time::Duration;

use clap::{Parser, Subcommand};

use rolter::config;
use rolter::strategy::{options, registry};
use rolter::Gateway;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "rolter",
    version,
    about = "A thread-per-core gateway for OpenAI-compatible inference engines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve with a configuration file.
    Run {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a configuration file, print every error, exit non-zero if any.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Start three built-in mock engines and the gateway in front of them.
    #[cfg(feature = "demo")]
    Demo {
        /// Gateway listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Worker threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Admin listener (metrics, targets, kill switch); a free port is used instead when
        /// this one is taken.
        #[arg(long, default_value = "127.0.0.1:9091")]
        admin: SocketAddr,
    },
    /// List every strategy with its aliases, traits and options.
    Strategies,
}

/// The operational log on stderr: `ROLTER_LOG` filters it (default `info`), `[log] format`
/// picks text or JSON lines, and text has ANSI colours only when stderr is a terminal (not
/// the journal or a file).
fn init_logging(format: config::LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROLTER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr);
    match format {
        config::LogFormat::Json => builder.json().with_current_span(false).init(),
        config::LogFormat::Text => builder.with_ansi(io::stderr().is_terminal()).init(),
    }
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() {
    let (tx, rx) = mpsc::channel();
    let mut first = true;
    if let Err(e) = ctrlc::set_handler(move || {
        if first {
            first = false;
            let _ = tx.send(());
        } else {
            std::process::exit(130);
        }
    }) {
        tracing::warn!("cannot install the signal handler: {e}");
    }
    let _ = rx.recv();
}

/// Writes command output; a reader that went away (a closed pipe) is not an error.
fn emit(write: impl FnOnce(&mut io::StdoutLock<'_>) -> io::Result<()>) -> ExitCode {
    let mut out = io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rolter: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

/// `rolter strategies`: every strategy with its aliases, traits, summary and options, the
/// defaults read from each strategy's options type.
fn list_strategies(out: &mut impl Write) -> io::Result<()> {
    for s in registry::all() {
        writeln!(out, "{}", s.name)?;
        if !s.aliases.is_empty() {
            writeln!(out, "  aliases: {}", s.aliases.join(", "))?;
        }
        let traits: Vec<&str> = s.traits.iter().map(|t| t.label()).collect();
        writeln!(out, "  traits:  {}", traits.join(", "))?;
        writeln!(out, "  {}", s.summary)?;
        for o in s.options() {
            let default = o.default.as_deref().unwrap_or("none");
            writeln!(out, "  option {} (default {default}): {}", o.key, o.help)?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match config::load_file(&config) {
            Ok(c) => emit(|out| {
                writeln!(
                    out,
                    "{}: OK ({} targets, {} routes)",
                    config.display(),
                    c.targets.len(),
                    c.routes.len()
                )?;
                for r in &c.routes {
                    // The options that differ from the defaults, as they would be written.
                    let options: Vec<String> = r
                        .strategy
                        .non_default()
                        .iter()
                        .map(|(k, v)| format!("{k} = {}", options::render(v)))
                        .collect();
                    if options.is_empty() {
                        writeln!(out, "  route {}: strategy {}", r.name, r.strategy.name())?;
                    } else {
                        let (name, options) = (r.strategy.name(), options.join(", "));
                        writeln!(out, "  route {}: strategy {name} ({options})", r.name)?;
                    }
                }
                let on_off = |b: bool| if b { "on" } else { "off" };
                writeln!(
                    out,
                    "  health: active checks {}, passive ejection {}",
                    on_off(c.health.active),
                    on_off(c.health.failures > 0)
                )?;
                writeln!(out, "  metrics scrape: {}", on_off(c.scrape.enabled))?;
                match &c.admin {
                    Some(a) => writeln!(out, "  admin listener: {}", a.listen),
                    None => writeln!(out, "  admin listener: off"),
                }
            }),
            Err(errors) => {
                eprintln!("{errors}");
                eprintln!("{} error(s) in {}", errors.errors.len(), config.display());
                ExitCode::from(2)
            }
        },
        Command::Run { config } => {
            let cfg = match config::load_file(&config) {
                Ok(c) => c,
                Err(errors) => {
                    eprintln!("{errors}");
                    eprintln!(
                        "{} error(s) in {}; nothing was started",
                        errors.errors.len(),
                        config.display()
                    );
                    return ExitCode::from(2);
                }
            };
            // Set up from the configuration; its errors above went to stderr directly.
            init_logging(cfg.log.format);
            let grace = cfg.server.shutdown_grace;
            let gateway = match Gateway::start(cfg) {
                Ok(g) => g,
                Err(e) => {
                    tracing::error!("cannot start: {e}");
                    return ExitCode::from(1);
                }
            };
            wait_for_signal();
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                "stopping: draining in-flight requests"
            );
            gateway.shutdown(grace);
            ExitCode::SUCCESS
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            listen,
            workers,
            admin,
        } => {
            init_logging(config::LogFormat::Text);
            let demo = match rolter::demo::start(listen, workers, admin) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("cannot start the demo: {e}");
                    return ExitCode::from(1);
                }
            };
            println!("{}", rolter::demo::banner(&demo));
            wait_for_signal();
            demo.gateway.shutdown(Duration::from_secs(5));
            ExitCode::SUCCESS
        }
        Command::Strategies => emit(|out| list_strategies(out)),
    }
}
