//! PartialObjectMetadata answers against a running API server (in this process, on loopback), as
//! client-go's metadata client and kube-rs' `list_metadata`/`metadata_watcher` ask for them: get,
//! paged lists, watches (with bookmarks and `sendInitialEvents`), writes, custom resources, and
//! the 406 answers of upstream's negotiation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";
const LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const ONE: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": {"team": "a"}, "annotations": {"note": name}},
           "data": {"big": "x".repeat(200)}})
}

/// The PartialObjectMetadata upstream makes of a full object.
fn partial_of(full: &Value, version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{version}"),
           "metadata": full["metadata"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_object_metadata() {
    let server = common::start().await;
    let api = server.api.clone();
    for i in 0..7 {
        let (code, body) = api.call("POST", CM, cm(&format!("m-{i}"))).await;
        assert_eq!(code, 201, "{body}");
    }

    // Get: the object's whole metadata, nothing else.
    let (_, full) = api.call("GET", &format!("{CM}/m-1"), Value::Null).await;
    let (code, ct, got) = api
        .call_accept("GET", &format!("{CM}/m-1"), ONE, Value::Null)
        .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"), "{got}");
    assert_eq!(got, partial_of(&full, "v1"));
    assert!(got.get("data").is_none());
    let (code, _, got) = api
        .call_accept(
            "GET",
            &format!("{CM}/m-1"),
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
            Value::Null,
        )
        .await;
    assert_eq!((code, got), (200, partial_of(&full, "v1beta1")));
    // The list kind asked of one object, and the object kind asked of a list: 406.
    let (code, _, st) = api
        .call_accept("GET", &format!("{CM}/m-1"), LIST, Value::Null)
        .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (406, Some("NotAcceptable")),
        "{st}"
    );
    let (code, _, st) = api.call_accept("GET", CM, ONE, Value::Null).await;
    assert_eq!(code, 406, "{st}");
    assert_eq!(
        st["message"],
        "you requested PartialObjectMetadata, but the requested object is a list (*core.ConfigMapList)"
    );
    // Nothing acceptable: 406; an unknown conversion falls to the next clause.
    let (code, _, st) = api
        .call_accept(
            "GET",
            CM,
            "application/json;as=Foo;g=meta.k8s.io;v=v1",
            Value::Null,
        )
        .await;
    assert_eq!(code, 406, "{st}");
    let (code, _, got) = api
        .call_accept(
            "GET",
            &format!("{CM}/m-1"),
            "application/json;as=Foo;g=meta.k8s.io;v=v1,application/json",
            Value::Null,
        )
        .await;
    assert_eq!((code, &got), (200, &full));

    // Paged list: PartialObjectMetadataList pages with continue and remainingItemCount, items
    // equal to the full list's metadata.
    let (_, all) = api
        .call("GET", &format!("{CM}?labelSelector=team%3Da"), Value::Null)
        .await;
    let want: Vec<Value> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| partial_of(o, "v1"))
        .collect();
    assert_eq!(want.len(), 7);
    let (code, _, first) = api
        .call_accept("GET", &format!("{CM}?limit=3"), LIST, Value::Null)
        .await;
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["kind"], "PartialObjectMetadataList");
    assert_eq!(first["apiVersion"], "meta.k8s.io/v1");
    assert!(first["metadata"]["resourceVersion"].is_string());
    // The namespace also holds kube-root-ca.crt: 8 objects, 5 after the first page.
    assert_eq!(first["metadata"]["remainingItemCount"], 5, "{first}");
    let mut items: Vec<Value> = first["items"].as_array().unwrap().clone();
    let mut cont = first["metadata"]["continue"].as_str().unwrap().to_string();
    while !cont.is_empty() {
        let (code, _, page) = api
            .call_accept(
                "GET",
                &format!("{CM}?limit=3&continue={cont}"),
                LIST,
                Value::Null,
            )
            .await;
        assert_eq!(code, 200, "{page}");
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        cont = page["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .to_string();
    }
    let ours: Vec<Value> = items
        .into_iter()
        .filter(|i| i["metadata"]["labels"]["team"] == "a")
        .collect();
    assert_eq!(ours, want);
    // v1beta1 lists, and label selectors apply as usual.
    let (code, _, l) = api
        .call_accept(
            "GET",
            &format!("{CM}?labelSelector=team%3Da"),
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1",
            Value::Null,
        )
        .await;
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(l["items"].as_array().unwrap().len(), 7);
    assert_eq!(l["items"][0]["apiVersion"], "meta.k8s.io/v1beta1");
    assert!(l["items"][0].get("data").is_none());

    // Watch-list: the initial objects as PartialObjectMetadata, the end bookmark (with its
    // annotation), then changes.
    let rv = all["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!(
        "{CM}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&labelSelector=team%3Da"
    );
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (code, _) = api
                .call(
                    "PATCH",
                    &format!("{CM}/m-2"),
                    json!({"metadata": {"labels": {"x": "y"}}}),
                )
                .await;
            assert_eq!(code, 200);
        })
    };
    let (code, events) = api
        .watch_accept(&path, ONE, |evs| {
            evs.iter().any(|e| e["type"] == "MODIFIED")
        })
        .await;
    writer.await.unwrap();
    assert_eq!(code, 200);
    let end = events
        .iter()
        .position(|e| e["type"] == "BOOKMARK")
        .expect("the initial-events-end bookmark");
    assert_eq!(end, 7, "{events:?}");
    for e in &events[..end] {
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
        assert!(e["object"].get("data").is_none());
    }
    let bm = &events[end]["object"];
    assert_eq!(bm["kind"], "PartialObjectMetadata");
    assert_eq!(bm["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        bm["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert!(
        bm["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            >= rv.parse::<i64>().unwrap()
    );
    let m = events.iter().find(|e| e["type"] == "MODIFIED").unwrap();
    assert_eq!(m["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(m["object"]["metadata"]["labels"]["x"], "y");
    assert!(m["object"].get("data").is_none());

    // Writes answer with metadata too; a delete's Status passes as it is.
    let (code, _, created) = api.call_accept("POST", CM, ONE, cm("w-1")).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["kind"], "PartialObjectMetadata");
    assert_eq!(created["metadata"]["name"], "w-1");
    assert!(created["metadata"]["uid"].is_string());
    let (code, _, deleted) = api
        .call_accept("DELETE", &format!("{CM}/w-1"), ONE, Value::Null)
        .await;
    assert_eq!(code, 200, "{deleted}");
    // (a ConfigMap's delete answers with a Status, which is not transformed)
    assert_eq!(deleted["kind"], "Status", "{deleted}");
    assert_eq!(deleted["status"], "Success");

    // Custom resources: served from the CRD's schema, as metadata.
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 3}}}}}}}]}
    });
    let (code, body) = api
        .call(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = api
            .call(
                "POST",
                widgets,
                json!({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "w", "labels": {"k": "v"}}, "spec": {}}),
            )
            .await;
        if code == 201 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{code} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, full) = api.call("GET", &format!("{widgets}/w"), Value::Null).await;
    assert_eq!(full["spec"]["size"], 3, "{full}");
    let (code, _, got) = api
        .call_accept("GET", &format!("{widgets}/w"), ONE, Value::Null)
        .await;
    assert_eq!((code, got), (200, partial_of(&full, "v1")));
    let (code, _, l) = api.call_accept("GET", widgets, LIST, Value::Null).await;
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["kind"], "PartialObjectMetadataList");
    assert_eq!(l["items"], json!([partial_of(&full, "v1")]));
    let (code, events) = api
        .watch_accept(
            &format!("{widgets}?watch=true&resourceVersion=0"),
            ONE,
            |evs| !evs.is_empty(),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"], partial_of(&full, "v1"));
}
