//! The one core/v1 Event recorder of Ferry's components, as client-go's `record.EventRecorder`:
//! an Event about an object, named `<object>.<unix nanos in hex>`, stamped with the reporting
//! component (and node, for node agents), written in the background. Recording never holds up
//! the caller; an Event that cannot be written is logged at debug level and dropped.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

/// `Normal` Events (routine).
pub const NORMAL: &str = "Normal";
/// `Warning` Events (something the user should look at).
pub const WARNING: &str = "Warning";

/// A reference to `obj` for an Event's `involvedObject`.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
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

/// Who reports: the component (`kubelet`, `endpoint-slice-controller`...) and, for per-node
/// agents, the node.
#[derive(Debug, Clone)]
pub struct Source {
    pub component: String,
    pub host: Option<String>,
}

impl Source {
    pub fn new(component: impl Into<String>) -> Self {
        Source {
            component: component.into(),
            host: None,
        }
    }

    pub fn on_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }
}

/// The Event (pure): in the involved object's namespace (`default` for cluster-scoped objects),
/// named as client-go names it, first and last seen `now`, count 1.
pub fn event(
    source: &Source,
    about: ObjectReference,
    type_: &str,
    reason: &str,
    message: impl Into<String>,
    now: jiff::Timestamp,
) -> Event {
    let ns = about
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    let nanos = u128::try_from(now.as_nanosecond()).unwrap_or(0);
    Event {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{nanos:x}",
                about.name.as_deref().unwrap_or_default()
            )),
            namespace: Some(ns),
            ..Default::default()
        },
        involved_object: about,
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(type_.into()),
        source: Some(EventSource {
            component: Some(source.component.clone()),
            host: source.host.clone(),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(source.component.clone()),
        reporting_instance: source.host.clone(),
        ..Default::default()
    }
}

/// Records Events for one component through one client.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    source: Source,
}

impl Recorder {
    pub fn new(client: kube::Client, source: Source) -> Self {
        Recorder { client, source }
    }

    /// Writes the Event now and returns the API server's answer.
    pub async fn publish(
        &self,
        about: ObjectReference,
        type_: &str,
        reason: &str,
        message: impl Into<String>,
    ) -> kube::Result<Event> {
        let ev = event(
            &self.source,
            about,
            type_,
            reason,
            message,
            jiff::Timestamp::now(),
        );
        let ns = ev.metadata.namespace.clone().unwrap_or_default();
        Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &ev)
            .await
    }

    /// Writes the Event in the background (fire and forget; needs a tokio runtime).
    pub fn record(
        &self,
        about: ObjectReference,
        type_: &str,
        reason: &str,
        message: impl Into<String>,
    ) {
        let this = self.clone();
        let (type_, reason, message) = (type_.to_string(), reason.to_string(), message.into());
        tokio::spawn(async move {
            if let Err(e) = this.publish(about, &type_, &reason, message).await {
                tracing::debug!("event {reason}: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Pod};

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn events_are_named_placed_and_stamped_as_client_go_does() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-1".into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.uid = Some("u1".into());
        let now = at("2026-11-24T10:00:00Z");
        let src = Source::new("kubelet").on_host("node-a");
        let ev = event(&src, reference(&pod), WARNING, "BackOff", "restarting", now);
        // client-go: fmt.Sprintf("%v.%x", ref.Name, t.UnixNano())
        let want_name = format!("web-1.{:x}", 1_795_514_400_000_000_000u128);
        assert_eq!(ev.metadata.name.as_deref(), Some(want_name.as_str()));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(ev.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(ev.involved_object.api_version.as_deref(), Some("v1"));
        assert_eq!(ev.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.reason.as_deref(), Some("BackOff"));
        assert_eq!(ev.message.as_deref(), Some("restarting"));
        let s = ev.source.unwrap_or_default();
        assert_eq!(s.component.as_deref(), Some("kubelet"));
        assert_eq!(s.host.as_deref(), Some("node-a"));
        assert_eq!(ev.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(ev.reporting_instance.as_deref(), Some("node-a"));
        assert_eq!(ev.count, Some(1));
        assert_eq!(ev.first_timestamp, Some(Time(now)));
        assert_eq!(ev.last_timestamp, Some(Time(now)));
    }

    #[test]
    fn cluster_scoped_objects_get_their_events_in_default() {
        let mut ns = Namespace::default();
        ns.metadata.name = Some("team".into());
        let ev = event(
            &Source::new("namespace-controller"),
            reference(&ns),
            NORMAL,
            "Deleted",
            "gone",
            at("2026-11-24T10:00:00Z"),
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(ev.involved_object.namespace, None);
        assert_eq!(ev.source.and_then(|s| s.host), None);
        assert_eq!(ev.reporting_instance, None);
    }
}
