#![allow(clippy::unwrap_used)]
//! Loopback tests of the UDP/TCP servers, forwarding, caching, stub domains and the ACL.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ferry_dns::forward::ForwardConfig;
use ferry_dns::index::*;
use ferry_dns::wire::{self, *};
use ferry_dns::{ServerConfig, start_with_index};
use hickory_proto::op::Message;
use hickory_proto::rr::RData as HRData;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// A fake upstream: answers every name with `addr` (TTL 60), except names starting with "nx."
/// which get NXDOMAIN with an SOA (negative TTL 30). Counts queries.
async fn fake_upstream(addr: Ipv4Addr) -> (SocketAddr, Arc<AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = sock.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, src)) = sock.recv_from(&mut buf).await else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            let Ok(req) = parse_request(&buf[..n]) else {
                continue;
            };
            let name = req.qname.clone().unwrap_or_default();
            let resp = if name.starts_with("nx.") {
                Response {
                    rcode: RCODE_NXDOMAIN,
                    authority: vec![Record::new(
                        "example",
                        60,
                        RData::Soa {
                            mname: "ns.example".into(),
                            rname: "h.example".into(),
                            serial: 1,
                            refresh: 1,
                            retry: 1,
                            expire: 1,
                            minimum: 30,
                        },
                    )],
                    ..Default::default()
                }
            } else {
                Response {
                    answers: vec![Record::new(name, 60, RData::A(addr))],
                    ..Default::default()
                }
            };
            let out = encode_response(&req, &resp, 4096);
            let _ = sock.send_to(&out, src).await;
        }
    });
    (local, count)
}

fn index() -> Index {
    let mut idx = Index::new(ZoneConfig::default());
    idx.upsert_service(ServiceInfo {
        namespace: "default".into(),
        name: "web".into(),
        kind: ServiceKind::ClusterIp(vec![
            "10.96.0.10".parse().unwrap(),
            "fd00::10".parse().unwrap(),
        ]),
        ports: vec![],
        publish_not_ready: false,
    });
    idx.upsert_service(ServiceInfo {
        namespace: "default".into(),
        name: "big".into(),
        kind: ServiceKind::Headless,
        ports: vec![],
        publish_not_ready: false,
    });
    idx.upsert_slice(SliceInfo {
        namespace: "default".into(),
        name: "big-1".into(),
        service: "big".into(),
        endpoints: (0..100)
            .map(|i| EndpointInfo {
                ip: IpAddr::V4(Ipv4Addr::new(10, 1, 0, i)),
                hostname: None,
                ready: true,
            })
            .collect(),
        ports: vec![],
    });
    idx
}

fn config(upstream: SocketAddr, stub: SocketAddr, acl: &str) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        udp_workers: 2,
        allow_recursion_from: vec![acl.parse().unwrap()],
        forward: ForwardConfig {
            upstreams: vec![upstream],
            stubs: vec![("corp.example".into(), vec![stub])],
            timeout: Duration::from_millis(500),
        },
        tcp: ferry_dns::TcpConfig::default(),
    }
}

async fn udp(addr: SocketAddr, pkt: &[u8]) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.send_to(pkt, addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(Duration::from_millis(700), s.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf.truncate(n);
    Some(buf)
}

async fn tcp(addr: SocketAddr, pkt: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&(pkt.len() as u16).to_be_bytes())
        .await
        .unwrap();
    s.write_all(pkt).await.unwrap();
    let len = s.read_u16().await.unwrap() as usize;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await.unwrap();
    buf
}

fn addrs(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            HRData::A(a) => Some(a.to_string()),
            HRData::AAAA(a) => Some(a.to_string()),
            _ => None,
        })
        .collect()
}

fn rcode(m: &[u8]) -> u16 {
    u16::from(m[3] & 0x0F)
}

