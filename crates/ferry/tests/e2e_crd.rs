//! CustomResourceDefinitions end to end with kubectl and the Python client against `ferry up`:
//! upstream's CronTab CRD (v1 schema with a pattern, bounds and a default, printer columns,
//! status and scale subresources, a second served version, category `all`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{Ferry, eventually, json};

const CRD: &str = include_str!("fixtures/crontab-crd.yaml");

const VALID: &str = r#"apiVersion: "stable.example.com/v1"
kind: CronTab
metadata:
  name: my-new-cron-object
spec:
  cronSpec: "* * * * */5"
  image: my-awesome-cron-image
"#;

const INVALID: &str = r#"apiVersion: "stable.example.com/v1"
kind: CronTab
metadata:
  name: my-bad-cron-object
spec:
  cronSpec: "* * * *"
  image: my-awesome-cron-image
  replicas: 15
"#;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn install_crd(f: &Ferry) {
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], CRD);
    assert!(out.status.success(), "apply CRD: {}", stderr(&out));
    f.k(
        "kubectl",
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/crontabs.stable.example.com",
            "--timeout=60s",
        ],
    );
}

#[test]
fn crontab_with_kubectl() {
    let f = Ferry::start();
    install_crd(&f);
    let crd = json(&f.k(
        "kubectl",
        &["get", "crd", "crontabs.stable.example.com", "-o", "json"],
    ));
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "CronTab");
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
    assert_eq!(
        crd["metadata"]["finalizers"],
        serde_json::json!(["customresourcecleanup.apiextensions.k8s.io"])
    );

    // A valid object is created and defaulted; an invalid one is refused with upstream's causes.
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], VALID);
    assert!(out.status.success(), "apply valid: {}", stderr(&out));
    let obj = json(&f.k(
        "kubectl",
        &["get", "ct", "my-new-cron-object", "-o", "json"],
    ));
    assert_eq!(obj["spec"]["replicas"], 1, "defaulted: {obj}");
    assert_eq!(obj["metadata"]["generation"], 1);
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], INVALID);
    assert!(!out.status.success(), "invalid object accepted");
    let err = stderr(&out);
    assert!(
        err.contains(r#"The CronTab "my-bad-cron-object" is invalid"#)
            && err.contains(r#"spec.cronSpec: Invalid value: "* * * *": spec.cronSpec in body should match '^(\d+|\*)(/\d+)?(\s+(\d+|\*)(/\d+)?){4}$'"#)
            && err.contains(
                "spec.replicas: Invalid value: 15: spec.replicas in body should be less than or equal to 10"
            ),
        "{err}"
    );
    // Unknown fields: pruned with a warning, refused under strict validation.
    let bogus = VALID.replace("  image:", "  bogus: 1\n  image:");
    let out = f.k_stdin(
        "kubectl",
        &["apply", "--validate=strict", "-f", "-"],
        &bogus,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(r#"unknown field "spec.bogus""#),
        "{}",
        stderr(&out)
    );
    let out = f.k_stdin("kubectl", &["apply", "--validate=false", "-f", "-"], &bogus);
    assert!(out.status.success(), "{}", stderr(&out));
    let obj = json(&f.k(
        "kubectl",
        &["get", "ct", "my-new-cron-object", "-o", "json"],
    ));
    assert!(obj["spec"].get("bogus").is_none(), "pruned: {obj}");

    // explain reads the published schema.
    let explain = f.k("kubectl", &["explain", "crontab.spec"]);
    assert!(
        explain.contains("KIND:       CronTab")
            && explain.contains("cronSpec")
            && explain.contains("replicas"),
        "{explain}"
    );

    // Printer columns, short name and category.
    let table = f.k("kubectl", &["get", "ct"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, vec!["NAME", "SPEC", "REPLICAS", "AGE"], "{table}");
    assert!(
        table.contains("my-new-cron-object   * * * * */5   1"),
        "{table}"
    );
    let all = f.k("kubectl", &["get", "all"]);
    assert!(
        all.contains("crontab.stable.example.com/my-new-cron-object"),
        "{all}"
    );
    let sel = f.k(
        "kubectl",
        &[
            "get",
            "ct",
            "--field-selector",
            "metadata.name=my-new-cron-object",
            "-o",
            "name",
        ],
    );
    assert_eq!(sel.trim(), "crontab.stable.example.com/my-new-cron-object");
    let sel = f.k(
        "kubectl",
        &[
            "get",
            "ct",
            "--field-selector",
            "metadata.name=other",
            "-o",
            "name",
        ],
    );
    assert_eq!(sel.trim(), "");

    // get -w sees a change.
    let (tx, rx) = mpsc::channel::<String>();
    let mut watch = Command::new("kubectl")
        .env("KUBECONFIG", &f.kubeconfig)
        .args(["--cache-dir"])
        .arg(f.dir.path().join("kcache-w"))
        .args(["get", "ct", "-w", "--request-timeout=60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let out_pipe = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out_pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    assert!(first.is_ok(), "watch printed nothing");
    let patched = f.kubectl(&[
        "patch",
        "ct",
        "my-new-cron-object",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"cronSpec":"*/7 * * * *"}}"#,
    ]);
    assert!(patched.status.success(), "{}", stderr(&patched));
    let mut seen = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
        if line.contains("*/7 * * * *") {
            seen = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "the watch did not show the change");

    // Strategic merge patch is refused (415), as upstream does for custom resources.
    let smp = f.kubectl(&[
        "patch",
        "ct",
        "my-new-cron-object",
        "-p",
        r#"{"spec":{"image":"x"}}"#,
    ]);
    assert!(!smp.status.success());
    assert!(
        stderr(&smp).contains("application/strategic-merge-patch+json is not supported"),
        "{}",
        stderr(&smp)
    );
    // JSON patch and server-side apply work.
    f.k(
        "kubectl",
        &[
            "patch",
            "ct",
            "my-new-cron-object",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/image","value":"jp"}]"#,
        ],
    );
    let out = f.k_stdin(
        "kubectl",
        &["apply", "--server-side", "-f", "-"],
        &VALID.replace("my-new-cron-object", "ssa-cron"),
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // The scale subresource.
    f.k(
        "kubectl",
        &["scale", "ct", "my-new-cron-object", "--replicas=5"],
    );
    let r = f.k(
        "kubectl",
        &[
            "get",
            "ct",
            "my-new-cron-object",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    );
    assert_eq!(r.trim(), "5");
    let scale = json(&f.k(
        "kubectl",
        &[
            "get",
            "--raw",
            "/apis/stable.example.com/v1/namespaces/default/crontabs/my-new-cron-object/scale",
        ],
    ));
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 5);
    // The status subresource: the main resource ignores status, /status only takes status.
    f.k(
        "kubectl",
        &[
            "patch",
            "ct",
            "my-new-cron-object",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"replicas":4,"labelSelector":"app=cron"},"spec":{"image":"ignored"}}"#,
        ],
    );
    f.k(
        "kubectl",
        &[
            "patch",
            "ct",
            "my-new-cron-object",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"replicas":9}}"#,
        ],
    );
    let obj = json(&f.k(
        "kubectl",
        &["get", "ct", "my-new-cron-object", "-o", "json"],
    ));
    assert_eq!(obj["status"]["replicas"], 4, "{obj}");
    assert_eq!(obj["spec"]["image"], "jp", "{obj}");
    let scale = json(&f.k(
        "kubectl",
        &[
            "get",
            "--raw",
            "/apis/stable.example.com/v1/namespaces/default/crontabs/my-new-cron-object/scale",
        ],
    ));
    assert_eq!(scale["status"]["replicas"], 4);
    assert_eq!(scale["status"]["selector"], "app=cron");

    // The second version serves the same objects with its apiVersion (the None strategy).
    let av = f.k(
        "kubectl",
        &[
            "get",
            "crontabs.v1beta1.stable.example.com",
            "my-new-cron-object",
            "-o",
            "jsonpath={.apiVersion}",
        ],
    );
    assert_eq!(av.trim(), "stable.example.com/v1beta1");

    // Discovery and OpenAPI.
    let res = f.k(
        "kubectl",
        &["api-resources", "--api-group=stable.example.com"],
    );
    assert!(
        res.contains("crontabs") && res.contains("ct") && res.contains("CronTab"),
        "{res}"
    );
    let group = json(&f.k("kubectl", &["get", "--raw", "/apis/stable.example.com"]));
    assert_eq!(group["preferredVersion"]["version"], "v1");
    let v3 = json(&f.k(
        "kubectl",
        &["get", "--raw", "/openapi/v3/apis/stable.example.com/v1"],
    ));
    assert!(
        v3["components"]["schemas"]["com.example.stable.v1.CronTab"].is_object(),
        "no CronTab schema"
    );

    // Survives a restart: the stored CRD is served again at start.
    let mut f = f;
    f.kill9();
    f.restart();
    let names = f.k("kubectl", &["get", "ct", "-o", "name"]);
    assert!(
        names.contains("crontab.stable.example.com/my-new-cron-object"),
        "{names}"
    );

    // Deleting the CRD deletes its objects.
    f.k(
        "kubectl",
        &[
            "delete",
            "crd",
            "crontabs.stable.example.com",
            "--timeout=60s",
        ],
    );
    assert!(
        eventually(30, || !f
            .kubectl(&["get", "--raw", "/apis/stable.example.com/v1"])
            .status
            .success()),
        "the group is still served"
    );
    install_crd(&f);
    let names = f.k("kubectl", &["get", "ct", "-A", "-o", "name"]);
    assert_eq!(names.trim(), "", "objects survived their CRD");
}

