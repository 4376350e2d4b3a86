//! Pure generation of a pod's `/etc/resolv.conf`, `/etc/hosts` and hostname, following
//! kubelet's rules (seed 000): DNS policies, `dnsConfig` merging with duplicates removed, the
//! `<ns>.svc.<zone> svc.<zone> <zone>` search list with `ndots:5`, the 32-domain / 2048-character
//! search limits, and `hostname`/`subdomain`/`setHostnameAsFQDN`.

use k8s_openapi::api::core::v1::Pod;

/// At most this many search domains (kubelet's `MaxDNSSearchPaths`).
pub const MAX_SEARCH_PATHS: usize = 32;
/// At most this many characters on the search line (kubelet's `MaxDNSSearchListChars`).
pub const MAX_SEARCH_CHARS: usize = 2048;
/// At most this many nameservers (glibc's `MAXNS`).
pub const MAX_NAMESERVERS: usize = 3;
/// A search domain longer than a DNS-1123 subdomain is dropped (glibc aborts on them).
const MAX_SEARCH_DOMAIN_LEN: usize = 253;
/// Linux limits `utsname.nodename` to 64 characters.
pub const HOSTNAME_MAX_LEN: usize = 64;

/// The resolver configuration of a pod, before rendering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses the node's resolver file (only `nameserver`, `search`/`domain` and `options`).
    pub fn parse(text: &str) -> ResolvConf {
        let mut r = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => r.nameservers.extend(words.next().map(str::to_string)),
                // The last search/domain line wins, as in glibc.
                Some("search") | Some("domain") => {
                    r.searches = words.map(|w| w.trim_end_matches('.').to_string()).collect()
                }
                Some("options") => r.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        r
    }

    /// The file content: `nameserver` lines, then `search`, then `options`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for ns in &self.nameservers {
            out.push_str("nameserver ");
            out.push_str(ns);
            out.push('\n');
        }
        if !self.searches.is_empty() {
            out.push_str("search ");
            out.push_str(&self.searches.join(" "));
            out.push('\n');
        }
        if !self.options.is_empty() {
            out.push_str("options ");
            out.push_str(&self.options.join(" "));
            out.push('\n');
        }
        out
    }
}

/// The node-wide inputs of DNS configuration.
#[derive(Debug, Clone, Default)]
pub struct ClusterDns {
    /// `--cluster-dns`: the cluster DNS server addresses. Empty: ClusterFirst falls back to Default.
    pub servers: Vec<String>,
    /// `--cluster-domain`, e.g. `cluster.local`.
    pub domain: String,
    /// The node's own resolver configuration (used by `Default` and appended searches).
    pub host: ResolvConf,
}

/// A resolv.conf and the warnings kubelet would record as `DNSConfigForming` events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsOutcome {
    pub conf: ResolvConf,
    pub warnings: Vec<String>,
}

