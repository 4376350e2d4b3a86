//! The minimal scheduler against the real API server.

mod lifecycle_common;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use lifecycle_common::*;
use serde_json::json;

async fn node(c: &Cluster, name: &str, labels: serde_json::Value, ready: bool) {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
    .expect("node");
    Api::<Node>::all(c.client.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
}

fn pod(name: &str, selector: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "x"}]}}))
    .expect("pod")
}

#[tokio::test]
async fn binds_spread_by_selector_and_reports_failures() {
    let c = start().await;
    node(&c, "n1", json!({"zone": "a"}), true).await;
    node(&c, "n2", json!({"zone": "b"}), true).await;
    node(&c, "n3", json!({"zone": "b"}), false).await;
    // Let the scheduler's informer see the nodes first.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for i in 0..4 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), json!({})))
            .await
            .expect("pod");
    }
    pods.create(&PostParams::default(), &pod("zb", json!({"zone": "b"})))
        .await
        .expect("pod");
    pods.create(
        &PostParams::default(),
        &pod("nowhere", json!({"zone": "c"})),
    )
    .await
    .expect("pod");
    let placed = eventually(20, || async {
        let l = pods.list(&ListParams::default()).await.ok()?;
        let mut m = std::collections::BTreeMap::new();
        for p in &l.items {
            let n = p.spec.as_ref()?.node_name.clone().unwrap_or_default();
            if n.is_empty() && p.metadata.name.as_deref() != Some("nowhere") {
                return None;
            }
            m.insert(p.metadata.name.clone().unwrap_or_default(), n);
        }
        Some(m)
    })
    .await
    .expect("all schedulable pods bound");
    assert_eq!(placed["zb"], "n2");
    assert_eq!(placed["nowhere"], "");
    assert!(
        placed.values().all(|n| n != "n3"),
        "bound to a NotReady node"
    );
    let on1 = placed.values().filter(|n| *n == "n1").count();
    let on2 = placed.values().filter(|n| *n == "n2").count();
    assert_eq!(on1 + on2, 5);
    assert!(on1.abs_diff(on2) <= 1, "spread by pod count: {placed:?}");
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let ev = eventually(10, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.involved_object.name.as_deref() == Some("nowhere")
            })
    })
    .await
    .expect("FailedScheduling event");
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let p = pods.get("nowhere").await.expect("pod");
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    // A matching node appears: the pod is bound.
    node(&c, "n4", json!({"zone": "c"}), true).await;
    let bound = eventually(10, || async {
        let p = pods.get("nowhere").await.ok()?;
        (p.spec?.node_name.as_deref() == Some("n4")).then_some(())
    })
    .await;
    assert!(bound.is_some());
}
