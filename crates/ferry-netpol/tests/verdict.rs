//! Table tests of the verdict function: every NetworkPolicy example of seed 004 and the
//! combinations upstream's e2e suite probes, on its 3 namespaces × 3 pods model.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use ferry_netpol::fixtures::{NAMESPACES, PODS, e2e_model, policy, with};
use ferry_netpol::matrix::{expect_all_but, format, matrix};
use ferry_netpol::model::{Model, NamedPort, PodInfo, PodKey, Proto};
use ferry_netpol::verdict::{Conn, Endpoint, Exemption, Outcome, evaluate, explain};
use serde_json::json;

fn pods() -> Vec<PodKey> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| PodKey::new(*ns, *p)))
        .collect()
}

fn k(s: &str) -> PodKey {
    let (ns, p) = s.split_once('/').unwrap();
    PodKey::new(ns, p)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Checks the full matrix; on mismatch prints both tables.
fn check(m: &Model, proto: Proto, port: u16, deny: impl Fn(&PodKey, &PodKey) -> bool) {
    let ps = pods();
    let got = matrix(m, &ps, proto, port);
    // A pod always reaches itself (upstream's e2e ignores loopback; the docs say it cannot be blocked).
    let want = expect_all_but(&ps, |f, t| f != t && deny(f, t));
    assert!(
        got == want,
        "{port}/{proto}\nexpected:\n{}got:\n{}",
        format(&ps, &want, proto, port),
        format(&ps, &got, proto, port)
    );
}

fn conn(m: &Model, from: &str, to: &str, proto: Proto, port: u16) -> bool {
    let ep = |s: &str| {
        if s.contains('/') {
            Endpoint::pod(k(s))
        } else {
            Endpoint::at(m, ip(s))
        }
    };
    evaluate(
        m,
        &Conn {
            src: ep(from),
            dst: ep(to),
            proto,
            port,
        },
    )
    .allowed
}

#[test]
fn no_policy_allows_everything() {
    let m = e2e_model(3);
    for proto in Proto::ALL {
        check(&m, proto, 80, |_, _| false);
    }
}

#[test]
fn seed_default_deny_ingress() {
    let m = with(
        e2e_model(3),
        policy(
            json!({"metadata": {"name": "default-deny-ingress", "namespace": "x"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        )
        .unwrap(),
    );
    for proto in Proto::ALL {
        check(&m, proto, 80, |_, t| t.namespace == "x");
    }
    // Egress of x is untouched.
    assert!(conn(&m, "x/a", "y/a", Proto::Tcp, 81));
}

#[test]
fn seed_allow_all_ingress_overrides_deny() {
    let m = with(
        with(
            e2e_model(3),
            policy(
                json!({"metadata": {"name": "default-deny-ingress", "namespace": "x"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
            )
            .unwrap(),
        ),
        policy(
            json!({"metadata": {"name": "allow-all-ingress", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}}),
        )
        .unwrap(),
    );
    for proto in Proto::ALL {
        check(&m, proto, 81, |_, _| false);
    }
    let v = evaluate(
        &m,
        &Conn {
            src: Endpoint::pod(k("y/a")),
            dst: Endpoint::pod(k("x/b")),
            proto: Proto::Tcp,
            port: 80,
        },
    );
    assert_eq!(v.ingress.isolated_by.len(), 2);
    match &v.ingress.outcome {
        Outcome::Allowed(r) => {
            assert_eq!(r.policy, k("x/allow-all-ingress"));
            assert_eq!((r.rule, r.peer, r.port), (0, None, None));
        }
        o => panic!("{o:?}"),
    }
}

#[test]
fn seed_default_deny_egress_and_allow_all_egress() {
    let deny = policy(
        json!({"metadata": {"name": "default-deny-egress", "namespace": "x"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}),
    )
    .unwrap();
    let m = with(e2e_model(3), deny.clone());
    for proto in Proto::ALL {
        check(&m, proto, 80, |f, _| f.namespace == "x");
    }
    // External destinations too; the pod's own node stays reachable.
    assert!(!conn(&m, "x/a", "93.184.216.34", Proto::Tcp, 443));
    assert!(
        conn(&m, "x/a", "198.18.0.1", Proto::Tcp, 10250),
        "x/a runs on n0"
    );
    assert!(
        !conn(&m, "x/a", "198.18.0.2", Proto::Tcp, 10250),
        "another node is not exempt"
    );
    let m = with(
        m,
        policy(
            json!({"metadata": {"name": "allow-all-egress", "namespace": "x"},
            "spec": {"podSelector": {}, "egress": [{}], "policyTypes": ["Egress"]}}),
        )
        .unwrap(),
    );
    for proto in Proto::ALL {
        check(&m, proto, 80, |_, _| false);
    }
    assert!(conn(&m, "x/a", "93.184.216.34", Proto::Udp, 53));
}

#[test]
fn seed_default_deny_all() {
    let m = with(
        e2e_model(3),
        policy(
            json!({"metadata": {"name": "default-deny-all", "namespace": "x"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}),
        )
        .unwrap(),
    );
    for proto in Proto::ALL {
        check(&m, proto, 80, |f, t| {
            f.namespace == "x" || t.namespace == "x"
        });
    }
    // Node probes still reach the pod (x/b runs on n1).
    assert!(conn(&m, "198.18.0.2", "x/b", Proto::Tcp, 80));
    assert!(!conn(&m, "198.18.0.1", "x/b", Proto::Tcp, 80));
    let v = evaluate(
        &m,
        &Conn {
            src: Endpoint::ip(ip("198.18.0.2")),
            dst: Endpoint::pod(k("x/b")),
            proto: Proto::Tcp,
            port: 80,
        },
    );
    assert_eq!(v.ingress.outcome, Outcome::Exempt(Exemption::OwnNode));
    assert_eq!(v.egress.outcome, Outcome::NotAPod);
}

/// Seed 004's `test-network-policy`, in a model with the namespaces and addresses it names.
fn seed_test_network_policy_model() -> Model {
    let mut m = Model::default();
    m.nodes.insert("n0".into(), vec![ip("198.18.0.1")]);
    m.put_namespace("default", Default::default());
    m.put_namespace(
        "proj",
        [("project".to_string(), "myproject".to_string())].into(),
    );
    m.put_namespace("other", Default::default());
    let mut add = |key: &str, role: &str, addr: &str| {
        m.pods.insert(
            k(key),
            PodInfo {
                labels: [("role".to_string(), role.to_string())].into(),
                ips: vec![ip(addr)],
                node: Some("n0".into()),
                host_network: false,
                ports: Vec::new(),
            },
        );
    };
    add("default/db", "db", "10.244.0.10");
    add("default/frontend", "frontend", "10.244.0.11");
    add("default/backend", "backend", "10.244.0.12");
    add("proj/anything", "backend", "10.244.0.20");
    add("other/frontend", "frontend", "10.244.0.30");
    add("default/inside", "x", "10.0.0.7");
    let np = policy(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "test-network-policy", "namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "db"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [
                {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                {"podSelector": {"matchLabels": {"role": "frontend"}}}
            ], "ports": [{"protocol": "TCP", "port": 6379}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}], "ports": [{"protocol": "TCP", "port": 5978}]}]
        }
    }))
    .unwrap();
    with(m, np)
}

#[test]
fn seed_test_network_policy() {
    let m = seed_test_network_policy_model();
    let t = Proto::Tcp;
    // Ingress: frontend of the same namespace, any pod of project=myproject, 172.17/16 but 172.17.1/24.
    assert!(conn(&m, "default/frontend", "default/db", t, 6379));
    assert!(conn(&m, "proj/anything", "default/db", t, 6379));
    assert!(conn(&m, "172.17.0.5", "default/db", t, 6379));
    assert!(conn(&m, "172.17.2.200", "default/db", t, 6379));
    assert!(!conn(&m, "172.17.1.5", "default/db", t, 6379), "except");
    assert!(!conn(&m, "172.18.0.1", "default/db", t, 6379));
    assert!(
        !conn(&m, "other/frontend", "default/db", t, 6379),
        "podSelector alone is the policy's namespace"
    );
    assert!(!conn(&m, "default/backend", "default/db", t, 6379));
    assert!(!conn(&m, "default/frontend", "default/db", t, 6380), "port");
    assert!(
        !conn(&m, "default/frontend", "default/db", Proto::Udp, 6379),
        "protocol"
    );
    // Egress: only 10.0.0.0/24 port 5978/TCP — a pod address in the block counts (ipBlock on pod IPs).
    assert!(conn(&m, "default/db", "10.0.0.9", t, 5978));
    assert!(conn(&m, "default/db", "default/inside", t, 5978));
    assert!(!conn(&m, "default/db", "10.0.1.9", t, 5978));
    assert!(!conn(&m, "default/db", "10.0.0.9", t, 5979));
    assert!(
        !conn(&m, "default/db", "default/frontend", t, 6379),
        "db's egress is isolated"
    );
    // Other pods are not selected.
    assert!(conn(
        &m,
        "default/frontend",
        "default/backend",
        Proto::Udp,
        9
    ));
    // The explanation names the policy, the rule, the peer and the port.
    let c = Conn {
        src: Endpoint::pod(k("proj/anything")),
        dst: Endpoint::pod(k("default/db")),
        proto: t,
        port: 6379,
    };
    let v = evaluate(&m, &c);
    let text = explain(&m, &c, &v).join("\n");
    assert!(
        text.contains("allowed by default/test-network-policy ingress[0] (peer [1] namespaceSelector {project=myproject}, port [0] 6379/TCP)"),
        "{text}"
    );
    assert!(
        text.contains(
            "egress of the source proj/anything (10.244.0.20): no policy with Egress selects it"
        ),
        "{text}"
    );
    assert!(text.ends_with("ALLOWED"), "{text}");
    let c = Conn {
        src: Endpoint::ip(ip("172.17.1.5")),
        ..c
    };
    let text = explain(&m, &c, &evaluate(&m, &c)).join("\n");
    assert!(
        text.contains("no rule allows 6379/TCP: denied") && text.ends_with("DENIED"),
        "{text}"
    );
}

#[test]
fn seed_end_port() {
    let mut m = seed_test_network_policy_model();
    m.policies.clear();
    let m = with(
        m,
        policy(
            json!({"metadata": {"name": "multi-port-egress", "namespace": "default"},
            "spec": {"podSelector": {"matchLabels": {"role": "db"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                    "ports": [{"protocol": "TCP", "port": 32000, "endPort": 32768}]}]}}),
        )
        .unwrap(),
    );
    for (port, ok) in [
        (31999, false),
        (32000, true),
        (32500, true),
        (32768, true),
        (32769, false),
    ] {
        assert_eq!(
            conn(&m, "default/db", "10.0.0.1", Proto::Tcp, port),
            ok,
            "{port}"
        );
    }
    assert!(!conn(&m, "default/db", "10.0.0.1", Proto::Udp, 32000));
    // Ingress of db is not isolated by an Egress-only policy.
    assert!(conn(&m, "172.18.0.1", "default/db", Proto::Tcp, 1));
}

#[test]
fn pod_and_namespace_selector_in_one_peer_or_two() {
    // One peer: pods b in namespaces y.
    let one = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}}))
        .unwrap(),
    );
    check(&one, Proto::Tcp, 80, |f, t| {
        *t == k("x/a") && *f != k("y/b")
    });
    // Two peers: any pod of y, or pods b of x.
    let two = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}}))
        .unwrap(),
    );
    check(&two, Proto::Tcp, 80, |f, t| {
        *t == k("x/a") && f.namespace != "y" && *f != k("x/b")
    });
    // namespaceSelector {} with podSelector: pods b of every namespace; matchExpressions NotIn.
    let all_ns = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["c"]}]}}]}]}}))
        .unwrap(),
    );
    check(&all_ns, Proto::Tcp, 80, |f, t| {
        *t == k("x/a") && f.name == "c"
    });
    // Namespace by name label.
    let by_name = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "z"}}}]}]}}))
        .unwrap(),
    );
    check(&by_name, Proto::Udp, 81, |f, t| {
        t.namespace == "x" && f.namespace != "z"
    });
}

