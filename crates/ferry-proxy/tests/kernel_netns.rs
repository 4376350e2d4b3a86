//! The kernel data path for real, inside a throwaway network namespace this test creates:
//! nftables rules for a few Services applied with the applier, connections to the ClusterIP
//! from inside the namespace spread over the endpoints (local TCP servers on addresses of that
//! namespace), an endpoint change applied as a difference, a Service without endpoints
//! rejected; then the same Service through upstream's iptables chains. Nothing in the root
//! namespace is touched. Needs root, `ip`, `nft`, `iptables` and `python3`; without them the
//! test says so and passes.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use ferry_proxy::kernel::apply::{self, IptApplier, NftApplier};
use ferry_proxy::kernel::input::{SvcPort, Target};
use ferry_proxy::kernel::iptables::IptConfig;
use ferry_proxy::kernel::nft::{self, NftConfig};
use ferry_proxy::model::{Proto, ServicePortName};

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Netns {
    name: String,
    children: Vec<Child>,
}

impl Netns {
    fn exec(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }
    fn prefix(&self) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.name.clone(),
        ]
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

const SERVER: &str = r#"
import socket, sys, threading
def serve(addr):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 8080)); s.listen(128)
    while True:
        c, _ = s.accept()
        try: c.sendall(addr.encode())
        finally: c.close()
for a in sys.argv[1:]:
    threading.Thread(target=serve, args=(a,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

const CLIENT: &str = r#"
import socket, sys, collections
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = collections.Counter()
for _ in range(n):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, port)); seen[s.recv(64).decode()] += 1
    except ConnectionRefusedError: seen["refused"] += 1
    except OSError as e: seen["error:" + type(e).__name__] += 1
    finally: s.close()
print(" ".join(f"{k}={v}" for k, v in sorted(seen.items())))
"#;

fn counts(out: &str) -> BTreeMap<String, u32> {
    out.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn svc(name: &str, vip: &str, port: u16, eps: &[&str]) -> SvcPort {
    SvcPort {
        name: ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: String::new(),
            proto: Proto::Tcp,
        },
        ipv6: false,
        port,
        node_port: None,
        cluster_ips: vec![vip.parse().unwrap()],
        externals: vec![],
        internal: if eps.is_empty() {
            Target::Reject
        } else {
            Target::Pool(
                eps.iter()
                    .map(|e| e.parse::<SocketAddr>().unwrap())
                    .collect(),
            )
        },
        external: Target::Reject,
        affinity: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    }
}

