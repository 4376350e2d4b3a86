//! NetworkPolicy on `ferry up --nodes 3` in the style of upstream's NetworkPolicy e2e
//! (kubernetes test/e2e/network/netpol): namespaces x, y, z × pods a, b, c, spread over the
//! nodes, each pod serving ports 80 and 81 over TCP and UDP (SCTP where the kernel allows);
//! for each seed 004 policy and for combinations, the whole matrix is probed from inside the
//! pods and compared with an expected matrix written out in this file (by hand, per case: not
//! by the verdict function under test), printed as upstream's truth tables on a mismatch.
//! Also: the delay from an API write to new connections following it (printed, not asserted),
//! the Prometheus counters of the verdict log, and Service traffic judged after translation.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::eventually;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];
const PROTOS: [&str; 2] = ["TCP", "UDP"];
const NODE_BASE: &str = "nm";

/// One pod of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Peer {
    ns: &'static str,
    pod: &'static str,
}

impl Peer {
    fn is(&self, name: &str) -> bool {
        format!("{}/{}", self.ns, self.pod) == name
    }
    fn name(&self) -> String {
        format!("{}/{}", self.ns, self.pod)
    }
}

fn peers() -> Vec<Peer> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |pod| Peer { ns, pod }))
        .collect()
}

/// The node of a pod: every node holds one pod of each namespace and of each name.
fn node_of(p: Peer) -> String {
    let i = NAMESPACES.iter().position(|n| *n == p.ns).unwrap_or(0);
    let j = PODS.iter().position(|n| *n == p.pod).unwrap_or(0);
    format!("{NODE_BASE}-{}", (i + j) % 3 + 1)
}

fn manifests() -> String {
    let mut out = String::new();
    for ns in NAMESPACES {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: \"{ns}\", labels: {{ns: \"{ns}\"}}}}\n---\n"
        ));
    }
    for p in peers() {
        let containers: Vec<String> = PORTS
            .iter()
            .map(|port| {
                format!(
                    "  - name: cont-{port}\n    image: registry.k8s.io/serve_hostname\n    \
                     args: [\"--port={port}\", \"--tcp\", \"--udp\", \"--http=false\"]\n    \
                     ports:\n    - {{name: serve-{port}-tcp, containerPort: {port}, protocol: TCP}}\n    \
                     - {{name: serve-{port}-udp, containerPort: {port}, protocol: UDP}}\n"
                )
            })
            .collect();
        out.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: \"{pod}\", namespace: \"{ns}\", labels: {{pod: \"{pod}\"}}}}\n\
             spec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n{c}---\n",
            pod = p.pod,
            ns = p.ns,
            node = node_of(p),
            c = containers.concat()
        ));
    }
    // A Service in front of x/a (the policies see the pod after translation).
    out.push_str(
        "apiVersion: v1\nkind: Service\nmetadata: {name: s-a, namespace: x}\nspec:\n  \
         selector: {pod: a}\n  ports:\n  - {name: tcp-80, port: 8080, targetPort: 80, protocol: TCP}\n",
    );
    out
}

