//! Node IPAM with ClusterCIDRConfig and the classic mode, against the real API server.

mod lifecycle_common;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use lifecycle_common::*;
use serde_json::{Value, json};

fn ccc(name: &str, v4: Option<(&str, i32)>, v6: Option<(&str, i32)>, labels: Value) -> Value {
    let mut spec = json!({"nodeSelector": {"matchLabels": labels}});
    if let Some((c, m)) = v4 {
        spec["ipv4"] = json!({"cidr": c, "perNodeMaskSize": m});
    }
    if let Some((c, m)) = v6 {
        spec["ipv6"] = json!({"cidr": c, "perNodeMaskSize": m});
    }
    json!({"apiVersion": "baremetal.cluster.gke.io/v1alpha1", "kind": "ClusterCIDRConfig",
        "metadata": {"name": name}, "spec": spec})
}

async fn node(c: &Cluster, name: &str, labels: Value) {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
        .expect("node");
    Api::<Node>::all(c.client.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
}

async fn cidrs(c: &Cluster, name: &str, secs: u64) -> Option<Vec<String>> {
    let api: Api<Node> = Api::all(c.client.clone());
    eventually(secs, || async {
        let n = api.get(name).await.ok()?;
        let v = n.spec?.pod_cidrs?;
        (!v.is_empty()).then_some(v)
    })
    .await
}

#[tokio::test]
async fn cluster_cidr_config_rules_in_order() {
    let c = start().await;
    // Rule 1: most matching labels.
    create(
        &c.client,
        ccc(
            "r1-one",
            Some(("10.1.0.0/16", 24)),
            None,
            json!({"r1": "a"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "r1-two",
            Some(("10.2.0.0/16", 24)),
            None,
            json!({"r1": "a", "rack": "rack1"}),
        ),
    )
    .await;
    node(&c, "n1", json!({"r1": "a", "rack": "rack1"})).await;
    assert_eq!(cidrs(&c, "n1", 10).await.expect("n1"), vec!["10.2.0.0/24"]);
    // Rule 2: fewest allocatable pod CIDRs.
    create(
        &c.client,
        ccc(
            "r2-four",
            Some(("192.168.0.0/20", 22)),
            None,
            json!({"r2": "a"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "r2-one",
            Some(("10.3.0.0/16", 16)),
            None,
            json!({"r2": "a"}),
        ),
    )
    .await;
    node(&c, "n2", json!({"r2": "a"})).await;
    assert_eq!(cidrs(&c, "n2", 10).await.expect("n2"), vec!["10.3.0.0/16"]);
    // Rule 3: smallest per-node block (both hold 16 blocks).
    create(
        &c.client,
        ccc("r3-25", Some(("10.4.0.0/21", 25)), None, json!({"r3": "a"})),
    )
    .await;
    create(
        &c.client,
        ccc("r3-27", Some(("10.5.0.0/23", 27)), None, json!({"r3": "a"})),
    )
    .await;
    node(&c, "n3", json!({"r3": "a"})).await;
    assert_eq!(cidrs(&c, "n3", 10).await.expect("n3"), vec!["10.5.0.0/27"]);
    // Rule 4: lowest alphanumeric label.
    create(
        &c.client,
        ccc(
            "r4-it",
            Some(("10.6.0.0/16", 24)),
            None,
            json!({"node.kubernetes.io/instance-type": "r4"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "r4-host",
            Some(("10.7.0.0/16", 24)),
            None,
            json!({"kubernetes.io/hostname": "n4"}),
        ),
    )
    .await;
    node(
        &c,
        "n4",
        json!({"node.kubernetes.io/instance-type": "r4", "kubernetes.io/hostname": "n4"}),
    )
    .await;
    assert_eq!(cidrs(&c, "n4", 10).await.expect("n4"), vec!["10.7.0.0/24"]);
    // Rule 5: lowest IPv4 CIDR; configs may overlap.
    create(
        &c.client,
        ccc(
            "r5-high",
            Some(("10.9.0.0/16", 24)),
            None,
            json!({"r5": "a"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "r5-low",
            Some(("10.8.0.0/15", 23)),
            None,
            json!({"r5": "a"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "r5-mid",
            Some(("10.8.0.0/16", 24)),
            None,
            json!({"r5": "a"}),
        ),
    )
    .await;
    // r5-low holds 256 /23 blocks like the others hold 256 /24 blocks, but its blocks are bigger:
    // rule 3 puts it last; r5-mid (10.8.0.0) wins over r5-high (10.9.0.0) by rule 5.
    node(&c, "n5", json!({"r5": "a"})).await;
    assert_eq!(cidrs(&c, "n5", 10).await.expect("n5"), vec!["10.8.0.0/24"]);
}

#[tokio::test]
async fn dual_stack_fallback_and_late_config() {
    let c = start().await;
    create(
        &c.client,
        ccc(
            "small",
            Some(("10.20.0.0/24", 25)),
            Some(("fd00:20::/120", 121)),
            json!({"pool": "x"}),
        ),
    )
    .await;
    create(
        &c.client,
        ccc(
            "next",
            Some(("10.21.0.0/16", 24)),
            Some(("fd00:21::/112", 120)),
            json!({"pool": "x"}),
        ),
    )
    .await;
    for n in ["a1", "a2", "a3"] {
        node(&c, n, json!({"pool": "x"})).await;
    }
    let mut got = Vec::new();
    for n in ["a1", "a2", "a3"] {
        got.push(cidrs(&c, n, 10).await.expect("cidrs"));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            vec!["10.20.0.0/25".to_string(), "fd00:20::/121".to_string()],
            vec!["10.20.0.128/25".to_string(), "fd00:20::80/121".to_string()],
            vec!["10.21.0.0/24".to_string(), "fd00:21::/120".to_string()],
        ],
        "dual stack, then the next config once the best one is exhausted"
    );
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n = nodes.get("a1").await.expect("a1");
    let spec = n.spec.expect("spec");
    assert_eq!(
        spec.pod_cidr.as_deref(),
        spec.pod_cidrs.as_ref().map(|v| v[0].as_str())
    );
    // A node without a matching config gets nothing until one appears.
    node(&c, "lonely", json!({"pool": "y"})).await;
    assert!(cidrs(&c, "lonely", 2).await.is_none());
    create(
        &c.client,
        ccc(
            "for-y",
            Some(("10.22.0.0/16", 24)),
            None,
            json!({"pool": "y"}),
        ),
    )
    .await;
    assert_eq!(
        cidrs(&c, "lonely", 10).await.expect("lonely"),
        vec!["10.22.0.0/24"]
    );
    // Released when the node goes away: the block is handed out again.
    nodes
        .delete("lonely", &DeleteParams::default())
        .await
        .expect("delete");
    node(&c, "again", json!({"pool": "y"})).await;
    assert_eq!(
        cidrs(&c, "again", 10).await.expect("again"),
        vec!["10.22.0.0/24"]
    );
}

#[tokio::test]
async fn validation_and_immutability() {
    let c = start().await;
    let gvk = kube::api::GroupVersionKind::gvk(
        "baremetal.cluster.gke.io",
        "v1alpha1",
        "ClusterCIDRConfig",
    );
    let (ar, _) = kube::discovery::pinned_kind(&c.client, &gvk)
        .await
        .expect("served");
    let api: Api<kube::api::DynamicObject> = Api::all_with(c.client.clone(), &ar);
    let bad: kube::api::DynamicObject = serde_json::from_value(ccc(
        "bad",
        Some(("10.0.0.0/16", 24)),
        Some(("fd00::/112", 116)),
        json!({}),
    ))
    .expect("obj");
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("unequal host bits accepted: {other:?}"),
    }
    create(
        &c.client,
        ccc("good", Some(("10.0.0.0/16", 24)), None, json!({})),
    )
    .await;
    let patch = json!({"spec": {"ipv4": {"cidr": "10.1.0.0/16", "perNodeMaskSize": 24}}});
    match api
        .patch(
            "good",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("spec change accepted: {other:?}"),
    }
}

#[tokio::test]
async fn classic_mode_avoids_service_range() {
    let c = start_with(args_from(&[
        "--cluster-cidr=10.96.0.0/11,fd00:10:244::/56",
        "--node-ipam-excluded-cidrs=10.96.0.0/12",
    ]))
    .await;
    node(&c, "c1", json!({})).await;
    node(&c, "c2", json!({})).await;
    let mut got = vec![
        cidrs(&c, "c1", 10).await.expect("c1"),
        cidrs(&c, "c2", 10).await.expect("c2"),
    ];
    got.sort();
    assert_eq!(
        got,
        vec![
            vec!["10.112.0.0/24".to_string(), "fd00:10:244::/64".to_string()],
            vec![
                "10.112.1.0/24".to_string(),
                "fd00:10:244:1::/64".to_string()
            ],
        ]
    );
}

/// Seed 001's per-cluster config: no `nodeSelector` applies to every node. A node that no
/// config can serve gets upstream's `CIDRNotAvailable` Event.
#[tokio::test]
async fn config_without_selector_and_cidr_not_available() {
    let c = start().await;
    let mut all = ccc("cluster-wide", Some(("10.30.0.0/23", 24)), None, json!({}));
    all["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("nodeSelector");
    create(&c.client, all).await;
    node(&c, "w1", json!({"any": "thing"})).await;
    node(&c, "w2", json!({})).await;
    let mut got = vec![
        cidrs(&c, "w1", 10).await.expect("w1"),
        cidrs(&c, "w2", 10).await.expect("w2"),
    ];
    got.sort();
    assert_eq!(got, vec![vec!["10.30.0.0/24"], vec!["10.30.1.0/24"]]);
    // The config is exhausted: the third node gets nothing, and an Event says so.
    node(&c, "w3", json!({})).await;
    assert!(cidrs(&c, "w3", 2).await.is_none());
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    let ev = eventually(10, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("CIDRNotAvailable")
                    && e.involved_object.name.as_deref() == Some("w3")
            })
    })
    .await
    .expect("CIDRNotAvailable event");
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(
        ev.message.as_deref(),
        Some("Node w3 status is now: CIDRNotAvailable")
    );
}

/// KEP-2593 / upstream `TestSyncClusterCIDRDeleteWithNodesAssociated`: a config that nodes use
/// carries a finalizer; deleting it leaves it Terminating and unused for new nodes until those
/// nodes are gone.
#[tokio::test]
async fn config_deletion_waits_for_its_nodes() {
    let c = start().await;
    create(
        &c.client,
        ccc(
            "doomed",
            Some(("10.40.0.0/16", 24)),
            None,
            json!({"p": "d"}),
        ),
    )
    .await;
    let configs: Api<kube::api::DynamicObject> = Api::all_with(
        c.client.clone(),
        &kube::api::ApiResource {
            group: "baremetal.cluster.gke.io".into(),
            version: "v1alpha1".into(),
            api_version: "baremetal.cluster.gke.io/v1alpha1".into(),
            kind: "ClusterCIDRConfig".into(),
            plural: "clustercidrconfigs".into(),
        },
    );
    let fin = "networking.k8s.io/cluster-cidr-finalizer";
    eventually(10, || async {
        let o = configs.get("doomed").await.ok()?;
        o.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == fin)
            .then_some(())
    })
    .await
    .expect("finalizer added");
    node(&c, "d1", json!({"p": "d"})).await;
    assert_eq!(cidrs(&c, "d1", 10).await.expect("d1"), vec!["10.40.0.0/24"]);
    configs
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete config");
    // Still there, Terminating, while d1 holds a block from it.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let o = configs.get("doomed").await.expect("still there");
    assert!(o.metadata.deletion_timestamp.is_some());
    // A new node is not served from a Terminating config.
    node(&c, "d2", json!({"p": "d"})).await;
    assert!(cidrs(&c, "d2", 2).await.is_none());
    // Once its nodes are gone, the config goes.
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .delete("d1", &DeleteParams::default())
        .await
        .expect("delete d1");
    eventually(15, || async {
        configs.get("doomed").await.err().map(|_| ())
    })
    .await
    .expect("config removed once unused");
}
