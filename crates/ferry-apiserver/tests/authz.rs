//! Identities and RBAC against a running API server (in this process, plain HTTP on loopback):
//! ServiceAccount tokens from TokenRequest, RBAC decisions with upstream's 403 message, access
//! reviews, tokens bound to a deleted pod, and privilege-escalation prevention.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};

mod common;
use common::Api;

async fn token_for(api: &Api, admin: &str, ns: &str, sa: &str, bound_pod: Option<&str>) -> String {
    let mut spec = json!({});
    if let Some(p) = bound_pod {
        spec["boundObjectRef"] = json!({"kind": "Pod", "apiVersion": "v1", "name": p});
    }
    let (code, tr) = api
        .call_as(
            admin,
            "POST",
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})),
        )
        .await;
    assert_eq!(code, 201, "{tr}");
    assert_eq!(tr["spec"]["expirationSeconds"], 3600, "{tr}");
    assert_eq!(
        tr["spec"]["audiences"][0],
        "https://kubernetes.default.svc.cluster.local"
    );
    tr["status"]["token"].as_str().unwrap().to_string()
}

async fn can_i(api: &Api, token: &str, verb: &str, ns: &str, resource: &str) -> bool {
    let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
    let (code, r) = api
        .call_as(
            token,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            Some(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "resource": resource, "group": group}}})),
        )
        .await;
    assert_eq!(code, 201, "{r}");
    r["status"]["allowed"].as_bool().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_and_rbac() {
    let server = common::start_with(|cfg| {
        cfg.audit_log_path = Some(cfg.data_dir.join("audit.log"));
    })
    .await;
    let dir = server.dir();
    let api = server.api.clone();
    let admin = api.token.as_str();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("pki/sa.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The default policy exists.
    let (code, crs) = api
        .call_as(
            admin,
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            None,
        )
        .await;
    assert_eq!(code, 200);
    let names: Vec<&str> = crs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    for n in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:basic-user",
        "system:discovery",
        "system:public-info-viewer",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    // Namespace team-a with two ServiceAccounts; `reader` is bound to view there.
    let (code, _) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces",
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})),
        )
        .await;
    assert_eq!(code, 201);
    for sa in ["reader", "nobody"] {
        let (code, r) = api
            .call_as(
                admin,
                "POST",
                "/api/v1/namespaces/team-a/serviceaccounts",
                Some(
                    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
                ),
            )
            .await;
        assert_eq!(code, 201, "{r}");
    }
    let (code, r) = api
        .call_as(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "reader-view"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "team-a"}]})))
        .await;
    assert_eq!(code, 201, "{r}");
    // An aggregated role holds its parts' rules (the aggregation controller's work is not in
    // this process: view is empty here, so bind a role with explicit rules too).
    let (code, r) = api
        .call_as(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}]})))
        .await;
    assert_eq!(code, 201, "{r}");
    let (code, _) = api
        .call_as(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "reader-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader"}]})))
        .await;
    assert_eq!(code, 201);

    let reader = token_for(&api, admin, "team-a", "reader", None).await;
    let nobody = token_for(&api, admin, "team-a", "nobody", None).await;

    // Who am I.
    let (code, r) = api
        .call_as(
            &reader,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
    assert_eq!(code, 201, "{r}");
    assert_eq!(
        r["status"]["userInfo"]["username"],
        "system:serviceaccount:team-a:reader"
    );
    assert_eq!(
        r["status"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team-a",
            "system:authenticated"
        ])
    );

    // Access reviews answer as the requests are then treated.
    assert!(can_i(&api, &reader, "list", "team-a", "pods").await);
    assert!(!can_i(&api, &reader, "list", "default", "pods").await);
    assert!(!can_i(&api, &reader, "create", "team-a", "pods").await);
    assert!(!can_i(&api, &nobody, "list", "team-a", "pods").await);
    assert!(can_i(&api, admin, "delete", "kube-system", "secrets").await);
    let (code, _) = api
        .call_as(&reader, "GET", "/api/v1/namespaces/team-a/pods", None)
        .await;
    assert_eq!(code, 200);
    let (code, st) = api
        .call_as(&reader, "GET", "/api/v1/namespaces/default/pods", None)
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "pods is forbidden: User \"system:serviceaccount:team-a:reader\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    assert_eq!(st["reason"], "Forbidden");
    assert_eq!(st["details"], json!({"kind": "pods"}));
    let (code, st) = api
        .call_as(&nobody, "GET", "/api/v1/namespaces/team-a/pods/x/log", None)
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "pods \"x\" is forbidden: User \"system:serviceaccount:team-a:nobody\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"team-a\""
    );
    let (code, st) = api
        .call_as(&nobody, "GET", "/apis/apps/v1/deployments", None)
        .await;
    assert_eq!(code, 403);
    assert_eq!(
        st["message"],
        "deployments.apps is forbidden: User \"system:serviceaccount:team-a:nobody\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
    );
    // Discovery for every authenticated user; nothing without credentials or with a bad token.
    assert_eq!(api.call_as(&nobody, "GET", "/api", None).await.0, 200);
    assert_eq!(api.call_as("", "GET", "/api", None).await.0, 401);
    assert_eq!(api.call_as("not-a-token", "GET", "/api", None).await.0, 401);
    let mut forged = reader.clone();
    forged.pop();
    assert_eq!(api.call_as(&forged, "GET", "/api", None).await.0, 401);
    assert_eq!(api.call_as("", "GET", "/version", None).await.0, 200);

    // Rules review.
    let (code, r) = api
        .call_as(&reader, "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            Some(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "team-a"}})))
        .await;
    assert_eq!(code, 201, "{r}");
    let rules = r["status"]["resourceRules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|x| x["resources"] == json!(["pods", "pods/log"])),
        "{r}"
    );

    // Escalation: `nobody` gets rights to manage roles in team-a, but cannot grant more than it
    // holds; bind lets it grant view.
    let (code, _) = api
        .call_as(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "rbac-manager"},
                "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "patch", "get"]},
                          {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})))
        .await;
    assert_eq!(code, 201);
    let (code, _) = api
        .call_as(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "nobody-rbac"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rbac-manager"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": "team-a"}]})))
        .await;
    assert_eq!(code, 201);
    // The authorizer reads the watch cache: wait until it has the binding.
    let mut bound_yet = false;
    for _ in 0..100 {
        if can_i(
            &api,
            &nobody,
            "create",
            "team-a",
            "roles.rbac.authorization.k8s.io",
        )
        .await
        {
            bound_yet = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(bound_yet);
    let (code, st) = api
        .call_as(&nobody, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "secrets"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]})))
        .await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "roles.rbac.authorization.k8s.io \"secrets\" is forbidden: user \"system:serviceaccount:team-a:nobody\" (groups=[\"system:serviceaccounts\" \"system:serviceaccounts:team-a\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}"
    );
    // What it holds, it may grant.
    let (code, st) = api
        .call_as(
            &nobody,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
            Some(
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "cm-get"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
            ),
        )
        .await;
    assert_eq!(code, 201, "{st}");
    // A patch that adds a right it lacks is refused as well.
    let (code, st) = api
        .call_as(&nobody, "PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/cm-get",
            Some(json!([{"op": "add", "path": "/rules/-", "value": {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}}])))
        .await;
    assert_eq!(code, 415, "{st}"); // JSON patch needs its content type
    let req = http::Request::builder()
        .method("PATCH")
        .uri(format!("{}/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/cm-get", api.base))
        .header("Authorization", format!("Bearer {nobody}"))
        .header("Content-Type", "application/json-patch+json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&json!([{"op": "add", "path": "/rules/-", "value": {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}}])).unwrap(),
        )))
        .unwrap();
    let resp = api.c.request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    // Binding a role it does not hold (cluster-admin) is refused; the stored role is unchanged.
    let (code, st) = api
        .call_as(&nobody, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings",
            Some(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "grab"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": "team-a"}]})))
        .await;
    assert_eq!(code, 403, "{st}");
    assert!(st["message"].as_str().unwrap().starts_with("rolebindings.rbac.authorization.k8s.io \"grab\" is forbidden: user \"system:serviceaccount:team-a:nobody\""), "{st}");
    let (_, role) = api
        .call_as(
            admin,
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/cm-get",
            None,
        )
        .await;
    assert_eq!(role["rules"].as_array().unwrap().len(), 1);

    // A token bound to a pod stops working when the pod is deleted.
    let (code, r) = api
        .call_as(admin, "POST", "/api/v1/namespaces/team-a/pods",
            Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
                "spec": {"serviceAccountName": "reader", "containers": [{"name": "c", "image": "busybox"}]}})))
        .await;
    assert_eq!(code, 201, "{r}");
    let bound = token_for(&api, admin, "team-a", "reader", Some("p1")).await;
    let (code, r) = api
        .call_as(
            &bound,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        )
        .await;
    assert_eq!(code, 201);
    assert_eq!(
        r["status"]["userInfo"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["p1"])
    );
    // TokenReview sees the same.
    let (code, r) = api
        .call_as(admin, "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": bound}})))
        .await;
    assert_eq!(code, 201);
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    let (code, _) = api
        .call_as(
            admin,
            "DELETE",
            "/api/v1/namespaces/team-a/pods/p1?gracePeriodSeconds=0",
            None,
        )
        .await;
    assert_eq!(code, 200);
    let mut refused = false;
    for _ in 0..100 {
        if api.call_as(&bound, "GET", "/api", None).await.0 == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(refused, "a token bound to a deleted pod is refused");
    // Binding to a missing pod is a 404; a too short lifetime is invalid.
    let (code, _) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/team-a/serviceaccounts/reader/token",
            Some(
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "gone"}}}),
            ),
        )
        .await;
    assert_eq!(code, 404);
    let (code, st) = api
        .call_as(admin, "POST", "/api/v1/namespaces/team-a/serviceaccounts/reader/token",
            Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 60}})))
        .await;
    assert_eq!(code, 422, "{st}");
    // Deleting the ServiceAccount invalidates its tokens.
    let (code, _) = api
        .call_as(
            admin,
            "DELETE",
            "/api/v1/namespaces/team-a/serviceaccounts/nobody",
            None,
        )
        .await;
    assert_eq!(code, 200);
    let mut refused = false;
    for _ in 0..100 {
        if api.call_as(&nobody, "GET", "/api", None).await.0 == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(refused, "a deleted ServiceAccount's token is refused");

    // The audit log: audit.k8s.io/v1 Events, one JSON line each, private to the owner.
    let log_path = dir.join("audit.log");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&log_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.iter().all(|e| e["apiVersion"] == "audit.k8s.io/v1"
        && e["kind"] == "Event"
        && e["level"] == "Metadata"));
    let denied = events
        .iter()
        .find(|e| e["responseStatus"]["code"] == 403 && e["objectRef"]["resource"] == "secrets")
        .or_else(|| events.iter().find(|e| e["responseStatus"]["code"] == 403))
        .expect("a refused request is logged");
    assert_eq!(
        denied["annotations"]["authorization.k8s.io/decision"],
        "forbid"
    );
    assert!(
        denied["user"]["username"]
            .as_str()
            .unwrap()
            .starts_with("system:serviceaccount:team-a:")
    );
    assert_eq!(denied["sourceIPs"], json!(["127.0.0.1"]));
    assert!(events.iter().any(|e| e["responseStatus"]["code"] == 401));
    assert!(
        events
            .iter()
            .any(|e| e["user"]["username"] == "admin" && e["verb"] == "create")
    );
    assert!(!log.contains(&reader), "no credentials in the audit log");
    drop(server);
}

