//! Table printers for every served kind: the columns and the cells upstream's server-side printers
//! (`pkg/printers/internalversion`) produce. The server prints with `Wide: true`, so every row
//! carries the priority-1 cells too; kubectl hides them unless `-o wide`.
//!
//! Each `kind(&obj)` uses the current time for ages; `kind_at(&obj, now)` takes it as a parameter.

pub mod duration;

use serde::Serialize;

/// One column of a `meta.k8s.io/v1` Table.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
}

impl Column {
    pub const fn new(name: &'static str, type_: &'static str, priority: i32) -> Self {
        Column {
            name,
            type_,
            format: "",
            description: "",
            priority,
        }
    }
    pub const fn name_column() -> Self {
        Column {
            name: "Name",
            type_: "string",
            format: "name",
            description: "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
            priority: 0,
        }
    }
}

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::api::storage::v1 as storage;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

pub use duration::{human_duration, since};

use ferry_selectors::{format_label_selector, format_labels, from_label_selector};

fn text(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

fn int(n: impl Into<i64>) -> Value {
    Value::from(n.into())
}

fn or_default(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("")
}

fn name(meta: &ObjectMeta) -> Value {
    text(or_default(&meta.name))
}

fn age(meta: &ObjectMeta, now: Timestamp) -> Value {
    text(since(meta.creation_timestamp.as_ref().map(|t| t.0), now))
}

/// Declares `kind(&obj)` (current time) for each `kind_at(&obj, now)`.
macro_rules! now_wrappers {
    ($($f:ident => $at:ident : $ty:ty),* $(,)?) => {
        $(
            pub fn $f(obj: &$ty) -> Vec<Value> {
                $at(obj, Timestamp::now())
            }
        )*
    };
}

now_wrappers! {
    namespace => namespace_at: core::Namespace,
    node => node_at: core::Node,
    pod => pod_at: core::Pod,
    service => service_at: core::Service,
    endpoints => endpoints_at: core::Endpoints,
    config_map => config_map_at: core::ConfigMap,
    secret => secret_at: core::Secret,
    core_event => core_event_at: core::Event,
    service_account => service_account_at: core::ServiceAccount,
    deployment => deployment_at: apps::Deployment,
    replica_set => replica_set_at: apps::ReplicaSet,
    endpoint_slice => endpoint_slice_at: discovery::EndpointSlice,
    ingress => ingress_at: networking::Ingress,
    ingress_class => ingress_class_at: networking::IngressClass,
    network_policy => network_policy_at: networking::NetworkPolicy,
    lease => lease_at: coordination::Lease,
    events_event => events_event_at: events::Event,
    replication_controller => replication_controller_at: core::ReplicationController,
    persistent_volume => persistent_volume_at: core::PersistentVolume,
    persistent_volume_claim => persistent_volume_claim_at: core::PersistentVolumeClaim,
    storage_class => storage_class_at: storage::StorageClass,
}

// ---------------------------------------------------------------------------------------------
// Namespace, Node

pub fn namespace_at(obj: &core::Namespace, now: Timestamp) -> Vec<Value> {
    let phase = obj
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    vec![name(&obj.metadata), text(phase), age(&obj.metadata, now)]
}

const NODE_ROLE_PREFIX: &str = "node-role.kubernetes.io/";
const NODE_ROLE_LABEL: &str = "kubernetes.io/role";

fn node_roles(labels: Option<&BTreeMap<String, String>>) -> String {
    let mut roles = BTreeSet::new();
    for (k, v) in labels.into_iter().flatten() {
        if let Some(role) = k.strip_prefix(NODE_ROLE_PREFIX) {
            if !role.is_empty() {
                roles.insert(role.to_string());
            }
        } else if k == NODE_ROLE_LABEL && !v.is_empty() {
            roles.insert(v.clone());
        }
    }
    if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    }
}

fn node_address(obj: &core::Node, kind: &str) -> String {
    obj.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == kind))
        .map(|a| a.address.clone())
        .unwrap_or_else(|| "<none>".to_string())
}

fn or_unknown(s: &str) -> String {
    if s.is_empty() {
        "<unknown>".to_string()
    } else {
        s.to_string()
    }
}

