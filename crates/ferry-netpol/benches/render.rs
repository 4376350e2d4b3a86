//! NetworkPolicy benchmark (not a test): 1,000 pods × 200 policies, all pods on one node (the
//! worst case for a node's table).
//!
//! Prints: render time, table size, `nft -f` time to load it in a throwaway network namespace
//! (the time from "all applied in the API" to "enforcing" is render + load), the diff of
//! typical changes (a pod relabelled, a pod added, a policy added) and their apply time, and
//! the per-connection cost of first packets through the table against no table, as a ratio.
//! The kernel parts need root, `ip`, `nft`, `nsenter` and `python3` (skipped otherwise).
//!
//!   nice -n 19 cargo bench -p ferry-netpol --bench render [-- CONNECTIONS]

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_netpol::apply::{Applier, Target};
use ferry_netpol::fixtures::policy;
use ferry_netpol::model::{Model, NamedPort, PodInfo, PodKey, Proto};
use ferry_netpol::render::{RenderOptions, render};
use ferry_netpol::ruleset::{diff, full_script};
use serde_json::json;

const NAMESPACES: usize = 10;
const PODS_PER_NS: usize = 100;
const POLICIES_PER_NS: usize = 20;
const A: &str = "198.18.200.2";
const B: &str = "198.18.201.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

fn model() -> Model {
    let mut m = Model::default();
    m.nodes
        .insert("n0".into(), vec![ip("198.18.200.1"), ip("198.18.201.1")]);
    for n in 0..NAMESPACES {
        let ns = format!("ns{n}");
        m.put_namespace(&ns, [("team".to_string(), format!("t{}", n % 3))].into());
        for i in 0..PODS_PER_NS {
            let addr = match (n, i) {
                (0, 0) => ip(A),
                (0, 1) => ip(B),
                _ => IpAddr::V4(Ipv4Addr::new(
                    10,
                    n as u8,
                    (i / 200) as u8,
                    (i % 200 + 1) as u8,
                )),
            };
            m.pods.insert(
                PodKey::new(ns.clone(), format!("p{i}")),
                PodInfo {
                    labels: [
                        ("app".to_string(), format!("app{}", i % 20)),
                        ("tier".to_string(), format!("{}", i % 3)),
                    ]
                    .into(),
                    ips: vec![addr],
                    node: Some("n0".into()),
                    host_network: false,
                    ports: vec![NamedPort {
                        name: "http".into(),
                        port: 80,
                        proto: Proto::Tcp,
                    }],
                },
            );
        }
    }
    for n in 0..NAMESPACES {
        let ns = format!("ns{n}");
        for k in 0..POLICIES_PER_NS {
            let sel = json!({"matchLabels": {"app": format!("app{k}")}});
            let spec = match k % 5 {
                0 => {
                    json!({"podSelector": sel, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("app{}", (k + 1) % 20)}}}], "ports": [{"port": 80}]}]})
                }
                1 => {
                    json!({"podSelector": sel, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", k % 3)}}, "podSelector": {"matchLabels": {"tier": "1"}}}], "ports": [{"port": "http"}]}]})
                }
                2 => {
                    json!({"podSelector": sel, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [format!("10.{n}.0.0/24")]}}], "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}]})
                }
                3 => {
                    json!({"podSelector": sel, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": 8000, "endPort": 9000}, {"protocol": "SCTP"}]}]})
                }
                _ => {
                    json!({"podSelector": sel, "policyTypes": ["Ingress", "Egress"], "ingress": [{"from": [{"podSelector": {}}]}], "egress": [{"to": [{"podSelector": {"matchLabels": {"tier": "2"}}}, {"namespaceSelector": {"matchLabels": {"team": "t0"}}}]}]})
                }
            };
            let p = policy(
                json!({"metadata": {"name": format!("np{k}"), "namespace": ns}, "spec": spec}),
            );
            if let Ok(p) = p {
                m.policies.insert(p.key(), p);
            }
        }
    }
    m
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .status()
        .is_ok_and(|s| s.success())
}