#[test]
fn named_ports_resolve_against_the_destination() {
    // Ingress by name: serve-80-tcp is 80/TCP on every pod.
    let m = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}}))
        .unwrap(),
    );
    check(&m, Proto::Tcp, 80, |_, _| false);
    check(&m, Proto::Tcp, 81, |_, t| *t == k("x/a"));
    check(&m, Proto::Udp, 80, |_, t| *t == k("x/a"));
    // The rule's protocol must match the container port's: serve-81-udp with TCP matches nothing.
    let m = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "TCP"}]}]}}))
        .unwrap(),
    );
    check(&m, Proto::Tcp, 81, |_, t| *t == k("x/a"));
    check(&m, Proto::Udp, 81, |_, t| *t == k("x/a"));
    // Egress by name: resolved on the pod connected to; pods without the name are not reachable.
    let mut base = e2e_model(3);
    base.pods.get_mut(&k("y/c")).unwrap().ports = vec![NamedPort {
        name: "serve-81-udp".into(),
        port: 8081,
        proto: Proto::Udp,
    }];
    let m = with(
        base,
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}}))
        .unwrap(),
    );
    check(&m, Proto::Udp, 81, |f, t| {
        f.namespace == "x" && *t == k("y/c")
    });
    check(&m, Proto::Tcp, 81, |f, _| f.namespace == "x");
    assert!(conn(&m, "x/a", "y/c", Proto::Udp, 8081));
    assert!(
        !conn(&m, "x/a", "10.9.9.9", Proto::Udp, 81),
        "external addresses have no named ports"
    );
}

