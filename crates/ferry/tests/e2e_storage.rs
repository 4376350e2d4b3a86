//! Issue 27 end to end with kubectl against `ferry up`: the default StorageClass
//! `local-path`, a StatefulSet's volumeClaimTemplates provisioned and bound on it (and the
//! volume removed with its claim under the Delete policy), a static PersistentVolume bound by
//! class and size and Released when its claim goes, validation of claims, a
//! ReplicationController scaled with `kubectl scale rc`, and `kubectl apply --prune` with its
//! default allowlist.

mod common;

use std::process::Output;

use common::{Ferry, eventually, json};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn get_json(f: &Ferry, args: &[&str]) -> serde_json::Value {
    let o = f.kubectl(args);
    if !o.status.success() {
        return serde_json::Value::Null;
    }
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

const WEB: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 2
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: busybox
        command: ["sleep", "3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#;

const STATIC: &str = r#"
apiVersion: v1
kind: PersistentVolume
metadata: {name: manual-big}
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: /tmp/ferry-e2e-unused-big}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: manual-small}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  storageClassName: manual
  hostPath: {path: /tmp/ferry-e2e-unused-small}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: claim1}
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 500Mi}}
"#;

fn claim_phase(f: &Ferry, name: &str) -> String {
    get_json(f, &["get", "pvc", name, "-o", "json"])["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn storage_classes_claims_volumes_and_replication_controllers() {
    let f = Ferry::start();

    // The default class.
    let sc = f.k("kubectl", &["get", "sc"]);
    assert!(
        sc.contains("local-path (default)")
            && sc.contains("ferry.dev/local-path")
            && sc.contains("WaitForFirstConsumer"),
        "{sc}"
    );
    let sc = f.k(
        "kubectl",
        &["get", "storageclass", "local-path", "-o", "json"],
    );
    assert_eq!(json(&sc)["reclaimPolicy"], "Delete");

    // Validation of a claim.
    let bad = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: bad}\nspec: {resources: {requests: {storage: 1Gi}}}\n";
    let o = f.k_stdin("kubectl", &["create", "-f", "-"], bad);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("spec.accessModes: Required value: at least 1 access mode is required"),
        "{}",
        text(&o)
    );

    // A static volume: the smallest that fits binds, by class.
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], STATIC);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || claim_phase(&f, "claim1") == "Bound"),
        "claim1: {}\n{}",
        f.k("kubectl", &["get", "pv,pvc"]),
        f.log()
    );
    let c = get_json(&f, &["get", "pvc", "claim1", "-o", "json"]);
    assert_eq!(c["spec"]["volumeName"], "manual-small");
    assert_eq!(
        c["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"],
        "yes"
    );
    assert_eq!(c["status"]["capacity"]["storage"], "1Gi");
    assert!(
        c["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "kubernetes.io/pvc-protection")),
        "{c}"
    );
    let pvc_table = f.k("kubectl", &["get", "pvc", "claim1"]);
    assert!(
        pvc_table.contains("Bound")
            && pvc_table.contains("manual-small")
            && pvc_table.contains("RWO,RWX"),
        "{pvc_table}"
    );
    let pv_table = f.k("kubectl", &["get", "pv", "manual-small"]);
    assert!(
        pv_table.contains("Retain") && pv_table.contains("default/claim1"),
        "{pv_table}"
    );
    // Retain: the claim's deletion releases the volume.
    f.k("kubectl", &["delete", "pvc", "claim1", "--wait=false"]);
    assert!(
        eventually(60, || {
            get_json(&f, &["get", "pv", "manual-small", "-o", "json"])["status"]["phase"]
                == "Released"
        }),
        "{}",
        f.k("kubectl", &["get", "pv"])
    );
    assert_eq!(
        get_json(&f, &["get", "pv", "manual-big", "-o", "json"])["status"]["phase"],
        "Available"
    );

    // A StatefulSet's claims on the default class, provisioned for the pods' node.
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], WEB);
    assert!(o.status.success(), "{}", text(&o));
    let bound =
        || claim_phase(&f, "data-web-0") == "Bound" && claim_phase(&f, "data-web-1") == "Bound";
    assert!(
        eventually(120, bound),
        "{}\n{}\n{}",
        f.k("kubectl", &["get", "pv,pvc,pods", "-o", "wide"]),
        f.k("kubectl", &["get", "events"]),
        f.log()
    );
    let c = get_json(&f, &["get", "pvc", "data-web-0", "-o", "json"]);
    assert_eq!(c["spec"]["storageClassName"], "local-path");
    assert_eq!(c["metadata"]["labels"]["app"], "web");
    let node = c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(!node.is_empty(), "{c}");
    let pv_name = c["spec"]["volumeName"].as_str().unwrap_or("").to_string();
    let pv = get_json(&f, &["get", "pv", &pv_name, "-o", "json"]);
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"],
        "ferry.dev/local-path"
    );
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    let dir = pv["spec"]["hostPath"]["path"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(std::path::Path::new(&dir).is_dir(), "{pv}");
    // The pods run on the volumes' node.
    assert!(
        eventually(120, || {
            let p = get_json(&f, &["get", "pod", "web-0", "-o", "json"]);
            p["spec"]["nodeName"] == node.as_str()
        }),
        "{}",
        f.k("kubectl", &["get", "pods", "-o", "wide"])
    );
    // As root every pod has its own mount namespace and the claim is mounted at /data: what
    // web-0 writes there is on the volume's directory and survives the pod (its replacement,
    // a new pod of the same name, reads it).
    if std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        let running = |uid: &str| {
            let p = get_json(&f, &["get", "pod", "web-0", "-o", "json"]);
            p["status"]["phase"] == "Running"
                && p["metadata"]["uid"].as_str().is_some_and(|u| u != uid)
        };
        assert!(
            eventually(120, || running("")),
            "{}",
            f.k("kubectl", &["get", "pods"])
        );
        let uid = get_json(&f, &["get", "pod", "web-0", "-o", "json"])["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let o = f.kubectl(&["exec", "web-0", "--", "sh", "-c", "echo kept > /data/x"]);
        assert!(o.status.success(), "{}\n{}", text(&o), f.log());
        assert_eq!(
            std::fs::read_to_string(std::path::Path::new(&dir).join("x")).unwrap_or_default(),
            "kept\n",
            "the file is on the volume's directory"
        );
        f.k("kubectl", &["delete", "pod", "web-0"]);
        assert!(
            eventually(120, || running(&uid)),
            "{}",
            f.k("kubectl", &["get", "pods", "-o", "wide"])
        );
        let o = f.kubectl(&["exec", "web-0", "--", "cat", "/data/x"]);
        assert_eq!(text(&o).trim(), "kept", "{}", f.log());
    }
    // Deleting the set leaves the claims (whenDeleted Retain); a claim deleted while unused
    // takes its volume and directory with it (Delete).
    f.k("kubectl", &["delete", "statefulset", "web"]);
    assert!(
        eventually(60, || get_json(
            &f,
            &["get", "pods", "-l", "app=web", "-o", "json"]
        )["items"]
            .as_array()
            .is_some_and(Vec::is_empty)),
        "{}",
        f.k("kubectl", &["get", "pods"])
    );
    f.k("kubectl", &["delete", "pvc", "data-web-0"]);
    assert!(
        eventually(60, || !f.kubectl(&["get", "pv", &pv_name]).status.success()),
        "{}",
        f.k("kubectl", &["get", "pv"])
    );
    assert!(!std::path::Path::new(&dir).exists(), "{dir}");

    // A ReplicationController and its scale.
    let rc = r#"
apiVersion: v1
kind: ReplicationController
metadata: {name: rc1}
spec:
  replicas: 2
  template:
    metadata: {labels: {app: rc1}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: busybox, command: ["sleep", "3600"]}]