pub fn node_at(obj: &core::Node, now: Timestamp) -> Vec<Value> {
    let status = obj.status.clone().unwrap_or_default();
    // The last condition of a type wins, as in upstream's map.
    let ready = status
        .conditions
        .iter()
        .flatten()
        .rev()
        .find(|c| c.type_ == "Ready");
    let mut states: Vec<String> = match ready {
        Some(c) if c.status == "True" => vec!["Ready".to_string()],
        Some(_) => vec!["NotReady".to_string()],
        None => vec!["Unknown".to_string()],
    };
    if obj
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        states.push("SchedulingDisabled".to_string());
    }
    let info = status.node_info.unwrap_or_default();
    vec![
        name(&obj.metadata),
        text(states.join(",")),
        text(node_roles(obj.metadata.labels.as_ref())),
        age(&obj.metadata, now),
        text(info.kubelet_version),
        text(node_address(obj, "InternalIP")),
        text(node_address(obj, "ExternalIP")),
        text(or_unknown(&info.os_image)),
        text(or_unknown(&info.kernel_version)),
        text(or_unknown(&info.container_runtime_version)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Pod

fn later(current: Option<Timestamp>, candidate: Option<Timestamp>) -> Option<Timestamp> {
    match (current, candidate) {
        (Some(c), Some(n)) if n > c => Some(n),
        (None, Some(n)) => Some(n),
        (c, _) => c,
    }
}

fn finished_at(state: Option<&core::ContainerState>) -> Option<Timestamp> {
    state
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref())
        .map(|t| t.0)
}

fn terminated_reason(t: &core::ContainerStateTerminated, prefix: &str) -> String {
    match t.reason.as_deref() {
        Some(r) if !r.is_empty() => format!("{prefix}{r}"),
        _ => match t.signal {
            Some(sig) if sig != 0 => format!("{prefix}Signal:{sig}"),
            _ => format!("{prefix}ExitCode:{}", t.exit_code),
        },
    }
}

/// The Status column's reason and the Ready / Restarts cells, as upstream's `printPod`.
struct PodSummary {
    ready: usize,
    total: usize,
    reason: String,
    restarts: i64,
    last_restart: Option<Timestamp>,
}

fn summarize_pod(pod: &core::Pod) -> PodSummary {
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_default();
    let mut reason = match status.reason.as_deref() {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => phase.clone(),
    };
    if conditions
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"))
    {
        reason = "SchedulingGated".to_string();
    }

    let init_containers = spec.init_containers.clone().unwrap_or_default();
    let restartable: BTreeMap<&str, bool> = init_containers
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.restart_policy.as_deref() == Some("Always"),
            )
        })
        .collect();
    let total = spec.containers.len() + restartable.values().filter(|r| **r).count();
    let mut ready = 0;
    let mut restarts: i64 = 0;
    let mut restartable_restarts: i64 = 0;
    let mut last_restart = None;
    let mut last_restartable_restart = None;

    let mut initializing = false;
    for (i, c) in status.init_container_statuses.iter().flatten().enumerate() {
        restarts += i64::from(c.restart_count);
        let finished = finished_at(c.last_state.as_ref());
        last_restart = later(last_restart, finished);
        let is_restartable = restartable.get(c.name.as_str()).copied().unwrap_or(false);
        if is_restartable {
            restartable_restarts += i64::from(c.restart_count);
            last_restartable_restart = later(last_restartable_restart, finished);
        }
        let state = c.state.clone().unwrap_or_default();
        if state.terminated.as_ref().is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if is_restartable && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = &state.terminated {
            reason = terminated_reason(t, "Init:");
        } else if let Some(w) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{w}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }

    let initialized = conditions
        .iter()
        .any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = restartable_restarts;
        last_restart = last_restartable_restart;
        let mut has_running = false;
        for c in status.container_statuses.iter().flatten().rev() {
            restarts += i64::from(c.restart_count);
            last_restart = later(last_restart, finished_at(c.last_state.as_ref()));
            let state = c.state.clone().unwrap_or_default();
            let waiting = state
                .waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty());
            if let Some(w) = waiting {
                reason = w;
            } else if let Some(t) = &state.terminated {
                reason = terminated_reason(t, "");
            } else if c.ready && state.running.is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.to_string();
        }
    }

    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".to_string();
        } else if phase != "Failed" && phase != "Succeeded" {
            reason = "Terminating".to_string();
        }
    }
    PodSummary {
        ready,
        total,
        reason,
        restarts,
        last_restart,
    }
}

fn none_if_empty(s: Option<String>) -> String {
    match s {
        Some(s) if !s.is_empty() => s,
        _ => "<none>".to_string(),
    }
}

pub fn pod_at(obj: &core::Pod, now: Timestamp) -> Vec<Value> {
    let sum = summarize_pod(obj);
    let restarts = match sum.last_restart {
        Some(t) if sum.restarts != 0 => format!("{} ({} ago)", sum.restarts, since(Some(t), now)),
        _ => sum.restarts.to_string(),
    };
    let spec = obj.spec.clone().unwrap_or_default();
    let status = obj.status.clone().unwrap_or_default();
    let ip = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .map(|ip| ip.ip.clone())
        .or(status.pod_ip.clone());
    let gates = match spec.readiness_gates.as_deref() {
        None | Some([]) => "<none>".to_string(),
        Some(gates) => {
            let conditions = status.conditions.clone().unwrap_or_default();
            let passing = gates
                .iter()
                .filter(|g| {
                    conditions
                        .iter()
                        .find(|c| c.type_ == g.condition_type)
                        .is_some_and(|c| c.status == "True")
                })
                .count();
            format!("{passing}/{}", gates.len())
        }
    };
    vec![
        name(&obj.metadata),
        text(format!("{}/{}", sum.ready, sum.total)),
        text(sum.reason),
        text(restarts),
        age(&obj.metadata, now),
        text(none_if_empty(ip)),
        text(none_if_empty(spec.node_name)),
        text(none_if_empty(status.nominated_node_name)),
        text(gates),
    ]
}

