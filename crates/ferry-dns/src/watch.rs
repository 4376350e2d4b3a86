//! Feeding the index from the API server: projections of the Kubernetes objects and `kube`
//! watchers. On errors the watchers back off and retry while the index keeps serving the last
//! state (serve-stale).

use std::collections::HashSet;
use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::index::*;
use crate::metrics::Metrics;
use crate::server::SharedIndex;

/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p > 0)
}

/// Projects a Service to what DNS needs.
pub fn project_service(s: &Service) -> Option<ServiceInfo> {
    let namespace = s.metadata.namespace.clone()?;
    let name = s.metadata.name.clone()?;
    let spec = s.spec.as_ref()?;
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let target = spec.external_name.as_deref().unwrap_or_default();
        ServiceKind::ExternalName(target.trim_end_matches('.').to_ascii_lowercase())
    } else if spec.cluster_ip.as_deref() == Some("None") {
        ServiceKind::Headless
    } else {
        let mut ips: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        ips.shrink_to_fit();
        ServiceKind::ClusterIp(ips)
    };
    // `collect` through a filter starts at four elements: kept for the life of the Service,
    // the exact size is ~170 bytes less per one-port Service (1.7 MB at 10,000 Services).
    let mut ports: Vec<PortInfo> = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(PortInfo {
                name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: port_u16(p.port)?,
            })
        })
        .collect();
    ports.shrink_to_fit();
    Some(ServiceInfo {
        namespace,
        name,
        kind,
        ports,
        publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
    })
}

/// Projects an EndpointSlice (None if it has no service-name label).
pub fn project_slice(s: &EndpointSlice) -> Option<SliceInfo> {
    let namespace = s.metadata.namespace.clone()?;
    let name = s.metadata.name.clone()?;
    let service = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
    let mut endpoints = Vec::new();
    for ep in s.endpoints.iter().flatten() {
        // A nil "ready" condition means unknown, to be interpreted as ready.
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        for addr in &ep.addresses {
            if let Ok(ip) = addr.parse::<IpAddr>() {
                endpoints.push(EndpointInfo {
                    ip,
                    hostname: ep.hostname.clone(),
                    ready,
                });
            }
        }
    }
    let mut ports: Vec<PortInfo> = s
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(PortInfo {
                name: p.name.clone().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: port_u16(p.port?)?,
            })
        })
        .collect();
    endpoints.shrink_to_fit();
    ports.shrink_to_fit();
    Some(SliceInfo {
        namespace,
        name,
        service,
        endpoints,
        ports,
    })
}

/// Projects a Pod to its IPs.
pub fn project_pod(p: &Pod) -> Option<PodInfo> {
    let namespace = p.metadata.namespace.clone()?;
    let name = p.metadata.name.clone()?;
    let status = p.status.as_ref();
    let mut ips: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|i| i.parse().ok())
    {
        ips.push(ip);
    }
    Some(PodInfo {
        namespace,
        name,
        ips,
    })
}

/// A Pod as DNS watches it: decoding keeps only the name, namespace, resourceVersion and the pod
/// IPs, and skips everything else (spec, labels, annotations, managedFields, conditions...), as
/// CoreDNS's kubernetes plugin keeps slim objects. At 150,000 pods this is most of the decode
/// time and memory of a full `k8s_openapi` Pod.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "SlimPodWire")]
pub struct SlimPod {
    /// Only `name`, `namespace` and `resourceVersion` are set.
    pub metadata: ObjectMeta,
    /// `status.podIPs`, else `status.podIP`.
    pub ips: Vec<IpAddr>,
}

