#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::kernel::input::{self, ExternalKind, SvcPort, Target};
use crate::kernel::trace::{self, Outcome, Packet};
use crate::model::{
    EndpointInfo, NodeInfo, PortInfo, ServiceInfo, ServicePortName, SliceInfo, SlicePort,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn port(name: &str, proto: Proto, p: u16) -> SvcPort {
    SvcPort {
        name: ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: String::new(),
            proto,
        },
        ipv6: false,
        port: p,
        node_port: None,
        cluster_ips: vec![],
        externals: vec![],
        internal: Target::Reject,
        external: Target::Reject,
        affinity: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    }
}

fn cfg() -> NftConfig {
    NftConfig {
        pod_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/64".parse().unwrap(),
        ],
        node_ips: vec![],
        masquerade_all: false,
    }
}

fn local() -> BTreeSet<IpAddr> {
    [ip("192.0.2.10"), ip("fd00:2::10")].into_iter().collect()
}

fn tr(rs: &Ruleset, from: &str, to: &str, p: u16, proto: Proto) -> trace::Trace {
    trace::trace(
        rs,
        &Packet {
            src: ip(from),
            dst: ip(to),
            port: p,
            proto,
        },
        &local(),
    )
}

fn endpoints(t: &trace::Trace) -> Vec<(SocketAddr, f64, bool)> {
    t.outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Endpoint {
                to,
                probability,
                masquerade,
                ..
            } => Some((*to, *probability, *masquerade)),
            _ => None,
        })
        .collect()
}

fn three() -> Vec<SocketAddr> {
    vec![
        sa("10.244.1.7:9376"),
        sa("10.244.2.3:9376"),
        sa("10.244.3.6:9376"),
    ]
}

#[test]
fn clusterip_three_endpoints() {
    let mut sp = port("hostnames", Proto::Tcp, 80);
    sp.cluster_ips = vec![ip("10.0.1.175")];
    sp.internal = Target::Pool(three());
    let rs = render(&[sp], &cfg());
    assert!(dangling(&rs).is_empty(), "{:?}", dangling(&rs));
    assert_eq!(
        rs.sets["svc4"].elements[&Key::Frontend(ip("10.0.1.175"), Proto::Tcp, 80)],
        Value::Verdict(Verdict::Goto("cl4-3".into()))
    );
    let d = &rs.sets["dnat4-3"].elements;
    assert_eq!(d.len(), 3);
    assert_eq!(
        d[&Key::FrontendIdx(ip("10.0.1.175"), Proto::Tcp, 80, 2)],
        Value::Endpoint(sa("10.244.3.6:9376"))
    );
    assert_eq!(rs.sets["hairpin4"].elements.len(), 3);
    // From a pod: even split, no masquerade.
    let t = tr(&rs, "10.244.1.9", "10.0.1.175", 80, Proto::Tcp);
    let eps = endpoints(&t);
    assert_eq!(eps.len(), 3, "{t}");
    for (_, p, m) in &eps {
        assert!((p - 1.0 / 3.0).abs() < 1e-9);
        assert!(!m);
    }
    // From the node itself (outside the pod CIDR): masqueraded.
    let t = tr(&rs, "192.0.2.10", "10.0.1.175", 80, Proto::Tcp);
    assert!(endpoints(&t).iter().all(|(_, _, m)| *m), "{t}");
    // Hairpin: an endpoint reaching itself is masqueraded.
    let t = tr(&rs, "10.244.2.3", "10.0.1.175", 80, Proto::Tcp);
    let e = endpoints(&t);
    assert!(
        e.iter()
            .any(|(to, _, m)| *to == sa("10.244.2.3:9376") && *m)
    );
    assert!(
        e.iter()
            .any(|(to, _, m)| *to == sa("10.244.1.7:9376") && !*m)
    );
    // Wrong port: not a Service.
    let t = tr(&rs, "10.244.1.9", "10.0.1.175", 81, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::NotAService]);
    // Rendered text: the maps-only layout.
    let text = render_full("ferry", &rs);
    assert!(
        text.contains("add element inet ferry svc4 { 10.0.1.175 . tcp . 80 : goto cl4-3 }"),
        "{text}"
    );
    assert!(text.contains(
        "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @dnat4-3"
    ));
    assert!(text.contains("ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x4000"));
}

