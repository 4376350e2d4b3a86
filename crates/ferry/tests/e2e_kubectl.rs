//! End to end with real kubectl (the machine's, and Debian's 1.20 when provided).

mod common;

use common::{Ferry, eventually, is_120, json, kubectls};

const SEED: &str = include_str!("fixtures/seed-manifests.yaml");

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn apply_seed_manifests_then_configure() {
    for bin in kubectls() {
        let f = Ferry::start();
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], SEED);
        assert!(
            out.status.success(),
            "{bin} apply failed: {}\n{}",
            stderr(&out),
            f.log()
        );
        let text = stdout(&out);
        for what in [
            "service/hostnames created",
            "deployment.apps/hostnames created",
            "service/my-service created",
            "endpoints/my-service created",
            "endpointslice.discovery.k8s.io/example-abc created",
            "pod/nginx created",
            "ingress.networking.k8s.io/minimal-ingress created",
            "networkpolicy.networking.k8s.io/test-network-policy created",
        ] {
            assert!(text.contains(what), "{bin}: missing {what:?} in:\n{text}");
        }
        // Unchanged.
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], SEED);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).contains("service/hostnames unchanged"),
            "{}",
            stdout(&out)
        );
        // Change the Service port 80 -> 81.
        let changed = SEED.replacen(
            "      port: 80\n      targetPort: 9376",
            "      port: 81\n      targetPort: 9376",
            1,
        );
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], &changed);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).contains("service/hostnames configured"),
            "{}",
            stdout(&out)
        );
        let svc = json(&f.k(&bin, &["get", "svc", "hostnames", "-o", "json"]));
        let ports = svc["spec"]["ports"].as_array().expect("ports");
        assert_eq!(ports.len(), 1, "{svc}");
        assert_eq!(ports[0]["port"], 81);
        assert_eq!(ports[0]["targetPort"], 9376);
        assert_eq!(ports[0]["name"], "default");
        assert_eq!(ports[0]["protocol"], "TCP");
        let raw = serde_json::to_string(&svc).expect("json");
        assert!(
            !raw.contains("$patch") && !raw.contains("$setElementOrder"),
            "directive leaked: {raw}"
        );
        let last =
            svc["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
                .as_str()
                .expect("annotation");
        assert!(last.contains("\"port\":81"), "{last}");
        // Server-side apply.
        let ssa = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa-cm\ndata:\n  a: \"1\"\n";
        let out = f.k_stdin(&bin, &["apply", "--server-side", "-f", "-"], ssa);
        assert!(out.status.success(), "{bin} ssa: {}", stderr(&out));
        assert!(
            stdout(&out).contains("serverside-applied"),
            "{}",
            stdout(&out)
        );
        let mut args = vec!["get", "cm", "ssa-cm", "-o", "json"];
        if !is_120(&bin) {
            args.push("--show-managed-fields");
        }
        let cm = json(&f.k(&bin, &args));
        assert_eq!(cm["data"]["a"], "1");
        let mf = cm["metadata"]["managedFields"]
            .as_array()
            .expect("managedFields");
        assert!(
            mf.iter()
                .any(|m| m["manager"] == "kubectl" && m["operation"] == "Apply"),
            "{cm}"
        );
    }
}

