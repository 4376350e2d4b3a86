//! Store-backed allocation tests (RedbStore in a temp dir).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;

use super::*;

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let s: Arc<dyn Store> =
        Arc::new(ferry_store::RedbStore::open(&dir.path().join("s.redb")).unwrap());
    (dir, s)
}

fn svc(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
           "spec": spec})
}

fn alloc(cidrs: &str, ports: &str) -> ServiceAlloc {
    ServiceAlloc {
        cidrs: parse_service_cidrs(cidrs).unwrap(),
        node_ports: ports.parse().unwrap(),
    }
}

#[tokio::test]
async fn cluster_ips_distinct_and_in_range_until_full() {
    let (_d, st) = store();
    // /28: 14 usable, band 14 (whole range static) -> all 14 allocatable, then full.
    let a = alloc("10.0.0.0/28", "30000-30010");
    let mut seen = HashSet::new();
    for i in 0..14 {
        let mut o = svc(
            &format!("s{i}"),
            json!({"type": "ClusterIP", "ports": [{"port": 80}]}),
        );
        let t = a.allocate_create(st.as_ref(), &mut o, false).await.unwrap();
        t.commit().await;
        let ip = o["spec"]["clusterIP"].as_str().unwrap().to_string();
        assert_eq!(o["spec"]["clusterIPs"], json!([ip]));
        assert_eq!(o["spec"]["ipFamilies"], json!(["IPv4"]));
        assert_eq!(o["spec"]["ipFamilyPolicy"], json!("SingleStack"));
        let c: Cidr = "10.0.0.0/28".parse().unwrap();
        assert!(c.index_of(&ip.parse().unwrap()).is_some());
        assert!(seen.insert(ip));
    }
    let mut o = svc("full", json!({"ports": [{"port": 80}]}));
    let e = a
        .allocate_create(st.as_ref(), &mut o, false)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, 500);
}

#[tokio::test]
async fn dynamic_prefers_upper_band() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24", "30000-32767"); // band 16
    for i in 0..50 {
        let mut o = svc(&format!("s{i}"), json!({"ports": [{"port": 80}]}));
        a.allocate_create(st.as_ref(), &mut o, false)
            .await
            .unwrap()
            .commit()
            .await;
        let ip: IpAddr = o["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        let c: Cidr = "10.0.0.0/24".parse().unwrap();
        assert!(c.index_of(&ip).unwrap() >= 16, "{ip}");
    }
}

#[tokio::test]
async fn specific_ip_checks() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24", "30000-32767");
    let mut o = svc(
        "a",
        json!({"clusterIP": "10.0.0.10", "clusterIPs": ["10.0.0.10"]}),
    );
    a.allocate_create(st.as_ref(), &mut o, false)
        .await
        .unwrap()
        .commit()
        .await;
    let cases = [
        ("10.0.0.10", "already allocated"),
        ("10.0.1.10", "not in the valid range"),
        ("10.0.0.255", "not in the valid range"),
        ("fd00::1", "not configured"),
    ];
    for (ip, msg) in cases {
        let mut o = svc("b", json!({"clusterIP": ip, "clusterIPs": [ip]}));
        let e = a
            .allocate_create(st.as_ref(), &mut o, false)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 422, "{ip}");
        assert!(e.message.contains(msg), "{ip}: {}", e.message);
    }
}

