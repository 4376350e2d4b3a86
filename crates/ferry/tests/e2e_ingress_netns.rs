//! Ingress on the netns pod network (issue 13), as root: `ferry up --nodes 2` serves every
//! Ingress on each node's addresses (IPv4 and IPv6, HTTP and HTTPS) inside the node's network
//! namespace, publishes those addresses in the Ingress status, and routes to pods on both
//! nodes. Probed from the cluster network (`ferry exec-net`), outside every node.

mod common;

use common::eventually;
use common::netns::{NetnsCluster, usable};

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: registry.k8s.io/serve_hostname}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 9376}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  rules:
  - http:
      paths:
      - path: /
        pathType: Prefix
        backend: {service: {name: web, port: {number: 80}}}
"#;

fn url(ip: &str, scheme: &str) -> String {
    if ip.contains(':') {
        format!("{scheme}://[{ip}]/")
    } else {
        format!("{scheme}://{ip}/")
    }
}

#[test]
fn ingress_listens_on_every_node() {
    if !usable() {
        return;
    }
    let c = NetnsCluster::start(&["--nodes", "2", "--node-name", "ing"]);
    c.apply(APP);
    let pods = || {
        c.k(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{\"\\n\"}{end}",
        ])
    };
    assert!(
        eventually(120, || {
            let p = pods();
            p.lines().filter(|l| l.ends_with(" Running")).count() == 2
        }),
        "pods not running: {}\n{}",
        pods(),
        c.log()
    );
    let names: Vec<String> = pods()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();

    // Status: every node's addresses, IPv4 first.
    let node_ips = c.k(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*].status.addresses[?(@.type==\"InternalIP\")]}{.address} {end}",
    ]);
    let mut want: Vec<&str> = node_ips.split_whitespace().collect();
    want.sort_by_key(|ip| ip.contains(':'));
    assert_eq!(want.len(), 4, "two nodes of two families: {node_ips}");
    let status = || {
        c.k(&[
            "get",
            "ingress",
            "web",
            "-o",
            "jsonpath={range .status.loadBalancer.ingress[*]}{.ip} {end}",
        ])
    };
    assert!(
        eventually(60, || {
            let mut got: Vec<String> = status().split_whitespace().map(String::from).collect();
            let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            got.sort();
            w.sort();
            got == w
        }),
        "status {:?}, want {want:?}\n{}",
        status(),
        c.log()
    );

    // Each node answers on each of its addresses, HTTP and HTTPS, with a pod's name.
    for ip in &want {
        for scheme in ["http", "https"] {
            let u = url(ip, scheme);
            let mut last = String::new();
            let ok = eventually(30, || {
                let out = c.exec_net(&["curl", "-sk", "-m", "3", &u]);
                last = String::from_utf8_lossy(&out.stdout).trim().to_string();
                names.contains(&last)
            });
            assert!(ok, "{u}: got {last:?}, want one of {names:?}\n{}", c.log());
        }
    }
}