#[test]
fn crd_validation_and_python_client() {
    let f = Ferry::start();
    // An invalid CRD: two storage versions, a non-structural schema, a bad name.
    let bad = CRD.replace("storage: false", "storage: true").replace(
        "name: crontabs.stable.example.com",
        "name: crontab.stable.example.com",
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &bad);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("metadata.name: Invalid value: \"crontab.stable.example.com\": must be spec.names.plural+\".\"+spec.group")
            && err.contains("must have exactly one version marked as storage version"),
        "{err}"
    );
    install_crd(&f);
    // Every kubectl (1.20 reads the OpenAPI v2 document for client-side validation).
    for bin in common::kubectls() {
        let name = format!("cron-{}", bin.len());
        let out = f.k_stdin(
            &bin,
            &["apply", "-f", "-"],
            &VALID.replace("my-new-cron-object", &name),
        );
        assert!(out.status.success(), "{bin}: {}", stderr(&out));
        let out = f.k_stdin(&bin, &["apply", "-f", "-"], INVALID);
        assert!(
            stderr(&out).contains("spec.replicas in body should be less than or equal to 10"),
            "{bin}: {}",
            stderr(&out)
        );
        let explain = f.k(&bin, &["explain", "crontab.spec"]);
        assert!(explain.contains("cronSpec"), "{bin}: {explain}");
        f.k(&bin, &["delete", "ct", &name]);
    }
    let script = r#"
