//! Issue 27 against a running API server (in this process, plain HTTP on loopback):
//! impersonation headers and the audit log, the `proxy` subresources of pods and services to a
//! backend on loopback (plain requests and an upgrade), the default admission plugins, the
//! `pods/ephemeralcontainers` subresource, error bodies ending in a newline, and OpenAPI listing
//! every served group version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::Api;

/// A raw request: (status, headers, body bytes).
async fn raw(
    api: &Api,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, http::HeaderMap, Bytes) {
    let mut r = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", api.base))
        .header("Authorization", format!("Bearer {}", api.token));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = api
        .c
        .request(r.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let h = resp.headers().clone();
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    (code, h, b)
}

/// GETs `path` until `done(code)` (reads come from the watch cache, a moment behind writes).
async fn until(api: &Api, path: &str, done: impl Fn(u16) -> bool) -> (u16, Bytes) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, _, b) = raw(api, "GET", path, &[], b"").await;
        if done(code) || tokio::time::Instant::now() > deadline {
            return (code, b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn as_json(b: &Bytes) -> Value {
    serde_json::from_slice(b).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(b)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_and_audit() {
    let server = common::start_with(|cfg| {
        cfg.audit_log_path = Some(cfg.data_dir.join("audit.log"));
    })
    .await;
    let api = server.api.clone();
    let path = "/api/v1/namespaces/default/secrets";
    // The admin may impersonate; the impersonated user's rights apply.
    let (code, _, b) = raw(&api, "GET", path, &[("Impersonate-User", "nobody")], b"").await;
    assert_eq!(code, 403);
    let s = as_json(&b);
    assert_eq!(
        s["message"],
        "secrets is forbidden: User \"nobody\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
    );
    assert!(b.ends_with(b"}\n"), "a Status ends with a newline");
    // A group makes the request that group's.
    let (code, _, b) = raw(
        &api,
        "GET",
        path,
        &[
            ("Impersonate-User", "jane"),
            ("Impersonate-Group", "system:masters"),
        ],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    // SelfSubjectReview answers the impersonated user.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (code, _, b) = raw(
        &api,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &[
            ("Content-Type", "application/json"),
            ("Impersonate-User", "system:serviceaccount:ux:default"),
            ("Impersonate-Extra-Scopes", "view"),
            ("Impersonate-Uid", "u-1"),
        ],
        review.to_string().as_bytes(),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&b));
    let u = &as_json(&b)["status"]["userInfo"];
    assert_eq!(u["username"], "system:serviceaccount:ux:default");
    assert_eq!(
        u["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:ux",
            "system:authenticated"
        ])
    );
    assert_eq!(u["uid"], "u-1");
    assert_eq!(u["extra"]["scopes"], json!(["view"]));
    // Groups without a user: upstream's internal error text.
    let (code, h, b) = raw(&api, "GET", path, &[("Impersonate-Group", "g")], b"").await;
    assert_eq!(code, 500);
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert_eq!(
        String::from_utf8_lossy(&b),
        "Internal Server Error: \"/api/v1/namespaces/default/secrets\": requested [{Group  g    }] without impersonating a user\n"
    );

    // A ServiceAccount without the impersonate verb is refused.
    let (code, _) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"metadata": {"name": "imp"}}),
        )
        .await;
    assert_eq!(code, 201);
    let (code, tr) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/imp/token",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
        )
        .await;
    assert_eq!(code, 201, "{tr}");
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    let sa_api = Api {
        token: token.clone(),
        ..api.clone()
    };
    let (code, _, b) = raw(&sa_api, "GET", path, &[("Impersonate-User", "nobody")], b"").await;
    assert_eq!(code, 403);
    let s = as_json(&b);
    assert_eq!(
        s["message"],
        "users \"nobody\" is forbidden: User \"system:serviceaccount:default:imp\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
    );
    assert_eq!(s["details"], json!({"name": "nobody", "kind": "users"}));
    let (code, _, b) = raw(
        &sa_api,
        "GET",
        path,
        &[("Impersonate-User", "system:serviceaccount:other:builder")],
        b"",
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        as_json(&b)["message"],
        "serviceaccounts \"builder\" is forbidden: User \"system:serviceaccount:default:imp\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"other\""
    );

    // The audit log names both users.
    let log = std::fs::read_to_string(server.dir().join("audit.log")).unwrap();
    let ev = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["impersonatedUser"]["username"] == "nobody")
        .expect("an event with impersonatedUser");
    assert_eq!(ev["user"]["username"], "admin");
    assert_eq!(ev["annotations"]["authorization.k8s.io/decision"], "forbid");
}

