#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use crate::kernel::input::{ExternalKind, SvcPort, Target};
use crate::model::{Proto, ServicePortName};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Seed 002's `hostnames` Service: ClusterIP 10.0.1.175:80, three pods on 9376.
fn hostnames() -> SvcPort {
    SvcPort {
        name: ServicePortName {
            namespace: "default".into(),
            name: "hostnames".into(),
            port: String::new(),
            proto: Proto::Tcp,
        },
        ipv6: false,
        port: 80,
        node_port: None,
        cluster_ips: vec!["10.0.1.175".parse().unwrap()],
        externals: vec![],
        internal: Target::Pool(vec![
            sa("10.244.1.7:9376"),
            sa("10.244.2.3:9376"),
            sa("10.244.3.6:9376"),
        ]),
        external: Target::Reject,
        affinity: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    }
}

#[test]
fn seed_002_names_and_probabilities() {
    let sp = hostnames();
    assert_eq!(svc_chain(&sp), "KUBE-SVC-NWV5X2332I4OT4T3");
    assert_eq!(
        sep_chain(&sp, &sa("10.244.3.6:9376")),
        "KUBE-SEP-57KPRZ3JQVENLNBR"
    );
    assert_eq!(
        sep_chain(&sp, &sa("10.244.1.7:9376")),
        "KUBE-SEP-WNBA2IHDGP2BOBGZ"
    );
    assert_eq!(
        sep_chain(&sp, &sa("10.244.2.3:9376")),
        "KUBE-SEP-X3P2623AGDH6CDF3"
    );
    assert_eq!(probability(3), "0.3333333333");
    assert_eq!(probability(2), "0.5000000000");
    let r = render(&[sp], false, &IptConfig::default(), &BTreeSet::new());
    let want = "\
-A KUBE-SERVICES -m comment --comment \"default/hostnames: cluster IP\" -m tcp -p tcp -d 10.0.1.175 --dport 80 -j KUBE-SVC-NWV5X2332I4OT4T3
-A KUBE-SVC-NWV5X2332I4OT4T3 -m comment --comment \"default/hostnames: -> 10.244.1.7:9376\" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-WNBA2IHDGP2BOBGZ
-A KUBE-SVC-NWV5X2332I4OT4T3 -m comment --comment \"default/hostnames: -> 10.244.2.3:9376\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-X3P2623AGDH6CDF3
-A KUBE-SVC-NWV5X2332I4OT4T3 -m comment --comment \"default/hostnames: -> 10.244.3.6:9376\" -j KUBE-SEP-57KPRZ3JQVENLNBR
-A KUBE-SEP-WNBA2IHDGP2BOBGZ -m comment --comment default/hostnames: -s 10.244.1.7 -j KUBE-MARK-MASQ
-A KUBE-SEP-WNBA2IHDGP2BOBGZ -m comment --comment default/hostnames: -m tcp -p tcp -j DNAT --to-destination 10.244.1.7:9376
";
    assert!(r.text.contains(want), "{}", r.text);
    assert!(r.text.contains(":KUBE-SEP-57KPRZ3JQVENLNBR - [0:0]\n"));
    assert!(
        r.text
            .contains("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n")
    );
    assert!(r.text.starts_with("*filter\n"));
    assert!(r.text.ends_with("-j KUBE-NODEPORTS\nCOMMIT\n"));
    assert_eq!(r.chains.len(), 4);
    // The Service goes away: its chains are flushed and deleted.
    let r2 = render(&[], false, &IptConfig::default(), &r.chains);
    assert!(r2.text.contains(":KUBE-SVC-NWV5X2332I4OT4T3 - [0:0]\n"));
    assert!(r2.text.contains("-X KUBE-SVC-NWV5X2332I4OT4T3\n"));
    assert!(r2.text.contains("-X KUBE-SEP-57KPRZ3JQVENLNBR\n"));
}

#[test]
fn localhost_nodeports_firewall() {
    let v4 = render(&[], false, &IptConfig::default(), &BTreeSet::new()).text;
    assert!(v4.contains(":KUBE-FIREWALL - [0:0]\n"), "{v4}");
    assert!(
        v4.contains("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n"),
        "{v4}"
    );
    // NodePorts match every local destination, 127.0.0.1 included.
    assert!(v4.contains("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n"));
    let v6 = render(&[], true, &IptConfig::default(), &BTreeSet::new()).text;
    assert!(v6.contains(":KUBE-FIREWALL - [0:0]\n"));
    assert!(!v6.contains("-A KUBE-FIREWALL"), "{v6}");
    let jumps = jump_rules();
    for chain in ["INPUT", "OUTPUT"] {
        assert!(jumps.iter().any(|(t, c, spec)| *t == "filter"
            && *c == chain
            && spec.as_slice() == ["-j", "KUBE-FIREWALL"]));
    }
    assert!(render_cleanup(&BTreeSet::new()).contains("-X KUBE-FIREWALL\n"));
}