#[test]
fn no_endpoints_reject_and_local_drop() {
    let mut a = port("empty", Proto::Tcp, 80);
    a.cluster_ips = vec![ip("10.96.0.5")];
    let mut u = port("udp-empty", Proto::Udp, 53);
    u.cluster_ips = vec![ip("10.96.0.6")];
    let mut l = port("local", Proto::Tcp, 80);
    l.cluster_ips = vec![ip("10.96.0.7")];
    l.internal = Target::Drop;
    l.internal_local = true;
    let rs = render(&[a, u, l], &cfg());
    assert!(dangling(&rs).is_empty());
    let t = tr(&rs, "10.244.1.9", "10.96.0.5", 80, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::Reject { tcp_reset: true }], "{t}");
    let t = tr(&rs, "192.0.2.10", "10.96.0.6", 53, Proto::Udp);
    assert_eq!(
        t.outcomes,
        vec![Outcome::Reject { tcp_reset: false }],
        "{t}"
    );
    let t = tr(&rs, "10.244.1.9", "10.96.0.7", 80, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::Drop], "{t}");
    assert!(rs.sets["svc4"].elements.is_empty());
}

#[test]
fn nodeport_external_lb_cluster_policy() {
    let mut sp = port("web", Proto::Tcp, 80);
    sp.cluster_ips = vec![ip("10.96.0.10")];
    sp.node_port = Some(30080);
    sp.externals = vec![
        (ip("198.18.0.50"), ExternalKind::ExternalIp),
        (ip("198.18.0.60"), ExternalKind::LoadBalancer),
    ];
    sp.internal = Target::Pool(three());
    sp.external = Target::Pool(three());
    let rs = render(&[sp], &cfg());
    assert!(dangling(&rs).is_empty());
    // NodePort on a node IP from outside: masqueraded (policy Cluster).
    let t = tr(&rs, "198.19.0.1", "192.0.2.10", 30080, Proto::Tcp);
    let e = endpoints(&t);
    assert_eq!(e.len(), 3, "{t}");
    assert!(e.iter().all(|(_, _, m)| *m));
    // Not on loopback (upstream's nftables mode).
    let t = tr(&rs, "127.0.0.1", "127.0.0.1", 30080, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::NotAService], "{t}");
    // Not on a non-local address.
    let t = tr(&rs, "198.19.0.1", "198.19.0.99", 30080, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::NotAService]);
    for ext in ["198.18.0.50", "198.18.0.60"] {
        let t = tr(&rs, "10.244.1.9", ext, 80, Proto::Tcp);
        let e = endpoints(&t);
        assert_eq!(e.len(), 3, "{t}");
        assert!(
            e.iter().all(|(_, _, m)| *m),
            "external traffic is masqueraded"
        );
    }
    // With node IPs configured, NodePorts answer there only.
    let mut c = cfg();
    c.node_ips = vec![ip("192.0.2.10")];
    let rs2 = render(&[], &c);
    assert!(rs2.sets.contains_key("nodeips4"));
    assert!(
        rs2.chains["services"]
            .rules
            .iter()
            .any(|r| r.render().contains("ip daddr @nodeips4"))
    );
}

#[test]
fn external_policy_local() {
    let mut sp = port("local", Proto::Tcp, 80);
    sp.cluster_ips = vec![ip("10.96.0.11")];
    sp.node_port = Some(30081);
    sp.externals = vec![(ip("198.18.0.70"), ExternalKind::LoadBalancer)];
    sp.internal = Target::Pool(three());
    sp.external = Target::Pool(vec![sa("10.244.1.7:9376")]);
    sp.external_local = true;
    let rs = render(&[sp.clone()], &cfg());
    assert!(dangling(&rs).is_empty(), "{:?}", dangling(&rs));
    // From outside: only the local endpoint, source kept.
    let t = tr(&rs, "198.19.0.1", "192.0.2.10", 30081, Proto::Tcp);
    assert_eq!(
        endpoints(&t),
        vec![(sa("10.244.1.7:9376"), 1.0, false)],
        "{t}"
    );
    // From a pod: short-circuited to all endpoints.
    let t = tr(&rs, "10.244.2.9", "198.18.0.70", 80, Proto::Tcp);
    assert_eq!(endpoints(&t).len(), 3, "{t}");
    // From the node itself: masqueraded, all endpoints.
    let t = tr(&rs, "192.0.2.10", "198.18.0.70", 80, Proto::Tcp);
    let e = endpoints(&t);
    assert_eq!(e.len(), 3, "{t}");
    assert!(e.iter().all(|(_, _, m)| *m));
    // No local endpoint: external traffic dropped, ClusterIP still served.
    sp.external = Target::Drop;
    let rs = render(&[sp], &cfg());
    let t = tr(&rs, "198.19.0.1", "192.0.2.10", 30081, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::Drop], "{t}");
    let t = tr(&rs, "10.244.2.9", "10.96.0.11", 80, Proto::Tcp);
    assert_eq!(endpoints(&t).len(), 3);
    // ... but pods and the node itself are still short-circuited to the cluster endpoints
    // (upstream's external chain runs before its filter drops the rest).
    let t = tr(&rs, "10.244.2.9", "198.18.0.70", 80, Proto::Tcp);
    assert_eq!(endpoints(&t).len(), 3, "{t}");
    let t = tr(&rs, "192.0.2.10", "192.0.2.10", 30081, Proto::Tcp);
    let e = endpoints(&t);
    assert_eq!(e.len(), 3, "{t}");
    assert!(e.iter().all(|(_, _, m)| *m), "{t}");
    let t = tr(&rs, "198.19.0.1", "198.18.0.70", 80, Proto::Tcp);
    assert_eq!(t.outcomes, vec![Outcome::Drop], "{t}");
}