/// Dials every pod address on loopback (same port), recording what was asked.
struct ToLoopback(Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>);

impl ferry_apiserver::resourceproxy::PodNetwork for ToLoopback {
    fn allowed(&self, ip: std::net::IpAddr) -> bool {
        ferry_apiserver::resourceproxy::location::is_global_unicast(ip)
    }
    fn dial(&self, addr: std::net::SocketAddr) -> ferry_apiserver::resourceproxy::Dialing {
        self.0.lock().unwrap().push(addr);
        Box::pin(tokio::net::TcpStream::connect(("127.0.0.1", addr.port())))
    }
}

/// A backend on loopback: answers `<method> <target> auth=<whether Authorization came>` to
/// plain requests, and echoes bytes after a `101` to upgrades.
async fn backend() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                let line = String::from_utf8_lossy(&buf)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                if head.contains("\r\nupgrade: websocket") {
                    let _ = s
                        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
                        .await;
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                    return;
                }
                let parts: Vec<&str> = line.split(' ').collect();
                let body = format!(
                    "{} {} auth={}",
                    parts.first().unwrap_or(&""),
                    parts.get(1).unwrap_or(&""),
                    head.contains("\r\nauthorization:")
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Backend: yes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_subresources() {
    let server = common::start().await;
    let api = server.api.clone();
    let port = backend().await;
    let (code, sa) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"metadata": {"name": "default"}}),
        )
        .await;
    assert!(code == 201 || code == 409, "{sa}");
    for (name, ip) in [("lo", "127.0.0.1"), ("web", "10.0.0.5")] {
        let (code, pod) = api
            .call(
                "POST",
                "/api/v1/namespaces/default/pods",
                json!({"metadata": {"name": name}, "spec": {"automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "x", "ports": [{"containerPort": port}]}]}}),
            )
            .await;
        assert_eq!(code, 201, "{pod}");
        let (code, st) = api
            .call(
                "PATCH",
                &format!("/api/v1/namespaces/default/pods/{name}/status"),
                json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}], "phase": "Running"}}),
            )
            .await;
        assert_eq!(code, 200, "{st}");
    }
    // A loopback pod IP is refused, as upstream (only global unicast addresses).
    until(&api, "/api/v1/namespaces/default/pods/web", |c| c == 200).await;
    let (code, _, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/lo/proxy/",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&b));
    assert_eq!(as_json(&b)["message"], "address not allowed");
    // The pod network of this test: every pod address is the backend's host, loopback.
    let dialled = Arc::new(std::sync::Mutex::new(Vec::new()));
    server
        .server
        .set_pod_network(Arc::new(ToLoopback(dialled.clone())));
    until(&api, "/api/v1/namespaces/default/pods/web/proxy/", |c| {
        c == 200
    })
    .await;
    // The first declared port, the path and query passed on, the credentials not.
    let (code, h, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/web/proxy/a/b?x=1&y=2",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(h["x-backend"], "yes");
    assert_eq!(&b[..], b"GET /a/b?x=1&y=2 auth=false");
    assert_eq!(
        dialled.lock().unwrap().last().copied(),
        Some(format!("10.0.0.5:{port}").parse().unwrap())
    );
    let (code, _, b) = raw(
        &api,
        "POST",
        &format!("/api/v1/namespaces/default/pods/http:web:{port}/proxy/"),
        &[],
        b"data",
    )
    .await;
    assert_eq!((code, &b[..]), (200, &b"POST / auth=false"[..]));
    // `.../proxy` redirects to `.../proxy/`.
    let (code, h, _) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/web/proxy?q=1",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 301);
    assert_eq!(
        h["location"],
        "/api/v1/namespaces/default/pods/web/proxy/?q=1"
    );
    // Not a pod, a bad id, a closed port.
    let (code, _, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/nope/proxy/",
        &[],
        b"",
    )
    .await;
    assert_eq!(
        (code, as_json(&b)["message"].clone()),
        (404, json!("pods \"nope\" not found"))
    );
    let (code, _, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/ftp:web:1/proxy/",
        &[],
        b"",
    )
    .await;
    assert_eq!(
        (code, as_json(&b)["message"].clone()),
        (400, json!("invalid pod request \"ftp:web:1\""))
    );
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (code, _, b) = raw(
        &api,
        "GET",
        &format!("/api/v1/namespaces/default/pods/web:{closed}/proxy/"),
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 503);
    assert_eq!(
        as_json(&b)["message"],
        format!(
            "error trying to reach service: dial tcp 10.0.0.5:{closed}: connect: connection refused"
        )
    );

    // services/proxy: through the Service's Endpoints.
    let (code, svc) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/services",
            json!({"metadata": {"name": "web"}, "spec": {"ports": [{"name": "http", "port": 80, "targetPort": port}]}}),
        )
        .await;
    assert_eq!(code, 201, "{svc}");
    let (code, _, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/services/web:80/proxy/",
        &[],
        b"",
    )
    .await;
    assert_eq!(
        code,
        404,
        "no Endpoints yet: {}",
        String::from_utf8_lossy(&b)
    );
    let (code, ep) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/endpoints",
            json!({"metadata": {"name": "web"}, "subsets": []}),
        )
        .await;
    assert_eq!(code, 201, "{ep}");
    let (code, b) = until(
        &api,
        "/api/v1/namespaces/default/services/web:80/proxy/",
        |c| c != 404,
    )
    .await;
    assert_eq!(code, 503);
    assert_eq!(
        as_json(&b)["message"],
        "no endpoints available for service \"web\""
    );
    let (code, _, b) = raw(
        &api,
        "GET",
        "/api/v1/namespaces/default/services/web:81/proxy/",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 503);
    assert_eq!(
        as_json(&b)["message"],
        "no service port 81 found for service \"web\""
    );
    let mut ep = ep;
    ep["subsets"] = json!([{
        "addresses": [{"ip": "10.0.0.5", "targetRef": {"kind": "Pod", "namespace": "default", "name": "web"}}],
        "ports": [{"name": "http", "port": port}]}]);
    let (code, ep) = api
        .call("PUT", "/api/v1/namespaces/default/endpoints/web", ep)
        .await;
    assert_eq!(code, 200, "{ep}");
    until(
        &api,
        "/api/v1/namespaces/default/services/web:80/proxy/",
        |c| c == 200,
    )
    .await;
    for id in ["web:80", "web:http", "http:web:80"] {
        let (code, _, b) = raw(
            &api,
            "GET",
            &format!("/api/v1/namespaces/default/services/{id}/proxy/x"),
            &[],
            b"",
        )
        .await;
        assert_eq!((code, &b[..]), (200, &b"GET /x auth=false"[..]), "{id}");
    }

    // An upgrade goes through both ways.
    let addr = api.base.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let req = format!(
        "GET /api/v1/namespaces/default/pods/web/proxy/ws HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        api.token
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut one = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut one))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "{}", String::from_utf8_lossy(&head));
        head.push(one[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(60), s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_admission_and_ephemeral_containers() {
    let server = common::start().await;
    let api = server.api.clone();
    let (code, _) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"metadata": {"name": "default"}}),
        )
        .await;
    assert!(code == 201 || code == 409);
    let (code, pod) = api
        .call(
            "POST",
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "p"}, "spec": {"automountServiceAccountToken": false,
                "containers": [{"name": "app", "image": "busybox"}],
                "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7}]}}),
        )
        .await;
    assert_eq!(code, 201, "{pod}");
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ])
    );

    // pods/ephemeralcontainers: GET the pod, add one (as kubectl debug does, a strategic merge
    // patch), other changes ignored, existing ones kept.
    let sub = "/api/v1/namespaces/default/pods/p/ephemeralcontainers";
    let (code, got) = until(&api, sub, |c| c == 200).await;
    assert_eq!(
        (code, as_json(&got)["metadata"]["name"].clone()),
        (200, json!("p"))
    );
    let patch = json!({"spec": {"ephemeralContainers": [{"name": "debugger-1", "image": "busybox",
        "targetContainerName": "app", "stdin": true, "tty": true, "resources": {},
        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}]}});
    let (code, _, b) = raw(
        &api,
        "PATCH",
        sub,
        &[("Content-Type", "application/strategic-merge-patch+json")],
        patch.to_string().as_bytes(),
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    let got = as_json(&b);
    assert_eq!(got["spec"]["ephemeralContainers"][0]["name"], "debugger-1");
    assert_eq!(
        got["spec"]["ephemeralContainers"][0]["targetContainerName"],
        "app"
    );
    let (_, stored) = api
        .call("GET", "/api/v1/namespaces/default/pods/p", Value::Null)
        .await;
    assert_eq!(
        stored["spec"]["ephemeralContainers"][0]["name"],
        "debugger-1"
    );
    // PUT: only ephemeralContainers counts; removing one is refused.
    let mut put = stored.clone();
    put["spec"]["containers"][0]["image"] = json!("nginx");
    put["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "debugger-2", "image": "busybox"}));
    let (code, after) = api.call("PUT", sub, put).await;
    assert_eq!(code, 200, "{after}");
    assert_eq!(after["spec"]["containers"][0]["image"], "busybox");
    assert_eq!(
        after["spec"]["ephemeralContainers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let mut removed = after.clone();
    removed["spec"]["ephemeralContainers"] = json!([]);
    let (code, st) = api.call("PUT", sub, removed).await;
    assert_eq!(code, 422, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("existing ephemeral containers \"debugger-1\" may not be removed"),
        "{st}"
    );
    let mut bad = after.clone();
    bad["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "d3", "image": "busybox", "ports": [{"containerPort": 80}]}));
    let (code, st) = api.call("PUT", sub, bad).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(
        st["details"]["causes"][0]["field"], "spec.ephemeralContainers[2].ports",
        "{st}"
    );

    // DefaultIngressClass: the newest default class.
    for (name, default) in [("a", "true"), ("b", "false")] {
        let (code, c) = api
            .call(
                "POST",
                "/apis/networking.k8s.io/v1/ingressclasses",
                json!({"metadata": {"name": name, "annotations": {"ingressclass.kubernetes.io/is-default-class": default}},
                    "spec": {"controller": "example.com/x"}}),
            )
            .await;
        assert_eq!(code, 201, "{c}");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut ing = Value::Null;
    for i in 0.. {
        let (code, created) = api
            .call(
                "POST",
                "/apis/networking.k8s.io/v1/namespaces/default/ingresses",
                json!({"metadata": {"name": format!("i{i}")}, "spec": {"defaultBackend": {"service": {"name": "s", "port": {"number": 80}}}}}),
            )
            .await;
        assert_eq!(code, 201, "{created}");
        if created["spec"]["ingressClassName"] == "a" || tokio::time::Instant::now() > deadline {
            ing = created;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ing["spec"]["ingressClassName"], "a", "{ing}");
    let (code, own) = api
        .call(
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/default/ingresses",
            json!({"metadata": {"name": "own", "annotations": {"kubernetes.io/ingress.class": "x"}},
                "spec": {"defaultBackend": {"service": {"name": "s", "port": {"number": 80}}}}}),
        )
        .await;
    assert_eq!(code, 201, "{own}");
    assert!(own["spec"].get("ingressClassName").is_none(), "{own}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_group_version() {
    let server = common::start().await;
    let api = server.api.clone();
    let (code, _, b) = raw(&api, "GET", "/openapi/v3", &[], b"").await;
    assert_eq!(code, 200);
    let index = as_json(&b);
    let (_, groups) = api.call("GET", "/apis", Value::Null).await;
    let mut want = vec!["api/v1".to_string()];
    for g in groups["groups"].as_array().unwrap() {
        for v in g["versions"].as_array().unwrap() {
            want.push(format!("apis/{}", v["groupVersion"].as_str().unwrap()));
        }
    }
    assert!(want.contains(&"apis/authentication.k8s.io/v1".to_string()));
    assert!(want.contains(&"apis/authorization.k8s.io/v1".to_string()));
    for gv in &want {
        assert!(index["paths"].get(gv).is_some(), "{gv} not in /openapi/v3");
    }
    let (code, _, b) = raw(
        &api,
        "GET",
        "/openapi/v3/apis/authorization.k8s.io/v1",
        &[],
        b"",
    )
    .await;
    assert_eq!(code, 200);
    let doc = as_json(&b);
    let post = &doc["paths"]["/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews"]
        ["post"];
    assert_eq!(
        post["operationId"],
        "createAuthorizationV1NamespacedLocalSubjectAccessReview"
    );
    assert!(
        doc["components"]["schemas"]
            .get("io.k8s.api.authorization.v1.LocalSubjectAccessReview")
            .is_some()
    );
    let (code, _, b) = raw(
        &api,
        "GET",
        "/openapi/v2",
        &[("Accept", "application/json")],
        b"",
    )
    .await;
    assert_eq!(code, 200);
    let v2 = as_json(&b);
    for gv in &want {
        let prefix = format!("/{gv}/");
        assert!(
            v2["paths"]
                .as_object()
                .unwrap()
                .keys()
                .any(|p| p.starts_with(&prefix)),
            "{gv} not in /openapi/v2"
        );
    }
}
