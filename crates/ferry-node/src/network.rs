//! The pod network. [`PodNetwork`] is the interface a mode implements; this issue ships the
//! loopback mode: a pod gets an address from its node's pod CIDR, and because `ferry up`'s
//! defaults put pod and service ranges inside 127.0.0.0/8 (pods `127.100.0.0/16`, one /24 per
//! node; services `127.96.0.0/16`), every such address is already local on Linux and nothing
//! on the machine's network changes. [`NetNs`] is the network-namespace mode: a namespace per
//! pod wired by CNI plugins.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Mutex;

use ipnet::IpNet;

/// Default pod CIDR of a node in loopback mode when the Node has no `spec.podCIDR`.
pub const DEFAULT_LOOPBACK_POD_CIDR: &str = "127.100.0.0/24";
/// Suggested cluster-wide ranges for `ferry up` in loopback mode.
pub const LOOPBACK_CLUSTER_CIDR: &str = "127.100.0.0/16";
pub const LOOPBACK_SERVICE_CIDR: &str = "127.96.0.0/16";

/// Pure allocator of pod addresses from a CIDR: skips the network address, the first host
/// (reserved as a gateway for netns modes) and the broadcast address; hands addresses out
/// round-robin after the last one given (as CNI host-local does) so a freed address is not
/// reused at once.
#[derive(Debug, Clone)]
pub struct IpAllocator {
    cidr: IpNet,
    used: BTreeSet<IpAddr>,
    last: Option<u128>,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    }
}

fn from_u128(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(n))
    }
}

impl IpAllocator {
    pub fn new(cidr: IpNet) -> IpAllocator {
        IpAllocator {
            cidr: cidr.trunc(),
            used: BTreeSet::new(),
            last: None,
        }
    }

    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    fn range(&self) -> (u128, u128) {
        let first = to_u128(self.cidr.network()) + 2;
        let last = match self.cidr {
            IpNet::V4(_) => to_u128(self.cidr.broadcast()).saturating_sub(1),
            IpNet::V6(_) => to_u128(self.cidr.broadcast()),
        };
        (first, last)
    }

    /// Marks an address in use (e.g. recovered from a running pod's status).
    pub fn reserve(&mut self, ip: IpAddr) -> bool {
        if !self.cidr.contains(&ip) {
            return false;
        }
        self.used.insert(ip)
    }

    pub fn release(&mut self, ip: IpAddr) {
        self.used.remove(&ip);
    }

    pub fn allocate(&mut self) -> Option<IpAddr> {
        let (first, last) = self.range();
        if first > last {
            return None;
        }
        let size = last - first + 1;
        let start = match self.last {
            Some(l) if l >= first && l < last => l + 1,
            _ => first,
        };
        let v4 = self.cidr.network().is_ipv4();
        let mut n = start;
        for _ in 0..size.min(1 << 20) {
            let ip = from_u128(v4, n);
            if !self.used.contains(&ip) {
                self.used.insert(ip);
                self.last = Some(n);
                return Some(ip);
            }
            n = if n >= last { first } else { n + 1 };
        }
        None
    }

    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

/// What a pod network gives a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddresses {
    pub ips: Vec<IpAddr>,
}

/// The pod a network is set up for.
#[derive(Debug, Clone, Default)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `hostPort` mappings (the CNI `portMappings` capability).
    pub port_mappings: Vec<serde_json::Value>,
}

/// Why a pod's network cannot be set up (kubelet's `FailedCreatePodSandBox` texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error("loopback pod network needs a pod CIDR inside 127.0.0.0/8, got {0}")]
    NotLoopback(IpNet),
    #[error("no free pod address left in {0}")]
    Exhausted(IpNet),
    #[error("the pod address table is poisoned (a set-up panicked)")]
    Poisoned,
    #[error("creating network namespace: {0}")]
    Namespace(String),
    #[error("network {network} gave pod {pod} no address")]
    NoAddress { network: String, pod: String },
    /// The CNI plugin failed (its message).
    #[error("failed to setup network for sandbox {pod}: {message}")]
    Plugin { pod: String, message: String },
    /// The blocking set-up task did not finish.
    #[error("network set-up task: {0}")]
    Task(String),
}