#[test]
fn client_ip_affinity_chains() {
    let mut sp = port("sticky", Proto::Tcp, 80);
    sp.cluster_ips = vec![ip("10.96.0.12")];
    sp.internal = Target::Pool(three());
    sp.affinity = Some(Duration::from_secs(600));
    let rs = render(&[sp], &cfg());
    assert!(dangling(&rs).is_empty());
    let aff: Vec<_> = rs
        .sets
        .iter()
        .filter(|(_, s)| matches!(s.kind, Some(SetKind::Affinity(Fam::V4, 600))))
        .collect();
    assert_eq!(aff.len(), 3);
    let text = render_full("ferry", &rs);
    assert!(text.contains("flags dynamic,timeout; timeout 600s;"));
    assert!(text.contains("update @aff4-"));
    assert!(text.contains("numgen random mod 3 vmap { 0 : goto sep4-"));
    let t = tr(&rs, "10.244.2.9", "10.96.0.12", 80, Proto::Tcp);
    assert_eq!(endpoints(&t).len(), 3, "{t}");
    // A resync keeps the learned affinity entries: dynamic sets are not diffed.
    let mut learned = rs.clone();
    for s in learned.sets.values_mut() {
        if s.kind.as_ref().is_some_and(SetKind::is_dynamic) {
            s.elements.insert(Key::Addr(ip("10.244.2.9")), Value::None);
        }
    }
    assert!(diff(&learned, &rs).is_empty());
}

#[test]
fn dual_stack_and_sctp_udp() {
    let mut v4 = port("dual", Proto::Udp, 53);
    v4.cluster_ips = vec![ip("10.96.0.10")];
    v4.internal = Target::Pool(vec![sa("10.244.1.2:53")]);
    let mut v6 = v4.clone();
    v6.ipv6 = true;
    v6.cluster_ips = vec![ip("fd00:96::a")];
    v6.internal = Target::Pool(vec![sa("[fd00:244::2]:53"), sa("[fd00:244::3]:53")]);
    let mut sctp = port("sctp", Proto::Sctp, 9999);
    sctp.cluster_ips = vec![ip("10.96.0.20")];
    sctp.internal = Target::Pool(vec![sa("10.244.1.2:9999")]);
    let rs = render(&[v4, v6, sctp], &cfg());
    assert!(dangling(&rs).is_empty());
    let t = tr(&rs, "fd00:244::9", "fd00:96::a", 53, Proto::Udp);
    assert_eq!(endpoints(&t).len(), 2, "{t}");
    assert!(endpoints(&t).iter().all(|(_, _, m)| !m));
    let t = tr(&rs, "fd00:99::9", "fd00:96::a", 53, Proto::Udp);
    assert!(endpoints(&t).iter().all(|(_, _, m)| *m), "{t}");
    let t = tr(&rs, "10.244.1.9", "10.96.0.20", 9999, Proto::Sctp);
    assert_eq!(endpoints(&t), vec![(sa("10.244.1.2:9999"), 1.0, false)]);
    let text = render_full("ferry", &rs);
    assert!(
        text.contains("fd00:96::a . udp . 53 : goto cl6-2"),
        "{text}"
    );
    assert!(text.contains("10.96.0.20 . sctp . 9999 : goto cl4-1"));
    assert!(text.contains("dnat ip6 to ip6 daddr"));
}