#[tokio::test]
async fn dual_stack_policies() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24,fd00::/120", "30000-32767");
    let cases = [
        (json!({}), "SingleStack", json!(["IPv4"]), 1),
        (
            json!({"ipFamilyPolicy": "PreferDualStack"}),
            "PreferDualStack",
            json!(["IPv4", "IPv6"]),
            2,
        ),
        (
            json!({"ipFamilyPolicy": "RequireDualStack"}),
            "RequireDualStack",
            json!(["IPv4", "IPv6"]),
            2,
        ),
        (
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
            "PreferDualStack",
            json!(["IPv6", "IPv4"]),
            2,
        ),
        (
            json!({"ipFamilies": ["IPv6"]}),
            "SingleStack",
            json!(["IPv6"]),
            1,
        ),
    ];
    for (i, (extra, policy, fams, n)) in cases.into_iter().enumerate() {
        let mut spec = json!({"ports": [{"port": 80}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let mut o = svc(&format!("s{i}"), spec);
        a.allocate_create(st.as_ref(), &mut o, false)
            .await
            .unwrap()
            .commit()
            .await;
        assert_eq!(o["spec"]["ipFamilyPolicy"], json!(policy), "case {i}");
        assert_eq!(o["spec"]["ipFamilies"], fams, "case {i}");
        let ips = strings(&o["spec"], "clusterIPs");
        assert_eq!(ips.len(), n, "case {i}");
        for (ip, f) in ips.iter().zip(fams.as_array().unwrap()) {
            let fam = Family::of(&ip.parse().unwrap());
            assert_eq!(fam.as_str(), f.as_str().unwrap());
        }
        assert_eq!(
            o["spec"]["clusterIP"].as_str(),
            ips.first().map(String::as_str)
        );
    }
}

#[tokio::test]
async fn headless_and_external_name_get_nothing() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24", "30000-32767");
    let mut o = svc(
        "h",
        json!({"clusterIP": "None", "clusterIPs": ["None"], "selector": {"a": "b"}}),
    );
    a.allocate_create(st.as_ref(), &mut o, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert_eq!(o["spec"]["clusterIPs"], json!(["None"]));
    let mut o = svc(
        "e",
        json!({"type": "ExternalName", "externalName": "example.com"}),
    );
    a.allocate_create(st.as_ref(), &mut o, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert!(o["spec"].get("clusterIP").is_none());
    let r = st.range(IP_PREFIX, RangeOptions::default()).await.unwrap();
    assert!(r.kvs.is_empty());
}

#[tokio::test]
async fn node_ports() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24", "30000-30099");
    let mut o = svc(
        "np",
        json!({"type": "NodePort", "ports": [
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "dns-udp", "port": 53, "protocol": "UDP"},
            {"name": "web", "port": 80, "protocol": "TCP", "nodePort": 30080}]}),
    );
    a.allocate_create(st.as_ref(), &mut o, false)
        .await
        .unwrap()
        .commit()
        .await;
    let p = &o["spec"]["ports"];
    assert_eq!(p[0]["nodePort"], p[1]["nodePort"]);
    assert_eq!(p[2]["nodePort"], json!(30080));
    // Taken and out of range -> 422.
    for (np, msg) in [(30080, "already allocated"), (40000, "valid range")] {
        let mut o = svc(
            "x",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}),
        );
        let e = a
            .allocate_create(st.as_ref(), &mut o, false)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 422);
        assert!(e.message.contains(msg), "{}", e.message);
        assert!(
            e.message.contains("spec.ports[0].nodePort"),
            "{}",
            e.message
        );
    }
    // LoadBalancer without node ports, but with a health check port.
    let mut o = svc(
        "lb",
        json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
               "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    );
    a.allocate_create(st.as_ref(), &mut o, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert!(o["spec"]["ports"][0].get("nodePort").is_none());
    assert!(o["spec"]["healthCheckNodePort"].as_i64().unwrap() >= 30000);
    // Release on delete.
    a.release(st.as_ref(), &o).await;
    let hc = o["spec"]["healthCheckNodePort"].as_i64().unwrap() as i32;
    assert!(st.get(&port_key(hc)).await.unwrap().is_none());
}

#[tokio::test]
async fn type_change_releases_node_ports_and_ips() {
    let (_d, st) = store();
    let a = alloc("10.0.0.0/24", "30000-30099");
    let mut old = svc(
        "s",
        json!({"type": "NodePort", "ports": [{"name": "w", "port": 80}]}),
    );
    a.allocate_create(st.as_ref(), &mut old, false)
        .await
        .unwrap()
        .commit()
        .await;
    let np = old["spec"]["ports"][0]["nodePort"].as_i64().unwrap() as i32;
    let ip: IpAddr = old["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
    // PUT without clusterIP/nodePort keeps them.
    let mut new = svc(
        "s",
        json!({"type": "NodePort", "ports": [{"name": "w", "port": 80}]}),
    );
    prepare_update(&mut new, &old);
    a.allocate_update(st.as_ref(), &mut new, &old, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert_eq!(new["spec"]["clusterIP"], old["spec"]["clusterIP"]);
    assert_eq!(new["spec"]["ports"][0]["nodePort"], json!(np));
    // NodePort -> ClusterIP frees the node port.
    let mut c = new.clone();
    c["spec"]["type"] = json!("ClusterIP");
    prepare_update(&mut c, &new);
    a.allocate_update(st.as_ref(), &mut c, &new, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert!(c["spec"]["ports"][0].get("nodePort").is_none());
    assert!(st.get(&port_key(np)).await.unwrap().is_none());
    assert!(st.get(&ip_key(&ip)).await.unwrap().is_some());
    // -> ExternalName frees the address.
    let mut e = c.clone();
    e["spec"]["type"] = json!("ExternalName");
    e["spec"]["externalName"] = json!("example.com");
    prepare_update(&mut e, &c);
    a.allocate_update(st.as_ref(), &mut e, &c, false)
        .await
        .unwrap()
        .commit()
        .await;
    assert!(e["spec"].get("clusterIPs").is_none());
    assert!(st.get(&ip_key(&ip)).await.unwrap().is_none());
}

#[tokio::test]
async fn concurrent_creates_get_distinct_ips() {
    let (_d, st) = store();
    let a = Arc::new(alloc("10.0.0.0/22", "30000-32767"));
    let mut tasks = Vec::new();
    for i in 0..300 {
        let (a, st) = (a.clone(), st.clone());
        tasks.push(tokio::spawn(async move {
            let mut o = svc(&format!("s{i}"), json!({"ports": [{"port": 80}]}));
            a.allocate_create(st.as_ref(), &mut o, false)
                .await
                .unwrap()
                .commit()
                .await;
            o["spec"]["clusterIP"].as_str().unwrap().to_string()
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        assert!(seen.insert(t.await.unwrap()));
    }
    assert_eq!(seen.len(), 300);
}

#[tokio::test]
async fn repair_frees_leaks_and_reclaims() {
    let (_d, st) = store();
    // A leaked key (no Service) and a Service whose key is missing.
    let leaked = Owner {
        namespace: "default".into(),
        name: "gone".into(),
        uid: "g".into(),
    };
    st.create("/registry/ipaddresses/10.0.0.7", leaked.bytes())
        .await
        .unwrap();
    let s = svc(
        "live",
        json!({"clusterIP": "10.0.0.8", "clusterIPs": ["10.0.0.8"]}),
    );
    st.create(
        "/registry/services/default/live",
        Bytes::from(serde_json::to_vec(&s).unwrap()),
    )
    .await
    .unwrap();
    let mut suspects = HashMap::new();
    let r1 = repair::repair_once(st.as_ref(), &mut suspects)
        .await
        .unwrap();
    assert!(r1.freed.is_empty());
    assert_eq!(
        r1.reclaimed,
        vec!["/registry/ipaddresses/10.0.0.8".to_string()]
    );
    let r2 = repair::repair_once(st.as_ref(), &mut suspects)
        .await
        .unwrap();
    assert_eq!(r2.freed, vec!["/registry/ipaddresses/10.0.0.7".to_string()]);
}
