//! The iptables mode (seed 002): upstream kube-proxy's chain layout written as
//! `iptables-restore --noflush` input, by a pure function of the kernel input.
//!
//! `KUBE-SERVICES` matches each frontend and jumps to `KUBE-SVC-<hash>` (or `KUBE-SVL-<hash>`
//! for a `Local` policy, `KUBE-EXT-<hash>` for external frontends), which picks a
//! `KUBE-SEP-<hash>` with `statistic --mode random --probability 1/n, 1/(n-1), …, 1`; each
//! `KUBE-SEP` marks hairpin traffic for masquerade and DNATs. `KUBE-NODEPORTS` holds the
//! NodePorts, `KUBE-MARK-MASQ` / `KUBE-POSTROUTING` do the masquerade, and the filter table's
//! `KUBE-SERVICES` / `KUBE-EXTERNAL-SERVICES` reject Services without endpoints.
//!
//! Chain names are upstream's: `KUBE-SVC-` + the first 16 characters of
//! base32(sha256(service port name + protocol)), and `KUBE-SEP-` the same over name + protocol +
//! endpoint. The service port name is written `namespace/name:port` (with the colon even for an
//! unnamed port) as the kube-proxy of seed 002 wrote it, so that the names are the seed's
//! (`default/hostnames:` → `KUBE-SVC-NWV5X2332I4OT4T3`). Probabilities are formatted as
//! upstream's `computeProbability` (`%0.10f`); `iptables-save` prints them back rounded to
//! the kernel's 32-bit fixed point (`0.33333333349`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use ipnet::IpNet;

use super::input::{ExternalKind, SvcPort, Target};
use super::nft::hash16;

/// Settings of the renderer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IptConfig {
    /// Pod CIDRs: ClusterIP traffic from elsewhere is masqueraded (`! -s CIDR`).
    pub pod_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
}

/// The chains kube-proxy owns in the filter table.
pub const FILTER_CHAINS: &[&str] = &[
    "KUBE-NODEPORTS",
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-FIREWALL",
];
/// The fixed chains kube-proxy owns in the nat table.
pub const NAT_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];

/// The jumps from the built-in chains into ours: (table, built-in chain, rule spec).
pub fn jump_rules() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    let new = ["-m", "conntrack", "--ctstate", "NEW"];
    let c = |s: &'static str| ["-m", "comment", "--comment", s];
    let mut v: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    let j = |chain: &'static str| ["-j", chain];
    v.push((
        "filter",
        "INPUT",
        [
            &new[..],
            &c("kubernetes externally-visible service portals"),
            &j("KUBE-EXTERNAL-SERVICES"),
        ]
        .concat(),
    ));
    v.push((
        "filter",
        "FORWARD",
        [
            &new[..],
            &c("kubernetes service portals"),
            &j("KUBE-SERVICES"),
        ]
        .concat(),
    ));
    v.push((
        "filter",
        "FORWARD",
        [
            &new[..],
            &c("kubernetes externally-visible service portals"),
            &j("KUBE-EXTERNAL-SERVICES"),
        ]
        .concat(),
    ));
    v.push((
        "filter",
        "OUTPUT",
        [
            &new[..],
            &c("kubernetes service portals"),
            &j("KUBE-SERVICES"),
        ]
        .concat(),
    ));
    v.push((
        "filter",
        "FORWARD",
        [&c("kubernetes forwarding rules")[..], &j("KUBE-FORWARD")].concat(),
    ));
    // Localhost NodePorts need route_localnet; this keeps other hosts from using it.
    v.push(("filter", "INPUT", j("KUBE-FIREWALL").to_vec()));
    v.push(("filter", "OUTPUT", j("KUBE-FIREWALL").to_vec()));
    v.push((
        "nat",
        "OUTPUT",
        [&c("kubernetes service portals")[..], &j("KUBE-SERVICES")].concat(),
    ));
    v.push((
        "nat",
        "PREROUTING",
        [&c("kubernetes service portals")[..], &j("KUBE-SERVICES")].concat(),
    ));
    v.push((
        "nat",
        "POSTROUTING",
        [
            &c("kubernetes postrouting rules")[..],
            &j("KUBE-POSTROUTING"),
        ]
        .concat(),
    ));
    v
}

/// `namespace/name:port`, as the seed's kube-proxy wrote a service port name.
pub fn port_name(sp: &SvcPort) -> String {
    format!("{}/{}:{}", sp.name.namespace, sp.name.name, sp.name.port)
}

fn proto(sp: &SvcPort) -> &'static str {
    super::nft::proto_name(sp.name.proto)
}

/// `KUBE-SVC-<hash>`.
pub fn svc_chain(sp: &SvcPort) -> String {
    format!(
        "KUBE-SVC-{}",
        hash16(&format!("{}{}", port_name(sp), proto(sp)))
    )
}
/// `KUBE-SVL-<hash>`.
pub fn svl_chain(sp: &SvcPort) -> String {
    format!(
        "KUBE-SVL-{}",
        hash16(&format!("{}{}", port_name(sp), proto(sp)))
    )
}
/// `KUBE-EXT-<hash>`.
pub fn ext_chain(sp: &SvcPort) -> String {
    format!(
        "KUBE-EXT-{}",
        hash16(&format!("{}{}", port_name(sp), proto(sp)))
    )
}
/// `KUBE-SEP-<hash>` of an endpoint `ip:port`.
pub fn sep_chain(sp: &SvcPort, ep: &std::net::SocketAddr) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&format!("{}{}{}", port_name(sp), proto(sp), ep))
    )
}

