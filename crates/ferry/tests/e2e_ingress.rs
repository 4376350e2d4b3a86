//! Ingress end to end on `ferry up`: every Ingress and IngressClass of seed 004 applied
//! verbatim with kubectl, answered by real pods (built-in images) through Ferry's Ingress proxy
//! as the seed describes, checked with curl (`--resolve` for host names, TLS verified against
//! the Secret's certificate); headers, WebSocket upgrades, Events, and a rolling update of a
//! backend under a client loop with zero failed requests.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{Ferry, eventually, json};

/// Backends: Deployments of the built-in images behind the Services the seed's examples name.
const BACKENDS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: service1}
spec:
  replicas: 2
  selector: {matchLabels: {app: service1}}
  template:
    metadata: {labels: {app: service1}}
    spec:
      containers: [{name: c, image: registry.k8s.io/serve_hostname}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: service2}
spec:
  replicas: 1
  selector: {matchLabels: {app: service2}}
  template:
    metadata: {labels: {app: service2}}
    spec:
      containers: [{name: c, image: registry.k8s.io/serve_hostname}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: service3}
spec:
  replicas: 1
  selector: {matchLabels: {app: service3}}
  template:
    metadata: {labels: {app: service3}}
    spec:
      containers: [{name: c, image: nginx}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: test}
spec:
  replicas: 1
  selector: {matchLabels: {app: test}}
  template:
    metadata: {labels: {app: test}}
    spec:
      containers: [{name: c, image: registry.k8s.io/serve_hostname}]
---
apiVersion: v1
kind: Service
metadata: {name: service1}
spec:
  selector: {app: service1}
  ports:
  - {name: http, port: 80, targetPort: 9376}
  - {name: fanout, port: 4200, targetPort: 9376}
---
apiVersion: v1
kind: Service
metadata: {name: service2}
spec:
  selector: {app: service2}
  ports:
  - {name: http, port: 80, targetPort: 9376}
  - {name: fanout, port: 8080, targetPort: 9376}
---
apiVersion: v1
kind: Service
metadata: {name: service3}
spec:
  selector: {app: service3}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: test}
spec:
  selector: {app: test}
  ports: [{port: 80, targetPort: 9376}]
"#;

/// A pod answering with the request's headers as JSON, and echoing bytes after a `101` for an
/// `Upgrade` request (a stand-in for a WebSocket server).
const ECHO: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: echo, labels: {app: echo}}
spec:
  containers:
  - name: c
    image: python
    command: ["python3", "-c", "import json,os,socketserver\nclass H(socketserver.StreamRequestHandler):\n  def handle(self):\n    while True:\n      line=self.rfile.readline()\n      if not line: return\n      hs={}\n      while True:\n        l=self.rfile.readline().decode()\n        if l in ('\\r\\n',''): break\n        k,v=l.split(':',1); hs[k.strip().lower()]=v.strip()\n      if hs.get('upgrade'):\n        self.wfile.write(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: '+hs['upgrade'].encode()+b'\\r\\nConnection: Upgrade\\r\\n\\r\\n'); self.wfile.flush()\n        while True:\n          b=self.request.recv(4096)\n          if not b: return\n          self.request.sendall(b)\n      body=json.dumps({'line':line.decode().strip(),'headers':hs}).encode()\n      self.wfile.write(b'HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n'%len(body)+body); self.wfile.flush()\nsocketserver.ThreadingTCPServer.allow_reuse_address=True\nsocketserver.ThreadingTCPServer((os.environ['POD_IP'],8000),H).serve_forever()\n"]
    env:
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: web, port: 80, targetPort: 8000}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: echo}
spec:
  rules:
  - host: echo.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: echo, port: {name: web}}}}
"#;

/// The IngressClasses of seed 004, verbatim.
const SEED_CLASSES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: external-lb
spec:
  controller: example.com/ingress-controller
  parameters:
    apiGroup: k8s.example.com
    kind: IngressParameters
    name: external-lb
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: external-lb-1
spec:
  controller: example.com/ingress-controller
  parameters:
    # 이 인그레스클래스에 대한 파라미터는 "external-config-1" 라는
    # ClusterIngressParameter(API 그룹 k8s.example.net)에 기재되어 있다.
    # 이 정의는 쿠버네티스가 
    # 클러스터 범위의 파라미터 리소스를 검색하도록 한다.
    scope: Cluster
    apiGroup: k8s.example.net
    kind: ClusterIngressParameter
    name: external-config-1
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: external-lb-2
spec:
  controller: example.com/ingress-controller
  parameters:
    # 이 인그레스클래스에 대한 파라미터는 
    # "external-configuration" 네임스페이스에 있는
    # "external-config" 라는 IngressParameter(API 그룹 k8s.example.com)에 기재되어 있다.
    scope: Namespace
    apiGroup: k8s.example.com
    kind: IngressParameter
    namespace: external-configuration
    name: external-config
