//! The pure answer function: (question, index) -> response, per the Kubernetes DNS specification.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::index::{Index, NameData, PodsMode};
use crate::wire::*;

/// The version of the Kubernetes DNS schema served in the `dns-version` TXT record.
pub const DNS_SCHEMA_VERSION: &str = "1.1.0";
const SOA_REFRESH: u32 = 7200;
const SOA_RETRY: u32 = 1800;
const SOA_EXPIRE: u32 = 86400;

/// A question, with the name lower-cased, dotted, without the trailing dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Question<'a> {
    pub name: &'a str,
    pub qtype: u16,
    pub qclass: u16,
}

/// What to do with a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answer from the index (cluster names, known reverse names).
    Answer(Response),
    /// Not a cluster name: forward (stub domain or upstream), if the client may recurse.
    Forward,
}

/// Is `name` equal to `zone` or below it? Returns the part before the zone ("" at the apex).
pub fn relative<'a>(name: &'a str, zone: &str) -> Option<&'a str> {
    if name == zone {
        return Some("");
    }
    let rest = name.strip_suffix(zone)?;
    rest.strip_suffix('.')
}

/// Parses a reverse-lookup name (`4.3.2.1.in-addr.arpa`, 32 nibbles `.ip6.arpa`).
pub fn parse_reverse(name: &str) -> Option<IpAddr> {
    if let Some(rest) = name.strip_suffix(".in-addr.arpa") {
        let mut octets = [0u8; 4];
        let parts: Vec<&str> = rest.split('.').collect();
        if parts.len() != 4 {
            return None;
        }
        for (i, p) in parts.iter().rev().enumerate() {
            if p.is_empty() || p.len() > 3 || (p.len() > 1 && p.starts_with('0')) {
                return None;
            }
            octets[i] = p.parse().ok()?;
        }
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    if let Some(rest) = name.strip_suffix(".ip6.arpa") {
        let nibbles: Vec<&str> = rest.split('.').collect();
        if nibbles.len() != 32 {
            return None;
        }
        let mut v: u128 = 0;
        for n in nibbles.iter().rev() {
            if n.len() != 1 {
                return None;
            }
            v = (v << 4) | u128::from_str_radix(n, 16).ok()?;
        }
        return Some(IpAddr::V6(Ipv6Addr::from(v)));
    }
    None
}

/// Parses the IP label of a pod name (`10-244-1-5`, `fd00--5`).
pub fn parse_ip_label(label: &str) -> Option<IpAddr> {
    if label.bytes().filter(|&b| b == b'-').count() == 3
        && let Ok(v4) = label.replace('-', ".").parse::<Ipv4Addr>()
    {
        return Some(IpAddr::V4(v4));
    }
    label
        .replace('-', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

fn addr_record(name: &str, ttl: u32, ip: IpAddr) -> Record {
    match ip {
        IpAddr::V4(a) => Record::new(name, ttl, RData::A(a)),
        IpAddr::V6(a) => Record::new(name, ttl, RData::Aaaa(a)),
    }
}

fn type_matches(qtype: u16, ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => qtype == TYPE_A || qtype == TYPE_ANY,
        IpAddr::V6(_) => qtype == TYPE_AAAA || qtype == TYPE_ANY,
    }
}

/// The zone's SOA record.
pub fn soa(idx: &Index) -> Record {
    let cfg = idx.config();
    Record::new(
        cfg.zone.as_str(),
        cfg.ttl,
        RData::Soa {
            mname: format!("ns.dns.{}", cfg.zone),
            rname: format!("hostmaster.{}", cfg.zone),
            serial: idx.serial(),
            refresh: SOA_REFRESH,
            retry: SOA_RETRY,
            expire: SOA_EXPIRE,
            minimum: cfg.ttl,
        },
    )
}

fn positive(answers: Vec<Record>, additional: Vec<Record>) -> Response {
    Response {
        rcode: RCODE_NOERROR,
        authoritative: true,
        answers,
        authority: vec![],
        additional,
    }
}

fn negative(idx: &Index, rcode: u16) -> Response {
    Response {
        rcode,
        authoritative: true,
        answers: vec![],
        authority: vec![soa(idx)],
        additional: vec![],
    }
}

/// NOERROR with answers, or NODATA (NOERROR, SOA in authority) when there are none.
fn positive_or_nodata(idx: &Index, answers: Vec<Record>, additional: Vec<Record>) -> Response {
    if answers.is_empty() {
        negative(idx, RCODE_NOERROR)
    } else {
        positive(answers, additional)
    }
}

fn from_name(idx: &Index, name: &str, d: &NameData, qtype: u16, depth: u8) -> Response {
    let ttl = idx.config().ttl;
    if let Some(target) = &d.cname {
        let mut answers = vec![Record::new(name, ttl, RData::Cname(target.to_string()))];
        let mut additional = vec![];
        // Follow a CNAME that stays inside the cluster zone (one level).
        if qtype != TYPE_CNAME
            && depth == 0
            && relative(target, &idx.config().zone).is_some()
            && let Some(td) = idx.name(target)
        {
            let r = from_name(idx, target, td, qtype, 1);
            answers.extend(r.answers);
            additional = r.additional;
        }
        return positive(answers, additional);
    }
    let mut answers = Vec::new();
    let mut additional = Vec::new();
    for ip in d.addrs.iter().filter(|ip| type_matches(qtype, ip)) {
        answers.push(addr_record(name, ttl, *ip));
    }
    if qtype == TYPE_SRV || qtype == TYPE_ANY {
        for s in &d.srv {
            answers.push(Record::new(
                name,
                ttl,
                RData::Srv {
                    priority: 0,
                    weight: s.weight,
                    port: s.port,
                    target: s.target.to_string(),
                },
            ));
            if additional.iter().any(|r: &Record| r.name == *s.target) {
                continue;
            }
            if let Some(td) = idx.name(&s.target) {
                for ip in &td.addrs {
                    additional.push(addr_record(&s.target, ttl, *ip));
                }
            }
        }
    }
    if depth > 0 {
        return positive(answers, additional);
    }
    positive_or_nodata(idx, answers, additional)
}

fn apex(idx: &Index, qtype: u16) -> Response {
    let cfg = idx.config();
    let ns_name = format!("ns.dns.{}", cfg.zone);
    let ns = Record::new(cfg.zone.as_str(), cfg.ttl, RData::Ns(ns_name.clone()));
    let glue: Vec<Record> = cfg
        .ns_ips
        .iter()
        .map(|ip| addr_record(&ns_name, cfg.ttl, *ip))
        .collect();
    match qtype {
        TYPE_SOA => positive(vec![soa(idx)], vec![]),
        TYPE_NS => positive(vec![ns], glue),
        TYPE_ANY => positive(vec![soa(idx), ns], glue),
        _ => negative(idx, RCODE_NOERROR),
    }
}

fn pod(idx: &Index, ip_label: &str, ns: &str, qtype: u16) -> Response {
    let cfg = idx.config();
    let Some(ip) = parse_ip_label(ip_label) else {
        return negative(idx, RCODE_NXDOMAIN);
    };
    let exists = match cfg.pods {
        PodsMode::Disabled => false,
        PodsMode::Insecure => true,
        PodsMode::Verified => idx.pod_exists(ns, &ip),
    };
    if !exists {
        return negative(idx, RCODE_NXDOMAIN);
    }
    let name = format!("{ip_label}.{ns}.pod.{}", cfg.zone);
    let answers = if type_matches(qtype, &ip) {
        vec![addr_record(&name, cfg.ttl, ip)]
    } else {
        vec![]
    };
    positive_or_nodata(idx, answers, vec![])
}

/// Answers a question from the index, or says it must be forwarded.
///
/// Names in the cluster zone are always answered here (never forwarded); reverse names are
/// answered when the index knows the address, and forwarded otherwise.
pub fn answer(q: &Question<'_>, idx: &Index) -> Outcome {
    let cfg = idx.config();
    let Some(rel) = relative(q.name, &cfg.zone) else {
        if q.qtype == TYPE_PTR
            && let Some(ip) = parse_reverse(q.name)
            && let Some(names) = idx.ptr(&ip)
        {
            let answers = names
                .iter()
                .map(|n| Record::new(q.name, cfg.ttl, RData::Ptr(n.to_string())))
                .collect();
            return Outcome::Answer(positive(answers, vec![]));
        }
        return Outcome::Forward;
    };
    if q.qclass != CLASS_IN && q.qclass != CLASS_ANY {
        return Outcome::Answer(Response {
            rcode: RCODE_REFUSED,
            ..Default::default()
        });
    }
    if rel.is_empty() {
        return Outcome::Answer(apex(idx, q.qtype));
    }
    if rel == "dns-version" {
        let answers = if q.qtype == TYPE_TXT || q.qtype == TYPE_ANY {
            vec![Record::new(
                q.name,
                cfg.ttl,
                RData::Txt(DNS_SCHEMA_VERSION.into()),
            )]
        } else {
            vec![]
        };
        return Outcome::Answer(positive_or_nodata(idx, answers, vec![]));
    }
    if rel == "ns.dns" {
        let answers: Vec<Record> = cfg
            .ns_ips
            .iter()
            .filter(|ip| type_matches(q.qtype, ip))
            .map(|ip| addr_record(q.name, cfg.ttl, *ip))
            .collect();
        return Outcome::Answer(positive_or_nodata(idx, answers, vec![]));
    }
    if let Some(d) = idx.name(q.name) {
        return Outcome::Answer(from_name(idx, q.name, d, q.qtype, 0));
    }
    let labels: Vec<&str> = rel.split('.').collect();
    if let [ip_label, ns, "pod"] = labels.as_slice() {
        return Outcome::Answer(pod(idx, ip_label, ns, q.qtype));
    }
    if matches!(rel, "svc" | "pod" | "dns") || idx.is_empty_non_terminal(q.name) {
        return Outcome::Answer(negative(idx, RCODE_NOERROR));
    }
    Outcome::Answer(negative(idx, RCODE_NXDOMAIN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn port(name: &str, port: u16) -> PortInfo {
        PortInfo {
            name: name.into(),
            protocol: "tcp".into(),
            port,
        }
    }
    fn ep(a: &str, host: Option<&str>, ready: bool) -> EndpointInfo {
        EndpointInfo {
            ip: ip(a),
            hostname: host.map(Into::into),
            ready,
        }
    }

    fn fixture(pods: PodsMode) -> Index {
        let cfg = ZoneConfig {
            pods,
            ns_ips: vec![ip("10.96.0.53")],
            ..ZoneConfig::default()
        };
        let mut idx = Index::new(cfg);
        let svc = |name: &str, kind, ports, pnr| ServiceInfo {
            namespace: "default".into(),
            name: name.into(),
            kind,
            ports,
            publish_not_ready: pnr,
        };
        idx.upsert_service(svc(
            "web",
            ServiceKind::ClusterIp(vec![ip("10.96.0.10"), ip("fd00::10")]),
            vec![port("http", 80), port("", 8080)],
            false,
        ));
        idx.upsert_service(svc(
            "v4only",
            ServiceKind::ClusterIp(vec![ip("10.96.0.11")]),
            vec![],
            false,
        ));
        idx.upsert_service(svc(
            "hl",
            ServiceKind::Headless,
            vec![port("http", 80)],
            false,
        ));
        let slice = |name: &str, service: &str, endpoints, ports| SliceInfo {
            namespace: "default".into(),
            name: name.into(),
            service: service.into(),
            endpoints,
            ports,
        };
        idx.upsert_slice(slice(
            "hl-v4",
            "hl",
            vec![
                ep("10.0.0.1", Some("pod-a"), true),
                ep("10.0.0.2", None, true),
                ep("10.0.0.3", Some("pod-c"), false),
            ],
            vec![port("http", 8080)],
        ));
        idx.upsert_slice(slice(
            "hl-v6",
            "hl",
            vec![ep("fd00::1", Some("pod-a"), true)],
            vec![port("http", 8080)],
        ));
        idx.upsert_service(svc("pnr", ServiceKind::Headless, vec![], true));
        idx.upsert_slice(slice(
            "pnr-1",
            "pnr",
            vec![ep("10.0.1.1", Some("x"), false)],
            vec![],
        ));
        idx.upsert_service(svc("empty", ServiceKind::Headless, vec![], false));
        idx.upsert_service(svc(
            "ext",
            ServiceKind::ExternalName("example.com".into()),
            vec![],
            false,
        ));
        idx.upsert_service(svc(
            "alias",
            ServiceKind::ExternalName("web.default.svc.cluster.local".into()),
            vec![],
            false,
        ));
        idx.upsert_pod(PodInfo {
            namespace: "default".into(),
            name: "p".into(),
            ips: vec![ip("10.244.1.5")],
        });
        idx
    }

    fn show(r: &Record) -> String {
        let d = match &r.data {
            RData::A(a) => format!("A {a}"),
            RData::Aaaa(a) => format!("AAAA {a}"),
            RData::Cname(n) => format!("CNAME {n}"),
            RData::Ptr(n) => format!("PTR {n}"),
            RData::Ns(n) => format!("NS {n}"),
            RData::Txt(t) => format!("TXT {t}"),
            RData::Srv {
                priority,
                weight,
                port,
                target,
            } => format!("SRV {priority} {weight} {port} {target}"),
            RData::Soa { mname, rname, .. } => format!("SOA {mname} {rname}"),
        };
        format!("{} {d}", r.name)
    }

    const NX: u16 = RCODE_NXDOMAIN;
    const OK: u16 = RCODE_NOERROR;
    const Z: &str = "cluster.local";

    #[test]
    fn answer_table() {
        let soa_line = "cluster.local SOA ns.dns.cluster.local hostmaster.cluster.local";
        // (pods mode, name, type, rcode, answers; additional)
        #[allow(clippy::type_complexity)]
        let table: Vec<(PodsMode, &str, u16, u16, Vec<&str>, Vec<&str>)> = vec![
            // ClusterIP, dual-stack
            (
                PodsMode::Disabled,
                "web.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["web.default.svc.cluster.local A 10.96.0.10"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "web.default.svc.cluster.local",
                TYPE_AAAA,
                OK,
                vec!["web.default.svc.cluster.local AAAA fd00::10"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "v4only.default.svc.cluster.local",
                TYPE_AAAA,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "web.default.svc.cluster.local",
                TYPE_TXT,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "nope.default.svc.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "web.other.svc.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            // SRV: normal service targets the service name; unnamed ports have none
            (
                PodsMode::Disabled,
                "_http._tcp.web.default.svc.cluster.local",
                TYPE_SRV,
                OK,
                vec![
                    "_http._tcp.web.default.svc.cluster.local SRV 0 100 80 web.default.svc.cluster.local",
                ],
                vec![
                    "web.default.svc.cluster.local A 10.96.0.10",
                    "web.default.svc.cluster.local AAAA fd00::10",
                ],
            ),
            (
                PodsMode::Disabled,
                "_http._udp.web.default.svc.cluster.local",
                TYPE_SRV,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "_tcp.web.default.svc.cluster.local",
                TYPE_SRV,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "_http._tcp.web.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec![],
                vec![],
            ),
            // headless: ready endpoints only, both families; hostnames; SRV per endpoint
            (
                PodsMode::Disabled,
                "hl.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec![
                    "hl.default.svc.cluster.local A 10.0.0.1",
                    "hl.default.svc.cluster.local A 10.0.0.2",
                ],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "hl.default.svc.cluster.local",
                TYPE_AAAA,
                OK,
                vec!["hl.default.svc.cluster.local AAAA fd00::1"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "pod-a.hl.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["pod-a.hl.default.svc.cluster.local A 10.0.0.1"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "pod-a.hl.default.svc.cluster.local",
                TYPE_AAAA,
                OK,
                vec!["pod-a.hl.default.svc.cluster.local AAAA fd00::1"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "pod-c.hl.default.svc.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "10-0-0-2.hl.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["10-0-0-2.hl.default.svc.cluster.local A 10.0.0.2"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "_http._tcp.hl.default.svc.cluster.local",
                TYPE_SRV,
                OK,
                vec![
                    "_http._tcp.hl.default.svc.cluster.local SRV 0 33 8080 pod-a.hl.default.svc.cluster.local",
                    "_http._tcp.hl.default.svc.cluster.local SRV 0 33 8080 10-0-0-2.hl.default.svc.cluster.local",
                ],
                vec![
                    "pod-a.hl.default.svc.cluster.local A 10.0.0.1",
                    "pod-a.hl.default.svc.cluster.local AAAA fd00::1",
                    "10-0-0-2.hl.default.svc.cluster.local A 10.0.0.2",
                ],
            ),
            (
                PodsMode::Disabled,
                "pnr.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["pnr.default.svc.cluster.local A 10.0.1.1"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "x.pnr.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["x.pnr.default.svc.cluster.local A 10.0.1.1"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "empty.default.svc.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            // ExternalName
            (
                PodsMode::Disabled,
                "ext.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec!["ext.default.svc.cluster.local CNAME example.com"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "ext.default.svc.cluster.local",
                TYPE_CNAME,
                OK,
                vec!["ext.default.svc.cluster.local CNAME example.com"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "alias.default.svc.cluster.local",
                TYPE_A,
                OK,
                vec![
                    "alias.default.svc.cluster.local CNAME web.default.svc.cluster.local",
                    "web.default.svc.cluster.local A 10.96.0.10",
                ],
                vec![],
            ),
            // pods
            (
                PodsMode::Disabled,
                "10-244-1-5.default.pod.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Insecure,
                "10-244-9-9.any.pod.cluster.local",
                TYPE_A,
                OK,
                vec!["10-244-9-9.any.pod.cluster.local A 10.244.9.9"],
                vec![],
            ),
            (
                PodsMode::Insecure,
                "fd00--5.any.pod.cluster.local",
                TYPE_AAAA,
                OK,
                vec!["fd00--5.any.pod.cluster.local AAAA fd00::5"],
                vec![],
            ),
            (
                PodsMode::Insecure,
                "10-244-9-9.any.pod.cluster.local",
                TYPE_AAAA,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Insecure,
                "not-an-ip.any.pod.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Verified,
                "10-244-1-5.default.pod.cluster.local",
                TYPE_A,
                OK,
                vec!["10-244-1-5.default.pod.cluster.local A 10.244.1.5"],
                vec![],
            ),
            (
                PodsMode::Verified,
                "10-244-1-5.other.pod.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Verified,
                "10-244-1-6.default.pod.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            // apex, structure, version
            (
                PodsMode::Disabled,
                "cluster.local",
                TYPE_SOA,
                OK,
                vec![soa_line],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "cluster.local",
                TYPE_NS,
                OK,
                vec!["cluster.local NS ns.dns.cluster.local"],
                vec!["ns.dns.cluster.local A 10.96.0.53"],
            ),
            (
                PodsMode::Disabled,
                "cluster.local",
                TYPE_A,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "ns.dns.cluster.local",
                TYPE_A,
                OK,
                vec!["ns.dns.cluster.local A 10.96.0.53"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "dns-version.cluster.local",
                TYPE_TXT,
                OK,
                vec!["dns-version.cluster.local TXT 1.1.0"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "dns-version.cluster.local",
                TYPE_A,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "svc.cluster.local",
                TYPE_A,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "default.svc.cluster.local",
                TYPE_A,
                OK,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "nons.svc.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "foo.cluster.local",
                TYPE_A,
                NX,
                vec![],
                vec![],
            ),
            // PTR: service IPs (v4 and v6) and endpoints with hostnames
            (
                PodsMode::Disabled,
                "10.0.96.10.in-addr.arpa",
                TYPE_PTR,
                OK,
                vec!["10.0.96.10.in-addr.arpa PTR web.default.svc.cluster.local"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa",
                TYPE_PTR,
                OK,
                vec![
                    "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa PTR web.default.svc.cluster.local",
                ],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "1.0.0.10.in-addr.arpa",
                TYPE_PTR,
                OK,
                vec!["1.0.0.10.in-addr.arpa PTR pod-a.hl.default.svc.cluster.local"],
                vec![],
            ),
            (
                PodsMode::Disabled,
                "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa",
                TYPE_PTR,
                OK,
                vec![
                    "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa PTR pod-a.hl.default.svc.cluster.local",
                ],
                vec![],
            ),
        ];
        for (mode, name, qtype, rcode, answers, additional) in table {
            let idx = fixture(mode);
            let q = Question {
                name,
                qtype,
                qclass: CLASS_IN,
            };
            let Outcome::Answer(r) = answer(&q, &idx) else {
                panic!("{name} {qtype}: forwarded");
            };
            let got: Vec<String> = r.answers.iter().map(show).collect();
            assert_eq!(r.rcode, rcode, "{name} {qtype} rcode ({got:?})");
            assert!(r.authoritative, "{name}");
            assert_eq!(got, answers, "{name} {qtype} answers");
            let got_add: Vec<String> = r.additional.iter().map(show).collect();
            assert_eq!(got_add, additional, "{name} {qtype} additional");
            if answers.is_empty() {
                let auth: Vec<String> = r.authority.iter().map(show).collect();
                assert_eq!(
                    auth,
                    vec![soa_line],
                    "{name} {qtype}: negative answers carry the SOA"
                );
            } else {
                assert!(r.authority.is_empty(), "{name}");
            }
            for rr in r.answers.iter().chain(&r.additional) {
                assert_eq!(rr.ttl, 5);
            }
        }
    }

    #[test]
    fn forwarded_and_not() {
        let idx = fixture(PodsMode::Disabled);
        for (name, qtype, fwd) in [
            ("example.com", TYPE_A, true),
            ("cluster.local.example.com", TYPE_A, true),
            ("xcluster.local", TYPE_A, true),
            ("9.9.9.9.in-addr.arpa", TYPE_PTR, true),
            ("10.0.96.10.in-addr.arpa", TYPE_A, true),
            ("anything.cluster.local", TYPE_A, false),
            ("cluster.local", TYPE_MX_FOR_TEST, false),
        ] {
            let got = answer(
                &Question {
                    name,
                    qtype,
                    qclass: CLASS_IN,
                },
                &idx,
            ) == Outcome::Forward;
            assert_eq!(got, fwd, "{name}");
        }
        let Outcome::Answer(r) = answer(
            &Question {
                name: Z,
                qtype: TYPE_A,
                qclass: 3,
            },
            &idx,
        ) else {
            panic!()
        };
        assert_eq!(r.rcode, RCODE_REFUSED);
    }
    const TYPE_MX_FOR_TEST: u16 = 15;

    #[test]
    fn soa_serial_changes_only_on_real_change() {
        let mut idx = fixture(PodsMode::Disabled);
        let s1 = idx.serial();
        let svc = idx.services().find(|s| s.name == "web").cloned().unwrap();
        assert!(!idx.upsert_service(svc));
        assert_eq!(idx.serial(), s1);
        idx.delete_service("default", "web");
        assert!(idx.serial() > s1);
    }

    #[test]
    fn reverse_and_label_parsing() {
        assert_eq!(parse_reverse("4.3.2.1.in-addr.arpa"), Some(ip("1.2.3.4")));
        assert_eq!(parse_reverse("3.2.1.in-addr.arpa"), None);
        assert_eq!(parse_reverse("256.3.2.1.in-addr.arpa"), None);
        assert_eq!(parse_reverse("1.ip6.arpa"), None);
        assert_eq!(parse_ip_label("10-0-0-1"), Some(ip("10.0.0.1")));
        assert_eq!(parse_ip_label("2001-db8--1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_ip_label("10-0-0"), None);
        assert_eq!(relative("a.cluster.local", Z), Some("a"));
        assert_eq!(relative("acluster.local", Z), None);
    }
}
