//! `[server.tls]`: the listener's certificates and keys (read, parsed and checked to match
//! here, so a bad file stops a start or a reload before anything is served with it), the
//! SNI certificates, the handshake timeout and the oldest protocol version.
//!
//! Owns reading the certificate and key files. It must not build the TLS server itself:
//! the gateway does, from the checked keys.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::common::*;

/// `server.tls.handshake_timeout` when not set.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn server_tls(
    raw: RawServerTls,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<ServerTls> {
    let default = tls_cert(
        raw.cert_file.as_deref(),
        raw.key_file.as_deref(),
        "server.tls",
        host,
        errs,
    );
    let handshake_timeout = duration(
        raw.handshake_timeout.as_ref(),
        "server.tls.handshake_timeout",
        DEFAULT_HANDSHAKE_TIMEOUT,
        false,
        errs,
    );
    let min_version = match raw.min_version.as_deref() {
        None | Some("1.2") => Some(TlsVersion::Tls12),
        Some("1.3") => Some(TlsVersion::Tls13),
        Some(other) => {
            errs.push(
                "server.tls.min_version",
                format!("`{other}` is not a TLS version rolter serves"),
                "write min_version = \"1.2\" (the default: TLS 1.2 and 1.3) or \"1.3\" (TLS 1.3 only)",
            );
            None
        }
    };
    let mut sni = Some(Vec::new());
    let mut seen: HashSet<String> = HashSet::new();
    for (i, e) in raw.sni.unwrap_or_default().into_iter().enumerate() {
        let at = format!("server.tls.sni[{i}]");
        let names = sni_names(e.names, &at, &mut seen, errs);
        let cert = tls_cert(
            e.cert_file.as_deref(),
            e.key_file.as_deref(),
            &at,
            host,
            errs,
        );
        match (names, cert, sni.as_mut()) {
            (Some(names), Some(cert), Some(list)) => list.push(SniCert { names, cert }),
            _ => sni = None,
        }
    }
    Some(ServerTls {
        default: default?,
        sni: sni?,
        handshake_timeout: handshake_timeout?,
        min_version: min_version?,
    })
}

/// An SNI entry's `names`: DNS names (lowercased), `*.` wildcards allowed for one label,
/// each name in one entry only.
fn sni_names(
    names: Option<Vec<String>>,
    at: &str,
    seen: &mut HashSet<String>,
    errs: &mut Collector,
) -> Option<Vec<String>> {
    let key = format!("{at}.names");
    let names = match names {
        Some(n) if !n.is_empty() => n,
        _ => {
            errs.push(
                key,
                "an SNI certificate needs the names it is served for",
                "add names = [\"api.example.com\"] (a `*.example.com` wildcard matches one label)",
            );
            return None;
        }
    };
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let lower = n.trim_end_matches('.').to_ascii_lowercase();
        let bare = lower.strip_prefix("*.").unwrap_or(&lower);
        let valid = rustls::pki_types::DnsName::try_from(bare.to_string()).is_ok()
            && bare.parse::<IpAddr>().is_err()
            && !bare.contains('*');
        if !valid {
            errs.push(
                &key,
                format!("`{n}` is not a DNS name a client can send as SNI"),
                "write host names such as \"api.example.com\" or \"*.example.com\" (clients send no SNI for IP addresses: the default certificate answers them)",
            );
            return None;
        }
        if !seen.insert(lower.clone()) {
            errs.push(
                &key,
                format!("`{n}` is named by more than one [[server.tls.sni]] entry"),
                "name each host in one entry only",
            );
            return None;
        }
        out.push(lower);
    }
    Some(out)
}

/// `cert_file` and `key_file` under `at`: both read, the chain and the key parsed, and the
/// key checked to be the certificate's.
fn tls_cert(
    cert_file: Option<&str>,
    key_file: Option<&str>,
    at: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<TlsCert> {
    let cert_key = format!("{at}.cert_file");
    let key_key = format!("{at}.key_file");
    let cert_path = required_path(
        cert_file,
        &cert_key,
        "the PEM certificate chain (leaf first)",
        host,
        errs,
    );
    let key_path = required_path(
        key_file,
        &key_key,
        "the PEM private key (PKCS#8, RSA or EC)",
        host,
        errs,
    );
    let (cert_path, key_path) = (cert_path?, key_path?);
    let chain = read_chain(&cert_path, &cert_key, errs);
    let key = read_key(&key_path, &key_key, errs);
    let (chain, key) = (chain?, key?);
    let provider = rustls::crypto::ring::default_provider();
    match CertifiedKey::from_der(chain, key, &provider) {
        Ok(k) => Some(TlsCert {
            cert_file: cert_path,
            key_file: key_path,
            key: Arc::new(k),
        }),
        Err(e) => {
            errs.push(
                key_key,
                format!(
                    "the key in `{}` cannot serve the certificate in `{}`: {e}",
                    key_path.display(),
                    cert_path.display()
                ),
                "use the private key the certificate was issued for (compare `openssl x509 -noout -pubkey -in CERT` with `openssl pkey -pubout -in KEY`), in PEM",
            );
            None
        }
    }
}

fn required_path(
    v: Option<&str>,
    key: &str,
    what: &str,
    host: &Host<'_>,
    errs: &mut Collector,
) -> Option<PathBuf> {
    match v {
        None | Some("") => {
            errs.push(
                key,
                format!("{key} is missing or empty"),
                format!("give the path of {what}; relative paths are resolved against the configuration file's directory"),
            );
            None
        }
        Some(p) => Some(config_path(host.config_dir, p)),
    }
}

fn read_file(path: &Path, key: &str, errs: &mut Collector) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => Some(b),
        Err(e) => {
            errs.push(
                key,
                format!("cannot read `{}`: {e}", path.display()),
                "check the path (relative paths are resolved against the configuration file's directory) and that the file is readable by rolter",
            );
            None
        }
    }
}

fn read_chain(
    path: &Path,
    key: &str,
    errs: &mut Collector,
) -> Option<Vec<CertificateDer<'static>>> {
    let bytes = read_file(path, key, errs)?;
    let mut chain = Vec::new();
    for item in CertificateDer::pem_slice_iter(&bytes) {
        match item {
            Ok(c) => chain.push(c),
            Err(e) => {
                errs.push(
                    key,
                    format!("`{}` is not valid PEM: {e}", path.display()),
                    "use a PEM file of `-----BEGIN CERTIFICATE-----` blocks, the server's certificate first, then its intermediates",
                );
                return None;
            }
        }
    }
    if chain.is_empty() {
        errs.push(
            key,
            format!("`{}` contains no certificate", path.display()),
            "put the server's certificate (then its intermediates) in the file as `-----BEGIN CERTIFICATE-----` PEM blocks",
        );
        return None;
    }
    Some(chain)
}

fn read_key(path: &Path, key: &str, errs: &mut Collector) -> Option<PrivateKeyDer<'static>> {
    let bytes = read_file(path, key, errs)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(k) => Some(k),
        Err(e) => {
            errs.push(
                key,
                format!("`{}` holds no usable private key: {e}", path.display()),
                "use a PEM private key: `-----BEGIN PRIVATE KEY-----` (PKCS#8), `-----BEGIN RSA PRIVATE KEY-----` or `-----BEGIN EC PRIVATE KEY-----` (convert with `openssl pkey -in KEY -out key.pem`)",
            );
            None
        }
    }
}
