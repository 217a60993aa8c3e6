//! Unit tests for the configuration loader, by section, and the helpers they share.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::error::Collector;
use super::raw;
use super::validate::check_prices;
use super::*;
use crate::prices::price_book;

const FLEET: &str = include_str!("../../../../config/vllm-fleet.toml");
const MANAGED: &str = include_str!("../../../../config/managed-api.toml");

/// Resolves a few fixed names; everything else fails like an unknown host.
fn fake_resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let ip = match host {
        "api.openai.com" => Ipv4Addr::new(192, 0, 2, 10),
        "engine.internal" => Ipv4Addr::new(192, 0, 2, 20),
        "localhost" => Ipv4Addr::LOCALHOST,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "failed to lookup address information",
            ))
        }
    };
    Ok(vec![SocketAddr::new(IpAddr::V4(ip), port)])
}

fn fake_env(name: &str) -> Option<String> {
    let vars: HashMap<&str, &str> = [
        ("OPENAI_API_KEY", "sk-test-123"),
        ("TOKEN", "abc"),
        ("TENANT", "blue"),
        ("EVIL", "x\r\nInjected: yes"),
        ("EMPTY", ""),
        ("ROLTER_ADMIN_TOKEN", "admin-secret-42"),
        ("SPACEY", "two words"),
        ("REDIS_USER", "gateway"),
        ("ROLTER_STATE_PASSWORD", "s3cret"),
    ]
    .into_iter()
    .collect();
    vars.get(name).map(|s| s.to_string())
}

/// Answers two `discover` names: `vllm.svc` (A records .1 and .2 of 192.0.2.0/24) and
/// `_http._tcp.vllm.svc` (SRV: two at priority 0, weights 50 and 100, one at priority 5).
fn fake_discover(
    _entry: &str,
    spec: &discover::DiscoverSpec,
    _ns: &[SocketAddr],
) -> Result<Vec<discover::Member>, String> {
    let m = |host: &str, last: u8, port: u16, priority: u16, weight: u16| discover::Member {
        host: host.to_string(),
        addr: SocketAddr::from(([192, 0, 2, last], port)),
        priority,
        weight,
    };
    match spec {
        discover::DiscoverSpec::Addresses { name, port } if name == "vllm.svc" => Ok(vec![
            m("192.0.2.1", 1, *port, 0, 1),
            m("192.0.2.2", 2, *port, 0, 1),
        ]),
        discover::DiscoverSpec::Srv { name } if name == "_http._tcp.vllm.svc" => Ok(vec![
            m("a.vllm.svc", 1, 8000, 0, 50),
            m("b.vllm.svc", 2, 8001, 0, 100),
            m("c.vllm.svc", 3, 8002, 5, 100),
        ]),
        _ => Err("no such name".into()),
    }
}

fn load(text: &str) -> Result<Config, ConfigErrors> {
    load_full(text, "test.toml", &fake_resolve, &fake_discover, &fake_env)
}

fn errors(text: &str) -> Vec<ConfigError> {
    match load(text) {
        Ok(c) => panic!("expected errors, got a config: {c:#?}"),
        Err(e) => {
            assert!(!e.errors.is_empty());
            e.errors
        }
    }
}

/// The error at `key`, panicking with all errors if there is none.
fn error_at<'a>(errs: &'a [ConfigError], key: &str) -> &'a ConfigError {
    errs.iter().find(|e| e.key == key).unwrap_or_else(|| {
        panic!(
            "no error at `{key}`; errors:\n{}",
            ConfigErrors {
                errors: errs.to_vec()
            }
        )
    })
}

const ONE_TARGET: &str = "[[targets]]\nname = \"a\"\nurl = \"http://10.0.0.1:8000\"\n";

mod admission;
mod api_keys;
mod discovery;
mod examples;
mod pd;
mod prices;
mod reload;
mod routes;
mod sections;
mod server_tls;
mod state;
mod target_api;
mod targets;
mod tracing;
mod values;
