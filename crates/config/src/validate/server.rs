//! `[server]`: listen address, workers, driver, limits, shutdown grace.

use super::common::*;
use super::server_tls::server_tls;

/// `[server]`, its `[server.limits]` and `[server.tls]`; `None` when any key has an error.
pub(super) fn server(
    raw: RawServer,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ServerConfig> {
    let listen = match raw.listen.as_deref() {
        None => Some(
            DEFAULT_LISTEN
                .parse()
                .expect("valid default listen address"),
        ),
        Some(s) => listen_addr(s, host, errs),
    };
    let workers = workers(raw.workers, host, errs);
    let driver = driver(raw.driver.as_deref(), errs);
    let shutdown_grace = duration(
        raw.shutdown_grace.as_ref(),
        "server.shutdown_grace",
        DEFAULT_SHUTDOWN_GRACE,
        true,
        errs,
    );
    let dns_refresh = dns_refresh(raw.dns_refresh.as_ref(), errs);
    let nameservers = nameservers(raw.nameservers, errs);
    let max_connections = max_connections(raw.max_connections, errs);
    let limits = limits(raw.limits.unwrap_or_default(), errs);
    let control_socket = control_socket(raw.control_socket.as_deref(), host, errs);
    let underscores_in_headers =
        underscores_in_headers(raw.underscores_in_headers.as_deref(), errs);
    let busy_poll = busy_poll(raw.busy_poll.as_ref(), errs);
    let tls = match raw.tls {
        None => Some(None),
        Some(t) => server_tls(t, host, errs).map(Some),
    };
    Some(ServerConfig {
        listen: listen?,
        workers: workers?,
        pin_workers: raw.pin_workers.unwrap_or(true),
        driver: driver?,
        limits: limits?,
        shutdown_grace: shutdown_grace?,
        control_socket: control_socket?,
        dns_refresh: dns_refresh?,
        nameservers: nameservers?,
        max_connections: max_connections?,
        underscores_in_headers: underscores_in_headers?,
        tls: tls?,
        busy_poll: busy_poll?,
    })
}

/// `server.workers`: 0 (or absent) for one per core, else 1 to 4096.
fn workers(v: Option<i64>, host: &Host<'_>, errs: &mut Collector) -> Option<usize> {
    match v {
        None | Some(0) => Some(host.cores.max(1)),
        Some(n) if n < 0 => {
            errs.push(
                "server.workers",
                format!("workers is {n}, a negative number"),
                "set workers = 0 for one worker per core, or a positive count",
            );
            None
        }
        Some(n) if n > 4096 => {
            errs.push(
                "server.workers",
                format!("workers is {n}, more than the limit of 4096"),
                "set workers = 0 for one worker per core, or a count of at most 4096",
            );
            None
        }
        Some(n) => Some(n as usize),
    }
}

/// `server.driver`: `auto` (the default), `io_uring` or `epoll`.
fn driver(v: Option<&str>, errs: &mut Collector) -> Option<DriverChoice> {
    match v {
        None | Some("auto") => Some(DriverChoice::Auto),
        Some("io_uring") => Some(DriverChoice::IoUring),
        Some("epoll") => Some(DriverChoice::Epoll),
        Some(other) => {
            let valid = ["auto", "io_uring", "epoll"];
            let best = closest(other, &valid).unwrap_or("auto");
            errs.push(
                "server.driver",
                format!("unknown driver `{other}`"),
                format!("use one of auto, io_uring, epoll (did you mean `{best}`?)"),
            );
            None
        }
    }
}

/// `server.max_connections`: greater than 0, [`DEFAULT_MAX_CONNECTIONS`] when absent.
fn max_connections(v: Option<i64>, errs: &mut Collector) -> Option<usize> {
    match v {
        None => Some(DEFAULT_MAX_CONNECTIONS),
        Some(n) if n <= 0 => {
            errs.push(
                "server.max_connections",
                format!("max_connections is {n}; it must be greater than 0"),
                format!(
                    "remove the key for the default of {DEFAULT_MAX_CONNECTIONS}, or set the \
                     most client connections the gateway keeps open at once"
                ),
            );
            None
        }
        Some(n) => Some(n as usize),
    }
}

/// `server.control_socket`: a non-empty path, relative ones taken from the configuration's
/// directory; `Some(None)` when absent (the default place).
fn control_socket(
    v: Option<&str>,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<Option<PathBuf>> {
    match v {
        None => Some(None),
        Some("") => {
            errs.push(
                "server.control_socket",
                "control_socket is empty",
                "remove the key for the default place, or give the path of a UNIX socket, \
                 e.g. control_socket = \"/run/rolter/rolter.sock\"",
            );
            None
        }
        Some(p) => Some(Some(config_path(host.config_dir, p))),
    }
}

/// `server.underscores_in_headers`: `drop` (the default), `reject` or `forward`.
fn underscores_in_headers(v: Option<&str>, errs: &mut Collector) -> Option<UnderscoreHeaders> {
    match v {
        None | Some("drop") => Some(UnderscoreHeaders::Drop),
        Some("reject") => Some(UnderscoreHeaders::Reject),
        Some("forward") => Some(UnderscoreHeaders::Forward),
        Some(other) => {
            errs.push(
                "server.underscores_in_headers",
                format!("`{other}` is not a choice for header names with an underscore"),
                "use \"drop\" (the default: ignored, not forwarded), \"reject\" (400) or \"forward\"",
            );
            None
        }
    }
}

/// `server.busy_poll`: zero (off) up to [`MAX_BUSY_POLL`].
fn busy_poll(v: Option<&toml::Value>, errs: &mut Collector) -> Option<Duration> {
    const KEY: &str = "server.busy_poll";
    let d = duration(v, KEY, Duration::ZERO, true, errs)?;
    if d > MAX_BUSY_POLL {
        errs.push(
            KEY,
            format!(
                "busy_poll is {}, longer than the maximum of {}",
                humantime::format_duration(d),
                humantime::format_duration(MAX_BUSY_POLL)
            ),
            "use a polling time such as \"200us\" to \"2ms\", or \"0s\" (the default) to \
             sleep whenever the worker has nothing to run",
        );
        return None;
    }
    Some(d)
}

/// `server.dns_refresh`: zero (resolve once, at load) or at least [`MIN_DNS_REFRESH`], so a
/// typo such as "30ms" cannot send a query per target every few milliseconds.
fn dns_refresh(v: Option<&toml::Value>, errs: &mut Collector) -> Option<Duration> {
    const KEY: &str = "server.dns_refresh";
    let d = duration(v, KEY, DEFAULT_DNS_REFRESH, true, errs)?;
    if !d.is_zero() && d < MIN_DNS_REFRESH {
        errs.push(
            KEY,
            format!(
                "dns_refresh is {}, shorter than the minimum of {}",
                humantime::format_duration(d),
                humantime::format_duration(MIN_DNS_REFRESH)
            ),
            "use at least \"1s\" (default \"30s\"), or \"0s\" to resolve host names only at load",
        );
        return None;
    }
    Some(d)
}

/// `server.nameservers`: `ip` or `ip:port` each (port 53 when absent); none: the ones of
/// `/etc/resolv.conf`.
fn nameservers(v: Option<Vec<String>>, errs: &mut Collector) -> Option<Vec<SocketAddr>> {
    let mut out = Vec::new();
    let mut ok = true;
    for (i, s) in v.unwrap_or_default().iter().enumerate() {
        let parsed = s.parse::<SocketAddr>().ok().or_else(|| {
            s.parse::<std::net::IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 53))
        });
        match parsed {
            Some(a) => out.push(a),
            None => {
                ok = false;
                errs.push(
                    format!("server.nameservers[{i}]"),
                    format!("`{s}` is not an IP address or ip:port"),
                    "write a nameserver's address, e.g. \"10.96.0.10\" or \"127.0.0.1:5353\" \
                     (leave nameservers out to use those of /etc/resolv.conf)",
                );
            }
        }
    }
    ok.then_some(out)
}

