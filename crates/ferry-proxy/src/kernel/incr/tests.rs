#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::kernel::input::{ExternalKind, Target};
use crate::model::{Proto, ServicePortName};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn cfg() -> NftConfig {
    NftConfig {
        pod_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/64".parse().unwrap(),
        ],
        node_ips: vec![ip("192.0.2.10")],
        masquerade_all: false,
    }
}

/// One port of Service `svc` (named `p<port>`).
#[allow(clippy::too_many_arguments)]
fn sp(
    svc: u8,
    port: u16,
    v6: bool,
    cip: u8,
    eps: &[u8],
    aff: bool,
    np: Option<u16>,
    ext: u8,
    ext_local: bool,
) -> SvcPort {
    let mk = |n: u8| -> IpAddr {
        if v6 {
            ip(&format!("fd00:96::{n}"))
        } else {
            ip(&format!("10.96.0.{n}"))
        }
    };
    let e: Vec<SocketAddr> = eps
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|n| SocketAddr::new(mk(100 + n), 8080))
        .collect();
    SvcPort {
        name: ServicePortName {
            namespace: "default".into(),
            name: format!("s{svc}"),
            port: format!("p{port}"),
            proto: if port.is_multiple_of(2) {
                Proto::Tcp
            } else {
                Proto::Udp
            },
        },
        ipv6: v6,
        port,
        node_port: np,
        cluster_ips: vec![mk(cip)],
        externals: if ext == 2 {
            vec![(mk(200 + cip), ExternalKind::ExternalIp)]
        } else {
            vec![]
        },
        internal: if e.is_empty() {
            Target::Reject
        } else {
            Target::Pool(e.clone())
        },
        external: match (ext, e.is_empty()) {
            (_, true) => Target::Reject,
            (0, _) => Target::Drop,
            _ => Target::Pool(e[..1].to_vec()),
        },
        affinity: aff.then(|| Duration::from_secs(60)),
        internal_local: false,
        external_local: ext_local,
        health_check_node_port: None,
    }
}

/// Ports as the kernel input orders them: by Service, then port, then family.
fn arb_ports() -> impl Strategy<Value = Vec<SvcPort>> {
    let one = (
        (0u8..5, 80u16..83, any::<bool>(), 0u8..6),
        (
            prop::collection::vec(0u8..8, 0..4),
            any::<bool>(),
            prop::option::of(30000u16..30004),
            0u8..3,
            any::<bool>(),
        ),
    );
    prop::collection::vec(one, 0..10).prop_map(|v| {
        let mut out: Vec<SvcPort> = Vec::new();
        let mut seen = BTreeSet::new();
        for ((svc, port, v6, cip), (eps, aff, np, ext, el)) in v {
            if seen.insert((svc, port, v6)) {
                out.push(sp(svc, port, v6, cip, &eps, aff, np, ext, el));
            }
        }
        out.sort_by(|a, b| {
            (&a.name.name, &a.name.port, a.ipv6).cmp(&(&b.name.name, &b.name.port, b.ipv6))
        });
        out
    })
}

proptest! {
    /// Whatever the sequence of inputs, the incremental state is the whole render's, and its
    /// operations take the kernel's table (modelled) from one to the next.
    #[test]
    fn incremental_equals_whole_render(seq in prop::collection::vec(arb_ports(), 1..5)) {
        let c = cfg();
        let mut inc = Incremental::new(&c);
        let mut kernel: Option<Ruleset> = None;
        for ports in &seq {
            let want = nft::render(ports, &c);
            let u = inc.update(ports);
            prop_assert_eq!(inc.state(), &want);
            match kernel.as_mut() {
                None => {
                    prop_assert!(u.full);
                    kernel = Some(want.clone());
                }
                Some(k) => {
                    prop_assert!(!u.full);
                    prop_assert_eq!(nft::apply_ops(k, &u.ops), Ok(()));
                    prop_assert_eq!(&*k, &want);
                }
            }
        }
        // Nothing changed: nothing rendered, nothing sent.
        if let Some(last) = seq.last() {
            let u = inc.update(last);
            prop_assert!(u.ops.is_empty());
            prop_assert_eq!(u.rendered, 0);
            // Input out of order (not what the kernel input gives): still exact.
            let mut rev = last.clone();
            rev.reverse();
            let u = inc.update(&rev);
            let want = nft::render(&rev, &c);
            prop_assert_eq!(inc.state(), &want);
            if let Some(k) = kernel.as_mut() {
                prop_assert_eq!(nft::apply_ops(k, &u.ops), Ok(()));
                prop_assert_eq!(&*k, &want);
            }
        }
    }
}

/// The kernel input per Service, in key order (what the change tracker hands over).
fn by_service(ports: &[SvcPort]) -> std::collections::BTreeMap<SvcKey, Vec<SvcPort>> {
    let mut m: std::collections::BTreeMap<SvcKey, Vec<SvcPort>> = Default::default();
    for p in ports {
        m.entry((p.name.namespace.clone(), p.name.name.clone()))
            .or_default()
            .push(p.clone());
    }
    m
}