"#;

const SEED_NGINX_CLASS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  labels:
    app.kubernetes.io/component: controller
  name: nginx-example
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: k8s.io/ingress-nginx
"#;

const MINIMAL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: minimal-ingress
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /
spec:
  ingressClassName: nginx-example
  rules:
  - http:
      paths:
      - path: /testpath
        pathType: Prefix
        backend:
          service:
            name: test
            port:
              number: 80
"#;

const RESOURCE_BACKEND: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ingress-resource-backend
spec:
  defaultBackend:
    resource:
      apiGroup: k8s.example.com
      kind: StorageBucket
      name: static-assets
  rules:
    - http:
        paths:
          - path: /icons
            pathType: ImplementationSpecific
            backend:
              resource:
                apiGroup: k8s.example.com
                kind: StorageBucket
                name: icon-assets
"#;

const WILDCARD: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ingress-wildcard-host
spec:
  rules:
  - host: "foo.bar.com"
    http:
      paths:
      - pathType: Prefix
        path: "/bar"
        backend:
          service:
            name: service1
            port:
              number: 80
  - host: "*.foo.com"
    http:
      paths:
      - pathType: Prefix
        path: "/foo"
        backend:
          service:
            name: service2
            port:
              number: 80
"#;

const SINGLE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: test-ingress
spec:
  defaultBackend:
    service:
      name: test
      port:
        number: 80
"#;

const FANOUT: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: simple-fanout-example
spec:
  rules:
  - host: foo.bar.com
    http:
      paths:
      - path: /foo
        pathType: Prefix
        backend:
          service:
            name: service1
            port:
              number: 4200
      - path: /bar
        pathType: Prefix
        backend:
          service:
            name: service2
            port:
              number: 8080
"#;

const VHOSTS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: name-virtual-host-ingress
spec:
  rules:
  - host: foo.bar.com
    http:
      paths:
      - pathType: Prefix
        path: "/"
        backend:
          service:
            name: service1
            port:
              number: 80
  - host: bar.foo.com
    http:
      paths:
      - pathType: Prefix
        path: "/"
        backend:
          service:
            name: service2
            port:
              number: 80
"#;

const VHOSTS_CATCH_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: name-virtual-host-ingress-no-third-host
spec:
  rules:
  - host: first.bar.com
    http:
      paths:
      - pathType: Prefix
        path: "/"
        backend:
          service:
            name: service1
            port:
              number: 80
  - host: second.bar.com
    http:
      paths:
      - pathType: Prefix
        path: "/"
        backend:
          service:
            name: service2
            port:
              number: 80
  - http:
      paths:
      - pathType: Prefix
        path: "/"
        backend:
          service:
            name: service3
            port:
              number: 80
"#;

const TLS_INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: tls-example-ingress
spec:
  tls:
  - hosts:
      - https-example.foo.com
    secretName: testsecret-tls
  rules:
  - host: https-example.foo.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: service1
            port:
              number: 80
"#;

/// Where the proxy of `ferry up` listens (its log says so once it is started).
fn edge_addrs(f: &Ferry) -> (String, String) {
    assert!(
        eventually(60, || f.ingress_addrs().is_some()),
        "no ingress addresses in the log:\n{}",
        f.log()
    );
    f.ingress_addrs().unwrap_or_default()
}

struct Edge {
    http: String,
    https: String,
}

impl Edge {
    fn port(addr: &str) -> &str {
        addr.rsplit(':').next().unwrap_or("")
    }

    /// `curl` through the proxy for `host` and `path`; returns (status, body).
    fn get(&self, host: &str, path: &str) -> (u16, String) {
        let port = Self::port(&self.http);
        curl(&[
            "--resolve",
            &format!("{host}:{port}:127.0.0.1"),
            &format!("http://{host}:{port}{path}"),
        ])
    }

    fn get_tls(&self, host: &str, path: &str, cacert: &std::path::Path) -> (u16, String) {
        let port = Self::port(&self.https);
        curl(&[
            "--cacert",
            &cacert.display().to_string(),
            "--resolve",
            &format!("{host}:{port}:127.0.0.1"),
            &format!("https://{host}:{port}{path}"),
        ])
    }
}

