//! DNS discovery: a `[[targets]]` entry with `discover` instead of `url` stands for a group
//! of targets, one per address of a name (A/AAAA records) or one per SRV record, each named
//! `<entry>/<host>:<port>` so that its name stays the same for as long as the address (or
//! SRV target) is in the answer.
//!
//! Owns the lookup itself (a DNS query over UDP, again over TCP when the answer was
//! truncated, to the nameservers of `server.nameservers` or `/etc/resolv.conf`), the group's
//! members, and turning members into targets ([`member_targets`]) and a running
//! configuration into one with a group's new members ([`Config::rediscovered`]). It blocks
//! (a query waits for its answer): callers run it at load or on a thread of their own,
//! never on a worker or the control thread's loop.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

pub use crate::model::{DiscoverSpec, DiscoveryGroup, Member};
use crate::{Config, Target};

/// How long one query waits for a nameserver's answer before trying the next one.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a lookup found no member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupError(pub String);

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The nameservers of `/etc/resolv.conf` (port 53), in order.
pub fn system_nameservers() -> Vec<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    resolv_conf_nameservers(&text)
}

/// The `nameserver` lines of a resolv.conf text.
pub fn resolv_conf_nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            // A scoped IPv6 address (`fe80::1%eth0`) is not usable here: skipped.
            let ip: IpAddr = words.next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

/// Looks `spec` up at `nameservers` (empty: those of `/etc/resolv.conf`): the members,
/// sorted by name, or why there are none (an error, or an answer without a usable record).
pub fn lookup(spec: &DiscoverSpec, nameservers: &[SocketAddr]) -> Result<Vec<Member>, LookupError> {
    let system;
    let servers = if nameservers.is_empty() {
        system = system_nameservers();
        if system.is_empty() {
            return Err(LookupError(
                "no nameserver: /etc/resolv.conf lists none and server.nameservers is not set"
                    .into(),
            ));
        }
        &system[..]
    } else {
        nameservers
    };
    let mut members = match spec {
        DiscoverSpec::Addresses { name, port } => addresses(name, servers)?
            .into_iter()
            .map(|ip| Member {
                host: ip.to_string(),
                addr: SocketAddr::new(ip, *port),
                priority: 0,
                weight: 1,
            })
            .collect(),
        DiscoverSpec::Srv { name } => srv(name, servers)?,
    };
    members.sort();
    members.dedup_by(|a, b| a.label() == b.label());
    if members.is_empty() {
        return Err(LookupError(format!("{spec}: the answer has no address")));
    }
    Ok(members)
}

/// The A and AAAA addresses of `name`, sorted (an error only when both queries failed).
fn addresses(name: &str, servers: &[SocketAddr]) -> Result<Vec<IpAddr>, LookupError> {
    let a = query(name, RecordType::A, servers);
    let aaaa = query(name, RecordType::AAAA, servers);
    if let (Err(e), Err(_)) = (&a, &aaaa) {
        return Err(e.clone());
    }
    let mut ips: Vec<IpAddr> = [a, aaaa]
        .iter()
        .flatten()
        .flat_map(|m| &m.answers)
        .filter_map(|r| match &r.data {
            RData::A(ip) => Some(IpAddr::V4(ip.0)),
            RData::AAAA(ip) => Some(IpAddr::V6(ip.0)),
            _ => None,
        })
        .collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// The SRV records of `name`, each at the first address of its target (from the answer's
/// additional records, else looked up).
fn srv(name: &str, servers: &[SocketAddr]) -> Result<Vec<Member>, LookupError> {
    let answer = query(name, RecordType::SRV, servers)?;
    let mut members = Vec::new();
    for record in &answer.answers {
        let RData::SRV(srv) = &record.data else {
            continue;
        };
        let host = srv.target.to_ascii();
        let host = host.trim_end_matches('.').to_string();
        // RFC 2782: a target of "." means the service is not available at this name.
        if host.is_empty() {
            continue;
        }
        let mut ips: Vec<IpAddr> = answer
            .additionals
            .iter()
            .filter(|r| r.name == srv.target)
            .filter_map(|r| match &r.data {
                RData::A(ip) => Some(IpAddr::V4(ip.0)),
                RData::AAAA(ip) => Some(IpAddr::V6(ip.0)),
                _ => None,
            })
            .collect();
        if ips.is_empty() {
            ips = addresses(&host, servers)?;
        }
        ips.sort();
        if let Some(&ip) = ips.first() {
            members.push(Member {
                host,
                addr: SocketAddr::new(ip, srv.port),
                priority: srv.priority,
                weight: srv.weight,
            });
        }
    }
    Ok(members)
}

/// One query for `name`'s `rtype` records, tried at each server in turn: the first answer
/// that is not a server failure.
fn query(name: &str, rtype: RecordType, servers: &[SocketAddr]) -> Result<Message, LookupError> {
    let mut fqdn = name.to_string();
    if !fqdn.ends_with('.') {
        fqdn.push('.');
    }
    let qname = Name::from_ascii(&fqdn)
        .map_err(|e| LookupError(format!("`{name}` is not a DNS name: {e}")))?;
    let id = fastrand::u16(..);
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(qname, rtype));
    let packet = msg
        .to_vec()
        .map_err(|e| LookupError(format!("cannot encode a query for {name}: {e}")))?;
    let mut last = LookupError(format!("no nameserver answered for {name}"));
    for &server in servers {
        match exchange(&packet, id, server) {
            Ok(answer) => match answer.metadata.response_code {
                ResponseCode::NoError => return Ok(answer),
                ResponseCode::NXDomain => {
                    return Err(LookupError(format!("{name}: no such name ({server})")))
                }
                code => last = LookupError(format!("{name} {rtype}: {code} from {server}")),
            },
            Err(e) => last = LookupError(format!("{name} {rtype} at {server}: {e}")),
        }
    }
    Err(last)
}

