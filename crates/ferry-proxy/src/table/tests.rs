#![allow(clippy::unwrap_used)]
use super::*;
use proptest::prelude::*;

const NODE: &str = "n1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn svc(name: &str) -> ServiceInfo {
    ServiceInfo {
        namespace: "default".into(),
        name: name.into(),
        cluster_ips: vec![ip("127.96.0.10")],
        ports: vec![PortInfo {
            name: "http".into(),
            proto: Proto::Tcp,
            port: 80,
            node_port: None,
        }],
        ..Default::default()
    }
}

#[derive(Clone, Copy, Debug)]
struct E {
    ip: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
    node: &'static str,
    zone: &'static str,
    hints: Option<&'static str>,
}

const fn ready(ip: &'static str, node: &'static str) -> E {
    E {
        ip,
        ready: true,
        serving: true,
        terminating: false,
        node,
        zone: "",
        hints: None,
    }
}

const fn term(ip: &'static str, node: &'static str, serving: bool) -> E {
    E {
        ip,
        ready: false,
        serving,
        terminating: true,
        node,
        zone: "",
        hints: None,
    }
}

fn ep(e: E) -> EndpointInfo {
    EndpointInfo {
        ip: ip(e.ip),
        ready: e.ready,
        serving: e.serving,
        terminating: e.terminating,
        node_name: (!e.node.is_empty()).then(|| e.node.to_string()),
        zone: (!e.zone.is_empty()).then(|| e.zone.to_string()),
        hint_zones: e.hints.map(|h| {
            h.split(',')
                .filter(|z| !z.is_empty())
                .map(str::to_string)
                .collect()
        }),
        topology: BTreeMap::new(),
    }
}

fn slice(svc: &str, name: &str, eps: &[E]) -> SliceInfo {
    SliceInfo {
        namespace: "default".into(),
        name: name.into(),
        service: svc.into(),
        ports: vec![SlicePort {
            name: "http".into(),
            proto: Proto::Tcp,
            port: 9376,
        }],
        endpoints: eps.iter().copied().map(ep).collect(),
    }
}

fn ctx() -> NodeContext {
    NodeContext {
        name: NODE.into(),
        labels: [
            (LABEL_HOSTNAME.to_string(), NODE.to_string()),
            (LABEL_ZONE.to_string(), "za".to_string()),
            (LABEL_REGION.to_string(), "r1".to_string()),
        ]
        .into_iter()
        .collect(),
        node_ips: vec![ip("127.0.0.1")],
        scheduler: Scheduler::RoundRobin,
        sctp: false,
    }
}

fn nodes() -> BTreeMap<String, NodeInfo> {
    let mk = |name: &str, zone: &str, region: &str| NodeInfo {
        name: name.into(),
        labels: [
            (LABEL_HOSTNAME.to_string(), name.to_string()),
            (LABEL_ZONE.to_string(), zone.to_string()),
            (LABEL_REGION.to_string(), region.to_string()),
        ]
        .into_iter()
        .collect(),
        addresses: vec![],
    };
    [
        mk("n1", "za", "r1"),
        mk("n2", "za", "r1"),
        mk("n3", "zb", "r1"),
        mk("n4", "zc", "r2"),
    ]
    .into_iter()
    .map(|n| (n.name.clone(), n))
    .collect()
}

fn one(svc: ServiceInfo, slices: Vec<SliceInfo>) -> Table {
    let services = [((svc.namespace.clone(), svc.name.clone()), svc)]
        .into_iter()
        .collect();
    let slices = slices
        .into_iter()
        .map(|s| ((s.namespace.clone(), s.name.clone()), s))
        .collect();
    build(&services, &slices, &nodes(), &ctx())
}