/// A pod network mode.
pub trait PodNetwork: Send + Sync {
    /// Gives the pod its addresses; idempotent for a pod already set up.
    fn setup(&self, pod: &PodRef, wanted: Option<IpAddr>) -> Result<PodAddresses, NetworkError>;
    /// Frees what `setup` took.
    fn teardown(&self, uid: &str);
    /// A command prefix that runs a process inside the pod's network (empty: host network).
    fn enter_prefix(&self, _uid: &str) -> Vec<String> {
        Vec::new()
    }
    /// The pod's network namespace, when it has its own.
    fn netns_path(&self, _uid: &str) -> Option<PathBuf> {
        None
    }
    fn name(&self) -> &'static str;
}

/// Loopback mode: addresses from the node's pod CIDR, all local through `lo`.
pub struct Loopback {
    inner: Mutex<(IpAllocator, std::collections::HashMap<String, IpAddr>)>,
}

impl Loopback {
    /// `cidr` must lie inside 127.0.0.0/8 (or be `::1/128`-like loopback) for the addresses to
    /// be local without configuring anything.
    pub fn new(cidr: IpNet) -> Result<Loopback, NetworkError> {
        let lo = IpNet::V4(ipnet::Ipv4Net::new_assert(
            std::net::Ipv4Addr::new(127, 0, 0, 0),
            8,
        ));
        if !lo.contains(&cidr) {
            return Err(NetworkError::NotLoopback(cidr));
        }
        Ok(Loopback {
            inner: Mutex::new((IpAllocator::new(cidr), Default::default())),
        })
    }
}

impl PodNetwork for Loopback {
    fn setup(&self, pod: &PodRef, wanted: Option<IpAddr>) -> Result<PodAddresses, NetworkError> {
        let uid = pod.uid.as_str();
        let mut g = self.inner.lock().map_err(|_| NetworkError::Poisoned)?;
        if let Some(ip) = g.1.get(uid) {
            return Ok(PodAddresses { ips: vec![*ip] });
        }
        let ip = match wanted {
            Some(ip) if g.0.reserve(ip) => ip,
            _ => {
                g.0.allocate()
                    .ok_or_else(|| NetworkError::Exhausted(g.0.cidr()))?
            }
        };
        g.1.insert(uid.to_string(), ip);
        Ok(PodAddresses { ips: vec![ip] })
    }

    fn teardown(&self, uid: &str) {
        if let Ok(mut g) = self.inner.lock()
            && let Some(ip) = g.1.remove(uid)
        {
            g.0.release(ip);
        }
    }

    fn name(&self) -> &'static str {
        "loopback"
    }
}

/// Network-namespace mode: each pod gets a namespace `<prefix><uid>` under /run/netns with
/// `lo` (the CNI `loopback` plugin) and `eth0` from the configured CNI network (by default the
/// reference `bridge` + `host-local` + `portmap` plugins, run inside the node namespace).
pub struct NetNs {
    pub cni: crate::cni::Cni,
    pub conf: crate::cni::ConfList,
    /// Pod namespaces are named `<netns_prefix><pod uid>`.
    pub netns_prefix: String,
}

fn loopback_conf() -> crate::cni::ConfList {
    crate::cni::ConfList {
        cni_version: "1.0.0".into(),
        name: "cni-loopback".into(),
        disable_check: false,
        plugins: vec![serde_json::json!({"type": "loopback"})],
    }
}

impl NetNs {
    pub fn netns_name(&self, uid: &str) -> String {
        format!("{}{uid}", self.netns_prefix)
    }