// ---------------------------------------------------------------------------------------------
// Service, Endpoints, EndpointSlice

/// IPs (or hostnames) of load-balancer ingress points, sorted and without duplicates.
fn lb_addresses<'a>(
    points: impl Iterator<Item = (Option<&'a String>, Option<&'a String>)>,
) -> String {
    let mut set = BTreeSet::new();
    for (ip, hostname) in points {
        match (
            ip.filter(|s| !s.is_empty()),
            hostname.filter(|s| !s.is_empty()),
        ) {
            (Some(ip), _) => set.insert(ip.clone()),
            (None, Some(h)) => set.insert(h.clone()),
            _ => false,
        };
    }
    set.into_iter().collect::<Vec<_>>().join(",")
}

fn service_external_ip(obj: &core::Service) -> String {
    let spec = obj.spec.clone().unwrap_or_default();
    let external = spec.external_ips.clone().unwrap_or_default();
    match spec.type_.as_deref().unwrap_or("") {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".to_string()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let ingress = obj
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .map(|v| v.as_slice())
                .unwrap_or_default();
            let lb = lb_addresses(ingress.iter().map(|i| (i.ip.as_ref(), i.hostname.as_ref())));
            if !external.is_empty() {
                let mut all: Vec<String> = Vec::new();
                if !lb.is_empty() {
                    all.extend(lb.split(',').map(str::to_string));
                }
                all.extend(external);
                all.join(",")
            } else if !lb.is_empty() {
                lb
            } else {
                "<pending>".to_string()
            }
        }
        "ExternalName" => spec.external_name.unwrap_or_default(),
        _ => "<unknown>".to_string(),
    }
}

fn service_ports(ports: &[core::ServicePort]) -> String {
    let pieces: Vec<String> = ports
        .iter()
        .map(|p| {
            let proto = or_default(&p.protocol);
            match p.node_port {
                Some(np) if np > 0 => format!("{}:{np}/{proto}", p.port),
                _ => format!("{}/{proto}", p.port),
            }
        })
        .collect();
    if pieces.is_empty() {
        "<none>".to_string()
    } else {
        pieces.join(",")
    }
}

pub fn service_at(obj: &core::Service, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let cluster_ip = spec
        .cluster_ips
        .as_ref()
        .and_then(|ips| ips.first().cloned())
        .or_else(|| spec.cluster_ip.clone().filter(|ip| !ip.is_empty()))
        .unwrap_or_else(|| "<none>".to_string());
    vec![
        name(&obj.metadata),
        text(spec.type_.clone().unwrap_or_default()),
        text(cluster_ip),
        text(service_external_ip(obj)),
        text(service_ports(spec.ports.as_deref().unwrap_or_default())),
        age(&obj.metadata, now),
        text(format_labels(spec.selector.as_ref())),
    ]
}

fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Upstream's `formatEndpoints` with all ports: at most three `ip:port`, then `+ N more...`.
fn format_endpoints(obj: &core::Endpoints) -> String {
    let subsets = obj.subsets.as_deref().unwrap_or_default();
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    const MAX: usize = 3;
    let mut list: Vec<String> = Vec::new();
    let mut more = false;
    let mut count = 0usize;
    for ss in subsets {
        let addresses = ss.addresses.as_deref().unwrap_or_default();
        let ports = ss.ports.as_deref().unwrap_or_default();
        if ports.is_empty() {
            // Headless services without ports list bare addresses.
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(a.ip.clone());
            }
            continue;
        }
        for port in ports {
            count += addresses.len();
            for a in addresses {
                if list.len() == MAX {
                    more = true;
                    break;
                }
                list.push(join_host_port(&a.ip, port.port));
            }
        }
    }
    let joined = list.join(",");
    if more {
        format!("{joined} + {} more...", count - MAX)
    } else {
        joined
    }
}

pub fn endpoints_at(obj: &core::Endpoints, now: Timestamp) -> Vec<Value> {
    vec![
        name(&obj.metadata),
        text(format_endpoints(obj)),
        age(&obj.metadata, now),
    ]
}

fn list_with_more(list: Vec<String>, more: bool, count: usize, max: usize) -> String {
    let joined = list.join(",");
    if more {
        return format!("{joined} + {} more...", count - max);
    }
    if joined.is_empty() {
        "<unset>".to_string()
    } else {
        joined
    }
}

fn format_slice_ports(ports: &[discovery::EndpointPort]) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    let mut more = false;
    for p in ports {
        if list.len() < MAX {
            list.push(match (p.port, &p.name) {
                (Some(n), _) => n.to_string(),
                (None, Some(name)) => name.clone(),
                (None, None) => "*".to_string(),
            });
        } else if list.len() == MAX {
            more = true;
        }
    }
    list_with_more(list, more, ports.len(), MAX)
}

