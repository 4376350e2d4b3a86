//! The netns pod network with the real reference CNI plugins (Debian's
//! containernetworking-plugins in /usr/lib/cni): a node namespace made by the test, pod
//! namespaces wired by `bridge` + `host-local` (+ `loopback`, `portmap`) run inside it,
//! IPv4 and IPv6 traffic between the node and a pod, an exhausted pod CIDR, DEL after an agent
//! restart (from the result cache), and nothing left behind. Needs root (skipped otherwise).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ferry_node::cni::{Cni, default_conflist};
use ferry_node::netns;
use ferry_node::network::{NetNs, PodNetwork, PodRef};

use ferry_node::is_root;

fn network(node_ns: &str, state: &Path, cidrs: &[&str], prefix: &str) -> NetNs {
    let cidrs: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c.parse().expect("cidr")).collect();
    NetNs {
        cni: Cni {
            bin_dirs: vec!["/usr/lib/cni".into()],
            exec_netns: Some(netns::path(node_ns)),
            cache_dir: state.join("results"),
        },
        conf: default_conflist("ferry-test", &cidrs, &state.join("ipam")),
        netns_prefix: prefix.to_string(),
    }
}

fn pod(uid: &str) -> PodRef {
    PodRef {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("pod-{uid}"),
        port_mappings: Vec::new(),
    }
}

/// Serves one connection inside `ns` on `addr` (answering "hi"), connects to it from
/// `from_ns`, returns what was read.
fn roundtrip(ns: &Path, from_ns: &Path, addr: SocketAddr) -> String {
    let l = netns::bind_tcp_in(Some(ns), addr).expect("bind in pod");
    l.set_nonblocking(false).expect("blocking");
    let server = std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"hi");
        }
    });
    let from = from_ns.to_path_buf();
    let got = netns::run_in(Some(&from), move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok::<_, std::io::Error>(out)
    })
    .expect("thread")
    .expect("connect");
    server.join().expect("server");
    got
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        netns::remove_prefix(&self.0);
    }
}

#[test]
fn pod_namespaces_through_the_reference_plugins() {
    if !is_root() || !Path::new("/usr/lib/cni/bridge").exists() {
        eprintln!("skipped: needs root and /usr/lib/cni (containernetworking-plugins)");
        return;
    }
    let prefix = format!("ferry-t{}", std::process::id());
    let _cleanup = Cleanup(prefix.clone());
    let node = format!("{prefix}-node1");
    netns::create(&node).expect("node netns");
    netns::ip_batch(Some(&node), "link set lo up\n").expect("lo");
    for (k, v) in netns::NODE_SYSCTLS {
        let _ = netns::sysctl(Some(&netns::path(&node)), k, v);
    }
    let state = tempfile::tempdir().expect("dir");
    let pod_prefix = format!("{prefix}-pod-");
    let net = network(
        &node,
        state.path(),
        &["10.250.0.0/29", "fd00:250::/64"],
        &pod_prefix,
    );

    // Two pods: each its namespace, lo up, eth0 with one address per family.
    let a = net.setup(&pod("a"), None).expect("pod a");
    let b = net.setup(&pod("b"), None).expect("pod b");
    assert_eq!(a.ips.len(), 2, "{a:?}");
    assert!(a.ips[0].is_ipv4() && a.ips[1].is_ipv6(), "{a:?}");
    assert_ne!(a.ips, b.ips);
    // Set-up is idempotent for a pod already attached.
    assert_eq!(net.setup(&pod("a"), None).expect("again"), a);
    let a_ns = net.netns_path("a").expect("path");
    let b_ns = net.netns_path("b").expect("path");
    let addrs = netns::ip(Some(&format!("{pod_prefix}a")), &["-o", "addr", "show"]).expect("ip");
    assert!(
        addrs.contains("lo") && addrs.contains("127.0.0.1"),
        "{addrs}"
    );
    assert!(addrs.contains(&a.ips[0].to_string()), "{addrs}");
    // Both pods may bind the same port; node -> pod and pod -> pod over both families.
    for ip in &a.ips {
        assert_eq!(
            roundtrip(&a_ns, &netns::path(&node), SocketAddr::new(*ip, 8080)),
            "hi"
        );
    }
    for ip in &b.ips {
        assert_eq!(roundtrip(&b_ns, &a_ns, SocketAddr::new(*ip, 8080)), "hi");
    }
    // A pod reaches itself on localhost.
    assert_eq!(
        roundtrip(&a_ns, &a_ns, "127.0.0.1:9000".parse().expect("addr")),
        "hi"
    );

    // The /29 has five addresses for pods minus the gateway: exhaust it; the failure names the
    // cause and leaves no namespace behind.
    let mut more = Vec::new();
    let err = loop {
        let uid = format!("x{}", more.len());
        match net.setup(&pod(&uid), None) {
            Ok(_) => more.push(uid),
            Err(e) => break (uid, e.to_string()),
        }
        assert!(more.len() < 10, "the range never ran out");
    };
    assert!(
        err.1.contains("no IP addresses available"),
        "unexpected error: {}",
        err.1
    );
    assert!(!netns::exists(&format!("{pod_prefix}{}", err.0)));

    // An agent restarted on the same state (a new NetNs value): GC tears down what the cache
    // lists (DEL with the cached result) and removes the namespaces.
    let restarted = network(
        &node,
        state.path(),
        &["10.250.0.0/29", "fd00:250::/64"],
        &pod_prefix,
    );
    let n = restarted.gc();
    assert_eq!(n, 2 + more.len());
    assert!(netns::list_with_prefix(&pod_prefix).is_empty());
    assert!(restarted.cni.cached().is_empty());
    // host-local released every address: only its bookkeeping files remain.
    let ipam = std::fs::read_dir(state.path().join("ipam").join("ferry-test"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<IpAddr>().is_ok())
                .count()
        })
        .unwrap_or(0);
    assert_eq!(ipam, 0, "addresses still reserved");
    // After GC a pod comes up again.
    let c = restarted.setup(&pod("c"), None).expect("pod c");
    restarted.teardown("c");
    assert!(!netns::exists(&format!("{pod_prefix}c")));
    assert!(!c.ips.is_empty());
}