import json
from kubernetes import client, config
config.load_kube_config()
api = client.CustomObjectsApi()
g, v, p = "stable.example.com", "v1", "crontabs"
body = {"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "py-cron", "labels": {"app": "py"}},
        "spec": {"cronSpec": "*/5 * * * *", "image": "py"}}
api.create_namespaced_custom_object(g, v, "default", p, body)
o = api.get_namespaced_custom_object(g, v, "default", p, "py-cron")
print("replicas", o["spec"]["replicas"])
l = api.list_namespaced_custom_object(g, v, "default", p, label_selector="app=py")
print("listed", [i["metadata"]["name"] for i in l["items"]])
api.patch_namespaced_custom_object(g, v, "default", p, "py-cron", {"spec": {"image": "py2"}})
print("image", api.get_namespaced_custom_object(g, v, "default", p, "py-cron")["spec"]["image"])
s = api.patch_namespaced_custom_object_status(g, v, "default", p, "py-cron", {"status": {"replicas": 2}})
print("status", s["status"]["replicas"])
api.patch_namespaced_custom_object_scale(g, v, "default", p, "py-cron", {"spec": {"replicas": 3}})
sc = api.get_namespaced_custom_object_scale(g, v, "default", p, "py-cron")
print("scale", sc["spec"]["replicas"], sc["status"]["replicas"])
try:
    api.create_namespaced_custom_object(g, v, "default", p, {"apiVersion": "stable.example.com/v1", "kind": "CronTab",
        "metadata": {"name": "bad"}, "spec": {"cronSpec": "x", "replicas": 11}})
