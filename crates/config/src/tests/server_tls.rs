//! `[server.tls]`: certificates and keys read and checked at load, SNI entries, the
//! handshake timeout and the minimum version; turning TLS on or off needs a restart.

use super::targets::TempDir;
use super::*;
use crate::reload::restart_needed;

/// A self-signed certificate for `names` and its key, both PEM.
fn cert(names: &[&str]) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let key = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(names)
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (c.pem(), key.serialize_pem())
}

fn with_tls(tls: &str) -> Result<Config, ConfigErrors> {
    load(&format!("[server.tls]\n{tls}\n{ONE_TARGET}"))
}

#[test]
fn certificates_keys_and_sni_are_loaded() {
    let dir = TempDir::new("srvtls");
    let (c, k) = cert(&["localhost"]);
    let (c2, k2) = cert(&["api.example.com", "*.example.org"]);
    let cf = dir.write("c.pem", c.as_bytes());
    let kf = dir.write("k.pem", k.as_bytes());
    let cf2 = dir.write("c2.pem", c2.as_bytes());
    let kf2 = dir.write("k2.pem", k2.as_bytes());
    let cfg = with_tls(&format!(
        "cert_file = {cf:?}\nkey_file = {kf:?}\nhandshake_timeout = \"3s\"\nmin_version = \"1.3\"\n\
         [[server.tls.sni]]\nnames = [\"API.example.com\", \"*.example.org\"]\n\
         cert_file = {cf2:?}\nkey_file = {kf2:?}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let tls = cfg.server.tls.expect("tls on");
    assert_eq!(tls.handshake_timeout, Duration::from_secs(3));
    assert_eq!(tls.min_version, TlsVersion::Tls13);
    assert_eq!(tls.default.key.cert.len(), 1);
    assert_eq!(tls.sni.len(), 1);
    assert_eq!(tls.sni[0].names, ["api.example.com", "*.example.org"]);
    // The key is never shown, the files are.
    let shown = format!("{:?}", tls.default);
    assert!(
        shown.contains("c.pem") && !shown.contains("PRIVATE"),
        "{shown}"
    );
    // Defaults.
    let cfg = with_tls(&format!("cert_file = {cf:?}\nkey_file = {kf:?}\n")).unwrap();
    let tls = cfg.server.tls.unwrap();
    assert_eq!(tls.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT);
    assert_eq!(tls.min_version, TlsVersion::Tls12);
    // Without the section: plaintext.
    assert!(load(ONE_TARGET).unwrap().server.tls.is_none());
}

#[test]
fn bad_files_name_the_key_the_file_and_the_fix() {
    let dir = TempDir::new("srvtls-bad");
    let (c, k) = cert(&["localhost"]);
    let (_, other_key) = cert(&["localhost"]);
    let cf = dir.write("c.pem", c.as_bytes());
    let kf = dir.write("k.pem", k.as_bytes());
    let wrong = dir.write("wrong.pem", other_key.as_bytes());
    let nokey = dir.write("nokey.pem", c.as_bytes());
    let empty = dir.write("empty.pem", b"nothing\n");
    let missing = dir.0.join("missing.pem").display().to_string();
    for (cert_file, key_file, key, needle) in [
        (&missing, &kf, "server.tls.cert_file", "cannot read"),
        (
            &empty,
            &kf,
            "server.tls.cert_file",
            "contains no certificate",
        ),
        (&cf, &missing, "server.tls.key_file", "cannot read"),
        (&cf, &nokey, "server.tls.key_file", "no usable private key"),
        (
            &cf,
            &wrong,
            "server.tls.key_file",
            "cannot serve the certificate",
        ),
    ] {
        let errs = with_tls(&format!(
            "cert_file = {cert_file:?}\nkey_file = {key_file:?}\n"
        ))
        .unwrap_err();
        let e = error_at(&errs.errors, key);
        assert!(e.message.contains(needle), "{e}");
        assert_eq!(e.file, "test.toml");
        assert!(!e.fix.is_empty(), "{e}");
    }
    let errs = with_tls(&format!("cert_file = {cf:?}\n")).unwrap_err();
    assert!(error_at(&errs.errors, "server.tls.key_file")
        .message
        .contains("missing"));
    let errs = with_tls(&format!(
        "cert_file = {cf:?}\nkey_file = {kf:?}\nmin_version = \"1.1\"\n"
    ))
    .unwrap_err();
    assert!(error_at(&errs.errors, "server.tls.min_version")
        .fix
        .contains("\"1.3\""));
    for names in ["[]", "[\"10.0.0.1\"]", "[\"a b\"]", "[\"x.*.com\"]"] {
        let errs = with_tls(&format!(
            "cert_file = {cf:?}\nkey_file = {kf:?}\n[[server.tls.sni]]\nnames = {names}\n\
             cert_file = {cf:?}\nkey_file = {kf:?}\n"
        ))
        .unwrap_err();
        error_at(&errs.errors, "server.tls.sni[0].names");
    }
    let errs = with_tls(&format!(
        "cert_file = {cf:?}\nkey_file = {kf:?}\n[[server.tls.sni]]\nnames = [\"a.test\"]\n\
         cert_file = {cf:?}\nkey_file = {kf:?}\n[[server.tls.sni]]\nnames = [\"A.test\"]\n\
         cert_file = {cf:?}\nkey_file = {kf:?}\n"
    ))
    .unwrap_err();
    assert!(error_at(&errs.errors, "server.tls.sni[1].names")
        .message
        .contains("more than one"));
    // A misspelt key gets a suggestion.
    let errs = with_tls(&format!("cert_file = {cf:?}\nkeyfile = {kf:?}\n")).unwrap_err();
    assert!(error_at(&errs.errors, "server.tls.keyfile")
        .fix
        .contains("key_file"));
}

#[test]
fn turning_tls_on_or_off_needs_a_restart_but_certificates_reload() {
    let dir = TempDir::new("srvtls-reload");
    let (c, k) = cert(&["localhost"]);
    let (c2, k2) = cert(&["localhost"]);
    let cf = dir.write("c.pem", c.as_bytes());
    let kf = dir.write("k.pem", k.as_bytes());
    let cf2 = dir.write("c2.pem", c2.as_bytes());
    let kf2 = dir.write("k2.pem", k2.as_bytes());
    let plain = load(ONE_TARGET).unwrap();
    let one = with_tls(&format!("cert_file = {cf:?}\nkey_file = {kf:?}\n")).unwrap();
    let two = with_tls(&format!(
        "cert_file = {cf2:?}\nkey_file = {kf2:?}\nhandshake_timeout = \"1s\"\n"
    ))
    .unwrap();
    let r = restart_needed(&plain, &one);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].key, "server.tls");
    assert!(r[0].message.contains("off to on"), "{}", r[0]);
    assert_eq!(restart_needed(&one, &plain)[0].key, "server.tls");
    assert!(restart_needed(&one, &two).is_empty());
}
