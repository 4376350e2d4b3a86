//! Garbage collector and namespace controller against the real API server.

mod lifecycle_common;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use lifecycle_common::*;
use serde_json::json;

fn cm(ns: &str, name: &str, owner: Option<(&str, &str, bool)>) -> serde_json::Value {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns}});
    if let Some((oname, uid, block)) = owner {
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": oname, "uid": uid, "blockOwnerDeletion": block}]);
    }
    v
}

async fn gone(api: &Api<ConfigMap>, name: &str, secs: u64) -> bool {
    eventually(secs, || async {
        match api.get_opt(name).await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await
    .is_some()
}

#[tokio::test]
async fn background_foreground_orphan_and_finalizers() {
    let c = start().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), "default");
    // Background: the dependent goes after the owner.
    let o = create(&c.client, cm("default", "o1", None)).await;
    let uid = o.metadata.uid.clone().expect("uid");
    create(&c.client, cm("default", "d1", Some(("o1", &uid, false)))).await;
    api.delete("o1", &DeleteParams::background())
        .await
        .expect("delete");
    assert!(
        gone(&api, "d1", 10).await,
        "dependent of a deleted owner survived"
    );

    // Foreground: the owner stays with deletionTimestamp until the dependent is gone.
    let o = create(&c.client, cm("default", "o2", None)).await;
    let uid = o.metadata.uid.clone().expect("uid");
    create(&c.client, cm("default", "d2", Some(("o2", &uid, true)))).await;
    // The dependent holds a custom finalizer: the owner must wait for it.
    api.patch(
        "d2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await
    .expect("patch");
    api.delete("o2", &DeleteParams::foreground())
        .await
        .expect("delete");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let owner = api.get("o2").await.expect("owner still there");
    assert!(owner.metadata.deletion_timestamp.is_some());
    let dep = api
        .get("d2")
        .await
        .expect("dependent held by its finalizer");
    assert!(dep.metadata.deletion_timestamp.is_some());
    api.patch(
        "d2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("patch");
    assert!(gone(&api, "d2", 10).await);
    assert!(gone(&api, "o2", 10).await, "foreground owner not finished");

    // Orphan: the dependent stays, without the owner reference.
    let o = create(&c.client, cm("default", "o3", None)).await;
    let uid = o.metadata.uid.clone().expect("uid");
    create(&c.client, cm("default", "d3", Some(("o3", &uid, true)))).await;
    api.delete("o3", &DeleteParams::orphan())
        .await
        .expect("delete");
    assert!(gone(&api, "o3", 10).await);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let d = api.get("d3").await.expect("orphan survives");
    assert!(d.metadata.owner_references.unwrap_or_default().is_empty());

    // An owner reference by name but with another uid does not keep a dependent alive.
    create(&c.client, cm("default", "o4", None)).await;
    create(
        &c.client,
        cm(
            "default",
            "d4",
            Some(("o4", "00000000-0000-0000-0000-000000000000", false)),
        ),
    )
    .await;
    assert!(gone(&api, "d4", 10).await, "owners are matched by uid");
    assert!(api.get_opt("o4").await.expect("get").is_some());
}

#[tokio::test]
async fn cross_namespace_owner_is_absent_with_event() {
    let c = start().await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    for n in ["nsa", "nsb"] {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}})).expect("ns"),
        )
        .await
        .expect("ns");
    }
    let o = create(&c.client, cm("nsb", "owner", None)).await;
    let uid = o.metadata.uid.clone().expect("uid");
    create(&c.client, cm("nsa", "owner", None)).await; // same name, other uid
    create(&c.client, cm("nsa", "dep", Some(("owner", &uid, false)))).await;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), "nsa");
    assert!(
        gone(&api, "dep", 10).await,
        "cross-namespace dependent not collected"
    );
    let events: Api<Event> = Api::namespaced(c.client.clone(), "nsa");
    let found = eventually(10, || async {
        let l = events.list(&ListParams::default()).await.ok()?;
        l.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("OwnerRefInvalidNamespace")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.name.as_deref() == Some("dep")
        })
    })
    .await;
    assert!(found.is_some(), "no OwnerRefInvalidNamespace event");
    // Both owners untouched.
    assert!(
        Api::<ConfigMap>::namespaced(c.client.clone(), "nsb")
            .get_opt("owner")
            .await
            .expect("get")
            .is_some()
    );
    assert!(api.get_opt("owner").await.expect("get").is_some());
}

#[tokio::test]
async fn namespace_deletion_empties_then_removes() {
    let c = start().await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let ns = nss.get(n).await.expect("system namespace");
        assert_eq!(
            ns.metadata
                .labels
                .unwrap_or_default()
                .get("kubernetes.io/metadata.name")
                .map(String::as_str),
            Some(n)
        );
    }
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).expect("ns"),
    )
    .await
    .expect("ns");
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), "doomed");
    for i in 0..3 {
        create(&c.client, cm("doomed", &format!("c{i}"), None)).await;
    }
    api.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await
    .expect("patch");
    nss.delete("doomed", &DeleteParams::default())
        .await
        .expect("delete ns");
    let terminating = eventually(10, || async {
        let ns = nss.get("doomed").await.ok()?;
        (ns.status?.phase.as_deref() == Some("Terminating")).then_some(())
    })
    .await;
    assert!(terminating.is_some());
    assert!(gone(&api, "c1", 10).await && gone(&api, "c2", 10).await);
    // Creating in a terminating namespace is refused with 403.
    let err = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "late"}})).expect("cm"),
        )
        .await
        .expect_err("create in terminating namespace");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 403),
        e => panic!("{e}"),
    }
    // The finalizer holds the namespace.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(nss.get_opt("doomed").await.expect("get").is_some());
    api.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("patch");
    let removed = eventually(15, || async {
        matches!(nss.get_opt("doomed").await, Ok(None)).then_some(())
    })
    .await;
    assert!(removed.is_some(), "namespace not removed");
}
