//! End to end: Deployments, ReplicaSets, the garbage collector, namespaces and ClusterCIDRConfig
//! through kubectl against `ferry up` (which runs the lifecycle controllers). No node agent runs
//! here: the test makes pods Ready through the status subresource.

mod common;

use common::{Ferry, eventually, json};

fn out(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Marks every live pod with label `sel` Ready; returns how many pods there are.
fn make_ready(f: &Ferry, ns: &str, sel: &str) -> usize {
    let o = f.kubectl(&["get", "pods", "-n", ns, "-l", sel, "-o", "json"]);
    if !o.status.success() {
        return 0;
    }
    let v = json(&String::from_utf8_lossy(&o.stdout));
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let mut live = 0;
    for p in &items {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        live += 1;
        let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if !ready {
            let name = p["metadata"]["name"].as_str().unwrap_or("");
            let patch = r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"},{"type":"ContainersReady","status":"True"}]}}"#;
            let _ = f.kubectl(&[
                "patch",
                "pod",
                name,
                "-n",
                ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                patch,
            ]);
        }
    }
    live
}

fn items(f: &Ferry, args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    json(&f.k("kubectl", &a))["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `kubectl rollout status` while a helper thread keeps making pods Ready.
fn rollout_status(f: &Ferry, name: &str, sel: &str) {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        let d = done.clone();
        s.spawn(move || {
            while !d.load(std::sync::atomic::Ordering::SeqCst) {
                make_ready(f, "default", sel);
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        });
        let o = f.kubectl(&[
            "rollout",
            "status",
            &format!("deployment/{name}"),
            "--timeout=60s",
        ]);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(
            o.status.success(),
            "rollout status: {}\n{}",
            out(&o),
            f.log()
        );
        assert!(out(&o).contains("successfully rolled out"), "{}", out(&o));
    });
}

#[test]
fn deployment_rollout_scale_restart_and_cascades() {
    let f = Ferry::start();
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=3",
        ],
    );
    rollout_status(&f, "web", "app=web");
    let rs = items(&f, &["rs", "-l", "app=web"]);
    assert_eq!(rs.len(), 1);
    assert_eq!(
        rs[0]["metadata"]["ownerReferences"][0]["kind"],
        "Deployment"
    );
    let pods = items(&f, &["pods", "-l", "app=web"]);
    assert_eq!(pods.len(), 3);
    for p in &pods {
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["uid"],
            rs[0]["metadata"]["uid"]
        );
    }
    // Scale.
    f.k("kubectl", &["scale", "deployment/web", "--replicas=5"]);
    rollout_status(&f, "web", "app=web");
    assert_eq!(items(&f, &["pods", "-l", "app=web"]).len(), 5);
    // Restart: a new ReplicaSet takes over.
    f.k("kubectl", &["rollout", "restart", "deployment/web"]);
    rollout_status(&f, "web", "app=web");
    assert!(eventually(60, || {
        let rs = items(&f, &["rs", "-l", "app=web"]);
        rs.len() == 2
            && rs.iter().any(|r| {
                r["spec"]["replicas"] == 5
                    && r["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
            })
            && rs.iter().any(|r| r["spec"]["replicas"] == 0)
            && items(&f, &["pods", "-l", "app=web"]).len() == 5
    }));
    let hist = f.k("kubectl", &["rollout", "history", "deployment/web"]);
    assert!(hist.contains('1') && hist.contains('2'), "{hist}");
    // Foreground: everything goes, the Deployment last.
    let o = f.kubectl(&[
        "delete",
        "deployment",
        "web",
        "--cascade=foreground",
        "--timeout=30s",
    ]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(eventually(60, || items(&f, &["rs,pods", "-l", "app=web"]).is_empty()));
    assert!(!f.kubectl(&["get", "deployment", "web"]).status.success());

    // Background.
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "bg",
            "--image=nginx",
            "--replicas=2",
        ],
    );
    assert!(eventually(60, || items(&f, &["pods", "-l", "app=bg"])
        .len()
        == 2));
    f.k("kubectl", &["delete", "deployment", "bg"]);
    assert!(eventually(60, || items(&f, &["rs,pods", "-l", "app=bg"]).is_empty()));

    // Orphan: the ReplicaSet and its pods stay, without the owner reference.
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "or",
            "--image=nginx",
            "--replicas=2",
        ],
    );
    assert!(eventually(60, || items(&f, &["pods", "-l", "app=or"])
        .len()
        == 2));
    let o = f.kubectl(&[
        "delete",
        "deployment",
        "or",
        "--cascade=orphan",
        "--timeout=30s",
    ]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(eventually(60, || !f
        .kubectl(&["get", "deployment", "or"])
        .status
        .success()));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let rs = items(&f, &["rs", "-l", "app=or"]);
    assert_eq!(rs.len(), 1);
    assert!(rs[0]["metadata"]["ownerReferences"].is_null(), "{}", rs[0]);
    assert_eq!(items(&f, &["pods", "-l", "app=or"]).len(), 2);
}

#[test]
fn namespace_deletion_and_cluster_cidr_config() {
    let f = Ferry::start();
    let o = f.kubectl(&[
        "get",
        "ns",
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
    ]);
    assert!(o.status.success(), "{}", out(&o));
    f.k("kubectl", &["create", "namespace", "gone"]);
    f.k(
        "kubectl",
        &[
            "create",
            "deployment",
            "d",
            "-n",
            "gone",
            "--image=nginx",
            "--replicas=2",
        ],
    );
    f.k(
        "kubectl",
        &[
            "create",
            "configmap",
            "c",
            "-n",
            "gone",
            "--from-literal=a=b",
        ],
    );
    assert!(eventually(60, || items(&f, &["pods", "-n", "gone"]).len() == 2));
    let o = f.kubectl(&["delete", "namespace", "gone", "--timeout=60s"]);
    assert!(o.status.success(), "{}\n{}", out(&o), f.log());
    assert!(eventually(60, || !f
        .kubectl(&["get", "ns", "gone"])
        .status
        .success()));

    // ClusterCIDRConfig, as in the seed's document.
    let ccc = "apiVersion: baremetal.cluster.gke.io/v1alpha1\nkind: ClusterCIDRConfig\nmetadata:\n  name: rack1\nspec:\n  ipv4:\n    cidr: \"10.40.0.0/16\"\n    perNodeMaskSize: 24\n  ipv6:\n    cidr: \"fd00:40::/112\"\n    perNodeMaskSize: 120\n  nodeSelector:\n    matchLabels:\n      rack: rack1\n";
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], ccc);
    assert!(o.status.success(), "{}", out(&o));
    let table = f.k("kubectl", &["get", "clustercidrconfigs"]);
    assert!(
        table.contains("rack1") && table.contains("10.40.0.0/16"),
        "{table}"
    );
    let bad = ccc
        .replace("perNodeMaskSize: 120", "perNodeMaskSize: 100")
        .replace("rack1\nspec", "bad\nspec");
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], &bad);
    assert!(!o.status.success(), "unequal host bits accepted");
    let node =
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: worker\n  labels:\n    rack: rack1\n";
    let o = f.k_stdin("kubectl", &["create", "-f", "-"], node);
    assert!(o.status.success(), "{}", out(&o));
    assert!(eventually(60, || {
        let n = json(&f.k("kubectl", &["get", "node", "worker", "-o", "json"]));
        n["spec"]["podCIDRs"] == serde_json::json!(["10.40.0.0/24", "fd00:40::/120"])
    }));
}