#[test]
fn ip_block_except_on_pod_addresses() {
    // Upstream's "should enforce except clause while egress access to server in CIDR block".
    let m = with(
        e2e_model(3),
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.2/32"]}}]}]}}))
        .unwrap(),
    );
    check(&m, Proto::Tcp, 80, |f, t| *f == k("x/a") && *t == k("y/b"));
}

#[test]
fn egress_with_dns_allowed() {
    let mut m = e2e_model(3);
    m.put_namespace("kube-system", Default::default());
    m.pods.insert(
        k("kube-system/coredns"),
        PodInfo {
            labels: [("k8s-app".to_string(), "kube-dns".to_string())].into(),
            ips: vec![ip("10.0.9.10")],
            node: Some("n1".into()),
            host_network: false,
            ports: Vec::new(),
        },
    );
    let m = with(
        m,
        policy(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80}]}
            ]}}))
        .unwrap(),
    );
    assert!(conn(&m, "x/a", "kube-system/coredns", Proto::Udp, 53));
    assert!(conn(&m, "x/a", "kube-system/coredns", Proto::Tcp, 53));
    assert!(!conn(&m, "x/a", "kube-system/coredns", Proto::Tcp, 80));
    check(&m, Proto::Tcp, 80, |f, t| {
        f.namespace == "x" && *t != k("x/b")
    });
    check(&m, Proto::Udp, 80, |f, _| f.namespace == "x");
}