/// `kubectl apply` then `kubectl apply --server-side` with a changed field: no conflict, as
/// upstream (kubectl 1.26+ upgrades the managed fields itself; older ones rely on the server's
/// last-applied migration), and the annotation follows the server-side applied configuration.
#[test]
fn client_side_then_server_side_apply_migrates() {
    let f = Ferry::start();
    for bin in kubectls() {
        let name = if is_120(&bin) { "mig-120" } else { "mig-new" };
        let v1 = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"1\"\n  b: \"2\"\n"
        );
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], &v1);
        assert!(out.status.success(), "{bin} csa: {}", stderr(&out));
        let v2 = v1.replace("a: \"1\"", "a: \"3\"");
        let out = f.k_stdin(&bin, &["apply", "--server-side", "-f", "-"], &v2);
        assert!(
            out.status.success(),
            "{bin} ssa after csa conflicted: {}\n{}",
            stderr(&out),
            stdout(&out)
        );
        let cm = json(&f.k(&bin, &["get", "cm", name, "-o", "json"]));
        assert_eq!(cm["data"]["a"], "3", "{cm}");
        assert_eq!(cm["data"]["b"], "2", "{cm}");
        let last =
            cm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        assert!(
            last.contains("\"a\":\"3\""),
            "{bin}: annotation not updated: {last}"
        );
        if is_120(&bin) {
            // kubectl 1.20 does not upgrade the client-side managers: they keep co-owning `b`.
            continue;
        }
        // kubectl 1.26+ moved the client-side managers' fields to its own apply entry, so
        // dropping a field in the next server-side apply removes it.
        let v3 = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"3\"\n"
        );
        let out = f.k_stdin(&bin, &["apply", "--server-side", "-f", "-"], &v3);
        assert!(out.status.success(), "{bin}: {}", stderr(&out));
        let cm = json(&f.k(&bin, &["get", "cm", name, "-o", "json"]));
        assert!(cm["data"].get("b").is_none(), "{bin}: b survived: {cm}");
    }
    // The requests above are counted in the API server's metrics, with upstream's names.
    let bin = kubectls().into_iter().next().expect("kubectl");
    let text = f.k(&bin, &["get", "--raw", "/metrics"]);
    let applied = text.lines().find(|l| {
        l.starts_with("apiserver_request_total{verb=\"APPLY\"")
            && l.contains("resource=\"configmaps\"")
            && l.contains("code=\"200\"")
    });
    assert!(
        applied.is_some(),
        "no APPLY count for configmaps in:\n{text}"
    );
    assert!(
        text.lines().any(
            |l| l.starts_with("apiserver_request_duration_seconds_bucket{")
                && l.contains("verb=\"GET\"")
        ),
        "{text}"
    );
}

#[test]
fn create_twice_is_already_exists() {
    for bin in kubectls() {
        let f = Ferry::start();
        let m = "apiVersion: v1\nkind: Service\nmetadata:\n  name: webc\nspec:\n  ports:\n  - port: 80\n";
        let out = f.k_stdin(&bin, &["create", "-f", "-"], m);
        assert!(out.status.success(), "{}", stderr(&out));
        let out = f.k_stdin(&bin, &["create", "-f", "-"], m);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("Error from server (AlreadyExists)")
                && stderr(&out).contains("services \"webc\" already exists"),
            "{bin}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn get_output_formats() {
    for bin in kubectls() {
        let f = Ferry::start();
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], SEED);
        assert!(out.status.success(), "{}", stderr(&out));
        let t = f.k(&bin, &["get", "svc"]);
        let header = t.lines().next().unwrap_or("");
        for col in [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE",
        ] {
            assert!(header.contains(col), "{bin}: {header}");
        }
        assert!(t.contains("hostnames") && t.contains("80/TCP"), "{t}");
        let wide = f.k(&bin, &["get", "svc", "-o", "wide"]);
        assert!(
            wide.lines().next().unwrap_or("").contains("SELECTOR")
                && wide.contains("app=hostnames"),
            "{wide}"
        );
        let all = f.k(&bin, &["get", "svc", "-A"]);
        assert!(
            all.lines().next().unwrap_or("").starts_with("NAMESPACE") && all.contains("default "),
            "{all}"
        );
        let y = f.k(&bin, &["get", "svc", "hostnames", "-o", "yaml"]);
        assert!(
            y.contains("kind: Service") && y.contains("targetPort: 9376"),
            "{y}"
        );
        let names = f.k(&bin, &["get", "svc", "-o", "name"]);
        assert!(
            names.contains("service/hostnames") && names.contains("service/my-service"),
            "{names}"
        );
        let jp = f.k(
            &bin,
            &[
                "get",
                "svc",
                "hostnames",
                "-o",
                "jsonpath={.spec.ports[0].targetPort}",
            ],
        );
        assert_eq!(jp.trim(), "9376");
        let l = f.k(
            &bin,
            &[
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=proxy",
                "-o",
                "name",
            ],
        );
        assert_eq!(l.trim(), "pod/nginx");
        let l = f.k(
            &bin,
            &[
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name!=proxy",
                "-o",
                "name",
            ],
        );
        // Only the seed Deployment's pods (made by the ReplicaSet controller) lack the label.
        assert!(l.lines().all(|p| p.starts_with("pod/hostnames-")), "{l}");
        let fs = f.k(
            &bin,
            &[
                "get",
                "svc",
                "--field-selector",
                "metadata.name=my-service",
                "-o",
                "name",
            ],
        );
        assert_eq!(fs.trim(), "service/my-service");
        let sorted = f.k(
            &bin,
            &["get", "svc", "--sort-by=.metadata.name", "-o", "name"],
        );
        let order: Vec<&str> = sorted.lines().collect();
        assert_eq!(
            order,
            vec![
                "service/hostnames",
                "service/kubernetes",
                "service/my-service"
            ],
            "{sorted}"
        );
        let labels = f.k(&bin, &["get", "pods", "--show-labels"]);
        assert!(labels.contains("app.kubernetes.io/name=proxy"), "{labels}");
        let d = f.k(&bin, &["describe", "svc", "hostnames"]);
        assert!(
            d.contains("Name:") && d.contains("hostnames") && d.contains("Selector:"),
            "{d}"
        );
        let out = f.k(&bin, &["label", "svc", "hostnames", "tier=fe"]);
        assert!(out.contains("labeled"), "{out}");
        let lab = json(&f.k(&bin, &["get", "svc", "hostnames", "-o", "json"]));
        assert_eq!(lab["metadata"]["labels"]["tier"], "fe");
        f.k(&bin, &["label", "svc", "hostnames", "tier-"]);
        let lab = json(&f.k(&bin, &["get", "svc", "hostnames", "-o", "json"]));
        assert!(lab["metadata"]["labels"].get("tier").is_none(), "{lab}");
    }
}

