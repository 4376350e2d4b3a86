//! The userspace proxy's portals (seed 004's userspace mode, upstream's `KUBE-PORTALS-*`
//! chains): the proxy does not bind Service addresses; it opens a port of its own for each
//! frontend and the kernel sends the frontend's traffic there. Traffic arriving at the node
//! (from pods, from outside) is redirected (`redirect to :PORT`, the address of the interface
//! it came in on); traffic the node sends itself is DNATed to the node's address and that
//! port, as upstream's host portals did (a redirect to the loopback address would leave
//! replies from the proxy's wildcard socket with the wrong source). NodePorts stay bound on
//! the node addresses as before.
//!
//! Everything lives in Ferry's own `inet` table: two maps per family keyed by `daddr .
//! l4proto . dport` (the port; the node address and port) and two NAT chains. [`plan`] is
//! pure: it maps the service table onto the proxy's ports (stable for a frontend's life) and
//! gives the map elements; [`script`] writes the difference from the previous elements as
//! one `nft -f` transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::Proto;
use crate::table::{Frontend, Table};

/// The maps' content: frontend → the proxy's port, and the node address DNATed to for the
/// node's own traffic (`None`: no node address of that family, only the redirect).
pub type Elements = BTreeMap<Frontend, (u16, Option<IpAddr>)>;

/// Ports given to frontends, kept while the frontend exists.
#[derive(Debug, Default, Clone)]
pub struct Ports {
    by_frontend: BTreeMap<Frontend, u16>,
}

/// Is `f` served through a portal (not a NodePort on a node address)?
fn is_portal(f: &Frontend, node_ips: &[IpAddr]) -> bool {
    !f.ip.is_unspecified() && !node_ips.contains(&f.ip) && f.proto != Proto::Sctp
}

/// The table the userspace data path serves (portal frontends moved to the proxy's ports on
/// the unspecified address of their family) and the portal map elements. `alloc` gives a
/// free port for a protocol and family (`true`: IPv6); ports of frontends gone are released.
/// Pure apart from `alloc`.
pub fn plan(
    ports: &mut Ports,
    table: &Table,
    node_ips: &[IpAddr],
    mut alloc: impl FnMut(Proto, bool) -> std::io::Result<u16>,
) -> (Table, Elements) {
    ports
        .by_frontend
        .retain(|f, _| table.frontends.contains_key(f) && is_portal(f, node_ips));
    let mut used: BTreeSet<u16> = ports.by_frontend.values().copied().collect();
    let mut out = Table {
        pools: table.pools.clone(),
        frontends: BTreeMap::new(),
    };
    let mut els = Elements::new();
    for (f, key) in &table.frontends {
        if !is_portal(f, node_ips) {
            out.frontends.insert(*f, key.clone());
            continue;
        }
        let port = match ports.by_frontend.get(f) {
            Some(p) => *p,
            None => {
                // A port no other frontend holds (whatever the family: an IPv6 wildcard
                // socket may take the IPv4 port too).
                let mut got = None;
                for _ in 0..16 {
                    match alloc(f.proto, f.ip.is_ipv6()) {
                        Ok(p) if p != 0 && !used.contains(&p) => {
                            got = Some(p);
                            break;
                        }
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(frontend = %f, "no port for the portal: {e}");
                            break;
                        }
                    }
                }
                let Some(p) = got else { continue };
                used.insert(p);
                ports.by_frontend.insert(*f, p);
                p
            }
        };
        let any = if f.ip.is_ipv6() {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        out.frontends.insert(
            Frontend {
                ip: any,
                port,
                proto: f.proto,
            },
            key.clone(),
        );
        let host = node_ips
            .iter()
            .find(|i| i.is_ipv6() == f.ip.is_ipv6() && !i.is_unspecified())
            .copied();
        els.insert(*f, (port, host));
    }
    (out, els)
}

/// A free port for `proto` (and family) from the kernel: bound once on the wildcard address
/// and released (upstream's userspace proxier did the same).
pub fn free_port(proto: Proto, ipv6: bool) -> std::io::Result<u16> {
    let any: IpAddr = if ipv6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let addr = std::net::SocketAddr::new(any, 0);
    Ok(match proto {
        Proto::Udp => std::net::UdpSocket::bind(addr)?.local_addr()?.port(),
        _ => std::net::TcpListener::bind(addr)?.local_addr()?.port(),
    })
}

/// The maps' family suffix.
fn fam(ip: &IpAddr) -> char {
    if ip.is_ipv6() { '6' } else { '4' }
}

fn proto(p: Proto) -> &'static str {
    super::nft::proto_name(p)
}

