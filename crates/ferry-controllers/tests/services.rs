//! Service and endpoint control plane against the real (in-process) API server: allocation in
//! the create path, EndpointSlices, Endpoints, mirroring, topology hints, load-balancer pool.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_controllers::services::{self, ServiceArgs};
use k8s_openapi::api::core::v1::{Endpoints, Event, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Cluster {
    client: kube::Client,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(cidrs: &str, args: Option<ServiceArgs>) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ferry_store::RedbStore::open(&dir.path().join("store.redb")).unwrap());
    let stop = CancellationToken::new();
    let config = ferry_apiserver::Config {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        service_cidrs: ferry_apiserver::alloc::parse_service_cidrs(cidrs).unwrap(),
        node_port_range: "30000-30999".parse().unwrap(),
        ..Default::default()
    };
    let running = ferry_apiserver::start(config, store, stop.clone())
        .await
        .unwrap();
    let client = ferry_controllers::client(Some(&running.kubeconfig))
        .await
        .unwrap();
    if let Some(args) = args {
        let (c, s) = (client.clone(), stop.clone());
        tokio::spawn(async move { services::run(c, args, s).await });
    }
    Cluster {
        client,
        stop,
        _dir: dir,
    }
}

fn args() -> ServiceArgs {
    ServiceArgs {
        loadbalancer_ip_range: "192.0.2.10-192.0.2.12".into(),
        ..Default::default()
    }
}

async fn create_svc(api: &Api<Service>, v: Value) -> Result<Service, kube::Error> {
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("unexpected error {other}"),
    }
}

async fn eventually<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a pod and sets its status (as kwok does).
async fn make_pod(api: &Api<Pod>, name: &str, ip: &str, labels: Value, ready: bool, node: &str) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
    set_pod_status(api, name, ip, ready).await;
}

async fn set_pod_status(api: &Api<Pod>, name: &str, ip: &str, ready: bool) {
    let st = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
}

