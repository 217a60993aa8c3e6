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
use rolter_config::Target;

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

#[cfg(test)]
mod tests {
    use super::UpstreamTls;

    /// A self-signed CA certificate in PEM, as an operator's `ca_file` holds it.
    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rolter test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    /// The gateway builds a client configuration for every `https://` target, with the
    /// target's own CA when it names one, and none for plaintext targets.
    #[test]
    fn one_client_configuration_per_tls_target() {
        let dir = std::env::temp_dir().join(format!("rolter-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, ca_pem()).unwrap();
        let text = format!(
            "[[targets]]\nname = \"private\"\nurl = \"https://127.0.0.1:8443\"\nca_file = \"{}\"\n\
             [[targets]]\nname = \"public\"\nurl = \"https://127.0.0.1:9443\"\n\
             [[targets]]\nname = \"plain\"\nurl = \"http://127.0.0.1:8000\"\n",
            ca.display()
        );
        let c = rolter_config::load_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.targets[0].ca_certs.len(), 1);
        let tls = UpstreamTls::build(&c.targets).unwrap();
        assert!(tls.get(0).is_some() && tls.get(1).is_some());
        assert!(tls.get(2).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
