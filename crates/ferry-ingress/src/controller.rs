//! The controller: kube-rs reflectors of Ingresses, IngressClasses, Services, EndpointSlices
//! and TLS Secrets (each object reduced to the fields the tables read before it is stored);
//! one coalescing loop rebuilds the route and certificate tables from them (with the Services
//! and EndpointSlices the Ingresses name), swaps them into the proxy, writes
//! `status.loadBalancer` and records Events.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use rustls::sign::CertifiedKey;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::proxy::Shared;
use crate::routes::{self, ClassPolicy, Inputs, Key, Problem, TlsBinding};
use crate::tls;

const COMPONENT: &str = "ferry-ingress";

/// What the controller needs besides the cluster's objects.
pub struct Settings {
    pub policy: ClassPolicy,
    /// The addresses written to `status.loadBalancer.ingress` (IPs or host names); none: no
    /// status is written.
    pub publish: Vec<String>,
    /// `namespace/name` of a Secret serving names no Ingress covers.
    pub default_certificate: Option<Key>,
    pub fallback_cert: Arc<CertifiedKey>,
    pub min_sync: Duration,
}

/// A store of `api`'s objects, each reduced by `slim` before it is kept, synced with one
/// streaming list (paged lists when the server refuses it).
fn spawn_reflector<K>(
    api: Api<K>,
    cfg: watcher::Config,
    slim: fn(&mut K),
    notify: Arc<Notify>,
    stop: CancellationToken,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = format!("ingress {}", K::kind(&()));
    let watch = ferry_kubeclient::watch::stream(api, cfg, kind).modify(slim);
    let stream = reflector::reflector(writer, watch).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                ev = stream.next() => match ev {
                    Some(Ok(_)) => notify.notify_one(),
                    Some(Err(e)) => tracing::debug!("ingress watch: {e}"),
                    None => break,
                }
            }
        }
    });
    reader
}

fn key<K: ResourceExt>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

/// What no store keeps: `managedFields` and kubectl's copy of the applied object.
fn slim_meta(m: &mut ObjectMeta) {
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            m.annotations = None;
        }
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn slim_ingress(i: &mut Ingress) {
    slim_meta(&mut i.metadata);
}

fn slim_class(c: &mut IngressClass) {
    slim_meta(&mut c.metadata);
}

/// A Service as the route table reads it: name, namespace, type and ports.
fn slim_service(s: &mut Service) {
    s.metadata = ObjectMeta {
        name: s.metadata.name.take(),
        namespace: s.metadata.namespace.take(),
        resource_version: s.metadata.resource_version.take(),
        ..ObjectMeta::default()
    };
    s.status = None;
    if let Some(spec) = s.spec.take() {
        s.spec = Some(ServiceSpec {
            type_: spec.type_,
            ports: spec.ports,
            ..ServiceSpec::default()
        });
    }
}

/// An EndpointSlice as the route table reads it: its Service, ports, and each endpoint's
/// addresses and readiness.
fn slim_slice(s: &mut EndpointSlice) {
    let service = s
        .metadata
        .labels
        .as_mut()
        .and_then(|l| l.remove(SERVICE_NAME_LABEL));
    s.metadata = ObjectMeta {
        name: s.metadata.name.take(),
        namespace: s.metadata.namespace.take(),
        resource_version: s.metadata.resource_version.take(),
        labels: service.map(|v| [(SERVICE_NAME_LABEL.to_string(), v)].into()),
        ..ObjectMeta::default()
    };
    for ep in s.endpoints.iter_mut().flatten() {
        *ep = Endpoint {
            addresses: std::mem::take(&mut ep.addresses),
            conditions: ep.conditions.take(),
            ..Endpoint::default()
        };
    }
}

/// A TLS Secret as the certificate table reads it: `tls.crt` and `tls.key`.
fn slim_secret(s: &mut Secret) {
    slim_meta(&mut s.metadata);
    s.metadata.labels = None;
    s.metadata.annotations = None;
    s.string_data = None;
    if let Some(d) = s.data.as_mut() {
        d.retain(|k, _| k == "tls.crt" || k == "tls.key");
    }
}

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Services the Ingresses name (default backends and rule backends, in the Ingress's
/// namespace): the only ones the route table looks up.
fn referenced_services<'a>(ingresses: impl IntoIterator<Item = &'a Ingress>) -> BTreeSet<Key> {
    let mut out = BTreeSet::new();
    for ing in ingresses {
        let ns = ing.namespace().unwrap_or_default();
        let Some(spec) = ing.spec.as_ref() else {
            continue;
        };
        let rules = spec.rules.iter().flatten();
        let paths = rules
            .filter_map(|r| r.http.as_ref())
            .flat_map(|h| h.paths.iter().map(|p| &p.backend));
        for b in spec.default_backend.iter().chain(paths) {
            if let Some(svc) = &b.service {
                out.insert((ns.clone(), svc.name.clone()));
            }
        }
    }
    out
}

struct Stores {
    ingresses: Store<Ingress>,
    classes: Store<IngressClass>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
}

