//! Issue 16 end to end with kubectl against `ferry up`: a 3-replica StatefulSet behind a
//! headless Service (`web-0.nginx.default.svc.cluster.local` from a pod, rollout
//! history/undo), `kubectl drain` with a PodDisruptionBudget (429, then success), a Job to
//! completion and a failing one to `BackoffLimitExceeded`, a CronJob firing every minute,
//! garbage collection and namespace deletion; a DaemonSet on `ferry up --nodes 3` (as root,
//! netns mode).

mod common;

use std::process::{Command, Output};

use common::{Ferry, eventually};

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
apiVersion: v1
kind: Service
metadata: {name: nginx, labels: {app: web}}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80, name: web}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: nginx
        image: nginx:1.25
        ports: [{containerPort: 80, name: web}]
  volumeClaimTemplates: []
"#;

#[test]
fn statefulset_dns_rollout_and_drain_with_pdb() {
    let f = Ferry::start();
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], WEB);
    assert!(o.status.success(), "{}", text(&o));
    let o = f.kubectl(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());
    let table = f.k("kubectl", &["get", "statefulset", "web"]);
    assert!(table.contains("3/3"), "{table}");
    let d = f.k("kubectl", &["describe", "statefulset", "web"]);
    assert!(d.contains("Pods Status:") && d.contains("3 Running"), "{d}");
    let e = f.k("kubectl", &["explain", "statefulset.spec.serviceName"]);
    assert!(e.contains("serviceName"), "{e}");
    let pods = get_json(&f, &["get", "pods", "-l", "app=web", "-o", "json"]);
    let mut names: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);
    let web0 = get_json(&f, &["get", "pod", "web-0", "-o", "json"]);
    assert_eq!(web0["spec"]["hostname"], "web-0");
    assert_eq!(web0["spec"]["subdomain"], "nginx");
    let ip0 = web0["status"]["podIP"].as_str().unwrap_or("").to_string();

    // Cluster DNS: the pod's stable name, from the DNS server and from inside another pod.
    let dns = f.dns_addr().expect("dns address in the log");
    let (dns_ip, dns_port) = dns.rsplit_once(':').expect("ip:port");
    let name = "web-0.nginx.default.svc.cluster.local";
    let dig = || {
        let o = Command::new("dig")
            .args([&format!("@{dns_ip}"), "-p", dns_port, "+short", name])
            .output()
            .expect("dig");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert!(
        eventually(60, || dig() == ip0),
        "dig {name}: {:?} != {ip0}",
        dig()
    );
    if dns_port == "53" {
        let hosts = f.k("kubectl", &["exec", "web-1", "--", "getent", "hosts", name]);
        assert!(
            hosts.starts_with(&ip0),
            "getent hosts {name} in web-1: {hosts}"
        );
    }

    // A rollout: a second revision, history, undo.
    f.k(
        "kubectl",
        &["set", "image", "statefulset/web", "nginx=nginx:1.26"],
    );
    let o = f.kubectl(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());
    let hist = f.k("kubectl", &["rollout", "history", "statefulset/web"]);
    assert!(hist.contains('1') && hist.contains('2'), "{hist}");
    let revs = f.k("kubectl", &["get", "controllerrevisions", "-l", "app=web"]);
    assert!(revs.contains("statefulset.apps/web"), "{revs}");
    let o = f.kubectl(&["rollout", "undo", "statefulset/web"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(120, || {
            let s = get_json(&f, &["get", "statefulset", "web", "-o", "json"]);
            s["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.25"
                && s["status"]["updatedReplicas"] == 3
                && s["status"]["readyReplicas"] == 3
                && s["status"]["currentRevision"] == s["status"]["updateRevision"]
        }),
        "undo did not roll back:\n{}",
        f.k("kubectl", &["get", "statefulset", "web", "-o", "yaml"])
    );

    // A budget that allows no disruption: drain is refused with 429.
    let o = f.k_stdin(
        "kubectl",
        &["apply", "-f", "-"],
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web-pdb}\nspec:\n  minAvailable: 3\n  selector: {matchLabels: {app: web}}\n",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || {
            let p = get_json(&f, &["get", "pdb", "web-pdb", "-o", "json"]);
            p["status"]["currentHealthy"] == 3 && p["status"]["observedGeneration"] == 1
        }),
        "{}",
        f.k("kubectl", &["get", "pdb", "web-pdb", "-o", "yaml"])
    );
    let d = f.k("kubectl", &["describe", "pdb", "web-pdb"]);
    assert!(
        d.contains("Min available:") && d.contains("Allowed disruptions:"),
        "{d}"
    );
    let pdb = f.k("kubectl", &["get", "pdb", "web-pdb"]);
    assert!(
        pdb.contains("ALLOWED DISRUPTIONS") && pdb.contains("web-pdb   3"),
        "{pdb}"
    );
    let node = web0["spec"]["nodeName"].as_str().unwrap_or("").to_string();
    let o = f.kubectl(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=8s",
    ]);
    assert!(!o.status.success(), "drain should have been refused");
    assert!(
        text(&o).contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{}",
        text(&o)
    );
    // The eviction subresource answers 429 directly too.
    let o = f.k_stdin(
        "kubectl",
        &["create", "--raw", "/api/v1/namespaces/default/pods/web-2/eviction", "-f", "-"],
        r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"web-2","namespace":"default"}}"#,
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("TooManyRequests") || text(&o).contains("429"),
        "{}",
        text(&o)
    );
    // Relax the budget: drain evicts everything.
    f.k(
        "kubectl",
        &[
            "patch",
            "pdb",
            "web-pdb",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":0}}"#,
        ],
    );
    assert!(eventually(60, || {
        let p = get_json(&f, &["get", "pdb", "web-pdb", "-o", "json"]);
        p["status"]["observedGeneration"] == 2 && p["status"]["disruptionsAllowed"] == 3
    }));
    let o = f.kubectl(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());
    assert!(text(&o).contains("evicted"), "{}", text(&o));
    f.k("kubectl", &["uncordon", &node]);
    let o = f.kubectl(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());

    // Deleting the set: its pods and revisions go (garbage collector).
    f.k("kubectl", &["delete", "statefulset", "web"]);
    assert!(
        eventually(120, || {
            f.k(
                "kubectl",
                &[
                    "get",
                    "pods,controllerrevisions",
                    "-l",
                    "app=web",
                    "-o",
                    "name",
                ],
            )
            .trim()
            .is_empty()
        }),
        "{}",
        f.k(
            "kubectl",
            &["get", "pods,controllerrevisions", "-l", "app=web"]
        )
    );
}