/// The probe every source pod runs: targets `IP:PORT/PROTO` (or `dns:NAME`), probed at once,
/// one `TARGET ok|fail` line each. Denied connections are rejected (they fail at once); the
/// timeouts bound the rest.
const PROBE: &str = r#"
import socket, sys, threading
res = {}
def tcp(ip, port):
    s = socket.socket(socket.AF_INET6 if ':' in ip else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect((ip, port))
        return len(s.recv(256)) > 0
    except OSError:
        return False
    finally:
        s.close()
def udp(ip, port):
    s = socket.socket(socket.AF_INET6 if ':' in ip else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    try:
        s.connect((ip, port))
        for _ in range(4):
            s.send(b"probe")
            try:
                if len(s.recv(256)) > 0:
                    return True
            except socket.timeout:
                continue
        return False
    except OSError:
        return False
    finally:
        s.close()
def dns(name):
    try:
        return len(socket.getaddrinfo(name, 80, socket.AF_INET)) > 0
    except OSError:
        return False
def run(t):
    if t.startswith('dns:'):
        res[t] = dns(t[4:])
        return
    hp, proto = t.rsplit('/', 1)
    ip, port = hp.rsplit(':', 1)
    res[t] = (tcp if proto == 'TCP' else udp)(ip, int(port))
ts = [threading.Thread(target=run, args=(t,)) for t in sys.argv[1:]]
for t in ts: t.start()
for t in ts: t.join()
for t in sys.argv[1:]:
    print(t, 'ok' if res.get(t) else 'fail')
"#;

/// Connects to `IP PORT` every 20 ms until the outcome flips from WANT's opposite to WANT
/// (`deny`: first failed connection; `allow`: first answered one); prints `ready` once the
/// starting state is seen, then the wall-clock time the first flipped attempt began (its SYN
/// was judged then, whatever its outcome took to show).
const FLIP: &str = r#"
import socket, sys, time
ip, port, want = sys.argv[1], int(sys.argv[2]), sys.argv[3]
trace = []
# Denied connections are rejected with ICMP errors, which the kernel rate-limits per peer (a
# burst of 6, then 1/s): past the burst a denied SYN is simply lost. Waiting for an allow, a
# short timeout keeps such losses from delaying the next attempt by a whole second.
timeout = 1.0 if want == 'deny' else 0.1
began = 0.0
def ok():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    global began
    s.settimeout(timeout)
    t = began = time.time()
    r = 'ok'
    try:
        s.connect((ip, port))
        r = 'connected'
        return len(s.recv(64)) > 0
    except OSError as e:
        r = r + ' ' + repr(e)
        return False
    finally:
        s.close()
        trace.append('%.3f+%.3f %s' % (t % 100, time.time() - t, r))
start = (want == 'deny')
end = time.time() + 30
while ok() != start and time.time() < end:
    time.sleep(0.05)
print('ready', flush=True)
n = 0
while time.time() < end:
    n += 1
    if ok() != start:
        print('flip %.6f %d %s' % (began, n, ' | '.join(trace[-8:])), flush=True)
        sys.exit(0)
    time.sleep(0.02)
print('timeout', flush=True)
"#;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The real python3 binary (pods run with the pod's environment, not the test's PATH shims).
fn python() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !p.is_empty()).then_some(p)
}

/// Why SCTP is not probed, when it is not.
fn sctp_skip_reason() -> Option<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)",
        ])
        .output()
        .ok()?;
    if out.status.success() {
        // The kernel has SCTP sockets, but the built-in serve_hostname image has no SCTP
        // server to answer probes.
        Some("the built-in serve_hostname image serves TCP and UDP only".into())
    } else {
        Some(format!(
            "this kernel has no SCTP sockets ({})",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .trim()
        ))
    }
}

/// `ferry up --pod-network netns --nodes 3`, stopped (SIGTERM, namespaces removed) on drop.
struct Up {
    child: Child,
    dir: tempfile::TempDir,
}