#[test]
fn frontend_collision_first_claim_wins() {
    let mut a = port("a", Proto::Tcp, 80);
    a.cluster_ips = vec![ip("10.96.0.30")];
    a.internal = Target::Pool(vec![sa("10.244.1.1:80")]);
    let mut b = port("b", Proto::Tcp, 80);
    b.cluster_ips = vec![ip("10.96.0.30")];
    b.internal = Target::Pool(vec![sa("10.244.1.2:80"), sa("10.244.1.3:80")]);
    let rs = render(&[a, b], &cfg());
    let t = tr(&rs, "10.244.9.9", "10.96.0.30", 80, Proto::Tcp);
    assert_eq!(endpoints(&t), vec![(sa("10.244.1.1:80"), 1.0, false)]);
    assert!(rs.sets["dnat4-2"].elements.is_empty());
}

#[test]
fn endpoint_change_is_a_few_element_ops() {
    let mut sp = port("web", Proto::Tcp, 80);
    sp.cluster_ips = vec![ip("10.96.0.10")];
    sp.internal = Target::Pool(three());
    let mut others: Vec<SvcPort> = (0..50)
        .map(|i| {
            let mut o = port(&format!("s{i}"), Proto::Tcp, 80);
            o.cluster_ips = vec![ip(&format!("10.96.1.{i}"))];
            o.internal = Target::Pool(vec![sa(&format!("10.244.5.{i}:80"))]);
            o
        })
        .collect();
    others.push(sp.clone());
    let a = render(&others, &cfg());
    let last = others.len() - 1;
    others[last].internal = Target::Pool(vec![
        sa("10.244.1.7:9376"),
        sa("10.244.9.9:9376"),
        sa("10.244.3.6:9376"),
    ]);
    let b = render(&others, &cfg());
    let ops = diff(&a, &b);
    // One element replaced in the DNAT map, one hairpin pair swapped.
    assert!(
        ops.iter()
            .all(|o| matches!(o, Op::AddElements(..) | Op::DeleteElements(..))),
        "{ops:?}"
    );
    let n: usize = ops
        .iter()
        .map(|o| match o {
            Op::AddElements(_, e) => e.len(),
            Op::DeleteElements(_, k) => k.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(n, 4, "{ops:?}");
    let mut m = a.clone();
    apply_ops(&mut m, &ops).unwrap();
    assert_eq!(m, b);
    // 3 -> 2 endpoints moves the Service to the k=2 chain and map.
    others[last].internal = Target::Pool(vec![sa("10.244.1.7:9376"), sa("10.244.3.6:9376")]);
    let c = render(&others, &cfg());
    let ops = diff(&b, &c);
    let text = render_ops("ferry", &ops);
    assert!(
        text.contains("delete element inet ferry svc4 { 10.96.0.10 . tcp . 80 }"),
        "{text}"
    );
    assert!(text.contains("add element inet ferry svc4 { 10.96.0.10 . tcp . 80 : goto cl4-2 }"));
    assert!(text.contains("delete chain inet ferry cl4-3"));
    assert!(text.contains("delete map inet ferry dnat4-3"), "{text}");
    let mut m = b.clone();
    apply_ops(&mut m, &ops).unwrap();
    assert_eq!(m, c);
    assert!(diff(&c, &c).is_empty());
}

/// From the projected API objects: a Service whose slice has ready, terminating and remote
/// endpoints, with both traffic policies Local.
#[test]
fn from_api_objects_traffic_policy_and_terminating_fallback() {
    let mut services = BTreeMap::new();
    services.insert(
        ("default".to_string(), "web".to_string()),
        ServiceInfo {
            namespace: "default".into(),
            name: "web".into(),
            cluster_ips: vec![ip("10.96.0.10")],
            ports: vec![PortInfo {
                name: "http".into(),
                proto: Proto::Tcp,
                port: 80,
                node_port: Some(30080),
            }],
            external_local: true,
            ..Default::default()
        },
    );
    let ep = |a: &str, node: &str, ready: bool, term: bool| EndpointInfo {
        ip: ip(a),
        ready,
        serving: true,
        terminating: term,
        node_name: Some(node.into()),
        zone: None,
        hint_zones: None,
        topology: BTreeMap::new(),
    };
    let mut slices = BTreeMap::new();
    slices.insert(
        ("default".to_string(), "web-1".to_string()),
        SliceInfo {
            namespace: "default".into(),
            name: "web-1".into(),
            service: "web".into(),
            ports: vec![SlicePort {
                name: "http".into(),
                proto: Proto::Tcp,
                port: 8080,
            }],
            endpoints: vec![
                ep("10.244.1.2", "n1", true, false),
                ep("10.244.2.2", "n2", true, false),
                ep("10.244.1.3", "n1", false, true),
            ],
        },
    );
    let nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
    let (ports, _) = input::build(&services, &slices, &nodes, "n1", &BTreeMap::new());
    assert_eq!(ports.len(), 1);
    let p = &ports[0];
    assert_eq!(
        p.internal,
        Target::Pool(vec![sa("10.244.1.2:8080"), sa("10.244.2.2:8080")])
    );
    assert_eq!(p.external, Target::Pool(vec![sa("10.244.1.2:8080")]));
    // Node n3 has no local endpoint: external traffic is dropped there.
    let (ports, _) = input::build(&services, &slices, &nodes, "n3", &BTreeMap::new());
    assert_eq!(ports[0].external, Target::Drop);
    // Only the terminating endpoint left: used as a fallback.
    let s = slices.values_mut().next().unwrap();
    s.endpoints.retain(|e| e.terminating);
    let (ports, _) = input::build(&services, &slices, &nodes, "n1", &BTreeMap::new());
    assert_eq!(ports[0].internal, Target::Pool(vec![sa("10.244.1.3:8080")]));
    // No endpoints: rejected.
    slices.clear();
    let (ports, _) = input::build(&services, &slices, &nodes, "n1", &BTreeMap::new());
    assert_eq!(ports[0].internal, Target::Reject);
    assert_eq!(ports[0].external, Target::Reject);
}

#[test]
fn base32_matches_go() {
    // Go: base32.StdEncoding.EncodeToString([]byte("foobar")) == "MZXW6YTBOI======"
    assert_eq!(base32(b"foobar"), "MZXW6YTBOI======");
    assert_eq!(base32(b"f"), "MY======");
    assert_eq!(base32(b""), "");
}

fn arb_ports() -> impl Strategy<Value = Vec<SvcPort>> {
    let one = (
        0u8..6,
        any::<bool>(),
        prop::collection::vec(0u8..8, 0..4),
        any::<bool>(),
        prop::option::of(30000u16..30004),
        any::<bool>(),
        0u8..3,
    );
    prop::collection::vec(one, 0..8).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (ipn, v6, eps, aff, np, ext_local, ext))| {
                let mut sp = port(
                    &format!("s{i}"),
                    if ipn % 2 == 0 { Proto::Tcp } else { Proto::Udp },
                    80,
                );
                sp.ipv6 = v6;
                let mk = |n: u8| -> IpAddr {
                    if v6 {
                        ip(&format!("fd00:96::{n}"))
                    } else {
                        ip(&format!("10.96.0.{n}"))
                    }
                };
                sp.cluster_ips = vec![mk(ipn)];
                let e: Vec<SocketAddr> = eps
                    .iter()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .map(|n| SocketAddr::new(mk(100 + n), 8080))
                    .collect();
                sp.internal = if e.is_empty() {
                    Target::Reject
                } else {
                    Target::Pool(e.clone())
                };
                sp.external = match (ext, e.is_empty()) {
                    (_, true) => Target::Reject,
                    (0, _) => Target::Drop,
                    _ => Target::Pool(e[..1].to_vec()),
                };
                sp.node_port = np;
                if ext == 2 {
                    sp.externals = vec![(mk(200 + ipn), ExternalKind::ExternalIp)];
                }
                sp.affinity = aff.then(|| Duration::from_secs(60));
                sp.external_local = ext_local;
                sp
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn diff_applied_to_a_yields_b(a in arb_ports(), b in arb_ports(), pod in any::<bool>()) {
        let mut c = cfg();
        if pod { c.pod_cidrs.clear(); }
        let ra = render(&a, &c);
        let rb = render(&b, &c);
        prop_assert!(dangling(&ra).is_empty());
        prop_assert!(dangling(&rb).is_empty());
        let ops = diff(&ra, &rb);
        let mut m = ra.clone();
        prop_assert_eq!(apply_ops(&mut m, &ops), Ok(()));
        prop_assert_eq!(&m, &rb);
        // From nothing (the first sync) too.
        let mut e = Ruleset::default();
        prop_assert_eq!(apply_ops(&mut e, &diff(&Ruleset::default(), &rb)), Ok(()));
        prop_assert_eq!(&e, &rb);
        prop_assert!(diff(&rb, &rb).is_empty());
    }
}