/// upstream's `computeProbability`: `%0.10f` of 1/n.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

fn quote(s: &str) -> String {
    if s.contains(' ') {
        format!("\"{s}\"")
    } else {
        s.to_string()
    }
}

/// The rendered text and the per-Service chains it declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IptRules {
    pub text: String,
    pub chains: BTreeSet<String>,
}

/// Renders the restore input for one family (`ports` of the other family are skipped).
/// Chains in `stale` that are no longer used are flushed and deleted.
pub fn render(
    ports: &[SvcPort],
    ipv6: bool,
    cfg: &IptConfig,
    stale: &BTreeSet<String>,
) -> IptRules {
    let mut filter = String::new();
    let mut nat_chains: Vec<String> = Vec::new();
    let mut nat = String::new();
    let mut declared: BTreeSet<String> = BTreeSet::new();
    let mut declare = |c: String, list: &mut Vec<String>| {
        if declared.insert(c.clone()) {
            list.push(c);
        }
    };
    let cidrs: Vec<&IpNet> = cfg
        .pod_cidrs
        .iter()
        .filter(|c| c.addr().is_ipv6() == ipv6)
        .collect();
    let mut nodeports = String::new();
    // The rules jumping to the endpoints of one chain.
    let endpoint_rules = |nat: &mut String,
                          list: &mut Vec<String>,
                          sp: &SvcPort,
                          chain: &str,
                          eps: &[std::net::SocketAddr],
                          done: &mut BTreeSet<String>| {
        let name = port_name(sp);
        if let Some(t) = sp.affinity {
            for e in eps {
                let _ = writeln!(
                    nat,
                    "-A {chain} -m comment --comment \"{name} -> {e}\" -m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}",
                    sep = sep_chain(sp, e),
                    secs = t.as_secs()
                );
            }
        }
        let n = eps.len();
        for (i, e) in eps.iter().enumerate() {
            let sep = sep_chain(sp, e);
            if i + 1 < n {
                let _ = writeln!(
                    nat,
                    "-A {chain} -m comment --comment \"{name} -> {e}\" -m statistic --mode random --probability {} -j {sep}",
                    probability(n - i)
                );
            } else {
                let _ = writeln!(
                    nat,
                    "-A {chain} -m comment --comment \"{name} -> {e}\" -j {sep}"
                );
            }
        }
        for e in eps {
            let sep = sep_chain(sp, e);
            if !done.insert(sep.clone()) {
                continue;
            }
            list.push(sep.clone());
            let _ = writeln!(
                nat,
                "-A {sep} -m comment --comment {} -s {} -j KUBE-MARK-MASQ",
                quote(&name),
                e.ip()
            );
            let recent = if sp.affinity.is_some() {
                format!(" -m recent --name {sep} --set")
            } else {
                String::new()
            };
            let _ = writeln!(
                nat,
                "-A {sep} -m comment --comment {}{recent} -m {p} -p {p} -j DNAT --to-destination {e}",
                quote(&name),
                p = proto(sp)
            );
        }
    };
    let mut seps_done: BTreeSet<String> = BTreeSet::new();
    for sp in ports.iter().filter(|s| s.ipv6 == ipv6) {
        let name = port_name(sp);
        let p = proto(sp);
        let svc = svc_chain(sp);
        let svl = svl_chain(sp);
        let ext = ext_chain(sp);
        let internal_chain = if sp.internal_local { &svl } else { &svc };
        let external_chain_pol = if sp.external_local { &svl } else { &svc };
        let has_endpoints =
            matches!(sp.internal, Target::Pool(_)) || matches!(sp.external, Target::Pool(_));
        let filter_target = |t: &Target| match t {
            Target::Drop => ("DROP", format!("\"{name} has no local endpoints\"")),
            _ => ("REJECT", format!("\"{name} has no endpoints\"")),
        };
        // Internal traffic.
        for ip in &sp.cluster_ips {
            let args = format!(
                "-m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {ip} --dport {}",
                sp.port
            );
            match &sp.internal {
                Target::Pool(_) => {
                    if cfg.masquerade_all {
                        let _ = writeln!(nat, "-A {internal_chain} {args} -j KUBE-MARK-MASQ");
                    } else if !cidrs.is_empty() {
                        for c in &cidrs {
                            let _ = writeln!(
                                nat,
                                "-A {internal_chain} {args} ! -s {c} -j KUBE-MARK-MASQ"
                            );
                        }
                    }
                    let _ = writeln!(nat, "-A KUBE-SERVICES {args} -j {internal_chain}");
                }
                t => {
                    let (target, comment) = filter_target(t);
                    let _ = writeln!(
                        filter,
                        "-A KUBE-SERVICES -m comment --comment {comment} -m {p} -p {p} -d {ip} --dport {} -j {target}",
                        sp.port
                    );
                }
            }
        }
        // External traffic.
        if sp.has_external() {
            for (ip, kind) in &sp.externals {
                let what = match kind {
                    ExternalKind::ExternalIp => "external IP",
                    ExternalKind::LoadBalancer => "loadbalancer IP",
                };
                if has_endpoints {
                    let _ = writeln!(
                        nat,
                        "-A KUBE-SERVICES -m comment --comment \"{name} {what}\" -m {p} -p {p} -d {ip} --dport {} -j {ext}",
                        sp.port
                    );
                }
                if !matches!(sp.external, Target::Pool(_)) {
                    let (target, comment) = filter_target(&sp.external);
                    let _ = writeln!(
                        filter,
                        "-A KUBE-EXTERNAL-SERVICES -m comment --comment {comment} -m {p} -p {p} -d {ip} --dport {} -j {target}",
                        sp.port
                    );
                }
            }
            if let Some(np) = sp.node_port {
                if has_endpoints {
                    let _ = writeln!(
                        nodeports,
                        "-A KUBE-NODEPORTS -m comment --comment {} -m {p} -p {p} --dport {np} -j {ext}",
                        quote(&name)
                    );
                }
                if !matches!(sp.external, Target::Pool(_)) {
                    let (target, comment) = filter_target(&sp.external);
                    let _ = writeln!(
                        filter,
                        "-A KUBE-EXTERNAL-SERVICES -m comment --comment {comment} -m addrtype --dst-type LOCAL -m {p} -p {p} --dport {np} -j {target}"
                    );
                }
            }
            if has_endpoints {
                declare(ext.clone(), &mut nat_chains);
                if !sp.external_local {
                    let _ = writeln!(
                        nat,
                        "-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"
                    );
                } else {
                    // Upstream short-circuits pod and node-local traffic to the Cluster
                    // policy chain.
                    let cluster_chain =
                        if matches!(sp.internal, Target::Pool(_)) && !sp.internal_local {
                            Some(&svc)
                        } else {
                            None
                        };
                    if let Some(cc) = cluster_chain {
                        for c in &cidrs {
                            let _ = writeln!(
                                nat,
                                "-A {ext} -m comment --comment \"pod traffic for {name} external destinations\" -s {c} -j {cc}"
                            );
                        }
                    }
                    let _ = writeln!(
                        nat,
                        "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"
                    );
                    if let Some(cc) = cluster_chain {
                        let _ = writeln!(
                            nat,
                            "-A {ext} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {cc}"
                        );
                    }
                }
                if matches!(sp.external, Target::Pool(_)) {
                    let _ = writeln!(nat, "-A {ext} -j {external_chain_pol}");
                }
            }
        }
        // Policy chains.
        let mut pools: Vec<(&String, &Vec<std::net::SocketAddr>)> = Vec::new();
        if let Target::Pool(eps) = &sp.internal {
            pools.push((internal_chain, eps));
        }
        if let Target::Pool(eps) = &sp.external
            && sp.has_external()
            && !pools.iter().any(|(c, _)| *c == external_chain_pol)
        {
            pools.push((external_chain_pol, eps));
        }
        for (chain, eps) in pools {
            declare(chain.clone(), &mut nat_chains);
            endpoint_rules(&mut nat, &mut nat_chains, sp, chain, eps, &mut seps_done);
        }
    }
    let mut out = String::new();
    out.push_str("*filter\n");
    for c in FILTER_CHAINS {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    out.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n");
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n");
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    if !ipv6 {
        // NodePorts answer on 127.0.0.1 too (upstream's localhost NodePorts, with
        // route_localnet=1): packets to 127.0.0.0/8 from elsewhere are martians again.
        out.push_str("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n");
    }
    out.push_str(&filter);
    out.push_str("COMMIT\n*nat\n");
    for c in NAT_CHAINS {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    let chains: BTreeSet<String> = nat_chains.iter().cloned().collect();
    for c in &nat_chains {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    let gone: Vec<&String> = stale.iter().filter(|c| !chains.contains(*c)).collect();
    for c in &gone {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    out.push_str(&nodeports);
    out.push_str("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n");
    out.push_str("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n");
    out.push_str("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n");
    out.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    out.push_str(&nat);
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    for c in &gone {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
    IptRules { text: out, chains }
}

/// Restore input that empties and deletes every chain of ours (the jumps into them must be
/// removed first).
pub fn render_cleanup(chains: &BTreeSet<String>) -> String {
    let mut out = String::from("*filter\n");
    for c in FILTER_CHAINS {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for c in FILTER_CHAINS {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n*nat\n");
    for c in NAT_CHAINS
        .iter()
        .map(|s| s.to_string())
        .chain(chains.iter().cloned())
    {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for c in NAT_CHAINS
        .iter()
        .map(|s| s.to_string())
        .chain(chains.iter().cloned())
    {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
    out
}

#[cfg(test)]
mod tests;
