//! Lists and watch-lists against a running API server (in this process, on loopback): paged
//! lists are one snapshot across concurrent writes and count what remains; a watch-list
//! (`sendInitialEvents=true`) sends the matching objects, then the bookmark that ends them, then
//! changes; the watch options are validated as upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";

fn cm(name: &str, v: u32, team: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": {"team": team}}, "data": {"v": v.to_string()}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_lists_and_watch_lists() {
    let server = common::start().await;
    let api = server.api.clone();
    // 300 ConfigMaps, every third labelled team=a.
    const N: u32 = 300;
    let mut creates = Vec::new();
    for w in 0..4u32 {
        let api = api.clone();
        creates.push(tokio::spawn(async move {
            for i in (w..N).step_by(4) {
                let team = if i % 3 == 0 { "a" } else { "b" };
                let (code, body) = api
                    .call("POST", CM, cm(&format!("cm-{i:03}"), 0, team))
                    .await;
                assert_eq!(code, 201, "{body}");
            }
        }));
    }
    for c in creates {
        c.await.unwrap();
    }

    // The namespace also holds what the server puts there (kube-root-ca.crt).
    let (_, all) = api.call("GET", CM, Value::Null).await;
    let total = all["items"].as_array().unwrap().len();
    assert!(total >= N as usize);

    // Paged list with writes between pages: every page at the first page's revision, and the
    // pages together are exactly the snapshot an unpaged list at that revision returns.
    let mut pages = Vec::new();
    let mut cont = String::new();
    let mut k = 0u32;
    loop {
        let q = if cont.is_empty() {
            format!("{CM}?limit=70")
        } else {
            format!("{CM}?limit=70&continue={cont}")
        };
        let (code, page) = api.call("GET", &q, Value::Null).await;
        assert_eq!(code, 200, "{page}");
        pages.push(page.clone());
        // Writes on both sides of the cursor.
        for _ in 0..5 {
            k += 1;
            let name = format!("cm-{:03}", (k * 37) % N);
            let (code, _) = api
                .call(
                    "PATCH",
                    &format!("{CM}/{name}"),
                    json!({"data": {"v": k.to_string()}}),
                )
                .await;
            assert!(code == 200 || code == 404, "{code}");
        }
        let (code, _) = api
            .call("POST", CM, cm(&format!("new-{k:03}"), 1, "a"))
            .await;
        assert_eq!(code, 201);
        let (code, _) = api
            .call(
                "DELETE",
                &format!("{CM}/cm-{:03}", (k * 11) % N),
                Value::Null,
            )
            .await;
        assert!(code == 200 || code == 404, "{code}");
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_string(),
            _ => break,
        }
    }
    assert_eq!(pages.len(), total.div_ceil(70));
    let rv0 = pages[0]["metadata"]["resourceVersion"].clone();
    let remaining: Vec<Value> = pages
        .iter()
        .map(|p| p["metadata"]["remainingItemCount"].clone())
        .collect();
    let want: Vec<Value> = (1..=pages.len())
        .map(|i| match total - (70 * i).min(total) {
            0 => Value::Null,
            n => json!(n),
        })
        .collect();
    assert_eq!(remaining, want);
    let mut paged: BTreeMap<String, String> = BTreeMap::new();
    for p in &pages {
        assert_eq!(p["metadata"]["resourceVersion"], rv0);
        for it in p["items"].as_array().unwrap() {
            paged.insert(
                it["metadata"]["name"].as_str().unwrap().into(),
                it["metadata"]["resourceVersion"].as_str().unwrap().into(),
            );
        }
    }
    assert_eq!(paged.len(), total);
    assert!(
        !paged.keys().any(|n| n.starts_with("new-")),
        "no object created after the snapshot"
    );
    let (_, exact) = api
        .call(
            "GET",
            &format!(
                "{CM}?resourceVersion={}&resourceVersionMatch=Exact",
                rv0.as_str().unwrap()
            ),
            Value::Null,
        )
        .await;
    let exact: BTreeMap<String, String> = exact["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|it| {
            (
                it["metadata"]["name"].as_str().unwrap().into(),
                it["metadata"]["resourceVersion"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(paged, exact);

    // A label-selected page: no remainingItemCount (upstream counts only unfiltered lists).
    let (_, sel) = api
        .call(
            "GET",
            &format!("{CM}?limit=10&labelSelector=team%3Da"),
            Value::Null,
        )
        .await;
    assert_eq!(sel["items"].as_array().unwrap().len(), 10);
    assert!(sel["metadata"]["continue"].as_str().is_some());
    assert!(sel["metadata"].get("remainingItemCount").is_none());

    // Watch-list: the current team=a objects as ADDED, the end bookmark, then changes.
    let (_, now) = api
        .call("GET", &format!("{CM}?labelSelector=team%3Da"), Value::Null)
        .await;
    let want: Vec<String> = now["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let path = format!(
        "{CM}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&labelSelector=team%3Da"
    );
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (code, _) = api.call("POST", CM, cm("late", 9, "a")).await;
            assert_eq!(code, 201);
        })
    };
    let (code, events) = api
        .watch(&path, |evs| {
            evs.iter()
                .any(|e| e["type"] == "ADDED" && e["object"]["metadata"]["name"] == "late")
        })
        .await;
    writer.await.unwrap();
    assert_eq!(code, 200);
    let end = events
        .iter()
        .position(|e| e["type"] == "BOOKMARK")
        .expect("the initial-events-end bookmark");
    let bookmark = &events[end]["object"];
    assert_eq!(
        bookmark["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let initial: Vec<String> = events[..end]
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "ADDED");
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    // The list above and the watch-list see the same objects (no write in between).
    assert_eq!(initial, want);
    let after: Vec<&Value> = events[end + 1..].iter().collect();
    assert_eq!(after.last().unwrap()["object"]["metadata"]["name"], "late");
    let brv: i64 = bookmark["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let late_rv: i64 = after.last().unwrap()["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(late_rv > brv);

    // sendInitialEvents=false: no initial events, only what changes after.
    let path = format!(
        "{CM}?watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (code, _) = api.call("POST", CM, cm("later", 9, "b")).await;
            assert_eq!(code, 201);
        })
    };
    let (_, events) = api.watch(&path, |evs| !evs.is_empty()).await;
    writer.await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "later");

    // Invalid options: 422 as upstream.
    for q in [
        "watch=true&sendInitialEvents=true",
        "watch=true&resourceVersion=1&resourceVersionMatch=NotOlderThan",
        "sendInitialEvents=true",
    ] {
        let (code, body) = api.call("GET", &format!("{CM}?{q}"), Value::Null).await;
        assert_eq!(code, 422, "{q}: {body}");
        assert_eq!(body["reason"], "Invalid", "{q}: {body}");
    }

    drop(server);
}