except client.exceptions.ApiException as e:
    print("invalid", e.status, sorted(c["field"] for c in json.loads(e.body)["details"]["causes"]))
print("cluster", len(api.list_cluster_custom_object(g, v, p)["items"]))
api.delete_namespaced_custom_object(g, v, "default", p, "py-cron")
print("after delete", len(api.list_cluster_custom_object(g, v, p)["items"]))
"#;
    let out = f.python(script, &[]);
    let want = [
        "replicas 1",
        "listed ['py-cron']",
        "image py2",
        "status 2",
        "scale 3 2",
        "invalid 422 ['spec.cronSpec', 'spec.replicas']",
        "cluster 1",
        "after delete 0",
    ];
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, want, "{out}");
}

/// The garbage collector follows ownerReferences to and from custom objects (it picks up the
/// new kind through discovery), and deleting a namespace deletes its custom objects.
#[test]
fn garbage_collection_and_namespaces() {
    let f = Ferry::start();
    install_crd(&f);
    f.k("kubectl", &["create", "configmap", "owner-cm"]);
    let cm_uid = f.k(
        "kubectl",
        &["get", "cm", "owner-cm", "-o", "jsonpath={.metadata.uid}"],
    );
    let dependent = format!(
        "{}  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner-cm\n    uid: {}\n",
        VALID
            .replace("  name: my-new-cron-object\n", "  name: owned-cron\n")
            .replace("spec:\n", "")
            .replace(
                "  cronSpec: \"* * * * */5\"\n  image: my-awesome-cron-image\n",
                ""
            ),
        cm_uid.trim()
    ) + "spec:\n  cronSpec: \"* * * * */5\"\n";
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &dependent);
    assert!(out.status.success(), "{}\n{dependent}", stderr(&out));
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], VALID);
    assert!(out.status.success(), "{}", stderr(&out));
    let ct_uid = f.k(
        "kubectl",
        &[
            "get",
            "ct",
            "my-new-cron-object",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    );
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned-cm\n  ownerReferences:\n  - apiVersion: stable.example.com/v1\n    kind: CronTab\n    name: my-new-cron-object\n    uid: {}\n",
        ct_uid.trim()
    );
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &cm);
    assert!(out.status.success(), "{}", stderr(&out));

    // Built-in owner gone: its custom dependent goes.
    f.k("kubectl", &["delete", "cm", "owner-cm"]);
    assert!(
        eventually(90, || !f
            .kubectl(&["get", "ct", "owned-cron"])
            .status
            .success()),
        "the custom dependent of a deleted ConfigMap survived"
    );
    // Custom owner gone: its built-in dependent goes.
    f.k("kubectl", &["delete", "ct", "my-new-cron-object"]);
    assert!(
        eventually(90, || !f
            .kubectl(&["get", "cm", "owned-cm"])
            .status
            .success()),
        "the ConfigMap owned by a deleted CronTab survived"
    );

    // Namespace deletion.
    f.k("kubectl", &["create", "namespace", "crons"]);
    let out = f.k_stdin("kubectl", &["apply", "-n", "crons", "-f", "-"], VALID);
    assert!(out.status.success(), "{}", stderr(&out));
    f.k("kubectl", &["delete", "namespace", "crons", "--wait=false"]);
    assert!(
        eventually(90, || {
            !f.kubectl(&["get", "namespace", "crons"]).status.success()
        }),
        "namespace crons was not removed"
    );
    let left = f.k("kubectl", &["get", "ct", "-A", "-o", "name"]);
    assert_eq!(left.trim(), "", "custom objects outlived their namespace");
}
