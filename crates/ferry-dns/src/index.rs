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

/// One pod in 8 bytes (24 with its key in the map): its first address inline when that is
/// IPv4 (the usual single-stack pod), its namespace id and two flags. Any other addresses live
/// in a side map ([`Index`]'s `pod_more`), keyed like the pod, so the common entry carries no
/// pointer. At 150,000 pods the map has 262,144 buckets of 25 bytes (6.5 MB) instead of 49.
#[derive(Debug, Clone, Copy)]
struct PodEntry {
    /// The first address when it is IPv4, as `u32`; 0 when it is not (0.0.0.0 is never a
    /// pod's address).
    v4: u32,
    /// The namespace id (the low 30 bits), [`POD_SEEN`] and [`POD_MORE`].
    meta: u32,
}

/// Set on the pods the current (re)list has seen; cleared on every pod when one starts.
const POD_SEEN: u32 = 1 << 31;
/// The pod has addresses after the inline one (all of them when there is none) in `pod_more`.
const POD_MORE: u32 = 1 << 30;
/// Namespace ids are sequential per namespace ever seen: 2^30 of them would take the
/// interning map alone past 16 GB, so the two flag bits never meet a real id.
const POD_NS: u32 = POD_MORE - 1;

impl PodEntry {
    fn ns(&self) -> u32 {
        self.meta & POD_NS
    }
}

/// A pod's addresses in order: the inline IPv4 one, then the side-map ones.
fn pod_entry_ips<'a>(
    e: &PodEntry,
    more: Option<&'a [IpAddr]>,
) -> impl Iterator<Item = IpAddr> + 'a {
    let first = (e.v4 != 0).then(|| IpAddr::V4(e.v4.into()));
    first.into_iter().chain(more.into_iter().flatten().copied())
}

