//! The DNS index: slim projections of Services, EndpointSlices and Pods, and the records they
//! produce, precomputed per name. Updates are incremental: a change to one Service (or one of its
//! slices) recomputes only that Service's names.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// How `a-b-c-d.ns.pod.zone` names are answered (the `pods` option of CoreDNS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PodsMode {
    /// No pod records (NXDOMAIN).
    #[default]
    Disabled,
    /// Any well-formed IP name is answered, without checking that the pod exists.
    Insecure,
    /// Only IPs of pods that exist in that namespace are answered.
    Verified,
}

/// Zone-wide settings the answer function needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    /// Cluster domain, lower-case, without the trailing dot (e.g. `cluster.local`).
    pub zone: String,
    /// TTL of every record the zone serves.
    pub ttl: u32,
    pub pods: PodsMode,
    /// Addresses served for `ns.dns.<zone>` (the NS record's glue); may be empty.
    pub ns_ips: Vec<IpAddr>,
}

impl Default for ZoneConfig {
    fn default() -> Self {
        ZoneConfig {
            zone: "cluster.local".into(),
            ttl: 5,
            pods: PodsMode::Disabled,
            ns_ips: Vec::new(),
        }
    }
}

/// A Service port, as DNS needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port name (SRV records exist only for named ports).
    pub name: String,
    /// `tcp`, `udp` or `sctp` (lower-case).
    pub protocol: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKind {
    /// A virtual IP Service: all its `clusterIPs` (dual-stack).
    ClusterIp(Vec<IpAddr>),
    /// `clusterIP: None`: records come from ready endpoints.
    Headless,
    /// `type: ExternalName`: a CNAME to this name (lower-case, no trailing dot).
    ExternalName(String),
}

/// Projection of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub kind: ServiceKind,
    pub ports: Vec<PortInfo>,
    pub publish_not_ready: bool,
}

/// Projection of one endpoint address of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    pub ip: IpAddr,
    pub hostname: Option<String>,
    pub ready: bool,
}

/// Projection of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub namespace: String,
    pub name: String,
    /// The `kubernetes.io/service-name` label.
    pub service: String,
    pub endpoints: Vec<EndpointInfo>,
    pub ports: Vec<PortInfo>,
}

/// Projection of a Pod (for `pods verified`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
}

/// An SRV record's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srv {
    pub port: u16,
    pub weight: u16,
    pub target: Box<str>,
}

/// Everything the zone holds for one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameData {
    pub addrs: Vec<IpAddr>,
    pub cname: Option<Box<str>>,
    pub srv: Vec<Srv>,
}

type Key = (Box<str>, Box<str>);

/// A pod's IPs without a heap allocation for the usual one (or none).
#[derive(Debug, Clone, PartialEq, Eq)]
enum PodIps {
    One(IpAddr),
    /// None or several (dual-stack).
    Many(Box<[IpAddr]>),
}

impl PodIps {
    fn new(ips: &[IpAddr]) -> Self {
        match ips {
            [ip] => PodIps::One(*ip),
            _ => PodIps::Many(ips.into()),
        }
    }
    fn as_slice(&self) -> &[IpAddr] {
        match self {
            PodIps::One(ip) => std::slice::from_ref(ip),
            PodIps::Many(v) => v,
        }
    }
}

/// One pod: its IPs, and the (re)list that last saw it.
#[derive(Debug)]
struct PodEntry {
    ips: PodIps,
    epoch: u32,
}

/// Pods keyed by (interned namespace id, name): at 150,000 pods each entry is ~60 bytes plus
/// its name, instead of two strings and a vector per pod.
type PodKey = (u32, Box<str>);

#[derive(Debug, Default)]
struct ServiceState {
    svc: Option<ServiceInfo>,
    slices: BTreeMap<Box<str>, SliceInfo>,
    owned_names: Vec<Box<str>>,
    owned_ptrs: Vec<(IpAddr, Box<str>)>,
}

