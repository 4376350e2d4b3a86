//! The kernel service proxy end to end (issue 11), as root: `ferry up --nodes 3` on a
//! dual-stack cluster, once per kernel mode (nftables, iptables). Every Service type (ClusterIP
//! of both families, NodePort, LoadBalancer, externalIPs) is reached from a pod, from a node
//! namespace and from outside the nodes (the cluster namespace); ClientIP affinity; traffic
//! policies `Local` (internal and external, with the healthCheckNodePort answers); topology
//! hints; a rolling update under a client loop with no failed request; a UDP flow moved off a
//! deleted endpoint (the time it took is printed, not asserted); the rules gone on exit.
//! Everything lives in the namespaces the cluster creates. Skipped without root, the CNI
//! plugins, nft or iptables.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

fn have(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

fn usable(mode: &str) -> bool {
    let tool = if mode == "iptables" {
        "iptables-restore"
    } else {
        "nft"
    };
    let ok = is_root()
        && Path::new("/usr/lib/cni/bridge").exists()
        && have("nsenter")
        && have("conntrack")
        && have(tool)
        && have("python3");
    if !ok {
        eprintln!(
            "skipped: needs root, nsenter, conntrack, python3, {tool} and /usr/lib/cni (containernetworking-plugins)"
        );
    }
    ok
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
    format!("ferry-{h:08x}")
}

fn tail(s: &str) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(40)..].join("\n")
}

fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

struct Cluster {
    child: Option<Child>,
    dir: tempfile::TempDir,
    prefix: String,
}

/// Where a request starts.
#[derive(Debug, Clone, Copy)]
enum From<'a> {
    Pod(&'a str),
    /// Node namespace 1..=3.
    Node(usize),
    /// The cluster namespace: outside every node.
    Outside,
}

impl Cluster {
    fn start(mode: &str) -> Cluster {
        Cluster::start_n(mode, 3)
    }