proptest! {
    /// Given only the Services that changed (and some that did not), the state is the whole
    /// render's and the operations keep the kernel's table in step.
    #[test]
    fn changed_services_equal_whole_render(seq in prop::collection::vec(arb_ports(), 1..5)) {
        let c = cfg();
        let mut inc = Incremental::new(&c);
        let mut kernel: Option<Ruleset> = None;
        let mut prev: std::collections::BTreeMap<SvcKey, Vec<SvcPort>> = Default::default();
        for ports in &seq {
            let now = by_service(ports);
            let whole: Vec<SvcPort> = now.values().flatten().cloned().collect();
            let want = nft::render(&whole, &c);
            // Changed, new and gone Services, plus every other unchanged one.
            let mut changes: Vec<(SvcKey, Vec<SvcPort>)> = Vec::new();
            for (i, (k, v)) in now.iter().enumerate() {
                if prev.get(k) != Some(v) || i % 2 == 0 {
                    changes.push((k.clone(), v.clone()));
                }
            }
            for k in prev.keys().filter(|k| !now.contains_key(*k)) {
                changes.push((k.clone(), Vec::new()));
            }
            let u = inc.update_services(changes);
            prop_assert_eq!(inc.state(), &want);
            prop_assert_eq!(inc.all_ports(), whole);
            match kernel.as_mut() {
                None => {
                    prop_assert!(u.full);
                    kernel = Some(want.clone());
                }
                Some(k) => {
                    prop_assert!(!u.full);
                    prop_assert_eq!(nft::apply_ops(k, &u.ops), Ok(()));
                    prop_assert_eq!(&*k, &want);
                }
            }
            prev = now;
        }
        // Unchanged Services handed over again: nothing rendered, nothing sent.
        let again: Vec<(SvcKey, Vec<SvcPort>)> = prev.into_iter().collect();
        let u = inc.update_services(again);
        prop_assert!(u.ops.is_empty());
        prop_assert_eq!(u.rendered, 0);
        // After a reset the next update is a full one, with or without changes.
        inc.reset();
        prop_assert!(inc.update_services(Vec::new()).full);
    }
}

#[test]
fn one_endpoint_change_renders_one_service_and_sends_elements() {
    let c = cfg();
    let mut ports: Vec<SvcPort> = (0..200u16)
        .map(|i| {
            let mut p = sp(0, 80, false, 0, &[1, 2, 3], false, None, 1, false);
            p.name.name = format!("svc-{i:04}");
            p.cluster_ips = vec![ip(&format!("10.96.{}.{}", i / 200 + 1, i % 200 + 1))];
            p
        })
        .collect();
    let mut inc = Incremental::new(&c);
    let first = inc.update(&ports);
    assert!(first.full);
    assert_eq!(first.rendered, 200);
    let ep = |n: u8| SocketAddr::new(ip(&format!("10.244.9.{n}")), 8080);
    ports[57].internal = Target::Pool(vec![ep(1), ep(2), ep(9)]);
    let u = inc.update(&ports);
    assert!(!u.full && !u.whole);
    assert_eq!(u.rendered, 1);
    assert!(
        u.ops
            .iter()
            .all(|o| matches!(o, Op::AddElements(..) | Op::DeleteElements(..))),
        "{:?}",
        u.ops
    );
    assert_eq!(inc.state(), &nft::render(&ports, &c));
    // A Service removed: its elements go, the shared chain stays (others use it).
    let gone = ports.remove(10);
    let u = inc.update(&ports);
    assert_eq!(u.rendered, 1);
    assert!(
        !u.ops
            .iter()
            .any(|o| matches!(o, Op::DeleteChain(c) if c == "cl4-3")),
        "{:?}",
        u.ops
    );
    assert_eq!(inc.state(), &nft::render(&ports, &c));
    // The last user of a chain gone: the chain goes too.
    let only: Vec<SvcPort> = vec![gone];
    let mut inc = Incremental::new(&c);
    inc.update(&only);
    let u = inc.update(&[]);
    assert!(
        u.ops
            .iter()
            .any(|o| matches!(o, Op::DeleteChain(c) if c == "cl4-3")),
        "{:?}",
        u.ops
    );
}

#[test]
fn claim_conflicts_fall_back_to_the_whole_render() {
    let c = cfg();
    // Two Services on one ClusterIP and port: the first claim wins.
    let a = sp(1, 80, false, 7, &[1], false, None, 1, false);
    let b = sp(2, 80, false, 7, &[2, 3], false, None, 1, false);
    let mut inc = Incremental::new(&c);
    inc.update(std::slice::from_ref(&a));
    let mut k = inc.state().clone();
    let both = vec![a.clone(), b.clone()];
    let u = inc.update(&both);
    assert!(u.whole);
    assert_eq!(inc.state(), &nft::render(&both, &c));
    nft::apply_ops(&mut k, &u.ops).unwrap();
    assert_eq!(&k, inc.state());
    // The winner goes: the other Service takes the address.
    let u = inc.update(std::slice::from_ref(&b));
    assert_eq!(inc.state(), &nft::render(std::slice::from_ref(&b), &c));
    nft::apply_ops(&mut k, &u.ops).unwrap();
    assert_eq!(&k, inc.state());
    // And back to incremental updates.
    let mut b2 = b.clone();
    b2.internal = Target::Pool(vec![SocketAddr::new(ip("10.96.0.104"), 8080)]);
    let u = inc.update(std::slice::from_ref(&b2));
    assert!(!u.whole);
    nft::apply_ops(&mut k, &u.ops).unwrap();
    assert_eq!(&k, &nft::render(std::slice::from_ref(&b2), &c));
}