#[test]
fn union_of_policies_and_isolation_per_direction() {
    let m = with(
        with(
            e2e_model(3),
            policy(json!({"metadata": {"name": "from-y", "namespace": "x"}, "spec": {"podSelector": {},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}}))
            .unwrap(),
        ),
        policy(json!({"metadata": {"name": "from-z-81", "namespace": "x"}, "spec": {"podSelector": {"matchLabels": {"pod": "c"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 81}]}]}}))
        .unwrap(),
    );
    check(&m, Proto::Tcp, 80, |f, t| {
        t.namespace == "x" && f.namespace != "y"
    });
    check(&m, Proto::Tcp, 81, |f, t| {
        t.namespace == "x" && f.namespace != "y" && !(t.name == "c" && f.namespace == "z")
    });
    // Egress of x is not isolated by ingress policies.
    check(&m, Proto::Udp, 81, |f, t| {
        t.namespace == "x" && f.namespace != "y"
    });
}

#[test]
fn empty_lists_and_peers() {
    // `ingress: []` (no rule) isolates and allows nothing; `from: []` in a rule allows all.
    let none = with(
        e2e_model(1),
        policy(json!({"metadata": {"name": "p", "namespace": "y"}, "spec": {"podSelector": {}, "ingress": []}}))
            .unwrap(),
    );
    check(&none, Proto::Tcp, 80, |_, t| t.namespace == "y");
    let all = with(
        e2e_model(1),
        policy(json!({"metadata": {"name": "p", "namespace": "y"}, "spec": {"podSelector": {}, "ingress": [{"from": [], "ports": []}]}}))
            .unwrap(),
    );
    check(&all, Proto::Sctp, 80, |_, _| false);
    // A protocol-only port entry: every port of that protocol.
    let udp = with(
        e2e_model(1),
        policy(json!({"metadata": {"name": "p", "namespace": "y"}, "spec": {"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP"}]}]}}))
            .unwrap(),
    );
    check(&udp, Proto::Udp, 81, |_, _| false);
    check(&udp, Proto::Tcp, 81, |_, t| t.namespace == "y");
}

