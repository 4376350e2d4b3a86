//! End to end: the real API server + `ferry dns`, objects created with kubectl, answers checked
//! with `dig` over UDP and TCP.

mod common;

use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Ferry;

struct Dns {
    child: Child,
    port: u16,
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

fn start_dns(f: &Ferry) -> Dns {
    let port = free_port();
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    // A fake upstream that never answers: cluster names must not need it.
    let upstream = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let up = upstream.local_addr().expect("addr");
    std::mem::forget(upstream);
    let log = std::fs::File::create(f.dir.path().join("dns.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("dns")
        .arg("--kubeconfig")
        .arg(&f.kubeconfig)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--upstream", &up.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ferry dns");
    Dns { child, port }
}

fn dig(port: u16, args: &[&str]) -> String {
    let out = Command::new("dig")
        .args([
            "@127.0.0.1",
            "-p",
            &port.to_string(),
            "+short",
            "+time=1",
            "+tries=1",
        ])
        .args(args)
        .output()
        .expect("dig (Debian dnsutils)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn services_resolve_over_udp_and_tcp() {
    let f = Ferry::start();
    let dns = start_dns(&f);
    // Ready once the first sync is done: the apex SOA answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while dig(dns.port, &["cluster.local", "SOA"]).is_empty() {
        assert!(Instant::now() < deadline, "dns never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A user-chosen ClusterIP inside this instance's Service range (127.N.0.0/16).
    let (range, _) = f.ranges();
    let second = range.split('.').nth(1).unwrap_or("96").to_string();
    let vip = format!("127.{second}.7.7");
    let ptr = format!("7.7.{second}.127.in-addr.arpa");
    let svc = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: {vip}\n  selector:\n    app: web\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n"
    );
    let created = Instant::now();
    let out = f.k_stdin("kubectl", &["create", "-f", "-"], &svc);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut latency = None;
    while created.elapsed() < Duration::from_secs(60) {
        if dig(dns.port, &["web.default.svc.cluster.local", "A"]) == vip {
            latency = Some(created.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let latency = latency.expect("web.default.svc.cluster.local never resolved");
    eprintln!("create -> resolvable (incl. kubectl process start): {latency:?}");
    assert_eq!(
        dig(dns.port, &["web.default.svc.cluster.local", "A", "+tcp"]),
        vip
    );
    assert_eq!(dig(dns.port, &["WEB.Default.SVC.cluster.local", "A"]), vip);
    let srv = dig(
        dns.port,
        &["_http._tcp.web.default.svc.cluster.local", "SRV"],
    );
    assert!(srv.ends_with("80 web.default.svc.cluster.local."), "{srv}");
    assert_eq!(
        dig(dns.port, &[ptr.as_str(), "PTR"]),
        "web.default.svc.cluster.local."
    );
    // Headless Service with a hand-written EndpointSlice carrying a hostname.
    let headless = "apiVersion: v1\nkind: Service\nmetadata:\n  name: db\nspec:\n  clusterIP: None\n  ports:\n  - port: 5432\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: db-1\n  labels:\n    kubernetes.io/service-name: db\naddressType: IPv4\nports:\n- port: 5432\n  protocol: TCP\nendpoints:\n- addresses: [\"10.244.0.5\"]\n  hostname: db-0\n  conditions:\n    ready: true\n- addresses: [\"10.244.0.6\"]\n  conditions:\n    ready: false\n";
    let out = f.k_stdin("kubectl", &["apply", "-f", "-"], headless);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = common::eventually(60, || {
        dig(dns.port, &["db.default.svc.cluster.local", "A"]) == "10.244.0.5"
    });
    assert!(
        ok,
        "headless: {}",
        dig(dns.port, &["db.default.svc.cluster.local", "A"])
    );
    assert_eq!(
        dig(dns.port, &["db-0.db.default.svc.cluster.local", "A"]),
        "10.244.0.5"
    );
    // Deleting the Service removes the name (NXDOMAIN -> empty +short).
    f.k("kubectl", &["delete", "svc", "web"]);
    assert!(common::eventually(60, || dig(
        dns.port,
        &["web.default.svc.cluster.local", "A"]
    )
    .is_empty()));
}