fn format_slice_endpoints(endpoints: &[discovery::Endpoint]) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    let mut more = false;
    let mut count = 0;
    for a in endpoints.iter().flat_map(|e| e.addresses.iter()) {
        if list.len() < MAX {
            list.push(a.clone());
        } else if list.len() == MAX {
            more = true;
        }
        count += 1;
    }
    list_with_more(list, more, count, MAX)
}

pub fn endpoint_slice_at(obj: &discovery::EndpointSlice, now: Timestamp) -> Vec<Value> {
    vec![
        name(&obj.metadata),
        text(obj.address_type.clone()),
        text(format_slice_ports(obj.ports.as_deref().unwrap_or_default())),
        text(format_slice_endpoints(
            obj.endpoints.as_deref().unwrap_or_default(),
        )),
        age(&obj.metadata, now),
    ]
}

// ---------------------------------------------------------------------------------------------
// ConfigMap, Secret, ServiceAccount, Lease

pub fn config_map_at(obj: &core::ConfigMap, now: Timestamp) -> Vec<Value> {
    let n =
        obj.data.as_ref().map_or(0, |d| d.len()) + obj.binary_data.as_ref().map_or(0, |d| d.len());
    vec![name(&obj.metadata), int(n as i64), age(&obj.metadata, now)]
}

pub fn secret_at(obj: &core::Secret, now: Timestamp) -> Vec<Value> {
    // `stringData` merges into `data` when the object is read into the internal type.
    let keys: BTreeSet<&String> = obj
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(obj.string_data.iter().flat_map(|d| d.keys()))
        .collect();
    vec![
        name(&obj.metadata),
        text(or_default(&obj.type_)),
        int(keys.len() as i64),
        age(&obj.metadata, now),
    ]
}

pub fn service_account_at(obj: &core::ServiceAccount, now: Timestamp) -> Vec<Value> {
    let n = obj.secrets.as_ref().map_or(0, |s| s.len());
    vec![name(&obj.metadata), int(n as i64), age(&obj.metadata, now)]
}

pub fn lease_at(obj: &coordination::Lease, now: Timestamp) -> Vec<Value> {
    let holder = obj
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    vec![name(&obj.metadata), text(holder), age(&obj.metadata, now)]
}

// ---------------------------------------------------------------------------------------------
// Deployment, ReplicaSet

fn container_cells(template: &core::PodTemplateSpec) -> (String, String) {
    let containers = template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let names = containers
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let images = containers
        .iter()
        .map(|c| or_default(&c.image))
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

pub fn deployment_at(obj: &apps::Deployment, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone();
    let status = obj.status.clone().unwrap_or_default();
    let desired = spec.replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let (names, images) = container_cells(&spec.template);
    let selector = match from_label_selector(&spec.selector) {
        Ok(s) => s.to_string(),
        Err(_) => "<invalid>".to_string(),
    };
    vec![
        name(&obj.metadata),
        text(format!("{ready}/{desired}")),
        int(status.updated_replicas.unwrap_or(0)),
        int(status.available_replicas.unwrap_or(0)),
        age(&obj.metadata, now),
        text(names),
        text(images),
        text(selector),
    ]
}

pub fn replica_set_at(obj: &apps::ReplicaSet, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone();
    let status = obj.status.clone().unwrap_or_default();
    let (names, images) = spec
        .template
        .as_ref()
        .map(container_cells)
        .unwrap_or_default();
    vec![
        name(&obj.metadata),
        int(spec.replicas.unwrap_or(0)),
        int(status.replicas),
        int(status.ready_replicas.unwrap_or(0)),
        age(&obj.metadata, now),
        text(names),
        text(images),
        text(format_label_selector(Some(&spec.selector))),
    ]
}

// ---------------------------------------------------------------------------------------------
// Ingress, IngressClass, NetworkPolicy

fn format_hosts(rules: &[networking::IngressRule]) -> String {
    const MAX: usize = 3;
    let mut list: Vec<String> = Vec::new();
    let mut more = false;
    for rule in rules {
        if list.len() == MAX {
            more = true;
        }
        if !more && let Some(h) = rule.host.as_ref().filter(|h| !h.is_empty()) {
            list.push(h.clone());
        }
    }
    if list.is_empty() {
        return "*".to_string();
    }
    let joined = list.join(",");
    if more {
        format!("{joined} + {} more...", rules.len() - MAX)
    } else {
        joined
    }
}

pub fn ingress_at(obj: &networking::Ingress, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let class = spec
        .ingress_class_name
        .clone()
        .unwrap_or_else(|| "<none>".to_string());
    let points = obj
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|v| v.as_slice())
        .unwrap_or_default();
    let address = lb_addresses(points.iter().map(|i| (i.ip.as_ref(), i.hostname.as_ref())));
    let ports = if spec.tls.as_ref().is_some_and(|t| !t.is_empty()) {
        "80, 443"
    } else {
        "80"
    };
    vec![
        name(&obj.metadata),
        text(class),
        text(format_hosts(spec.rules.as_deref().unwrap_or_default())),
        text(address),
        text(ports),
        age(&obj.metadata, now),
    ]
}