/// The table with its maps and chains, empty (written once, replacing any earlier one).
pub fn skeleton(table: &str) -> String {
    let mut s =
        format!("add table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n");
    for (ip, addr, n) in [("ip", "ipv4_addr", 4), ("ip6", "ipv6_addr", 6)] {
        let _ = writeln!(
            s,
            "  map portals{n} {{ type {addr} . inet_proto . inet_service : inet_service; }}"
        );
        let _ = writeln!(
            s,
            "  map host-portals{n} {{ typeof {ip} daddr . meta l4proto . th dport : {ip} daddr . th dport; }}"
        );
    }
    s.push_str(
        "  chain portals-container {\n    type nat hook prerouting priority -100; policy accept;\n",
    );
    for (ip, n) in [("ip", 4), ("ip6", 6)] {
        let _ = writeln!(
            s,
            "    meta l4proto {{ tcp, udp }} redirect to :{ip} daddr . meta l4proto . th dport map @portals{n}"
        );
    }
    s.push_str(
        "  }\n  chain portals-host {\n    type nat hook output priority -100; policy accept;\n",
    );
    for (ip, n) in [("ip", 4), ("ip6", 6)] {
        let _ = writeln!(
            s,
            "    meta l4proto {{ tcp, udp }} dnat {ip} to {ip} daddr . meta l4proto . th dport map @host-portals{n}"
        );
    }
    s.push_str("  }\n}\n");
    s
}

/// The `nft -f` script taking the maps from `old` to `new` (one transaction; empty when
/// nothing changed). Pure.
pub fn script(table: &str, old: &Elements, new: &Elements) -> String {
    let mut s = String::new();
    let key = |f: &Frontend| format!("{} . {} . {}", f.ip, proto(f.proto), f.port);
    for (f, v) in old {
        if new.get(f) == Some(v) {
            continue;
        }
        let n = fam(&f.ip);
        let _ = writeln!(s, "delete element inet {table} portals{n} {{ {} }}", key(f));
        if v.1.is_some() {
            let _ = writeln!(
                s,
                "delete element inet {table} host-portals{n} {{ {} }}",
                key(f)
            );
        }
    }
    for (f, v) in new {
        if old.get(f) == Some(v) {
            continue;
        }
        let n = fam(&f.ip);
        let _ = writeln!(
            s,
            "add element inet {table} portals{n} {{ {} : {} }}",
            key(f),
            v.0
        );
        if let Some(h) = v.1 {
            let _ = writeln!(
                s,
                "add element inet {table} host-portals{n} {{ {} : {h} . {} }}",
                key(f),
                v.0
            );
        }
    }
    s
}

/// Where the portals go: Ferry's table, in the node's namespace (`ip netns` name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalsConfig {
    pub table: String,
    pub netns: Option<String>,
}

/// Keeps the portals in step with the userspace data path; removes the table when dropped.
pub struct Portals {
    cfg: PortalsConfig,
    ports: Ports,
    /// The elements the kernel holds (`None`: the table is to be written whole).
    applied: Option<Elements>,
}

impl Portals {
    pub fn new(cfg: PortalsConfig) -> Portals {
        Portals {
            cfg,
            ports: Ports::default(),
            applied: None,
        }
    }

    /// Opens the proxy's ports for `table` (through `dp`), then points the portals at them.
    pub async fn apply(
        &mut self,
        dp: &mut crate::dataplane::Dataplane,
        table: &Table,
        node_ips: &[IpAddr],
    ) -> crate::dataplane::ApplyReport {
        let (served, els) = plan(&mut self.ports, table, node_ips, free_port);
        let report = dp.apply(&served);
        let (mut text, old) = match self.applied.take() {
            Some(old) => (String::new(), old),
            None => (skeleton(&self.cfg.table), Elements::new()),
        };
        text.push_str(&script(&self.cfg.table, &old, &els));
        if text.is_empty() {
            self.applied = Some(old);
            return report;
        }
        let prefix = super::apply::netns_prefix(self.cfg.netns.as_deref());
        let r = tokio::task::spawn_blocking(move || {
            super::apply::run(&prefix, &["nft", "-f", "-"], Some(&text))
        })
        .await;
        match r {
            Ok(Ok(_)) => self.applied = Some(els),
            Ok(Err(e)) => tracing::warn!("userspace proxy portals: {e}"),
            Err(e) => tracing::warn!("userspace proxy portals: {e}"),
        }
        report
    }
}

