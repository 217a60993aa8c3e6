//! The `rolter` command: run (and `--upgrade`), reload, check, keys (hash, new), demo
//! (feature `demo`), strategies.
//!
//! Signals while running: SIGTERM and SIGINT drain and exit (a second one exits at once),
//! SIGHUP reloads the configuration file, SIGUSR2 starts the binary on disk as a new process
//! that takes the listening sockets over (`--upgrade`), SIGUSR1 reopens the log files.
//!
//! Exit codes: 0 success, 1 runtime failure (cannot bind, cannot start, another instance
//! runs, a refused reload), 2 configuration error (reported before any port is bound).
//! Output to a closed pipe (`rolter strategies | head -1`) ends the command quietly.

use std::io::{self, Write};
#[cfg(feature = "demo")]
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
#[cfg(feature = "demo")]
use std::time::Duration;

use clap::{Parser, Subcommand};

use rolter::config;
use rolter::gateway::runtime::control_socket::{self, ControlServer, Serving};
use rolter::gateway::runtime::listener;
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
        /// Take the listening sockets over from the gateway running with this
        /// configuration (a binary upgrade): it drains and exits once this one serves, and
        /// no connection is lost. Without it, a gateway already running is an error.
        #[arg(long)]
        upgrade: bool,
    },
    /// Ask the gateway running with this configuration file to reload it: exits 0 when it
    /// applied the new file, 1 with every error when it refused (and kept the old one).
    Reload {
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
        /// A disaggregated fleet instead: prefill and decode engines behind a P/D route.
        #[arg(long)]
        pd: bool,
    },
    /// List every strategy with its aliases, traits and options.
    Strategies,
    /// Client API keys for `[[keys]]`: only their hashes go in the configuration.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Read a key from stdin (one line) and print its `hash = "sha256:…"` line.
    Hash,
    /// Generate a random key, print it once, and the `[[keys]]` table to paste (which
    /// holds only its hash).
    New {
        /// The key's name (its label in the access log and the metrics).
        #[arg(long)]
        name: String,
    },
}

/// What every generated key starts with, so scanners and people recognise one.
const KEY_PREFIX: &str = "rolter_";

/// `rolter keys hash` and `rolter keys new`.
fn keys_command(command: KeysCommand) -> ExitCode {
    match command {
        KeysCommand::Hash => {
            let mut line = String::new();
            if let Err(e) = io::stdin().read_line(&mut line) {
                eprintln!("error: cannot read the key from stdin: {e}");
                return ExitCode::from(1);
            }
            let key = line.trim_end_matches(['\r', '\n']).trim();
            if key.is_empty() {
                eprintln!(
                    "error: no key on stdin (fix: pipe the key in, e.g. `printf %s \"$KEY\" | rolter keys hash`, or run `rolter keys new --name NAME` for a new one)"
                );
                return ExitCode::from(2);
            }
            emit(|out| writeln!(out, "hash = \"{}\"", config::key_hash(key)))
        }
        KeysCommand::New { name } => {
            let valid = name.len() <= 64
                && name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid {
                eprintln!(
                    "error: --name `{name}` is not 1 to 64 letters, digits, '_', '-' or '.' starting with a letter or digit (fix: e.g. --name team-search)"
                );
                return ExitCode::from(2);
            }
            let mut bytes = [0u8; 32];
            if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err()
            {
                eprintln!("error: the system's random number generator failed");
                return ExitCode::from(1);
            }
            let key: String = std::iter::once(KEY_PREFIX.to_string())
                .chain(bytes.iter().map(|b| format!("{b:02x}")))
                .collect();
            emit(|out| {
                // The key alone on the first line (for `head -1`); never in the table.
                writeln!(out, "{key}")?;
                writeln!(out)?;
                writeln!(
                    out,
                    "# The key above is shown only now: give it to the client."
                )?;
                writeln!(
                    out,
                    "# Paste this table into the configuration or the keys file:"
                )?;
                writeln!(out, "[[keys]]")?;
                writeln!(out, "name = \"{name}\"")?;
                writeln!(out, "hash = \"{}\"", config::key_hash(&key))
            })
        }
    }
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

/// What the running process is asked to do, by a signal or the control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// SIGTERM or SIGINT: drain and exit.
    Stop,
    /// SIGHUP.
    Reload,
    /// SIGUSR1.
    ReopenLogs,
    /// SIGUSR2: start the binary on disk with `--upgrade`.
    Upgrade,
    /// A new process took the listening sockets over: drain and exit.
    UpgradedAway,
}

