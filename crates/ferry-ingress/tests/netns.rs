//! `--netns`: the data path listens and connects inside a network namespace this test creates
//! (as root; removed at the end). Its listener is reachable there, not from the caller's
//! namespace.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_ingress::{proxy, routes, tls};
use serde_json::json;
use tokio_util::sync::CancellationToken;

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

struct Netns {
    name: String,
    backend: Option<Child>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.backend.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn in_ns(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap()
}

fn table(backend: &str) -> routes::RouteTable {
    let (ip, port) = backend.split_once(':').unwrap();
    let mut inputs = routes::Inputs::default();
    inputs.ingresses.push(
        serde_json::from_value(json!({
            "metadata": {"name": "i", "namespace": "default", "annotations": {"kubernetes.io/ingress.class": "ferry"}},
            "spec": {"defaultBackend": {"service": {"name": "s", "port": {"number": 80}}}}
        }))
        .unwrap(),
    );
    let key = ("default".to_string(), "s".to_string());
    inputs.services.insert(
        key.clone(),
        serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap(),
    );
    inputs.slices.insert(
        key,
        vec![serde_json::from_value(json!({
            "metadata": {"name": "s-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4",
            "ports": [{"port": port.parse::<i32>().unwrap(), "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip]}]
        }))
        .unwrap()],
    );
    routes::build(&inputs, &routes::ClassPolicy::default()).table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_path_in_a_network_namespace() {
    if !is_root() || Command::new("ip").arg("-V").output().is_err() {
        eprintln!("skipped: needs root and iproute2 to create a network namespace");
        return;
    }
    let name = format!("ferry-ingtest-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .unwrap();
    assert!(ok.success());
    let mut ns = Netns {
        name: name.clone(),
        backend: None,
    };
    assert!(
        in_ns(&name, &["ip", "link", "set", "lo", "up"])
            .status
            .success()
    );
    // The backend lives in the namespace only.
    ns.backend = Some(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &name,
                "python3",
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                "28999",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let shared = proxy::Shared::new(proxy::Limits::default(), false);
    shared.swap_routes(table("127.0.0.1:28999"));
    let resolver = Arc::new(tls::Resolver::new(tls::CertTable {
        exact: Default::default(),
        wildcard: Default::default(),
        default: tls::self_signed().unwrap(),
    }));
    let stop = CancellationToken::new();
    let running = ferry_ingress::serve_data_path(
        shared,
        Some("127.0.0.1:28080".parse().unwrap()),
        None,
        Arc::new(tls::server_config(resolver)),
        Some((format!("/run/netns/{name}").into(), 1)),
        stop.clone(),
    )
    .await
    .unwrap();
    assert_eq!(running.http, Some("127.0.0.1:28080".parse().unwrap()));

    // Inside the namespace: proxied to the backend there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let mut answered = false;
    while Instant::now() < deadline {
        let out = in_ns(
            &name,
            &[
                "curl",
                "-s",
                "-m",
                "5",
                "-w",
                "\n%{http_code}",
                "http://127.0.0.1:28080/",
            ],
        );
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        if last.ends_with("\n200") && last.contains("Directory listing") {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(answered, "no answer inside the namespace: {last}");
    // Outside: nothing of ours listens on that address.
    let outside = Command::new("curl")
        .args(["-s", "-m", "3", "http://127.0.0.1:28080/"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&outside.stdout).contains("Directory listing"));
    stop.cancel();
    drop(ns);
}
