//! A whole-table write into a fresh namespace (structure through `nft -f`, every element in
//! one netlink batch) leaves exactly the table one `nft -f` transaction leaves: the same
//! cluster state is applied both ways in two throwaway network namespaces and the
//! canonicalised `nft -j list table` outputs are compared, before and after a change sent as
//! a difference (netlink in one, `nft -f` in the other). Needs root, `ip` and `nft`; without
//! them the test says so and passes.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry_proxy::kernel::apply::{self, NftApplier};
use ferry_proxy::kernel::incr::Incremental;
use ferry_proxy::kernel::input::{ExternalKind, SvcPort, Target};
use ferry_proxy::kernel::nft::NftConfig;
use ferry_proxy::model::{Proto, ServicePortName};
use serde_json::Value;

fn usable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    root && have("ip") && have("nft")
}

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("ferry-nlt-{tag}-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success());
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn eps(base: &str, n: usize, port: u16) -> Vec<SocketAddr> {
    (0..n)
        .map(|j| {
            let a = match ip(base) {
                IpAddr::V4(v) => {
                    let o = v.octets();
                    IpAddr::from([o[0], o[1], o[2], o[3] + j as u8])
                }
                IpAddr::V6(v) => {
                    let mut o = v.octets();
                    o[15] += j as u8;
                    IpAddr::from(o)
                }
            };
            SocketAddr::new(a, port)
        })
        .collect()
}

/// Every Service shape the renderer knows, and enough plain Services for several netlink
/// messages per map.
fn cluster() -> Vec<SvcPort> {
    let base = |i: usize, proto: Proto, ipv6: bool| SvcPort {
        name: ServicePortName {
            namespace: "ns".into(),
            name: format!("s{i:04}"),
            port: "p".into(),
            proto,
        },
        ipv6,
        port: 80,
        node_port: None,
        cluster_ips: vec![if ipv6 {
            ip(&format!("fd00:96::{:x}", i + 1))
        } else {
            ip(&format!("10.96.{}.{}", i / 200, i % 200 + 1))
        }],
        externals: vec![],
        internal: Target::Reject,
        external: Target::Reject,
        affinity: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    };
    let mut out = Vec::new();
    for i in 0..600 {
        let mut p = base(i, Proto::Tcp, false);
        p.internal = Target::Pool(eps(&format!("10.244.{}.10", i / 200), 1 + i % 5, 8080));
        out.push(p);
    }
    let mut udp = base(600, Proto::Udp, false);
    udp.port = 53;
    udp.internal = Target::Pool(eps("10.244.9.10", 2, 5353));
    out.push(udp);
    let mut sctp = base(601, Proto::Sctp, false);
    sctp.internal = Target::Pool(eps("10.244.9.20", 1, 9000));
    out.push(sctp);
    let mut v6 = base(602, Proto::Tcp, true);
    v6.internal = Target::Pool(eps("fd00:244::10", 3, 8080));
    out.push(v6);
    let mut np = base(603, Proto::Tcp, false);
    np.node_port = Some(30080);
    np.externals = vec![
        (ip("192.0.2.10"), ExternalKind::ExternalIp),
        (ip("192.0.2.20"), ExternalKind::LoadBalancer),
    ];
    np.internal = Target::Pool(eps("10.244.9.30", 2, 8080));
    np.external = Target::Pool(eps("10.244.9.30", 2, 8080));
    out.push(np);
    let mut local = base(604, Proto::Tcp, false);
    local.node_port = Some(30081);
    local.externals = vec![(ip("192.0.2.30"), ExternalKind::LoadBalancer)];
    local.external_local = true;
    local.health_check_node_port = Some(32000);
    local.internal = Target::Pool(eps("10.244.9.40", 3, 8080));
    local.external = Target::Pool(eps("10.244.9.40", 1, 8080));
    out.push(local);
    let mut drop = base(605, Proto::Tcp, false);
    drop.node_port = Some(30082);
    drop.external_local = true;
    drop.internal = Target::Pool(eps("10.244.9.50", 1, 8080));
    drop.external = Target::Drop;
    out.push(drop);
    let mut aff = base(606, Proto::Tcp, false);
    aff.affinity = Some(Duration::from_secs(600));
    aff.internal = Target::Pool(eps("10.244.9.60", 2, 8080));
    out.push(aff);
    out.push(base(607, Proto::Tcp, false)); // no endpoints: rejected
    out
}

/// `nft -j list table` without handles, with sets' elements and the top-level objects in a
/// stable order.
fn listing(ns: &Netns, table: &str) -> Vec<String> {
    fn canon(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("handle");
                for (k, x) in m.iter_mut() {
                    canon(x);
                    if k == "elem"
                        && let Value::Array(a) = x
                    {
                        a.sort_by_key(|e| e.to_string());
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(canon),
            _ => {}
        }
    }
    let out = apply::run(
        &apply::netns_prefix(Some(&ns.0)),
        &["nft", "-j", "list", "table", "inet", table],
        None,
    )
    .unwrap();
    let mut v: Value = serde_json::from_str(&out).unwrap();
    canon(&mut v);
    let mut items: Vec<String> = v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x.get("metainfo").is_none())
        .map(|x| x.to_string())
        .collect();
    items.sort();
    items
}

#[test]
fn fresh_table_over_netlink_equals_one_nft_transaction() {
    if !usable() {
        eprintln!("skipped: needs root, ip and nft");
        return;
    }
    let table = "ferry-nlt";
    let cfg = NftConfig {
        pod_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..NftConfig::default()
    };
    let (a, b) = (Netns::new("a"), Netns::new("b"));
    let mut ports = cluster();
    let mut inc = Incremental::new(&cfg);
    assert!(inc.update(&ports).full);

    let mut split = NftApplier::new(table, Some(&a.0));
    let st = split.sync(inc.state()).unwrap();
    assert!(st.full && st.netlink, "{st:?}");
    assert!(st.structure > Duration::ZERO && st.elements > Duration::ZERO);
    let mut whole = NftApplier::new(table, Some(&b.0));
    whole.use_netlink = false;
    let st = whole.sync(inc.state()).unwrap();
    assert!(st.full && !st.netlink);
    let (la, lb) = (listing(&a, table), listing(&b, table));
    assert!(la.len() > 20, "{la:?}");
    assert_eq!(la, lb);

    // A difference: endpoints of one Service change, another Service goes.
    ports[7].internal = Target::Pool(eps("10.244.8.1", 4, 8080));
    ports.remove(100);
    let u = inc.update(&ports);
    assert!(!u.full && !u.ops.is_empty());
    let st = split.sync_ops(inc.state(), &u.ops).unwrap();
    assert!(st.netlink);
    whole.sync_ops(inc.state(), &u.ops).unwrap();
    assert_eq!(listing(&a, table), listing(&b, table));

    // The table exists: a whole rewrite stays one atomic nft -f transaction.
    let mut again = NftApplier::new(table, Some(&a.0));
    let st = again.sync(inc.state()).unwrap();
    assert!(
        st.full && !st.netlink && st.structure == Duration::ZERO,
        "{st:?}"
    );
    assert_eq!(listing(&a, table), listing(&b, table));
    split.cleanup().unwrap();
    whole.cleanup().unwrap();
}
