//! Issue 14, ServiceAccounts end to end on the netns pod network (as root): the ServiceAccount
//! admission plugin gives a pod the projected `kube-api-access-*` volume; the agent fills it
//! (a token bound to the pod, `ca.crt`, `namespace`); from inside the pod, curl with that CA and
//! token against `https://kubernetes.default.svc` is refused (403, upstream's message) for the
//! bare `default` ServiceAccount and allowed once a RoleBinding gives it `view`. Also: a pod
//! naming a missing ServiceAccount is refused, and `automountServiceAccountToken: false` leaves
//! the pod without the volume. Skipped without root or the CNI plugins.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn usable() -> bool {
    let ok = is_root()
        && Path::new("/usr/lib/cni/bridge").exists()
        && Command::new("nsenter").arg("--version").output().is_ok()
        && Command::new("curl").arg("--version").output().is_ok();
    if !ok {
        eprintln!(
            "skipped: needs root, nsenter, curl and /usr/lib/cni (containernetworking-plugins)"
        );
    }
    ok
}

/// The namespace prefix of a data directory (as `ferry up` computes it: FNV-1a of the path).
fn prefix_of(dir: &Path) -> String {
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut h: u32 = 0x811c_9dc5;
    for b in canon.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("ferry-{h:08x}-")
}

struct Cluster {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("ferry.log")).expect("log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["up", "--data-dir"])
            .arg(dir.path())
            .args(["--pod-network", "netns", "--listen-api", "127.0.0.1:0"])
            .args(["--agent-port", "0", "--dns-metrics-listen", "127.0.0.1:0"])
            .args(["--node-name", "sa"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ferry up");
        let kc = dir.path().join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !kc.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "ferry exited ({st}):\n{}",
                    std::fs::read_to_string(dir.path().join("ferry.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "ferry not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster {
            child: Some(child),
            dir,
        }
    }

    fn log(&self) -> String {
        let s = std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default();
        let l: Vec<&str> = s.lines().collect();
        l[l.len().saturating_sub(40)..].join("\n")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("kubectl");
        if let (Some(text), Some(mut si)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            si.write_all(text.as_bytes()).expect("stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}\nlog tail:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut v = args.to_vec();
        v.extend(["-o", "json"]);
        serde_json::from_str(&self.k(&v)).expect("json")
    }

    /// Runs `script` with `sh -c` in `pod` until its output contains `want`; returns it.
    fn exec_until(&self, ns: &str, pod: &str, script: &str, want: &str) -> String {
        let mut last = String::new();
        let ok = eventually(90, || {
            let out = self.kubectl(&["exec", "-n", ns, pod, "--", "sh", "-c", script], None);
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            out.status.success() && last.contains(want)
        });
        assert!(
            ok,
            "{script:?} in {ns}/{pod} never printed {want:?}; last: {last}\nlog tail:\n{}",
            self.log()
        );
        last
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM: the agent stops its pods and `ferry up` removes its namespaces.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let prefix = prefix_of(self.dir.path());
        for n in std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|n| n.starts_with(&prefix))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
        {
            let _ = Command::new("ip").args(["netns", "delete", &n]).status();
        }
    }
}

fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

/// curl from inside the pod with the mounted CA and token; prints the body then the status.
fn curl_pods(ns: &str) -> String {
    format!(
        "curl -sS -m 5 --cacert {SA_DIR}/ca.crt -H \"Authorization: Bearer $(cat {SA_DIR}/token)\" \
         -w '\\nHTTP %{{http_code}}' https://kubernetes.default.svc/api/v1/namespaces/{ns}/pods"
    )
}

#[test]
fn projected_token_from_inside_a_pod() {
    if !usable() {
        return;
    }
    let c = Cluster::start();
    let ns = "team-x";
    c.k(&["create", "namespace", ns]);
    assert!(
        eventually(60, || c
            .kubectl(&["get", "serviceaccount", "default", "-n", ns], None)
            .status
            .success()),
        "no default ServiceAccount in {ns}\n{}",
        c.log()
    );

    // A missing ServiceAccount: refused with upstream's message.
    let out = c.kubectl(
        &[
            "run",
            "ghost",
            "-n",
            ns,
            "--image=busybox",
            "--overrides",
            r#"{"spec": {"serviceAccountName": "ghost"}}"#,
            "--",
            "sleep",
            "3600",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("pods \"ghost\" is forbidden: error looking up service account team-x/ghost: serviceaccount \"ghost\" not found"),
        "{stderr}"
    );

    c.kubectl(
        &["apply", "-f", "-"],
        Some(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {ns}}}
spec:
  containers:
  - {{name: c, image: busybox, command: ["sleep", "3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: quiet, namespace: {ns}}}
spec:
  automountServiceAccountToken: false
  containers:
  - {{name: c, image: busybox, command: ["sleep", "3600"]}}
"#
        )),
    );
    let pod = c.json(&["get", "pod", "client", "-n", ns]);
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    let vol = pod["spec"]["volumes"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(vol.starts_with("kube-api-access-"), "{pod}");
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        SA_DIR
    );
    let quiet = c.json(&["get", "pod", "quiet", "-n", ns]);
    assert!(
        quiet["spec"]["volumes"]
            .as_array()
            .is_none_or(|v| v.is_empty()),
        "{quiet}"
    );

    // The volume's three files, seen from inside the pod.
    c.exec_until(ns, "client", &format!("cat {SA_DIR}/namespace"), ns);
    c.exec_until(
        ns,
        "client",
        &format!("cat {SA_DIR}/ca.crt"),
        "BEGIN CERTIFICATE",
    );
    let token = c.exec_until(ns, "client", &format!("cat {SA_DIR}/token"), "eyJ");
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    // The token is bound to the pod, and the API server verifies it (TokenReview).
    let review = format!(
        r#"{{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {{"token": "{token}"}}}}"#
    );
    let out = c.kubectl(&["create", "-f", "-", "-o", "json"], Some(&review));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tr: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(tr["status"]["authenticated"], true, "{tr}");
    assert_eq!(
        tr["status"]["user"]["username"],
        "system:serviceaccount:team-x:default"
    );
    let extra = &tr["status"]["user"]["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        serde_json::json!(["client"]),
        "{tr}"
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        serde_json::json!([pod["metadata"]["uid"]]),
        "{tr}"
    );

    // From inside the pod through the kubernetes Service: 403 for the bare default account...
    let out = c.exec_until(ns, "client", &curl_pods(ns), "HTTP 403");
    assert!(
        out.contains(r#"pods is forbidden: User \"system:serviceaccount:team-x:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"team-x\""#),
        "{out}"
    );
    // ...and 200 once it may view the namespace.
    c.k(&[
        "create",
        "rolebinding",
        "default-view",
        "--clusterrole=view",
        "--serviceaccount=team-x:default",
        "-n",
        ns,
    ]);
    let out = c.exec_until(ns, "client", &curl_pods(ns), "HTTP 200");
    assert!(
        out.contains("\"kind\":\"PodList\"") || out.contains("\"kind\": \"PodList\""),
        "{out}"
    );
    assert!(
        out.contains("\"name\":\"client\"") || out.contains("\"name\": \"client\""),
        "{out}"
    );
}