/// Turns the signals into events on a thread of their own. A second SIGTERM or SIGINT
/// exits at once (130).
fn signal_events(tx: mpsc::Sender<Event>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    let mut signals =
        match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot install the signal handlers: {e}");
                return;
            }
        };
    let spawned = std::thread::Builder::new()
        .name("rolter-signals".into())
        .spawn(move || {
            let mut stopping = false;
            for sig in signals.forever() {
                let event = match sig {
                    SIGHUP => Event::Reload,
                    SIGUSR1 => Event::ReopenLogs,
                    SIGUSR2 => Event::Upgrade,
                    _ if stopping => std::process::exit(130),
                    _ => {
                        stopping = true;
                        Event::Stop
                    }
                };
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the signal thread: {e}");
    }
}

/// Blocks until SIGINT or SIGTERM.
#[cfg(feature = "demo")]
fn wait_for_stop() {
    let (tx, rx) = mpsc::channel();
    signal_events(tx);
    while let Ok(e) = rx.recv() {
        if e == Event::Stop {
            return;
        }
    }
}

/// `rolter run`: start (or take over from a running gateway), serve, and answer signals
/// until a stop or a handover.
fn run(path: &Path, upgrade: bool) -> ExitCode {
    let cfg = match config::load_file(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!(
                "{} error(s) in {}; nothing was started",
                errors.errors.len(),
                path.display()
            );
            return ExitCode::from(2);
        }
    };
    // Set up from the configuration; its errors above went to stderr directly.
    init_logging(cfg.log.format);
    // The path of this binary now, before a package manager replaces the file: an upgrade
    // runs whatever is at this path then.
    let exe = std::env::current_exe().ok();
    let socket = control_socket::path_for(&cfg);
    let grace = cfg.server.shutdown_grace;
    // Signals are caught from here on: one that arrives while the gateway starts (systemd
    // may stop or reload right after READY=1) waits in the channel instead of killing the
    // process with the default action.
    let (tx, rx) = mpsc::channel();
    signal_events(tx.clone());
    let (started, handover) = if upgrade {
        match take_over(cfg, &socket) {
            Ok((g, h)) => (Ok(g), Some(h)),
            Err(e) => (Err(e), None),
        }
    } else {
        if let Some(running) = control_socket::status(&socket) {
            tracing::error!(
                "another gateway runs with this configuration ({running}, control socket {}): \
                 stop it first, or replace it without dropping a connection with \
                 `rolter run --upgrade --config {}`",
                socket.display(),
                path.display()
            );
            return ExitCode::from(1);
        }
        (Gateway::start(cfg), None)
    };
    let gateway = match started {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let control = start_control_socket(&gateway, &socket, tx);
    if let Some(h) = handover {
        if let Err(e) = h.ready() {
            tracing::warn!("upgrade: the old gateway did not confirm its drain: {e}");
        }
    }
    // The process SIGUSR2 started: under systemd it becomes the main process once it serves.
    let mut upgrading: Option<std::process::Child> = None;
    let stop_reason = loop {
        let Ok(event) = rx.recv() else {
            break "the signal thread ended";
        };
        match event {
            Event::Stop => break "stop signal",
            Event::UpgradedAway => {
                if let Some(c) = upgrading.as_mut() {
                    if matches!(c.try_wait(), Ok(None)) {
                        rolter::gateway::notify::main_pid(c.id());
                    }
                }
                break "a new process took over";
            }
            Event::Reload => {
                // The outcome is logged and counted by the gateway.
                let _ = gateway.reload();
            }
            Event::ReopenLogs => {
                tracing::info!("SIGUSR1: reopening the access log");
                gateway.reopen_logs();
            }
            Event::Upgrade => {
                if let Some(c) = spawn_upgrade(exe.as_deref(), path) {
                    upgrading = Some(c);
                }
            }
        }
    };
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "stopping ({stop_reason}): draining in-flight requests"
    );
    // The control socket's copies of the listening sockets close first.
    drop(control);
    gateway.shutdown(grace);
    ExitCode::SUCCESS
}

