//! Recording core/v1 Events about objects, as upstream's event recorders do (fire and forget:
//! an Event that cannot be written never holds up a controller).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};

/// A reference to `obj` for `involvedObject`.
pub(crate) fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(K::kind(&()).to_string()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: obj.resource_version(),
        ..Default::default()
    }
}

/// Writes an Event in the background.
pub(crate) fn record(
    client: &kube::Client,
    about: ObjectReference,
    type_: &str,
    reason: &str,
    message: String,
    component: &'static str,
) {
    let client = client.clone();
    let (type_, reason) = (type_.to_string(), reason.to_string());
    tokio::spawn(async move {
        let ns = about.namespace.clone().unwrap_or_else(|| "default".into());
        let now = jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", about.name.clone().unwrap_or_default())),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: about,
            reason: Some(reason),
            message: Some(message),
            type_: Some(type_),
            source: Some(EventSource {
                component: Some(component.into()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(component.into()),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(client, &ns);
        if let Err(e) = events.create(&PostParams::default(), &ev).await {
            tracing::debug!("event: {e}");
        }
    });
}