/// A pod's key: a 128-bit keyed hash of (namespace, name) under this process's random keys,
/// instead of the name itself (at 150,000 pods the names and their allocations were a third
/// of the index). Two pods colliding would need a 2^-128 chance per pair (~10^-28 here), and
/// the keys are unknown outside the process. Two `u64`s rather than a `u128`: 8-byte
/// alignment keeps a map entry at 24 bytes instead of 32.
type PodKey = [u64; 2];

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
    /// Namespaces of pods, interned: name -> id (never shrinks; one entry per namespace ever
    /// seen with a pod).
    ns_ids: HashMap<Box<str>, u32>,
    /// (pod IPv4 address, namespace id) -> how many pods of that namespace have it (12 bytes
    /// an entry), and the same for other addresses.
    pod_v4: HashMap<(u32, u32), u32>,
    pod_ips: HashMap<(IpAddr, u32), u32>,
    pods: HashMap<PodKey, PodEntry>,
    /// The addresses of the pods flagged [`POD_MORE`] after their inline one.
    pod_more: HashMap<PodKey, Box<[IpAddr]>>,
    pod_hash: (std::hash::RandomState, std::hash::RandomState),
    /// A pod (re)list is under way: upserts flag what they see; pods left unflagged at its
    /// end are removed.
    pod_relisting: bool,
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
            ns_ids: HashMap::new(),
            pod_v4: HashMap::new(),
            pod_ips: HashMap::new(),
            pod_hash: Default::default(),
            pods: HashMap::new(),
            pod_more: HashMap::new(),
            pod_relisting: false,
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
        let Some(id) = self.ns_ids.get(ns).copied() else {
            return false;
        };
        match ip {
            IpAddr::V4(a) if !a.is_unspecified() => self.pod_v4.contains_key(&(u32::from(*a), id)),
            _ => self.pod_ips.contains_key(&(*ip, id)),
        }
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
        let id = self.ns_ids.len() as u32;
        self.ns_ids.insert(ns.into(), id);
        id
    }

    fn pod_key(&self, ns: u32, name: &str) -> PodKey {
        use std::hash::BuildHasher;
        let (a, b) = &self.pod_hash;
        [a.hash_one((ns, name)), b.hash_one((ns, name))]
    }

    pub fn upsert_pod(&mut self, pod: PodInfo) -> bool {
        let ns = self.ns_id(&pod.namespace);
        let key = self.pod_key(ns, &pod.name);
        let seen = if self.pod_relisting { POD_SEEN } else { 0 };
        if let Some(e) = self.pods.get_mut(&key) {
            e.meta |= seen;
            let more = self.pod_more.get(&key).map(|m| &m[..]);
            if pod_entry_ips(e, more).eq(pod.ips.iter().copied()) {
                return false;
            }
        }
        self.remove_pod_ips(key);
        for ip in &pod.ips {
            match ip {
                IpAddr::V4(a) if !a.is_unspecified() => {
                    *self.pod_v4.entry((u32::from(*a), ns)).or_default() += 1
                }
                _ => *self.pod_ips.entry((*ip, ns)).or_default() += 1,
            }
        }
        let (v4, rest) = match pod.ips.split_first() {
            Some((IpAddr::V4(a), rest)) if !a.is_unspecified() => (u32::from(*a), rest),
            _ => (0, &pod.ips[..]),
        };
        let mut meta = (ns & POD_NS) | seen;
        if !rest.is_empty() {
            meta |= POD_MORE;
            self.pod_more.insert(key, rest.into());
        }
        self.pods.insert(key, PodEntry { v4, meta });
        self.touch();
        true
    }

    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> bool {
        let Some(ns) = self.ns_ids.get(namespace).copied() else {
            return false;
        };
        let key = self.pod_key(ns, name);
        if !self.pods.contains_key(&key) {
            return false;
        }
        self.remove_pod_ips(key);
        self.touch();
        true
    }

    /// Starts a (re)list of pods: [`Index::upsert_pod`] flags what it sees until
    /// [`Index::end_pod_relist`] removes the pods it did not see. A relist that starts over
    /// (the watch failed during the list) clears the flags of the interrupted one.
    pub fn begin_pod_relist(&mut self) {
        for e in self.pods.values_mut() {
            e.meta &= !POD_SEEN;
        }
        self.pod_relisting = true;
    }

    /// Ends a pod (re)list: removes the pods it did not see. Returns whether any went.
    pub fn end_pod_relist(&mut self) -> bool {
        self.pod_relisting = false;
        let stale: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(_, e)| e.meta & POD_SEEN == 0)
            .map(|(k, _)| *k)
            .collect();
        for k in &stale {
            self.remove_pod_ips(*k);
        }
        if !stale.is_empty() {
            self.touch();
        }
        // Give back what a larger cluster needed.
        self.pods.shrink_to_fit();
        self.pod_more.shrink_to_fit();
        self.pod_v4.shrink_to_fit();
        self.pod_ips.shrink_to_fit();
        !stale.is_empty()
    }

    /// Removes a pod and its address counts.
    fn remove_pod_ips(&mut self, key: PodKey) {
        let Some(e) = self.pods.remove(&key) else {
            return;
        };
        let more = if e.meta & POD_MORE != 0 {
            self.pod_more.remove(&key)
        } else {
            None
        };
        fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u32>, k: K) {
            if let Some(n) = m.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }
        let ns = e.ns();
        for ip in pod_entry_ips(&e, more.as_deref()) {
            match ip {
                IpAddr::V4(a) if !a.is_unspecified() => dec(&mut self.pod_v4, (u32::from(a), ns)),
                _ => dec(&mut self.pod_ips, (ip, ns)),
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
        let (names, mut ptrs) = match &st.svc {
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
        // Kept for the life of the Service: exact sizes, not `push`'s first four elements
        // (at 10,000 Services that slack was ~2.5 MB).
        for (n, mut data) in names {
            data.addrs.shrink_to_fit();
            data.srv.shrink_to_fit();
            self.add_ents(&n);
            self.names.insert(n.clone(), data);
            owned_names.push(n);
        }
        ptrs.shrink_to_fit();
        for (ip, n) in &ptrs {
            let v = self.ptr.entry(*ip).or_default();
            v.reserve_exact(1);
            v.push(n.clone());
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
        assert_eq!(idx.pod_count(), 1);
        assert!(idx.upsert_pod(pod("b", "d", &["10.0.0.3"])));
        assert!(!idx.pod_exists("b", &ip("fd00::2")));
        assert!(idx.delete_pod("b", "d"));
        assert!(idx.pod_ips.is_empty() && idx.pod_v4.is_empty() && idx.pods.is_empty());
        // IPv6-first dual-stack and an unspecified address keep their order and identity.
        for ips in [&["fd00::9", "10.0.0.9"][..], &["0.0.0.0", "10.0.0.8"][..]] {
            assert!(idx.upsert_pod(pod("c", "x", ips)));
            assert!(!idx.upsert_pod(pod("c", "x", ips)), "no-op for {ips:?}");
            for i in ips {
                assert!(idx.pod_exists("c", &ip(i)), "{i}");
            }
        }
        assert!(!idx.pod_exists("c", &ip("fd00::9")), "replaced");
        assert!(idx.delete_pod("c", "x"));
        assert!(idx.pod_ips.is_empty() && idx.pod_v4.is_empty() && idx.pods.is_empty());
        assert!(
            idx.pod_more.is_empty(),
            "side-map addresses go with their pod"
        );
    }

    /// A map entry of the pod index stays at 24 bytes (the 150,000-pod RSS budget).
    #[test]
    fn pod_entry_layout() {
        assert_eq!(std::mem::size_of::<(PodKey, PodEntry)>(), 24);
    }

    /// A relist that starts over before its end (the watch failed mid-list) removes what the
    /// new one does not see, even pods the interrupted one had seen.
    #[test]
    fn interrupted_pod_relist() {
        let mut idx = Index::new(ZoneConfig::default());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let pod = |name: &str, ips: &[&str]| PodInfo {
            namespace: "a".into(),
            name: name.into(),
            ips: ips.iter().map(|s| ip(s)).collect(),
        };
        idx.begin_pod_relist();
        idx.upsert_pod(pod("p1", &["10.0.0.1"]));
        idx.upsert_pod(pod("p2", &["fd00::2", "10.0.0.2"]));
        idx.upsert_pod(pod("p3", &["10.0.0.3"]));
        assert!(!idx.end_pod_relist());
        // Relist 1 sees p1 and p2, then the watch fails; relist 2 sees only p3.
        idx.begin_pod_relist();
        idx.upsert_pod(pod("p1", &["10.0.0.1"]));
        idx.upsert_pod(pod("p2", &["fd00::2", "10.0.0.2"]));
        idx.begin_pod_relist();
        idx.upsert_pod(pod("p3", &["10.0.0.3"]));
        assert!(idx.end_pod_relist());
        assert_eq!(idx.pod_count(), 1);
        assert!(idx.pod_exists("a", &ip("10.0.0.3")));
        for gone in ["10.0.0.1", "10.0.0.2", "fd00::2"] {
            assert!(!idx.pod_exists("a", &ip(gone)), "{gone}");
        }
        assert!(idx.pod_more.is_empty() && idx.pod_ips.is_empty());
        idx.upsert_pod(pod("p4", &["10.0.0.4"]));
        idx.begin_pod_relist();
        idx.upsert_pod(pod("p3", &["10.0.0.3"]));
        assert!(
            idx.end_pod_relist(),
            "p4, added between relists, was not seen"
        );
        assert_eq!(idx.pod_count(), 1);
    }
}
