#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The userspace data path with real loopback traffic: Services and EndpointSlices (as JSON,
//! through the same projections and table as the watch path) applied to a [`Dataplane`], and
//! small TCP/UDP backends on 127.77.x.y that the test runs itself. (The API server rejects
//! loopback endpoint addresses, as upstream validation does, so traffic tests drive the table
//! directly; `tests/watch.rs` covers the API path.)

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_proxy::Scheduler;
use ferry_proxy::dataplane::{Dataplane, DataplaneConfig};
use ferry_proxy::model::{self, NodeInfo, ServiceInfo, SliceInfo};
use ferry_proxy::table::incr::Incremental;
use ferry_proxy::table::{self, NodeContext};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

const NODE: &str = "proxy-test-node";
const NODE_IP: &str = "127.77.0.100";

type Key = (String, String);

/// Services and slices as the watches would record them, applied to a data path.
struct Harness {
    dp: Dataplane,
    services: BTreeMap<Key, ServiceInfo>,
    slices: BTreeMap<Key, SliceInfo>,
    slice_json: BTreeMap<String, Value>,
    ctx: NodeContext,
    /// The per-Service table the sync loop keeps; the data path gets its deltas.
    inc: Incremental,
}

impl Harness {
    fn new() -> Self {
        Harness {
            dp: Dataplane::new(DataplaneConfig::default(), CancellationToken::new()),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            slice_json: BTreeMap::new(),
            inc: Incremental::default(),
            ctx: NodeContext {
                name: NODE.into(),
                labels: BTreeMap::new(),
                node_ips: vec![NODE_IP.parse().unwrap()],
                scheduler: Scheduler::RoundRobin,
                sctp: false,
            },
        }
    }

    /// Applies the state as the sync loop does: every Service's part rebuilt, only the
    /// difference handed to the data path (which must then serve the whole table).
    fn sync(&mut self) {
        let nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
        let keys: BTreeSet<Key> = self
            .services
            .keys()
            .chain(self.inc.services())
            .cloned()
            .collect();
        let parts: Vec<(Key, table::Table)> = keys
            .into_iter()
            .map(|k| {
                let part = match self.services.get(&k) {
                    Some(svc) => {
                        let slices: Vec<&SliceInfo> = self
                            .slices
                            .values()
                            .filter(|s| s.namespace == svc.namespace && s.service == svc.name)
                            .collect();
                        table::build_service(svc, &slices, &nodes, &self.ctx)
                    }
                    None => table::Table::default(),
                };
                (k, part)
            })
            .collect();
        let delta = self.inc.update(parts);
        let r = self.dp.apply_delta(&delta);
        assert!(r.failed.is_empty(), "{:?}", r.failed);
        let t = table::build(&self.services, &self.slices, &nodes, &self.ctx);
        assert_eq!(self.inc.table(), &t);
        let listening: BTreeSet<_> = t.frontends.keys().copied().collect();
        assert_eq!(self.dp.listening(), listening);
    }

    fn put_slice(&mut self, svc: &str, v: Value) {
        let s: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_json::from_value(v.clone()).unwrap();
        let info = model::project_slice(&s).unwrap();
        self.slices
            .insert(("default".into(), format!("{svc}-1")), info);
        self.slice_json.insert(svc.to_string(), v);
    }

    fn add(&mut self, svc: Value, slice: Value) {
        let typed: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(svc.clone()).unwrap();
        let info = model::project_service(&typed, Some(&svc)).unwrap();
        let name = info.name.clone();
        self.services.insert(("default".into(), name.clone()), info);
        self.put_slice(&name, slice);
        self.sync();
    }

    fn set_endpoints(&mut self, svc: &str, eps: Value) {
        let mut v = self.slice_json[svc].clone();
        v["endpoints"] = eps;
        self.put_slice(svc, v);
        self.sync();
    }

    /// A ClusterIP service `name` on `vip:80` -> 9376.
    fn web_service(&mut self, name: &str, vip: &str, extra: Value, eps: &[&str]) {
        let mut svc = json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": vip, "ports": [{"name": "http", "port": 80, "targetPort": 9376}]}
        });
        merge(&mut svc, extra);
        self.add(svc, slice_json(name, "http", "TCP", 9376, eps));
    }
}

