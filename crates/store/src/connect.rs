//! Opening one connection to the store, per topology, with the timeouts applied.
//!
//! Owns turning [`StoreSettings`] into a live connection: a standalone server, the master a
//! sentinel names (asked here, each step bounded by the connect timeout, and checked with
//! `ROLE` so a stale sentinel answer during a failover is not trusted), or a cluster
//! connection. Credentials and the TLS CA are applied here. It must not issue the store's
//! own commands (the other modules do) nor retry beyond trying each sentinel once.

use redis::cluster::{ClusterClientBuilder, ClusterConnection};
use redis::{Client, Connection, ConnectionLike, IntoConnectionInfo, TlsCertificates, Value};

use crate::error::StoreError;
use crate::settings::{redact_url as redact, StoreSettings, Topology};

/// A connection to a single server (standalone or the sentinel's master) or to a cluster.
pub(crate) enum Conn {
    Node(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    pub(crate) fn link(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Node(c) => c,
            Conn::Cluster(c) => c.as_mut(),
        }
    }
}

/// Connects as `s` says (credentials, TLS, timeouts); no command of the store is sent.
pub(crate) fn open(s: &StoreSettings) -> Result<Conn, StoreError> {
    if let Some(problem) = s.problem() {
        return Err(StoreError::Invalid(problem));
    }
    let ca = match &s.tls_ca_file {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            StoreError::Invalid(format!(
                "cannot read the TLS CA file {}: {e}",
                path.display()
            ))
        })?),
        None => None,
    };
    match &s.topology {
        Topology::Standalone => node(&s.urls[0], s, ca.as_deref(), true).map(Conn::Node),
        Topology::Sentinel { master } => via_sentinels(master, s, ca.as_deref()).map(Conn::Node),
        Topology::Cluster => cluster(s, ca).map(|c| Conn::Cluster(Box::new(c))),
    }
}

/// One server at `url`; `ours` applies the settings' credentials (a sentinel keeps the
/// ones of its own URL).
fn node(
    url: &str,
    s: &StoreSettings,
    ca: Option<&[u8]>,
    ours: bool,
) -> Result<Connection, StoreError> {
    let mut info = url
        .into_connection_info()
        .map_err(|e| StoreError::Invalid(format!("store URL `{}`: {e}", redact(url))))?;
    if ours {
        let mut redis = info.redis_settings().clone();
        if let Some(user) = &s.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &s.password {
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
    }
    let client = match ca {
        Some(pem) if url.starts_with("rediss://") => Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => Client::open(info),
    }
    .map_err(|e| StoreError::Invalid(format!("store URL `{}`: {e}", redact(url))))?;
    let conn = client
        .get_connection_with_timeout(s.connect_timeout)
        .map_err(|e| connect_error(url, e))?;
    conn.set_read_timeout(Some(s.command_timeout))?;
    conn.set_write_timeout(Some(s.command_timeout))?;
    Ok(conn)
}

/// Asks each sentinel in turn for `master`'s address and connects to the first that
/// answers and really is a master.
fn via_sentinels(
    master: &str,
    s: &StoreSettings,
    ca: Option<&[u8]>,
) -> Result<Connection, StoreError> {
    let mut last = StoreError::Connect(format!("no sentinel knows a master named `{master}`"));
    for url in &s.urls {
        let addr: Option<(String, u16)> = match node(url, s, ca, false).and_then(|mut c| {
            Ok(redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master)
                .query(&mut c)?)
        }) {
            Ok(addr) => addr,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let Some((host, port)) = addr else {
            last = StoreError::Connect(format!(
                "sentinel {} knows no master named `{master}`",
                redact(url)
            ));
            continue;
        };
        let scheme = if url.starts_with("rediss://") {
            "rediss"
        } else {
            "redis"
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let master_url = format!("{scheme}://{host}:{port}");
        match node(&master_url, s, ca, true).and_then(|mut c| {
            let role: Vec<Value> = redis::cmd("ROLE").query(&mut c)?;
            Ok((role, c))
        }) {
            Ok((role, c)) if matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") => {
                return Ok(c)
            }
            Ok(_) => {
                last = StoreError::Connect(format!(
                    "{master_url}, named master `{master}` by sentinel {}, is not a master \
                     (failover in progress?)",
                    redact(url)
                ))
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn cluster(s: &StoreSettings, ca: Option<Vec<u8>>) -> Result<ClusterConnection, StoreError> {
    let mut b = ClusterClientBuilder::new(s.urls.iter().map(String::as_str))
        .connection_timeout(s.connect_timeout)
        .response_timeout(s.command_timeout)
        // A dead node fails the call at once; the state thread retries on its own schedule.
        .retries(1)
        .min_retry_wait(1)
        .max_retry_wait(10);
    if let Some(user) = &s.username {
        b = b.username(user);
    }
    if let Some(password) = &s.password {
        b = b.password(password);
    }
    if let Some(pem) = ca {
        b = b.certs(TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
    }
    let client = b
        .build()
        .map_err(|e| StoreError::Invalid(format!("cluster settings: {e}")))?;
    let conn = client
        .get_connection()
        .map_err(|e| connect_error(&s.urls[0], e))?;
    conn.set_read_timeout(Some(s.command_timeout))?;
    conn.set_write_timeout(Some(s.command_timeout))?;
    Ok(conn)
}

/// A failed connection attempt: a timeout, refused credentials, or unreachable `url`.
fn connect_error(url: &str, e: redis::RedisError) -> StoreError {
    match StoreError::from(e) {
        StoreError::Command(m) | StoreError::Decode(m) | StoreError::Connect(m) => {
            StoreError::Connect(format!("{}: {m}", redact(url)))
        }
        other => other,
    }
}