struct Lab {
    names: [String; 3],
    children: Vec<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

const SERVER: &str = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 80)); s.listen(1024)
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.close()
"#;

const CLIENT: &str = r#"
import socket, sys, time
n = int(sys.argv[1]); host = sys.argv[2]
best = []
for rnd in range(3):
    t = time.perf_counter()
    for _ in range(n):
        s = socket.socket(); s.connect((host, 80)); s.close()
    best.append((time.perf_counter() - t) / n)
print(min(best) * 1e6)
"#;

fn lab() -> Option<Lab> {
    let id = std::process::id();
    let lab = Lab {
        names: [
            format!("fnb{id}n"),
            format!("fnb{id}a"),
            format!("fnb{id}b"),
        ],
        children: Vec::new(),
    };
    let [node, a, b] = &lab.names;
    for n in &lab.names {
        if !sh(&["ip", "netns", "add", n]) {
            return None;
        }
    }
    let ex = |ns: &str, args: &[&str]| {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(args);
        sh(&v)
    };
    for (pod, hif, hip, pip) in [(a, "va", "198.18.200.1", A), (b, "vb", "198.18.201.1", B)] {
        let ok = sh(&[
            "ip", "-n", node, "link", "add", hif, "type", "veth", "peer", "name", "eth0", "netns",
            pod,
        ]) && ex(
            node,
            &["ip", "addr", "add", &format!("{hip}/24"), "dev", hif],
        ) && ex(node, &["ip", "link", "set", hif, "up"])
            && ex(
                pod,
                &["ip", "addr", "add", &format!("{pip}/24"), "dev", "eth0"],
            )
            && ex(pod, &["ip", "link", "set", "eth0", "up"])
            && ex(pod, &["ip", "link", "set", "lo", "up"])
            && ex(pod, &["ip", "route", "add", "default", "via", hip]);
        if !ok {
            return None;
        }
    }
    ex(node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]).then_some(lab)
}