impl Stores {
    /// The route table's inputs: every Ingress and IngressClass, and of the Services and
    /// EndpointSlices (10,000s in a large cluster) only those of Services an Ingress names.
    fn inputs(&self) -> (Inputs, BTreeMap<Key, Secret>) {
        let mut i = Inputs {
            ingresses: self
                .ingresses
                .state()
                .iter()
                .map(|o| (**o).clone())
                .collect(),
            classes: self.classes.state().iter().map(|o| (**o).clone()).collect(),
            ..Default::default()
        };
        let wanted = referenced_services(&i.ingresses);
        for k in &wanted {
            let r = ObjectRef::new(&k.1).within(&k.0);
            if let Some(s) = self.services.get(&r) {
                i.services.insert(k.clone(), (*s).clone());
            }
        }
        for s in self.slices.state() {
            let Some(svc) = s.labels().get(SERVICE_NAME_LABEL) else {
                continue;
            };
            let k = (s.namespace().unwrap_or_default(), svc.clone());
            if wanted.contains(&k) {
                i.slices.entry(k).or_default().push((*s).clone());
            }
        }
        let secrets = self
            .secrets
            .state()
            .iter()
            .map(|s| (key(s.as_ref()), (**s).clone()))
            .collect();
        (i, secrets)
    }
}

/// Runs until `stop`: watches, rebuilds, swaps.
pub async fn run(
    client: Client,
    shared: Arc<Shared>,
    resolver: Arc<tls::Resolver>,
    settings: Settings,
    stop: CancellationToken,
) {
    let notify = Arc::new(Notify::new());
    let all = watcher::Config::default;
    let stores = Stores {
        ingresses: spawn_reflector(
            Api::all(client.clone()),
            all(),
            slim_ingress,
            notify.clone(),
            stop.clone(),
        ),
        classes: spawn_reflector(
            Api::all(client.clone()),
            all(),
            slim_class,
            notify.clone(),
            stop.clone(),
        ),
        services: spawn_reflector(
            Api::all(client.clone()),
            all(),
            slim_service,
            notify.clone(),
            stop.clone(),
        ),
        slices: spawn_reflector(
            Api::all(client.clone()),
            all(),
            slim_slice,
            notify.clone(),
            stop.clone(),
        ),
        secrets: spawn_reflector(
            Api::all(client.clone()),
            all().fields("type=kubernetes.io/tls"),
            slim_secret,
            notify.clone(),
            stop.clone(),
        ),
    };
    // Wait for every first list so that the first table is complete.
    let ready = async {
        let _ = stores.ingresses.wait_until_ready().await;
        let _ = stores.classes.wait_until_ready().await;
        let _ = stores.services.wait_until_ready().await;
        let _ = stores.slices.wait_until_ready().await;
        let _ = stores.secrets.wait_until_ready().await;
    };
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = ready => {}
    }
    let mut reported: HashSet<Problem> = HashSet::new();
    let mut announced: BTreeSet<Key> = BTreeSet::new();
    let mut first = true;
    loop {
        let (inputs, secrets) = stores.inputs();
        let built = routes::build(&inputs, &settings.policy);
        let mut bindings = built.tls.clone();
        if let Some(def) = &settings.default_certificate {
            bindings.push(TlsBinding {
                host: None,
                secret: def.clone(),
                ingress: def.clone(),
            });
        }
        let (certs, tls_problems) = tls::build(&bindings, &secrets, settings.fallback_cert.clone());
        shared.swap_routes(built.table);
        resolver.swap(certs);
        if first {
            first = false;
            tracing::info!(
                ingresses = inputs.ingresses.len(),
                services = stores.services.state().len(),
                slices = stores.slices.state().len(),
                secrets = secrets.len(),
                "ingress controller synced: first route table served"
            );
        }

        // Events: each problem once while it lasts.
        let by_key: BTreeMap<Key, &Ingress> =
            inputs.ingresses.iter().map(|i| (key(i), i)).collect();
        let now: HashSet<Problem> = built
            .problems
            .into_iter()
            .chain(tls_problems)
            .filter(|p| built.ours.contains(&p.ingress))
            .collect();
        for p in now.difference(&reported) {
            if let Some(ing) = by_key.get(&p.ingress) {
                tracing::warn!(ingress = %format!("{}/{}", p.ingress.0, p.ingress.1), "{}: {}", p.reason, p.message);
                record(&client, ing, "Warning", p.reason, p.message.clone());
            }
        }
        reported = now;
        for k in built.ours.difference(&announced) {
            if let Some(ing) = by_key.get(k) {
                record(&client, ing, "Normal", "Sync", "Scheduled for sync".into());
            }
        }
        announced = built.ours.clone();

        // Status: our address on our Ingresses; taken off those no longer ours.
        if !settings.publish.is_empty() {
            let wanted = status_entries(&settings.publish);
            for ing in &inputs.ingresses {
                let k = key(ing);
                let current = ing
                    .status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.clone())
                    .unwrap_or_default();
                let current: Vec<serde_json::Value> = current
                    .iter()
                    .map(|i| serde_json::to_value(i).unwrap_or_default())
                    .collect();
                let has_ours = current == wanted;
                let want = built.ours.contains(&k);
                if want && !has_ours {
                    patch_status(
                        &client,
                        &k,
                        json!({"status": {"loadBalancer": {"ingress": wanted.clone()}}}),
                    );
                } else if !want && !current.is_empty() && current == wanted {
                    patch_status(
                        &client,
                        &k,
                        json!({"status": {"loadBalancer": {"ingress": null}}}),
                    );
                }
            }
        }

        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => {}
            // Status writes that failed are retried on the next pass.
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        // Coalesce a burst of changes into one rebuild.
        tokio::time::sleep(settings.min_sync).await;
    }
}