    fn attachment(&self, pod: &PodRef, ifname: &str) -> crate::cni::Attachment {
        let mut caps = std::collections::BTreeMap::new();
        if !pod.port_mappings.is_empty() {
            caps.insert(
                "portMappings".to_string(),
                serde_json::Value::Array(pod.port_mappings.clone()),
            );
        }
        crate::cni::Attachment {
            container_id: pod.uid.clone(),
            netns: crate::netns::path(&self.netns_name(&pod.uid)),
            ifname: ifname.into(),
            args: vec![
                ("K8S_POD_NAMESPACE".into(), pod.namespace.clone()),
                ("K8S_POD_NAME".into(), pod.name.clone()),
                ("K8S_POD_INFRA_CONTAINER_ID".into(), pod.uid.clone()),
                ("K8S_POD_UID".into(), pod.uid.clone()),
            ],
            capability_args: caps,
        }
    }

    /// Tears down what the cache says is attached (e.g. after the agent was killed): every
    /// cached attachment gets its DEL and its namespace is removed. Returns how many.
    pub fn gc(&self) -> usize {
        let entries = self.cni.cached();
        let mut n = 0;
        for e in &entries {
            if let Ok(list) = crate::cni::ConfList::parse(&e.config.to_string())
                && let Err(err) = self.cni.del(&list, &e.attachment)
            {
                tracing::warn!("CNI DEL of {}: {err}", e.attachment.container_id);
            }
            if e.attachment.ifname == "eth0" {
                n += 1;
            }
            crate::netns::delete(&self.netns_name(&e.attachment.container_id));
        }
        // Namespaces without a cache entry (killed between creation and ADD).
        for name in crate::netns::list_with_prefix(&self.netns_prefix) {
            crate::netns::delete(&name);
        }
        n
    }
}

impl PodNetwork for NetNs {
    fn setup(&self, pod: &PodRef, _wanted: Option<IpAddr>) -> Result<PodAddresses, NetworkError> {
        let name = self.netns_name(&pod.uid);
        let att = self.attachment(pod, "eth0");
        if crate::netns::exists(&name)
            && let Some(c) = self.cni.read_cache(&self.conf.name, &pod.uid, "eth0")
        {
            let ips = crate::cni::pod_ips(&c.result);
            if !ips.is_empty() {
                return Ok(PodAddresses { ips });
            }
        }
        crate::netns::create(&name).map_err(|e| NetworkError::Namespace(e.to_string()))?;
        // No duplicate address detection inside the pod: its addresses are unique by IPAM,
        // and DAD would hold IPv6 back for a second or two.
        let p = crate::netns::path(&name);
        for key in [
            "net/ipv6/conf/default/accept_dad",
            "net/ipv6/conf/all/accept_dad",
        ] {
            let _ = crate::netns::sysctl(Some(&p), key, "0");
        }
        let lo_att = self.attachment(pod, "lo");
        let result = self
            .cni
            .add(&loopback_conf(), &lo_att)
            .and_then(|_| self.cni.add(&self.conf, &att));
        match result {
            Ok(r) => {
                let ips = crate::cni::pod_ips(&r);
                if ips.is_empty() {
                    self.teardown(&pod.uid);
                    return Err(NetworkError::NoAddress {
                        network: self.conf.name.clone(),
                        pod: pod.uid.clone(),
                    });
                }
                Ok(PodAddresses { ips })
            }
            Err(e) => {
                // Nothing half-made stays: DEL (releases addresses) and remove the namespace.
                let _ = self.cni.del(&self.conf, &att);
                let _ = self.cni.del(&loopback_conf(), &lo_att);
                crate::netns::delete(&name);
                Err(NetworkError::Plugin {
                    pod: pod.uid.clone(),
                    message: e.to_string(),
                })
            }
        }
    }

