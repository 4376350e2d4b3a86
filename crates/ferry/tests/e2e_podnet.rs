//! The netns pod network end to end (issue 10), as root: `ferry up --nodes 3` on a dual-stack
//! cluster — two pods on one node both serving :8080, a sidecar reaching its main container on
//! localhost, pod to pod across nodes over IPv4 and IPv6, a PreferDualStack Service answering
//! on both ClusterIPs from another node, AAAA from kube-dns inside a pod, a hostNetwork pod
//! with its node's IP and hostname, `ferry exec-net`; then exit and kill -9 leave no network
//! namespace or process behind. Everything lives in namespaces the cluster creates (their
//! names start with a per-data-directory prefix); the machine's own namespace is not touched.
//! Skipped without root or the CNI plugins.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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
        && Command::new("nsenter").arg("--version").output().is_ok();
    if !ok {
        eprintln!("skipped: needs root, nsenter and /usr/lib/cni (containernetworking-plugins)");
    }
    ok
}

struct Cluster {
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

fn ferry_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferry")
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

fn namespaces(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// PIDs whose command line names `needle`.
fn processes(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| *pid != me)
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|c| {
                            String::from_utf8_lossy(&c)
                                .replace('\0', " ")
                                .contains(needle)
                        })
                        .unwrap_or(false)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Threads (`pid/tid comm`) whose network namespace has inode `ino`.
fn netns_holders(ino: u64) -> Vec<String> {
    let want = format!("net:[{ino}]");
    let mut v = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = p.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if pid.parse::<u32>().is_err() {
            continue;
        }
        for f in std::fs::read_dir(p.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if std::fs::read_link(f.path()).is_ok_and(|l| l.to_string_lossy() == want) {
                v.push(format!("{pid} fd {}", f.file_name().to_string_lossy()));
            }
        }
        for t in std::fs::read_dir(p.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if std::fs::read_link(t.path().join("ns/net"))
                .is_ok_and(|l| l.to_string_lossy() == want)
            {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                v.push(format!(
                    "{pid}/{} {}",
                    t.file_name().to_string_lossy(),
                    comm.trim()
                ));
            }
        }
    }
    v
}