/// Runs curl; (status, body); status 0 when curl itself failed (e.g. certificate refused).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.trim().to_string())
}

/// Polls until `host` + `path` is answered by a pod of `svc` (a body starting with `svc-`),
/// or — for `None` — with 404.
fn expect(e: &Edge, host: &str, path: &str, svc: Option<&str>) {
    let mut last = (0, String::new());
    let ok = eventually(60, || {
        last = e.get(host, path);
        match svc {
            Some("service3") => last.0 == 200 && last.1.contains("Welcome to nginx"),
            Some(s) => last.0 == 200 && last.1.starts_with(&format!("{s}-")),
            None => last.0 == 404,
        }
    });
    assert!(ok, "{host}{path}: want {svc:?}, last answer {last:?}");
}

fn apply(f: &Ferry, manifest: &str) {
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], manifest);
    assert!(
        out.status.success(),
        "apply failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        manifest
    );
}

fn delete(f: &Ferry, manifest: &str) {
    let out = f.k_stdin("kubectl", &["delete", "-f", "-", "--wait=false"], manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn address(f: &Ferry, name: &str) -> String {
    let out = f.kubectl(&[
        "get",
        "ingress",
        name,
        "-o",
        "jsonpath={.status.loadBalancer.ingress[0].ip}",
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn events_of(f: &Ferry, name: &str) -> String {
    let out = f.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "json",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ready_pods(f: &Ferry, app: &str, want: usize) -> bool {
    let out = f.kubectl(&[
        "get",
        "endpointslices",
        "-l",
        &format!("kubernetes.io/service-name={app}"),
        "-o",
        "json",
    ]);
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let n = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"].as_bool() != Some(false))
        .count();
    n >= want
}

fn tls_secret(
    dir: &std::path::Path,
    name: &str,
    cn: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let crt = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    let st = Command::new("openssl")
        .args([
            "req", "-x509", "-nodes", "-days", "365", "-newkey", "rsa:2048", "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .args([
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            &format!("subjectAltName=DNS:{cn}"),
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success());
    (crt, key)
}

#[test]
fn seed_004_ingress_examples() {
    let f = Ferry::start();
    let (http, https) = edge_addrs(&f);
    let e = Edge { http, https };
    apply(&f, BACKENDS);

    // The IngressClasses of the seed, verbatim: `external-lb` (parameters without scope) is
    // defaulted to scope Cluster as upstream does.
    apply(&f, SEED_CLASSES);
    let scope = f.k(
        "kubectl",
        &[
            "get",
            "ingressclass",
            "external-lb",
            "-o",
            "jsonpath={.spec.parameters.scope}",
        ],
    );
    assert_eq!(scope, "Cluster");
    // `ferry up` installs the default class `ferry`.
    let ferry_class = json(&f.k("kubectl", &["get", "ingressclass", "ferry", "-o", "json"]));
    assert_eq!(
        ferry_class["spec"]["controller"],
        "ferry.dev/ingress-controller"
    );

    for (svc, n) in [
        ("service1", 2),
        ("service2", 1),
        ("service3", 1),
        ("test", 1),
    ] {
        assert!(
            eventually(90, || ready_pods(&f, svc, n)),
            "{svc} has no ready endpoints"
        );
    }

    // Single service: everything goes to the default backend; the address is ours.
    apply(&f, SINGLE);
    expect(&e, "anything.example", "/", Some("test"));
    expect(&e, "127.0.0.1", "/some/path?q=1", Some("test"));
    assert!(eventually(30, || address(&f, "test-ingress") == "127.0.0.1"));
    let table = f.k("kubectl", &["get", "ingress", "test-ingress"]);
    assert!(table.contains("127.0.0.1"), "{table}");
    delete(&f, SINGLE);
    expect(&e, "anything.example", "/", None);

    // Simple fanout: one host, two services by path (ports 4200 and 8080 of the Services).
    apply(&f, FANOUT);
    expect(&e, "foo.bar.com", "/foo", Some("service1"));
    expect(&e, "foo.bar.com", "/foo/x/y", Some("service1"));
    expect(&e, "foo.bar.com", "/bar", Some("service2"));
    expect(&e, "foo.bar.com", "/foobar", None);
    expect(&e, "foo.bar.com", "/", None);
    expect(&e, "other.bar.com", "/foo", None);
    assert!(eventually(30, || address(&f, "simple-fanout-example") == "127.0.0.1"));
    delete(&f, FANOUT);

    // Name-based virtual hosting.
    apply(&f, VHOSTS);
    expect(&e, "foo.bar.com", "/", Some("service1"));
    expect(&e, "bar.foo.com", "/any", Some("service2"));
    expect(&e, "baz.foo.com", "/", None);
    delete(&f, VHOSTS);

    // ... and with a rule without a host: everything else goes to service3 (nginx).
    apply(&f, VHOSTS_CATCH_ALL);
    expect(&e, "first.bar.com", "/", Some("service1"));
    expect(&e, "second.bar.com", "/", Some("service2"));
    expect(&e, "third.bar.com", "/", Some("service3"));
    expect(&e, "127.0.0.1", "/index.html", Some("service3"));
    delete(&f, VHOSTS_CATCH_ALL);

    // Host wildcards: one label only.
    apply(&f, WILDCARD);
    expect(&e, "foo.bar.com", "/bar", Some("service1"));
    expect(&e, "bar.foo.com", "/foo", Some("service2"));
    expect(&e, "baz.bar.foo.com", "/foo", None);
    expect(&e, "foo.com", "/foo", None);
    delete(&f, WILDCARD);

    // TLS: the certificate of the Secret, verified by curl against that certificate; HTTP/2.
    let (crt, key) = tls_secret(f.dir.path(), "testsecret", "https-example.foo.com");
    f.k(
        "kubectl",
        &[
            "create",
            "secret",
            "tls",
            "testsecret-tls",
            "--cert",
            &crt.display().to_string(),
            "--key",
            &key.display().to_string(),
        ],
    );
    apply(&f, TLS_INGRESS);
    let mut last = (0, String::new());
    assert!(
        eventually(60, || {
            last = e.get_tls("https-example.foo.com", "/", &crt);
            last.0 == 200 && last.1.starts_with("service1-")
        }),
        "TLS: {last:?}"
    );
    let port = Edge::port(&e.https);
    let v = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_version}", "--cacert"])
        .arg(&crt)
        .args([
            "--resolve",
            &format!("https-example.foo.com:{port}:127.0.0.1"),
            &format!("https://https-example.foo.com:{port}/"),
        ])
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&v.stdout),
        "2",
        "HTTP/2 over TLS (ALPN)"
    );
    // A name no Secret covers gets the default certificate: refused by that CA.
    let (code, _) = e.get_tls("other.foo.com", "/", &crt);
    assert_eq!(code, 0, "a name without a certificate must not verify");

    // The Secret changes: the new certificate is served without a restart.
    let (crt2, key2) = tls_secret(f.dir.path(), "testsecret2", "https-example.foo.com");
    let secret_yaml = f.k(
        "kubectl",
        &[
            "create",
            "secret",
            "tls",
            "testsecret-tls",
            "--cert",
            &crt2.display().to_string(),
            "--key",
            &key2.display().to_string(),
            "--dry-run=client",
            "-o",
            "yaml",
        ],
    );
    apply(&f, &secret_yaml);
    assert!(
        eventually(60, || e.get_tls("https-example.foo.com", "/", &crt2).0
            == 200),
        "the renewed certificate is served"
    );
    // A missing Secret: an Event on the Ingress, and the default certificate.
    f.k("kubectl", &["delete", "secret", "testsecret-tls"]);
    assert!(
        eventually(60, || e.get_tls("https-example.foo.com", "/", &crt2).0 == 0),
        "default certificate once the Secret is gone"
    );
    assert!(
        eventually(30, || events_of(&f, "tls-example-ingress")
            .contains("BadSecret")),
        "no BadSecret event: {}",
        events_of(&f, "tls-example-ingress")
    );
    delete(&f, TLS_INGRESS);

    // Resource backends: served as the default backend (404), with an Event.
    apply(&f, RESOURCE_BACKEND);
    assert!(eventually(30, || events_of(&f, "ingress-resource-backend")
        .contains("UnsupportedBackend")));
    expect(&e, "x.test", "/icons/a.png", None);
    delete(&f, RESOURCE_BACKEND);

    // An Ingress without a class gets the default IngressClass at creation (DefaultIngressClass
    // admission): Ferry's, while it is the only default.
    apply(&f, SINGLE);
    let class_of = |name: &str| {
        f.k(
            "kubectl",
            &[
                "get",
                "ingress",
                name,
                "-o",
                "jsonpath={.spec.ingressClassName}",
            ],
        )
    };
    assert_eq!(class_of("test-ingress").trim(), "ferry");
    // The class of another controller: not served, no address. Once the seed's nginx-example is
    // a second default, the newest default is the one a new classless Ingress gets (upstream's
    // rule), and Ferry does not serve it.
    apply(&f, SEED_NGINX_CLASS);
    apply(&f, MINIMAL);
    expect(&e, "x.test", "/testpath", Some("test"));
    assert!(eventually(30, || address(&f, "test-ingress") == "127.0.0.1"));
    assert_eq!(address(&f, "minimal-ingress"), "");
    apply(
        &f,
        &SINGLE.replace("name: test-ingress", "name: classless-later"),
    );
    assert_eq!(class_of("classless-later").trim(), "nginx-example");
    assert_eq!(address(&f, "classless-later"), "");
    // The legacy annotation picks Ferry even with another class named.
    f.k(
        "kubectl",
        &[
            "annotate",
            "ingress",
            "minimal-ingress",
            "kubernetes.io/ingress.class=ferry",
        ],
    );
    assert!(eventually(30, || address(&f, "minimal-ingress") == "127.0.0.1"));
}

/// Forwarded headers, WebSocket-style upgrades, and a rolling update under load.
#[test]
fn ingress_headers_upgrades_and_rollout() {
    let f = Ferry::start();
    let (http, https) = edge_addrs(&f);
    let e = Edge { http, https };
    apply(&f, BACKENDS.split("\n---\n").next().unwrap_or_default());
    apply(
        &f,
        r#"
apiVersion: v1
kind: Service
metadata: {name: service1}
spec:
  selector: {app: service1}
  ports: [{name: http, port: 80, targetPort: 9376}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  rules:
  - host: web.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: service1, port: {number: 80}}}}
"#,
    );
    apply(&f, ECHO);

    // X-Forwarded-* and X-Real-IP; the client's own X-Forwarded-For is not trusted.
    let port = Edge::port(&e.http).to_string();
    let mut last = (0, String::new());
    assert!(
        eventually(90, || {
            last = curl(&[
                "-H",
                "X-Forwarded-For: 6.6.6.6",
                "--resolve",
                &format!("echo.test:{port}:127.0.0.1"),
                &format!("http://echo.test:{port}/p?q=1"),
            ]);
            last.0 == 200
        }),
        "echo: {last:?}"
    );
    let v = json(&last.1);
    let h = &v["headers"];
    assert_eq!(v["line"], "GET /p?q=1 HTTP/1.1");
    assert_eq!(h["host"], format!("echo.test:{port}"));
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-real-ip"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], format!("echo.test:{port}"));
    assert_eq!(h["x-forwarded-port"], port);

    // Upgrade pass-through: 101, then bytes both ways.
    let mut s = TcpStream::connect(&e.http).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: echo.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .expect("write");
    let mut buf = vec![0u8; 4096];
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).expect("read head");
        assert!(n > 0, "closed before the 101");
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"ping through the ingress").expect("write");
    let mut got = Vec::new();
    while got.len() < 24 {
        let n = s.read(&mut buf).expect("read echo");
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(&got[..], b"ping through the ingress");

    // A rolling update of the backend Deployment with a client looping through the Ingress:
    // no request fails.
    assert!(eventually(90, || ready_pods(&f, "service1", 2)));
    assert!(eventually(60, || e.get("web.test", "/").0 == 200));
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let client = {
        let (stop, ok, failed, errors) = (stop.clone(), ok.clone(), failed.clone(), errors.clone());
        let addr = e.http.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let p = Edge::port(&addr).to_string();
                let (code, body) = curl(&[
                    "--resolve",
                    &format!("web.test:{p}:127.0.0.1"),
                    &format!("http://web.test:{p}/"),
                ]);
                if code == 200 && body.starts_with("service1-") {
                    ok.fetch_add(1, Ordering::SeqCst);
                } else {
                    failed.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut v) = errors.lock() {
                        v.push((code, body));
                    }
                }
            }
        })
    };
    f.k("kubectl", &["rollout", "restart", "deployment/service1"]);
    f.k(
        "kubectl",
        &["rollout", "status", "deployment/service1", "--timeout=120s"],
    );
    // Keep going while the old pods drain and go.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    client.join().expect("client");
    let errors = errors.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(ok.load(Ordering::SeqCst) > 20, "too few requests");
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "failures during the rollout: {errors:?}"
    );
}