impl Drop for Portals {
    fn drop(&mut self) {
        let prefix = super::apply::netns_prefix(self.cfg.netns.as_deref());
        if let Err(e) = super::apply::run(
            &prefix,
            &["nft", "-f", "-"],
            Some(&super::nft::render_cleanup(&self.cfg.table)),
        ) {
            tracing::warn!("removing the userspace proxy portals: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::ServicePortName;
    use crate::sched::Scheduler;
    use crate::table::{Pool, PoolKey, Reach};

    fn key(name: &str, reach: Reach, ipv6: bool) -> PoolKey {
        PoolKey {
            port: ServicePortName {
                namespace: "ns".into(),
                name: name.into(),
                port: "p".into(),
                proto: Proto::Tcp,
            },
            reach,
            ipv6,
        }
    }

    fn fe(ip: &str, port: u16, proto: Proto) -> Frontend {
        Frontend {
            ip: ip.parse().unwrap(),
            port,
            proto,
        }
    }

    fn table() -> Table {
        let mut t = Table::default();
        for (k, f) in [
            (
                key("a", Reach::Internal, false),
                fe("10.96.0.1", 80, Proto::Tcp),
            ),
            (
                key("a", Reach::External, false),
                fe("192.168.1.5", 30080, Proto::Tcp),
            ),
            (
                key("a", Reach::External, false),
                fe("192.0.2.9", 80, Proto::Tcp),
            ),
            (
                key("b", Reach::Internal, false),
                fe("10.96.0.2", 53, Proto::Udp),
            ),
            (
                key("b", Reach::Internal, true),
                fe("fd00::2", 53, Proto::Udp),
            ),
        ] {
            t.pools.insert(
                k.clone(),
                Pool {
                    endpoints: vec!["10.244.0.2:8080".parse().unwrap()],
                    scheduler: Scheduler::Random,
                    affinity: None,
                    proxy_protocol: None,
                },
            );
            t.frontends.insert(f, k);
        }
        t
    }

    #[test]
    fn portals_get_stable_ports_and_node_ports_stay_bound() {
        let node_ips: Vec<IpAddr> = vec!["192.168.1.5".parse().unwrap()];
        let mut ports = Ports::default();
        let mut next = 40000u16;
        let mut alloc = |_: Proto, _: bool| {
            next += 1;
            // The kernel may hand back a port another portal holds: skipped.
            Ok(if next == 40002 { 40001 } else { next })
        };
        let t = table();
        let (dp, els) = plan(&mut ports, &t, &node_ips, &mut alloc);
        // The NodePort on the node address as it was; four portals on wildcard addresses.
        assert!(
            dp.frontends
                .contains_key(&fe("192.168.1.5", 30080, Proto::Tcp))
        );
        assert_eq!(els.len(), 4);
        let vip = els[&fe("10.96.0.1", 80, Proto::Tcp)];
        assert_eq!(vip, (40001, Some("192.168.1.5".parse().unwrap())));
        assert!(dp.frontends.contains_key(&fe("0.0.0.0", 40001, Proto::Tcp)));
        let v6 = els[&fe("fd00::2", 53, Proto::Udp)];
        assert_eq!(v6.1, None, "no IPv6 node address: redirect only");
        assert!(dp.frontends.contains_key(&fe("::", v6.0, Proto::Udp)));
        let distinct: BTreeSet<u16> = els.values().map(|v| v.0).collect();
        assert_eq!(distinct.len(), 4);
        // Again: the same ports, no allocation, nothing to write.
        let (dp2, els2) = plan(&mut ports, &t, &node_ips, |_, _| {
            panic!("no allocation for known frontends")
        });
        assert_eq!((dp2, &els2), (dp, &els));
        assert_eq!(script("ferry", &els, &els2), "");
        // A frontend gone: its port is released and its elements deleted.
        let mut t3 = t.clone();
        t3.frontends.remove(&fe("10.96.0.2", 53, Proto::Udp));
        let (_, els3) = plan(&mut ports, &t3, &node_ips, |_, _| Ok(50000));
        assert_eq!(els3.len(), 3);
        let s = script("ferry", &els2, &els3);
        assert_eq!(
            s,
            format!(
                "delete element inet ferry portals4 {{ 10.96.0.2 . udp . 53 }}\n\
                 delete element inet ferry host-portals4 {{ 10.96.0.2 . udp . 53 }}\n"
            )
        );
        let s = script("ferry", &Elements::new(), &els3);
        assert!(s.contains(
            "add element inet ferry host-portals4 { 10.96.0.1 . tcp . 80 : 192.168.1.5 . 40001 }"
        ));
        assert!(s.contains("add element inet ferry portals6 { fd00::2 . udp . 53 : "));
        assert!(!s.contains("host-portals6"));
    }

    #[test]
    fn skeleton_has_both_hooks_and_families() {
        let s = skeleton("ferry");
        assert!(s.starts_with("add table inet ferry\ndelete table inet ferry\n"));
        assert!(s.contains("type nat hook prerouting priority -100"));
        assert!(s.contains("redirect to :ip6 daddr . meta l4proto . th dport map @portals6"));
        assert!(s.contains("dnat ip to ip daddr . meta l4proto . th dport map @host-portals4"));
    }
}