impl Up {
    fn start(extra: &[&str]) -> Up {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("ferry.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["up", "--data-dir"])
            .arg(dir.path())
            .args(["--pod-network", "netns", "--nodes", "3"])
            .args(["--node-name", NODE_BASE])
            .args(["--listen-api", "127.0.0.1:0", "--agent-port", "0"])
            .args(["--dns-metrics-listen", "127.0.0.1:0"])
            .args(["--netpol-metrics-listen", "127.0.0.1:0"])
            .args(["--proxy-healthz-listen", "off"])
            .args(["--ingress-http-addr", "off", "--ingress-https-addr", "off"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ferry up");
        Up { child, dir }
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ferry.log")).unwrap_or_default()
    }
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(mut i) = c.stdin.take() {
            let _ = i.write_all(stdin.unwrap_or("").as_bytes());
        }
        c.wait_with_output().expect("kubectl")
    }
    fn apply(&self, yaml: &str) {
        let out = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fn delete_policies(&self) {
        let out = self.kubectl(
            &[
                "delete",
                "networkpolicies",
                "--all",
                "--all-namespaces",
                "--wait=false",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fn get(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.kubectl(args, None).stdout)
            .trim()
            .to_string()
    }
    fn metrics_url(&self) -> Option<String> {
        self.log().lines().find_map(|l| {
            l.strip_prefix("ferry up: NetworkPolicy metrics on ")
                .map(|u| u.trim().to_string())
        })
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A probe's key: destination, port, protocol, IPv6 (else IPv4).
type Probe = (Peer, u16, &'static str, bool);
/// Observed or expected reachability: (from, to, port, proto, IPv6) -> reachable.
type Matrix = BTreeMap<(Peer, Peer, u16, &'static str, bool), bool>;

struct World {
    python: String,
    ips: BTreeMap<Peer, Ipv4Addr>,
    ips6: BTreeMap<Peer, Ipv6Addr>,
}

impl World {
    fn target(&self, to: Peer, port: u16, proto: &str, v6: bool) -> String {
        if v6 {
            format!("{}:{port}/{proto}", self.ips6[&to])
        } else {
            format!("{}:{port}/{proto}", self.ips[&to])
        }
    }

    /// Runs the probe script in `from` for `targets`; returns each target's outcome.
    fn probe(&self, up: &Up, from: Peer, targets: &[String]) -> BTreeMap<String, bool> {
        let mut args = vec![
            "exec",
            "-n",
            from.ns,
            from.pod,
            "-c",
            "cont-80",
            "--",
            &self.python,
            "-c",
            PROBE,
        ];
        args.extend(targets.iter().map(|s| s.as_str()));
        let out = up.kubectl(&args, None);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| {
                let (t, r) = l.rsplit_once(' ')?;
                Some((t.to_string(), r == "ok"))
            })
            .collect()
    }

    /// Probes `probes` from every pod at once (one exec per source pod).
    fn probe_matrix(&self, up: &Up, probes: &[(Peer, Probe)]) -> Matrix {
        let mut by_source: BTreeMap<Peer, Vec<Probe>> = BTreeMap::new();
        for (from, p) in probes {
            by_source.entry(*from).or_default().push(*p);
        }
        let mut m = Matrix::new();
        std::thread::scope(|s| {
            let handles: Vec<_> = by_source
                .iter()
                .map(|(from, ps)| {
                    let targets: Vec<String> = ps
                        .iter()
                        .map(|(to, port, proto, v6)| self.target(*to, *port, proto, *v6))
                        .collect();
                    let h = s.spawn(move || self.probe(up, *from, &targets));
                    (*from, ps.clone(), h)
                })
                .collect();
            for (from, ps, h) in handles {
                let got = h.join().unwrap_or_default();
                for (to, port, proto, v6) in ps {
                    let t = self.target(to, port, proto, v6);
                    m.insert(
                        (from, to, port, proto, v6),
                        got.get(&t).copied().unwrap_or(false),
                    );
                }
            }
        });
        m
    }
}

/// Upstream's truth table: a header of destinations, one row per source; `.` true, `X` false.
fn truth_table(title: &str, cell: impl Fn(Peer, Peer) -> bool) -> String {
    let all = peers();
    let mut out = format!("{title}\n-");
    for to in &all {
        out.push_str(&format!("\t{}", to.name()));
    }
    out.push('\n');
    for from in &all {
        out.push_str(&from.name());
        for to in &all {
            out.push_str(if cell(*from, *to) { "\t." } else { "\tX" });
        }
        out.push('\n');
    }
    out
}

/// Expected reachability of one case: (from, to, port, proto, IPv6) -> allowed. A pod always
/// reaches itself (upstream's AllowLoopback) — applied by the caller.
type Expect<'a> = Box<dyn Fn(Peer, Peer, u16, &str, bool) -> bool + 'a>;

struct Case<'a> {
    name: &'static str,
    policies: String,
    expect: Expect<'a>,
}

/// What is probed between each pair: both ports and protocols over IPv4, port 80 over IPv6.
fn kinds() -> Vec<(u16, &'static str, bool)> {
    let mut k = Vec::new();
    for port in PORTS {
        for proto in PROTOS {
            k.push((port, proto, false));
        }
    }
    for proto in PROTOS {
        k.push((PORTS[0], proto, true));
    }
    k
}

fn family(v6: bool) -> &'static str {
    if v6 { "IPv6" } else { "IPv4" }
}

fn all_probes() -> Vec<(Peer, Probe)> {
    let mut v = Vec::new();
    for from in peers() {
        for to in peers() {
            for (port, proto, v6) in kinds() {
                v.push((from, (to, port, proto, v6)));
            }
        }
    }
    v
}

/// Probes until the observed matrix matches the expectation (as upstream, which retries a
/// mismatching probe: enforcement follows the API write after a short delay); only the
/// mismatching cells are probed again. Returns the mismatches left and the tries.
fn check(up: &Up, w: &World, case: &Case) -> (Vec<String>, usize) {
    let expected = |from: Peer, to: Peer, port: u16, proto: &str, v6: bool| {
        from == to || (case.expect)(from, to, port, proto, v6)
    };
    let mut todo = all_probes();
    let mut observed = Matrix::new();
    let mut tries = 0;
    while tries < 8 && !todo.is_empty() {
        tries += 1;
        let got = w.probe_matrix(up, &todo);
        observed.extend(got.iter().map(|(k, v)| (*k, *v)));
        todo.retain(|(from, (to, port, proto, v6))| {
            observed[&(*from, *to, *port, *proto, *v6)] != expected(*from, *to, *port, proto, *v6)
        });
        if !todo.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let mut report = Vec::new();
    for (port, proto, v6) in kinds() {
        let seen = |f: Peer, t: Peer| observed.get(&(f, t, port, proto, v6)).copied();
        let differs = peers().iter().any(|f| {
            peers()
                .iter()
                .any(|t| seen(*f, *t) != Some(expected(*f, *t, port, proto, v6)))
        });
        if differs {
            let what = format!("{port}/{proto} {}", family(v6));
            report.push(format!(
                "{}{}{}",
                truth_table(&format!("expected {what}:"), |f, t| expected(
                    f, t, port, proto, v6
                )),
                truth_table(&format!("observed {what}:"), |f, t| seen(f, t)
                    .unwrap_or(false)),
                truth_table(&format!("comparison {what} (X: differs):"), |f, t| seen(
                    f, t
                )
                    == Some(expected(f, t, port, proto, v6))),
            ));
        }
    }
    (report, tries)
}

fn in_cidr(ip: Ipv4Addr, cidr: &str) -> bool {
    let Some((base, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(base), Ok(len)) = (base.parse::<Ipv4Addr>(), len.parse::<u32>()) else {
        return false;
    };
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(ip) & mask == u32::from(base) & mask
}

fn policy(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: \"{name}\", namespace: \"{ns}\"}}\nspec:\n{spec}\n---\n"
    )
}

/// The seed 004 policies, as printed there, in namespace `ns`.
fn seed(ns: &str, name: &str) -> String {
    let spec = match name {
        "default-deny-ingress" => "  podSelector: {}\n  policyTypes:\n  - Ingress",
        "allow-all-ingress" => "  podSelector: {}\n  ingress:\n  - {}\n  policyTypes:\n  - Ingress",
        "default-deny-egress" => "  podSelector: {}\n  policyTypes:\n  - Egress",
        "allow-all-egress" => "  podSelector: {}\n  egress:\n  - {}\n  policyTypes:\n  - Egress",
        "default-deny-all" => "  podSelector: {}\n  policyTypes:\n  - Ingress\n  - Egress",
        _ => panic!("no seed policy {name}"),
    };
    policy(ns, name, spec)
}

#[test]
fn netpol_matrix_on_three_nodes() {
    if !is_root()
        || !["ip", "nft", "nsenter", "kubectl", "python3"]
            .iter()
            .all(|c| have(c))
    {
        eprintln!("skipping: needs root, ip, nft, nsenter, kubectl and python3");
        return;
    }
    let Some(python) = python() else {
        eprintln!("skipping: python3 does not say where it is");
        return;
    };
    if let Some(why) = sctp_skip_reason() {
        println!("SCTP not probed: {why} (SCTP rules are rendered and tested at the rule level)");
    }
    let up = Up::start(&[]);
    assert!(
        eventually(60, || up.dir.path().join("kubeconfig").exists()),
        "{}",
        up.log()
    );
    assert!(
        eventually(60, || up
            .get(&["get", "nodes", "--no-headers"])
            .matches(" Ready")
            .count()
            == 3),
        "{}",
        up.log()
    );
    up.apply(&manifests());
    assert!(
        eventually(120, || up
            .get(&["get", "pods", "-A", "--no-headers", "-l", "pod"])
            .matches("Running")
            .count()
            == 9),
        "{}\n{}",
        up.get(&["get", "pods", "-A", "-o", "wide"]),
        up.log()
    );
    let mut ips = BTreeMap::new();
    let mut ips6 = BTreeMap::new();
    for p in peers() {
        let all = up.get(&[
            "get",
            "pod",
            "-n",
            p.ns,
            p.pod,
            "-o",
            "jsonpath={.status.podIPs[*].ip}",
        ]);
        let v4 = all
            .split_whitespace()
            .find_map(|a| a.parse::<Ipv4Addr>().ok());
        let v6 = all
            .split_whitespace()
            .find_map(|a| a.parse::<Ipv6Addr>().ok());
        ips.insert(
            p,
            v4.unwrap_or_else(|| panic!("{p:?} has no IPv4 address: {all:?}")),
        );
        ips6.insert(
            p,
            v6.unwrap_or_else(|| panic!("{p:?} has no IPv6 address: {all:?}")),
        );
    }
    let pod_cidr_of = |node: &str| up.get(&["get", "node", node, "-o", "jsonpath={.spec.podCIDR}"]);
    let w = World { python, ips, ips6 };
    let ip = |name: &str| {
        peers()
            .into_iter()
            .find(|p| p.is(name))
            .map(|p| w.ips[&p])
            .expect("pod")
    };
    let x_a = ip("x/a");
    let y_b = ip("y/b");
    let z_a = ip("z/a");
    // The pod CIDR of the node of y/a: the seed's `except` carves it out of the pod network.
    let node_ya = node_of(Peer { ns: "y", pod: "a" });
    let carved = pod_cidr_of(&node_ya);
    assert!(carved.contains('/'), "pod CIDR of {node_ya}: {carved:?}");
    let pod_net = format!("{}/16", {
        let o = x_a.octets();
        Ipv4Addr::new(o[0], o[1], 0, 0)
    });

    let cases: Vec<Case> = vec![
        Case {
            name: "no policies: everything reaches everything",
            policies: String::new(),
            expect: Box::new(|_, _, _, _, _v6| true),
        },
        Case {
            name: "seed default-deny-ingress in x",
            policies: seed("x", "default-deny-ingress"),
            expect: Box::new(|_, to, _, _, _v6| to.ns != "x"),
        },
        Case {
            name: "seed allow-all-ingress with default-deny-ingress in x (union)",
            policies: seed("x", "default-deny-ingress") + &seed("x", "allow-all-ingress"),
            expect: Box::new(|_, _, _, _, _v6| true),
        },
        Case {
            name: "seed default-deny-egress in x",
            policies: seed("x", "default-deny-egress"),
            expect: Box::new(|from, _, _, _, _v6| from.ns != "x"),
        },
        Case {
            name: "seed allow-all-egress with default-deny-egress in x",
            policies: seed("x", "default-deny-egress") + &seed("x", "allow-all-egress"),
            expect: Box::new(|_, _, _, _, _v6| true),
        },
        Case {
            name: "seed default-deny-all in x",
            policies: seed("x", "default-deny-all"),
            expect: Box::new(|from, to, _, _, _v6| from.ns != "x" && to.ns != "x"),
        },
        Case {
            name: "podSelector: x/a only from pods b of its namespace",
            policies: policy(
                "x",
                "allow-x-b",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}",
            ),
            expect: Box::new(|from, to, _, _, _v6| !to.is("x/a") || from.is("x/b")),
        },
        Case {
            name: "namespaceSelector: x/a only from namespace y",
            policies: policy(
                "x",
                "allow-ns-y",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {ns: \"y\"}}",
            ),
            expect: Box::new(|from, to, _, _, _v6| !to.is("x/a") || from.ns == "y"),
        },
        Case {
            name: "namespaceSelector matchExpressions NotIn [x]: x/a from the other namespaces",
            policies: policy(
                "x",
                "allow-not-x",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [\"x\"]}]}",
            ),
            expect: Box::new(|from, to, _, _, _v6| !to.is("x/a") || from.ns != "x"),
        },
        Case {
            name: "podSelector AND namespaceSelector (one peer): x/a from pods b of y and z",
            policies: policy(
                "x",
                "allow-b-of-yz",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: [\"y\", \"z\"]}]}\n      podSelector: {matchLabels: {pod: b}}",
            ),
            expect: Box::new(|from, to, _, _, _v6| {
                !to.is("x/a") || (from.pod == "b" && (from.ns == "y" || from.ns == "z"))
            }),
        },
        Case {
            name: "podSelector OR namespaceSelector (two peers) and a second policy (union): x/a from y, x/c, z/c",
            policies: policy(
                "x",
                "allow-y-or-c",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {ns: \"y\"}}\n    - podSelector: {matchLabels: {pod: c}}",
            ) + &policy(
                "x",
                "allow-z-c",
                "  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - namespaceSelector: {matchLabels: {ns: \"z\"}}\n      podSelector: {matchLabels: {pod: c}}",
            ),
            expect: Box::new(|from, to, _, _, _v6| {
                !to.is("x/a") || from.ns == "y" || from.is("x/c") || from.is("z/c")
            }),
        },
        Case {
            name: "named ports: x/a from everywhere on serve-81-tcp and serve-80-udp/UDP (serve-81-udp as TCP matches nothing)",
            policies: policy(
                "x",
                "allow-named",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - namespaceSelector: {}\n    ports:\n    - port: serve-81-tcp\n    - {port: serve-80-udp, protocol: UDP}\n    - port: serve-81-udp",
            ),
            expect: Box::new(|_, to, port, proto, _v6| {
                !to.is("x/a") || (port == 81 && proto == "TCP") || (port == 80 && proto == "UDP")
            }),
        },
        Case {
            name: "endPort: x/a ingress TCP 79-80; x/b egress TCP 81-90 and UDP 80-80",
            policies: policy(
                "x",
                "ingress-range",
                "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - ports:\n    - {protocol: TCP, port: 79, endPort: 80}",
            ) + &policy(
                "x",
                "egress-range",
                "  podSelector: {matchLabels: {pod: b}}\n  policyTypes: [Egress]\n  egress:\n  - ports:\n    - {protocol: TCP, port: 81, endPort: 90}\n    - {protocol: UDP, port: 80, endPort: 80}",
            ),
            expect: Box::new(|from, to, port, proto, _v6| {
                (!to.is("x/a") || (port == 80 && proto == "TCP"))
                    && (!from.is("x/b")
                        || (port == 81 && proto == "TCP")
                        || (port == 80 && proto == "UDP"))
            }),
        },
        Case {
            name: "ipBlock with except: x/a egress to the pod network except y/b; x/c ingress from z/a's /32",
            policies: policy(
                "x",
                "egress-except",
                &format!(
                    "  podSelector: {{matchLabels: {{pod: a}}}}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    - ipBlock: {{cidr: {pod_net}, except: [{y_b}/32]}}"
                ),
            ) + &policy(
                "x",
                "ingress-cidr",
                &format!(
                    "  podSelector: {{matchLabels: {{pod: c}}}}\n  ingress:\n  - from:\n    - ipBlock: {{cidr: {z_a}/32}}"
                ),
            ),
            // The blocks are IPv4: over IPv6, x/a reaches nothing and x/c admits nobody.
            expect: Box::new(|from, to, _, _, v6| {
                (!from.is("x/a") || (!v6 && !to.is("y/b")))
                    && (!to.is("x/c") || (!v6 && from.is("z/a")))
            }),
        },
        Case {
            name: "seed test-network-policy shape on x/a: ingress from ipBlock-except | ns z | pod b on TCP 80; egress to the pod network on TCP 81",
            policies: policy(
                "x",
                "test-network-policy",
                &format!(
                    "  podSelector: {{matchLabels: {{pod: a}}}}\n  policyTypes:\n  - Ingress\n  - Egress\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: {pod_net}\n        except:\n        - {carved}\n    - namespaceSelector:\n        matchLabels: {{ns: \"z\"}}\n    - podSelector:\n        matchLabels: {{pod: b}}\n    ports:\n    - protocol: TCP\n      port: 80\n  egress:\n  - to:\n    - ipBlock:\n        cidr: {pod_net}\n    ports:\n    - protocol: TCP\n      port: 81"
                ),
            ),
            expect: Box::new(|from, to, port, proto, v6| {
                let in_block = !v6 && !in_cidr(w.ips[&from], &carved);
                let ingress_ok = !to.is("x/a")
                    || (port == 80
                        && proto == "TCP"
                        && (in_block || from.ns == "z" || from.is("x/b")));
                let egress_ok = !from.is("x/a") || (!v6 && port == 81 && proto == "TCP");
                ingress_ok && egress_ok
            }),
        },
        Case {
            name: "egress with DNS allowed: default-deny-egress in x plus UDP/TCP 53 to anywhere",
            policies: seed("x", "default-deny-egress")
                + &policy(
                    "x",
                    "allow-dns",
                    "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - ports:\n    - {protocol: UDP, port: 53}\n    - {protocol: TCP, port: 53}",
                ),
            expect: Box::new(|from, _, _, _, _v6| from.ns != "x"),
        },
    ];

    let mut failures = Vec::new();
    for case in &cases {
        up.delete_policies();
        if !case.policies.is_empty() {
            up.apply(&case.policies);
        }
        let t = Instant::now();
        let (report, tries) = check(&up, &w, case);
        println!(
            "case {:?}: {} after {tries} probe round(s), {:.1} s",
            case.name,
            if report.is_empty() {
                "matches"
            } else {
                "DIFFERS"
            },
            t.elapsed().as_secs_f64()
        );
        if !report.is_empty() {
            println!("{}", report.join("\n"));
            failures.push(case.name);
        }
        if case.name.starts_with("egress with DNS allowed") {
            // Cluster DNS answers x/a through the allowed port 53.
            let from = Peer { ns: "x", pod: "a" };
            let name = "dns:kubernetes.default.svc.cluster.local".to_string();
            assert!(
                eventually(60, || w
                    .probe(&up, from, std::slice::from_ref(&name))
                    .get(&name)
                    .copied()
                    .unwrap_or(false)),
                "x/a cannot resolve a name with DNS allowed"
            );
        }
    }
    assert!(failures.is_empty(), "cases that differ: {failures:?}");

    // Service traffic is judged after translation: x/a admits x/b only, so x/b reaches the
    // Service s-a (ClusterIP 8080 -> pod 80) and x/c does not; without a policy both do.
    up.delete_policies();
    let svc_ip = up.get(&[
        "get",
        "svc",
        "-n",
        "x",
        "s-a",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let svc = format!("{svc_ip}:8080/TCP");
    let via_service = |from: &str| {
        let p = peers().into_iter().find(|p| p.is(from)).expect("peer");
        w.probe(&up, p, std::slice::from_ref(&svc))
            .get(&svc)
            .copied()
            .unwrap_or(false)
    };
    assert!(
        eventually(30, || via_service("x/b") && via_service("x/c")),
        "the Service {svc} does not answer without policies: {}",
        up.log()
    );
    up.apply(&policy(
        "x",
        "allow-x-b",
        "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}",
    ));
    assert!(
        eventually(60, || !via_service("x/c")),
        "x/c still reaches x/a through its Service"
    );
    assert!(
        eventually(60, || via_service("x/b")),
        "x/b no longer reaches x/a through its Service"
    );
    println!("Service traffic after translation: x/b -> s-a allowed, x/c -> s-a denied");

    // Policy changes take effect for new connections within ~1 s of the API write: x/c
    // connects to x/a every 20 ms while a policy denying it is created, then deleted.
    up.delete_policies();
    let x_c = Peer { ns: "x", pod: "c" };
    let deny_c = policy(
        "x",
        "only-b",
        "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}",
    );
    let mut latencies = Vec::new();
    let rounds = [("deny", "create"), ("allow", "delete")].repeat(3);
    for (want, change) in rounds {
        let mut child = Command::new("kubectl")
            .args([
                "exec", "-n", "x", "c", "-c", "cont-80", "--", &w.python, "-c", FLIP,
            ])
            .arg(x_a.to_string())
            .args(["80", want])
            .env("KUBECONFIG", up.dir.path().join("kubeconfig"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl exec");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = lines.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(ready, "ready", "the flip probe did not start from {x_c:?}");
        let t0 = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let t = Instant::now();
        if change == "create" {
            up.apply(&deny_c);
        } else {
            up.delete_policies();
        }
        let api = t.elapsed().as_secs_f64();
        let flip = lines.next().and_then(|l| l.ok()).unwrap_or_default();
        let _ = child.wait();
        let at: f64 = flip
            .strip_prefix("flip ")
            .and_then(|v| v.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no flip after the policy {change}: {flip:?}"));
        // The flipped attempt may have begun just before the kubectl call returned.
        let ms = ((at - t0) * 1000.0).max(0.0);
        println!(
            "policy {change}d -> new connections {} after {ms:.0} ms (the kubectl call itself took {:.0} ms)",
            if want == "deny" { "denied" } else { "allowed" },
            api * 1000.0
        );
        if std::env::var_os("FERRY_TEST_NETPOL_DEBUG").is_some() {
            println!("flip probe: {flip}");
            for l in up.log().lines().filter(|l| l.contains("netpol sync")) {
                println!("{l}");
            }
        }
        latencies.push(ms);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    println!(
        "API write to enforcement (kubectl start to the first new connection following it), {} changes: min {:.0} ms, median {:.0} ms, max {:.0} ms",
        latencies.len(),
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );

    // The verdict log as Prometheus counters: x/a's ingress denials on its node, the allow
    // rule that admitted x/b, and the sync loop.
    up.apply(&deny_c);
    let from_c = w.probe(
        &up,
        x_c,
        &[w.target(Peer { ns: "x", pod: "a" }, 80, "TCP", false)],
    );
    assert!(
        eventually(60, || {
            let r = w.probe(
                &up,
                x_c,
                &[w.target(Peer { ns: "x", pod: "a" }, 80, "TCP", false)],
            );
            r.values().all(|ok| !ok)
        }),
        "x/c still reaches x/a: {from_c:?}"
    );
    let _ = w.probe(
        &up,
        Peer { ns: "x", pod: "b" },
        &[w.target(Peer { ns: "x", pod: "a" }, 80, "TCP", false)],
    );
    let url = up
        .metrics_url()
        .expect("ferry up prints the netpol metrics address");
    let node_xa = node_of(Peer { ns: "x", pod: "a" });
    let scrape = || {
        let out = Command::new("curl")
            .args(["-s", "-m", "10", &url])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let value = |text: &str, prefix: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let denied = format!(
        "ferry_netpol_denied_packets_total{{node=\"{node_xa}\",direction=\"ingress\",pod=\"x/a\"}}"
    );
    let allowed = format!(
        "ferry_netpol_allowed_packets_total{{node=\"{node_xa}\",direction=\"ingress\",policy=\"x/only-b\",rule=\"ingress[0]\"}}"
    );
    let mut text = String::new();
    assert!(
        eventually(60, || {
            text = scrape();
            value(&text, &denied) > 0 && value(&text, &allowed) > 0
        }),
        "{text}"
    );
    for n in 1..=3 {
        let syncs = format!("ferry_netpol_syncs_total{{node=\"{NODE_BASE}-{n}\",result=\"ok\"}}");
        assert!(value(&text, &syncs) > 0, "{syncs}: {text}");
    }
    assert!(
        text.contains("ferry_netpol_sync_programming_latency_seconds_bucket"),
        "{text}"
    );
    println!(
        "metrics: {denied} {}; {allowed} {}",
        value(&text, &denied),
        value(&text, &allowed)
    );
    let (sum, count) = (1..=3).fold((0.0, 0u64), |(s, c), n| {
        let l = format!("{{node=\"{NODE_BASE}-{n}\"}}");
        let sum: f64 = text
            .lines()
            .find(|x| {
                x.starts_with(&format!(
                    "ferry_netpol_sync_programming_latency_seconds_sum{l}"
                ))
            })
            .and_then(|x| x.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let count = value(
            &text,
            &format!("ferry_netpol_sync_programming_latency_seconds_count{l}"),
        );
        (s + sum, c + count)
    });
    assert!(count > 0, "{text}");
    println!(
        "agent programming latency (watch event recorded -> kernel), mean of {count} syncs: {:.1} ms",
        sum / count as f64 * 1000.0
    );
    let health = Command::new("curl")
        .args(["-s", "-m", "10", &url.replace("/metrics", "/healthz")])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&health.stdout), "ok");
}
