//! DNS over TCP under a connection cap: at the cap new connections wait (they are not reset)
//! and get their answer once an idle connection times out.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferry_dns::forward::ForwardConfig;
use ferry_dns::index::*;
use ferry_dns::wire;
use ferry_dns::{ServerConfig, TcpConfig, start_with_index};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn index() -> Index {
    let mut idx = Index::new(ZoneConfig::default());
    idx.upsert_service(ServiceInfo {
        namespace: "default".into(),
        name: "web".into(),
        kind: ServiceKind::ClusterIp(vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10))]),
        ports: vec![],
        publish_not_ready: false,
    });
    idx
}

fn config(tcp: TcpConfig) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        udp_workers: 1,
        allow_recursion_from: vec![],
        forward: ForwardConfig {
            upstreams: vec![],
            stubs: vec![],
            timeout: Duration::from_millis(500),
        },
        tcp,
    }
}

async fn send_query(s: &mut TcpStream) {
    let q = wire::build_query(7, "web.default.svc.cluster.local", 1, true, None);
    s.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
    s.write_all(&q).await.unwrap();
}

async fn read_answer(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = s.read_u16().await? as usize;
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn ask(addr: SocketAddr) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    send_query(&mut s).await;
    read_answer(&mut s).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_connections_wait_and_idle_ones_close() {
    let srv = start_with_index(
        index(),
        config(TcpConfig {
            max_connections: 2,
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(5),
        }),
    )
    .await
    .unwrap();
    let addr = srv.tcp_addr;
    // Two clients take both slots: each asks once, then stays idle.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        send_query(&mut s).await;
        let a = read_answer(&mut s).await.unwrap();
        assert_eq!(u16::from_be_bytes([a[0], a[1]]), 7);
        held.push(s);
    }
    // A third connection is accepted by the kernel but not served while both are held...
    let mut third = TcpStream::connect(addr).await.unwrap();
    send_query(&mut third).await;
    let early = tokio::time::timeout(Duration::from_millis(800), read_answer(&mut third)).await;
    assert!(early.is_err(), "answered beyond the cap: {early:?}");
    // ...and is answered (not reset) once the idle ones time out.
    let a = tokio::time::timeout(Duration::from_secs(60), read_answer(&mut third))
        .await
        .expect("the waiting connection is served after the idle ones close")
        .unwrap();
    assert_eq!(u16::from_be_bytes([a[0], a[1]]), 7);
    // The held connections were closed by the server (idle timeout): EOF.
    for mut s in held {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut b))
            .await
            .expect("closed by the idle timeout");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_read_timeout() {
    let srv = start_with_index(
        index(),
        config(TcpConfig {
            max_connections: 1,
            read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(5),
        }),
    )
    .await
    .unwrap();
    let addr = srv.tcp_addr;
    // A client that connects and says nothing holds the only slot only briefly.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut b))
        .await
        .expect("closed by the read timeout");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let a = tokio::time::timeout(Duration::from_secs(30), ask(addr))
        .await
        .unwrap();
    assert_eq!(u16::from_be_bytes([a[0], a[1]]), 7);
    srv.stop().await.unwrap();
}