pub fn ingress_class_at(obj: &networking::IngressClass, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let parameters = match &spec.parameters {
        None => "<none>".to_string(),
        Some(p) => {
            let mut s = p.kind.clone();
            if let Some(group) = &p.api_group {
                s.push('.');
                s.push_str(group);
            }
            format!("{s}/{}", p.name)
        }
    };
    vec![
        name(&obj.metadata),
        text(spec.controller.unwrap_or_default()),
        text(parameters),
        age(&obj.metadata, now),
    ]
}

pub fn network_policy_at(obj: &networking::NetworkPolicy, now: Timestamp) -> Vec<Value> {
    let selector = obj
        .spec
        .as_ref()
        .and_then(|s| s.pod_selector.clone())
        .unwrap_or_default();
    vec![
        name(&obj.metadata),
        text(format_label_selector(Some(&selector))),
        age(&obj.metadata, now),
    ]
}

// ---------------------------------------------------------------------------------------------
// Events: both API versions print through upstream's one (internal) Event printer.

struct EventView {
    name: String,
    kind: String,
    object_name: String,
    field_path: String,
    type_: String,
    reason: String,
    message: String,
    component: String,
    host: String,
    reporting_controller: String,
    reporting_instance: String,
    first: Option<Timestamp>,
    last: Option<Timestamp>,
    event_time: Option<Timestamp>,
    count: i32,
    series: Option<(i32, Option<Timestamp>)>,
}

fn event_cells(e: EventView, now: Timestamp) -> Vec<Value> {
    let first = if e.first.is_some() {
        since(e.first, now)
    } else {
        since(e.event_time, now)
    };
    let mut last = if e.last.is_some() {
        since(e.last, now)
    } else {
        first.clone()
    };
    let mut count = e.count;
    if let Some((series_count, observed)) = e.series {
        last = since(observed, now);
        count = series_count;
    } else if count == 0 {
        // Events of the new API leave the count unset for singletons.
        count = 1;
    }
    let target = if e.object_name.is_empty() {
        e.kind.to_lowercase()
    } else {
        format!("{}/{}", e.kind.to_lowercase(), e.object_name)
    };
    let component = if e.component.is_empty() {
        e.reporting_controller
    } else {
        e.component
    };
    let host = if e.host.is_empty() {
        e.reporting_instance
    } else {
        e.host
    };
    let source = if host.is_empty() {
        component
    } else {
        format!("{component}, {host}")
    };
    vec![
        text(last),
        text(e.type_),
        text(e.reason),
        text(target),
        text(e.field_path),
        text(source),
        text(e.message.trim()),
        text(first),
        int(count),
        text(e.name),
    ]
}

pub fn core_event_at(obj: &core::Event, now: Timestamp) -> Vec<Value> {
    let io = &obj.involved_object;
    let source = obj.source.clone().unwrap_or_default();
    let view = EventView {
        name: or_default(&obj.metadata.name).to_string(),
        kind: or_default(&io.kind).to_string(),
        object_name: or_default(&io.name).to_string(),
        field_path: or_default(&io.field_path).to_string(),
        type_: or_default(&obj.type_).to_string(),
        reason: or_default(&obj.reason).to_string(),
        message: or_default(&obj.message).to_string(),
        component: source.component.unwrap_or_default(),
        host: source.host.unwrap_or_default(),
        reporting_controller: or_default(&obj.reporting_component).to_string(),
        reporting_instance: or_default(&obj.reporting_instance).to_string(),
        first: obj.first_timestamp.as_ref().map(|t| t.0),
        last: obj.last_timestamp.as_ref().map(|t| t.0),
        event_time: obj.event_time.as_ref().map(|t| t.0),
        count: obj.count.unwrap_or(0),
        series: obj.series.as_ref().map(|s| {
            (
                s.count.unwrap_or(0),
                s.last_observed_time.as_ref().map(|t| t.0),
            )
        }),
    };
    event_cells(view, now)
}

pub fn events_event_at(obj: &events::Event, now: Timestamp) -> Vec<Value> {
    let regarding = obj.regarding.clone().unwrap_or_default();
    let source = obj.deprecated_source.clone().unwrap_or_default();
    let view = EventView {
        name: or_default(&obj.metadata.name).to_string(),
        kind: regarding.kind.unwrap_or_default(),
        object_name: regarding.name.unwrap_or_default(),
        field_path: regarding.field_path.unwrap_or_default(),
        type_: or_default(&obj.type_).to_string(),
        reason: or_default(&obj.reason).to_string(),
        message: or_default(&obj.note).to_string(),
        component: source.component.unwrap_or_default(),
        host: source.host.unwrap_or_default(),
        reporting_controller: or_default(&obj.reporting_controller).to_string(),
        reporting_instance: or_default(&obj.reporting_instance).to_string(),
        first: obj.deprecated_first_timestamp.as_ref().map(|t| t.0),
        last: obj.deprecated_last_timestamp.as_ref().map(|t| t.0),
        event_time: obj.event_time.as_ref().map(|t| t.0),
        count: obj.deprecated_count.unwrap_or(0),
        series: obj
            .series
            .as_ref()
            .map(|s| (s.count, Some(s.last_observed_time.0))),
    };
    event_cells(view, now)
}

