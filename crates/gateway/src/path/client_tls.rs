//! The listener's TLS settings for one configuration: a `rustls::ServerConfig` built from
//! the certificates `[server.tls]` loaded (TLS 1.2 and 1.3, or 1.3 only; ALPN `http/1.1`),
//! with the certificate chosen by the client's SNI name.
//!
//! Owns the choice of certificate per handshake. Every configuration generation of a core
//! builds its own, so a reload's certificates serve the connections accepted after it
//! while open sessions keep theirs. It must not read files (the configuration did) nor do
//! I/O.

use std::collections::HashMap;
use std::sync::Arc;

use rolter_config::{ServerTls, TlsVersion};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// Certificates by SNI name: exact names, then `*.` wildcards (one label), then the
/// default (also for clients that send no SNI).
#[derive(Debug)]
struct BySni {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// Keyed by what follows `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
}

impl BySni {
    fn pick(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name else {
            return self.default.clone();
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(k) = self.exact.get(&name) {
            return k.clone();
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(k) = self.wildcard.get(parent) {
                return k.clone();
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// The server configuration for `tls`.
pub fn server_config(tls: &ServerTls) -> Arc<ServerConfig> {
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    for e in &tls.sni {
        for n in &e.names {
            match n.strip_prefix("*.") {
                Some(parent) => wildcard.insert(parent.to_string(), e.cert.key.clone()),
                None => exact.insert(n.clone(), e.cert.key.clone()),
            };
        }
    }
    let resolver = BySni {
        default: tls.default.key.clone(),
        exact,
        wildcard,
    };
    let versions: &[&'static rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Arc<CertifiedKey> {
        let kp = rcgen::KeyPair::generate().unwrap();
        let c = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        let der = rustls::pki_types::PrivateKeyDer::try_from(kp.serialize_der()).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        Arc::new(CertifiedKey::from_der(vec![c.der().clone()], der, &provider).unwrap())
    }

    /// Exact names first, then one-label wildcards, then the default.
    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let (d, a, w) = (key("default"), key("a.test"), key("x.wild.test"));
        let r = BySni {
            default: d.clone(),
            exact: [("a.test".to_string(), a.clone())].into(),
            wildcard: [("wild.test".to_string(), w.clone())].into(),
        };
        assert!(Arc::ptr_eq(&r.pick(Some("A.test")), &a));
        assert!(Arc::ptr_eq(&r.pick(Some("x.wild.test")), &w));
        assert!(Arc::ptr_eq(&r.pick(Some("y.x.wild.test")), &d));
        assert!(Arc::ptr_eq(&r.pick(Some("wild.test")), &d));
        assert!(Arc::ptr_eq(&r.pick(None), &d));
    }
}
