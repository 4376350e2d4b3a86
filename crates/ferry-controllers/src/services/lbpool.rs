//! The built-in load-balancer IP pool (no IO), as MetalLB or k3s ServiceLB do it: every
//! `LoadBalancer` Service of our class (or without a class) gets one address per IP family it
//! uses from `--loadbalancer-ip-range`; `spec.loadBalancerIP` is honoured when it is in the pool
//! and free; addresses already in a Service's status are kept.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

/// Our `loadBalancerClass`; Services without a class are ours too.
pub const DEFAULT_CLASS: &str = "ferry.dev/loadbalancer";

fn to_u128(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

fn from_u128(v6: bool, v: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(v.into())
    } else {
        IpAddr::V4((v as u32).into())
    }
}

/// Address ranges: `a.b.c.d-e.f.g.h`, CIDRs, or single addresses, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    ranges: Vec<(bool, u128, u128)>,
}

/// A load-balancer range that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid load-balancer range {0:?}")]
pub struct PoolError(pub String);

impl std::str::FromStr for Pool {
    type Err = PoolError;
    fn from_str(s: &str) -> Result<Pool, PoolError> {
        let mut ranges = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let err = || PoolError(part.to_string());
            if let Some((a, b)) = part.split_once('-') {
                let a: IpAddr = a.trim().parse().map_err(|_| err())?;
                let b: IpAddr = b.trim().parse().map_err(|_| err())?;
                if a.is_ipv6() != b.is_ipv6() || to_u128(&b) < to_u128(&a) {
                    return Err(err());
                }
                ranges.push((a.is_ipv6(), to_u128(&a), to_u128(&b)));
            } else if let Some((a, len)) = part.split_once('/') {
                let a: IpAddr = a.parse().map_err(|_| err())?;
                let len: u32 = len.parse().map_err(|_| err())?;
                let bits = if a.is_ipv6() { 128 } else { 32 };
                if len > bits {
                    return Err(err());
                }
                let host = bits - len;
                let size = if host >= 128 {
                    u128::MAX
                } else {
                    (1u128 << host) - 1
                };
                let start = to_u128(&a) & !size;
                ranges.push((a.is_ipv6(), start, start.saturating_add(size)));
            } else {
                let a: IpAddr = part.parse().map_err(|_| err())?;
                ranges.push((a.is_ipv6(), to_u128(&a), to_u128(&a)));
            }
        }
        Ok(Pool { ranges })
    }
}

impl Pool {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    pub fn contains(&self, ip: &IpAddr) -> bool {
        let v = to_u128(ip);
        self.ranges
            .iter()
            .any(|(v6, a, b)| *v6 == ip.is_ipv6() && v >= *a && v <= *b)
    }
    /// The first free address of a family.
    pub fn first_free(&self, v6: bool, used: &HashSet<IpAddr>) -> Option<IpAddr> {
        for (f, a, b) in &self.ranges {
            if *f != v6 {
                continue;
            }
            let mut v = *a;
            let mut steps = 0usize;
            loop {
                let ip = from_u128(v6, v);
                if !used.contains(&ip) {
                    return Some(ip);
                }
                steps += 1;
                if v == *b || steps > used.len() + 1 {
                    break;
                }
                v += 1;
            }
        }
        None
    }
}

/// Whether the Service is a LoadBalancer this controller serves.
pub fn is_ours(svc: &Service, class: &str) -> bool {
    let Some(spec) = svc.spec.as_ref() else {
        return false;
    };
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec
            .load_balancer_class
            .as_deref()
            .is_none_or(|c| c == class)
}

/// Current ingress IPs in the Service's status.
pub fn current_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default()
}

/// The outcome for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    Ips(Vec<String>),
    /// The requested `loadBalancerIP` cannot be used (outside the pool or taken).
    Unavailable(String),
    /// The pool has no free address.
    Exhausted,
}

