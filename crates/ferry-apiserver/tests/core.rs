//! The API server core against a running server (in this process, on loopback): optimistic
//! concurrency and delete preconditions, finalizers and graceful deletion as watchers see them,
//! and a watch from a resourceVersion the server never reached.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preconditions_conflicts_and_finalizers() {
    let server = common::start().await;
    let api = server.api.clone();

    // Optimistic concurrency: an update carrying a stale resourceVersion is 409.
    let (code, a) = api
        .call(
            "POST",
            CM,
            json!({"metadata": {"name": "a"}, "data": {"v": "1"}}),
        )
        .await;
    assert_eq!(code, 201, "{a}");
    let rv1 = a["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let uid = a["metadata"]["uid"].as_str().unwrap().to_string();
    let (code, a2) = api
        .call(
            "PUT",
            &format!("{CM}/a"),
            json!({"metadata": {"name": "a", "resourceVersion": rv1}, "data": {"v": "2"}}),
        )
        .await;
    assert_eq!(code, 200, "{a2}");
    let (code, stale) = api
        .call(
            "PUT",
            &format!("{CM}/a"),
            json!({"metadata": {"name": "a", "resourceVersion": rv1}, "data": {"v": "3"}}),
        )
        .await;
    assert_eq!(code, 409, "{stale}");
    assert_eq!(stale["reason"], "Conflict");
    assert!(
        stale["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified"),
        "{stale}"
    );

    // Delete preconditions: a wrong uid or resourceVersion is 409 with upstream's message.
    let rv2 = a2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for (pre, text) in [
        (
            json!({"uid": "not-the-uid"}),
            format!(
                "Precondition failed: UID in precondition: not-the-uid, UID in object meta: {uid}"
            ),
        ),
        (
            json!({"resourceVersion": rv1}),
            format!(
                "Precondition failed: ResourceVersion in precondition: {rv1}, ResourceVersion in object meta: {rv2}"
            ),
        ),
    ] {
        let (code, e) = api
            .call("DELETE", &format!("{CM}/a"), json!({"preconditions": pre}))
            .await;
        assert_eq!(code, 409, "{e}");
        assert!(e["message"].as_str().unwrap().contains(&text), "{e}");
    }
    let (code, _) = api
        .call(
            "DELETE",
            &format!("{CM}/a"),
            json!({"preconditions": {"uid": uid, "resourceVersion": rv2}}),
        )
        .await;
    assert_eq!(code, 200);
    let (code, _) = api.call("GET", &format!("{CM}/a"), Value::Null).await;
    assert_eq!(code, 404);

    // Finalizers: a delete marks the object; it goes when the last finalizer is removed, and a
    // watcher sees MODIFIED (deletionTimestamp set) then DELETED.
    let (code, f) = api
        .call(
            "POST",
            CM,
            json!({"metadata": {"name": "f", "finalizers": ["example.com/keep"]}}),
        )
        .await;
    assert_eq!(code, 201, "{f}");
    let from = f["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, marked) = api.call("DELETE", &format!("{CM}/f"), Value::Null).await;
    assert_eq!(code, 200, "{marked}");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    let (code, still) = api.call("GET", &format!("{CM}/f"), Value::Null).await;
    assert_eq!(code, 200);
    assert_eq!(still["metadata"]["finalizers"], json!(["example.com/keep"]));
    // Another delete changes nothing (still there, still marked).
    let (code, again) = api.call("DELETE", &format!("{CM}/f"), Value::Null).await;
    assert!(code == 200 || code == 202, "{again}");
    let (code, _) = api
        .call(
            "PATCH",
            &format!("{CM}/f"),
            json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(code, 200);
    let (code, _) = api.call("GET", &format!("{CM}/f"), Value::Null).await;
    assert_eq!(code, 404);
    let (_, events) = api
        .watch(
            &format!("{CM}?watch=true&resourceVersion={from}&fieldSelector=metadata.name%3Df"),
            |evs| evs.iter().any(|e| e["type"] == "DELETED"),
        )
        .await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"MODIFIED"), "{events:?}");
    assert_eq!(kinds.last(), Some(&"DELETED"), "{events:?}");
    assert!(events[0]["object"]["metadata"]["deletionTimestamp"].is_string());

    // A watch from a resourceVersion far ahead of the server: 504 after the wait, as upstream.
    let (code, e) = api
        .call(
            "GET",
            &format!("{CM}?watch=true&resourceVersion=999999999"),
            Value::Null,
        )
        .await;
    assert_eq!(code, 504, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version")
    );
}