#[test]
fn host_network_pods_are_their_node() {
    let mut m = e2e_model(3);
    m.pods.insert(
        k("x/host"),
        PodInfo {
            labels: [("pod".to_string(), "a".to_string())].into(),
            ips: vec![ip("198.18.0.1")],
            node: Some("n0".into()),
            host_network: true,
            ports: Vec::new(),
        },
    );
    let m = with(
        m,
        policy(
            json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}]}}),
        )
        .unwrap(),
    );
    // Not selected by the policy (host network), not matched by the podSelector as a peer.
    let v = evaluate(
        &m,
        &Conn {
            src: Endpoint::pod(k("x/host")),
            dst: Endpoint::pod(k("y/a")),
            proto: Proto::Tcp,
            port: 80,
        },
    );
    assert_eq!(v.egress.outcome, Outcome::NotAPod);
    // x/a runs on n0: the host pod of n0 reaches it; x/b on n1 is not reachable from it.
    assert!(conn(&m, "x/host", "x/a", Proto::Tcp, 80));
    assert!(!conn(&m, "x/host", "x/b", Proto::Tcp, 80));
    assert!(
        conn(&m, "x/a", "x/a", Proto::Udp, 9),
        "a pod reaches itself"
    );
}

#[test]
fn dual_stack_uses_the_connection_family() {
    let mut m = e2e_model(1);
    m.pods.get_mut(&k("x/a")).unwrap().ips.push(ip("fd00::a"));
    m.pods.get_mut(&k("y/a")).unwrap().ips.push(ip("fd00::b"));
    let m = with(
        m,
        policy(
            json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {"podSelector": {},
            "ingress": [{"from": [{"ipBlock": {"cidr": "fd00::/64"}}]}]}}),
        )
        .unwrap(),
    );
    assert!(conn(&m, "fd00::b", "fd00::a", Proto::Tcp, 80));
    assert!(!conn(&m, "10.0.1.1", "10.0.0.1", Proto::Tcp, 80));
    // Pod to pod picks the first common family (IPv4 here): the IPv6 block does not match.
    assert!(!conn(&m, "y/a", "x/a", Proto::Tcp, 80));
}