    fn start_n(mode: &str, nodes: usize) -> Cluster {
        let nodes = nodes.to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = prefix_of(dir.path());
        let log = std::fs::File::create(dir.path().join("ferry.log")).expect("log");
        let child = Command::new(ferry_bin())
            .args([
                "up",
                "--data-dir",
                &dir.path().display().to_string(),
                "--pod-network",
                "netns",
                "--nodes",
                &nodes,
                "--proxy-mode",
                mode,
                "--listen-api",
                "127.0.0.1:0",
                "--agent-port",
                "0",
                "--dns-metrics-listen",
                "127.0.0.1:0",
                "--netpol-metrics-listen",
                "127.0.0.1:0",
                "--proxy-healthz-listen",
                "off",
                "--ingress-http-addr",
                "off",
                "--ingress-https-addr",
                "off",
                "--node-name",
                "kp",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ferry up");
        let mut c = Cluster {
            child: Some(child),
            dir,
            prefix,
        };
        let kc = c.kubeconfig();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !kc.exists() {
            if let Some(ch) = c.child.as_mut()
                && let Ok(Some(st)) = ch.try_wait()
            {
                panic!("ferry exited ({st}):\n{}", c.log());
            }
            assert!(Instant::now() < deadline, "ferry not ready:\n{}", c.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn node_ns(&self, i: usize) -> String {
        format!("{}-node{i}", self.prefix)
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
        if let (Some(t), Some(mut si)) = (stdin, child.stdin.take()) {
            use std::io::Write;
            si.write_all(t.as_bytes()).expect("stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    fn k(&self, args: &[&str]) -> String {
        let out = self.kubectl(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\nlog tail:\n{}",
            text(&out),
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn apply(&self, yaml: &str) {
        let out = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(out.status.success(), "apply: {}", text(&out));
    }

    fn jsonpath(&self, kind: &str, name: &str, path: &str) -> String {
        let out = self.kubectl(
            &["get", kind, name, "-o", &format!("jsonpath={path}")],
            None,
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn wait_ready(&self, pods: &[&str]) {
        for p in pods {
            let ok = eventually(90, || {
                let r = self.jsonpath("pod", p, "{.status.containerStatuses[*].ready}");
                !r.is_empty() && r.split_whitespace().all(|x| x == "true")
            });
            assert!(ok, "pod {p} not ready\nlog tail:\n{}", tail(&self.log()));
        }
    }

    /// Runs `cmd` from `from`; its output (stdout and stderr) and whether it succeeded.
    fn run(&self, from: From, cmd: &[&str]) -> (bool, String) {
        let out = match from {
            From::Pod(p) => {
                let mut args = vec!["exec", p, "--"];
                args.extend(cmd);
                self.kubectl(&args, None)
            }
            From::Node(i) => Command::new("ip")
                .args(["netns", "exec", &self.node_ns(i)])
                .args(cmd)
                .output()
                .expect("ip netns exec"),
            From::Outside => Command::new(ferry_bin())
                .args([
                    "exec-net",
                    "--data-dir",
                    &self.dir.path().display().to_string(),
                ])
                .arg("--")
                .args(cmd)
                .output()
                .expect("ferry exec-net"),
        };
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    }

    /// One HTTP GET: the body, or `None` when the request failed.
    fn get(&self, from: From, url: &str) -> Option<String> {
        let (ok, body) = self.run(from, &["curl", "-s", "-g", "-m", "3", url]);
        ok.then_some(body)
    }

    /// GETs `url` until it answers; the answer.
    fn get_until(&self, from: From, url: &str) -> String {
        let mut last = None;
        let ok = eventually(60, || {
            last = self.get(from, url);
            last.is_some()
        });
        assert!(
            ok,
            "GET {url} from {from:?} never answered\nlog tail:\n{}",
            tail(&self.log())
        );
        last.unwrap_or_default()
    }

    /// The backends that answer `url` from `from` in `n` requests (each must answer).
    fn backends(&self, from: From, url: &str, n: usize) -> BTreeSet<String> {
        self.get_until(from, url);
        let mut seen = BTreeSet::new();
        for _ in 0..n {
            let b = self.get(from, url);
            assert!(b.is_some(), "GET {url} from {from:?} failed");
            seen.extend(b);
        }
        seen
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SIGTERM first: `ferry up` stops its pods and removes its namespaces; SIGKILL only if
        // it does not exit in time (pod processes would outlive it).
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            if !eventually(40, || matches!(c.try_wait(), Ok(Some(_)))) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        // Whatever still names this cluster's data directory (a pod of a killed agent).
        let needle = self.dir.path().display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if pid != std::process::id() && String::from_utf8_lossy(&cmd).contains(&needle) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let names: Vec<String> = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
                    .collect()
            })
            .unwrap_or_default();
        for n in names {
            let _ = Command::new("ip").args(["netns", "delete", &n]).status();
        }
    }
}

fn url(ip: &str, port: &str) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}/")
    } else {
        format!("http://{ip}:{port}/")
    }
}

/// A client loop: GET `url` every 50 ms for `secs` seconds; prints `ok fail` and the hosts.
const LOOP: &str = r#"
import sys, time, urllib.request
url, secs = sys.argv[1], float(sys.argv[2])
ok = fail = 0; hosts = set(); end = time.time() + secs
while time.time() < end:
    try:
        hosts.add(urllib.request.urlopen(url, timeout=3).read().decode()); ok += 1
    except Exception as e:
        fail += 1; print("failed:", e, file=sys.stderr)
    time.sleep(0.05)
print(ok, fail, " ".join(sorted(hosts)))
"#;

/// A UDP flow from one fixed source port: sends every 20 ms; prints each new answer with the
/// wall-clock time it first came; stops at `want` or after `secs`.
const UDP: &str = r#"
import socket, sys, time
host, port, want, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 40123)); s.settimeout(0.02)
seen = set(); end = time.time() + secs
while time.time() < end:
    try: s.sendto(b"x", (host, port))
    except OSError: pass
    try:
        d = s.recv(512).decode().strip()
        if d not in seen:
            seen.add(d); print(d, time.time(), flush=True)
        if d == want: break
    except OSError: pass
    time.sleep(0.02)
"#;

fn pod(name: &str, node: &str, labels: &str, extra_args: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{{labels}}}}}
spec:
  nodeName: {node}
  containers:
  - name: main
    image: registry.k8s.io/serve_hostname
    args: ["--port=8080"{extra_args}]
    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
"#
    )
}

fn client(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeName: {node}
  containers:
  - name: c
    image: busybox
    command: ["sleep", "3600"]
"#
    )
}

