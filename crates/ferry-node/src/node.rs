//! Node registration, status heartbeat and the node Lease in `kube-node-lease`.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the Node object says about this agent.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub name: String,
    pub ips: Vec<IpAddr>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub port: u16,
    pub cpus: u64,
    pub memory_bytes: u64,
    pub max_pods: u32,
    pub labels: Vec<(String, String)>,
    /// Annotations set on the Node (e.g. `ferry.dev/agent-endpoint`).
    pub annotations: Vec<(String, String)>,
    /// The pod network is configured (the node has its pod CIDR); the node is NotReady until then.
    pub network_ready: bool,
}

/// Total memory (`sysinfo(2)`: what `/proc/meminfo` shows as `MemTotal`), in bytes.
pub fn host_memory() -> u64 {
    let info = rustix::system::sysinfo();
    info.totalram.saturating_mul(u64::from(info.mem_unit))
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn micro_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Labels kubelet puts on its Node.
pub fn node_labels(f: &NodeFacts) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("kubernetes.io/hostname".into(), json!(f.name));
    m.insert("kubernetes.io/os".into(), json!("linux"));
    m.insert("beta.kubernetes.io/os".into(), json!("linux"));
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    m.insert("kubernetes.io/arch".into(), json!(arch));
    m.insert("beta.kubernetes.io/arch".into(), json!(arch));
    if let Some(z) = &f.zone {
        m.insert("topology.kubernetes.io/zone".into(), json!(z));
    }
    if let Some(r) = &f.region {
        m.insert("topology.kubernetes.io/region".into(), json!(r));
    }
    for (k, v) in &f.labels {
        m.insert(k.clone(), json!(v));
    }
    m
}

/// The Node status this agent reports.
pub fn node_status(f: &NodeFacts, transition: &str) -> Value {
    let hb = now();
    let mut addresses: Vec<Value> = f
        .ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip.to_string()}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": f.name}));
    let resources = json!({
        "cpu": f.cpus.to_string(),
        "memory": format!("{}Ki", f.memory_bytes / 1024),
        "pods": f.max_pods.to_string(),
        "ephemeral-storage": "10Gi",
    });
    let cond = |t: &str, status: &str, reason: &str, msg: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": msg,
               "lastHeartbeatTime": hb, "lastTransitionTime": transition})
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    json!({
        "addresses": addresses,
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            if f.network_ready {
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")
            } else {
                cond(
                    "Ready",
                    "False",
                    "KubeletNotReady",
                    "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:the node has no pod CIDR yet",
                )
            },
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": f.port}},
        "nodeInfo": {
            "machineID": read_trim("/etc/machine-id"),
            "systemUUID": read_trim("/etc/machine-id"),
            "bootID": read_trim("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": rustix::system::uname().release().to_string_lossy(),
            "osImage": "Linux",
            "containerRuntimeVersion": "ferry://0.1.0",
            "kubeletVersion": "v1.32.0-ferry",
            "kubeProxyVersion": "v1.32.0-ferry",
            "operatingSystem": "linux",
            "architecture": arch,
        },
    })
}