fn omit_duplicates(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// Options merge by name; a pod option replaces the node's value, order is first appearance.
fn merge_options(existing: &[String], pod: &[(String, Option<String>)]) -> Vec<String> {
    let mut map: Vec<(String, Option<String>)> = Vec::new();
    let mut put = |name: &str, value: Option<String>| {
        if let Some(e) = map.iter_mut().find(|(n, _)| n == name) {
            e.1 = value;
        } else {
            map.push((name.to_string(), value));
        }
    };
    for o in existing {
        match o.split_once(':') {
            Some((n, v)) => put(n, Some(v.to_string())),
            None => put(o, None),
        }
    }
    for (n, v) in pod {
        put(n, v.clone());
    }
    map.into_iter()
        .map(|(n, v)| match v {
            Some(v) if !v.is_empty() => format!("{n}:{v}"),
            _ => n,
        })
        .collect()
}

/// Applies the search-line limits; returns whether anything was cut.
fn fit_search_limits(search: Vec<String>) -> (Vec<String>, bool) {
    let mut exceeded = false;
    let mut s = search;
    if s.len() > MAX_SEARCH_PATHS {
        s.truncate(MAX_SEARCH_PATHS);
        exceeded = true;
    }
    let before = s.len();
    s.retain(|d| d.len() <= MAX_SEARCH_DOMAIN_LEN);
    exceeded |= s.len() != before;
    let line_len =
        |s: &[String]| s.iter().map(String::len).sum::<usize>() + s.len().saturating_sub(1);
    if line_len(&s) > MAX_SEARCH_CHARS {
        while line_len(&s) > MAX_SEARCH_CHARS {
            s.pop();
        }
        exceeded = true;
    }
    (s, exceeded)
}

/// The resolv.conf kubelet would give `pod` (seed 000).
pub fn resolv_conf(pod: &Pod, cluster: &ClusterDns) -> DnsOutcome {
    let spec = pod.spec.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let host_network = spec.host_network.unwrap_or(false);
    let mut warnings = Vec::new();
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    // Which policy really applies.
    let effective = match policy {
        "ClusterFirstWithHostNet" => "ClusterFirst",
        "ClusterFirst" if host_network => "Default",
        "None" => "None",
        "Default" => "Default",
        _ => "ClusterFirst",
    };
    let effective = if effective == "ClusterFirst" && cluster.servers.is_empty() {
        warnings.push(
            "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."
                .to_string(),
        );
        "Default"
    } else {
        effective
    };
    let mut conf = match effective {
        "None" => ResolvConf::default(),
        "Default" => cluster.host.clone(),
        _ => {
            let d = &cluster.domain;
            let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
            searches.extend(cluster.host.searches.iter().cloned());
            ResolvConf {
                nameservers: cluster.servers.clone(),
                searches: omit_duplicates(searches),
                options: vec!["ndots:5".to_string()],
            }
        }
    };
    if let Some(dc) = &spec.dns_config {
        let mut ns_all = conf.nameservers.clone();
        ns_all.extend(dc.nameservers.clone().unwrap_or_default());
        conf.nameservers = omit_duplicates(ns_all);
        let mut s = dc.searches.clone().unwrap_or_default();
        s.extend(conf.searches.iter().cloned());
        conf.searches = omit_duplicates(s);
        let pod_opts: Vec<(String, Option<String>)> = dc
            .options
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|o| o.name.map(|n| (n, o.value)))
            .collect();
        conf.options = merge_options(&conf.options, &pod_opts);
    }
    if conf.nameservers.len() > MAX_NAMESERVERS {
        conf.nameservers.truncate(MAX_NAMESERVERS);
        warnings.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
            conf.nameservers.join(" ")
        ));
    }
    let (s, exceeded) = fit_search_limits(std::mem::take(&mut conf.searches));
    conf.searches = s;
    if exceeded {
        warnings.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
            conf.searches.join(" ")
        ));
    }
    DnsOutcome { conf, warnings }
}

/// The hostname a pod sees, and its domain (`<subdomain>.<ns>.svc.<zone>`), as kubelet's
/// `GeneratePodHostNameAndDomain`.
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let hostname = match spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
    {
        Some(h) => h.to_string(),
        None => truncate_hostname(pod.metadata.name.as_deref().unwrap_or("")),
    };
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| format!("{sub}.{ns}.svc.{cluster_domain}"));
    (hostname, domain)
}

/// Pod names may be longer than a hostname: cut to 63 and drop trailing `-`/`.`.
fn truncate_hostname(name: &str) -> String {
    const MAX: usize = 63;
    if name.len() <= MAX {
        return name.to_string();
    }
    name[..MAX].trim_end_matches(['-', '.']).to_string()
}

/// A pod with `setHostnameAsFQDN` whose FQDN is longer than a hostname may be (kubelet's
/// message; the pod stays pending).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({HOSTNAME_MAX_LEN} characters is the max, {len} characters requested)",
    len = .fqdn.len()
)]
pub struct FqdnTooLong {
    pub fqdn: String,
}

/// The hostname to set in the pod's UTS namespace: the FQDN with `setHostnameAsFQDN`, which
/// fails (the pod stays pending) above 64 characters.
pub fn pod_hostname(pod: &Pod, cluster_domain: &str) -> Result<String, FqdnTooLong> {
    let (host, domain) = hostname_and_domain(pod, cluster_domain);
    let as_fqdn = pod
        .spec
        .as_ref()
        .and_then(|s| s.set_hostname_as_fqdn)
        .unwrap_or(false);
    match (as_fqdn, domain) {
        (true, Some(d)) => {
            let fqdn = format!("{host}.{d}");
            if fqdn.len() > HOSTNAME_MAX_LEN {
                return Err(FqdnTooLong { fqdn });
            }
            Ok(fqdn)
        }
        _ => Ok(host),
    }
}