/// Sends `packet` to `server` over UDP and reads its answer (over TCP when truncated).
fn exchange(packet: &[u8], id: u16, server: SocketAddr) -> io::Result<Message> {
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(server)?;
    socket.set_read_timeout(Some(QUERY_TIMEOUT))?;
    socket.send(packet)?;
    let mut buf = [0u8; 4096];
    let deadline = std::time::Instant::now() + QUERY_TIMEOUT;
    loop {
        let n = socket.recv(&mut buf)?;
        let answer = decode(&buf[..n])?;
        if answer.metadata.id != id || answer.metadata.message_type != MessageType::Response {
            // A stray or late datagram: wait for ours.
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            continue;
        }
        if answer.metadata.truncation {
            return exchange_tcp(packet, id, server);
        }
        return Ok(answer);
    }
}

/// The same query over TCP (two-byte length prefix each way).
fn exchange_tcp(packet: &[u8], id: u16, server: SocketAddr) -> io::Result<Message> {
    let mut s = TcpStream::connect_timeout(&server, QUERY_TIMEOUT)?;
    s.set_read_timeout(Some(QUERY_TIMEOUT))?;
    s.set_write_timeout(Some(QUERY_TIMEOUT))?;
    let len = u16::try_from(packet.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "query too long"))?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(packet);
    s.write_all(&out)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut body)?;
    let answer = decode(&body)?;
    if answer.metadata.id != id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the answer's id is not the query's",
        ));
    }
    Ok(answer)
}

fn decode(bytes: &[u8]) -> io::Result<Message> {
    Message::from_vec(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// The targets of a group with `members`: copies of `template`, each named
/// `<entry>/<host>:<port>` at its member's address. SRV weights scale the entry's weight
/// (the heaviest record gets the entry's weight, a record of weight 0 a small share), and
/// SRV priorities become tiers above the entry's, in order.
pub fn member_targets(entry: &str, template: &Target, members: &[Member]) -> Vec<Target> {
    let heaviest = members.iter().map(|m| m.weight.max(1)).max().unwrap_or(1);
    let mut priorities: Vec<u16> = members.iter().map(|m| m.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    members
        .iter()
        .map(|m| {
            let mut t = template.clone();
            let label = m.label();
            t.name = format!("{entry}/{label}");
            t.url = format!(
                "{}://{}{}",
                if t.tls { "https" } else { "http" },
                m.addr,
                t.base_path
            );
            t.addr = m.addr;
            t.dns_name = None;
            if m.host.parse::<IpAddr>().is_err() {
                // An SRV target: its own name is the one its certificate and Host carry.
                t.server_name = m.host.clone();
                t.host_header = label.clone();
            }
            t.weight = template.weight * f64::from(m.weight.max(1)) / f64::from(heaviest);
            let rank = priorities
                .iter()
                .position(|&p| p == m.priority)
                .unwrap_or(0);
            t.tier = template.tier + rank as u32;
            t.lmcache_instance = t.name.clone();
            t.member_of = Some(entry.to_string());
            t
        })
        .collect()
}

impl Config {
    /// This configuration with group `entry`'s members replaced by `members`: the group's
    /// targets in its place in the target list, and every route that named the entry over
    /// the new ones. Targets outside the group keep their definitions (so a reload keeps
    /// their connections and health). `None` when there is no such group or no member.
    pub fn rediscovered(&self, entry: &str, members: Vec<Member>) -> Option<Config> {
        if members.is_empty() {
            return None;
        }
        let g = self.discovery.iter().position(|g| g.name == entry)?;
        let mut next = self.clone();
        let group = &mut next.discovery[g];
        let fresh = member_targets(entry, &group.template, &members);
        group.members = members;
        let mut targets = Vec::with_capacity(self.targets.len() + fresh.len());
        // Old index → the new indices it stands for.
        let mut map: Vec<std::ops::Range<usize>> = Vec::with_capacity(self.targets.len());
        let mut placed = false;
        for t in &self.targets {
            let start = targets.len();
            if t.member_of.as_deref() == Some(entry) {
                if !placed {
                    targets.extend(fresh.iter().cloned());
                    placed = true;
                }
            } else {
                targets.push(t.clone());
            }
            map.push(start..targets.len());
        }
        for r in &mut next.routes {
            r.targets = r.targets.iter().flat_map(|&t| map[t].clone()).collect();
        }
        next.targets = targets;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_gives_its_nameservers_in_order() {
        let text = "# comment\nsearch svc.cluster.local\nnameserver 10.96.0.10\n\
                    nameserver ::1\nnameserver fe80::1%eth0\noptions ndots:5\n";
        assert_eq!(
            resolv_conf_nameservers(text),
            vec![
                "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn a_member_label_brackets_ipv6() {
        let m = Member {
            host: "fd00::5".into(),
            addr: "[fd00::5]:8000".parse().unwrap(),
            priority: 0,
            weight: 1,
        };
        assert_eq!(m.label(), "[fd00::5]:8000");
    }
}