#[tokio::test]
async fn cluster_answers_udp_tcp_truncation_and_forwarding() {
    let (up, up_count) = fake_upstream(Ipv4Addr::new(1, 2, 3, 4)).await;
    let (stub, stub_count) = fake_upstream(Ipv4Addr::new(5, 6, 7, 8)).await;
    let srv = start_with_index(index(), config(up, stub, "127.0.0.0/8"))
        .await
        .unwrap();

    // A cluster name, mixed case: answered, case of the question kept.
    let out = udp(
        srv.udp_addr,
        &build_query(1, "WeB.Default.svc.Cluster.Local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.metadata.id, 1);
    assert!(m.metadata.authoritative);
    assert_eq!(addrs(&m), vec!["10.96.0.10"]);
    assert_eq!(
        m.answers[0].name.to_string(),
        "WeB.Default.svc.Cluster.Local."
    );
    // Same question again (answer cache), other id.
    let out = udp(
        srv.udp_addr,
        &build_query(
            2,
            "web.default.svc.cluster.local",
            TYPE_AAAA,
            true,
            Some(1232),
        ),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(addrs(&m), vec!["fd00::10"]);
    assert!(m.edns.is_some());

    // 100 endpoints: truncated over plain UDP, complete over TCP and with a big EDNS buffer.
    let q = build_query(3, "big.default.svc.cluster.local", TYPE_A, true, None);
    let out = udp(srv.udp_addr, &q).await.unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty());
    let m = Message::from_vec(&tcp(srv.tcp_addr, &q).await).unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 100);
    let out = udp(
        srv.udp_addr,
        &build_query(4, "big.default.svc.cluster.local", TYPE_A, true, Some(4096)),
    )
    .await
    .unwrap();
    assert_eq!(Message::from_vec(&out).unwrap().answers.len(), 100);

    // Negative cluster answers: NXDOMAIN with SOA, never forwarded.
    let out = udp(
        srv.udp_addr,
        &build_query(5, "nope.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(rcode(&out), RCODE_NXDOMAIN);
    assert_eq!(m.authorities.len(), 1);
    assert_eq!(
        up_count.load(Ordering::SeqCst),
        0,
        "cluster names are never forwarded"
    );

    // Forwarding + positive cache.
    let out = udp(
        srv.udp_addr,
        &build_query(6, "Www.Example.com", TYPE_A, true, None),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.metadata.id, 6);
    assert_eq!(addrs(&m), vec!["1.2.3.4"]);
    assert_eq!(m.answers[0].name.to_string(), "Www.Example.com.");
    let out = udp(
        srv.udp_addr,
        &build_query(7, "www.example.com", TYPE_A, true, None),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.metadata.id, 7);
    assert_eq!(addrs(&m), vec!["1.2.3.4"]);
    assert!(m.answers[0].ttl <= 60);
    // Over TCP too, from the same cache.
    let m = Message::from_vec(
        &tcp(
            srv.tcp_addr,
            &build_query(8, "www.example.com", TYPE_A, true, None),
        )
        .await,
    )
    .unwrap();
    assert_eq!(addrs(&m), vec!["1.2.3.4"]);
    assert_eq!(
        up_count.load(Ordering::SeqCst),
        1,
        "second query served from the cache"
    );

    // Negative cache.
    for id in 10..13 {
        let out = udp(
            srv.udp_addr,
            &build_query(id, "nx.example.com", TYPE_A, true, None),
        )
        .await
        .unwrap();
        assert_eq!(rcode(&out), RCODE_NXDOMAIN);
    }
    assert_eq!(up_count.load(Ordering::SeqCst), 2, "NXDOMAIN cached");

    // Stub domain.
    let out = udp(
        srv.udp_addr,
        &build_query(20, "host.corp.example", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(addrs(&Message::from_vec(&out).unwrap()), vec!["5.6.7.8"]);
    assert_eq!(stub_count.load(Ordering::SeqCst), 1);
    assert_eq!(up_count.load(Ordering::SeqCst), 2);

    // Malformed packets: short ones dropped, a header without question gets FORMERR; still alive.
    assert!(udp(srv.udp_addr, &[1, 2, 3]).await.is_none());
    let out = udp(srv.udp_addr, &[0, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    assert_eq!(rcode(&out), RCODE_FORMERR);
    assert_eq!(&out[0..2], &[0, 9]);
    let mut bad = build_query(21, "web.default.svc.cluster.local", TYPE_A, true, None);
    bad.truncate(bad.len() - 3);
    assert_eq!(
        rcode(&udp(srv.udp_addr, &bad).await.unwrap()),
        RCODE_FORMERR
    );
    // EDNS version 1 -> BADVERS.
    let mut v1 = build_query(
        22,
        "web.default.svc.cluster.local",
        TYPE_A,
        true,
        Some(1232),
    );
    let n = v1.len();
    v1[n - 5] = 1; // OPT TTL: version byte
    let m = Message::from_vec(&udp(srv.udp_addr, &v1).await.unwrap()).unwrap();
    assert_eq!(u16::from(m.metadata.response_code), RCODE_BADVERS);
    let out = udp(
        srv.udp_addr,
        &build_query(23, "web.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_NOERROR);

    // Live update: a new Service is answered right after the index changes.
    let t0 = Instant::now();
    srv.index.update(|idx| {
        idx.upsert_service(ServiceInfo {
            namespace: "default".into(),
            name: "new".into(),
            kind: ServiceKind::ClusterIp(vec!["10.96.0.99".parse().unwrap()]),
            ports: vec![],
            publish_not_ready: false,
        })
    });
    let out = udp(
        srv.udp_addr,
        &build_query(30, "new.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(addrs(&Message::from_vec(&out).unwrap()), vec!["10.96.0.99"]);
    // Speed is a benchmark's business, not a test's: report it, do not assert on it.
    eprintln!("index change -> answered: {:?}", t0.elapsed());

    let metrics = srv.metrics.encode();
    assert!(metrics.contains(r#"ferry_dns_requests_total{type="A",rcode="NOERROR"}"#));
    assert!(
        metrics.contains("ferry_dns_forward_cache_hits_total 4"),
        "{metrics}"
    );
    srv.stop().await.unwrap();
}

#[tokio::test]
async fn recursion_refused_outside_acl() {
    let (up, up_count) = fake_upstream(Ipv4Addr::new(1, 2, 3, 4)).await;
    let srv = start_with_index(index(), config(up, up, "10.0.0.0/8"))
        .await
        .unwrap();
    let out = udp(
        srv.udp_addr,
        &build_query(1, "www.example.com", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_REFUSED);
    let out = udp(
        srv.udp_addr,
        &build_query(2, "9.9.9.9.in-addr.arpa", TYPE_PTR, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_REFUSED);
    assert_eq!(
        up_count.load(Ordering::SeqCst),
        0,
        "nothing forwarded for a client outside the ACL"
    );
    // Cluster names are still answered to anyone.
    let out = udp(
        srv.udp_addr,
        &build_query(3, "web.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_NOERROR);
    let out = udp(
        srv.udp_addr,
        &build_query(4, "10.0.96.10.in-addr.arpa", TYPE_PTR, true, None),
    )
    .await
    .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.answers.len(), 1);
    srv.stop().await.unwrap();
}

#[tokio::test]
async fn ops_endpoints() {
    let shared = Arc::new(ferry_dns::SharedIndex::new(index()));
    let metrics = Arc::new(ferry_dns::Metrics::new());
    let l = ferry_dns::ops::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(ferry_dns::ops::serve(l, shared.clone(), metrics));
    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
    shared.set_ready();
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let m = get(addr, "/metrics").await;
    assert!(m.contains("ferry_dns_index_services 2"), "{m}");
    task.abort();
    let _ = wire::TYPE_A;
}

/// Before the index has synced with the API server, cluster names get SERVFAIL (CoreDNS's
/// behaviour), not a negative answer that resolvers would cache; afterwards they are answered.
#[tokio::test]
async fn servfail_before_first_sync() {
    let shared = Arc::new(ferry_dns::SharedIndex::new(index()));
    let metrics = Arc::new(ferry_dns::Metrics::new());
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let server = ferry_dns::server::Server::bind(
        config(unused, unused, "127.0.0.0/8"),
        shared.clone(),
        metrics,
    )
    .await
    .unwrap();
    let addr = server.udp_addr();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    for (id, name) in [
        (1, "web.default.svc.cluster.local"),
        (2, "nope.default.svc.cluster.local"),
    ] {
        let out = udp(addr, &build_query(id, name, TYPE_A, true, None))
            .await
            .unwrap();
        assert_eq!(rcode(&out), RCODE_SERVFAIL, "{name} before sync");
    }
    shared.set_ready();
    let out = udp(
        addr,
        &build_query(3, "web.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_NOERROR);
    let out = udp(
        addr,
        &build_query(4, "nope.default.svc.cluster.local", TYPE_A, true, None),
    )
    .await
    .unwrap();
    assert_eq!(rcode(&out), RCODE_NXDOMAIN);
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

/// Bursts of queries from many clients at once reach one UDP worker as batches (one receive
/// takes several, one send answers them): every query gets its own answer (its id, its
/// question) at the address it came from, over IPv4 and IPv6; a malformed datagram in the
/// middle of a burst is dropped without disturbing the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_bursts_are_answered_one_by_one() {
    let (up, _) = fake_upstream(Ipv4Addr::new(1, 2, 3, 4)).await;
    for listen in ["127.0.0.1:0", "[::1]:0"] {
        let client_addr = if listen.starts_with('[') {
            "[::1]:0"
        } else {
            "127.0.0.1:0"
        };
        let mut cfg = config(up, up, "127.0.0.0/8");
        cfg.listen = match listen.parse() {
            Ok(a) => a,
            Err(_) => continue,
        };
        cfg.udp_workers = 1;
        let srv = match start_with_index(index(), cfg).await {
            Ok(s) => s,
            // No IPv6 on this machine's loopback.
            Err(_) if listen.starts_with('[') => continue,
            Err(e) => panic!("{e}"),
        };
        // (name, qtype, expected rcode, expected addresses)
        let cases: [(&str, u16, u16, &[&str]); 3] = [
            ("web.default.svc.cluster.local", TYPE_A, 0, &["10.96.0.10"]),
            ("web.default.svc.cluster.local", TYPE_AAAA, 0, &["fd00::10"]),
            ("nope.default.svc.cluster.local", TYPE_A, 3, &[]),
        ];
        let mut clients = Vec::new();
        for c in 0..8u16 {
            clients.push((c, UdpSocket::bind(client_addr).await.unwrap()));
        }
        // Rounds of bursts small enough for the sockets' receive buffers (8 x 10 datagrams).
        const ROUNDS: u16 = 6;
        const BURST: u16 = 10;
        for round in 0..ROUNDS {
            for (c, s) in &clients {
                for k in 0..BURST {
                    let i = round * BURST + k;
                    let (name, qtype, _, _) = cases[usize::from(i) % cases.len()];
                    let id = c * 1000 + i;
                    s.send_to(&build_query(id, name, qtype, true, None), srv.udp_addr)
                        .await
                        .unwrap();
                    if k == BURST / 2 {
                        s.send_to(&[0u8; 5], srv.udp_addr).await.unwrap();
                    }
                }
            }
            for (c, s) in &clients {
                let mut seen = std::collections::BTreeSet::new();
                let mut buf = vec![0u8; 65535];
                while seen.len() < usize::from(BURST) {
                    let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{listen}: client {c} got {} answers", seen.len())
                        })
                        .unwrap();
                    let m = Message::from_vec(&buf[..n]).unwrap();
                    let id = m.metadata.id;
                    assert_eq!(id / 1000, *c, "{listen}: answer for another client");
                    let i = id % 1000;
                    assert_eq!(i / BURST, round, "{listen}: answer of another round");
                    let (name, qtype, rc, want) = cases[usize::from(i) % cases.len()];
                    assert_eq!(m.queries[0].name().to_string(), format!("{name}."));
                    assert_eq!(u16::from(m.queries[0].query_type()), qtype);
                    assert_eq!(rcode(&buf[..n]), rc, "{listen}: {name}");
                    assert_eq!(addrs(&m), want, "{listen}: {name}");
                    assert!(seen.insert(id), "{listen}: answered twice: {id}");
                }
            }
        }
        srv.stop().await.unwrap();
    }
}

/// Cached answers are shared between queries that differ only in case and ID, never between
/// queries whose answers differ (EDNS or not, recursion desired or not, NXDOMAIN): one burst,
/// answered in batches from the cache, each answer carries its own query's ID, the question and
/// owner names in that query's case, and its own flags.
#[tokio::test]
async fn cached_answers_keep_each_querys_id_case_and_flags() {
    let (up, _) = fake_upstream(Ipv4Addr::new(1, 2, 3, 4)).await;
    let mut cfg = config(up, up, "127.0.0.0/8");
    cfg.udp_workers = 1;
    let srv = start_with_index(index(), cfg).await.unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let names = [
        "web.default.svc.cluster.local",
        "WEB.default.SVC.cluster.local",
        "wEb.DeFaUlT.sVc.ClUsTeR.lOcAl",
        "nope.Default.svc.cluster.local",
        "NOPE.default.svc.cluster.local",
    ];
    // Query i: name i % 5, EDNS on odd i, RD on i % 3 != 0.
    let query = |i: u16| {
        let name = names[usize::from(i) % names.len()];
        let edns = (i % 2 == 1).then_some(1232);
        (name, edns, !i.is_multiple_of(3))
    };
    let mut buf = vec![0u8; 65535];
    // Three passes over 30 queries: the first fills the cache, the others are answered from it.
    for pass in 0..3u16 {
        for i in 0..30u16 {
            let (name, edns, rd) = query(i);
            s.send_to(
                &build_query(pass * 100 + i, name, TYPE_A, rd, edns),
                srv.udp_addr,
            )
            .await
            .unwrap();
        }
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < 30 {
            let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("pass {pass}: {} answers", seen.len()))
                .unwrap();
            let out = &buf[..n];
            let m = Message::from_vec(out).unwrap();
            let id = m.metadata.id;
            assert_eq!(id / 100, pass);
            let i = id % 100;
            assert!(seen.insert(i), "answered twice: {id}");
            let (name, edns, rd) = query(i);
            assert_eq!(m.queries[0].name().to_string(), format!("{name}."), "{id}");
            assert_eq!(m.metadata.recursion_desired, rd, "{id}");
            assert_eq!(m.edns.is_some(), edns.is_some(), "{id}");
            if name.to_ascii_lowercase().starts_with("nope") {
                assert_eq!(rcode(out), RCODE_NXDOMAIN, "{id}");
                assert!(m.answers.is_empty());
                assert_eq!(m.authorities.len(), 1, "{id}: SOA");
            } else {
                assert_eq!(rcode(out), RCODE_NOERROR, "{id}");
                assert_eq!(addrs(&m), vec!["10.96.0.10"], "{id}");
                assert_eq!(m.answers[0].name.to_string(), format!("{name}."), "{id}");
            }
        }
    }
    srv.stop().await.unwrap();
}