/// Assigns addresses to the Services of our class (`services` keyed by namespace/name).
/// Services that already hold addresses keep them; then Services asking for a `loadBalancerIP`;
/// the rest are served in key order.
pub fn assign(
    pool: &Pool,
    services: &BTreeMap<String, &Service>,
    class: &str,
) -> BTreeMap<String, Assignment> {
    let mut used: HashSet<IpAddr> = HashSet::new();
    let mut out = BTreeMap::new();
    let ours: Vec<(&String, &&Service)> =
        services.iter().filter(|(_, s)| is_ours(s, class)).collect();
    // Keep valid existing assignments first, so a newcomer never takes them.
    let mut kept: BTreeMap<&String, Vec<IpAddr>> = BTreeMap::new();
    for (k, s) in &ours {
        let fams = families(s);
        let requested = requested_ip(s);
        let mut keep = Vec::new();
        for ip in current_ips(s) {
            let Ok(ip) = ip.parse::<IpAddr>() else {
                continue;
            };
            let fam_ok = fams.contains(&ip.is_ipv6());
            let req_ok = requested.is_none_or(|r| r == ip || r.is_ipv6() != ip.is_ipv6());
            if pool.contains(&ip)
                && fam_ok
                && req_ok
                && !used.contains(&ip)
                && !keep.iter().any(|k: &IpAddr| k.is_ipv6() == ip.is_ipv6())
            {
                used.insert(ip);
                keep.push(ip);
            }
        }
        kept.insert(k, keep);
    }
    // Requested addresses are served before dynamic ones.
    let mut order = ours;
    order.sort_by_key(|(_, s)| requested_ip(s).is_none());
    for (k, s) in order {
        let mut ips = kept.remove(k).unwrap_or_default();
        let requested = requested_ip(s);
        let mut result = None;
        for v6 in families(s) {
            if ips.iter().any(|i| i.is_ipv6() == v6) {
                continue;
            }
            if let Some(r) = requested.filter(|r| r.is_ipv6() == v6) {
                if pool.contains(&r) && !used.contains(&r) {
                    used.insert(r);
                    ips.push(r);
                } else {
                    result = Some(Assignment::Unavailable(r.to_string()));
                }
                continue;
            }
            match pool.first_free(v6, &used) {
                Some(ip) => {
                    used.insert(ip);
                    ips.push(ip);
                }
                None => {
                    if result.is_none() {
                        result = Some(Assignment::Exhausted);
                    }
                }
            }
        }
        let res = match result {
            Some(r) if ips.is_empty() => r,
            _ => Assignment::Ips(ips.iter().map(ToString::to_string).collect()),
        };
        out.insert(k.clone(), res);
    }
    out
}

fn requested_ip(s: &Service) -> Option<IpAddr> {
    s.spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
}

/// IP families (true = IPv6) the Service uses, in order.
fn families(s: &Service) -> Vec<bool> {
    let f: Vec<bool> = s
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default()
        .iter()
        .map(|f| f == "IPv6")
        .collect();
    if f.is_empty() { vec![false] } else { f }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(extra: serde_json::Value, status_ip: Option<&str>) -> Service {
        let mut v = json!({"metadata": {"name": "s", "namespace": "default"},
                           "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4"], "ports": [{"port": 80}]}});
        for (k, val) in extra.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        if let Some(ip) = status_ip {
            v["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pool_parse() {
        let p: Pool = "192.168.1.240-192.168.1.242, 10.0.0.0/30, fd00::5"
            .parse()
            .unwrap();
        assert!(p.contains(&"192.168.1.241".parse().unwrap()));
        assert!(p.contains(&"10.0.0.3".parse().unwrap()));
        assert!(!p.contains(&"10.0.0.4".parse().unwrap()));
        assert!(p.contains(&"fd00::5".parse().unwrap()));
        assert!("1.2.3.4-1.2.3.1".parse::<Pool>().is_err());
        assert!("x".parse::<Pool>().is_err());
    }

    #[test]
    fn assignment_table() {
        let pool: Pool = "192.168.1.240-192.168.1.241,fd00::1-fd00::2"
            .parse()
            .unwrap();
        let a = svc(json!({}), None);
        let b = svc(json!({"loadBalancerIP": "192.168.1.241"}), None);
        let c = svc(json!({}), None);
        let other = svc(json!({"loadBalancerClass": "example.com/other"}), None);
        let outside = svc(json!({"loadBalancerIP": "10.0.0.1"}), None);
        let kept = svc(json!({}), Some("192.168.1.240"));
        let dual = svc(json!({"ipFamilies": ["IPv6", "IPv4"]}), None);
        let m: BTreeMap<String, &Service> = [
            ("a".to_string(), &a),
            ("b".into(), &b),
            ("c".into(), &c),
            ("other".into(), &other),
            ("outside".into(), &outside),
            ("z-kept".into(), &kept),
        ]
        .into();
        let got = assign(&pool, &m, DEFAULT_CLASS);
        assert_eq!(got["z-kept"], Assignment::Ips(vec!["192.168.1.240".into()]));
        assert_eq!(got["b"], Assignment::Ips(vec!["192.168.1.241".into()]));
        assert_eq!(got["a"], Assignment::Exhausted);
        assert_eq!(got["c"], Assignment::Exhausted);
        assert_eq!(got["outside"], Assignment::Unavailable("10.0.0.1".into()));
        assert!(!got.contains_key("other"));
        let m: BTreeMap<String, &Service> = [("d".to_string(), &dual)].into();
        assert_eq!(
            assign(&pool, &m, DEFAULT_CLASS)["d"],
            Assignment::Ips(vec!["fd00::1".into(), "192.168.1.240".into()])
        );
    }
}