    fn teardown(&self, uid: &str) {
        let cached = self.cni.read_cache(&self.conf.name, uid, "eth0");
        let (list, att) = match cached {
            Some(c) => (
                crate::cni::ConfList::parse(&c.config.to_string()).unwrap_or(self.conf.clone()),
                c.attachment,
            ),
            None => (
                self.conf.clone(),
                self.attachment(
                    &PodRef {
                        uid: uid.to_string(),
                        ..Default::default()
                    },
                    "eth0",
                ),
            ),
        };
        if let Err(e) = self.cni.del(&list, &att) {
            tracing::warn!("CNI DEL for pod {uid}: {e}");
        }
        let lo = crate::cni::Attachment {
            ifname: "lo".into(),
            ..att
        };
        let _ = self.cni.del(&loopback_conf(), &lo);
        crate::netns::delete(&self.netns_name(uid));
    }

    fn enter_prefix(&self, uid: &str) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!(
                "--net={}",
                crate::netns::path(&self.netns_name(uid)).display()
            ),
            "--".into(),
        ]
    }

    fn netns_path(&self, uid: &str) -> Option<PathBuf> {
        Some(crate::netns::path(&self.netns_name(uid)))
    }

    fn name(&self) -> &'static str {
        "netns"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn allocation_table() {
        let mut a = IpAllocator::new("127.100.3.0/29".parse().expect("cidr"));
        // .0 network, .1 gateway, .7 broadcast are never handed out.
        let got: Vec<IpAddr> = std::iter::from_fn(|| a.allocate()).collect();
        let want: Vec<IpAddr> = [
            "127.100.3.2",
            "127.100.3.3",
            "127.100.3.4",
            "127.100.3.5",
            "127.100.3.6",
        ]
        .iter()
        .map(|s| ip(s))
        .collect();
        assert_eq!(got, want);
        // Round-robin: a released address comes back only after the others.
        a.release(ip("127.100.3.3"));
        a.release(ip("127.100.3.5"));
        assert_eq!(a.allocate(), Some(ip("127.100.3.3")));
        assert_eq!(a.allocate(), Some(ip("127.100.3.5")));
        assert_eq!(a.allocate(), None);
        let mut b = IpAllocator::new("127.100.0.0/24".parse().expect("cidr"));
        assert!(b.reserve(ip("127.100.0.2")));
        assert!(!b.reserve(ip("127.101.0.2")));
        assert_eq!(b.allocate(), Some(ip("127.100.0.3")));
    }

    #[test]
    fn loopback_mode() {
        assert!(Loopback::new("10.0.0.0/24".parse().expect("cidr")).is_err());
        let l = Loopback::new("127.100.0.0/24".parse().expect("cidr")).expect("lo");
        let pod = |uid: &str| PodRef {
            uid: uid.into(),
            ..Default::default()
        };
        let a = l.setup(&pod("u1"), None).expect("a");
        assert_eq!(l.setup(&pod("u1"), None).expect("again"), a);
        let b = l.setup(&pod("u2"), Some(ip("127.100.0.9"))).expect("b");
        assert_eq!(b.ips, vec![ip("127.100.0.9")]);
        // A wanted address already taken: a fresh one.
        let c = l.setup(&pod("u3"), Some(ip("127.100.0.9"))).expect("c");
        assert_ne!(c.ips, b.ips);
        l.teardown("u2");
        assert!(l.setup(&pod("u4"), Some(ip("127.100.0.9"))).is_ok());
    }

    proptest! {
        #[test]
        fn never_duplicates(ops in proptest::collection::vec(any::<bool>(), 1..200)) {
            let mut a = IpAllocator::new("127.100.0.0/26".parse().expect("cidr"));
            let mut held: Vec<IpAddr> = Vec::new();
            for alloc in ops {
                if alloc || held.is_empty() {
                    if let Some(ip) = a.allocate() {
                        prop_assert!(!held.contains(&ip));
                        prop_assert!(a.cidr().contains(&ip));
                        held.push(ip);
                    } else {
                        prop_assert_eq!(held.len(), 61);
                    }
                } else {
                    let ip = held.remove(0);
                    a.release(ip);
                }
            }
        }
    }
}