"#;
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], rc);
    assert!(o.status.success(), "{}", text(&o));
    let pods = |n: usize| {
        get_json(&f, &["get", "pods", "-l", "app=rc1", "-o", "json"])["items"]
            .as_array()
            .is_some_and(|a| {
                a.len() == n
                    && a.iter().all(|p| {
                        p["metadata"]["ownerReferences"][0]["kind"] == "ReplicationController"
                    })
            })
    };
    assert!(
        eventually(60, || pods(2)),
        "{}",
        f.k("kubectl", &["get", "pods", "--show-labels"])
    );
    let rcj = get_json(&f, &["get", "rc", "rc1", "-o", "json"]);
    assert_eq!(rcj["spec"]["selector"]["app"], "rc1");
    f.k("kubectl", &["scale", "rc", "rc1", "--replicas=3"]);
    assert!(
        eventually(60, || pods(3)),
        "{}",
        f.k("kubectl", &["get", "pods"])
    );
    assert!(
        eventually(60, || {
            let t = f.k("kubectl", &["get", "rc", "rc1", "--no-headers"]);
            t.split_whitespace().take(3).collect::<Vec<_>>() == ["rc1", "3", "3"]
        }),
        "{}",
        f.k("kubectl", &["get", "rc"])
    );

    // apply --prune with kubectl's default allowlist (it lists these kinds).
    let set = |both: bool| {
        let mut s = String::from(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keep, labels: {prune: e2e}}\ndata: {a: b}\n",
        );
        if both {
            s.push_str(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: drop, labels: {prune: e2e}}\ndata: {a: b}\n",
            );
        }
        s
    };
    let o = f.k_stdin(
        "kubectl",
        &["apply", "--prune", "-l", "prune=e2e", "-f", "-"],
        &set(true),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = f.k_stdin(
        "kubectl",
        &["apply", "--prune", "-l", "prune=e2e", "-f", "-"],
        &set(false),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("configmap/drop pruned"), "{}", text(&o));
    assert!(!f.kubectl(&["get", "configmap", "drop"]).status.success());
    assert!(f.kubectl(&["get", "configmap", "keep"]).status.success());
}
