//! Where nothing can be enforced (the loopback pod network of `ferry up` without root: pods
//! are processes on 127.0.0.0/8 sharing the host's network), every NetworkPolicy gets one
//! Warning Event saying so, and the caller is told once (`ferry up` prints it).

use std::collections::HashSet;

use ferry_kubeclient::events;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

pub const REASON: &str = "NetworkPolicyNotEnforced";
pub const COMPONENT: &str = "ferry-netpol";

/// The Warning's message.
pub fn message(mode: &str) -> String {
    format!(
        "NetworkPolicy is not enforced: the {mode} pod network cannot isolate pods, so every \
         connection is allowed; run `ferry up` as root for the network-namespace pod network, \
         where policies are enforced in nftables"
    )
}

/// The Event for `np` (pure).
pub fn event_for(np: &NetworkPolicy, mode: &str, now: jiff::Timestamp) -> Event {
    events::event(
        &events::Source::new(COMPONENT),
        events::reference(np),
        events::WARNING,
        REASON,
        message(mode),
        now,
    )
}

/// Whether a Warning already exists for this policy object (a restart does not repeat it).
async fn already_warned(client: &Client, np: &NetworkPolicy) -> bool {
    let Some(uid) = np.uid() else { return false };
    let ns = np.namespace().unwrap_or_else(|| "default".into());
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().fields(&format!("involvedObject.uid={uid},reason={REASON}"));
    match events.list(&lp).await {
        Ok(l) => !l.items.is_empty(),
        Err(_) => false,
    }
}

/// Watches NetworkPolicies until `cancel`; each new one gets the Warning. `on_first` runs once,
/// with the first policy's `namespace/name`.
pub async fn run(
    client: Client,
    mode: String,
    cancel: CancellationToken,
    on_first: impl FnOnce(&str) + Send,
) {
    let api: Api<NetworkPolicy> = Api::all(client.clone());
    let mut stream =
        ferry_kubeclient::watch::stream(api, watcher::Config::default(), "netpol warnings")
            .default_backoff()
            .boxed();
    let mut seen: HashSet<String> = HashSet::new();
    let mut on_first = Some(on_first);
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        let np = match ev {
            Ok(WEvent::Apply(np)) | Ok(WEvent::InitApply(np)) => np,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!("netpol warning watch: {e}");
                continue;
            }
        };
        let Some(uid) = np.uid() else { continue };
        if !seen.insert(uid) {
            continue;
        }
        let name = format!("{}/{}", np.namespace().unwrap_or_default(), np.name_any());
        if let Some(f) = on_first.take() {
            f(&name);
        }
        if already_warned(&client, &np).await {
            continue;
        }
        let ev = event_for(&np, &mode, jiff::Timestamp::now());
        let ns = np.namespace().unwrap_or_else(|| "default".into());
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        if let Err(e) = events.create(&PostParams::default(), &ev).await {
            tracing::debug!("netpol warning event for {name}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn event_names_the_policy() {
        let np: NetworkPolicy = serde_json::from_value(
            json!({"metadata": {"name": "deny", "namespace": "x", "uid": "u1"}, "spec": {}}),
        )
        .unwrap();
        let ev = event_for(&np, "loopback", jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.reason.as_deref(), Some(REASON));
        assert_eq!(ev.involved_object.kind.as_deref(), Some("NetworkPolicy"));
        assert_eq!(ev.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("x"));
        assert!(
            ev.message
                .unwrap()
                .starts_with("NetworkPolicy is not enforced: the loopback pod network")
        );
    }
}