#[derive(Deserialize)]
struct SlimMetaWire {
    name: Option<String>,
    namespace: Option<String>,
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct SlimPodIpWire {
    ip: String,
}

#[derive(Deserialize)]
struct SlimPodStatusWire {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<SlimPodIpWire>>,
}

#[derive(Deserialize)]
struct SlimPodWire {
    metadata: SlimMetaWire,
    status: Option<SlimPodStatusWire>,
}

impl From<SlimPodWire> for SlimPod {
    fn from(w: SlimPodWire) -> Self {
        let mut ips: Vec<IpAddr> = Vec::new();
        let mut pod_ip = None;
        if let Some(st) = w.status {
            ips = st
                .pod_ips
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.parse().ok())
                .collect();
            pod_ip = st.pod_ip;
        }
        if ips.is_empty()
            && let Some(ip) = pod_ip.as_deref().and_then(|i| i.parse().ok())
        {
            ips.push(ip);
        }
        SlimPod {
            metadata: ObjectMeta {
                name: w.metadata.name,
                namespace: w.metadata.namespace,
                resource_version: w.metadata.resource_version,
                ..ObjectMeta::default()
            },
            ips,
        }
    }
}

ferry_kubeclient::pod_resource!(SlimPod);

/// Projects a slim Pod to its IPs (the same result as [`project_pod`] on the full Pod).
pub fn project_slim_pod(p: &SlimPod) -> Option<PodInfo> {
    Some(PodInfo {
        namespace: p.metadata.namespace.clone()?,
        name: p.metadata.name.clone()?,
        ips: p.ips.clone(),
    })
}

/// How one watched kind maps onto the index.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    const KIND: &'static str;
    fn key(&self) -> Option<(String, String)> {
        Some((self.meta().namespace.clone()?, self.meta().name.clone()?))
    }
    fn upsert(&self, idx: &mut Index) -> bool;
    fn remove(idx: &mut Index, ns: &str, name: &str) -> bool;
    /// The keys of this kind in the index: what a (re)list compares the keys it saw with.
    /// Kinds whose index marks what a (re)list saw itself ([`Watched::INDEX_TRACKS_RELIST`])
    /// keep the default (the pod index does not even keep names).
    fn keys(_idx: &Index) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether the index itself marks what a (re)list saw ([`Watched::relist_begin`] /
    /// [`Watched::relist_end`]) instead of [`apply_event`] collecting every key: for Pods,
    /// where 150,000 key pairs would be the largest allocation of a relist.
    const INDEX_TRACKS_RELIST: bool = false;
    fn relist_begin(_idx: &mut Index) {}
    /// Removes what the (re)list did not see; returns whether anything changed.
    fn relist_end(_idx: &mut Index) -> bool {
        false
    }
}

impl Watched for Service {
    const KIND: &'static str = "Service";
    fn upsert(&self, idx: &mut Index) -> bool {
        match project_service(self) {
            Some(s) => idx.upsert_service(s),
            None => self
                .key()
                .is_some_and(|(ns, n)| idx.delete_service(&ns, &n)),
        }
    }
    fn remove(idx: &mut Index, ns: &str, name: &str) -> bool {
        idx.delete_service(ns, name)
    }
    fn keys(idx: &Index) -> Vec<(String, String)> {
        idx.services()
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect()
    }
}

impl Watched for EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    fn upsert(&self, idx: &mut Index) -> bool {
        match project_slice(self) {
            Some(s) => idx.upsert_slice(s),
            None => self.key().is_some_and(|(ns, n)| idx.delete_slice(&ns, &n)),
        }
    }
    fn remove(idx: &mut Index, ns: &str, name: &str) -> bool {
        idx.delete_slice(ns, name)
    }
    fn keys(idx: &Index) -> Vec<(String, String)> {
        idx.slices()
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect()
    }
}

impl Watched for SlimPod {
    const KIND: &'static str = "Pod";
    fn upsert(&self, idx: &mut Index) -> bool {
        match project_slim_pod(self) {
            Some(p) => idx.upsert_pod(p),
            None => false,
        }
    }
    fn remove(idx: &mut Index, ns: &str, name: &str) -> bool {
        idx.delete_pod(ns, name)
    }
    const INDEX_TRACKS_RELIST: bool = true;
    fn relist_begin(idx: &mut Index) {
        idx.begin_pod_relist()
    }
    fn relist_end(idx: &mut Index) -> bool {
        idx.end_pod_relist()
    }
}