/// `status.loadBalancer.ingress` entries for the published addresses: `ip` for addresses,
/// `hostname` for names.
fn status_entries(publish: &[String]) -> Vec<serde_json::Value> {
    publish
        .iter()
        .map(|addr| {
            if addr.parse::<std::net::IpAddr>().is_ok() {
                json!({"ip": addr})
            } else {
                json!({"hostname": addr})
            }
        })
        .collect()
}

fn patch_status(client: &Client, k: &Key, body: serde_json::Value) {
    let api: Api<Ingress> = Api::namespaced(client.clone(), &k.0);
    let name = k.1.clone();
    tokio::spawn(async move {
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            tracing::debug!("ingress status of {name}: {e}");
        }
    });
}

/// Writes a core/v1 Event about `ing` in the background (as upstream's recorders: an Event that
/// cannot be written is dropped).
fn record(client: &Client, ing: &Ingress, type_: &str, reason: &str, message: String) {
    use ferry_kubeclient::events::{Recorder, Source, reference};
    Recorder::new(client.clone(), Source::new(COMPONENT)).record(
        reference(ing),
        type_,
        reason,
        message,
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_the_services_ingresses_name_are_inputs() {
        let ings: Vec<Ingress> = vec![
            obj(
                json!({"metadata": {"name": "a", "namespace": "x"}, "spec": {
                "defaultBackend": {"service": {"name": "def", "port": {"number": 80}}},
                "rules": [{"host": "a.test", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}},
                    {"path": "/r", "pathType": "Prefix", "backend": {"resource": {"kind": "Bucket", "name": "b"}}}
                ]}}, {"host": "b.test"}]}}),
            ),
            obj(
                json!({"metadata": {"name": "b", "namespace": "y"}, "spec": {"rules": [{"http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 8080}}}}
                ]}}]}}),
            ),
            obj(json!({"metadata": {"name": "c", "namespace": "z"}})),
        ];
        let want: Vec<Key> = [("x", "def"), ("x", "web"), ("y", "web")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(
            referenced_services(&ings).into_iter().collect::<Vec<_>>(),
            want
        );
    }

    #[test]
    fn stored_objects_keep_what_the_tables_read() {
        let mut svc: Service = obj(json!({
            "metadata": {"name": "web", "namespace": "x", "resourceVersion": "5", "labels": {"a": "b"},
                "annotations": {LAST_APPLIED: "{}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}}}));
        slim_service(&mut svc);
        assert_eq!(
            serde_json::to_value(&svc).unwrap(),
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "x", "resourceVersion": "5"},
                "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
        );

        let mut slice: EndpointSlice = obj(json!({
            "metadata": {"name": "web-abc", "namespace": "x", "generateName": "web-",
                "labels": {SERVICE_NAME_LABEL: "web", "endpointslice.kubernetes.io/managed-by": "c"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u"}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": false}, "nodeName": "n1",
                "targetRef": {"kind": "Pod", "name": "p"}, "zone": "z"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}));
        slim_slice(&mut slice);
        assert_eq!(
            serde_json::to_value(&slice).unwrap(),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-abc", "namespace": "x", "labels": {SERVICE_NAME_LABEL: "web"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": false}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
        );

        let mut secret: Secret = obj(json!({
            "metadata": {"name": "tls", "namespace": "x", "annotations": {LAST_APPLIED: "{\"data\": {}}"}},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Yw==", "tls.key": "aw==", "ca.crt": "Yw==", "other": "bw=="}}));
        slim_secret(&mut secret);
        assert!(secret.metadata.annotations.is_none());
        let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
        assert_eq!(keys, ["tls.crt", "tls.key"]);

        let mut ing: Ingress = obj(json!({"metadata": {"name": "a", "namespace": "x",
            "annotations": {LAST_APPLIED: "{}", LEGACY: "ferry"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}}));
        slim_ingress(&mut ing);
        assert!(ing.metadata.managed_fields.is_none());
        assert_eq!(
            ing.metadata.annotations.unwrap().keys().collect::<Vec<_>>(),
            [LEGACY]
        );
    }

    const LEGACY: &str = routes::LEGACY_CLASS_ANNOTATION;
}