/// The index. All names are lower-case, dotted, without the trailing dot.
#[derive(Debug)]
pub struct Index {
    cfg: ZoneConfig,
    services: HashMap<Key, ServiceState>,
    /// slice (ns, name) -> service name it belongs to.
    slice_owner: HashMap<Key, Box<str>>,
    names: HashMap<Box<str>, NameData>,
    /// Empty non-terminals (ancestors of names, below the apex), reference counted.
    ents: HashMap<Box<str>, u32>,
    ptr: HashMap<IpAddr, Vec<Box<str>>>,
    /// Namespace names of pods, interned: id -> name (never shrinks; one entry per namespace
    /// ever seen with a pod).
    ns_names: Vec<Box<str>>,
    ns_ids: HashMap<Box<str>, u32>,
    /// (pod IP, namespace id) -> how many pods of that namespace have the IP.
    pod_ips: HashMap<(IpAddr, u32), u32>,
    pods: HashMap<PodKey, PodEntry>,
    /// The current pod (re)list; entries not seen by it are removed at its end.
    pod_epoch: u32,
    serial: u32,
    generation: u64,
}

fn now_unix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1)
}

/// The label form of an IP used for pod names and hostname-less headless endpoints
/// (`10-0-0-1`, `fd00--1`).
pub fn ip_label(ip: &IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

impl Index {
    pub fn new(cfg: ZoneConfig) -> Self {
        let mut cfg = cfg;
        cfg.zone = cfg.zone.trim_end_matches('.').to_ascii_lowercase();
        Index {
            cfg,
            services: HashMap::new(),
            slice_owner: HashMap::new(),
            names: HashMap::new(),
            ents: HashMap::new(),
            ptr: HashMap::new(),
            ns_names: Vec::new(),
            ns_ids: HashMap::new(),
            pod_ips: HashMap::new(),
            pods: HashMap::new(),
            pod_epoch: 0,
            serial: now_unix(),
            generation: 0,
        }
    }

    pub fn config(&self) -> &ZoneConfig {
        &self.cfg
    }
    /// SOA serial: the Unix time of the last change (strictly increasing across changes).
    pub fn serial(&self) -> u32 {
        self.serial
    }
    /// Bumped on every change; used to invalidate encoded-answer caches.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    pub fn name(&self, name: &str) -> Option<&NameData> {
        self.names.get(name)
    }
    pub fn is_empty_non_terminal(&self, name: &str) -> bool {
        self.ents.contains_key(name)
    }
    pub fn ptr(&self, ip: &IpAddr) -> Option<&[Box<str>]> {
        self.ptr.get(ip).map(|v| v.as_slice())
    }
    pub fn pod_exists(&self, ns: &str, ip: &IpAddr) -> bool {
        self.ns_ids
            .get(ns)
            .is_some_and(|id| self.pod_ips.contains_key(&(*ip, *id)))
    }
    pub fn service_count(&self) -> usize {
        self.services.values().filter(|s| s.svc.is_some()).count()
    }
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
    pub fn services(&self) -> impl Iterator<Item = &ServiceInfo> {
        self.services.values().filter_map(|s| s.svc.as_ref())
    }
    pub fn slices(&self) -> impl Iterator<Item = &SliceInfo> {
        self.services.values().flat_map(|s| s.slices.values())
    }
    pub fn pods(&self) -> impl Iterator<Item = PodInfo> + '_ {
        self.pods.iter().map(|((ns, name), e)| PodInfo {
            namespace: self.ns_names[*ns as usize].to_string(),
            name: name.to_string(),
            ips: e.ips.as_slice().to_vec(),
        })
    }

    fn touch(&mut self) {
        self.generation += 1;
        self.serial = now_unix().max(self.serial.wrapping_add(1));
    }

    /// Inserts or replaces a Service. Returns whether anything changed.
    pub fn upsert_service(&mut self, svc: ServiceInfo) -> bool {
        let key: Key = (svc.namespace.as_str().into(), svc.name.as_str().into());
        let st = self.services.entry(key.clone()).or_default();
        if st.svc.as_ref() == Some(&svc) {
            return false;
        }
        st.svc = Some(svc);
        self.rebuild(&key);
        true
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        let key: Key = (namespace.into(), name.into());
        let Some(st) = self.services.get_mut(&key) else {
            return false;
        };
        if st.svc.take().is_none() {
            return false;
        }
        self.rebuild(&key);
        true
    }

    pub fn upsert_slice(&mut self, slice: SliceInfo) -> bool {
        let skey: Key = (slice.namespace.as_str().into(), slice.name.as_str().into());
        let mut changed = false;
        // The service label may change (rare); detach from the previous owner first.
        if let Some(prev) = self.slice_owner.get(&skey).cloned()
            && *prev != *slice.service
        {
            changed |= self.delete_slice(&slice.namespace, &slice.name);
        }
        let key: Key = (
            slice.namespace.as_str().into(),
            slice.service.as_str().into(),
        );
        self.slice_owner
            .insert(skey.clone(), slice.service.as_str().into());
        let st = self.services.entry(key.clone()).or_default();
        if st.slices.get(&skey.1) == Some(&slice) {
            return changed;
        }
        st.slices.insert(skey.1, slice);
        self.rebuild(&key);
        true
    }

    pub fn delete_slice(&mut self, namespace: &str, name: &str) -> bool {
        let skey: Key = (namespace.into(), name.into());
        let Some(svc) = self.slice_owner.remove(&skey) else {
            return false;
        };
        let key: Key = (namespace.into(), svc);
        let Some(st) = self.services.get_mut(&key) else {
            return false;
        };
        if st.slices.remove(&skey.1).is_none() {
            return false;
        }
        self.rebuild(&key);
        true
    }

    fn ns_id(&mut self, ns: &str) -> u32 {
        if let Some(id) = self.ns_ids.get(ns) {
            return *id;
        }
        let id = self.ns_names.len() as u32;
        self.ns_names.push(ns.into());
        self.ns_ids.insert(ns.into(), id);
        id
    }

    pub fn upsert_pod(&mut self, pod: PodInfo) -> bool {
        let key: PodKey = (self.ns_id(&pod.namespace), pod.name.into_boxed_str());
        let epoch = self.pod_epoch;
        if let Some(e) = self.pods.get_mut(&key) {
            e.epoch = epoch;
            if e.ips.as_slice() == pod.ips.as_slice() {
                return false;
            }
        }
        self.remove_pod_ips(&key);
        for ip in &pod.ips {
            *self.pod_ips.entry((*ip, key.0)).or_default() += 1;
        }
        let ips = PodIps::new(&pod.ips);
        self.pods.insert(key, PodEntry { ips, epoch });
        self.touch();
        true
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> bool {
        let Some(ns) = self.ns_ids.get(namespace).copied() else {
            return false;
        };
        let key: PodKey = (ns, name.into());
        if !self.pods.contains_key(&key) {
            return false;
        }
        self.remove_pod_ips(&key);
        self.pods.remove(&key);
        self.touch();
        true
    }

    /// Starts a (re)list of pods: [`Index::upsert_pod`] marks what it sees until
    /// [`Index::end_pod_relist`] removes the pods it did not see.
    pub fn begin_pod_relist(&mut self) {
        self.pod_epoch = self.pod_epoch.wrapping_add(1);
    }

    /// Ends a pod (re)list: removes the pods it did not see. Returns whether any went.
    pub fn end_pod_relist(&mut self) -> bool {
        let epoch = self.pod_epoch;
        let stale: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(_, e)| e.epoch != epoch)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &stale {
            self.remove_pod_ips(k);
            self.pods.remove(k);
        }
        if !stale.is_empty() {
            self.touch();
        }
        // Give back what a larger cluster needed.
        self.pods.shrink_to_fit();
        self.pod_ips.shrink_to_fit();
        !stale.is_empty()
    }

    fn remove_pod_ips(&mut self, key: &PodKey) {
        let Some(e) = self.pods.get(key) else {
            return;
        };
        for ip in e.ips.as_slice() {
            let k = (*ip, key.0);
            if let Some(n) = self.pod_ips.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.pod_ips.remove(&k);
                }
            }
        }
    }

    fn add_ents(&mut self, name: &str) {
        let zone_len = self.cfg.zone.len();
        let mut rest = name;
        while let Some((_, parent)) = rest.split_once('.') {
            if parent.len() <= zone_len {
                break;
            }
            *self.ents.entry(parent.into()).or_default() += 1;
            rest = parent;
        }
    }

    fn remove_ents(&mut self, name: &str) {
        let zone_len = self.cfg.zone.len();
        let mut rest = name;
        while let Some((_, parent)) = rest.split_once('.') {
            if parent.len() <= zone_len {
                break;
            }
            if let Some(c) = self.ents.get_mut(parent) {
                *c -= 1;
                if *c == 0 {
                    self.ents.remove(parent);
                }
            }
            rest = parent;
        }
    }

    /// Recomputes every name and PTR owned by one Service.
    fn rebuild(&mut self, key: &Key) {
        let Some(st) = self.services.get_mut(key) else {
            return;
        };
        let old_names = std::mem::take(&mut st.owned_names);
        let old_ptrs = std::mem::take(&mut st.owned_ptrs);
        let (names, ptrs) = match &st.svc {
            Some(svc) => compute_service(svc, &st.slices, &self.cfg.zone),
            None => (Vec::new(), Vec::new()),
        };
        let empty = st.svc.is_none() && st.slices.is_empty();
        for n in &old_names {
            self.names.remove(n);
            self.remove_ents(n);
        }
        for (ip, n) in &old_ptrs {
            if let Some(v) = self.ptr.get_mut(ip) {
                if let Some(i) = v.iter().position(|x| x == n) {
                    v.remove(i);
                }
                if v.is_empty() {
                    self.ptr.remove(ip);
                }
            }
        }
        let mut owned_names = Vec::with_capacity(names.len());
        for (n, data) in names {
            self.add_ents(&n);
            self.names.insert(n.clone(), data);
            owned_names.push(n);
        }
        for (ip, n) in &ptrs {
            self.ptr.entry(*ip).or_default().push(n.clone());
        }
        if empty {
            self.services.remove(key);
        } else if let Some(st) = self.services.get_mut(key) {
            st.owned_names = owned_names;
            st.owned_ptrs = ptrs;
        }
        self.touch();
    }
}