// ---------------------------------------------------------------------------------------------
// ReplicationController, PersistentVolume, PersistentVolumeClaim, StorageClass

pub fn replication_controller_at(obj: &core::ReplicationController, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let status = obj.status.clone().unwrap_or_default();
    let (names, images) = spec
        .template
        .as_ref()
        .map(container_cells)
        .unwrap_or_default();
    vec![
        name(&obj.metadata),
        int(spec.replicas.unwrap_or(0)),
        int(status.replicas),
        int(status.ready_replicas.unwrap_or(0)),
        age(&obj.metadata, now),
        text(names),
        text(images),
        text(format_labels(spec.selector.as_ref())),
    ]
}

/// Upstream's `GetAccessModesAsString`: RWO, ROX, RWX, RWOP, each once, in that order.
pub fn access_modes(modes: &[String]) -> String {
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(m, _)| modes.iter().any(|x| x == m))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

fn class_of(meta: &ObjectMeta, spec_class: &Option<String>) -> String {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(BETA_STORAGE_CLASS))
        .cloned()
        .or_else(|| spec_class.clone())
        .unwrap_or_default()
}

fn phase_or_terminating(meta: &ObjectMeta, phase: Option<&str>) -> String {
    if meta.deletion_timestamp.is_some() {
        "Terminating".to_string()
    } else {
        phase.unwrap_or("").to_string()
    }
}

fn unset(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "<unset>".to_string())
}

pub fn persistent_volume_at(obj: &core::PersistentVolume, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let status = obj.status.clone().unwrap_or_default();
    let claim = spec
        .claim_ref
        .as_ref()
        .map(|c| {
            format!(
                "{}/{}",
                c.namespace.as_deref().unwrap_or(""),
                c.name.as_deref().unwrap_or("")
            )
        })
        .unwrap_or_default();
    let capacity = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    vec![
        name(&obj.metadata),
        text(capacity),
        text(access_modes(
            spec.access_modes.as_deref().unwrap_or_default(),
        )),
        text(
            spec.persistent_volume_reclaim_policy
                .clone()
                .unwrap_or_default(),
        ),
        text(phase_or_terminating(&obj.metadata, status.phase.as_deref())),
        text(claim),
        text(class_of(&obj.metadata, &spec.storage_class_name)),
        text(unset(&spec.volume_attributes_class_name)),
        text(status.reason.clone().unwrap_or_default()),
        age(&obj.metadata, now),
        text(unset(&spec.volume_mode)),
    ]
}

pub fn persistent_volume_claim_at(obj: &core::PersistentVolumeClaim, now: Timestamp) -> Vec<Value> {
    let spec = obj.spec.clone().unwrap_or_default();
    let status = obj.status.clone().unwrap_or_default();
    let volume = spec.volume_name.clone().unwrap_or_default();
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            status
                .capacity
                .as_ref()
                .and_then(|c| c.get("storage"))
                .map(|q| q.0.clone())
                .unwrap_or_default(),
            access_modes(status.access_modes.as_deref().unwrap_or_default()),
        )
    };
    vec![
        name(&obj.metadata),
        text(phase_or_terminating(&obj.metadata, status.phase.as_deref())),
        text(volume),
        text(capacity),
        text(modes),
        text(class_of(&obj.metadata, &spec.storage_class_name)),
        text(unset(&spec.volume_attributes_class_name)),
        age(&obj.metadata, now),
        text(unset(&spec.volume_mode)),
    ]
}

/// `storageclass.kubernetes.io/is-default-class` (and its beta form) set to "true".
pub fn is_default_class(meta: &ObjectMeta) -> bool {
    meta.annotations.as_ref().is_some_and(|a| {
        [
            "storageclass.kubernetes.io/is-default-class",
            "storageclass.beta.kubernetes.io/is-default-class",
        ]
        .iter()
        .any(|k| a.get(*k).map(String::as_str) == Some("true"))
    })
}

pub fn storage_class_at(obj: &storage::StorageClass, now: Timestamp) -> Vec<Value> {
    let mut n = obj.metadata.name.clone().unwrap_or_default();
    if is_default_class(&obj.metadata) {
        n.push_str(" (default)");
    }
    vec![
        text(n),
        text(obj.provisioner.clone()),
        text(
            obj.reclaim_policy
                .clone()
                .unwrap_or_else(|| "Delete".into()),
        ),
        text(
            obj.volume_binding_mode
                .clone()
                .unwrap_or_else(|| "Immediate".into()),
        ),
        Value::Bool(obj.allow_volume_expansion.unwrap_or(false)),
        age(&obj.metadata, now),
    ]
}

/// Column definitions per kind.
pub mod columns {
    use crate::Column;

    /// The description of every `Age` column (upstream's `creationTimestamp` field doc).
    pub const AGE: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
    pub const CONTAINERS: &str = "Names of each container in the template.";
    pub const IMAGES: &str = "Images referenced by each container in the template.";