fn connect_cost(lab: &Lab, n: usize) -> Option<f64> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.names[1],
            "python3",
            "-c",
            CLIENT,
            &n.to_string(),
            B,
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn main() {
    let conns: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    let m = model();
    let opts = RenderOptions::default();
    let times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            let _ = render(&m, "n0", &opts);
            t.elapsed()
        })
        .collect();
    let render_time = median(times.clone());
    let table = render(&m, "n0", &opts);
    let script = full_script(&table);
    let elements: usize = table.sets.values().map(|s| s.elements.len()).sum();
    let rules: usize = table.chains.values().map(|c| c.rules.len()).sum();
    println!(
        "model: {} pods, {} policies, all on node n0",
        m.pods.len(),
        m.policies.len()
    );
    println!(
        "render: {:.1} ms (median of 5); table: {} chains, {} rules, {} sets/maps, {} elements, script {} KiB / {} lines",
        median(times).as_secs_f64() * 1e3,
        table.chains.len(),
        rules,
        table.sets.len(),
        elements,
        script.len() / 1024,
        script.lines().count()
    );
    // Typical changes.
    let mut relabel = m.clone();
    if let Some(p) = relabel.pods.get_mut(&PodKey::new("ns3", "p7")) {
        p.labels.insert("app".into(), "app1".into());
    }
    let mut add_pod = m.clone();
    add_pod.pods.insert(
        PodKey::new("ns4", "new"),
        PodInfo {
            labels: [
                ("app".to_string(), "app0".to_string()),
                ("tier".to_string(), "1".to_string()),
            ]
            .into(),
            ips: vec![ip("10.4.9.9")],
            node: Some("n0".into()),
            host_network: false,
            ports: Vec::new(),
        },
    );
    let mut add_policy = m.clone();
    if let Ok(p) = policy(
        json!({"metadata": {"name": "extra", "namespace": "ns5"}, "spec": {"podSelector": {"matchLabels": {"tier": "0"}},
        "ingress": [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]}}),
    ) {
        add_policy.policies.insert(p.key(), p);
    }
    let changes = [
        ("pod relabelled", &relabel),
        ("pod added", &add_pod),
        ("policy added (34 pods)", &add_policy),
    ];
    for (what, after) in changes {
        let t = Instant::now();
        let new = render(after, "n0", &opts);
        let (d, st) = diff(Some(&table), &new);
        println!(
            "{what}: render+diff {:.1} ms, {} objects touched ({} elements +{} -{}, {} chains rewritten, {} rules), batch {} lines",
            t.elapsed().as_secs_f64() * 1e3,
            st.size(),
            st.elements_added + st.elements_removed,
            st.elements_added,
            st.elements_removed,
            st.chains_rewritten,
            st.rules_written,
            d.lines().count()
        );
    }

    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root || !["ip", "nft", "nsenter", "python3"].iter().all(|c| have(c)) {
        println!("kernel part skipped (needs root, ip, nft, nsenter, python3)");
        return;
    }
    let Some(mut lab) = lab() else {
        println!("kernel part skipped: could not build the namespaces");
        return;
    };
    let server = Command::new("ip")
        .args(["netns", "exec", &lab.names[2], "python3", "-c", SERVER])
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut server) = server else { return };
    if let Some(out) = server.stdout.take() {
        let mut l = String::new();
        let _ = BufReader::new(out).read_line(&mut l);
    }
    lab.children.push(server);
    let mut applier = Applier::new(Target {
        netns: Some(PathBuf::from(format!("/run/netns/{}", lab.names[0]))),
    });
    let bare = connect_cost(&lab, conns);
    let t = Instant::now();
    let loaded = applier.apply(&table);
    let load = t.elapsed();
    if let Err(e) = loaded {
        println!("nft load failed: {e}");
        return;
    }
    println!(
        "nft load of the whole table (first): {:.0} ms; applied to enforcing = render + load ≈ {:.0} ms",
        load.as_secs_f64() * 1e3,
        (load + render_time).as_secs_f64() * 1e3
    );
    applier.resync();
    let t = Instant::now();
    let _ = applier.apply(&table);
    println!(
        "nft atomic reload over the existing table: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    for (what, after) in changes {
        let new = render(after, "n0", &opts);
        let t = Instant::now();
        let r = applier.apply(&new);
        println!(
            "apply '{what}': {:.1} ms ({})",
            t.elapsed().as_secs_f64() * 1e3,
            if r.is_ok() { "ok" } else { "failed" }
        );
        let _ = applier.apply(&table);
    }
    // b (ns0/p1, app1) is isolated by ns0/np1 (tier=1 pods of team t1 on "http") and np0's
    // egress... a (ns0/p0, app0, tier 0) reaches it only through an extra rule: the last one.
    let mut allow = m.clone();
    if let Ok(p) = policy(
        json!({"metadata": {"name": "zz-allow-a", "namespace": "ns0"}, "spec": {"podSelector": {"matchLabels": {"app": "app1"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "app0", "tier": "0"}}}], "ports": [{"port": 80}]}]}}),
    ) {
        allow.policies.insert(p.key(), p);
    }
    let _ = applier.apply(&render(&allow, "n0", &opts));
    let with = connect_cost(&lab, conns);
    match (bare, with) {
        (Some(b), Some(w)) => println!(
            "per connection (python connect+close, best of 3 × {conns}): no table {b:.1} µs, through the table (b isolated by {} rules) {w:.1} µs: ratio {:.2}",
            allow
                .policies
                .values()
                .filter(|p| p.namespace == "ns0"
                    && p.pod_selector
                        .matches(&allow.pods[&PodKey::new("ns0", "p1")].labels))
                .map(|p| p.ingress.len())
                .sum::<usize>(),
            w / b
        ),
        _ => println!("per-connection measurement failed"),
    }
    let _ = applier.remove();
}