/// Applies one watch event. `relist` collects the keys seen during a (re)list, so that objects
/// that disappeared while we were disconnected are removed at `InitDone`. Returns true at
/// `InitDone`.
pub fn apply_event<K: Watched>(
    shared: &SharedIndex,
    metrics: &Metrics,
    relist: &mut Option<HashSet<(String, String)>>,
    ev: Event<K>,
) -> bool {
    let start = Instant::now();
    let changed = match ev {
        Event::Init => {
            *relist = Some(HashSet::new());
            if K::INDEX_TRACKS_RELIST {
                shared.update(K::relist_begin);
            }
            false
        }
        Event::InitApply(obj) => {
            if !K::INDEX_TRACKS_RELIST
                && let (Some(seen), Some(k)) = (relist.as_mut(), obj.key())
            {
                seen.insert(k);
            }
            shared.update(|idx| obj.upsert(idx))
        }
        Event::InitDone if K::INDEX_TRACKS_RELIST => {
            *relist = None;
            shared.update(K::relist_end);
            return true;
        }
        Event::InitDone => {
            let seen = relist.take().unwrap_or_default();
            shared.update(|idx| {
                let stale: Vec<_> = K::keys(idx)
                    .into_iter()
                    .filter(|k| !seen.contains(k))
                    .collect();
                let mut changed = false;
                for (ns, name) in stale {
                    changed |= K::remove(idx, &ns, &name);
                }
                changed
            });
            return true;
        }
        Event::Apply(obj) => shared.update(|idx| obj.upsert(idx)),
        Event::Delete(obj) => match obj.key() {
            Some((ns, name)) => shared.update(|idx| K::remove(idx, &ns, &name)),
            None => false,
        },
    };
    if changed && relist.is_none() {
        metrics
            .programming_latency
            .observe(start.elapsed().as_secs_f64());
    }
    false
}

/// A watcher that syncs with one streaming list and falls back to paged lists when the server
/// refuses it ([`ferry_kubeclient::watch::stream`]).
pub fn watch_stream<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
) -> futures::stream::BoxStream<'static, watcher::Result<Event<K>>>
where
    K::DynamicType: Default,
{
    ferry_kubeclient::watch::stream(api, config, K::KIND)
}

/// Watches one kind forever, feeding the index. Calls `on_synced` after the first full list.
pub async fn watch_kind<K: Watched>(
    api: Api<K>,
    shared: Arc<SharedIndex>,
    metrics: Arc<Metrics>,
    on_synced: tokio::sync::mpsc::Sender<&'static str>,
) {
    let mut stream = watch_stream(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut relist = None;
    let mut synced = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                if apply_event(&shared, &metrics, &mut relist, ev) && !synced {
                    synced = true;
                    let _ = on_synced.send(K::KIND).await;
                }
            }
            Err(e) => {
                // Keep serving the last index; the watcher retries with backoff.
                tracing::warn!(kind = K::KIND, error = %e, "watch failed; serving stale index");
            }
        }
    }
}