/// A TCP "pod": writes its name and a newline, then waits for the client to close.
async fn tcp_backend(ip: &str, port: u16, name: &str) -> CancellationToken {
    let l = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), port))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = s.cancelled() => return,
                r = l.accept() => {
                    let Ok((mut c, _)) = r else { continue };
                    let name = name.clone();
                    tokio::spawn(async move {
                        let _ = c.write_all(format!("{name}\n").as_bytes()).await;
                        let mut sink = [0u8; 512];
                        while let Ok(n) = c.read(&mut sink).await {
                            if n == 0 { break; }
                        }
                    });
                }
            }
        }
    });
    stop
}

/// A TCP backend that echoes the first line it receives (the PROXY header).
async fn first_line_backend(ip: &str, port: u16) {
    let l = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut r = BufReader::new(c);
                let mut line = String::new();
                let _ = r.read_line(&mut line).await;
                let _ = r.get_mut().write_all(line.as_bytes()).await;
            });
        }
    });
}

/// A UDP "pod": answers `name:payload`.
async fn udp_backend(ip: &str, port: u16, name: &str) {
    let s = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), port))
        .await
        .unwrap();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            let reply = format!("{name}:{}", String::from_utf8_lossy(&buf[..n]));
            let _ = s.send_to(reply.as_bytes(), from).await;
        }
    });
}

async fn connect_from(src: Option<&str>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    match src {
        None => TcpStream::connect(addr).await,
        Some(src) => {
            let s = TcpSocket::new_v4()?;
            s.bind(SocketAddr::new(src.parse().unwrap(), 0))?;
            s.connect(addr).await
        }
    }
}

/// Connects, reads the backend's name, keeps the connection.
async fn open(src: Option<&str>, addr: &str) -> std::io::Result<(String, TcpStream)> {
    let s = connect_from(src, addr.parse().unwrap()).await?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::other("timeout"))??;
    if line.is_empty() {
        return Err(std::io::Error::other("closed without a name"));
    }
    Ok((line.trim().to_string(), r.into_inner()))
}

async fn fetch(src: Option<&str>, addr: &str) -> std::io::Result<String> {
    open(src, addr).await.map(|(n, _)| n)
}

/// Fetches until the address answers (the proxy has synced it).
async fn wait_serving(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if fetch(None, addr).await.is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{addr} never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn counts(names: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in names {
        *m.entry(n.clone()).or_insert(0) += 1;
    }
    m
}

fn slice_json(svc: &str, port_name: &str, proto: &str, port: u16, eps: &[&str]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-1"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": proto}],
        "endpoints": eps.iter().map(|ip| json!({
            "addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE
        })).collect::<Vec<_>>()
    })
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

const PODS: [&str; 3] = ["127.77.1.1", "127.77.1.2", "127.77.1.3"];