#[test]
fn nftables_and_iptables_in_a_throwaway_netns() {
    let root = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&root.stdout).trim() != "0"
        || !["ip", "nft", "python3", "iptables-restore"]
            .iter()
            .all(|c| have(c))
    {
        eprintln!("skipped: needs root, ip, nft, iptables-restore and python3");
        return;
    }
    let root_tables_before = sh(&["nft", "list", "tables"]);
    let mut ns = Netns {
        name: format!("ferry-kp-test-{}", std::process::id()),
        children: Vec::new(),
    };
    sh(&["ip", "netns", "add", &ns.name]);
    ns.exec(&["ip", "link", "set", "lo", "up"]);
    for a in ["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4"] {
        ns.exec(&["ip", "addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
    // A route covering the Service range, so that connect() reaches the output hook.
    ns.exec(&[
        "ip", "link", "add", "kp0", "type", "veth", "peer", "name", "kp1",
    ]);
    ns.exec(&["ip", "link", "set", "kp0", "up"]);
    ns.exec(&["ip", "link", "set", "kp1", "up"]);
    ns.exec(&["ip", "addr", "add", "198.18.9.1/24", "dev", "kp0"]);
    ns.exec(&["ip", "route", "add", "198.19.0.0/16", "dev", "kp0"]);
    let mut server = Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c", SERVER])
        .args(["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(server.stdout.take().unwrap());
        r.read_line(&mut line).unwrap();
    }
    ns.children.push(server);
    assert_eq!(line.trim(), "ready");

    let client = |vip: &str, port: u16, n: u32| {
        counts(&ns.exec(&[
            "python3",
            "-c",
            CLIENT,
            vip,
            &port.to_string(),
            &n.to_string(),
        ]))
    };

    // nftables.
    let table = "ferry-kp-test";
    let mut a = NftApplier::new(table, Some(&ns.name));
    let cfg = NftConfig::default();
    let mut ports = vec![
        svc(
            "web",
            "198.19.0.10",
            80,
            &["198.18.1.1:8080", "198.18.1.2:8080", "198.18.1.3:8080"],
        ),
        svc("empty", "198.19.0.11", 80, &[]),
        svc("one", "198.19.0.12", 81, &["198.18.1.4:8080"]),
    ];
    // ClientIP affinity: one client sticks to one endpoint.
    let mut sticky = svc(
        "sticky",
        "198.19.0.13",
        80,
        &["198.18.1.1:8080", "198.18.1.2:8080", "198.18.1.3:8080"],
    );
    sticky.affinity = Some(std::time::Duration::from_secs(60));
    ports.push(sticky);
    // A NodePort, answered on the node's own address (fib daddr type local).
    let mut np = svc(
        "np",
        "198.19.0.14",
        80,
        &["198.18.1.1:8080", "198.18.1.2:8080"],
    );
    np.node_port = Some(30080);
    np.external = np.internal.clone();
    ports.push(np);
    let st = a.sync(&nft::render(&ports, &cfg)).unwrap();
    assert!(st.full);
    let seen = client("198.19.0.13", 80, 20);
    assert_eq!(seen.len(), 1, "affinity keeps one endpoint: {seen:?}");
    assert_eq!(seen.values().sum::<u32>(), 20);
    let seen = client("198.18.9.1", 30080, 30);
    assert!(
        seen.contains_key("198.18.1.1") && seen.contains_key("198.18.1.2"),
        "NodePort on a local address: {seen:?}"
    );
    let seen = client("198.19.0.10", 80, 90);
    for e in ["198.18.1.1", "198.18.1.2", "198.18.1.3"] {
        assert!(
            seen.get(e).copied().unwrap_or(0) >= 10,
            "uneven or missing {e}: {seen:?}"
        );
    }
    assert_eq!(seen.values().sum::<u32>(), 90, "{seen:?}");
    assert_eq!(client("198.19.0.12", 81, 5).get("198.18.1.4"), Some(&5));
    let seen = client("198.19.0.11", 80, 3);
    assert_eq!(
        seen.get("refused"),
        Some(&3),
        "no endpoints: TCP reset: {seen:?}"
    );

    // An endpoint change is sent as a difference: element operations only.
    ports[0] = svc(
        "web",
        "198.19.0.10",
        80,
        &["198.18.1.1:8080", "198.18.1.2:8080", "198.18.1.4:8080"],
    );
    let desired = nft::render(&ports, &cfg);
    let script = a.script(&desired);
    assert!(
        script
            .lines()
            .all(|l| l.starts_with("add element") || l.starts_with("delete element")),
        "{script}"
    );
    let st = a.sync(&desired).unwrap();
    assert!(!st.full && st.ops > 0 && st.netlink, "{st:?}");
    eprintln!(
        "endpoint change over netlink: kernel {:?}, whole sync {:?}",
        st.kernel, st.took
    );
    let seen = client("198.19.0.10", 80, 60);
    assert_eq!(seen.get("198.18.1.3"), None, "{seen:?}");
    assert!(
        seen.get("198.18.1.4").copied().unwrap_or(0) >= 5,
        "{seen:?}"
    );
    // The kernel holds what the model says.
    let listed = ns.exec(&["nft", "list", "map", "inet", table, "dnat4-3"]);
    assert!(
        listed.contains("198.18.1.4 . 8080") && !listed.contains("198.18.1.3 . 8080"),
        "{listed}"
    );
    // Nothing left to send.
    assert_eq!(a.sync(&desired).unwrap().ops, 0);
    // Cleanup removes the table.
    a.cleanup().unwrap();
    assert!(!ns.exec(&["nft", "list", "tables"]).contains(table));

    // iptables (upstream's chains), the same Services.
    let mut ipt = IptApplier::new("iptables", ns.prefix());
    let t0 = Instant::now();
    ipt.sync(&ports, &IptConfig::default()).unwrap();
    let saved = ns.exec(&["iptables-save", "-t", "nat"]);
    assert!(
        saved.contains("-m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-"),
        "{saved}"
    );
    let seen = client("198.19.0.10", 80, 60);
    for e in ["198.18.1.1", "198.18.1.2", "198.18.1.4"] {
        assert!(seen.get(e).copied().unwrap_or(0) >= 5, "{seen:?}");
    }
    assert_eq!(client("198.19.0.11", 80, 2).get("refused"), Some(&2));
    ipt.cleanup().unwrap();
    let saved = ns.exec(&["iptables-save"]);
    assert!(!saved.contains("KUBE-"), "{saved}");
    eprintln!("iptables part took {:?}", t0.elapsed());

    // Stale UDP flows: the pairs that went away are the ones flushed.
    let mut u_old = svc(
        "dns",
        "198.19.0.53",
        53,
        &["198.18.1.1:53", "198.18.1.2:53"],
    );
    u_old.name.proto = Proto::Udp;
    let mut u_new = u_old.clone();
    u_new.internal = Target::Pool(vec!["198.18.1.2:53".parse().unwrap()]);
    let stale = apply::stale_udp(&[u_old], &[u_new]);
    assert_eq!(stale.len(), 1);
    assert_eq!(
        stale[0].endpoint,
        "198.18.1.1:53".parse::<SocketAddr>().unwrap()
    );
    // `conntrack -D` with nothing to delete is not an error for the caller.
    if have("conntrack") {
        apply::flush_stale_udp(&ns.prefix(), &stale);
    }

    drop(ns);
    assert_eq!(
        sh(&["nft", "list", "tables"]),
        root_tables_before,
        "root namespace untouched"
    );
}