#[test]
fn masquerade_reject_nodeport_local_affinity() {
    let cfg = IptConfig {
        pod_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
    };
    let mut sp = hostnames();
    sp.node_port = Some(30080);
    sp.externals = vec![("198.18.0.50".parse().unwrap(), ExternalKind::ExternalIp)];
    sp.external = Target::Pool(vec![sa("10.244.1.7:9376")]);
    sp.external_local = true;
    sp.affinity = Some(Duration::from_secs(10800));
    let mut empty = hostnames();
    empty.name.name = "empty".into();
    empty.cluster_ips = vec!["10.0.1.176".parse().unwrap()];
    empty.internal = Target::Reject;
    let mut local = hostnames();
    local.name.name = "local".into();
    local.cluster_ips = vec!["10.0.1.177".parse().unwrap()];
    local.internal = Target::Drop;
    local.internal_local = true;
    let r = render(&[sp.clone(), empty, local], false, &cfg, &BTreeSet::new());
    let t = &r.text;
    let svc = svc_chain(&sp);
    let svl = svl_chain(&sp);
    let ext = ext_chain(&sp);
    for line in [
        format!("-A {svc} -m comment --comment \"default/hostnames: cluster IP\" -m tcp -p tcp -d 10.0.1.175 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"),
        format!("-A KUBE-NODEPORTS -m comment --comment default/hostnames: -m tcp -p tcp --dport 30080 -j {ext}"),
        format!("-A KUBE-SERVICES -m comment --comment \"default/hostnames: external IP\" -m tcp -p tcp -d 198.18.0.50 --dport 80 -j {ext}"),
        format!("-A {ext} -m comment --comment \"pod traffic for default/hostnames: external destinations\" -s 10.244.0.0/16 -j {svc}"),
        format!("-A {ext} -m comment --comment \"masquerade LOCAL traffic for default/hostnames: external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"),
        format!("-A {ext} -m comment --comment \"route LOCAL traffic for default/hostnames: external destinations\" -m addrtype --src-type LOCAL -j {svc}"),
        format!("-A {ext} -j {svl}"),
        format!("-A {svl} -m comment --comment \"default/hostnames: -> 10.244.1.7:9376\" -m recent --name KUBE-SEP-WNBA2IHDGP2BOBGZ --rcheck --seconds 10800 --reap -j KUBE-SEP-WNBA2IHDGP2BOBGZ"),
        "-A KUBE-SEP-WNBA2IHDGP2BOBGZ -m comment --comment default/hostnames: -m recent --name KUBE-SEP-WNBA2IHDGP2BOBGZ --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.7:9376".to_string(),
        "-A KUBE-SERVICES -m comment --comment \"default/empty: has no endpoints\" -m tcp -p tcp -d 10.0.1.176 --dport 80 -j REJECT".to_string(),
        "-A KUBE-SERVICES -m comment --comment \"default/local: has no local endpoints\" -m tcp -p tcp -d 10.0.1.177 --dport 80 -j DROP".to_string(),
    ] {
        assert!(t.contains(&format!("{line}\n")), "missing {line}\n{t}");
    }
    // A SEP shared by the internal and the external chain is written once.
    let sep_dnat = t
        .matches("-j DNAT --to-destination 10.244.1.7:9376")
        .count();
    assert_eq!(sep_dnat, 1);
    // The filter table rejects, the nat table DNATs.
    let (filter, nat) = t.split_once("COMMIT\n*nat\n").unwrap();
    assert!(filter.contains("-j REJECT") && !nat.contains("-j REJECT"));
    // IPv6 ports are not in the IPv4 text.
    let mut v6 = hostnames();
    v6.ipv6 = true;
    v6.cluster_ips = vec!["fd00::1".parse().unwrap()];
    let r6 = render(&[v6.clone()], false, &cfg, &BTreeSet::new());
    assert!(!r6.text.contains("fd00::1"));
    let r6 = render(&[v6], true, &cfg, &BTreeSet::new());
    assert!(r6.text.contains("-d fd00::1 --dport 80"));
}