/// The kubelet-managed `/etc/hosts` of a pod (not host-network): localhost entries, the pod's
/// own addresses with its FQDN, then `hostAliases`.
pub fn etc_hosts(pod: &Pod, pod_ips: &[String], cluster_domain: &str) -> String {
    let mut out = String::from("# Kubernetes-managed hosts file.\n");
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    let (host, domain) = hostname_and_domain(pod, cluster_domain);
    for ip in pod_ips {
        match &domain {
            Some(d) => out.push_str(&format!("{ip}\t{host}.{d}\t{host}\n")),
            None => out.push_str(&format!("{ip}\t{host}\n")),
        }
    }
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default();
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.unwrap_or_default();
            out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
        }
    }
    out
}

/// `/etc/hosts` of a host-network pod: the node's file under kubelet's header.
pub fn etc_hosts_host_network(host_file: &str) -> String {
    format!("# Kubernetes-managed hosts file (host network).\n{host_file}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostAlias, PodDNSConfig, PodDNSConfigOption, PodSpec};

    fn pod(ns: &str, name: &str, f: impl FnOnce(&mut PodSpec)) -> Pod {
        let mut spec = PodSpec::default();
        f(&mut spec);
        let mut p = Pod {
            spec: Some(spec),
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(ns.into());
        p
    }

    fn cluster() -> ClusterDns {
        ClusterDns {
            servers: vec!["10.32.0.10".into()],
            domain: "cluster.local".into(),
            host: ResolvConf {
                nameservers: vec!["192.168.1.1".into()],
                searches: vec!["corp.example".into()],
                options: vec!["timeout:2".into()],
            },
        }
    }

    fn cfg(ns: &[&str], s: &[&str], opts: &[(&str, Option<&str>)]) -> Option<PodDNSConfig> {
        Some(PodDNSConfig {
            nameservers: Some(ns.iter().map(|s| s.to_string()).collect()),
            searches: Some(s.iter().map(|s| s.to_string()).collect()),
            options: Some(
                opts.iter()
                    .map(|(n, v)| PodDNSConfigOption {
                        name: Some(n.to_string()),
                        value: v.map(str::to_string),
                    })
                    .collect(),
            ),
        })
    }

    #[test]
    fn resolv_conf_table() {
        let cases: Vec<(&str, Pod, &str)> = vec![
            (
                "ClusterFirst default (seed format)",
                pod("test", "p", |_| {}),
                "nameserver 10.32.0.10\nsearch test.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n",
            ),
            (
                "ClusterFirst with hostNetwork acts as Default",
                pod("test", "p", |s| s.host_network = Some(true)),
                "nameserver 192.168.1.1\nsearch corp.example\noptions timeout:2\n",
            ),
            (
                "ClusterFirstWithHostNet",
                pod("test", "p", |s| {
                    s.host_network = Some(true);
                    s.dns_policy = Some("ClusterFirstWithHostNet".into());
                }),
                "nameserver 10.32.0.10\nsearch test.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n",
            ),
            (
                "Default",
                pod("test", "p", |s| s.dns_policy = Some("Default".into())),
                "nameserver 192.168.1.1\nsearch corp.example\noptions timeout:2\n",
            ),
            (
                "None with dnsConfig (seed example)",
                pod("ns1", "dns-example", |s| {
                    s.dns_policy = Some("None".into());
                    s.dns_config = cfg(
                        &["1.2.3.4"],
                        &["ns1.svc.cluster-domain.example", "my.dns.search.suffix"],
                        &[("ndots", Some("2")), ("edns0", None)],
                    );
                }),
                "nameserver 1.2.3.4\nsearch ns1.svc.cluster-domain.example my.dns.search.suffix\noptions ndots:2 edns0\n",
            ),
            (
                "ClusterFirst merged with dnsConfig, duplicates removed, pod searches first",
                pod("a", "p", |s| {
                    s.dns_config = cfg(
                        &["10.32.0.10", "1.1.1.1"],
                        &["svc.cluster.local", "x.example"],
                        &[("ndots", Some("1")), ("rotate", None)],
                    );
                }),
                "nameserver 10.32.0.10\nnameserver 1.1.1.1\nsearch svc.cluster.local x.example a.svc.cluster.local cluster.local corp.example\noptions ndots:1 rotate\n",
            ),
        ];
        for (name, p, want) in cases {
            let got = resolv_conf(&p, &cluster());
            assert_eq!(got.conf.render(), want, "{name}");
            assert!(got.warnings.is_empty(), "{name}: {:?}", got.warnings);
        }
    }

    #[test]
    fn no_cluster_dns_falls_back_to_default() {
        let mut c = cluster();
        c.servers.clear();
        let got = resolv_conf(&pod("a", "p", |_| {}), &c);
        assert_eq!(got.conf, c.host);
        assert_eq!(got.warnings.len(), 1);
    }

    #[test]
    fn limits() {
        // 40 search domains: cut to 32.
        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let p = pod("a", "p", |s| {
            s.dns_policy = Some("None".into());
            s.dns_config = cfg(&["1.2.3.4"], &refs, &[]);
        });
        let got = resolv_conf(&p, &cluster());
        assert_eq!(got.conf.searches.len(), MAX_SEARCH_PATHS);
        assert_eq!(got.conf.searches[31], "d31.example");
        assert!(got.warnings[0].starts_with("Search Line limits were exceeded"));
        // Long domains: the line is cut to 2048 characters.
        let long: Vec<String> = (0..20).map(|i| format!("{i:0>200}")).collect();
        let refs: Vec<&str> = long.iter().map(String::as_str).collect();
        let p = pod("a", "p", |s| {
            s.dns_policy = Some("None".into());
            s.dns_config = cfg(&["1.2.3.4"], &refs, &[]);
        });
        let got = resolv_conf(&p, &cluster());
        let line = got.conf.searches.join(" ");
        assert!(line.len() <= MAX_SEARCH_CHARS);
        assert_eq!(got.conf.searches.len(), 10); // 10*200+9 = 2009
        // Four nameservers: three kept.
        let p = pod("a", "p", |s| {
            s.dns_policy = Some("None".into());
            s.dns_config = cfg(&["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"], &[], &[]);
        });
        let got = resolv_conf(&p, &cluster());
        assert_eq!(got.conf.nameservers.len(), 3);
        assert!(got.warnings[0].starts_with("Nameserver limits were exceeded"));
    }

    #[test]
    fn parse_host_resolv_conf() {
        let r = ResolvConf::parse(
            "# comment\nnameserver 1.1.1.1\nnameserver 8.8.8.8 # x\ndomain a.example\nsearch b.example. c.example\noptions ndots:1 edns0\n",
        );
        assert_eq!(r.nameservers, vec!["1.1.1.1", "8.8.8.8"]);
        assert_eq!(r.searches, vec!["b.example", "c.example"]);
        assert_eq!(r.options, vec!["ndots:1", "edns0"]);
    }

    #[test]
    fn hostnames() {
        let cases: Vec<(Pod, Result<&str, ()>)> = vec![
            (pod("ns", "web-0", |_| {}), Ok("web-0")),
            (
                pod("ns", "p", |s| {
                    s.hostname = Some("busybox-1".into());
                    s.subdomain = Some("busybox-subdomain".into());
                }),
                Ok("busybox-1"),
            ),
            (
                pod("my-namespace", "p", |s| {
                    s.hostname = Some("busybox-1".into());
                    s.subdomain = Some("sub".into());
                    s.set_hostname_as_fqdn = Some(true);
                }),
                Ok("busybox-1.sub.my-namespace.svc.cluster.local"),
            ),
            (
                pod("my-namespace", "p", |s| {
                    s.hostname = Some("a-rather-long-hostname-for-a-pod".into());
                    s.subdomain = Some("busybox-subdomain".into());
                    s.set_hostname_as_fqdn = Some(true);
                }),
                Err(()),
            ),
            (
                pod("ns", &format!("{}-{}", "a".repeat(62), "bcd"), |_| {}),
                Ok("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            ),
        ];
        for (p, want) in cases {
            let got = pod_hostname(&p, "cluster.local");
            match want {
                Ok(w) => assert_eq!(got.as_deref().ok(), Some(w)),
                Err(()) => {
                    let e = got.expect_err("too long").to_string();
                    assert!(
                        e.contains(
                            "is too long (64 characters is the max, 81 characters requested)"
                        ),
                        "{e}"
                    );
                }
            }
        }
    }

    #[test]
    fn hosts_file() {
        let p = pod("ns", "busybox1", |s| {
            s.hostname = Some("busybox-1".into());
            s.subdomain = Some("sub".into());
            s.host_aliases = Some(vec![HostAlias {
                ip: "10.1.2.3".into(),
                hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
            }]);
        });
        let h = etc_hosts(&p, &["127.100.0.2".into()], "cluster.local");
        assert!(h.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(h.contains("127.100.0.2\tbusybox-1.sub.ns.svc.cluster.local\tbusybox-1\n"));
        assert!(h.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"));
        let plain = etc_hosts(&pod("ns", "web", |_| {}), &["127.100.0.3".into()], "c");
        assert!(plain.ends_with("127.100.0.3\tweb\n"));
    }
}
