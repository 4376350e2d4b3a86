//! The model upstream's NetworkPolicy e2e tests probe: namespaces x, y and z, pods a, b and c
//! in each, serving ports 80 and 81 over TCP, UDP and SCTP with named ports
//! `serve-<port>-<proto>`. Used by tests, benchmarks and `ferry netpol matrix` examples.

use std::net::{IpAddr, Ipv4Addr};

use crate::model::{
    Labels, Model, NamedPort, PodInfo, PodKey, Policy, ProjectError, Proto, project_policy,
};

/// The e2e namespaces and pods.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The 3×3 model on `nodes` nodes (pods spread round-robin); pod `x/a` is 10.0.0.1, `y/b`
/// 10.0.1.2 and so on; node `n<i>` has 198.18.0.<i+1>.
pub fn e2e_model(nodes: usize) -> Model {
    let mut m = Model::default();
    let nodes = nodes.max(1);
    for i in 0..nodes {
        m.nodes.insert(
            format!("n{i}"),
            vec![IpAddr::V4(Ipv4Addr::new(198, 18, 0, (i + 1) as u8))],
        );
    }
    let mut n = 0usize;
    for (ni, ns) in NAMESPACES.iter().enumerate() {
        m.put_namespace(ns, labels(&[("ns", ns)]));
        for (pi, pod) in PODS.iter().enumerate() {
            let mut ports = Vec::new();
            for port in [80u16, 81] {
                for proto in Proto::ALL {
                    ports.push(NamedPort {
                        name: format!("serve-{port}-{}", proto.as_str().to_ascii_lowercase()),
                        port,
                        proto,
                    });
                }
            }
            m.pods.insert(
                PodKey::new(*ns, *pod),
                PodInfo {
                    labels: labels(&[("pod", pod)]).into(),
                    ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, ni as u8, (pi + 1) as u8))],
                    node: Some(format!("n{}", n % nodes).into()),
                    host_network: false,
                    ports,
                },
            );
            n += 1;
        }
    }
    m
}

/// Parses a NetworkPolicy written as JSON (tests and examples).
pub fn policy(v: serde_json::Value) -> Result<Policy, ProjectError> {
    let np: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(v)
        .map_err(|e| ProjectError::Selector("json".into(), e.to_string()))?;
    project_policy(&np)
}

/// Adds a policy to the model.
pub fn with(mut m: Model, p: Policy) -> Model {
    m.policies.insert(p.key(), p);
    m
}