#[test]
fn delete_with_each_cascade() {
    for bin in kubectls() {
        let f = Ferry::start();
        for (i, cascade) in ["background", "foreground", "orphan"].iter().enumerate() {
            let name = format!("del{i}");
            let m = format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: b\n"
            );
            let out = f.k_stdin(&bin, &["create", "-f", "-"], &m);
            assert!(out.status.success(), "{}", stderr(&out));
            let arg = format!("--cascade={cascade}");
            let out = f.kubectl_with(&bin, &["delete", "cm", &name, &arg, "--timeout=20s"], None);
            assert!(
                out.status.success(),
                "{bin} {cascade}: {}\n{}",
                stderr(&out),
                f.log()
            );
            assert!(stdout(&out).contains("deleted"), "{}", stdout(&out));
            let out = f.kubectl_with(&bin, &["get", "cm", &name], None);
            assert!(
                !out.status.success(),
                "{bin}: {name} still there after {cascade}"
            );
        }
        // A foreground delete waits for a dependent, then completes when it is gone.
        let owner = f.k_stdin(
            &bin,
            &["create", "-f", "-", "-o", "json"],
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owner\n",
        );
        assert!(owner.status.success(), "{}", stderr(&owner));
        let owner = json(&stdout(&owner));
        let uid = owner["metadata"]["uid"].as_str().expect("uid").to_string();
        let dep = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dependent\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {uid}\n    blockOwnerDeletion: true\n"
        );
        let out = f.k_stdin(&bin, &["create", "-f", "-"], &dep);
        assert!(out.status.success(), "{}", stderr(&out));
        let out = f.kubectl_with(
            &bin,
            &[
                "delete",
                "cm",
                "owner",
                "--cascade=foreground",
                "--timeout=30s",
            ],
            None,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            !f.kubectl_with(&bin, &["get", "cm", "dependent"], None)
                .status
                .success(),
            "dependent survived"
        );
        assert!(
            !f.kubectl_with(&bin, &["get", "cm", "owner"], None)
                .status
                .success(),
            "owner survived"
        );
    }
}

