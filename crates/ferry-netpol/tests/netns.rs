//! NetworkPolicy enforced for real, in throwaway network namespaces this test creates: a
//! "node" namespace routing between two "pod" namespaces over veth pairs, Ferry's table applied
//! in the node with the applier. Deny, then allow; a policy change holds for the next new
//! connection; an established connection keeps flowing across a deny; the deny counters count.
//! Everything is removed at the end; the root namespace is never touched. Needs root, `ip`,
//! `nft`, `nsenter` and `python3`; without them the test says so and passes.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use ferry_netpol::apply::{Applier, Target};
use ferry_netpol::fixtures::{policy, with};
use ferry_netpol::model::{Model, PodInfo, PodKey};
use ferry_netpol::render::{RenderOptions, render};
use serde_json::json;

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces (deleted on drop, with the processes started in them).
struct Lab {
    node: String,
    a: String,
    b: String,
    children: Vec<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in [&self.a, &self.b, &self.node] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

const SERVER: &str = r#"
import socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, _ = s.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
def echo(c):
    try:
        while True:
            d = c.recv(64)
            if not d: break
            c.sendall(d)
    finally: c.close()
for p in (80, 81):
    threading.Thread(target=serve, args=(p,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// One connection attempt per line read from stdin ("HOST PORT"); prints ok/refused/timeout.
/// "hold HOST PORT" opens a connection kept for "again", which sends on it once more.
const CLIENT: &str = r#"
import socket, sys
held = None
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "again":
            held.sendall(b"2"); r = held.recv(8); print("ok" if r == b"2" else "bad", flush=True); continue
        s = socket.socket(); s.settimeout(3); s.connect((w[-2], int(w[-1]))); s.sendall(b"1")
        r = s.recv(8)
        if w[0] == "hold": held = s
        else: s.close()
        print("ok" if r == b"1" else "bad", flush=True)
    except ConnectionRefusedError: print("refused", flush=True)
    except socket.timeout: print("timeout", flush=True)
    except OSError as e: print("error:" + type(e).__name__, flush=True)
"#;

struct Client {
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Client {
    fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim().to_string()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn model() -> Model {
    let mut m = Model::default();
    m.nodes
        .insert("n".into(), vec![ip("198.18.200.1"), ip("198.18.201.1")]);
    m.put_namespace("x", Default::default());
    for (name, addr) in [("a", "198.18.200.2"), ("b", "198.18.201.2")] {
        m.pods.insert(
            PodKey::new("x", name),
            PodInfo {
                labels: [("pod".to_string(), name.to_string())].into(),
                ips: vec![ip(addr)],
                node: Some("n".into()),
                host_network: false,
                ports: Vec::new(),
            },
        );
    }
    m
}

#[test]
fn policy_enforced_in_a_node_namespace() {
    for tool in ["ip", "nft", "nsenter", "python3"] {
        if !have(tool) {
            eprintln!("skipping: {tool} is missing");
            return;
        }
    }
    if !std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    {
        eprintln!("skipping: not root");
        return;
    }
    let id = std::process::id();
    let mut lab = Lab {
        node: format!("fnp{id}n"),
        a: format!("fnp{id}a"),
        b: format!("fnp{id}b"),
        children: Vec::new(),
    };
    for n in [&lab.node, &lab.a, &lab.b] {
        sh(&["ip", "netns", "add", n]);
    }
    let (node, a, b) = (lab.node.clone(), lab.a.clone(), lab.b.clone());
    let exec = |ns: &str, args: &[&str]| {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(args);
        sh(&v);
    };
    for (pod, host_if, hip, pip) in [
        (&a, "va", "198.18.200.1", "198.18.200.2"),
        (&b, "vb", "198.18.201.1", "198.18.201.2"),
    ] {
        sh(&[
            "ip", "-n", &node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0",
            "netns", pod,
        ]);
        exec(
            &node,
            &["ip", "addr", "add", &format!("{hip}/24"), "dev", host_if],
        );
        exec(&node, &["ip", "link", "set", host_if, "up"]);
        exec(
            pod,
            &["ip", "addr", "add", &format!("{pip}/24"), "dev", "eth0"],
        );
        exec(pod, &["ip", "link", "set", "eth0", "up"]);
        exec(pod, &["ip", "link", "set", "lo", "up"]);
        exec(pod, &["ip", "route", "add", "default", "via", hip]);
    }
    exec(&node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);

    let mut server = Command::new("ip")
        .args(["netns", "exec", &b, "python3", "-c", SERVER])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    lab.children.push(server);
    let mut client_proc = Command::new("ip")
        .args(["netns", "exec", &a, "python3", "-c", CLIENT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = Client {
        stdin: client_proc.stdin.take().unwrap(),
        out: BufReader::new(client_proc.stdout.take().unwrap()),
    };
    lab.children.push(client_proc);

    let mut applier = Applier::new(Target {
        netns: Some(PathBuf::from(format!("/run/netns/{node}"))),
    });
    let opts = RenderOptions::default();
    let base = model();

    // No policy: the table exists and lets everything through.
    applier.apply(&render(&base, "n", &opts)).unwrap();
    assert_eq!(client.ask("198.18.201.2 80"), "ok");
    // A connection established before the deny keeps working.
    assert_eq!(client.ask("hold 198.18.201.2 81"), "ok");

    // default-deny-ingress in x: b refuses new connections (rejected at once).
    let deny = with(
        base.clone(),
        policy(
            json!({"metadata": {"name": "default-deny-ingress", "namespace": "x"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
        )
        .unwrap(),
    );
    let stats = applier.apply(&render(&deny, "n", &opts)).unwrap();
    assert!(stats.elements_added >= 1, "{stats:?}");
    let r = client.ask("198.18.201.2 80");
    assert!(r != "ok", "denied, got {r}");
    assert_eq!(client.ask("again"), "ok", "established flows pass");

    // Allow from pod=a on port 80 only: the next connection passes, 81 stays denied.
    let allow = with(
        deny.clone(),
        policy(json!({"metadata": {"name": "allow-a-80", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "b"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}], "ports": [{"port": 80}]}]}}))
        .unwrap(),
    );
    let stats = applier.apply(&render(&allow, "n", &opts)).unwrap();
    assert!(
        stats.chains_rewritten >= 1 && stats.sets_added >= 2,
        "{stats:?}"
    );
    assert_eq!(client.ask("198.18.201.2 80"), "ok");
    assert!(client.ask("198.18.201.2 81") != "ok");

    // Relabel a (pod=c): its address leaves the peer set; the change is element operations only.
    let mut relabeled = allow.clone();
    relabeled
        .pods
        .get_mut(&PodKey::new("x", "a"))
        .unwrap()
        .labels
        .insert("pod".into(), "c".into());
    let stats = applier.apply(&render(&relabeled, "n", &opts)).unwrap();
    assert_eq!(stats.chains_rewritten, 0, "{stats:?}");
    assert!(client.ask("198.18.201.2 80") != "ok");

    // The counters saw the denied first packets; the allowed ones on request.
    let json = applier.target.list_json().unwrap().unwrap();
    let rows = ferry_netpol::log::counters(&json);
    let denied = rows
        .iter()
        .find(|r| r.verdict == "deny" && r.subject == "x/b")
        .unwrap();
    // The chain was rewritten when allow-a-80 came (counters restart): 81, then 80 after relabel.
    assert!(denied.packets >= 2, "{rows:?}");
    let allowed = rows
        .iter()
        .find(|r| r.verdict == "allow" && r.subject == "x/allow-a-80 ingress[0]")
        .unwrap();
    assert!(allowed.packets >= 1, "{rows:?}");

    // A full resync over the existing table keeps the same behaviour.
    applier.resync();
    applier.apply(&render(&allow, "n", &opts)).unwrap();
    assert_eq!(client.ask("198.18.201.2 80"), "ok");

    // Removing the policies opens everything again; removing the table leaves nothing behind.
    applier.apply(&render(&base, "n", &opts)).unwrap();
    assert_eq!(client.ask("198.18.201.2 81"), "ok");
    applier.remove().unwrap();
    assert!(applier.target.list_json().unwrap().is_none());
}