/// Starts the watchers; marks the index ready once every one has synced.
pub fn spawn_watchers(
    client: Client,
    shared: Arc<SharedIndex>,
    metrics: Arc<Metrics>,
    pods: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let mut tasks = vec![
        tokio::spawn(watch_kind::<Service>(
            Api::all(client.clone()),
            shared.clone(),
            metrics.clone(),
            tx.clone(),
        )),
        tokio::spawn(watch_kind::<EndpointSlice>(
            Api::all(client.clone()),
            shared.clone(),
            metrics.clone(),
            tx.clone(),
        )),
    ];
    let mut want = 2;
    if pods {
        tasks.push(tokio::spawn(watch_kind::<SlimPod>(
            Api::all(client),
            shared.clone(),
            metrics.clone(),
            tx,
        )));
        want += 1;
    }
    tasks.push(tokio::spawn(async move {
        let mut n = 0;
        while let Some(kind) = rx.recv().await {
            tracing::info!(kind, "dns index synced");
            n += 1;
            if n == want {
                shared.set_ready();
                metrics.ready.set(1);
                break;
            }
        }
    }));
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn projections() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"],
                     "ports": [{"name": "HTTP", "port": 80}, {"port": 81, "protocol": "UDP"}]}
        }))
        .unwrap();
        let p = project_service(&svc).unwrap();
        assert_eq!(
            p.kind,
            ServiceKind::ClusterIp(vec![
                "10.96.0.1".parse().unwrap(),
                "fd00::1".parse().unwrap()
            ])
        );
        assert_eq!(
            p.ports[0],
            PortInfo {
                name: "http".into(),
                protocol: "tcp".into(),
                port: 80
            }
        );
        assert_eq!(p.ports[1].protocol, "udp");

        let ext: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "e"},
            "spec": {"type": "ExternalName", "externalName": "Example.COM."}
        }))
        .unwrap();
        assert_eq!(
            project_service(&ext).unwrap().kind,
            ServiceKind::ExternalName("example.com".into())
        );

        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "hostname": "a", "conditions": {"ready": false}},
                {"addresses": ["10.0.0.2"]}
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap();
        let s = project_slice(&slice).unwrap();
        assert_eq!(s.service, "web");
        assert!(!s.endpoints[0].ready && s.endpoints[1].ready);
        assert_eq!(s.endpoints[0].hostname.as_deref(), Some("a"));
        assert_eq!(s.ports[0].port, 8080);

        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "p"},
            "status": {"podIP": "10.244.0.1", "podIPs": [{"ip": "10.244.0.1"}, {"ip": "fd00::5"}]}
        }))
        .unwrap();
        assert_eq!(project_pod(&pod).unwrap().ips.len(), 2);
    }

    /// The slim Pod decodes real objects to the same projection as the full k8s-openapi Pod.
    #[test]
    fn slim_pod_matches_full_projection() {
        let fixtures = [
            // A kubelet-written pod as the API server returns it.
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-0", "namespace": "shop", "uid": "8f6a04b9-289e-4b25-81a9-65965d31310d",
                    "resourceVersion": "262", "generation": 1, "creationTimestamp": "2026-11-24T06:40:59Z",
                    "labels": {"app": "web"}, "annotations": {"a": "b"},
                    "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "ports": [{"containerPort": 80}], "resources": {"limits": {"cpu": "1"}}}],
                    "nodeName": "n1", "dnsPolicy": "ClusterFirst", "restartPolicy": "Always"},
                "status": {"phase": "Running", "podIP": "10.244.1.5",
                    "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::1:5"}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                        "image": "pause", "imageID": "", "state": {"running": {"startedAt": "2026-11-24T06:41:00Z"}}}]}
            }),
            // Only the legacy podIP.
            json!({"metadata": {"name": "old", "namespace": "ns"}, "status": {"podIP": "10.0.0.9"}}),
            // Pending: no status, no IPs.
            json!({"metadata": {"name": "pending", "namespace": "ns"}, "spec": {"containers": []}}),
            // Unparsable IPs are skipped in both.
            json!({"metadata": {"name": "bad", "namespace": "ns"},
                   "status": {"podIP": "nope", "podIPs": [{"ip": "nope"}]}}),
            // No namespace: no projection.
            json!({"metadata": {"name": "cluster"}}),
        ];
        for f in fixtures {
            let full: Pod = serde_json::from_value(f.clone()).unwrap();
            let slim: SlimPod = serde_json::from_value(f.clone()).unwrap();
            assert_eq!(project_pod(&full), project_slim_pod(&slim), "{f}");
            assert_eq!(slim.meta().resource_version, full.metadata.resource_version);
            assert!(slim.meta().labels.is_none() && slim.meta().managed_fields.is_none());
        }
        // Watch events carry the slim type too.
        let ev: kube::core::WatchEvent<SlimPod> = serde_json::from_value(json!({
            "type": "ADDED",
            "object": {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"},
                       "status": {"podIPs": [{"ip": "10.1.2.3"}]}}
        }))
        .unwrap();
        let kube::core::WatchEvent::Added(p) = ev else {
            panic!("not Added")
        };
        assert_eq!(p.ips, vec!["10.1.2.3".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            SlimPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }

    #[test]
    fn relist_removes_vanished_objects() {
        let shared = SharedIndex::new(Index::new(ZoneConfig::default()));
        let m = Metrics::new();
        let mk = |name: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"clusterIP": "10.96.0.1"}
            }))
            .unwrap()
        };
        let mut relist = None;
        apply_event(&shared, &m, &mut relist, Event::Apply(mk("a")));
        apply_event(&shared, &m, &mut relist, Event::Apply(mk("b")));
        // Reconnect: only "b" still exists.
        apply_event::<Service>(&shared, &m, &mut relist, Event::Init);
        apply_event(&shared, &m, &mut relist, Event::InitApply(mk("b")));
        // Until InitDone, the old index keeps serving "a" (serve-stale).
        assert!(shared.read().name("a.ns.svc.cluster.local").is_some());
        assert!(apply_event::<Service>(
            &shared,
            &m,
            &mut relist,
            Event::InitDone
        ));
        assert!(shared.read().name("a.ns.svc.cluster.local").is_none());
        assert!(shared.read().name("b.ns.svc.cluster.local").is_some());
        apply_event(&shared, &m, &mut relist, Event::Delete(mk("b")));
        assert_eq!(shared.read().service_count(), 0);
    }

    #[test]
    fn pod_relist_removes_vanished_pods_and_keeps_serving_until_done() {
        let shared = SharedIndex::new(Index::new(ZoneConfig::default()));
        let m = Metrics::new();
        let mk = |ns: &str, name: &str, ip: &str| -> SlimPod {
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name},
                "status": {"podIPs": [{"ip": ip}]}
            }))
            .unwrap()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut relist = None;
        apply_event::<SlimPod>(&shared, &m, &mut relist, Event::Init);
        for (ns, n, i) in [
            ("a", "p1", "10.0.0.1"),
            ("a", "p2", "10.0.0.2"),
            ("b", "p1", "10.0.0.3"),
        ] {
            apply_event(&shared, &m, &mut relist, Event::InitApply(mk(ns, n, i)));
        }
        assert!(apply_event::<SlimPod>(
            &shared,
            &m,
            &mut relist,
            Event::InitDone
        ));
        assert_eq!(shared.read().pod_count(), 3);
        // Reconnect: a/p2 is gone, b/p1 moved to another IP, a/p3 is new.
        apply_event::<SlimPod>(&shared, &m, &mut relist, Event::Init);
        apply_event(
            &shared,
            &m,
            &mut relist,
            Event::InitApply(mk("a", "p1", "10.0.0.1")),
        );
        apply_event(
            &shared,
            &m,
            &mut relist,
            Event::InitApply(mk("b", "p1", "10.0.0.9")),
        );
        apply_event(
            &shared,
            &m,
            &mut relist,
            Event::InitApply(mk("a", "p3", "10.0.0.4")),
        );
        // Serve-stale until InitDone.
        assert!(shared.read().pod_exists("a", &ip("10.0.0.2")));
        assert!(apply_event::<SlimPod>(
            &shared,
            &m,
            &mut relist,
            Event::InitDone
        ));
        let idx = shared.read();
        assert_eq!(idx.pod_count(), 3);
        assert!(!idx.pod_exists("a", &ip("10.0.0.2")));
        assert!(idx.pod_exists("a", &ip("10.0.0.1")));
        assert!(idx.pod_exists("a", &ip("10.0.0.4")));
        assert!(idx.pod_exists("b", &ip("10.0.0.9")));
        assert!(!idx.pod_exists("b", &ip("10.0.0.3")));
        drop(idx);
        // A second relist that sees everything removes nothing.
        apply_event::<SlimPod>(&shared, &m, &mut relist, Event::Init);
        for (ns, n, i) in [
            ("a", "p1", "10.0.0.1"),
            ("b", "p1", "10.0.0.9"),
            ("a", "p3", "10.0.0.4"),
        ] {
            apply_event(&shared, &m, &mut relist, Event::InitApply(mk(ns, n, i)));
        }
        apply_event::<SlimPod>(&shared, &m, &mut relist, Event::InitDone);
        assert_eq!(shared.read().pod_count(), 3);
    }
}
