//! The per-kind REST hooks and the delete planner against a running server (in this process,
//! on loopback): propagation policies and the garbage collector's finalizers, a bound pod's
//! graceful deletion, a Namespace held by its spec finalizers until `/finalize`, a deleted
//! Service's ClusterIP freed, pod binding, and PUT creating only the kinds that allow it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";
const SVC: &str = "/api/v1/namespaces/default/services";

fn finalizers(v: &Value) -> Value {
    v["metadata"]["finalizers"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagation_finalizers_and_kind_hooks() {
    let server = common::start().await;
    let api = server.api.clone();
    let cm = |name: &str| json!({"metadata": {"name": name}, "data": {"k": "v"}});

    // Propagation: Foreground marks with foregroundDeletion (202); a repeat changes nothing;
    // Background then drops the finalizer and the object goes.
    assert_eq!(api.call("POST", CM, cm("fg")).await.0, 201);
    let (code, v) = api
        .call(
            "DELETE",
            &format!("{CM}/fg"),
            json!({"propagationPolicy": "Foreground"}),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    assert_eq!(finalizers(&v), json!(["foregroundDeletion"]));
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    let (code, again) = api
        .call(
            "DELETE",
            &format!("{CM}/fg"),
            json!({"propagationPolicy": "Foreground"}),
        )
        .await;
    assert_eq!(code, 202, "{again}");
    assert_eq!(
        again["metadata"]["resourceVersion"], v["metadata"]["resourceVersion"],
        "a repeated delete writes nothing"
    );
    let (code, _) = api
        .call(
            "DELETE",
            &format!("{CM}/fg?propagationPolicy=Background"),
            Value::Null,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        api.call("GET", &format!("{CM}/fg"), Value::Null).await.0,
        404
    );

    // Orphan (also as orphanDependents=true) adds the orphan finalizer.
    assert_eq!(api.call("POST", CM, cm("or")).await.0, 201);
    let (code, v) = api
        .call(
            "DELETE",
            &format!("{CM}/or?orphanDependents=true"),
            Value::Null,
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(finalizers(&v), json!(["orphan"]));
    // An unknown policy is refused with upstream's field error.
    let (code, st) = api
        .call(
            "DELETE",
            &format!("{CM}/or"),
            json!({"propagationPolicy": "Sideways"}),
        )
        .await;
    assert_eq!(code, 422, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("Unsupported value: \"Sideways\"")
    );
    // Removing the last finalizer of an object being deleted removes it.
    let (code, _) = api
        .call(
            "PATCH",
            &format!("{CM}/or"),
            json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        api.call("GET", &format!("{CM}/or"), Value::Null).await.0,
        404
    );

    // A pod bound to a node terminates gracefully: marked with its grace period, which a
    // repeated delete may shorten but not lengthen; grace 0 removes it.
    let pod = |name: &str, node: &str| {
        json!({"metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
    };
    assert_eq!(api.call("POST", PODS, pod("bound", "n1")).await.0, 201);
    let (code, v) = api
        .call("DELETE", &format!("{PODS}/bound"), Value::Null)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 30);
    let (_, v) = api
        .call(
            "DELETE",
            &format!("{PODS}/bound?gracePeriodSeconds=60"),
            Value::Null,
        )
        .await;
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 30, "{v}");
    let (_, v) = api
        .call(
            "DELETE",
            &format!("{PODS}/bound?gracePeriodSeconds=5"),
            Value::Null,
        )
        .await;
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 5, "{v}");
    assert_eq!(
        api.call("GET", &format!("{PODS}/bound"), Value::Null)
            .await
            .0,
        200
    );
    let (code, _) = api
        .call(
            "DELETE",
            &format!("{PODS}/bound?gracePeriodSeconds=0"),
            Value::Null,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(
        api.call("GET", &format!("{PODS}/bound"), Value::Null)
            .await
            .0,
        404
    );
    // A terminating pod whose finalizer is not released yet (a Job's tracking finalizer):
    // its agent's final delete (grace 0) is recorded, and the pod goes when the finalizer is
    // removed, whichever comes first.
    let mut held = pod("held", "n1");
    held["metadata"]["finalizers"] = json!(["batch.kubernetes.io/job-tracking"]);
    assert_eq!(api.call("POST", PODS, held).await.0, 201);
    let (_, v) = api
        .call("DELETE", &format!("{PODS}/held"), Value::Null)
        .await;
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 30, "{v}");
    let (code, v) = api
        .call(
            "DELETE",
            &format!("{PODS}/held?gracePeriodSeconds=0"),
            Value::Null,
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 0, "{v}");
    let (code, v) = api.call("GET", &format!("{PODS}/held"), Value::Null).await;
    assert_eq!(code, 200, "held by its finalizer: {v}");
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 0, "{v}");
    let (code, v) = api
        .call(
            "PATCH",
            &format!("{PODS}/held"),
            json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        api.call("GET", &format!("{PODS}/held"), Value::Null)
            .await
            .0,
        404
    );
    // An unbound pod goes at once.
    assert_eq!(api.call("POST", PODS, pod("unbound", "")).await.0, 201);
    assert_eq!(
        api.call("DELETE", &format!("{PODS}/unbound"), Value::Null)
            .await
            .0,
        200
    );
    assert_eq!(
        api.call("GET", &format!("{PODS}/unbound"), Value::Null)
            .await
            .0,
        404
    );

    // Binding: once; a second binding is a conflict; other kinds have no /binding.
    assert_eq!(api.call("POST", PODS, pod("sched", "")).await.0, 201);
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "sched"},
        "target": {"kind": "Node", "name": "n2"}});
    let (code, st) = api
        .call("POST", &format!("{PODS}/sched/binding"), binding.clone())
        .await;
    assert_eq!(code, 201, "{st}");
    let (_, p) = api.call("GET", &format!("{PODS}/sched"), Value::Null).await;
    assert_eq!(p["spec"]["nodeName"], "n2");
    let (code, st) = api
        .call("POST", &format!("{PODS}/sched/binding"), binding)
        .await;
    assert_eq!(code, 409, "{st}");
    assert_eq!(api.call("POST", CM, cm("c")).await.0, 201);
    let (code, _) = api
        .call("POST", &format!("{CM}/c/binding"), json!({}))
        .await;
    assert_eq!(code, 404);

    // A Namespace is held by its spec finalizers until /finalize clears them.
    let (code, ns) = api
        .call(
            "POST",
            "/api/v1/namespaces",
            json!({"metadata": {"name": "held"}}),
        )
        .await;
    assert_eq!(code, 201, "{ns}");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    let (code, v) = api
        .call("DELETE", "/api/v1/namespaces/held", Value::Null)
        .await;
    assert_eq!(code, 200, "{v}");
    assert!(v["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        api.call("GET", "/api/v1/namespaces/held", Value::Null)
            .await
            .0,
        200
    );
    let mut fin = v.clone();
    fin["spec"]["finalizers"] = json!([]);
    let (code, v) = api
        .call("PUT", "/api/v1/namespaces/held/finalize", fin)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        api.call("GET", "/api/v1/namespaces/held", Value::Null)
            .await
            .0,
        404
    );

    // A deleted Service's ClusterIP is free for the next one at once.
    let svc = |name: &str, ip: Option<&str>| {
        let mut s = json!({"metadata": {"name": name},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}});
        if let Some(ip) = ip {
            s["spec"]["clusterIP"] = json!(ip);
        }
        s
    };
    let (code, a) = api.call("POST", SVC, svc("a", None)).await;
    assert_eq!(code, 201, "{a}");
    let ip = a["spec"]["clusterIP"].as_str().unwrap().to_string();
    let (code, st) = api.call("POST", SVC, svc("b", Some(&ip))).await;
    assert_eq!(code, 422, "the address is taken: {st}");
    assert_eq!(
        api.call("DELETE", &format!("{SVC}/a"), Value::Null).await.0,
        200
    );
    let (code, b) = api.call("POST", SVC, svc("b", Some(&ip))).await;
    assert_eq!(code, 201, "{b}");
    assert_eq!(b["spec"]["clusterIP"], ip.as_str());

    // PUT creates Endpoints (controllers write them that way) but not ConfigMaps.
    let (code, e) = api
        .call(
            "PUT",
            "/api/v1/namespaces/default/endpoints/made",
            json!({"metadata": {"name": "made"}, "subsets": []}),
        )
        .await;
    assert_eq!(code, 201, "{e}");
    let (code, _) = api.call("PUT", &format!("{CM}/absent"), cm("absent")).await;
    assert_eq!(code, 404);
}