pub(super) fn listen_addr(s: &str, host: &Host<'_>, errs: &mut Collector) -> Option<SocketAddr> {
    socket_addr(s, "server.listen", 8080, host, errs)
}

/// A listen address `host:port` (IP literal, or a name resolved once); `port` is the port
/// used in the examples of the fix.
pub(super) fn socket_addr(
    s: &str,
    key: &str,
    port: u16,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<SocketAddr> {
    let fix = format!(
        "write an address and port such as \"127.0.0.1:{port}\", \"0.0.0.0:{port}\" or \"[::]:{port}\""
    );
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    let Some((name, port)) = s.rsplit_once(':') else {
        errs.push(key, format!("`{s}` has no port"), fix);
        return None;
    };
    let Ok(port) = port.parse::<u16>() else {
        errs.push(key, format!("`{s}` has an invalid port `{port}`"), fix);
        return None;
    };
    if name.is_empty() {
        errs.push(key, format!("`{s}` has no host"), fix);
        return None;
    }
    match (host.resolve)(name, port) {
        Ok(addrs) if !addrs.is_empty() => Some(addrs[0]),
        Ok(_) => {
            errs.push(key, format!("host `{name}` resolved to no address"), fix);
            None
        }
        Err(e) => {
            errs.push(key, format!("cannot resolve host `{name}`: {e}"), fix);
            None
        }
    }
}

pub(super) fn limits(raw: RawLimits, errs: &mut Collector) -> Option<Limits> {
    let d = Limits::default();
    let size = |v: Option<i64>, key: &str, default: usize, errs: &mut Collector| {
        positive(v, &format!("server.limits.{key}"), errs)
            .map(|v| v.map_or(default, |v| v as usize))
    };
    let max_head_bytes = size(raw.max_head_bytes, "max_head_bytes", d.max_head_bytes, errs);
    let mut max_headers = size(raw.max_headers, "max_headers", d.max_headers, errs);
    if let Some(n) = max_headers.filter(|&n| n > rolter_codec::h1::request_head::MAX_HEADERS_CAP) {
        errs.push(
            "server.limits.max_headers",
            format!(
                "{n} is over the largest supported value, {}",
                rolter_codec::h1::request_head::MAX_HEADERS_CAP
            ),
            format!(
                "set max_headers to at most {}",
                rolter_codec::h1::request_head::MAX_HEADERS_CAP
            ),
        );
        max_headers = None;
    }
    let max_uri_bytes = size(raw.max_uri_bytes, "max_uri_bytes", d.max_uri_bytes, errs);
    let max_body_bytes = size(raw.max_body_bytes, "max_body_bytes", d.max_body_bytes, errs);
    let t = |v: Option<&toml::Value>, key: &str, default: Duration, errs: &mut Collector| {
        duration(v, &format!("server.limits.{key}"), default, false, errs)
    };
    let head_timeout = t(
        raw.head_timeout.as_ref(),
        "head_timeout",
        d.head_timeout,
        errs,
    );
    let body_timeout = t(
        raw.body_timeout.as_ref(),
        "body_timeout",
        d.body_timeout,
        errs,
    );
    let keepalive_timeout = t(
        raw.keepalive_timeout.as_ref(),
        "keepalive_timeout",
        d.keepalive_timeout,
        errs,
    );
    let write_timeout = t(
        raw.write_timeout.as_ref(),
        "write_timeout",
        d.write_timeout,
        errs,
    );
    Some(Limits {
        max_head_bytes: max_head_bytes?,
        max_headers: max_headers?,
        max_uri_bytes: max_uri_bytes?,
        max_body_bytes: max_body_bytes?,
        head_timeout: head_timeout?,
        body_timeout: body_timeout?,
        keepalive_timeout: keepalive_timeout?,
        write_timeout: write_timeout?,
    })
}
