//! TLS client settings for `https://` targets: one immutable `rustls::ClientConfig` per
//! distinct trust setting, built once when the gateway starts and shared by every worker.
//!
//! Owns trust decisions only (which roots, which protocol versions, ALPN). Certificates
//! from a target's `ca_file` were read and checked when the configuration was loaded; this
//! module never touches the file system or the network.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use super::connect::TlsParams;
use crate::config::Target;

/// What one TLS target connects with.
#[derive(Debug, Clone)]
pub struct TargetTls {
    pub config: Arc<ClientConfig>,
    /// SNI and the name the certificate must match (the URL's host).
    pub server_name: ServerName<'static>,
}

impl TargetTls {
    pub fn params(&self) -> TlsParams<'_> {
        TlsParams {
            config: &self.config,
            server_name: &self.server_name,
        }
    }
}

/// The TLS client configuration of each target, indexed like `Config::targets`
/// (`None` for plaintext targets). Targets with the same trust setting share one `Arc`.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTls {
    per_target: Vec<Option<TargetTls>>,
}

impl UpstreamTls {
    /// Builds the client configurations for `targets`: the webpki public roots for a target
    /// without `ca_file`, exactly the certificates of its `ca_file` otherwise.
    pub fn build(targets: &[Target]) -> Result<UpstreamTls, String> {
        let mut public: Option<Arc<ClientConfig>> = None;
        let mut private: Vec<(&[CertificateDer<'static>], Arc<ClientConfig>)> = Vec::new();
        let mut per_target = Vec::with_capacity(targets.len());
        for t in targets {
            if !t.tls {
                per_target.push(None);
                continue;
            }
            let cfg = if t.ca_certs.is_empty() {
                match &public {
                    Some(c) => c.clone(),
                    None => {
                        let c = client_config(public_roots())?;
                        public = Some(c.clone());
                        c
                    }
                }
            } else if let Some((_, c)) = private.iter().find(|(certs, _)| *certs == t.ca_certs) {
                c.clone()
            } else {
                let roots = private_roots(&t.ca_certs)
                    .map_err(|e| format!("target `{}`: ca_file: {e}", t.name))?;
                let c = client_config(roots)?;
                private.push((&t.ca_certs, c.clone()));
                c
            };
            let server_name = ServerName::try_from(t.server_name.clone()).map_err(|e| {
                format!(
                    "target `{}`: `{}` is not a valid TLS server name: {e}",
                    t.name, t.server_name
                )
            })?;
            per_target.push(Some(TargetTls {
                config: cfg,
                server_name,
            }));
        }
        Ok(UpstreamTls { per_target })
    }

    /// The TLS settings for target `tid` (`None`: plaintext).
    pub fn get(&self, tid: usize) -> Option<&TargetTls> {
        self.per_target.get(tid).and_then(Option::as_ref)
    }
}

/// Mozilla's public CA set (webpki-roots), compiled in.
fn public_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// A root store holding exactly `certs`.
pub fn private_roots(certs: &[CertificateDer<'static>]) -> Result<RootCertStore, rustls::Error> {
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c.clone())?;
    }
    Ok(roots)
}

/// TLS 1.2 and 1.3 (rustls' safe defaults) with the ring provider, ALPN `http/1.1`.
fn client_config(roots: RootCertStore) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