/// Endpoints of a Service, deduplicated by IP across its slices.
struct MergedEndpoint {
    ip: IpAddr,
    hostname: Option<String>,
    ready: bool,
    ports: Vec<PortInfo>,
}

fn merge_endpoints(slices: &BTreeMap<Box<str>, SliceInfo>) -> Vec<MergedEndpoint> {
    let mut out: Vec<MergedEndpoint> = Vec::new();
    let mut pos: HashMap<IpAddr, usize> = HashMap::new();
    for slice in slices.values() {
        for ep in &slice.endpoints {
            match pos.get(&ep.ip) {
                Some(&i) => {
                    let m = &mut out[i];
                    m.ready |= ep.ready;
                    if m.hostname.is_none() {
                        m.hostname.clone_from(&ep.hostname);
                    }
                    for p in &slice.ports {
                        if !m.ports.contains(p) {
                            m.ports.push(p.clone());
                        }
                    }
                }
                None => {
                    pos.insert(ep.ip, out.len());
                    out.push(MergedEndpoint {
                        ip: ep.ip,
                        hostname: ep.hostname.clone(),
                        ready: ep.ready,
                        ports: slice.ports.clone(),
                    });
                }
            }
        }
    }
    out
}

fn push_addr(map: &mut Vec<(Box<str>, NameData)>, name: &str, ip: IpAddr) {
    match map.iter_mut().find(|(n, _)| &**n == name) {
        Some((_, d)) => {
            if !d.addrs.contains(&ip) {
                d.addrs.push(ip);
            }
        }
        None => map.push((
            name.into(),
            NameData {
                addrs: vec![ip],
                ..Default::default()
            },
        )),
    }
}

