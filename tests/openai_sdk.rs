//! The official `openai` Python SDK against the gateway, under both drivers: chat (plain
//! and streamed), completions, models.list() and models.retrieve(), and audio
//! transcription and translation (multipart uploads), checked by
//! tests/sdk/openai_client.py; once over plaintext and once over TLS (`[server.tls]`, the
//! SDK trusting a CA made at test time).
//!
//! Needs `python3` with the `openai` package (`pip install openai`); without them the test
//! fails and says so, it never skips.

mod common;

use common::*;

const SETUP: &str =
    "run the test command from the README (`./tests/run.sh`, which installs the `openai` package)";

fn run_script(base_url: &str, ca_file: Option<&std::path::Path>) -> (Option<i32>, String) {
    let ca = ca_file.map(|p| p.display().to_string());
    let mut args = vec![base_url];
    args.extend(ca.as_deref());
    common::sdk::run_script("openai_client.py", &args, SETUP)
}

#[test]
fn openai_python_sdk_works_through_the_gateway() {
    for d in drivers() {
        let a = mock("a", |c| c.tokens = 6);
        let b = mock("b", |c| c.tokens = 6);
        let g = gateway_for(d, &[&a, &b], "");
        let r = call(g.local_addr(), &request("GET", "/health", &[], ""));
        assert_eq!(r.status, 200, "{}: the gateway is up", driver_name(d));
        let (code, output) = run_script(&format!("http://{}", g.local_addr()), None);
        match code {
            Some(0) => {}
            Some(3) => panic!("the `openai` Python package is missing; {SETUP}\n{output}"),
            _ => panic!(
                "openai_client.py failed under {} (exit {code:?})\n{output}",
                driver_name(d)
            ),
        }
        assert!(output.contains("all checks passed"), "{output}");
        let served = a.stats().completed + b.stats().completed;
        assert_eq!(
            served, 3,
            "three inference calls (chat, streamed chat, completion) reached the engines\n{output}"
        );
        // The SDK's multipart upload reached an engine with the file's bytes intact.
        let mut audio = b"RIFF".to_vec();
        audio.extend(0..=255u8);
        audio.extend_from_slice(b"\r\n--not-the-boundary\r\n");
        audio.extend((0..=255u8).rev());
        let uploads: Vec<_> = a
            .requests()
            .into_iter()
            .chain(b.requests())
            .filter(|r| r.path == "/v1/audio/transcriptions")
            .collect();
        assert_eq!(uploads.len(), 1, "{output}");
        assert!(
            uploads[0].body.windows(audio.len()).any(|w| w == audio),
            "the file part arrived byte for byte"
        );
        assert!(uploads[0]
            .header("content-type")
            .is_some_and(|t| t.starts_with("multipart/form-data; boundary=")));
    }
}

/// A CA (PEM at `<dir>/ca.pem`) and a server certificate it signed for 127.0.0.1 and
/// localhost (`<dir>/srv.pem`, `<dir>/srv.key`).
fn write_pki(dir: &std::path::Path) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rolter SDK test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("srv.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("srv.key"), key.serialize_pem()).unwrap();
}

#[test]
fn openai_python_sdk_works_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    for d in drivers() {
        let a = mock("a", |c| c.tokens = 6);
        let rest = format!(
            "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n{}\
             [[routes]]\nname = \"r\"\ntargets = [\"t0\"]\n",
            dir.path().join("srv.pem"),
            dir.path().join("srv.key"),
            target("t0", a.addr(), ""),
        );
        let g = gateway(d, &rest);
        let (code, output) = run_script(
            &format!("https://{}", g.local_addr()),
            Some(&dir.path().join("ca.pem")),
        );
        match code {
            Some(0) => {}
            Some(3) => panic!("the `openai` Python package is missing; {SETUP}\n{output}"),
            _ => panic!(
                "openai_client.py over TLS failed under {} (exit {code:?})\n{output}",
                driver_name(d)
            ),
        }
        assert!(output.contains("all checks passed"), "{output}");
        assert_eq!(a.stats().completed, 3, "{output}");
    }
}

/// A vLLM disaggregated route (prefill `p0`, decode `d0`, mock engines in those roles):
/// the script's chat (plain and streamed), completion and cut stream are prefilled and
/// decoded, its other calls go to the decode engine alone.
#[test]
fn openai_python_sdk_works_through_a_disaggregated_route() {
    use rolter_mock::{PdConfig, PdProtocol, PdRole};
    let role = |role| {
        move |c: &mut rolter_mock::MockConfig| {
            c.tokens = 6;
            c.pd = Some(PdConfig {
                role,
                protocol: PdProtocol::Vllm,
                ..PdConfig::default()
            });
        }
    };
    for d in drivers() {
        let ctx = driver_name(d);
        let p = mock("p0", role(PdRole::Prefill));
        let dm = mock("d0", role(PdRole::Decode));
        let rest = format!(
            "{}{}[[routes]]\nname = \"chat\"\ndisaggregation = \"vllm\"\n\
             prefill = {{ targets = [\"p0\"] }}\ndecode = {{ targets = [\"d0\"] }}\n",
            target("p0", p.addr(), ""),
            target("d0", dm.addr(), ""),
        );
        let g = gateway(d, &rest);
        let (code, output) = run_script(&format!("http://{}", g.local_addr()), None);
        match code {
            Some(0) => {}
            Some(3) => panic!("the `openai` Python package is missing; {SETUP}\n{output}"),
            _ => panic!(
                "openai_client.py through a P/D route failed under {ctx} (exit {code:?})\n{output}"
            ),
        }
        assert!(output.contains("all checks passed"), "{output}");
        // Chat, streamed chat, completion and the cut chat stream: each prefilled on p0,
        // its blocks pulled by d0, then decoded there.
        let (ps, ds) = (p.pd_stats(), dm.pd_stats());
        assert_eq!(
            (ps.prefills, ps.pulls_served, ps.refused),
            (4, 4, 0),
            "{ctx}: {ps:?}\n{output}"
        );
        assert_eq!((ds.decodes, ds.refused), (4, 0), "{ctx}: {ds:?}\n{output}");
        let prefilled: Vec<String> = p
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/v1/"))
            .map(|r| r.path)
            .collect();
        assert_eq!(
            prefilled,
            [
                "/v1/chat/completions",
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/chat/completions"
            ],
            "{ctx}: only generation goes to the prefill pool"
        );
        for r in dm
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("completions"))
        {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(
                body["kv_transfer_params"]["remote_engine_id"],
                p.pd_engine_id().unwrap(),
                "{ctx}"
            );
        }
    }
}
