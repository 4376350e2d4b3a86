//! The data path's limits: the per-process connection cap (TCP and UDP flows), the TCP idle
//! timeout. Addresses in 127.79.0.0/16 (other test files use other ranges).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferry_proxy::Scheduler;
use ferry_proxy::dataplane::{Dataplane, DataplaneConfig};
use ferry_proxy::model::{self, NodeInfo};
use ferry_proxy::table::{self, NodeContext};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

const NODE: &str = "limits-node";

/// A data path serving one Service `vip:80` (TCP and UDP) -> `pod:9376`.
fn dataplane(cfg: DataplaneConfig, vip: &str, pod: &str) -> Dataplane {
    let svc = json!({
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"clusterIP": vip, "ports": [
            {"name": "tcp", "port": 80, "targetPort": 9376},
            {"name": "udp", "port": 80, "targetPort": 9376, "protocol": "UDP"}
        ]}
    });
    let mut services = BTreeMap::new();
    let typed: k8s_openapi::api::core::v1::Service = serde_json::from_value(svc.clone()).unwrap();
    services.insert(
        ("default".to_string(), "s".to_string()),
        model::project_service(&typed, Some(&svc)).unwrap(),
    );
    let mut slices = BTreeMap::new();
    for proto in ["TCP", "UDP"] {
        let v = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("s-{proto}"), "namespace": "default",
                "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4",
            "ports": [{"name": proto.to_lowercase(), "port": 9376, "protocol": proto}],
            "endpoints": [{"addresses": [pod], "conditions": {"ready": true}, "nodeName": NODE}]
        });
        let s: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(v).unwrap();
        slices.insert(
            ("default".to_string(), format!("s-{proto}")),
            model::project_slice(&s).unwrap(),
        );
    }
    let ctx = NodeContext {
        name: NODE.into(),
        labels: BTreeMap::new(),
        node_ips: vec![],
        scheduler: Scheduler::RoundRobin,
        sctp: false,
    };
    let nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
    let t = table::build(&services, &slices, &nodes, &ctx);
    let mut dp = Dataplane::new(cfg, CancellationToken::new());
    let r = dp.apply(&t);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    dp
}

/// A TCP pod that says "hi" and then echoes; a UDP pod that echoes.
async fn pod(ip: &str) {
    let l = TcpListener::bind((ip, 9376)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = c.write_all(b"hi\n").await;
                let mut buf = [0u8; 512];
                while let Ok(n) = c.read(&mut buf).await {
                    if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let u = UdpSocket::bind((ip, 9376)).await.unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf).await {
            let _ = u.send_to(&buf[..n], from).await;
        }
    });
}

/// Connects and reads the pod's greeting: the connection is proxied end to end.
async fn proxied(addr: &str) -> Option<BufReader<TcpStream>> {
    let s = TcpStream::connect(addr).await.ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    match tokio::time::timeout(Duration::from_secs(20), r.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 && line == "hi\n" => Some(r),
        _ => None,
    }
}

/// Whether the peer closed `s` within `secs`.
async fn closed_within(s: &mut BufReader<TcpStream>, secs: u64) -> bool {
    let mut b = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(secs), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_and_slots_come_back() {
    pod("127.79.1.1").await;
    let dp = dataplane(
        DataplaneConfig {
            max_connections: 2,
            ..DataplaneConfig::default()
        },
        "127.79.0.10",
        "127.79.1.1",
    );
    let vip = "127.79.0.10:80";
    let a = proxied(vip).await.expect("first connection proxied");
    let _b = proxied(vip).await.expect("second connection proxied");
    assert_eq!(dp.limiter().in_use(), 2);
    // Beyond the cap: accepted and closed at once, never proxied.
    let mut third = BufReader::new(TcpStream::connect(vip).await.unwrap());
    assert!(
        closed_within(&mut third, 20).await,
        "third connection not closed"
    );
    assert!(dp.limiter().saturated() >= 1);
    // A closed connection gives its slot back.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = None;
    while c.is_none() && Instant::now() < deadline {
        c = proxied(vip).await;
        if c.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(c.is_some(), "no slot came back");
    assert_eq!(dp.limiter().in_use(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_flows_count_against_the_cap() {
    pod("127.79.2.1").await;
    let dp = dataplane(
        DataplaneConfig {
            max_connections: 1,
            udp_idle: Duration::from_secs(600),
            ..DataplaneConfig::default()
        },
        "127.79.0.20",
        "127.79.2.1",
    );
    let vip: SocketAddr = "127.79.0.20:80".parse().unwrap();
    let ask = |sock: std::sync::Arc<UdpSocket>, ms: u64| async move {
        sock.send_to(b"ping", vip).await.unwrap();
        let mut buf = [0u8; 16];
        tokio::time::timeout(Duration::from_millis(ms), sock.recv_from(&mut buf))
            .await
            .ok()
            .and_then(|r| r.ok())
            .map(|(n, _)| buf[..n].to_vec())
    };
    let one = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let mut got = None;
    for _ in 0..40 {
        got = ask(one.clone(), 500).await;
        if got.is_some() {
            break;
        }
    }
    assert_eq!(got.as_deref(), Some(&b"ping"[..]));
    assert_eq!(dp.limiter().in_use(), 1);
    // A second client would open a second flow: dropped while the first one lives.
    let two = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    assert_eq!(ask(two.clone(), 800).await, None);
    assert!(dp.limiter().saturated() >= 1);
    // The first flow still works.
    assert_eq!(ask(one, 20_000).await.as_deref(), Some(&b"ping"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tcp_connections_time_out_busy_ones_do_not() {
    pod("127.79.3.1").await;
    let dp = dataplane(
        DataplaneConfig {
            tcp_idle: Some(Duration::from_secs(2)),
            ..DataplaneConfig::default()
        },
        "127.79.0.30",
        "127.79.3.1",
    );
    let vip = "127.79.0.30:80";
    let mut idle = proxied(vip).await.unwrap();
    let mut busy = proxied(vip).await.unwrap();
    // The busy one talks every 100 ms (20 times within the timeout) for 4 s.
    let talk = tokio::spawn(async move {
        for _ in 0..40 {
            busy.get_mut().write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            busy.read_exact(&mut b).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        busy
    });
    assert!(closed_within(&mut idle, 60).await, "idle connection kept");
    let mut busy = talk.await.expect("the busy connection stayed open");
    // Once quiet, it goes too, and its slot is released.
    assert!(closed_within(&mut busy, 60).await);
    let deadline = Instant::now() + Duration::from_secs(20);
    while dp.limiter().in_use() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dp.limiter().in_use(), 0);
}