fn push_srv(map: &mut Vec<(Box<str>, NameData)>, name: &str, srv: Srv) {
    match map.iter_mut().find(|(n, _)| &**n == name) {
        Some((_, d)) => {
            if !d.srv.contains(&srv) {
                d.srv.push(srv)
            }
        }
        None => map.push((
            name.into(),
            NameData {
                srv: vec![srv],
                ..Default::default()
            },
        )),
    }
}

type Computed = (Vec<(Box<str>, NameData)>, Vec<(IpAddr, Box<str>)>);

fn compute_service(
    svc: &ServiceInfo,
    slices: &BTreeMap<Box<str>, SliceInfo>,
    zone: &str,
) -> Computed {
    let base = format!("{}.{}.svc.{}", svc.name, svc.namespace, zone).to_ascii_lowercase();
    let mut names: Vec<(Box<str>, NameData)> = Vec::new();
    let mut ptrs: Vec<(IpAddr, Box<str>)> = Vec::new();
    let srv_name =
        |p: &PortInfo| format!("_{}._{}.{}", p.name, p.protocol, base).to_ascii_lowercase();
    match &svc.kind {
        ServiceKind::ExternalName(target) => {
            names.push((
                base.as_str().into(),
                NameData {
                    cname: Some(target.as_str().into()),
                    ..Default::default()
                },
            ));
        }
        ServiceKind::ClusterIp(ips) => {
            names.push((
                base.as_str().into(),
                NameData {
                    addrs: ips.clone(),
                    ..Default::default()
                },
            ));
            for ip in ips {
                ptrs.push((*ip, base.as_str().into()));
            }
            for p in svc.ports.iter().filter(|p| !p.name.is_empty()) {
                let srv = Srv {
                    port: p.port,
                    weight: 100,
                    target: base.as_str().into(),
                };
                push_srv(&mut names, &srv_name(p), srv);
            }
        }
        ServiceKind::Headless => {
            // Names exist only for usable endpoints: with none, the Service's name is
            // NXDOMAIN (DNS specification 2.4.1, as CoreDNS answers).
            let eps = merge_endpoints(slices);
            let usable: Vec<&MergedEndpoint> = eps
                .iter()
                .filter(|e| e.ready || svc.publish_not_ready)
                .collect();
            let n_usable = usable.len().max(1);
            for ep in &usable {
                push_addr(&mut names, &base, ep.ip);
                let host = match &ep.hostname {
                    Some(h) if !h.is_empty() => {
                        let n = format!("{}.{}", h.to_ascii_lowercase(), base);
                        ptrs.push((ep.ip, n.as_str().into()));
                        n
                    }
                    _ => format!("{}.{}", ip_label(&ep.ip), base),
                };
                push_addr(&mut names, &host, ep.ip);
                for p in ep.ports.iter().filter(|p| !p.name.is_empty()) {
                    let weight = (100 / n_usable).max(1) as u16;
                    let srv = Srv {
                        port: p.port,
                        weight,
                        target: host.as_str().into(),
                    };
                    push_srv(&mut names, &srv_name(p), srv);
                }
            }
        }
    }
    (names, ptrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, kind: ServiceKind) -> ServiceInfo {
        ServiceInfo {
            namespace: ns.into(),
            name: name.into(),
            kind,
            ports: vec![],
            publish_not_ready: false,
        }
    }

    #[test]
    fn incremental_updates_and_deletes_leave_nothing_behind() {
        let mut idx = Index::new(ZoneConfig::default());
        let ip: IpAddr = "10.96.0.10".parse().unwrap();
        let mut s = svc("ns", "web", ServiceKind::ClusterIp(vec![ip]));
        s.ports.push(PortInfo {
            name: "http".into(),
            protocol: "tcp".into(),
            port: 80,
        });
        assert!(idx.upsert_service(s.clone()));
        assert!(
            !idx.upsert_service(s.clone()),
            "no-op update is not a change"
        );
        assert!(idx.name("web.ns.svc.cluster.local").is_some());
        assert!(idx.name("_http._tcp.web.ns.svc.cluster.local").is_some());
        assert!(idx.is_empty_non_terminal("_tcp.web.ns.svc.cluster.local"));
        assert!(idx.is_empty_non_terminal("ns.svc.cluster.local"));
        assert!(idx.ptr(&ip).is_some());
        let g = idx.generation();
        assert!(idx.delete_service("ns", "web"));
        assert!(idx.generation() > g);
        assert!(idx.names.is_empty());
        assert!(idx.ents.is_empty());
        assert!(idx.ptr.is_empty());
        assert!(idx.services.is_empty());
    }

    #[test]
    fn slices_before_service_and_dedup() {
        let mut idx = Index::new(ZoneConfig::default());
        let ep = |ip: &str, ready| EndpointInfo {
            ip: ip.parse().unwrap(),
            hostname: None,
            ready,
        };
        for (name, eps) in [
            ("h-1", vec![ep("10.0.0.1", true), ep("10.0.0.2", false)]),
            ("h-2", vec![ep("10.0.0.1", true)]),
        ] {
            idx.upsert_slice(SliceInfo {
                namespace: "ns".into(),
                name: name.into(),
                service: "h".into(),
                endpoints: eps,
                ports: vec![],
            });
        }
        assert!(idx.name("h.ns.svc.cluster.local").is_none());
        idx.upsert_service(svc("ns", "h", ServiceKind::Headless));
        let d = idx.name("h.ns.svc.cluster.local").unwrap();
        assert_eq!(d.addrs, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
        idx.delete_slice("ns", "h-1");
        idx.delete_slice("ns", "h-2");
        idx.delete_service("ns", "h");
        assert!(idx.names.is_empty() && idx.services.is_empty() && idx.slice_owner.is_empty());
    }

    #[test]
    fn pods_by_ip() {
        let mut idx = Index::new(ZoneConfig::default());
        let ip: IpAddr = "10.244.0.5".parse().unwrap();
        idx.upsert_pod(PodInfo {
            namespace: "a".into(),
            name: "p".into(),
            ips: vec![ip],
        });
        assert!(idx.pod_exists("a", &ip));
        assert!(!idx.pod_exists("b", &ip));
        idx.upsert_pod(PodInfo {
            namespace: "a".into(),
            name: "p".into(),
            ips: vec![],
        });
        assert!(!idx.pod_exists("a", &ip));
        idx.delete_pod("a", "p");
        assert_eq!(idx.pod_count(), 0);
    }

    #[test]
    fn pods_sharing_an_ip_and_dual_stack() {
        let mut idx = Index::new(ZoneConfig::default());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let pod = |ns: &str, name: &str, ips: &[&str]| PodInfo {
            namespace: ns.into(),
            name: name.into(),
            ips: ips.iter().map(|s| ip(s)).collect(),
        };
        // Two pods of one namespace with the same IP (hostNetwork), one in another namespace.
        assert!(idx.upsert_pod(pod("a", "h1", &["10.0.0.1"])));
        assert!(idx.upsert_pod(pod("a", "h2", &["10.0.0.1"])));
        assert!(idx.upsert_pod(pod("b", "d", &["10.0.0.2", "fd00::2"])));
        assert!(
            !idx.upsert_pod(pod("b", "d", &["10.0.0.2", "fd00::2"])),
            "no-op"
        );
        assert!(idx.pod_exists("a", &ip("10.0.0.1")));
        assert!(!idx.pod_exists("b", &ip("10.0.0.1")));
        assert!(idx.pod_exists("b", &ip("fd00::2")));
        assert!(!idx.pod_exists("nowhere", &ip("10.0.0.2")));
        assert!(idx.delete_pod("a", "h1"));
        assert!(idx.pod_exists("a", &ip("10.0.0.1")), "h2 still has it");
        assert!(idx.delete_pod("a", "h2"));
        assert!(!idx.pod_exists("a", &ip("10.0.0.1")));
        assert!(!idx.delete_pod("a", "h2"));
        assert!(!idx.delete_pod("zz", "h2"));
        let mut all: Vec<PodInfo> = idx.pods().collect();
        all.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(all, vec![pod("b", "d", &["10.0.0.2", "fd00::2"])]);
        assert!(idx.upsert_pod(pod("b", "d", &["10.0.0.3"])));
        assert!(!idx.pod_exists("b", &ip("fd00::2")));
        assert!(idx.delete_pod("b", "d"));
        assert!(idx.pod_ips.is_empty() && idx.pods.is_empty());
    }
}