#[test]
fn watch_and_wait() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};
    let f = Ferry::start();
    let kc = f.kubeconfig.clone();
    let cache = f.dir.path().join("kcache-w");
    // A ConfigMap the watch lists first: once it is printed, the watch is established (no fixed
    // sleep that a loaded machine outruns).
    f.k(
        "kubectl",
        &["create", "configmap", "w0", "--from-literal=a=b"],
    );
    let mut child = std::process::Command::new("kubectl")
        .env("KUBECONFIG", &kc)
        .args(["--cache-dir"])
        .arg(&cache)
        .args([
            "get",
            "cm",
            "-w",
            "--output-watch-events",
            "--request-timeout=120s",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl -w");
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(mut s) = seen.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        })
    };
    let text = || seen.lock().map(|s| s.clone()).unwrap_or_default();
    let has = |event: &str, name: &str| {
        text()
            .lines()
            .any(|l| l.starts_with(event) && l.split_whitespace().nth(1) == Some(name))
    };
    assert!(
        eventually(60, || has("ADDED", "w0")),
        "the watch never listed w0:\n{}",
        text()
    );
    f.k(
        "kubectl",
        &["create", "configmap", "w1", "--from-literal=a=b"],
    );
    f.k("kubectl", &["label", "cm", "w1", "x=y"]);
    f.k("kubectl", &["delete", "cm", "w1"]);
    let all = eventually(60, || {
        ["ADDED", "MODIFIED", "DELETED"]
            .iter()
            .all(|ev| has(ev, "w1"))
    });
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    let _ = reader.join();
    assert!(
        all,
        "missing ADDED, MODIFIED or DELETED of w1 in:\n{}\n{}",
        text(),
        stderr(&out)
    );
    // wait --for=condition on a pod whose status is patched later.
    f.k_stdin("kubectl", &["create", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata:\n  name: slow\nspec:\n  containers:\n  - name: c\n    image: busybox\n");
    let kc2 = kc.clone();
    let waiter = std::thread::spawn(move || {
        std::process::Command::new("kubectl")
            .env("KUBECONFIG", &kc2)
            .args(["wait", "--for=condition=Ready", "pod/slow", "--timeout=30s"])
            .output()
            .expect("kubectl wait")
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let patch = r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#;
    f.k(
        "kubectl",
        &[
            "patch",
            "pod",
            "slow",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ],
    );
    let out = waiter.join().expect("join");
    assert!(out.status.success(), "wait failed: {}", stderr(&out));
    assert!(stdout(&out).contains("condition met"), "{}", stdout(&out));
}

#[test]
fn explain_and_api_resources() {
    let f = Ferry::start();
    let ex = f.k("kubectl", &["explain", "service.spec.ports"]);
    assert!(ex.contains("targetPort") && ex.contains("FIELDS"), "{ex}");
    let ar = f.k("kubectl", &["api-resources"]);
    for line in [
        "services",
        "endpointslices",
        "deployments",
        "networkpolicies",
        "leases",
    ] {
        assert!(ar.contains(line), "{ar}");
    }
    assert!(
        ar.lines()
            .any(|l| l.starts_with("services") && l.contains("svc") && l.contains("Service")),
        "{ar}"
    );
    for bin in kubectls().iter().filter(|b| is_120(b)) {
        let ar = f.k(bin, &["api-resources"]);
        assert!(ar.contains("services"), "{ar}");
    }
}

#[test]
fn invalid_services_are_rejected_with_causes() {
    let f = Ferry::start();
    let cases = [
        ("port0", "  ports:\n  - port: 0\n", "spec.ports[0].port"),
        (
            "port70000",
            "  ports:\n  - port: 70000\n",
            "spec.ports[0].port",
        ),
        (
            "dupnames",
            "  ports:\n  - name: a\n    port: 80\n  - name: a\n    port: 81\n",
            "spec.ports[1].name",
        ),
        (
            "unknowntype",
            "  type: Bogus\n  ports:\n  - port: 80\n",
            "spec.type",
        ),
        (
            "headlessnodeport",
            "  type: NodePort\n  clusterIP: None\n  ports:\n  - port: 80\n",
            "spec.clusterIP",
        ),
        ("noports", "  selector:\n    a: b\n", "spec.ports"),
    ];
    for (name, spec, field) in cases {
        let m = format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n{spec}");
        let out = f.k_stdin("kubectl", &["create", "-f", "-"], &m);
        assert!(!out.status.success(), "{name} was accepted");
        let e = stderr(&out);
        assert!(e.contains("is invalid") && e.contains(field), "{name}: {e}");
        assert!(
            !f.kubectl(&["get", "svc", name]).status.success(),
            "{name} was stored"
        );
    }
    let m = "apiVersion: v1\nkind: Service\nmetadata:\n  name: Bad_Name\nspec:\n  ports:\n  - port: 80\n";
    let out = f.k_stdin("kubectl", &["create", "-f", "-"], m);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("metadata.name"), "{}", stderr(&out));
    // The list is unchanged: only the cluster's own objects (none of ours).
    let l = f.k("kubectl", &["get", "svc", "-o", "name"]);
    assert!(!l.contains("port0") && !l.contains("Bad_Name"), "{l}");
}

#[test]
fn typed_create_generators_send_protobuf() {
    let f = Ferry::start();
    f.k("kubectl", &["create", "namespace", "pbns"]);
    f.k(
        "kubectl",
        &["create", "configmap", "pbcm", "--from-literal=k=v"],
    );
    f.k(
        "kubectl",
        &["create", "service", "clusterip", "pbsvc", "--tcp=80:8080"],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "pbdep",
            "--image=nginx",
            "--replicas=2",
        ],
    );
    let cm = json(&f.k("kubectl", &["get", "cm", "pbcm", "-o", "json"]));
    assert_eq!(cm["data"]["k"], "v");
    let svc = json(&f.k("kubectl", &["get", "svc", "pbsvc", "-o", "json"]));
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    let dep = json(&f.k("kubectl", &["get", "deploy", "pbdep", "-o", "json"]));
    assert_eq!(dep["spec"]["replicas"], 2);
    let ns = json(&f.k("kubectl", &["get", "ns", "pbns", "-o", "json"]));
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "pbns"
    );
    assert!(eventually(60, || f
        .kubectl(&["get", "ns", "pbns"])
        .status
        .success()));
}