/// The ServiceAccount admission plugin: default name, refusal of a missing ServiceAccount with
/// upstream's message, the projected token volume mounted everywhere (or not, by
/// automountServiceAccountToken), mirror pods left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_admission() {
    let server = common::start().await;
    let api = server.api.clone();
    let admin = api.token.as_str();
    let pod = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
    let one = json!({"containers": [{"name": "c", "image": "busybox"}]});

    // The system namespaces have their default ServiceAccount and root CA from the start.
    let (code, r) = api
        .call_as(
            admin,
            "GET",
            "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
            None,
        )
        .await;
    assert_eq!(code, 200, "{r}");
    assert!(
        r["data"]["ca.crt"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    let (code, p) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/default/pods",
            Some(pod("plain", one.clone())),
        )
        .await;
    assert_eq!(code, 201, "{p}");
    assert_eq!(p["spec"]["serviceAccountName"], "default");
    assert_eq!(p["spec"]["serviceAccount"], "default");
    let vol = &p["spec"]["volumes"][0];
    let vname = vol["name"].as_str().unwrap();
    assert!(
        vname.starts_with("kube-api-access-") && vname.len() == 21,
        "{vname}"
    );
    assert_eq!(
        vol["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]})
    );
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": vname, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])
    );

    // A namespace whose default ServiceAccount does not exist (no controller runs here).
    let (code, _) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces",
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "adm"}})),
        )
        .await;
    assert_eq!(code, 201);
    let (code, st) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/adm/pods",
            Some(pod("p1", one.clone())),
        )
        .await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "pods \"p1\" is forbidden: error looking up service account adm/default: serviceaccount \"default\" not found"
    );
    assert_eq!(st["reason"], "Forbidden");
    assert_eq!(st["details"], json!({"name": "p1", "kind": "pods"}));
    // A generated name is shown as its prefix; a dry run is refused alike.
    let mut generated = pod(
        "",
        json!({"serviceAccountName": "robot", "containers": [{"name": "c", "image": "busybox"}]}),
    );
    generated["metadata"] = json!({"generateName": "web-"});
    let (code, st) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/adm/pods?dryRun=All",
            Some(generated.clone()),
        )
        .await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "pods \"web-\" is forbidden: error looking up service account adm/robot: serviceaccount \"robot\" not found"
    );

    // Once the ServiceAccount exists the pod is admitted, init containers mounted too; a
    // container with its own mount at the path keeps it.
    for (name, automount) in [("robot", None), ("quiet", Some(false))] {
        let mut sa =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
        if let Some(b) = automount {
            sa["automountServiceAccountToken"] = json!(b);
        }
        let (code, r) = api
            .call_as(
                admin,
                "POST",
                "/api/v1/namespaces/adm/serviceaccounts",
                Some(sa),
            )
            .await;
        assert_eq!(code, 201, "{r}");
    }
    let (code, p) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/adm/pods",
            Some(generated),
        )
        .await;
    assert_eq!(code, 201, "{p}");
    assert!(p["metadata"]["name"].as_str().unwrap().starts_with("web-"));
    let (code, p) = api
        .call_as(admin, "POST", "/api/v1/namespaces/adm/pods", Some(pod("mixed", json!({
            "serviceAccount": "robot",
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "a", "image": "busybox"},
                {"name": "b", "image": "busybox", "volumeMounts": [{"name": "own", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "own", "emptyDir": {}}]}))))
        .await;
    assert_eq!(code, 201, "{p}");
    assert_eq!(p["spec"]["serviceAccountName"], "robot");
    let vname = p["spec"]["volumes"][1]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(vname.starts_with("kube-api-access-"));
    assert_eq!(
        p["spec"]["initContainers"][0]["volumeMounts"][0]["name"],
        vname.as_str()
    );
    assert_eq!(
        p["spec"]["containers"][0]["volumeMounts"][0]["name"],
        vname.as_str()
    );
    assert_eq!(
        p["spec"]["containers"][1]["volumeMounts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(p["spec"]["containers"][1]["volumeMounts"][0]["name"], "own");

    // automountServiceAccountToken: the ServiceAccount's false, unless the pod says true.
    let (code, p) = api
        .call_as(admin, "POST", "/api/v1/namespaces/adm/pods",
            Some(pod("q1", json!({"serviceAccountName": "quiet", "containers": [{"name": "c", "image": "busybox"}]}))))
        .await;
    assert_eq!(code, 201, "{p}");
    assert!(
        p["spec"]["volumes"].as_array().is_none_or(|v| v.is_empty()),
        "{p}"
    );
    let (code, p) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/adm/pods",
            Some(pod(
                "q2",
                json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true,
                "containers": [{"name": "c", "image": "busybox"}]}),
            )),
        )
        .await;
    assert_eq!(code, 201, "{p}");
    assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);

    // Mirror pods: not changed, and may not name a ServiceAccount.
    let mut mirror = pod("m1", one.clone());
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    mirror["spec"]["nodeName"] = json!("node-a");
    let (code, p) = api
        .call_as(
            admin,
            "POST",
            "/api/v1/namespaces/adm/pods",
            Some(mirror.clone()),
        )
        .await;
    assert_eq!(code, 201, "{p}");
    assert!(p["spec"].get("serviceAccountName").is_none(), "{p}");
    assert!(
        p["spec"]["volumes"].as_array().is_none_or(|v| v.is_empty()),
        "{p}"
    );
    mirror["metadata"]["name"] = json!("m2");
    mirror["spec"]["serviceAccountName"] = json!("robot");
    let (code, st) = api
        .call_as(admin, "POST", "/api/v1/namespaces/adm/pods", Some(mirror))
        .await;
    assert_eq!(code, 403, "{st}");
    assert_eq!(
        st["message"],
        "pods \"m2\" is forbidden: a mirror pod may not reference service accounts"
    );
    drop(server);
}
