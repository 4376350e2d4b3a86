//! The controller: kube-rs reflectors of Ingresses, IngressClasses, Services, EndpointSlices
//! and TLS Secrets; one coalescing loop rebuilds the route and certificate tables from them,
//! swaps them into the proxy, writes `status.loadBalancer` and records Events.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
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

fn spawn_reflector<K>(
    api: Api<K>,
    cfg: watcher::Config,
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
    let stream = reflector::reflector(writer, watcher::watcher(api, cfg)).default_backoff();
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

struct Stores {
    ingresses: Store<Ingress>,
    classes: Store<IngressClass>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
}

impl Stores {
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
        for s in self.services.state() {
            i.services.insert(key(s.as_ref()), (*s).clone());
        }
        for s in self.slices.state() {
            let Some(svc) = s.labels().get("kubernetes.io/service-name") else {
                continue;
            };
            i.slices
                .entry((s.namespace().unwrap_or_default(), svc.clone()))
                .or_default()
                .push((*s).clone());
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
            notify.clone(),
            stop.clone(),
        ),
        classes: spawn_reflector(
            Api::all(client.clone()),
            all(),
            notify.clone(),
            stop.clone(),
        ),
        services: spawn_reflector(
            Api::all(client.clone()),
            all(),
            notify.clone(),
            stop.clone(),
        ),
        slices: spawn_reflector(
            Api::all(client.clone()),
            all(),
            notify.clone(),
            stop.clone(),
        ),
        secrets: spawn_reflector(
            Api::all(client.clone()),
            all().fields("type=kubernetes.io/tls"),
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
    let ns = ing.namespace().unwrap_or_else(|| "default".into());
    let about = ObjectReference {
        api_version: Some("networking.k8s.io/v1".into()),
        kind: Some("Ingress".into()),
        name: Some(ing.name_any()),
        namespace: Some(ns.clone()),
        uid: ing.uid(),
        resource_version: ing.resource_version(),
        ..Default::default()
    };
    let now = Time(jiff::Timestamp::now());
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", ing.name_any())),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: about,
        reason: Some(reason.to_string()),
        message: Some(message),
        type_: Some(type_.to_string()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    tokio::spawn(async move {
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::debug!("event: {e}");
        }
    });
}