#[test]
fn service_topology_keys_are_served() {
    for bin in kubectls() {
        let f = Ferry::start();
        let m = "apiVersion: v1\nkind: Service\nmetadata:\n  name: topo\nspec:\n  selector:\n    app: x\n  ports:\n  - port: 80\n  topologyKeys:\n  - kubernetes.io/hostname\n  - topology.kubernetes.io/zone\n  - \"*\"\n";
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], m);
        assert!(out.status.success(), "{bin}: {}", stderr(&out));
        let svc = json(&f.k(&bin, &["get", "svc", "topo", "-o", "json"]));
        assert_eq!(
            svc["spec"]["topologyKeys"],
            serde_json::json!(["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]),
            "{svc}"
        );
        // Kept through an unrelated patch.
        f.k(&bin, &["label", "svc", "topo", "a=b"]);
        let svc = json(&f.k(&bin, &["get", "svc", "topo", "-o", "json"]));
        assert_eq!(svc["spec"]["topologyKeys"][2], "*", "{svc}");
        let bad = m
            .replace("  - \"*\"\n", "")
            .replace(
                "  - kubernetes.io/hostname\n",
                "  - \"*\"\n  - kubernetes.io/hostname\n",
            )
            .replace("name: topo", "name: topo-bad");
        let out = f.k_stdin(&bin, &["create", "-f", "-"], &bad);
        assert!(!out.status.success(), "{bin}: accepted {bad}");
        assert!(
            stderr(&out).contains("spec.topologyKeys[0]"),
            "{}",
            stderr(&out)
        );
    }
    let f = Ferry::start();
    let ex = f.k("kubectl", &["explain", "service.spec.topologyKeys"]);
    assert!(ex.contains("topologyKeys"), "{ex}");
}