async fn start_pods() -> Vec<CancellationToken> {
    let mut out = Vec::new();
    for (i, ip) in PODS.iter().enumerate() {
        out.push(tcp_backend(ip, 9376, &format!("pod-{}", i + 1)).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_data_path() {
    let mut h = Harness::new();
    let _pods = start_pods().await;

    // --- round-robin over three endpoints (the seed's hostnames demo) ---
    h.web_service("hostnames", "127.96.77.10", json!({}), &PODS);
    wait_serving("127.96.77.10:80").await;
    let mut names = Vec::new();
    for _ in 0..30 {
        names.push(fetch(None, "127.96.77.10:80").await.unwrap());
    }
    assert_eq!(
        counts(&names).values().copied().collect::<Vec<_>>(),
        vec![10, 10, 10],
        "round-robin: {names:?}"
    );
    let three: BTreeSet<_> = names[..3].iter().collect();
    assert_eq!(three.len(), 3, "three requests, three pods");

    // --- retry on the next endpoint when a connect fails ---
    h.web_service(
        "retry",
        "127.96.77.11",
        json!({}),
        &["127.77.0.99", PODS[0], "127.77.0.98", PODS[1]],
    );
    wait_serving("127.96.77.11:80").await;
    for _ in 0..12 {
        let n = fetch(None, "127.96.77.11:80").await.unwrap();
        assert!(n == "pod-1" || n == "pod-2", "{n}");
    }

    // --- endpoint removal: new connections avoid the removed endpoint at once ---
    h.set_endpoints(
        "hostnames",
        json!([{"addresses": [PODS[0]], "conditions": {"ready": true}},
               {"addresses": [PODS[1]], "conditions": {"ready": true}}]),
    );
    for _ in 0..10 {
        assert_ne!(fetch(None, "127.96.77.10:80").await.unwrap(), "pod-3");
    }

    // --- no ready endpoints: refused at once; serving+terminating ones are a fallback ---
    h.set_endpoints(
        "hostnames",
        json!([{"addresses": [PODS[2]],
                "conditions": {"ready": false, "serving": true, "terminating": true}}]),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if fetch(None, "127.96.77.10:80").await.ok().as_deref() == Some("pod-3") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "terminating fallback never served"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.set_endpoints(
        "hostnames",
        json!([{"addresses": [PODS[2]], "conditions": {"ready": false}}]),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let t = Instant::now();
        match TcpStream::connect("127.96.77.10:80").await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                assert!(t.elapsed() < Duration::from_secs(2), "refused, but slowly");
                break;
            }
            _ => {}
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // --- every scheduler, chosen per Service by annotation ---
    for (i, sched) in ["rr", "random", "lc", "dh", "sh", "sed", "nq"]
        .into_iter()
        .enumerate()
    {
        let vip = format!("127.96.77.{}", 20 + i);
        h.web_service(
            &format!("sched-{sched}"),
            &vip,
            json!({"metadata": {"annotations": {"ferry.dev/scheduler": sched}}}),
            &PODS,
        );
        let addr = format!("{vip}:80");
        wait_serving(&addr).await;
        let s: Scheduler = sched.parse().unwrap();
        match s {
            Scheduler::RoundRobin => {
                let mut n = Vec::new();
                for _ in 0..30 {
                    n.push(fetch(None, &addr).await.unwrap());
                }
                assert!(counts(&n).values().all(|c| *c == 10), "{sched}: {n:?}");
            }
            Scheduler::Random => {
                let mut n = Vec::new();
                for _ in 0..150 {
                    n.push(fetch(None, &addr).await.unwrap());
                }
                let c = counts(&n);
                assert_eq!(c.len(), 3, "{sched}: {c:?}");
                assert!(c.values().all(|v| *v >= 20), "{sched}: {c:?}");
            }
            Scheduler::LeastConnection
            | Scheduler::ShortestExpectedDelay
            | Scheduler::NeverQueue => {
                // Held connections spread evenly: each new one goes to the least loaded.
                let mut held = Vec::new();
                let mut n = Vec::new();
                for _ in 0..9 {
                    let (name, conn) = open(None, &addr).await.unwrap();
                    n.push(name);
                    held.push(conn);
                }
                assert!(counts(&n).values().all(|c| *c == 3), "{sched}: {n:?}");
                // Closed connections: all idle, the first endpoint in order wins each time.
                drop(held);
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut n = Vec::new();
                for _ in 0..6 {
                    n.push(fetch(None, &addr).await.unwrap());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(counts(&n).len(), 1, "{sched} idle: {n:?}");
            }
            Scheduler::DestinationHashing => {
                let mut n = BTreeSet::new();
                for k in 1..=12 {
                    let src = format!("127.78.0.{k}");
                    n.insert(fetch(Some(&src), &addr).await.unwrap());
                }
                assert_eq!(n.len(), 1, "{sched}: one destination, one backend: {n:?}");
            }
            Scheduler::SourceHashing => {
                let mut all = BTreeSet::new();
                for k in 1..=24 {
                    let src = format!("127.78.1.{k}");
                    let first = fetch(Some(&src), &addr).await.unwrap();
                    for _ in 0..3 {
                        assert_eq!(fetch(Some(&src), &addr).await.unwrap(), first, "{src}");
                    }
                    all.insert(first);
                }
                assert!(all.len() >= 2, "{sched}: sources spread: {all:?}");
            }
        }
    }

    // --- sessionAffinity: ClientIP ---
    h.web_service(
        "sticky",
        "127.96.77.30",
        json!({"spec": {"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}}),
        &PODS,
    );
    wait_serving("127.96.77.30:80").await;
    let mut firsts = BTreeSet::new();
    for k in 1..=6 {
        let src = format!("127.78.2.{k}");
        let first = fetch(Some(&src), "127.96.77.30:80").await.unwrap();
        for _ in 0..5 {
            assert_eq!(
                fetch(Some(&src), "127.96.77.30:80").await.unwrap(),
                first,
                "{src} sticks"
            );
        }
        firsts.insert(first);
    }
    assert_eq!(firsts.len(), 3, "new clients still go round-robin");

    // --- NodePort on the node IP, externalIPs, LoadBalancer ingress IPs ---
    h.web_service(
        "exposed",
        "127.96.77.40",
        json!({"spec": {"type": "NodePort", "externalIPs": ["127.77.0.200"],
            "ports": [{"name": "http", "port": 80, "targetPort": 9376, "nodePort": 30777}]}}),
        &PODS,
    );
    wait_serving("127.96.77.40:80").await;
    wait_serving(&format!("{NODE_IP}:30777")).await;
    wait_serving("127.77.0.200:80").await;

    // --- PROXY protocol towards the backend ---
    first_line_backend("127.77.2.1", 9000).await;
    h.add(
        json!({"metadata": {"name": "pp", "namespace": "default",
                "annotations": {"ferry.dev/proxy-protocol": "v1"}},
               "spec": {"clusterIP": "127.96.77.50",
                "ports": [{"name": "http", "port": 80, "targetPort": 9000}]}}),
        slice_json("pp", "http", "TCP", 9000, &["127.77.2.1"]),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let (header, local) = loop {
        if let Ok(s) = TcpStream::connect("127.96.77.50:80").await {
            let local = s.local_addr().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            if r.read_line(&mut line).await.is_ok() && !line.is_empty() {
                break (line, local);
            }
        }
        assert!(
            Instant::now() < deadline,
            "proxy-protocol service never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        header,
        format!(
            "PROXY TCP4 {} 127.96.77.50 {} 80\r\n",
            local.ip(),
            local.port()
        )
    );

    // --- UDP ---
    for (i, ip) in PODS.iter().enumerate() {
        udp_backend(ip, 5353, &format!("udp-{}", i + 1)).await;
    }
    h.add(
        json!({"metadata": {"name": "dns", "namespace": "default"},
               "spec": {"clusterIP": "127.96.77.60",
                "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}}),
        slice_json("dns", "dns", "UDP", 5353, &PODS),
    );
    let mut seen = BTreeSet::new();
    for k in 0..3 {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.connect("127.96.77.60:53").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let reply = loop {
            let _ = sock.send(format!("q{k}").as_bytes()).await;
            let mut buf = [0u8; 1500];
            match tokio::time::timeout(Duration::from_millis(200), sock.recv(&mut buf)).await {
                Ok(Ok(n)) => break String::from_utf8_lossy(&buf[..n]).to_string(),
                _ => assert!(Instant::now() < deadline, "no UDP answer"),
            }
        };
        assert!(reply.ends_with(&format!(":q{k}")), "{reply}");
        // The same flow keeps its backend.
        sock.send(b"again").await.unwrap();
        let mut buf = [0u8; 1500];
        let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let again = String::from_utf8_lossy(&buf[..n]).to_string();
        assert_eq!(
            again.split(':').next(),
            reply.split(':').next(),
            "one flow, one backend"
        );
        seen.insert(reply.split(':').next().unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), 3, "UDP flows round-robin: {seen:?}");

    h.dp.shutdown();
    // Listeners are closed on stop.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect("127.96.77.40:80").await.is_err());
}