fn kernel_proxy(mode: &str) {
    if !usable(mode) {
        return;
    }
    let c = Cluster::start(mode);
    assert!(
        eventually(60, || c
            .k(&["get", "nodes", "--no-headers"])
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
            .count()
            == 3),
        "three Ready nodes\n{}",
        tail(&c.log())
    );
    // Zones for the hints: kp-1 in a, kp-2 and kp-3 in b.
    c.k(&["label", "node", "kp-1", "topology.kubernetes.io/zone=a"]);
    c.k(&["label", "node", "kp-2", "topology.kubernetes.io/zone=b"]);
    c.k(&["label", "node", "kp-3", "topology.kubernetes.io/zone=b"]);

    let mut m = vec![
        pod("w1", "kp-1", "app: web", ""),
        pod("w2", "kp-2", "app: web", ""),
        pod("u1", "kp-1", "app: udp", r#", "--udp=true""#),
        client("client", "kp-3"),
        client("client1", "kp-1"),
    ];
    m.push(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-lb}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  ipFamilyPolicy: PreferDualStack
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-ext}
spec:
  type: NodePort
  externalIPs: [198.18.255.100]
  selector: {app: web}
  ports: [{port: 81, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-local}
spec:
  internalTrafficPolicy: Local
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-aff}
spec:
  sessionAffinity: ClientIP
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: udp}
spec:
  selector: {app: udp}
  ports: [{port: 5353, targetPort: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata:
  name: hinted
  annotations: {service.kubernetes.io/topology-mode: Auto}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
"#
        .to_string(),
    );
    c.apply(&m.join("---\n"));
    c.wait_ready(&["w1", "w2", "u1", "client", "client1"]);
    let w1 = c.jsonpath("pod", "w1", "{.status.podIP}");
    let w2 = c.jsonpath("pod", "w2", "{.status.podIP}");
    let both: BTreeSet<String> = ["w1".to_string(), "w2".to_string()].into();
    let node_ip = |i: usize| format!("198.18.0.{}", 10 + i);
    let node_ip6 = |i: usize| format!("fd00:198:18::{:x}", 10 + i);

    // ClusterIPs of both families from a pod, a node and outside the nodes; both endpoints.
    let cips = c.jsonpath("svc", "web", "{.spec.clusterIPs[*]}");
    let cips: Vec<String> = cips.split_whitespace().map(str::to_string).collect();
    assert_eq!(cips.len(), 2, "dual-stack ClusterIPs: {cips:?}");
    for ip in &cips {
        for from in [From::Pod("client"), From::Node(3), From::Outside] {
            let seen = c.backends(from, &url(ip, "80"), 12);
            assert_eq!(seen, both, "ClusterIP {ip} from {from:?}");
        }
    }
    // By name, through kube-dns (a Service whose endpoints are the nodes' DNS listeners).
    assert!(both.contains(&c.get_until(From::Pod("client"), "http://web/")));
    // A pod reaching itself through its Service (hairpin).
    assert!(eventually(30, || c
        .get(From::Pod("w1"), &url(&cips[0], "80"))
        .as_deref()
        == Some("w1")));

    // NodePort + externalIP (externalTrafficPolicy Cluster): any node forwards to both.
    let np = c.jsonpath("svc", "web-ext", "{.spec.ports[0].nodePort}");
    for from in [From::Pod("client"), From::Node(3), From::Outside] {
        assert_eq!(
            c.backends(from, &url(&node_ip(3), &np), 12),
            both,
            "NodePort from {from:?}"
        );
        assert_eq!(
            c.backends(from, &url("198.18.255.100", "81"), 12),
            both,
            "externalIP from {from:?}"
        );
    }

    // Localhost NodePorts: iptables mode answers on 127.0.0.1 inside a node (route_localnet,
    // as upstream's iptables mode); nftables mode does not (as upstream's nftables mode).
    let localhost = url("127.0.0.1", &np);
    if mode == "iptables" {
        assert_eq!(
            c.backends(From::Node(1), &localhost, 8),
            both,
            "localhost NodePort"
        );
    } else {
        assert_eq!(
            c.get(From::Node(1), &localhost),
            None,
            "no localhost NodePort"
        );
    }

    // LoadBalancer with externalTrafficPolicy Local: a node answers only with its own
    // endpoints, a node without any drops; the health check says which.
    assert!(
        eventually(30, || !c
            .jsonpath("svc", "web-lb", "{.status.loadBalancer.ingress[0].ip}")
            .is_empty()),
        "load-balancer IP"
    );
    let lb = c.jsonpath("svc", "web-lb", "{.status.loadBalancer.ingress[0].ip}");
    let lbnp = c.jsonpath("svc", "web-lb", "{.spec.ports[0].nodePort}");
    let hc = c.jsonpath("svc", "web-lb", "{.spec.healthCheckNodePort}");
    assert!(!hc.is_empty(), "healthCheckNodePort");
    let one: BTreeSet<String> = ["w1".to_string()].into();
    let two: BTreeSet<String> = ["w2".to_string()].into();
    assert_eq!(c.backends(From::Outside, &url(&node_ip(1), &lbnp), 8), one);
    assert_eq!(c.backends(From::Outside, &url(&node_ip(2), &lbnp), 8), two);
    assert_eq!(
        c.backends(From::Outside, &url(&node_ip6(2), &lbnp), 4),
        two,
        "IPv6 NodePort"
    );
    assert_eq!(
        c.get(From::Outside, &url(&node_ip(3), &lbnp)),
        None,
        "no local endpoint"
    );
    // The cluster namespace routes load-balancer addresses to the first node.
    assert_eq!(c.backends(From::Outside, &url(&lb, "80"), 8), one);
    // From a pod and a node the load-balancer address is short-circuited to the Service.
    assert_eq!(c.backends(From::Pod("client"), &url(&lb, "80"), 12), both);
    assert_eq!(c.backends(From::Node(3), &url(&lb, "80"), 12), both);
    let health = |i: usize| {
        c.run(
            From::Outside,
            &[
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-m",
                "3",
                &url(&node_ip(i), &hc),
            ],
        )
        .1
    };
    assert!(
        eventually(30, || health(1) == "200"),
        "health of kp-1: {}",
        health(1)
    );
    assert_eq!(health(3), "503", "health of kp-3 (no local endpoint)");

    // internalTrafficPolicy Local: only the node's own endpoints; none on kp-3 -> dropped.
    let local_ip = c.jsonpath("svc", "web-local", "{.spec.clusterIP}");
    assert_eq!(
        c.backends(From::Pod("client1"), &url(&local_ip, "80"), 8),
        one
    );
    assert_eq!(c.get(From::Pod("client"), &url(&local_ip, "80")), None);

    // ClientIP affinity: one client, one backend.
    let aff = c.jsonpath("svc", "web-aff", "{.spec.clusterIP}");
    assert_eq!(
        c.backends(From::Pod("client"), &url(&aff, "80"), 12).len(),
        1,
        "affinity"
    );

    // Topology hints (a hand-made EndpointSlice): zone b nodes use w2, zone a uses w1.
    c.apply(&format!(
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hinted-1
  labels: {{kubernetes.io/service-name: hinted, endpointslice.kubernetes.io/managed-by: e2e}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- addresses: ["{w1}"]
  conditions: {{ready: true}}
  hints: {{forZones: [{{name: a}}]}}
- addresses: ["{w2}"]
  conditions: {{ready: true}}
  hints: {{forZones: [{{name: b}}]}}
"#
    ));
    let hinted = c.jsonpath("svc", "hinted", "{.spec.clusterIP}");
    let hurl = url(&hinted, "80");
    for (from, want) in [(From::Pod("client"), &two), (From::Pod("client1"), &one)] {
        // Once the rules have it, every request keeps to the zone.
        assert!(
            eventually(30, || c.backends(from, &hurl, 6) == *want),
            "hints from {from:?}"
        );
        assert_eq!(c.backends(from, &hurl, 16), *want, "hints from {from:?}");
    }

    // A rolling update under a client loop: no request fails.
    c.apply(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: roll}
spec:
  replicas: 2
  selector: {matchLabels: {app: roll}}
  template:
    metadata: {labels: {app: roll}}
    spec:
      containers:
      - name: main
        image: registry.k8s.io/serve_hostname
        args: ["--port=8080"]
        env: [{name: V, value: "1"}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: roll}
spec:
  selector: {app: roll}
  ports: [{port: 80, targetPort: 8080}]
"#,
    );
    assert!(
        eventually(90, || c.jsonpath(
            "deploy",
            "roll",
            "{.status.readyReplicas}"
        ) == "2"),
        "deployment roll ready\n{}",
        tail(&c.log())
    );
    let roll = c.jsonpath("svc", "roll", "{.spec.clusterIP}");
    c.get_until(From::Pod("client"), &url(&roll, "80"));
    let before: BTreeSet<String> = c
        .k(&[
            "get",
            "pods",
            "-l",
            "app=roll",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let client_loop = Command::new("kubectl")
        .env("KUBECONFIG", c.kubeconfig())
        .env("HOME", c.dir.path())
        .args([
            "exec",
            "client",
            "--",
            "python3",
            "-c",
            LOOP,
            &url(&roll, "80"),
            "25",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("client loop");
    std::thread::sleep(Duration::from_secs(2));
    c.k(&["set", "env", "deployment/roll", "V=2"]);
    let out = client_loop.wait_with_output().expect("client loop");
    let res = String::from_utf8_lossy(&out.stdout).to_string();
    let f: Vec<&str> = res.split_whitespace().collect();
    assert!(
        f.len() >= 3,
        "client loop: {res}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hosts: BTreeSet<String> = f[2..].iter().map(|s| s.to_string()).collect();
    eprintln!(
        "[{mode}] rolling update: {} requests, {} failed, hosts {hosts:?}",
        f[0], f[1]
    );
    assert_eq!(
        f[1],
        "0",
        "failed requests during the rolling update: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        hosts.iter().any(|h| !before.contains(h)) && hosts.iter().any(|h| before.contains(h)),
        "the loop spanned the update: before {before:?}, answered by {hosts:?}"
    );

    // A UDP flow to a deleted endpoint moves to the new one (its stale conntrack entry is
    // removed; a flow that keeps sending would otherwise stay on the old endpoint): the time
    // from the old pod's deletion to the first answer of the new one.
    let udp = c.jsonpath("svc", "udp", "{.spec.clusterIP}");
    let mut flow = Command::new("kubectl")
        .env("KUBECONFIG", c.kubeconfig())
        .env("HOME", c.dir.path())
        .args([
            "exec", "client", "--", "python3", "-u", "-c", UDP, &udp, "5353", "u2", "90",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("udp flow");
    let stdout = flow.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let first = rx.recv_timeout(Duration::from_secs(60));
    lines.extend(first.clone());
    assert!(
        first.as_deref().is_ok_and(|l| l.starts_with("u1 ")),
        "the UDP flow reaches u1 first: {first:?}\n{}",
        tail(&c.log())
    );
    // A second endpoint joins (the flow stays on u1), then u1 goes.
    c.apply(&pod("u2", "kp-2", "app: udp", r#", "--udp=true""#));
    c.wait_ready(&["u2"]);
    assert!(eventually(30, || c
        .k(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=udp",
            "-o",
            "jsonpath={.items[*].endpoints[*].targetRef.name}"
        ])
        .contains("u2")));
    std::thread::sleep(Duration::from_secs(1));
    let t_delete = now();
    c.k(&["delete", "pod", "u1", "--wait=false"]);
    let moved = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                lines.push(l.clone());
                if let Some(t) = l
                    .strip_prefix("u2 ")
                    .and_then(|t| t.trim().parse::<f64>().ok())
                {
                    break Some(t);
                }
            }
            Err(_) => break None,
        }
    };
    let _ = flow.kill();
    let _ = flow.wait();
    let Some(t_moved) = moved else {
        panic!(
            "the UDP flow never moved to u2: {lines:?}\n{}",
            tail(&c.log())
        )
    };
    eprintln!(
        "[{mode}] stale UDP flow moved to the new endpoint {:.0} ms after the old pod's deletion",
        (t_moved - t_delete) * 1000.0
    );

    // The rules exist while running; exit removes the node namespaces with them.
    let present = |i: usize| match mode {
        "iptables" => c
            .run(From::Node(i), &["iptables-save", "-t", "nat"])
            .1
            .contains("KUBE-SERVICES"),
        _ => {
            c.run(From::Node(i), &["nft", "list", "table", "inet", "ferry"])
                .0
        }
    };
    assert!(present(1), "{mode} rules in kp-1");
    let mut c = c;
    if let Some(mut ch) = c.child.take() {
        let _ = Command::new("kill")
            .args(["-TERM", &ch.id().to_string()])
            .status();
        assert!(
            eventually(40, || matches!(ch.try_wait(), Ok(Some(_)))),
            "ferry exits on SIGTERM"
        );
    }
    assert!(
        eventually(60, || !Path::new(&format!("/run/netns/{}", c.node_ns(1)))
            .exists()),
        "node namespaces removed"
    );
}

#[test]
fn nftables_three_nodes() {
    kernel_proxy("nftables");
}

#[test]
fn iptables_three_nodes() {
    kernel_proxy("iptables");
}

/// One UDP request from a fixed source: the answer, or an empty string.
const UDP_ONCE: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.sendto(b"x", (sys.argv[1], int(sys.argv[2]))); print(s.recv(512).decode().strip())
except OSError: pass
"#;

/// Seed 004's userspace mode on the netns pod network: the proxy binds no Service address;
/// Ferry's table in each node namespace sends ClusterIP and externalIP traffic to the proxy's
/// own ports (redirect for traffic arriving, DNAT to the node address for the node's own),
/// and the proxy picks a backend.
#[test]
fn userspace_portals_two_nodes() {
    if !usable("userspace") {
        return;
    }
    let c = Cluster::start_n("userspace", 2);
    assert!(
        eventually(60, || c
            .k(&["get", "nodes", "--no-headers"])
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
            .count()
            == 2),
        "two Ready nodes\n{}",
        tail(&c.log())
    );
    let m = [
        pod("w1", "kp-1", "app: web", ""),
        pod("w2", "kp-2", "app: web", ""),
        pod("u1", "kp-1", "app: udp", r#", "--udp=true""#),
        client("client", "kp-2"),
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-ext}
spec:
  type: NodePort
  externalIPs: [198.18.255.100]
  selector: {app: web}
  ports: [{port: 81, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: udp}
spec:
  selector: {app: udp}
  ports: [{port: 5353, targetPort: 8080, protocol: UDP}]
"#
        .to_string(),
    ];
    c.apply(&m.join("---\n"));
    c.wait_ready(&["w1", "w2", "u1", "client"]);
    let both: BTreeSet<String> = ["w1".to_string(), "w2".to_string()].into();
    let cips = c.jsonpath("svc", "web", "{.spec.clusterIPs[*]}");
    let cips: Vec<String> = cips.split_whitespace().map(str::to_string).collect();
    assert_eq!(cips.len(), 2, "dual-stack ClusterIPs: {cips:?}");
    for ip in &cips {
        for from in [From::Pod("client"), From::Node(1), From::Outside] {
            assert_eq!(
                c.backends(from, &url(ip, "80"), 10),
                both,
                "ClusterIP {ip} from {from:?}"
            );
        }
    }
    let np = c.jsonpath("svc", "web-ext", "{.spec.ports[0].nodePort}");
    for from in [From::Pod("client"), From::Node(2)] {
        assert_eq!(
            c.backends(from, &url("198.18.255.100", "81"), 10),
            both,
            "externalIP from {from:?}"
        );
        assert_eq!(
            c.backends(from, &url("198.18.0.11", &np), 10),
            both,
            "NodePort from {from:?}"
        );
    }
    let udp = c.jsonpath("svc", "udp", "{.spec.clusterIP}");
    for from in [From::Pod("client"), From::Node(1)] {
        assert!(
            eventually(30, || c
                .run(from, &["python3", "-c", UDP_ONCE, &udp, "5353"])
                .1
                == "u1"),
            "UDP ClusterIP from {from:?}\n{}",
            tail(&c.log())
        );
    }

    // The kernel does the redirecting: nothing listens on the Service addresses, Ferry's
    // table maps each of them to a port of the proxy, and that port is what answers.
    for i in 1..=2 {
        let (_, listening) = c.run(From::Node(i), &["ss", "-Hltnu"]);
        for ip in cips.iter().chain([&udp, &"198.18.255.100".to_string()]) {
            assert!(
                !listening.contains(&format!("{ip}:")) && !listening.contains(&format!("[{ip}]:")),
                "node {i} binds Service address {ip}:\n{listening}"
            );
        }
        let (ok, table) = c.run(From::Node(i), &["nft", "list", "table", "inet", "ferry"]);
        assert!(ok, "node {i}: no portal table");
        let line = table
            .lines()
            .find(|l| l.contains(&format!("{} . tcp . 80 : ", cips[0])))
            .unwrap_or_else(|| panic!("node {i}: no portal for {}:\n{table}", cips[0]));
        let port = line
            .rsplit(':')
            .next()
            .and_then(|p| {
                p.trim()
                    .trim_end_matches([',', '}'])
                    .trim()
                    .parse::<u16>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("portal port in {line:?}"));
        assert!(
            table.contains("redirect to :ip daddr . meta l4proto . th dport map @portals4"),
            "{table}"
        );
        let direct = c.get(From::Node(i), &format!("http://127.0.0.1:{port}/"));
        assert!(
            direct.as_ref().is_some_and(|b| both.contains(b)),
            "node {i}: the portal port {port} is the proxy: {direct:?}"
        );
    }
    drop(c);
}