fn root_links() -> usize {
    Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

impl Cluster {
    fn start(extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args: Vec<String> = vec![
            "up".into(),
            "--data-dir".into(),
            dir.path().display().to_string(),
            "--pod-network".into(),
            "netns".into(),
            "--listen-api".into(),
            "127.0.0.1:0".into(),
            "--agent-port".into(),
            "0".into(),
            "--dns-metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--node-name".into(),
            "pn".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut c = Cluster {
            child: None,
            dir,
            args,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.dir.path().join("kubeconfig"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("ferry.log"))
            .expect("log");
        let mut child = Command::new(ferry_bin())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ferry up");
        let kc = self.dir.path().join("kubeconfig");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !kc.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("ferry exited ({st}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ferry not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.env("KUBECONFIG", self.kubeconfig())
            .env("HOME", self.dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().expect("kubectl");
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
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn apply(&self, yaml: &str) {
        let out = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until `kubectl exec` of `cmd` in `pod` prints something containing `want`.
    fn exec_until(&self, pod: &str, container: Option<&str>, cmd: &[&str], want: &str) -> String {
        let mut args = vec!["exec", pod];
        if let Some(c) = container {
            args.extend(["-c", c]);
        }
        args.push("--");
        args.extend(cmd);
        let mut last = String::new();
        let ok = eventually(60, || {
            let out = self.kubectl(&args, None);
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            out.status.success() && last.contains(want)
        });
        assert!(
            ok,
            "kubectl {args:?} never printed {want:?}; last: {last}\nlog tail:\n{}",
            tail(&self.log())
        );
        last
    }

    fn jsonpath(&self, kind: &str, name: &str, path: &str) -> String {
        let out = self.kubectl(
            &["get", kind, name, "-o", &format!("jsonpath={path}")],
            None,
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn wait_running(&self, pods: &[&str]) {
        for p in pods {
            let ok = eventually(90, || {
                self.jsonpath("pod", p, "{.status.containerStatuses[*].ready}")
                    .split_whitespace()
                    .all(|r| r == "true")
                    && !self
                        .jsonpath("pod", p, "{.status.containerStatuses[*].ready}")
                        .is_empty()
            });
            assert!(
                ok,
                "pod {p} not ready: {}\nlog tail:\n{}",
                self.k(&["get", "pod", p, "-o", "yaml"]),
                tail(&self.log())
            );
        }
    }

    fn sigterm(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("ferry did not exit on SIGTERM:\n{}", tail(&self.log()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill9();
        for pid in processes(&self.dir.path().display().to_string()) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        for n in namespaces(&prefix_of(self.dir.path())) {
            let _ = Command::new("ip").args(["netns", "delete", &n]).status();
        }
    }
}

fn tail(s: &str) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(40)..].join("\n")
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

fn serve_pod(name: &str, node: &str, port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  nodeName: {node}
  containers:
  - name: main
    image: registry.k8s.io/serve_hostname
    args: ["--port={port}"]
    readinessProbe: {{tcpSocket: {{port: {port}}}, periodSeconds: 1}}
"#
    )
}

#[test]
fn three_nodes_dual_stack() {
    if !usable() {
        return;
    }
    let links_before = root_links();
    // Pods of a deleted node are collected by the pod GC after its quarantine (upstream: 40 s).
    let mut c = Cluster::start(&[
        "--nodes",
        "3",
        "--controllers-arg=--pod-gc-orphan-quarantine-seconds=2",
    ]);
    let prefix = prefix_of(c.dir.path());
    assert!(
        eventually(60, || {
            let out = c.kubectl(&["get", "nodes", "--no-headers"], None);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
                .count()
                == 3
        }),
        "three Ready nodes: {}\n{}",
        c.k(&["get", "nodes", "-o", "wide"]),
        tail(&c.log())
    );
    assert_eq!(namespaces(&prefix).len(), 4, "cluster + 3 nodes");

    // Two pods on one node, both on :8080; a pod with a sidecar; a client pod on node 3; a
    // hostNetwork pod on node 2.
    let mut manifests = vec![serve_pod("a1", "pn-1", 8080), serve_pod("a2", "pn-1", 8080)];
    manifests.push(
        r#"apiVersion: v1
kind: Pod
metadata: {name: side}
spec:
  nodeName: pn-2
  containers:
  - name: main
    image: registry.k8s.io/serve_hostname
    args: ["--port=8080"]
  - name: sidecar
    image: busybox
    command: ["sleep", "3600"]
"#
        .to_string(),
    );
    manifests.push(
        r#"apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: pn-3
  containers:
  - name: c
    image: busybox
    command: ["sleep", "3600"]
"#
        .to_string(),
    );
    manifests.push(
        r#"apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  nodeName: pn-2
  hostNetwork: true
  containers:
  - name: c
    image: busybox
    command: ["sleep", "3600"]
"#
        .to_string(),
    );
    manifests.push(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: a1}
  ports: [{port: 80, targetPort: 8080}]
"#
        .to_string(),
    );
    c.apply(&manifests.join("---\n"));
    c.wait_running(&["a1", "a2", "side", "client", "hostnet"]);

    // Both pods serve :8080, each in its own namespace with an address of each family.
    let a1_ips = c.jsonpath("pod", "a1", "{.status.podIPs[*].ip}");
    let a1_ips: Vec<&str> = a1_ips.split_whitespace().collect();
    assert_eq!(a1_ips.len(), 2, "{a1_ips:?}");
    assert!(a1_ips[0].starts_with("10.244.") && a1_ips[1].starts_with("fd00:10:244:"));
    assert_eq!(c.jsonpath("pod", "a1", "{.status.podIP}"), a1_ips[0]);
    let a2_ip = c.jsonpath("pod", "a2", "{.status.podIP}");
    assert_ne!(a2_ip, a1_ips[0]);

    // Sidecar -> main on localhost.
    c.exec_until(
        "side",
        Some("sidecar"),
        &["curl", "-s", "-m", "3", "http://localhost:8080/"],
        "side",
    );
    // Pod to pod across nodes (pn-3 -> pn-1), IPv4 and IPv6.
    c.exec_until(
        "client",
        None,
        &[
            "curl",
            "-s",
            "-m",
            "3",
            &format!("http://{}:8080/", a1_ips[0]),
        ],
        "a1",
    );
    c.exec_until(
        "client",
        None,
        &[
            "curl",
            "-s",
            "-m",
            "3",
            "-g",
            &format!("http://[{}]:8080/", a1_ips[1]),
        ],
        "a1",
    );
    c.exec_until(
        "client",
        None,
        &["curl", "-s", "-m", "3", &format!("http://{a2_ip}:8080/")],
        "a2",
    );
    // The PreferDualStack Service on both ClusterIPs, from another node.
    let cips = c.jsonpath("svc", "web", "{.spec.clusterIPs[*]}");
    let cips: Vec<&str> = cips.split_whitespace().collect();
    assert_eq!(cips.len(), 2, "dual-stack ClusterIPs: {cips:?}");
    for ip in &cips {
        let url = if ip.contains(':') {
            format!("http://[{ip}]:80/")
        } else {
            format!("http://{ip}:80/")
        };
        c.exec_until("client", None, &["curl", "-s", "-m", "3", "-g", &url], "a1");
    }
    // AAAA (and A) from kube-dns inside a pod.
    c.exec_until(
        "client",
        None,
        &[
            "dig",
            "+short",
            "+time=2",
            "AAAA",
            "web.default.svc.cluster.local",
        ],
        cips[1],
    );
    c.exec_until(
        "client",
        None,
        &["dig", "+short", "+time=2", "web.default.svc.cluster.local"],
        cips[0],
    );
    // kube-dns is dual-stack (PreferDualStack): pods get both nameservers, and the IPv6 one
    // answers over IPv6 for both record types.
    let dns_ips = c.k(&[
        "get",
        "svc",
        "-n",
        "kube-system",
        "kube-dns",
        "-o",
        "jsonpath={.spec.ipFamilyPolicy} {.spec.clusterIPs[*]}",
    ]);
    assert_eq!(dns_ips, "PreferDualStack 10.96.0.10 fd00:10:96::a");
    c.exec_until(
        "client",
        None,
        &["cat", "/etc/resolv.conf"],
        "nameserver fd00:10:96::a",
    );
    c.exec_until(
        "client",
        None,
        &[
            "dig",
            "-6",
            "+short",
            "+time=2",
            "@fd00:10:96::a",
            "AAAA",
            "web.default.svc.cluster.local",
        ],
        cips[1],
    );
    c.exec_until(
        "client",
        None,
        &[
            "dig",
            "-6",
            "+short",
            "+time=2",
            "+tcp",
            "@fd00:10:96::a",
            "web.default.svc.cluster.local",
        ],
        cips[0],
    );
    // The kubernetes Service reaches the API server from a pod.
    c.exec_until(
        "client",
        None,
        // Any JSON answer (a Status when anonymous requests are refused) proves the path.
        &[
            "curl",
            "-sk",
            "-m",
            "3",
            "https://kubernetes.default.svc/version",
        ],
        "{",
    );
    // hostNetwork: the node's addresses and hostname.
    let node_ips = c.jsonpath(
        "node",
        "pn-2",
        "{.status.addresses[?(@.type==\"InternalIP\")].address}",
    );
    let pod_ips = c.jsonpath("pod", "hostnet", "{.status.podIPs[*].ip}");
    assert_eq!(pod_ips, node_ips);
    assert!(node_ips.starts_with("198.18.0."), "{node_ips}");
    c.exec_until("hostnet", None, &["hostname"], "pn-2");
    c.exec_until(
        "hostnet",
        None,
        &["ip", "-o", "addr", "show", "eth0"],
        "198.18.0.12",
    );
    // A pod's own namespace is not the node's: the host's interfaces are not visible.
    let links = c.exec_until("client", None, &["ip", "-o", "link", "show"], "eth0");
    let ifaces: Vec<&str> = links
        .lines()
        .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(ifaces.len(), 2, "lo and eth0 only: {links}");

    // ferry exec-net: the tour's curl of the ClusterIP from the cluster network.
    let out = Command::new(ferry_bin())
        .args(["exec-net", "--data-dir"])
        .arg(c.dir.path())
        .args([
            "--",
            "curl",
            "-s",
            "-m",
            "3",
            &format!("http://{}:80/", cips[0]),
        ])
        .output()
        .expect("exec-net");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "a1");

    // `kubectl delete node pn-3`: its agent, proxy and DNS stop; its pods' processes and
    // namespaces, its own namespace, its veth on the cluster bridge and the cluster's routes
    // through it go; the pod GC deletes the pods bound to it; the other nodes keep working.
    let cluster_ns = format!("{prefix}cluster");
    let client_uid = c.jsonpath("pod", "client", "{.metadata.uid}");
    let client_ns = format!("{prefix}pod3-{client_uid}");
    let node3_ns = format!("{prefix}node3");
    assert!(
        namespaces(&prefix).contains(&client_ns),
        "{:?}",
        namespaces(&prefix)
    );
    let client_pids: Vec<String> = Command::new("ip")
        .args(["netns", "pids", &client_ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !client_pids.is_empty(),
        "the client pod runs in {client_ns}"
    );
    let cluster_links = || {
        Command::new("ip")
            .args(["-n", &cluster_ns, "-o", "link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    let cluster_routes = || {
        ["-4", "-6"]
            .iter()
            .map(|f| {
                Command::new("ip")
                    .args(["-n", &cluster_ns, f, "route", "show"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                    .unwrap_or_default()
            })
            .collect::<String>()
    };
    assert!(cluster_links().contains("fv3@"), "{}", cluster_links());
    assert!(
        cluster_routes().contains("via 198.18.0.13"),
        "{}",
        cluster_routes()
    );
    let others_before = namespaces(&prefix).len();
    let node3_ino = std::fs::metadata(format!("/run/netns/{node3_ns}"))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap_or(0);
    c.k(&["delete", "node", "pn-3"]);
    let gone = eventually(60, || {
        let ns = namespaces(&prefix);
        !ns.contains(&client_ns)
            && !ns.contains(&node3_ns)
            && !cluster_links().contains("fv3@")
            && !cluster_routes().contains("via 198.18.0.13")
            && !cluster_routes().contains("via fd00:198:18::d")
            && client_pids
                .iter()
                .all(|p| !Path::new(&format!("/proc/{p}")).exists())
            && !c.kubectl(&["get", "pod", "client"], None).status.success()
    });
    assert!(
        gone,
        "node pn-3 left: namespaces {:?}, held by {:?}, links {}, routes {}, pod {}\nlog tail:\n{}",
        namespaces(&prefix),
        netns_holders(node3_ino),
        cluster_links(),
        cluster_routes(),
        String::from_utf8_lossy(&c.kubectl(&["get", "pod", "client"], None).stdout),
        tail(&c.log())
    );
    assert_eq!(
        namespaces(&prefix).len(),
        others_before - 2,
        "only pn-3 and its pod went: {:?}",
        namespaces(&prefix)
    );
    let out = Command::new(ferry_bin())
        .args(["exec-net", "--data-dir"])
        .arg(c.dir.path())
        .args(["--node", "pn-3", "--", "true"])
        .output()
        .expect("exec-net");
    assert!(
        !out.status.success(),
        "pn-3 is no longer in the cluster record"
    );
    // The remaining nodes still reach each other (pn-2 -> pn-1).
    c.exec_until(
        "side",
        Some("sidecar"),
        &[
            "curl",
            "-s",
            "-m",
            "3",
            &format!("http://{}:8080/", a1_ips[0]),
        ],
        "a1",
    );

    // Exit: no namespace, process or root link left.
    let dir = c.dir.path().display().to_string();
    c.sigterm();
    assert!(
        eventually(60, || namespaces(&prefix).is_empty()
            && processes(&dir).is_empty()),
        "left behind: {:?} {:?}",
        namespaces(&prefix),
        processes(&dir)
    );
    assert_eq!(
        root_links(),
        links_before,
        "the root namespace's links changed"
    );
}

#[test]
fn kill9_then_restart_leaves_nothing_behind() {
    if !usable() {
        return;
    }
    let links_before = root_links();
    let mut c = Cluster::start(&[]);
    let prefix = prefix_of(c.dir.path());
    let dir = c.dir.path().display().to_string();
    c.apply(&serve_pod("p", "pn", 8080));
    c.wait_running(&["p"]);
    let before = namespaces(&prefix);
    assert_eq!(before.len(), 3, "cluster, node, pod: {before:?}");
    c.kill9();
    // The pod processes and namespaces outlive a kill -9 ...
    assert_eq!(namespaces(&prefix).len(), 3);
    // ... and the next `ferry up` removes them, then runs the pod again.
    c.spawn();
    assert!(
        eventually(60, || c
            .log()
            .contains("network namespace(s) a previous run left")),
        "{}",
        tail(&c.log())
    );
    c.wait_running(&["p"]);
    let ip = c.jsonpath("pod", "p", "{.status.podIP}");
    assert!(ip.starts_with("10.244."), "{ip}");
    assert_eq!(namespaces(&prefix).len(), 3, "{:?}", namespaces(&prefix));
    // The killed run's IPAM leases were released (DEL from the CNI cache): one pod, one
    // address per family.
    assert_eq!(leases(c.dir.path()).len(), 2, "{:?}", leases(c.dir.path()));
    assert_eq!(pod_veths(&format!("{prefix}node1")), 1);
    c.sigterm();
    assert!(
        eventually(60, || namespaces(&prefix).is_empty()
            && processes(&dir).is_empty()),
        "left behind: {:?} {:?}",
        namespaces(&prefix),
        processes(&dir)
    );
    assert_eq!(
        root_links(),
        links_before,
        "the root namespace's links changed"
    );
}

const NGINX_DEFAULT_CONF: &str = r#"server {
        listen 80 default_server;
        listen [::]:80 default_server ipv6only=on;

        listen 443 ssl;

        root /usr/share/nginx/html;
        index index.html;

        server_name localhost;
        ssl_certificate /etc/nginx/ssl/tls.crt;
        ssl_certificate_key /etc/nginx/ssl/tls.key;

        location / {
                try_files $uri $uri/ =404;
        }
}
"#;

/// The seed's nginx-secure-app; the image `bprashanth/nginxhttps:1.0` stands for the machine's
/// nginx, whose main configuration (a ConfigMap mounted over /etc/nginx/nginx.conf) includes
/// the seed's `default.conf` from /etc/nginx/conf.d, with its pid file in an emptyDir.
const NGINX_SECURE_APP: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: my-nginx
  labels:
    run: my-nginx
spec:
  type: NodePort
  ports:
  - port: 8080
    targetPort: 80
    protocol: TCP
    name: http
  - port: 443
    protocol: TCP
    name: https
  selector:
    run: my-nginx
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: my-nginx
spec:
  selector:
    matchLabels:
      run: my-nginx
  replicas: 1
  template:
    metadata:
      labels:
        run: my-nginx
    spec:
      volumes:
      - name: secret-volume
        secret:
          secretName: nginxsecret
      - name: configmap-volume
        configMap:
          name: nginxconfigmap
      - name: main
        configMap:
          name: nginx-main
      - name: run
        emptyDir: {}
      containers:
      - name: nginxhttps
        image: bprashanth/nginxhttps:1.0
        command: ["nginx", "-g", "daemon off;"]
        ports:
        - containerPort: 443
        - containerPort: 80
        volumeMounts:
        - mountPath: /etc/nginx/ssl
          name: secret-volume
        - mountPath: /etc/nginx/conf.d
          name: configmap-volume
        - mountPath: /etc/nginx/nginx.conf
          name: main
          subPath: nginx.conf
        - mountPath: /run/ferry-e2e-nginx
          name: run
"#;

const NGINX_MAIN_CONF: &str = "worker_processes 1;\npid /run/ferry-e2e-nginx/nginx.pid;\n\
error_log stderr;\nevents {}\nhttp {\n    access_log off;\n    include /etc/nginx/mime.types;\n\
    include /etc/nginx/conf.d/*.conf;\n}\n";

#[test]
fn seed_004_nginx_https_and_volumes() {
    if !usable() || !Path::new("/usr/sbin/nginx").exists() {
        eprintln!("skipped: needs nginx");
        return;
    }
    // Pods share the machine's file system: mount points that do not exist are made (empty);
    // the ones this test makes are removed at the end (only if empty).
    let made: Vec<&str> = [
        "/etc/nginx/ssl",
        "/run/ferry-e2e-nginx",
        "/ferry-e2e/cm",
        "/ferry-e2e/info",
        "/ferry-e2e/proj",
        "/ferry-e2e",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    let mut c = Cluster::start(&[]);
    let prefix = prefix_of(c.dir.path());
    let dir = c.dir.path().display().to_string();
    assert!(eventually(60, || {
        let out = c.kubectl(&["get", "nodes", "--no-headers"], None);
        String::from_utf8_lossy(&out.stdout).contains(" Ready ")
    }));
    // The Deployment first: its Secret is missing, so the pod waits in ContainerCreating with
    // a FailedMount Event naming it.
    c.apply(NGINX_SECURE_APP);
    assert!(
        eventually(60, || {
            let out = c.kubectl(
                &[
                    "get",
                    "events",
                    "--field-selector",
                    "reason=FailedMount",
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
                None,
            );
            let msg = String::from_utf8_lossy(&out.stdout).to_string();
            msg.contains("secret \"nginxsecret\" not found")
        }),
        "no FailedMount event:\n{}",
        tail(&c.log())
    );
    let out = c.kubectl(
        &["get", "pods", "-l", "run=my-nginx", "-o", "jsonpath={.items[0].metadata.name} {.items[0].status.containerStatuses[0].state.waiting.reason}"],
        None,
    );
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = line.split_whitespace();
    let pod_name = it.next().unwrap_or_default().to_string();
    assert_eq!(it.next(), Some("ContainerCreating"), "{line}");

    // The seed's keys (openssl, CN=my-nginx) and ConfigMap; then the pod runs and HTTPS answers
    // through the Service.
    let tmp = c.dir.path().join("keys");
    std::fs::create_dir_all(&tmp).expect("keys dir");
    let st = Command::new("openssl")
        .args([
            "req", "-x509", "-nodes", "-days", "365", "-newkey", "rsa:2048", "-keyout",
        ])
        .arg(tmp.join("nginx.key"))
        .arg("-out")
        .arg(tmp.join("nginx.crt"))
        .args(["-subj", "/CN=my-nginx/O=my-nginx"])
        .output()
        .expect("openssl");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    std::fs::write(tmp.join("default.conf"), NGINX_DEFAULT_CONF).expect("conf");
    std::fs::write(tmp.join("nginx.conf"), NGINX_MAIN_CONF).expect("main conf");
    let key = tmp.join("nginx.key").display().to_string();
    let crt = tmp.join("nginx.crt").display().to_string();
    c.k(&[
        "create",
        "secret",
        "tls",
        "nginxsecret",
        "--key",
        &key,
        "--cert",
        &crt,
    ]);
    c.k(&[
        "create",
        "configmap",
        "nginxconfigmap",
        &format!("--from-file={}", tmp.join("default.conf").display()),
    ]);
    c.k(&[
        "create",
        "configmap",
        "nginx-main",
        &format!("--from-file={}", tmp.join("nginx.conf").display()),
    ]);
    c.wait_running(&[&pod_name]);
    let got = c.exec_until(
        &pod_name,
        None,
        &["cat", "/etc/nginx/ssl/tls.crt"],
        "BEGIN CERTIFICATE",
    );
    assert_eq!(
        got.trim(),
        std::fs::read_to_string(&crt).expect("crt").trim()
    );
    let cip = c.jsonpath("svc", "my-nginx", "{.spec.clusterIP}");
    let mut last = String::new();
    let ok = eventually(60, || {
        let out = Command::new(ferry_bin())
            .args([
                "exec-net",
                "--data-dir",
                &dir,
                "--",
                "curl",
                "-vsk",
                "-m",
                "3",
            ])
            .arg(format!("https://{cip}:443/"))
            .output()
            .expect("exec-net");
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        last.contains("Welcome to nginx") && last.contains("CN=my-nginx")
    });
    assert!(ok, "HTTPS through the Service: {last}\n{}", tail(&c.log()));

    // configMap, downwardAPI and projected volumes; a ConfigMap update reaches the pod.
    c.k(&[
        "create",
        "configmap",
        "data",
        "--from-literal=greeting=hello",
    ]);
    c.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: vols, labels: {tier: web}}
spec:
  containers:
  - name: c
    image: busybox
    command: ["sleep", "3600"]
    volumeMounts:
    - {name: cm, mountPath: /ferry-e2e/cm}
    - {name: info, mountPath: /ferry-e2e/info}
    - {name: proj, mountPath: /ferry-e2e/proj, readOnly: true}
  volumes:
  - name: cm
    configMap: {name: data, items: [{key: greeting, path: hi.txt, mode: 0600}]}
  - name: info
    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
  - name: proj
    projected:
      sources:
      - configMap: {name: data}
      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
"#,
    );
    c.wait_running(&["vols"]);
    c.exec_until("vols", None, &["cat", "/ferry-e2e/cm/hi.txt"], "hello");
    c.exec_until(
        "vols",
        None,
        &["stat", "-L", "-c", "%a", "/ferry-e2e/cm/hi.txt"],
        "600",
    );
    c.exec_until(
        "vols",
        None,
        &["cat", "/ferry-e2e/info/labels"],
        "tier=\"web\"",
    );
    c.exec_until("vols", None, &["cat", "/ferry-e2e/proj/name"], "vols");
    c.k(&[
        "patch",
        "configmap",
        "data",
        "-p",
        r#"{"data":{"greeting":"updated"}}"#,
    ]);
    c.exec_until("vols", None, &["cat", "/ferry-e2e/cm/hi.txt"], "updated");

    // Init containers as upstream reports them: Init:0/1, then Running.
    c.apply(
        r#"apiVersion: v1
kind: Pod
metadata: {name: initp}
spec:
  initContainers:
  - {name: wait, image: busybox, command: ["sleep", "4"]}
  containers:
  - {name: c, image: busybox, command: ["sleep", "3600"]}
"#,
    );
    assert!(
        eventually(30, || {
            let out = c.kubectl(&["get", "pod", "initp", "--no-headers"], None);
            String::from_utf8_lossy(&out.stdout).contains("Init:0/1")
        }),
        "never Init:0/1"
    );
    c.wait_running(&["initp"]);
    assert_eq!(
        c.jsonpath(
            "pod",
            "initp",
            "{.status.initContainerStatuses[0].state.terminated.reason}"
        ),
        "Completed"
    );

    c.sigterm();
    for p in made {
        let _ = std::fs::remove_dir(p);
    }
    assert!(
        eventually(60, || namespaces(&prefix).is_empty()
            && processes(&dir).is_empty()),
        "left behind: {:?} {:?}",
        namespaces(&prefix),
        processes(&dir)
    );
}

/// Host-local leases (files named by address) in a node's IPAM directory.
fn leases(dir: &Path) -> Vec<String> {
    let ipam = dir.join("agent/nodes/pn/cni/ipam/ferry");
    std::fs::read_dir(ipam)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Pod-side veths on the node's bridge (the node's own `eth0` is not one).
fn pod_veths(node_ns: &str) -> usize {
    Command::new("ip")
        .args(["-n", node_ns, "-o", "link", "show", "type", "veth"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.contains(" eth0@"))
                .count()
        })
        .unwrap_or(usize::MAX)
}

/// `reason|count|message` of each Event about a pod.
fn pod_events(c: &Cluster, pod: &str) -> Vec<(String, u64, String)> {
    let out = c.kubectl(
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}|{.count}|{.message}{\"\\n\"}{end}",
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = l.splitn(3, '|');
            Some((
                p.next()?.to_string(),
                p.next()?.parse().unwrap_or(1),
                p.next()?.to_string(),
            ))
        })
        .collect()
}

/// Waits until the pod has `FailedCreatePodSandBox` Events whose messages contain `cause`,
/// at least `times` of them (counting repeats): retried with back-off.
fn wait_sandbox_failures(c: &Cluster, pod: &str, cause: &str, times: u64) {
    let ok = eventually(60, || {
        pod_events(c, pod)
            .iter()
            .filter(|(r, _, m)| r == "FailedCreatePodSandBox" && m.contains(cause))
            .map(|(_, n, _)| *n)
            .sum::<u64>()
            >= times
    });
    assert!(
        ok,
        "no {times} FailedCreatePodSandBox events naming {cause:?} for {pod}: {:?}\nlog tail:\n{}",
        pod_events(c, pod),
        tail(&c.log())
    );
    // Meanwhile the pod waits in ContainerCreating.
    assert_eq!(c.jsonpath("pod", pod, "{.status.phase}"), "Pending");
    assert_eq!(
        c.jsonpath(
            "pod",
            pod,
            "{.status.containerStatuses[0].state.waiting.reason}"
        ),
        "ContainerCreating"
    );
}

#[test]
fn cni_failure_and_exhausted_pod_cidr() {
    if !usable() {
        return;
    }
    // A failing plugin: `portmap` (the last of the default network) wrapped by a script that
    // fails ADD while a gate file exists. A tiny pod CIDR: a /30 per node, one pod address
    // (host-local keeps .1 for the gateway).
    let tools = tempfile::tempdir().expect("tempdir");
    let gate = tools.path().join("gate");
    std::fs::write(&gate, "").expect("gate");
    let script = format!(
        "#!/bin/sh\nif [ -e {} ] && [ \"$CNI_COMMAND\" = ADD ]; then\n  cat >/dev/null\n  \
         echo '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"e2e: injected portmap failure\"}}'\n  \
         exit 1\nfi\nexec /usr/lib/cni/portmap\n",
        gate.display()
    );
    let plugin = tools.path().join("portmap");
    std::fs::write(&plugin, script).expect("plugin");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bins = format!("{},/usr/lib/cni", tools.path().display());
    let mut c = Cluster::start(&[
        "--cni-bin-dir",
        &bins,
        "--cluster-cidr",
        "10.244.0.0/30,fd00:10:244::/56",
        "--controllers-arg=--node-cidr-mask-size-ipv4=30",
    ]);
    let prefix = prefix_of(c.dir.path());
    let node_ns = format!("{prefix}node1");
    let nothing_left = |pods: usize, c: &Cluster| {
        namespaces(&prefix).len() == 2 + pods
            && pod_veths(&node_ns) == pods
            && leases(c.dir.path()).len() == 2 * pods
    };

    // The plugin fails: Pending with Events naming the cause, retried, nothing left over.
    c.apply(&serve_pod("g1", "pn", 8080));
    wait_sandbox_failures(&c, "g1", "e2e: injected portmap failure", 2);
    assert!(
        eventually(30, || nothing_left(0, &c)),
        "a failed sandbox leaked: namespaces {:?}, veths {}, leases {:?}",
        namespaces(&prefix),
        pod_veths(&node_ns),
        leases(c.dir.path())
    );
    // The plugin recovers: the next retry succeeds.
    std::fs::remove_file(&gate).expect("open the gate");
    c.wait_running(&["g1"]);
    assert_eq!(c.jsonpath("pod", "g1", "{.status.podIP}"), "10.244.0.2");

    // The pod CIDR is exhausted: the second pod waits, naming host-local's error, and holds
    // nothing; once the first pod goes, it gets the address.
    c.apply(&serve_pod("g2", "pn", 8080));
    wait_sandbox_failures(&c, "g2", "no IP addresses available", 1);
    assert!(
        eventually(30, || nothing_left(1, &c)),
        "an exhausted pod CIDR leaked: namespaces {:?}, veths {}, leases {:?}",
        namespaces(&prefix),
        pod_veths(&node_ns),
        leases(c.dir.path())
    );
    c.k(&["delete", "pod", "g1", "--wait=true"]);
    c.wait_running(&["g2"]);
    assert_eq!(c.jsonpath("pod", "g2", "{.status.podIP}"), "10.244.0.2");
    assert!(
        eventually(30, || nothing_left(1, &c)),
        "{:?} {:?}",
        namespaces(&prefix),
        leases(c.dir.path())
    );
    c.sigterm();
    assert!(
        eventually(60, || namespaces(&prefix).is_empty()),
        "{:?}",
        namespaces(&prefix)
    );
}