/// Creates or adopts the Node, then reports status. Returns the Node as stored.
pub async fn register(client: &kube::Client, f: &NodeFacts) -> crate::error::Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let transition = now();
    let mut annotations = serde_json::Map::new();
    annotations.insert("node.alpha.kubernetes.io/ttl".into(), json!("0"));
    for (k, v) in &f.annotations {
        annotations.insert(k.clone(), json!(v));
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f.name, "labels": node_labels(f),
            "annotations": annotations},
        "spec": {},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = json!({"metadata": {"labels": node_labels(f), "annotations": annotations}});
            nodes
                .patch(&f.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(e) => return Err(e.into()),
    }
    let status = json!({"status": node_status(f, &transition)});
    Ok(nodes
        .patch_status(&f.name, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

/// Logs an API error of the agent: a refusal (401/403: the node's identity lacks a permission,
/// or NodeRestriction refused the write) at warn, anything else (a conflict, a restarting API
/// server) at debug.
pub fn log_api_error(what: &str, e: &kube::Error) {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => tracing::warn!("{what}: {e}"),
        _ => tracing::debug!("{what}: {e}"),
    }
}

async fn ensure_lease_namespace(client: &kube::Client) {
    let nss: Api<Namespace> = Api::all(client.clone());
    if let Ok(None) = nss.get_opt("kube-node-lease").await {
        let ns: Result<Namespace, _> =
            serde_json::from_value(json!({"metadata": {"name": "kube-node-lease"}}));
        if let Ok(ns) = ns {
            let _ = nss.create(&PostParams::default(), &ns).await;
        }
    }
}

/// Renews the node Lease every `interval` and the Node status every `status_every`, until
/// `stop`.
pub async fn heartbeat(
    client: kube::Client,
    f: NodeFacts,
    node_uid: Option<String>,
    interval: Duration,
    status_every: Duration,
    stop: CancellationToken,
) {
    ensure_lease_namespace(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client.clone());
    let transition = now();
    let mut last_status = tokio::time::Instant::now();
    loop {
        let mut lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": f.name, "leaseDurationSeconds": 40, "renewTime": micro_now()},
        });
        if let Some(uid) = &node_uid {
            lease["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": f.name, "uid": uid}]);
        }
        let pp = PatchParams::apply("ferry-agent").force();
        if let Err(e) = leases.patch(&f.name, &pp, &Patch::Apply(&lease)).await {
            // Fall back to create/replace when server-side apply is unavailable.
            log_api_error("lease apply", &e);
            if let Ok(l) = serde_json::from_value::<Lease>(lease.clone())
                && leases.create(&PostParams::default(), &l).await.is_err()
            {
                let m = json!({"spec": lease["spec"].clone()});
                let _ = leases
                    .patch(&f.name, &PatchParams::default(), &Patch::Merge(&m))
                    .await;
            }
        }
        if last_status.elapsed() >= status_every {
            last_status = tokio::time::Instant::now();
            let status = json!({"status": node_status(&f, &transition)});
            if let Err(e) = nodes
                .patch_status(&f.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                log_api_error("node status", &e);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sysinfo(2)` and `/proc/meminfo` agree on the total (the kernel prints one from the other).
    #[test]
    fn host_memory_is_meminfo_total() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("MemTotal");
        assert_eq!(host_memory(), kib * 1024);
    }

    #[test]
    fn root_check_matches_proc_status() {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .expect("Uid");
        assert_eq!(crate::is_root(), euid == "0");
    }

    #[test]
    fn status_and_labels() {
        let f = NodeFacts {
            name: "n1".into(),
            ips: vec!["127.0.0.1".parse().expect("ip")],
            zone: Some("z1".into()),
            region: Some("r1".into()),
            port: 10250,
            cpus: 4,
            memory_bytes: 8 * 1024 * 1024 * 1024,
            max_pods: 110,
            labels: vec![("role".into(), "x".into())],
            annotations: vec![],
            network_ready: true,
        };
        let l = node_labels(&f);
        assert_eq!(l["kubernetes.io/hostname"], "n1");
        assert_eq!(l["topology.kubernetes.io/zone"], "z1");
        assert_eq!(l["topology.kubernetes.io/region"], "r1");
        assert_eq!(l["role"], "x");
        let s = node_status(&f, "2020-01-01T00:00:00Z");
        assert_eq!(
            s["addresses"][0],
            json!({"type": "InternalIP", "address": "127.0.0.1"})
        );
        assert_eq!(
            s["addresses"][1],
            json!({"type": "Hostname", "address": "n1"})
        );
        assert_eq!(s["allocatable"]["memory"], "8388608Ki");
        assert_eq!(s["allocatable"]["cpu"], "4");
        assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(s["conditions"][3]["type"], "Ready");
        assert_eq!(s["conditions"][3]["status"], "True");
    }

    #[test]
    fn not_ready_without_a_pod_cidr() {
        let f = NodeFacts {
            name: "n1".into(),
            ips: vec!["127.0.0.1".parse().expect("ip")],
            zone: None,
            region: None,
            port: 10250,
            cpus: 1,
            memory_bytes: 1024,
            max_pods: 110,
            labels: vec![],
            annotations: vec![],
            network_ready: false,
        };
        let s = node_status(&f, "2026-01-01T00:00:00Z");
        let ready = s["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .expect("Ready");
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "KubeletNotReady");
    }
}