/// `--upgrade`: the running gateway's sockets, and this gateway started on them.
fn take_over(
    cfg: config::Config,
    socket: &Path,
) -> std::io::Result<(Gateway, control_socket::Handover)> {
    let mut h = control_socket::take_over(socket)?;
    let want = cfg.server.workers.max(1);
    if h.listeners.len() != want {
        return Err(std::io::Error::other(format!(
            "--upgrade: the running gateway has {} workers and this configuration {want}; \
             a handover keeps every listening socket, so set server.workers = {}",
            h.listeners.len(),
            h.listeners.len()
        )));
    }
    let got = h.listeners[0].local_addr()?;
    let listen = cfg.server.listen;
    if got.ip() != listen.ip() || (listen.port() != 0 && got.port() != listen.port()) {
        return Err(std::io::Error::other(format!(
            "--upgrade: the running gateway listens on {got}, this configuration on {listen}"
        )));
    }
    let admin = match (&cfg.admin, h.admin.take()) {
        (Some(a), Some(l)) if l.local_addr().ok() == Some(a.listen) => Some(l),
        (Some(a), _) => Some(listener::bind_admin(a.listen)?),
        (None, _) => None,
    };
    let listeners = std::mem::take(&mut h.listeners);
    Ok((Gateway::start_on(cfg, listeners, admin)?, h))
}

/// Serves the control socket (`rolter reload`, `--upgrade`); a gateway without one still
/// reloads on SIGHUP and through the admin API.
fn start_control_socket(
    gateway: &Gateway,
    socket: &Path,
    events: mpsc::Sender<Event>,
) -> Option<ControlServer> {
    let (listeners, admin) = match gateway.listening_sockets() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("no control socket: {e}");
            return None;
        }
    };
    let serving = Serving {
        listeners,
        admin,
        reloads: gateway.reloads().clone(),
        on_upgraded: Box::new(move || {
            let _ = events.send(Event::UpgradedAway);
        }),
        describe: format!("listening on {}", gateway.local_addr()),
    };
    match ControlServer::start(socket, serving) {
        Ok(c) => {
            tracing::info!(socket = %socket.display(), "control socket listening");
            Some(c)
        }
        Err(e) => {
            tracing::warn!(
                "no control socket ({e}): `rolter reload` and `--upgrade` are unavailable; \
                 SIGHUP and POST /admin/reload still reload (set server.control_socket to a \
                 writable path)"
            );
            None
        }
    }
}

/// SIGUSR2: runs the binary now at this path as `rolter run --upgrade` with the same
/// configuration; it takes the sockets over, and this process drains when it says so.
fn spawn_upgrade(exe: Option<&Path>, config: &Path) -> Option<std::process::Child> {
    let Some(exe) = exe else {
        tracing::warn!(
            "SIGUSR2: this binary's path is unknown; run `rolter run --upgrade` by hand"
        );
        return None;
    };
    match std::process::Command::new(exe)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--upgrade")
        .stdin(std::process::Stdio::null())
        .spawn()
    {
        Ok(child) => {
            tracing::info!(
                pid = child.id(),
                exe = %exe.display(),
                "SIGUSR2: started the new binary; it takes the sockets over"
            );
            Some(child)
        }
        Err(e) => {
            tracing::warn!("SIGUSR2: cannot start {}: {e}", exe.display());
            None
        }
    }
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
        Command::Run { config, upgrade } => run(&config, upgrade),
        Command::Reload { config } => {
            // The running gateway loads the file itself and answers with every error.
            let (port, explicit) = config::peek_control(&config);
            let socket = control_socket::path_from(port, explicit.as_deref());
            match control_socket::request_reload(&socket) {
                Ok(report) => emit(|out| writeln!(out, "{report}")),
                Err(message) => {
                    eprintln!("{message}");
                    ExitCode::from(1)
                }
            }
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            listen,
            workers,
            admin,
            pd,
        } => {
            init_logging(config::LogFormat::Text);
            let fleet = if pd {
                rolter::demo::Fleet::Disaggregated
            } else {
                rolter::demo::Fleet::Speeds
            };
            let demo = match rolter::demo::start(listen, workers, admin, fleet) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("cannot start the demo: {e}");
                    return ExitCode::from(1);
                }
            };
            println!("{}", rolter::demo::banner(&demo));
            wait_for_stop();
            demo.gateway.shutdown(Duration::from_secs(5));
            ExitCode::SUCCESS
        }
        Command::Strategies => emit(|out| list_strategies(out)),
        Command::Keys { command } => keys_command(command),
    }
}