async fn make_node(api: &Api<Node>, name: &str, zone: Option<&str>, cpu: &str) {
    let mut labels = serde_json::Map::new();
    if let Some(z) = zone {
        labels.insert("topology.kubernetes.io/zone".into(), json!(z));
    }
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    api.create(&PostParams::default(), &n).await.unwrap();
    let st = json!({"status": {"allocatable": {"cpu": cpu},
        "conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
}

async fn slices_of(api: &Api<EndpointSlice>, svc: &str) -> Vec<EndpointSlice> {
    api.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .unwrap()
        .items
}

fn slice_ips(slices: &[EndpointSlice]) -> Vec<String> {
    let mut v: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten().map(|e| e.addresses[0].clone()))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn allocation_of_every_service_type() {
    let c = start("10.96.0.0/12", Some(args())).await;
    let api: Api<Service> = Api::namespaced(c.client.clone(), "default");
    // The kubernetes Service holds the first address.
    let k = api.get("kubernetes").await.unwrap();
    assert_eq!(k.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));

    let s = create_svc(
        &api,
        json!({"metadata": {"name": "cip"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .await
    .unwrap();
    let spec = s.spec.unwrap();
    let ip: std::net::Ipv4Addr = spec.cluster_ip.as_deref().unwrap().parse().unwrap();
    assert_eq!(ip.octets()[0], 10);
    assert!(ip.octets()[1] >= 96 && ip.octets()[1] < 112);
    assert_eq!(spec.ip_families.unwrap(), ["IPv4"]);
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));

    let s = create_svc(&api, json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort",
        "ports": [{"name": "a", "port": 53, "protocol": "TCP"}, {"name": "b", "port": 53, "protocol": "UDP"}]}})).await.unwrap();
    let ports = s.spec.unwrap().ports.unwrap();
    let np = ports[0].node_port.unwrap();
    assert!((30000..=30999).contains(&np));
    assert_eq!(ports[1].node_port, Some(np));

    let s = create_svc(
        &api,
        json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer",
        "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}}),
    )
    .await
    .unwrap();
    assert!(s.spec.as_ref().unwrap().health_check_node_port.is_some());
    assert!(
        s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
            .node_port
            .is_some()
    );
    let lb_ip = eventually("lb ingress", 10, async || {
        let s = api.get("lb").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert_eq!(lb_ip, "192.0.2.10");
    create_svc(&api, json!({"metadata": {"name": "lb-req"}, "spec": {"type": "LoadBalancer",
        "loadBalancerIP": "192.0.2.12", "allocateLoadBalancerNodePorts": false, "externalIPs": ["198.51.100.7"],
        "ports": [{"port": 80}]}})).await.unwrap();
    let got = eventually("requested lb ip", 10, async || {
        let s = api.get("lb-req").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert_eq!(got, "192.0.2.12");
    let s = api.get("lb-req").await.unwrap();
    assert!(
        s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
            .node_port
            .is_none()
    );
    assert_eq!(s.spec.unwrap().external_ips.unwrap(), ["198.51.100.7"]);
    // Another class is left alone.
    create_svc(
        &api,
        json!({"metadata": {"name": "lb-other"}, "spec": {"type": "LoadBalancer",
        "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]}}),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        api.get("lb-other")
            .await
            .unwrap()
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_none_or(|i| i.is_empty())
    );

    let s = create_svc(&api, json!({"metadata": {"name": "hl"}, "spec": {"clusterIP": "None", "selector": {"a": "b"}, "ports": [{"port": 80}]}})).await.unwrap();
    assert_eq!(s.spec.unwrap().cluster_ips.unwrap(), ["None"]);
    let s = create_svc(&api, json!({"metadata": {"name": "en"}, "spec": {"type": "ExternalName", "externalName": "example.com"}})).await.unwrap();
    assert!(s.spec.unwrap().cluster_ip.is_none());

    // User-chosen values: out of range or taken -> 422.
    let cases = [
        json!({"metadata": {"name": "bad1"}, "spec": {"clusterIP": "10.200.0.1", "ports": [{"port": 80}]}}),
        json!({"metadata": {"name": "bad2"}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}),
        json!({"metadata": {"name": "bad3"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 31500}]}}),
        json!({"metadata": {"name": "bad4"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}}),
    ];
    for v in cases {
        let e = create_svc(&api, v.clone()).await.unwrap_err();
        assert_eq!(code(e), 422, "{v}");
    }
    // A chosen free one works; deleting releases it for reuse.
    create_svc(
        &api,
        json!({"metadata": {"name": "mine"}, "spec": {"clusterIP": "10.96.0.50", "type": "NodePort",
        "ports": [{"port": 80, "nodePort": 30500}]}}),
    )
    .await
    .unwrap();
    api.delete("mine", &DeleteParams::default()).await.unwrap();
    create_svc(&api, json!({"metadata": {"name": "mine2"}, "spec": {"clusterIP": "10.96.0.50", "type": "NodePort",
        "ports": [{"port": 80, "nodePort": 30500}]}})).await.unwrap();
    // Type change NodePort -> ClusterIP releases the node port.
    api.patch(
        "mine2",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"type": "ClusterIP"}})),
    )
    .await
    .unwrap();
    create_svc(
        &api,
        json!({"metadata": {"name": "mine3"}, "spec": {"type": "NodePort",
        "ports": [{"port": 80, "nodePort": 30500}]}}),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn concurrent_creates_get_distinct_ips() {
    let c = start("10.96.0.0/12", None).await;
    let api: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let api = api.clone();
        tasks.spawn(async move {
            let s = create_svc(
                &api,
                json!({"metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}}),
            )
            .await
            .unwrap();
            s.spec.unwrap().cluster_ip.unwrap()
        });
    }
    let mut ips = HashSet::new();
    while let Some(ip) = tasks.join_next().await {
        assert!(ips.insert(ip.unwrap()));
    }
    assert_eq!(ips.len(), 1000);
}

#[tokio::test]
async fn dual_stack_policies() {
    let c = start("10.96.0.0/16,fd00:10::/108", None).await;
    let api: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let cases = [
        (json!({}), "SingleStack", vec!["IPv4"]),
        (
            json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"]}),
            "SingleStack",
            vec!["IPv6"],
        ),
        (
            json!({"ipFamilyPolicy": "PreferDualStack"}),
            "PreferDualStack",
            vec!["IPv4", "IPv6"],
        ),
        (
            json!({"ipFamilyPolicy": "RequireDualStack"}),
            "RequireDualStack",
            vec!["IPv4", "IPv6"],
        ),
        (
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
            "PreferDualStack",
            vec!["IPv6", "IPv4"],
        ),
    ];
    for (i, (extra, policy, fams)) in cases.into_iter().enumerate() {
        let mut spec = json!({"ports": [{"port": 80}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let s = create_svc(
            &api,
            json!({"metadata": {"name": format!("d{i}")}, "spec": spec}),
        )
        .await
        .unwrap();
        let spec = s.spec.unwrap();
        assert_eq!(spec.ip_family_policy.as_deref(), Some(policy), "case {i}");
        assert_eq!(
            spec.ip_families.as_deref().unwrap(),
            fams.as_slice(),
            "case {i}"
        );
        let ips = spec.cluster_ips.unwrap();
        assert_eq!(ips.len(), fams.len());
        for (ip, f) in ips.iter().zip(&fams) {
            assert_eq!(ip.contains(':'), *f == "IPv6", "case {i}: {ip}");
        }
        assert_eq!(spec.cluster_ip.as_ref(), ips.first());
    }
    // Upgrade SingleStack -> PreferDualStack adds the second family.
    let s = api
        .patch(
            "d0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ipFamilyPolicy": "PreferDualStack"}})),
        )
        .await
        .unwrap();
    assert_eq!(s.spec.unwrap().cluster_ips.unwrap().len(), 2);
    // On a single-stack cluster RequireDualStack is refused.
    let c1 = start("10.96.0.0/16", None).await;
    let api1: Api<Service> = Api::namespaced(c1.client.clone(), "default");
    let e = create_svc(&api1, json!({"metadata": {"name": "r"}, "spec": {"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}}))
        .await
        .unwrap_err();
    assert_eq!(code(e), 422);
}

#[tokio::test]
async fn endpoint_slices_and_endpoints() {
    let c = start("10.96.0.0/12", Some(args())).await;
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let eps: Api<Endpoints> = Api::namespaced(c.client.clone(), "default");
    create_svc(
        &svcs,
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await
    .unwrap();
    let mut want = Vec::new();
    for i in 0..250 {
        let ip = format!("10.244.{}.{}", i / 200, i % 200 + 1);
        make_pod(
            &pods,
            &format!("web-{i}"),
            &ip,
            json!({"app": "web"}),
            true,
            "n1",
        )
        .await;
        want.push(ip);
    }
    want.sort();
    // Unselected pod.
    make_pod(
        &pods,
        "other",
        "10.244.9.9",
        json!({"app": "other"}),
        true,
        "n1",
    )
    .await;
    let got = eventually("250 endpoints in slices", 30, async || {
        let s = slices_of(&slices, "web").await;
        (slice_ips(&s) == want).then_some(s)
    })
    .await;
    assert_eq!(got.len(), 3);
    for s in &got {
        assert!(s.endpoints.as_ref().unwrap().len() <= 100);
        let l = s.metadata.labels.as_ref().unwrap();
        assert_eq!(
            l["endpointslice.kubernetes.io/managed-by"],
            "endpointslice-controller.k8s.io"
        );
        let o = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str(), o.controller),
            ("Service", "web", Some(true))
        );
        assert_eq!(s.ports.as_ref().unwrap()[0].port, Some(8080));
    }
    // One pod turns unready: exactly one slice changes.
    let before: BTreeMap<String, String> = got
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap(),
                s.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect();
    set_pod_status(&pods, "web-7", "10.244.0.8", false).await;
    let after = eventually("unready endpoint", 10, async || {
        let s = slices_of(&slices, "web").await;
        let e = s
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .find(|e| e.addresses[0] == "10.244.0.8")?
            .clone();
        (e.conditions.as_ref()?.ready == Some(false)).then_some(s)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let changed = after
        .iter()
        .filter(|s| {
            before.get(s.metadata.name.as_ref().unwrap()) != s.metadata.resource_version.as_ref()
        })
        .count();
    assert_eq!(changed, 1);
    let e = after
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .find(|e| e.addresses[0] == "10.244.0.8")
        .unwrap();
    let cnd = e.conditions.as_ref().unwrap();
    assert_eq!(
        (cnd.ready, cnd.serving, cnd.terminating),
        (Some(false), Some(false), Some(false))
    );

    // Endpoints: 249 ready + 1 not ready.
    let ep = eventually("endpoints", 10, async || {
        let e = eps.get("web").await.ok()?;
        let s = &e.subsets.as_ref()?[0];
        (s.addresses.as_ref()?.len() == 249 && s.not_ready_addresses.as_ref()?.len() == 1)
            .then_some(e)
    })
    .await;
    assert!(ep.metadata.annotations.is_none());

    // A terminating pod (bound to a node, so deletion is graceful): serving, terminating, not ready.
    pods.delete("web-3", &DeleteParams::default())
        .await
        .unwrap();
    eventually("terminating endpoint", 10, async || {
        let s = slices_of(&slices, "web").await;
        let e = s
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .find(|e| e.addresses[0] == "10.244.0.4")?
            .clone();
        let c = e.conditions?;
        (c.ready == Some(false) && c.serving == Some(true) && c.terminating == Some(true))
            .then_some(())
    })
    .await;
    // Slices of other managers are left alone.
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-foreign", "labels": {"kubernetes.io/service-name": "web",
                     "endpointslice.kubernetes.io/managed-by": "mesh-controller"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.99.0.1"]}]}))
    .unwrap();
    slices
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(slices.get("web-foreign").await.is_ok());
}

#[tokio::test]
async fn endpoints_over_capacity_and_headless_hostname() {
    let c = start(
        "10.96.0.0/12",
        Some(ServiceArgs {
            max_endpoints_per_slice: 1000,
            ..args()
        }),
    )
    .await;
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let eps: Api<Endpoints> = Api::namespaced(c.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    create_svc(&svcs, json!({"metadata": {"name": "big"}, "spec": {"selector": {"app": "big"}, "ports": [{"port": 80}]}})).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1500 {
        let pods = pods.clone();
        tasks.spawn(async move {
            make_pod(
                &pods,
                &format!("big-{i}"),
                &format!("10.245.{}.{}", i / 200, i % 200 + 1),
                json!({"app": "big"}),
                true,
                "n1",
            )
            .await;
        });
    }
    while tasks.join_next().await.is_some() {}
    let e = eventually("truncated endpoints", 60, async || {
        let e = eps.get("big").await.ok()?;
        let n: usize = e
            .subsets
            .iter()
            .flatten()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum();
        (n == 1000).then_some(e)
    })
    .await;
    assert_eq!(
        e.metadata.annotations.unwrap()["endpoints.kubernetes.io/over-capacity"],
        "truncated"
    );
    // Slices still carry all 1500 (two slices of <= 1000).
    eventually("1500 in slices", 60, async || {
        (slice_ips(&slices_of(&slices, "big").await).len() == 1500).then_some(())
    })
    .await;

    // Headless service: hostname for the pod with hostname + subdomain.
    create_svc(&svcs, json!({"metadata": {"name": "hs"}, "spec": {"clusterIP": "None", "selector": {"app": "hs"}, "ports": [{"port": 80}]}})).await.unwrap();
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "hs-0", "labels": {"app": "hs"}},
        "spec": {"hostname": "host-0", "subdomain": "hs", "nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    set_pod_status(&pods, "hs-0", "10.246.0.1", true).await;
    eventually("hostname", 10, async || {
        let s = slices_of(&slices, "hs").await;
        let e = s
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .next()?
            .clone();
        (e.hostname.as_deref() == Some("host-0")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn mirroring_and_skip_rules() {
    let c = start("10.96.0.0/12", Some(args())).await;
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let eps: Api<Endpoints> = Api::namespaced(c.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let endpoints = |name: &str, labels: Value, annotations: Value| -> Endpoints {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "subsets": [{"addresses": [{"ip": "192.168.5.1"}, {"ip": "192.168.5.2"}],
                         "ports": [{"name": "http", "port": 8080}]}]}),
        )
        .unwrap()
    };
    // Mirrored.
    create_svc(
        &svcs,
        json!({"metadata": {"name": "ext"}, "spec": {"ports": [{"name": "http", "port": 80}]}}),
    )
    .await
    .unwrap();
    eps.create(
        &PostParams::default(),
        &endpoints("ext", json!({}), json!({})),
    )
    .await
    .unwrap();
    let s = eventually("mirrored slice", 10, async || {
        let s = slices_of(&slices, "ext").await;
        (slice_ips(&s) == ["192.168.5.1", "192.168.5.2"]).then_some(s)
    })
    .await;
    assert_eq!(
        s[0].metadata.labels.as_ref().unwrap()["endpointslice.kubernetes.io/managed-by"],
        "endpointslicemirroring-controller.k8s.io"
    );
    // Skip rules: label, leader annotation, no Service, Service with selector.
    create_svc(
        &svcs,
        json!({"metadata": {"name": "skip1"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .await
    .unwrap();
    eps.create(
        &PostParams::default(),
        &endpoints(
            "skip1",
            json!({"endpointslice.kubernetes.io/skip-mirror": "true"}),
            json!({}),
        ),
    )
    .await
    .unwrap();
    create_svc(
        &svcs,
        json!({"metadata": {"name": "skip2"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .await
    .unwrap();
    eps.create(
        &PostParams::default(),
        &endpoints(
            "skip2",
            json!({}),
            json!({"control-plane.alpha.kubernetes.io/leader": "{}"}),
        ),
    )
    .await
    .unwrap();
    eps.create(
        &PostParams::default(),
        &endpoints("skip3", json!({}), json!({})),
    )
    .await
    .unwrap();
    create_svc(&svcs, json!({"metadata": {"name": "skip4"}, "spec": {"selector": {"app": "none"}, "ports": [{"port": 80}]}})).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in ["skip1", "skip2", "skip3", "skip4"] {
        let s = slices_of(&slices, name).await;
        assert!(
            s.iter().all(
                |s| s.metadata.labels.as_ref().unwrap()["endpointslice.kubernetes.io/managed-by"]
                    != "endpointslicemirroring-controller.k8s.io"
            ),
            "{name} was mirrored"
        );
    }
}

#[tokio::test]
async fn topology_hints_and_safeguards() {
    let c = start("10.96.0.0/12", Some(args())).await;
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let nodes: Api<Node> = Api::all(c.client.clone());
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    make_node(&nodes, "na", Some("a"), "4").await;
    make_node(&nodes, "nb", Some("b"), "2").await;
    make_node(&nodes, "nc", Some("c"), "2000m").await;
    create_svc(&svcs, json!({"metadata": {"name": "topo", "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
        "spec": {"selector": {"app": "topo"}, "ports": [{"port": 80}]}})).await.unwrap();
    for (i, node) in ["na", "na", "nb", "nb", "nb", "nc", "nc", "nc"]
        .iter()
        .enumerate()
    {
        make_pod(
            &pods,
            &format!("topo-{i}"),
            &format!("10.247.0.{}", i + 1),
            json!({"app": "topo"}),
            true,
            node,
        )
        .await;
    }
    let counts = eventually("hints 4/2/2", 20, async || {
        let s = slices_of(&slices, "topo").await;
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for e in s.iter().flat_map(|s| s.endpoints.iter().flatten()) {
            let z = e.hints.as_ref()?.for_zones.as_ref()?[0].name.clone();
            *m.entry(z).or_insert(0) += 1;
        }
        (m.values().sum::<usize>() == 8).then_some(m)
    })
    .await;
    assert_eq!(
        counts,
        BTreeMap::from([("a".into(), 4), ("b".into(), 2), ("c".into(), 2)])
    );
    let no_hints = async |what: &str| {
        eventually(what, 20, async || {
            let s = slices_of(&slices, "topo").await;
            s.iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .all(|e| e.hints.is_none())
                .then_some(())
        })
        .await;
        eventually("hints-disabled event", 10, async || {
            let l = events.list(&ListParams::default()).await.ok()?;
            l.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("TopologyAwareHintsDisabled")
                        && e.involved_object.name.as_deref() == Some("topo")
                })
                .then_some(())
        })
        .await;
    };
    // Safeguard: a node without a zone.
    make_node(&nodes, "nx", None, "1").await;
    no_hints("no hints: node without zone").await;
    nodes.delete("nx", &DeleteParams::default()).await.unwrap();
    eventually("hints back", 20, async || {
        let s = slices_of(&slices, "topo").await;
        s.iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .all(|e| e.hints.is_some())
            .then_some(())
    })
    .await;
    // Safeguard: too few endpoints (2 ready for 3 zones).
    for i in 2..8 {
        set_pod_status(
            &pods,
            &format!("topo-{i}"),
            &format!("10.247.0.{}", i + 1),
            false,
        )
        .await;
    }
    no_hints("no hints: too few endpoints").await;
}

/// Pods and a Service that exist before the controller starts: the pods of the initial list
/// are not mapped to Services one by one (the sync of every Service after "synced" covers
/// them), so the Service's slice must still list them; a pod created after sync is mapped.
#[tokio::test]
async fn objects_listed_at_start_and_pods_after_sync() {
    let cl = start("10.96.0.0/16", None).await;
    let svcs: Api<Service> = Api::namespaced(cl.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(cl.client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(cl.client.clone(), "default");
    create_svc(
        &svcs,
        json!({"metadata": {"name": "early"},
               "spec": {"selector": {"app": "early"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
    )
    .await
    .unwrap();
    make_pod(&pods, "e1", "10.1.0.1", json!({"app": "early"}), true, "").await;
    make_pod(
        &pods,
        "other",
        "10.1.0.9",
        json!({"app": "other"}),
        true,
        "",
    )
    .await;
    let (c, s) = (cl.client.clone(), cl.stop.clone());
    tokio::spawn(async move { services::run(c, args(), s).await });
    eventually("the listed pod in the slice", 30, async || {
        let ips = slice_ips(&slices_of(&slices, "early").await);
        (ips == ["10.1.0.1"]).then_some(())
    })
    .await;
    make_pod(&pods, "e2", "10.1.0.2", json!({"app": "early"}), true, "").await;
    eventually("a pod created after sync in the slice", 30, async || {
        let ips = slice_ips(&slices_of(&slices, "early").await);
        (ips == ["10.1.0.1", "10.1.0.2"]).then_some(())
    })
    .await;
}