/// core/v1 and events.k8s.io/v1 Events are one store, as upstream: an Event written through
/// either API is read through both, converted (`message` ↔ `note`, `involvedObject` ↔
/// `regarding`, ...), and field selectors of each API work on it.
#[test]
fn events_are_one_store_served_through_both_apis() {
    let f = Ferry::start();
    let bin = kubectls().into_iter().next().expect("kubectl");
    let new_style = r#"{"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "ev-new", "namespace": "default"},
        "eventTime": "2026-11-24T05:00:00.000000Z", "reportingController": "ferry.dev/e2e",
        "reportingInstance": "e2e-1", "action": "Testing", "reason": "Checked",
        "note": "written as events.k8s.io", "type": "Normal",
        "regarding": {"kind": "Pod", "name": "web-1", "namespace": "default", "apiVersion": "v1"}}"#;
    let out = f.k_stdin(&bin, &["create", "-f", "-"], new_style);
    assert!(out.status.success(), "{}", stderr(&out));
    let old_style = r#"{"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "ev-old", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "web-2", "namespace": "default"},
        "reason": "Started", "message": "written as core", "type": "Normal",
        "source": {"component": "e2e"}, "count": 2,
        "firstTimestamp": "2026-11-24T05:00:00Z", "lastTimestamp": "2026-11-24T05:01:00Z"}"#;
    let out = f.k_stdin(&bin, &["create", "-f", "-"], old_style);
    assert!(out.status.success(), "{}", stderr(&out));

    let core = json(&f.k(&bin, &["get", "events.v1.", "ev-new", "-o", "json"]));
    assert_eq!(core["apiVersion"], "v1", "{core}");
    assert_eq!(core["message"], "written as events.k8s.io", "{core}");
    assert_eq!(core["involvedObject"]["name"], "web-1", "{core}");
    assert_eq!(core["reportingComponent"], "ferry.dev/e2e", "{core}");

    let ev = json(&f.k(
        &bin,
        &["get", "events.v1.events.k8s.io", "ev-old", "-o", "json"],
    ));
    assert_eq!(ev["apiVersion"], "events.k8s.io/v1", "{ev}");
    assert_eq!(ev["note"], "written as core", "{ev}");
    assert_eq!(ev["regarding"]["name"], "web-2", "{ev}");
    assert_eq!(ev["deprecatedCount"], 2, "{ev}");
    assert_eq!(ev["deprecatedSource"]["component"], "e2e", "{ev}");

    // Both lists hold both; each API's field selectors apply.
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = v["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                    .filter(|n| n.starts_with("ev-"))
                    .collect()
            })
            .unwrap_or_default();
        n.sort();
        n
    };
    let all_core = json(&f.k(&bin, &["get", "events.v1.", "-o", "json"]));
    assert_eq!(names(&all_core), ["ev-new", "ev-old"], "{all_core}");
    let all_ev = json(&f.k(&bin, &["get", "events.v1.events.k8s.io", "-o", "json"]));
    assert_eq!(names(&all_ev), ["ev-new", "ev-old"], "{all_ev}");
    let sel = json(&f.k(
        &bin,
        &[
            "get",
            "events.v1.events.k8s.io",
            "--field-selector",
            "regarding.name=web-2",
            "-o",
            "json",
        ],
    ));
    assert_eq!(names(&sel), ["ev-old"], "{sel}");
    let sel = json(&f.k(
        &bin,
        &[
            "get",
            "events.v1.",
            "--field-selector",
            "involvedObject.name=web-1",
            "-o",
            "json",
        ],
    ));
    assert_eq!(names(&sel), ["ev-new"], "{sel}");

    // An update through one API is seen through the other; a delete removes it from both.
    let out = f.k(
        &bin,
        &[
            "patch",
            "events.v1.events.k8s.io",
            "ev-old",
            "--type=merge",
            "-p",
            r#"{"note":"patched"}"#,
        ],
    );
    assert!(out.contains("patched"), "{out}");
    let core = json(&f.k(&bin, &["get", "events.v1.", "ev-old", "-o", "json"]));
    assert_eq!(core["message"], "patched", "{core}");
    f.k(&bin, &["delete", "events.v1.", "ev-new"]);
    let all_ev = json(&f.k(&bin, &["get", "events.v1.events.k8s.io", "-o", "json"]));
    assert_eq!(names(&all_ev), ["ev-old"], "{all_ev}");
}