/// The endpoints served at a frontend, as strings.
fn at(t: &Table, fe: &str) -> Vec<String> {
    let sock = sa(fe);
    let f = Frontend {
        ip: sock.ip(),
        port: sock.port(),
        proto: Proto::Tcp,
    };
    t.frontends
        .get(&f)
        .and_then(|k| t.pools.get(k))
        .map(|p| p.endpoints.iter().map(|e| e.ip().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn selection_table() {
    let local_int = |mut s: ServiceInfo| {
        s.internal_local = true;
        s
    };
    let hinted = |mut s: ServiceInfo| {
        s.hints = true;
        s
    };
    let keys = |k: &[&str]| {
        let k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
        move |mut s: ServiceInfo| {
            s.topology_keys = k.clone();
            s
        }
    };
    let id = |s: ServiceInfo| s;
    let hz = |ip, node, zone, hints| E {
        zone,
        hints: Some(hints),
        ..ready(ip, node)
    };
    type Case = (
        &'static str,
        Box<dyn Fn(ServiceInfo) -> ServiceInfo>,
        Vec<E>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "all ready",
            Box::new(id),
            vec![
                ready("127.0.1.1", "n1"),
                ready("127.0.1.2", "n2"),
                ready("127.0.1.3", "n3"),
            ],
            vec!["127.0.1.1", "127.0.1.2", "127.0.1.3"],
        ),
        (
            "not ready excluded",
            Box::new(id),
            vec![ready("127.0.1.1", "n1"), term("127.0.1.2", "n2", true)],
            vec!["127.0.1.1"],
        ),
        (
            "fallback to serving+terminating",
            Box::new(id),
            vec![
                term("127.0.1.1", "n1", true),
                term("127.0.1.2", "n2", false),
            ],
            vec!["127.0.1.1"],
        ),
        (
            "not ready, not terminating: nothing",
            Box::new(id),
            vec![E {
                ready: false,
                serving: false,
                ..ready("127.0.1.1", "n1")
            }],
            vec![],
        ),
        (
            "internal Local: only this node",
            Box::new(local_int),
            vec![ready("127.0.1.1", "n1"), ready("127.0.1.2", "n2")],
            vec!["127.0.1.1"],
        ),
        (
            "internal Local: none local",
            Box::new(local_int),
            vec![ready("127.0.1.2", "n2")],
            vec![],
        ),
        (
            "internal Local: local terminating fallback",
            Box::new(local_int),
            vec![term("127.0.1.1", "n1", true), ready("127.0.1.2", "n2")],
            vec!["127.0.1.1"],
        ),
        (
            "hints: this zone",
            Box::new(hinted),
            vec![
                hz("127.0.1.1", "n1", "za", "za"),
                hz("127.0.1.2", "n3", "zb", "zb"),
                hz("127.0.1.3", "n3", "zb", "za"),
            ],
            vec!["127.0.1.1", "127.0.1.3"],
        ),
        (
            "hints: one ready endpoint without hints -> all",
            Box::new(hinted),
            vec![hz("127.0.1.1", "n1", "za", "za"), ready("127.0.1.2", "n3")],
            vec!["127.0.1.1", "127.0.1.2"],
        ),
        (
            "hints: none for this zone -> all",
            Box::new(hinted),
            vec![
                hz("127.0.1.1", "n3", "zb", "zb"),
                hz("127.0.1.2", "n4", "zc", "zc"),
            ],
            vec!["127.0.1.1", "127.0.1.2"],
        ),
        (
            "hints present but not requested -> all",
            Box::new(id),
            vec![
                hz("127.0.1.1", "n1", "za", "za"),
                hz("127.0.1.2", "n3", "zb", "zb"),
            ],
            vec!["127.0.1.1", "127.0.1.2"],
        ),
        (
            "topologyKeys hostname only, local exists",
            Box::new(keys(&[LABEL_HOSTNAME])),
            vec![ready("127.0.1.1", "n1"), ready("127.0.1.2", "n2")],
            vec!["127.0.1.1"],
        ),
        (
            "topologyKeys hostname only, none local -> refused",
            Box::new(keys(&[LABEL_HOSTNAME])),
            vec![ready("127.0.1.2", "n2")],
            vec![],
        ),
        (
            "topologyKeys hostname, *",
            Box::new(keys(&[LABEL_HOSTNAME, TOPOLOGY_ANY])),
            vec![ready("127.0.1.2", "n2"), ready("127.0.1.3", "n3")],
            vec!["127.0.1.2", "127.0.1.3"],
        ),
        (
            "topologyKeys zone then region",
            Box::new(keys(&[LABEL_HOSTNAME, LABEL_ZONE, LABEL_REGION])),
            vec![ready("127.0.1.2", "n2"), ready("127.0.1.3", "n3")],
            vec!["127.0.1.2"],
        ),
        (
            "topologyKeys region",
            Box::new(keys(&[LABEL_ZONE, LABEL_REGION])),
            vec![ready("127.0.1.3", "n3"), ready("127.0.1.4", "n4")],
            vec!["127.0.1.3"],
        ),
        (
            "topologyKeys zone, region: nothing matches -> refused",
            Box::new(keys(&[LABEL_ZONE, LABEL_REGION])),
            vec![ready("127.0.1.4", "n4")],
            vec![],
        ),
    ];
    for (name, f, eps, want) in cases {
        let t = one(f(svc("web")), vec![slice("web", "web-1", &eps)]);
        assert_eq!(at(&t, "127.96.0.10:80"), want, "{name}");
    }
}

#[test]
fn frontends_for_every_address() {
    let mut s = svc("web");
    s.cluster_ips = vec![ip("127.96.0.10"), ip("::1")];
    s.ports[0].node_port = Some(30080);
    s.external_ips = vec![ip("127.0.0.50")];
    s.load_balancer_ips = vec![ip("127.0.0.60")];
    s.external_local = true;
    let t = one(
        s,
        vec![slice(
            "web",
            "web-1",
            &[ready("127.0.1.1", "n1"), ready("127.0.1.2", "n2")],
        )],
    );
    let all = vec!["127.0.1.1", "127.0.1.2"];
    assert_eq!(at(&t, "127.96.0.10:80"), all, "cluster IP: cluster-wide");
    for fe in ["127.0.0.1:30080", "127.0.0.50:80", "127.0.0.60:80"] {
        assert_eq!(at(&t, fe), vec!["127.0.1.1"], "{fe}: external Local");
    }
    // No IPv6 endpoints: the IPv6 cluster IP gets no frontend (refused).
    assert!(at(&t, "[::1]:80").is_empty());
    assert_eq!(t.frontends.len(), 4);
    assert_eq!(t.pools.len(), 2);
}

#[test]
fn dedupe_across_slices_and_ports_by_name() {
    let mut s = svc("web");
    s.ports.push(PortInfo {
        name: "dns".into(),
        proto: Proto::Udp,
        port: 53,
        node_port: None,
    });
    let mut udp = slice(
        "web",
        "web-2",
        &[ready("127.0.1.1", "n1"), ready("127.0.1.3", "n2")],
    );
    udp.ports = vec![
        SlicePort {
            name: "dns".into(),
            proto: Proto::Udp,
            port: 5353,
        },
        SlicePort {
            name: "http".into(),
            proto: Proto::Tcp,
            port: 9376,
        },
    ];
    let a = slice(
        "web",
        "web-1",
        &[term("127.0.1.1", "n1", true), ready("127.0.1.2", "n2")],
    );
    let t = one(s, vec![a, udp]);
    // 127.0.1.1 is terminating in one slice and ready in the other: the ready copy wins.
    assert_eq!(
        at(&t, "127.96.0.10:80"),
        vec!["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    );
    let udp_fe = Frontend {
        ip: ip("127.96.0.10"),
        port: 53,
        proto: Proto::Udp,
    };
    let pool = &t.pools[&t.frontends[&udp_fe]];
    assert_eq!(
        pool.endpoints,
        vec![sa("127.0.1.1:5353"), sa("127.0.1.3:5353")]
    );
}

#[test]
fn annotations_and_defaults_reach_pools() {
    let mut s = svc("web");
    s.scheduler = Some(Scheduler::SourceHashing);
    s.proxy_protocol = Some(ProxyProtocol::V1);
    s.affinity = Some(Duration::from_secs(5));
    let t = one(s, vec![slice("web", "web-1", &[ready("127.0.1.1", "n1")])]);
    let p = t.pools.values().next().unwrap();
    assert_eq!(p.scheduler, Scheduler::SourceHashing);
    assert_eq!(p.proxy_protocol, Some(ProxyProtocol::V1));
    assert_eq!(p.affinity, Some(Duration::from_secs(5)));
    let t = one(
        svc("web"),
        vec![slice("web", "web-1", &[ready("127.0.1.1", "n1")])],
    );
    assert_eq!(
        t.pools.values().next().unwrap().scheduler,
        Scheduler::RoundRobin
    );
}

#[test]
fn slices_of_other_services_and_namespaces_ignored() {
    let mut other_ns = slice("web", "web-x", &[ready("127.0.1.9", "n1")]);
    other_ns.namespace = "kube-system".into();
    let t = one(
        svc("web"),
        vec![
            slice("api", "api-1", &[ready("127.0.1.8", "n1")]),
            other_ns,
            slice("web", "web-1", &[ready("127.0.1.1", "n1")]),
        ],
    );
    assert_eq!(at(&t, "127.96.0.10:80"), vec!["127.0.1.1"]);
}

#[test]
fn colliding_frontends_first_service_wins_and_diff() {
    let a = svc("a");
    let b = svc("b");
    let services: BTreeMap<_, _> = [a, b]
        .into_iter()
        .map(|s| ((s.namespace.clone(), s.name.clone()), s))
        .collect();
    let slices: BTreeMap<_, _> = [
        slice("a", "a-1", &[ready("127.0.1.1", "n1")]),
        slice("b", "b-1", &[ready("127.0.1.2", "n1")]),
    ]
    .into_iter()
    .map(|s| ((s.namespace.clone(), s.name.clone()), s))
    .collect();
    let t = build(&services, &slices, &nodes(), &ctx());
    assert_eq!(at(&t, "127.96.0.10:80"), vec!["127.0.1.1"]);
    let (removed, added) = frontend_diff(&Table::default(), &t);
    assert!(removed.is_empty());
    assert_eq!(added.len(), 1);
    let (removed, added) = frontend_diff(&t, &t);
    assert!(removed.is_empty() && added.is_empty());
    let (removed, _) = frontend_diff(&t, &Table::default());
    assert_eq!(removed.len(), 1);
}

fn arb_e() -> impl Strategy<Value = E> {
    (
        0u8..6,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec!["n1", "n2", "n3", "n4", ""]),
        prop::sample::select(vec![None, Some(""), Some("za"), Some("zb"), Some("za,zb")]),
    )
        .prop_map(|(i, ready, serving, terminating, node, hints)| E {
            ip: [
                "127.0.1.1",
                "127.0.1.2",
                "127.0.1.3",
                "127.0.1.4",
                "127.0.1.5",
                "127.0.1.6",
            ][usize::from(i)],
            ready,
            serving: serving || ready,
            terminating: terminating && !ready,
            node,
            zone: "",
            hints,
        })
}

proptest! {
    /// Invariants: every served endpoint is in some slice; with ready endpoints present (and no
    /// topology restriction) only ready ones are served; Local serves only local endpoints;
    /// a frontend exists iff its pool is non-empty.
    #[test]
    fn table_invariants(
        eps in prop::collection::vec(arb_e(), 0..10),
        eps2 in prop::collection::vec(arb_e(), 0..5),
        internal_local in any::<bool>(),
        hints in any::<bool>(),
    ) {
        let mut s = svc("web");
        s.internal_local = internal_local;
        s.hints = hints;
        let t = one(s, vec![slice("web", "web-1", &eps), slice("web", "web-2", &eps2)]);
        let all: Vec<&E> = eps.iter().chain(eps2.iter()).collect();
        let served = at(&t, "127.96.0.10:80");
        let mut sorted = served.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), served.len(), "deduplicated");
        for a in &served {
            prop_assert!(all.iter().any(|e| e.ip == a), "served endpoint comes from a slice");
        }
        for a in &served {
            let copies: Vec<&&E> = all.iter().filter(|e| e.ip == a).collect();
            prop_assert!(copies.iter().any(|e| e.ready || (e.serving && e.terminating)));
            if internal_local {
                prop_assert!(copies.iter().any(|e| e.node == NODE));
            }
        }
        if !internal_local && !hints && all.iter().any(|e| e.ready) {
            prop_assert!(!served.is_empty());
        }
        for (f, k) in &t.frontends {
            prop_assert!(t.pools.get(k).is_some_and(|p| !p.endpoints.is_empty()), "{}", f);
        }
    }
}