const FAILING: &str = r#"
apiVersion: batch/v1
kind: Job
metadata: {name: fails}
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "exit 3"]
"#;

#[test]
fn jobs_cronjob_gc_and_namespace_deletion() {
    let f = Ferry::start();
    // A Job to completion.
    let o = f.kubectl(&[
        "create",
        "job",
        "ok",
        "--image=busybox",
        "--",
        "sh",
        "-c",
        "exit 0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let job = get_json(&f, &["get", "job", "ok", "-o", "json"]);
    let uid = job["metadata"]["uid"].as_str().unwrap_or("").to_string();
    assert_eq!(
        job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
        uid.as_str()
    );
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["job-name"],
        "ok"
    );
    let o = f.kubectl(&[
        "wait",
        "--for=condition=complete",
        "job/ok",
        "--timeout=120s",
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());
    let table = f.k("kubectl", &["get", "job", "ok"]);
    assert!(
        table.contains("Complete") && table.contains("1/1"),
        "{table}"
    );
    // Its pod is released (no job-tracking finalizer left).
    assert!(eventually(60, || {
        let p = get_json(&f, &["get", "pods", "-l", "job-name=ok", "-o", "json"]);
        p["items"].as_array().is_some_and(|a| {
            a.len() == 1
                && a[0]["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty())
        })
    }));

    // A failing Job: two failures with backoffLimit 1.
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], FAILING);
    assert!(o.status.success(), "{}", text(&o));
    let o = f.kubectl(&[
        "wait",
        "--for=condition=failed",
        "job/fails",
        "--timeout=120s",
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), f.log());
    let job = get_json(&f, &["get", "job", "fails", "-o", "json"]);
    assert_eq!(job["status"]["failed"], 2, "{job}");
    let failed = job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .unwrap_or_default();
    assert_eq!(failed["reason"], "BackoffLimitExceeded", "{job}");
    let table = f.k("kubectl", &["get", "job", "fails"]);
    assert!(table.contains("Failed"), "{table}");
    let d = f.k("kubectl", &["describe", "job", "fails"]);
    assert!(
        d.contains("Pods Statuses:") && d.contains("2 Failed"),
        "{d}"
    );
    let e = f.k("kubectl", &["explain", "cronjob.spec.timeZone"]);
    assert!(e.contains("timeZone"), "{e}");

    // A CronJob firing every minute.
    let o = f.kubectl(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=*/1 * * * *",
        "--",
        "sh",
        "-c",
        "exit 0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let table = f.k("kubectl", &["get", "cronjob", "tick"]);
    assert!(
        table.contains("*/1 * * * *") && table.contains("<none>"),
        "{table}"
    );
    assert!(
        eventually(100, || {
            let c = get_json(&f, &["get", "cronjob", "tick", "-o", "json"]);
            !c["status"]["lastScheduleTime"].is_null()
        }),
        "the CronJob never fired:\n{}",
        f.log()
    );
    let jobs = get_json(&f, &["get", "jobs", "-o", "json"]);
    let fired: Vec<String> = jobs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["metadata"]["ownerReferences"][0]["name"] == "tick")
        .map(|j| j["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        fired.len() == 1 && fired[0].starts_with("tick-"),
        "{fired:?}"
    );
    let o = f.kubectl(&[
        "wait",
        "--for=condition=complete",
        &format!("job/{}", fired[0]),
        "--timeout=120s",
    ]);
    assert!(o.status.success(), "{}", text(&o));

    // Garbage collection: deleting the CronJob takes its Jobs and their pods.
    f.k("kubectl", &["delete", "cronjob", "tick"]);
    assert!(
        eventually(60, || {
            let o = f.kubectl(&["get", "job", &fired[0]]);
            !o.status.success()
        }),
        "the CronJob's Job survived"
    );
    assert!(eventually(60, || {
        f.k(
            "kubectl",
            &[
                "get",
                "pods",
                "-l",
                &format!("job-name={}", fired[0]),
                "-o",
                "name",
            ],
        )
        .trim()
        .is_empty()
    }));

    // Namespace deletion removes the new kinds.
    f.k("kubectl", &["create", "namespace", "batch"]);
    let o = f.kubectl(&[
        "-n",
        "batch",
        "create",
        "job",
        "sleeper",
        "--image=busybox",
        "--",
        "sleep",
        "300",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = f.kubectl(&[
        "-n",
        "batch",
        "create",
        "cronjob",
        "later",
        "--image=busybox",
        "--schedule=@yearly",
        "--",
        "true",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(eventually(60, || {
        f.k("kubectl", &["-n", "batch", "get", "pods", "-o", "name"])
            .contains("pod/sleeper-")
    }));
    f.k("kubectl", &["delete", "namespace", "batch", "--wait=false"]);
    let t0 = std::time::Instant::now();
    assert!(
        eventually(120, || !f
            .kubectl(&["get", "namespace", "batch"])
            .status
            .success()),
        "namespace batch was not removed within 120 s:\n{}",
        namespace_report(&f, "batch")
    );
    eprintln!("namespace batch removed in {:?}", t0.elapsed());
}

/// What holds a namespace's deletion: every namespaced kind the API serves, listed in the
/// namespace (with deletion timestamps, finalizers, owners, phases), the Namespace's own status
/// (phase, conditions) and finalizers, and the controllers' log lines about it.
fn namespace_report(f: &Ferry, ns: &str) -> String {
    let mut out = String::new();
    let kinds = f.kubectl(&[
        "api-resources",
        "--namespaced=true",
        "--verbs=list",
        "-o",
        "name",
    ]);
    let kinds: Vec<String> = String::from_utf8_lossy(&kinds.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    out.push_str(&format!("namespaced kinds: {}\n", kinds.join(",")));
    let o = f.kubectl(&["get", &kinds.join(","), "-n", ns, "-o", "json"]);
    if !o.status.success() {
        out.push_str(&format!("listing the content failed: {}\n", text(&o)));
    }
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let mut items = list["items"].as_array().cloned().unwrap_or_default();
    // Events are served by two groups: each once.
    let mut seen = std::collections::HashSet::new();
    items.retain(|i| seen.insert(i["metadata"]["uid"].as_str().unwrap_or("").to_string()));
    out.push_str(&format!("{} object(s) left in {ns}:\n", items.len()));
    for i in &items {
        let m = &i["metadata"];
        out.push_str(&format!(
            "  {}/{} uid={} deletionTimestamp={} grace={} finalizers={} owners={} phase={} node={}\n",
            i["kind"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?"),
            m["uid"].as_str().unwrap_or(""),
            m["deletionTimestamp"],
            m["deletionGracePeriodSeconds"],
            m["finalizers"],
            m["ownerReferences"],
            i["status"]["phase"],
            i["spec"]["nodeName"],
        ));
    }
    let o = f.kubectl(&["get", "namespace", ns, "-o", "json"]);
    let n: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    out.push_str(&format!(
        "namespace {ns}: deletionTimestamp={} metadata.finalizers={} spec.finalizers={} status={}\n",
        n["metadata"]["deletionTimestamp"],
        n["metadata"]["finalizers"],
        n["spec"]["finalizers"],
        n["status"],
    ));
    let log = f.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(ns)
                || l.contains("namespace-controller")
                || l.contains("garbage-collector")
                || l.contains("job-controller")
        })
        .collect();
    out.push_str("log lines about it (last 80):\n");
    for l in &lines[lines.len().saturating_sub(80)..] {
        out.push_str(&strip_ansi(l));
        out.push('\n');
    }
    out
}

/// `s` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A namespace held by content with a finalizer nobody removes explains itself as upstream's
/// does: `NamespaceContentRemaining` and `NamespaceFinalizersRemaining` conditions naming the
/// resource and the finalizer (in `kubectl describe`), until the finalizer goes.
#[test]
fn namespace_held_by_a_finalizer_explains_itself() {
    let f = Ferry::start();
    f.k("kubectl", &["create", "namespace", "held"]);
    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"keep","namespace":"held","finalizers":["example.com/hold"]}}"#;
    let o = f.k_stdin("kubectl", &["create", "-f", "-"], cm);
    assert!(o.status.success(), "{}", text(&o));
    f.k("kubectl", &["create", "configmap", "plain", "-n", "held"]);
    f.k("kubectl", &["delete", "namespace", "held", "--wait=false"]);
    let condition = |ns: &serde_json::Value, t: &str| {
        ns["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap_or_default()
    };
    let mut ns = serde_json::Value::Null;
    assert!(
        eventually(60, || {
            ns = get_json(&f, &["get", "namespace", "held", "-o", "json"]);
            let remaining = condition(&ns, "NamespaceContentRemaining");
            let fins = condition(&ns, "NamespaceFinalizersRemaining");
            remaining["status"] == "True"
                && remaining["message"]
                    == "Some resources are remaining: configmaps. has 1 resource instances"
                && fins["status"] == "True"
                && fins["reason"] == "SomeFinalizersRemain"
                && fins["message"]
                    == "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
        }),
        "{ns}\n{}",
        namespace_report(&f, "held")
    );
    assert_eq!(ns["status"]["phase"], "Terminating", "{ns}");
    assert_eq!(
        condition(&ns, "NamespaceDeletionContentFailure")["status"],
        "False",
        "{ns}"
    );
    let d = f.k("kubectl", &["describe", "namespace", "held"]);
    assert!(
        d.contains("NamespaceFinalizersRemaining") && d.contains("SomeFinalizersRemain"),
        "{d}"
    );
    // The finalizer goes: so does the namespace.
    f.k(
        "kubectl",
        &[
            "patch",
            "configmap",
            "keep",
            "-n",
            "held",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
    assert!(
        eventually(120, || !f
            .kubectl(&["get", "namespace", "held"])
            .status
            .success()),
        "namespace held was not removed:\n{}",
        namespace_report(&f, "held")
    );
}

// ---- DaemonSet on three nodes (netns mode, as root) ----

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// `ferry up --pod-network netns --nodes 3`, stopped (SIGTERM, namespaces removed) on drop.
struct NetnsUp {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl NetnsUp {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut c = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(mut i) = c.stdin.take() {
            let _ = i.write_all(stdin.unwrap_or("").as_bytes());
        }
        c.wait_with_output().expect("kubectl")
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }
}

impl Drop for NetnsUp {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const AGENT: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox
        command: ["sleep", "3600"]
"#;

#[test]
fn daemonset_on_three_nodes() {
    if !is_root() || !std::path::Path::new("/usr/lib/cni/bridge").exists() {
        eprintln!("skipping: needs root and the CNI plugins");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = std::fs::File::create(dir.path().join("ferry.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["up", "--data-dir"])
        .arg(dir.path())
        .args([
            "--pod-network",
            "netns",
            "--nodes",
            "3",
            "--node-name",
            "dsn",
        ])
        .args(["--listen-api", "127.0.0.1:0", "--agent-port", "0"])
        .args([
            "--dns-metrics-listen",
            "127.0.0.1:0",
            "--proxy-healthz-listen",
            "off",
        ])
        .args(["--ingress-http-addr", "off", "--ingress-https-addr", "off"])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ferry up");
    let up = NetnsUp { child, dir };
    assert!(
        eventually(60, || up.dir.path().join("kubeconfig").exists()),
        "{}",
        up.log()
    );
    assert!(
        eventually(90, || {
            let o = up.kubectl(&["get", "nodes", "--no-headers"], None);
            String::from_utf8_lossy(&o.stdout).matches(" Ready").count() == 3
        }),
        "{}",
        up.log()
    );
    let o = up.kubectl(&["apply", "-f", "-"], Some(AGENT));
    assert!(o.status.success(), "{}", text(&o));
    let o = up.kubectl(
        &["rollout", "status", "daemonset/agent", "--timeout=180s"],
        None,
    );
    assert!(o.status.success(), "{}\n{}", text(&o), up.log());
    let pods_on_nodes = || -> Vec<String> {
        let o = up.kubectl(&["get", "pods", "-l", "app=agent", "-o", "json"], None);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let mut nodes: Vec<String> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| p["spec"]["nodeName"].as_str().unwrap_or("").to_string())
            .collect();
        nodes.sort();
        nodes
    };
    assert_eq!(pods_on_nodes(), ["dsn-1", "dsn-2", "dsn-3"]);
    let table =
        String::from_utf8_lossy(&up.kubectl(&["get", "ds", "agent"], None).stdout).to_string();
    assert!(table.contains("NODE SELECTOR"), "{table}");
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().take(6).collect::<Vec<_>>()
                == ["agent", "3", "3", "3", "3", "3"]),
        "{table}"
    );
    // A tainted node loses its daemon pod; a rolling update replaces the others one by one.
    up.kubectl(&["taint", "node", "dsn-3", "dedicated=x:NoExecute"], None);
    assert!(
        eventually(60, || pods_on_nodes() == ["dsn-1", "dsn-2"]),
        "{:?}",
        pods_on_nodes()
    );
    let o = up.kubectl(&["rollout", "restart", "daemonset/agent"], None);
    assert!(o.status.success(), "{}", text(&o));
    let o = up.kubectl(
        &["rollout", "status", "daemonset/agent", "--timeout=180s"],
        None,
    );
    assert!(o.status.success(), "{}\n{}", text(&o), up.log());
    let hist = String::from_utf8_lossy(
        &up.kubectl(&["rollout", "history", "daemonset/agent"], None)
            .stdout,
    )
    .to_string();
    assert!(hist.contains('2'), "{hist}");
    let o = up.kubectl(&["delete", "daemonset", "agent"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(eventually(60, || pods_on_nodes().is_empty()));
}

const ADOPT: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ss}
spec:
  serviceName: ss
  replicas: 1
  selector: {matchLabels: {app: ss}}
  template:
    metadata: {labels: {app: ss}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: busybox, command: [sleep, "3600"]}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: sleeper}
spec:
  parallelism: 1
  completions: 1
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: busybox, command: [sleep, "3600"]}]
"#;

/// The uids of a pod's controller references (empty when orphaned).
fn controller_uids(pod: &serde_json::Value) -> Vec<String> {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["controller"] == true)
        .filter_map(|r| r["uid"].as_str().map(String::from))
        .collect()
}

/// Upstream's "should adopt matching orphans and release non-matching pods" for a StatefulSet
/// and a Job: an orphaned pod the selector matches is adopted back, a relabelled one is
/// released (and the Job replaces it).
#[test]
fn statefulset_and_job_adopt_orphans_and_release_non_matching() {
    let f = Ferry::start();
    let o = f.k_stdin("kubectl", &["apply", "-f", "-"], ADOPT);
    assert!(o.status.success(), "{}", text(&o));
    let uid_of = |kind: &str, name: &str| {
        get_json(&f, &["get", kind, name, "-o", "json"])["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let ss = uid_of("statefulset", "ss");
    let job = uid_of("job", "sleeper");
    let pod = |name: &str| get_json(&f, &["get", "pod", name, "-o", "json"]);
    assert!(
        eventually(90, || controller_uids(&pod("ss-0")) == [ss.clone()]),
        "{}",
        f.log()
    );
    // Orphan it: the set adopts it back (same pod, our controller reference again).
    let pod_uid = pod("ss-0")["metadata"]["uid"].clone();
    let orphan = r#"{"metadata":{"ownerReferences":null}}"#;
    let o = f.kubectl(&["patch", "pod", "ss-0", "--type=merge", "-p", orphan]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || {
            let p = pod("ss-0");
            p["metadata"]["uid"] == pod_uid && controller_uids(&p) == [ss.clone()]
        }),
        "{}",
        f.log()
    );
    // Relabel it: released, left running, orphaned.
    let o = f.kubectl(&["label", "pod", "ss-0", "app=released", "--overwrite"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || {
            let p = pod("ss-0");
            p["metadata"]["uid"] == pod_uid && controller_uids(&p).is_empty()
        }),
        "{}",
        f.log()
    );

    // The Job: its running pod, orphaned, is adopted back with the tracking finalizer.
    let job_pods = || {
        get_json(&f, &["get", "pods", "-l", "job-name=sleeper", "-o", "json"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let mut first = String::new();
    assert!(
        eventually(90, || {
            let ps = job_pods();
            match ps.as_slice() {
                [p] if controller_uids(p) == [job.clone()] => {
                    first = p["metadata"]["name"].as_str().unwrap_or("").to_string();
                    true
                }
                _ => false,
            }
        }),
        "{}",
        f.log()
    );
    let o = f.kubectl(&["patch", "pod", &first, "--type=merge", "-p", orphan]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || {
            let p = pod(&first);
            controller_uids(&p) == [job.clone()]
                && p["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == "batch.kubernetes.io/job-tracking"))
        }),
        "{}",
        f.log()
    );
    // Drop the selector's label: released (reference and finalizer gone), and the Job
    // creates a replacement.
    let o = f.kubectl(&[
        "label",
        "pod",
        &first,
        "batch.kubernetes.io/controller-uid-",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        eventually(60, || {
            let p = pod(&first);
            controller_uids(&p).is_empty()
                && p["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty())
        }),
        "{}",
        f.log()
    );
    assert!(
        eventually(60, || job_pods().iter().any(|p| {
            p["metadata"]["name"] != first.as_str() && controller_uids(p) == [job.clone()]
        })),
        "{}",
        f.log()
    );
}
