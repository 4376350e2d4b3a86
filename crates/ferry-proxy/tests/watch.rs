#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The proxy against an in-process API server (kwok-style objects): watches feed the table,
//! changes reach it within a second, a Service without endpoints is refused at once, and
//! `/healthz` answers. Endpoint addresses are 198.18.0.0/15 (the API server rejects loopback
//! endpoints, as upstream does); nothing connects to them, so no packet leaves loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proxy::SyncStatus;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const NODE: &str = "watch-test-node";

async fn create<K>(api: &Api<K>, v: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

/// The endpoints (as strings) behind a frontend in a status, if any.
fn served(st: &SyncStatus, fe: &str) -> Option<Vec<String>> {
    let (_, k) = st
        .table
        .frontends
        .iter()
        .find(|(f, _)| format!("{}:{}", f.ip, f.port) == fe)?;
    Some(
        st.table.pools[k]
            .endpoints
            .iter()
            .map(|e| e.ip().to_string())
            .collect(),
    )
}

/// Waits until `pred` holds for the proxy's status; returns how long it took.
async fn until(p: &ferry_proxy::Proxy, pred: impl Fn(&SyncStatus) -> bool) -> Duration {
    let t0 = Instant::now();
    let mut st = p.status();
    while !pred(&st) {
        st = tokio::time::timeout(Duration::from_secs(10), p.wait_syncs(st.syncs))
            .await
            .expect("proxy never reached the expected state")
            .unwrap();
    }
    t0.elapsed()
}

fn ep(ip: &str, node: &str, ready: bool) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": ready}, "nodeName": node})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_drive_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).unwrap());
    let cancel = CancellationToken::new();
    let config = ferry_apiserver::Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        service_cidrs: ferry_apiserver::alloc::parse_service_cidrs("127.96.0.0/16").unwrap(),
        ..Default::default()
    };
    let running = ferry_apiserver::start(config, store, cancel.clone())
        .await
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&running.kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(cfg).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    create(
        &nodes,
        json!({"metadata": {"name": NODE, "labels": {
            "kubernetes.io/hostname": NODE, "topology.kubernetes.io/zone": "za"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.78.0.100"}]}}),
    )
    .await;
    let args = ferry_proxy::ProxyArgs {
        node_name: Some(NODE.into()),
        healthz_bind_address: ferry_proxy::OptAddr(Some("127.0.0.1:0".parse().unwrap())),
        min_sync_period: Duration::from_millis(20),
        ..Default::default()
    };
    let proxy = ferry_proxy::start(client.clone(), &args, cancel.child_token())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");

    // A NodePort Service with endpoints on this node and another; an ITP-Local Service.
    create(
        &services,
        json!({"metadata": {"name": "web", "namespace": "default"},
               "spec": {"type": "NodePort", "clusterIP": "127.96.78.10", "externalTrafficPolicy": "Local",
                 "ports": [{"name": "http", "port": 80, "targetPort": 9376, "nodePort": 30778}]}}),
    )
    .await;
    create(
        &slices,
        json!({"metadata": {"name": "web-1", "namespace": "default",
                 "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": 9376, "protocol": "TCP"}],
               "endpoints": [ep("198.18.0.1", NODE, true), ep("198.18.0.2", "other", true),
                             ep("198.18.0.3", "other", true)]}),
    )
    .await;
    // The same address in a second slice is served once.
    create(
        &slices,
        json!({"metadata": {"name": "web-2", "namespace": "default",
                 "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": 9376, "protocol": "TCP"}],
               "endpoints": [ep("198.18.0.3", "other", true)]}),
    )
    .await;
    until(&proxy, |st| {
        served(st, "127.96.78.10:80").is_some_and(|e| e.len() == 3)
            && served(st, "127.78.0.100:30778") == Some(vec!["198.18.0.1".into()])
    })
    .await;

    // The seed's topologyKeys (annotation form): this node only.
    create(
        &services,
        json!({"metadata": {"name": "local", "namespace": "default",
                 "annotations": {"ferry.dev/topology-keys": "kubernetes.io/hostname"}},
               "spec": {"clusterIP": "127.96.78.11",
                 "ports": [{"name": "http", "port": 80, "targetPort": 9376}]}}),
    )
    .await;
    create(
        &slices,
        json!({"metadata": {"name": "local-1", "namespace": "default",
                 "labels": {"kubernetes.io/service-name": "local"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": 9376, "protocol": "TCP"}],
               "endpoints": [ep("198.18.0.5", NODE, true), ep("198.18.0.6", "other", true)]}),
    )
    .await;
    until(&proxy, |st| {
        served(st, "127.96.78.11:80") == Some(vec!["198.18.0.5".into()])
    })
    .await;

    // Removing an endpoint reaches the proxy within a second.
    let t0 = Instant::now();
    slices
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [ep("198.18.0.1", NODE, true), ep("198.18.0.3", "other", true)]})),
        )
        .await
        .unwrap();
    until(&proxy, |st| {
        served(st, "127.96.78.10:80")
            .is_some_and(|e| e.len() == 2 && !e.contains(&"198.18.0.2".to_string()))
    })
    .await;
    let took = t0.elapsed();
    println!("endpoint removal -> proxy table: {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // No ready endpoints: the listener goes away and connections are refused at once.
    slices
        .patch(
            "local-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [ep("198.18.0.5", NODE, false)]})),
        )
        .await
        .unwrap();
    until(&proxy, |st| served(st, "127.96.78.11:80").is_none()).await;
    let t = Instant::now();
    let err = TcpStream::connect("127.96.78.11:80").await.unwrap_err();
    // The listener closes asynchronously: a connection racing with the close is reset rather
    // than refused. Either way it fails at once.
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
        ),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(2));

    // Deleting the Service removes its frontends.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    until(&proxy, |st| served(st, "127.96.78.10:80").is_none()).await;

    // /healthz
    let mut s = TcpStream::connect(proxy.healthz_addr.unwrap())
        .await
        .unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("lastUpdated"), "{resp}");

    proxy.stop().await;
    cancel.cancel();
}