    /// A column of `format` "" (every server-side column but `Name`).
    pub const fn col(
        name: &'static str,
        type_: &'static str,
        description: &'static str,
        priority: i32,
    ) -> Column {
        Column {
            name,
            type_,
            format: "",
            description,
            priority,
        }
    }

    fn age() -> Column {
        col("Age", "string", AGE, 0)
    }

    pub fn replication_controller() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Desired",
                "integer",
                "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1.",
                0,
            ),
            col(
                "Current",
                "integer",
                "Replicas is the most recently observed number of replicas.",
                0,
            ),
            col(
                "Ready",
                "integer",
                "The number of ready replicas for this replication controller.",
                0,
            ),
            age(),
            col("Containers", "string", CONTAINERS, 1),
            col("Images", "string", IMAGES, 1),
            col(
                "Selector",
                "string",
                "Selector is a label query over pods that should match the Replicas count.",
                1,
            ),
        ]
    }
    pub fn persistent_volume() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Capacity",
                "string",
                "capacity is the description of the persistent volume's resources and capacity.",
                0,
            ),
            col(
                "Access Modes",
                "string",
                "accessModes contains all ways the volume can be mounted.",
                0,
            ),
            col(
                "Reclaim Policy",
                "string",
                "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
                0,
            ),
            col(
                "Status",
                "string",
                "phase indicates if a volume is available, bound to a claim, or released by a claim.",
                0,
            ),
            col(
                "Claim",
                "string",
                "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
                0,
            ),
            col(
                "StorageClass",
                "string",
                "storageClassName is the name of StorageClass to which this persistent volume belongs.",
                0,
            ),
            col(
                "VolumeAttributesClass",
                "string",
                "Name of VolumeAttributesClass to which this persistent volume belongs.",
                0,
            ),
            col(
                "Reason",
                "string",
                "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.",
                0,
            ),
            age(),
            col(
                "VolumeMode",
                "string",
                "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
                1,
            ),
        ]
    }
    pub fn persistent_volume_claim() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Status",
                "string",
                "phase represents the current phase of PersistentVolumeClaim.",
                0,
            ),
            col(
                "Volume",
                "string",
                "volumeName is the binding reference to the PersistentVolume backing this claim.",
                0,
            ),
            col(
                "Capacity",
                "string",
                "capacity represents the actual resources of the underlying volume.",
                0,
            ),
            col(
                "Access Modes",
                "string",
                "accessModes contains the actual access modes the volume backing the PVC has.",
                0,
            ),
            col(
                "StorageClass",
                "string",
                "storageClassName is the name of the StorageClass required by the claim.",
                0,
            ),
            col(
                "VolumeAttributesClass",
                "string",
                "volumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim.",
                0,
            ),
            age(),
            col(
                "VolumeMode",
                "string",
                "volumeMode defines what type of volume is required by the claim.",
                1,
            ),
        ]
    }
    pub fn storage_class() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Provisioner",
                "string",
                "Indicates the type of the provisioner.",
                0,
            ),
            col(
                "ReclaimPolicy",
                "string",
                "Dynamically provisioned PersistentVolumes of this storage class are created with this reclaimPolicy. Defaults to Delete.",
                0,
            ),
            col(
                "VolumeBindingMode",
                "string",
                "VolumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound. When unset, VolumeBindingImmediate is used.",
                0,
            ),
            col(
                "AllowVolumeExpansion",
                "string",
                "AllowVolumeExpansion shows whether the storage class allow volume expand.",
                0,
            ),
            age(),
        ]
    }
    pub fn namespace() -> Vec<Column> {
        vec![
            Column::name_column(),
            col("Status", "string", "The status of the namespace", 0),
            age(),
        ]
    }
    pub fn node() -> Vec<Column> {
        vec![
            Column::name_column(),
            col("Status", "string", "The status of the node", 0),
            col("Roles", "string", "The roles of the node", 0),
            age(),
            col(
                "Version",
                "string",
                "Kubelet Version reported by the node.",
                0,
            ),
            col(
                "Internal-IP",
                "string",
                "List of addresses reachable to the node.",
                1,
            ),
            col(
                "External-IP",
                "string",
                "List of addresses reachable to the node.",
                1,
            ),
            col(
                "OS-Image",
                "string",
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                1,
            ),
            col(
                "Kernel-Version",
                "string",
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                1,
            ),
            col(
                "Container-Runtime",
                "string",
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                1,
            ),
        ]
    }
    pub fn pod() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Ready",
                "string",
                "The aggregate readiness state of this pod for accepting traffic.",
                0,
            ),
            col(
                "Status",
                "string",
                "The aggregate status of the containers in this pod.",
                0,
            ),
            col(
                "Restarts",
                "string",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                0,
            ),
            age(),
            col(
                "IP",
                "string",
                "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                1,
            ),
            col(
                "Node",
                "string",
                "NodeName indicates in which node this pod is scheduled.",
                1,
            ),
            col(
                "Nominated Node",
                "string",
                "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
                1,
            ),
            col(
                "Readiness Gates",
                "string",
                "If specified, all readiness gates will be evaluated for pod readiness.",
                1,
            ),
        ]
    }
    pub fn service() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Type",
                "string",
                "type determines how the Service is exposed. Defaults to ClusterIP.",
                0,
            ),
            col(
                "Cluster-IP",
                "string",
                "clusterIP is the IP address of the service and is usually assigned randomly.",
                0,
            ),
            col(
                "External-IP",
                "string",
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
                0,
            ),
            col(
                "Port(s)",
                "string",
                "The list of ports that are exposed by this service.",
                0,
            ),
            age(),
            col(
                "Selector",
                "string",
                "Route service traffic to pods with label keys and values matching this selector.",
                1,
            ),
        ]
    }
    pub fn endpoints() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Endpoints",
                "string",
                "The set of all endpoints is the union of all subsets.",
                0,
            ),
            age(),
        ]
    }
    pub fn config_map() -> Vec<Column> {
        vec![
            Column::name_column(),
            col("Data", "string", "Data contains the configuration data.", 0),
            age(),
        ]
    }
    pub fn secret() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Type",
                "string",
                "Used to facilitate programmatic handling of secret data.",
                0,
            ),
            col("Data", "string", "Data contains the secret data.", 0),
            age(),
        ]
    }
    /// Both Event APIs share upstream's one Event table.
    pub fn core_event() -> Vec<Column> {
        vec![
            col(
                "Last Seen",
                "string",
                "The time at which the most recent occurrence of this event was recorded.",
                0,
            ),
            col(
                "Type",
                "string",
                "Type of this event (Normal, Warning), new types could be added in the future",
                0,
            ),
            col(
                "Reason",
                "string",
                "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                0,
            ),
            col(
                "Object",
                "string",
                "The object that this event is about.",
                0,
            ),
            col(
                "Subobject",
                "string",
                "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
                1,
            ),
            col(
                "Source",
                "string",
                "The component reporting this event. Should be a short machine understandable string.",
                1,
            ),
            col(
                "Message",
                "string",
                "A human-readable description of the status of this operation.",
                0,
            ),
            col(
                "First Seen",
                "string",
                "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
                1,
            ),
            col(
                "Count",
                "string",
                "The number of times this event has occurred.",
                1,
            ),
            Column {
                priority: 1,
                ..Column::name_column()
            },
        ]
    }
    pub fn service_account() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Secrets",
                "string",
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
                0,
            ),
            age(),
        ]
    }
    pub fn deployment() -> Vec<Column> {
        vec![
            Column::name_column(),
            col("Ready", "string", "Number of the pod with ready state", 0),
            col(
                "Up-to-date",
                "string",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                0,
            ),
            col(
                "Available",
                "string",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                0,
            ),
            age(),
            col("Containers", "string", CONTAINERS, 1),
            col("Images", "string", IMAGES, 1),
            col(
                "Selector",
                "string",
                "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
                1,
            ),
        ]
    }
    pub fn replica_set() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Desired",
                "integer",
                "Replicas is the number of desired replicas.",
                0,
            ),
            col(
                "Current",
                "integer",
                "Replicas is the most recently observed number of replicas.",
                0,
            ),
            col(
                "Ready",
                "integer",
                "The number of ready replicas for this replica set.",
                0,
            ),
            age(),
            col("Containers", "string", CONTAINERS, 1),
            col("Images", "string", IMAGES, 1),
            col(
                "Selector",
                "string",
                "Selector is a label query over pods that should match the replica count.",
                1,
            ),
        ]
    }
    pub fn endpoint_slice() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "AddressType",
                "string",
                "addressType specifies the type of address carried by this EndpointSlice.",
                0,
            ),
            col(
                "Ports",
                "string",
                "ports specifies the list of network ports exposed by each endpoint in this slice.",
                0,
            ),
            col(
                "Endpoints",
                "string",
                "endpoints is a list of unique endpoints in this slice.",
                0,
            ),
            age(),
        ]
    }
    pub fn ingress() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Class",
                "string",
                "The name of the IngressClass resource that should be used for additional configuration",
                0,
            ),
            col(
                "Hosts",
                "string",
                "Hosts that incoming requests are matched against before the ingress rule",
                0,
            ),
            col(
                "Address",
                "string",
                "Address is a list containing ingress points for the load-balancer",
                0,
            ),
            col(
                "Ports",
                "string",
                "Ports of TLS configurations that open",
                0,
            ),
            age(),
        ]
    }
    pub fn ingress_class() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Controller",
                "string",
                "Controller that is responsible for handling this class",
                0,
            ),
            col(
                "Parameters",
                "string",
                "A reference to a resource with additional parameters",
                0,
            ),
            age(),
        ]
    }
    pub fn network_policy() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Pod-Selector",
                "string",
                "Selects the pods to which this NetworkPolicy object applies.",
                0,
            ),
            age(),
        ]
    }
    pub fn lease() -> Vec<Column> {
        vec![
            Column::name_column(),
            col(
                "Holder",
                "string",
                "holderIdentity contains the identity of the holder of a current lease.",
                0,
            ),
            age(),
        ]
    }
    pub fn events_event() -> Vec<Column> {
        core_event()
    }
}
