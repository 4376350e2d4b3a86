//! The seed 002 demo, end to end on `ferry up`: the `hostnames` Deployment behind a ClusterIP,
//! answered round-robin by real processes through the userspace proxy, resolvable by cluster DNS.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Ferry, eventually, json};

const SEED: &str = include_str!("fixtures/seed-manifests.yaml");

/// The first two documents of the fixture: seed 002's Service and Deployment, verbatim.
fn hostnames_manifests() -> String {
    SEED.split("\n---\n")
        .take(2)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// One HTTP GET; returns the body.
fn http_get(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: hostnames\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(body.trim().to_string())
        }
        _ => Err(std::io::Error::other(format!("bad answer: {out:?}"))),
    }
}

fn ready_addresses(f: &Ferry, svc: &str) -> Vec<String> {
    let out = f.kubectl(&["get", "endpoints", svc, "-o", "json"]);
    if !out.status.success() {
        return Vec::new();
    }
    let ep = json(&String::from_utf8_lossy(&out.stdout));
    ep["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["ip"].as_str().map(String::from))
        .collect()
}

#[test]
fn seed_002_hostnames_demo() {
    let f = Ferry::start();
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], &hostnames_manifests());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Endpoints: three addresses on 9376.
    assert!(
        eventually(60, || ready_addresses(&f, "hostnames").len() == 3),
        "endpoints never had 3 addresses:\n{}",
        f.log()
    );
    let ep = json(&f.k("kubectl", &["get", "endpoints", "hostnames", "-o", "json"]));
    assert_eq!(ep["subsets"][0]["ports"][0]["port"], 9376, "{ep}");
    let table = f.k("kubectl", &["get", "endpoints", "hostnames"]);
    assert_eq!(table.matches(":9376").count(), 3, "{table}");

    // Three requests to the ClusterIP: three different pods.
    let svc = json(&f.k("kubectl", &["get", "svc", "hostnames", "-o", "json"]));
    let ip = svc["spec"]["clusterIP"]
        .as_str()
        .expect("clusterIP")
        .to_string();
    let vip: SocketAddr = format!("{ip}:80").parse().expect("addr");
    assert!(
        eventually(60, || http_get(vip).is_ok()),
        "the Service never answered on {vip}"
    );
    let names: HashSet<String> = (0..3)
        .map(|_| http_get(vip).expect("GET through the Service"))
        .collect();
    assert_eq!(names.len(), 3, "round-robin over three pods: {names:?}");
    let pods = f.k(
        "kubectl",
        &["get", "pods", "-l", "app=hostnames", "-o", "name"],
    );
    for n in &names {
        assert!(
            pods.contains(n.as_str()),
            "{n} is not a hostnames pod: {pods}"
        );
    }

    // Cluster DNS answers the Service name with the ClusterIP.
    let dns = f.dns_addr().expect("dns address in the log");
    let (dns_ip, dns_port) = dns.rsplit_once(':').expect("ip:port");
    let dig = std::process::Command::new("dig")
        .args([
            &format!("@{dns_ip}"),
            "-p",
            dns_port,
            "+short",
            "hostnames.default.svc.cluster.local",
        ])
        .output()
        .expect("dig");
    assert_eq!(String::from_utf8_lossy(&dig.stdout).trim(), ip);

    // Inside a pod: resolv.conf as seed 000 describes it, and the name resolves.
    let pod = pods
        .lines()
        .next()
        .expect("a pod")
        .trim_start_matches("pod/")
        .to_string();
    let resolv = f.k("kubectl", &["exec", &pod, "--", "cat", "/etc/resolv.conf"]);
    let (svc_range, _) = f.ranges();
    let want = format!(
        "nameserver {}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5",
        common::kube_dns_ip(&svc_range)
    );
    if dns_port == "53" {
        assert_eq!(resolv.trim(), want);
        let hosts = f.k(
            "kubectl",
            &["exec", &pod, "--", "getent", "hosts", "hostnames"],
        );
        assert!(hosts.starts_with(&ip), "getent hosts hostnames: {hosts}");
    } else {
        assert!(
            resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
            "{resolv}"
        );
    }

    // A rollout restart with a client looping through the Service: zero failures.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let looper = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match http_get(vip) {
                    Ok(_) => ok.fetch_add(1, Ordering::SeqCst),
                    Err(e) => {
                        errors.push(e.to_string());
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
                std::thread::sleep(Duration::from_millis(10));
            }
            errors
        })
    };
    f.k("kubectl", &["rollout", "restart", "deployment/hostnames"]);
    f.k(
        "kubectl",
        &[
            "rollout",
            "status",
            "deployment/hostnames",
            "--timeout=120s",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let errors = looper.join().expect("looper");
    assert!(
        ok.load(Ordering::SeqCst) > 20,
        "too few requests went through"
    );
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "failures during the rollout: {errors:?}"
    );

    // Deleting a pod takes it out of the endpoints and the proxy promptly.
    assert!(eventually(60, || ready_addresses(&f, "hostnames").len() == 3));
    let pods = f.k(
        "kubectl",
        &["get", "pods", "-l", "app=hostnames", "-o", "json"],
    );
    let pods = json(&pods);
    let victim = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .expect("a pod")
        .clone();
    let victim_name = victim["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let victim_ip = victim["status"]["podIP"]
        .as_str()
        .expect("podIP")
        .to_string();
    let t = Instant::now();
    f.k("kubectl", &["delete", "pod", &victim_name, "--wait=false"]);
    assert!(eventually(60, || !ready_addresses(&f, "hostnames")
        .contains(&victim_ip)));
    let gone = t.elapsed();
    eprintln!("pod delete -> out of the endpoints: {gone:?} (incl. kubectl start-up)");
    for _ in 0..12 {
        let who = http_get(vip).expect("GET after the delete");
        assert_ne!(
            who, victim_name,
            "the proxy still sends traffic to the deleted pod"
        );
    }

    // A Service without ready endpoints refuses connections at once.
    let lonely = "apiVersion: v1\nkind: Service\nmetadata:\n  name: lonely\nspec:\n  selector:\n    app: nobody\n  ports:\n  - port: 8080\n";
    f.k_stdin("kubectl", &["apply", "-f", "-"], lonely);
    let svc = json(&f.k("kubectl", &["get", "svc", "lonely", "-o", "json"]));
    let lip = svc["spec"]["clusterIP"]
        .as_str()
        .expect("clusterIP")
        .to_string();
    let addr: SocketAddr = format!("{lip}:8080").parse().expect("addr");
    let t = Instant::now();
    let err = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .expect_err("connected to a Service without endpoints");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    eprintln!("refused after {:?}", t.elapsed());
}

/// Seed 004's `topologyKeys` through the proxy of `ferry up`: the first key whose value
/// matches this node picks the endpoints; no match and no `"*"` refuses.
#[test]
fn service_topology_keys_route_through_the_proxy() {
    let f = Ferry::start();
    let m = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: topo\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: topo}\n  template:\n    metadata:\n      labels: {app: topo}\n    spec:\n      containers:\n      - name: c\n        image: registry.k8s.io/serve_hostname\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: topo\nspec:\n  selector: {app: topo}\n  ports:\n  - port: 8080\n    targetPort: 9376\n  topologyKeys: [\"kubernetes.io/hostname\"]\n";
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], m);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        eventually(60, || ready_addresses(&f, "topo").len() == 2),
        "no endpoints:\n{}",
        f.log()
    );
    let svc = json(&f.k("kubectl", &["get", "svc", "topo", "-o", "json"]));
    let vip: SocketAddr = format!("{}:8080", svc["spec"]["clusterIP"].as_str().expect("ip"))
        .parse()
        .expect("addr");
    // Same host name as this node: served.
    assert!(
        eventually(60, || http_get(vip).is_ok()),
        "not served with kubernetes.io/hostname"
    );
    // A key this node does not carry, and no "*": refused.
    let patch = r#"{"spec":{"topologyKeys":["topology.kubernetes.io/zone"]}}"#;
    f.k(
        "kubectl",
        &["patch", "svc", "topo", "--type=merge", "-p", patch],
    );
    assert!(
        eventually(
            10,
            || matches!(TcpStream::connect_timeout(&vip, Duration::from_secs(2)), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
        ),
        "still served without a matching topology key"
    );
    // With "*" last: any endpoint.
    let patch = r#"{"spec":{"topologyKeys":["topology.kubernetes.io/zone","*"]}}"#;
    f.k(
        "kubectl",
        &["patch", "svc", "topo", "--type=merge", "-p", patch],
    );
    assert!(
        eventually(60, || http_get(vip).is_ok()),
        "not served with \"*\""
    );
}
