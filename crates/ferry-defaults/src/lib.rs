//! Defaulting for every served kind, as upstream's `SetDefaults_*` functions do it
//! (`pkg/apis/core/v1/defaults.go`, `pkg/apis/apps/v1/defaults.go`,
//! `pkg/apis/discovery/v1/defaults.go`, `pkg/apis/networking/v1/defaults.go`).

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::events::v1 as events;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::api::storage::v1 as storage;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The label every Namespace carries with its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
pub const DEFAULT_CLIENT_IP_TIMEOUT_SECONDS: i32 = 10800;
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// Octal 0644, the default file mode of projected, secret, configMap and downwardAPI volumes.
pub const DEFAULT_VOLUME_MODE: i32 = 0o644;

fn set<T>(field: &mut Option<T>, value: T) {
    if field.is_none() {
        *field = Some(value);
    }
}

fn set_str(field: &mut Option<String>, value: &str) {
    if field.as_deref().unwrap_or("").is_empty() {
        *field = Some(value.to_string());
    }
}

pub fn namespace(obj: &mut core::Namespace) {
    if let Some(name) = obj.metadata.name.clone().filter(|n| !n.is_empty()) {
        obj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NAMESPACE_NAME_LABEL.to_string(), name);
    }
    if let Some(status) = obj.status.as_mut() {
        set_str(&mut status.phase, "Active");
    }
}

pub fn node(obj: &mut core::Node) {
    if let Some(status) = obj.status.as_mut()
        && status.allocatable.is_none()
        && let Some(cap) = &status.capacity
    {
        status.allocatable = Some(cap.clone());
    }
}

/// The image pull policy upstream picks from the tag: `Always` for `:latest` or no tag,
/// `IfNotPresent` otherwise (including digests).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    // The tag follows the last ':' after the last '/' (a ':' before it is a registry port).
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn probe(p: &mut Option<core::Probe>) {
    let Some(p) = p.as_mut() else { return };
    set(&mut p.timeout_seconds, 1);
    set(&mut p.period_seconds, 10);
    set(&mut p.success_threshold, 1);
    set(&mut p.failure_threshold, 3);
    if let Some(h) = p.http_get.as_mut() {
        set_str(&mut h.path, "/");
        set_str(&mut h.scheme, "HTTP");
    }
    if let Some(g) = p.grpc.as_mut() {
        set(&mut g.service, String::new());
    }
}

fn lifecycle_handler(h: Option<&mut core::LifecycleHandler>) {
    if let Some(h) = h
        && let Some(get) = h.http_get.as_mut()
    {
        set_str(&mut get.path, "/");
        set_str(&mut get.scheme, "HTTP");
    }
}

fn container(c: &mut core::Container) {
    if c.image_pull_policy.as_deref().unwrap_or("").is_empty() {
        c.image_pull_policy =
            Some(default_pull_policy(c.image.as_deref().unwrap_or("")).to_string());
    }
    set_str(
        &mut c.termination_message_path,
        DEFAULT_TERMINATION_MESSAGE_PATH,
    );
    set_str(&mut c.termination_message_policy, "File");
    for p in c.ports.iter_mut().flatten() {
        set_str(&mut p.protocol, "TCP");
    }
    for e in c.env.iter_mut().flatten() {
        if let Some(fr) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
            set_str(&mut fr.api_version, "v1");
        }
    }
    probe(&mut c.liveness_probe);
    probe(&mut c.readiness_probe);
    probe(&mut c.startup_probe);
    if let Some(l) = c.lifecycle.as_mut() {
        lifecycle_handler(l.post_start.as_mut());
        lifecycle_handler(l.pre_stop.as_mut());
    }
    // Requests default to limits for resources that only have a limit.
    if let Some(r) = c.resources.as_mut()
        && let Some(limits) = r.limits.clone()
    {
        let requests = r.requests.get_or_insert_with(Default::default);
        for (k, v) in limits {
            requests.entry(k).or_insert(v);
        }
    }
}

fn volume(v: &mut core::Volume) {
    let has_source = match serde_json::to_value(&*v) {
        Ok(serde_json::Value::Object(m)) => m.keys().any(|k| k != "name"),
        _ => true,
    };
    if !has_source {
        v.empty_dir = Some(Default::default());
    }
    if let Some(sv) = v.secret.as_mut() {
        set(&mut sv.default_mode, DEFAULT_VOLUME_MODE);
    }
    if let Some(cm) = v.config_map.as_mut() {
        set(&mut cm.default_mode, DEFAULT_VOLUME_MODE);
    }
    if let Some(d) = v.downward_api.as_mut() {
        set(&mut d.default_mode, DEFAULT_VOLUME_MODE);
        for item in d.items.iter_mut().flatten() {
            if let Some(fr) = item.field_ref.as_mut() {
                set_str(&mut fr.api_version, "v1");
            }
        }
    }
    if let Some(p) = v.projected.as_mut() {
        set(&mut p.default_mode, DEFAULT_VOLUME_MODE);
    }
    if let Some(h) = v.host_path.as_mut() {
        set(&mut h.type_, String::new());
    }
}

/// SetDefaults_PodSpec and everything it reaches (containers, volumes, probes...).
pub fn pod_spec(spec: &mut core::PodSpec) {
    set_str(&mut spec.dns_policy, "ClusterFirst");
    set_str(&mut spec.restart_policy, "Always");
    set(&mut spec.security_context, Default::default());
    set(
        &mut spec.termination_grace_period_seconds,
        DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
    );
    set_str(&mut spec.scheduler_name, DEFAULT_SCHEDULER_NAME);
    set(&mut spec.enable_service_links, true);
    // The deprecated serviceAccount field mirrors serviceAccountName.
    if spec
        .service_account_name
        .as_deref()
        .unwrap_or("")
        .is_empty()
        && let Some(sa) = spec.service_account.clone().filter(|s| !s.is_empty())
    {
        spec.service_account_name = Some(sa);
    }
    let host_network = spec.host_network == Some(true);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        container(c);
        if host_network {
            for p in c.ports.iter_mut().flatten() {
                if p.host_port.unwrap_or(0) == 0 {
                    p.host_port = Some(p.container_port);
                }
            }
        }
    }
    for v in spec.volumes.iter_mut().flatten() {
        volume(v);
    }
}

pub fn pod(obj: &mut core::Pod) {
    let spec = obj.spec.get_or_insert_with(Default::default);
    pod_spec(spec);
}

fn pod_template(t: &mut core::PodTemplateSpec) {
    pod_spec(t.spec.get_or_insert_with(Default::default));
}

pub fn service(obj: &mut core::Service) {
    let spec = obj.spec.get_or_insert_with(Default::default);
    set_str(&mut spec.session_affinity, "None");
    if spec.session_affinity.as_deref() == Some("ClientIP") {
        let cfg = spec
            .session_affinity_config
            .get_or_insert_with(Default::default);
        let cip = cfg.client_ip.get_or_insert_with(Default::default);
        set(&mut cip.timeout_seconds, DEFAULT_CLIENT_IP_TIMEOUT_SECONDS);
    }
    set_str(&mut spec.type_, "ClusterIP");
    for p in spec.ports.iter_mut().flatten() {
        set_str(&mut p.protocol, "TCP");
        let unset = match &p.target_port {
            None => true,
            Some(IntOrString::Int(0)) => true,
            Some(IntOrString::String(s)) => s.is_empty(),
            Some(IntOrString::Int(_)) => false,
        };
        if unset {
            p.target_port = Some(IntOrString::Int(p.port));
        }
    }
    let type_ = spec.type_.clone().unwrap_or_default();
    let externally_accessible = match type_.as_str() {
        "NodePort" | "LoadBalancer" => true,
        "ClusterIP" => spec
            .external_ips
            .as_ref()
            .is_some_and(|ips| !ips.is_empty()),
        _ => false,
    };
    if externally_accessible {
        set_str(&mut spec.external_traffic_policy, "Cluster");
    }
    if spec.internal_traffic_policy.is_none() && type_ != "ExternalName" {
        spec.internal_traffic_policy = Some("Cluster".to_string());
    }
    if type_ == "LoadBalancer" {
        set(&mut spec.allocate_load_balancer_node_ports, true);
    }
    // The strategy keeps clusterIP and clusterIPs in step: a lone clusterIP becomes clusterIPs[0].
    if let Some(ip) = spec.cluster_ip.clone().filter(|ip| !ip.is_empty())
        && spec.cluster_ips.as_ref().is_none_or(|ips| ips.is_empty())
    {
        spec.cluster_ips = Some(vec![ip]);
    }
    if type_ == "LoadBalancer"
        && let Some(lb) = obj.status.as_mut().and_then(|st| st.load_balancer.as_mut())
    {
        for ing in lb.ingress.iter_mut().flatten() {
            if ing.ip.as_deref().is_some_and(|ip| !ip.is_empty()) && ing.ip_mode.is_none() {
                ing.ip_mode = Some("VIP".to_string());
            }
        }
    }
}

pub fn endpoints(obj: &mut core::Endpoints) {
    for ss in obj.subsets.iter_mut().flatten() {
        for p in ss.ports.iter_mut().flatten() {
            set_str(&mut p.protocol, "TCP");
        }
    }
}

pub fn config_map(_obj: &mut core::ConfigMap) {}

/// Type `Opaque`, and `stringData` merged into `data` (it is write-only, as upstream's
/// conversion does it).
pub fn secret(obj: &mut core::Secret) {
    set_str(&mut obj.type_, "Opaque");
    if let Some(string_data) = obj.string_data.take() {
        let data = obj.data.get_or_insert_with(Default::default);
        for (k, v) in string_data {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
}

pub fn core_event(_obj: &mut core::Event) {}

pub fn service_account(_obj: &mut core::ServiceAccount) {}

pub fn deployment(obj: &mut apps::Deployment) {
    let spec = &mut obj.spec;
    set(&mut spec.replicas, 1);
    let strategy = spec.strategy.get_or_insert_with(Default::default);
    set_str(&mut strategy.type_, "RollingUpdate");
    if strategy.type_.as_deref() == Some("RollingUpdate") {
        let ru = strategy.rolling_update.get_or_insert_with(Default::default);
        set(
            &mut ru.max_unavailable,
            IntOrString::String("25%".to_string()),
        );
        set(&mut ru.max_surge, IntOrString::String("25%".to_string()));
    }
    set(&mut spec.revision_history_limit, 10);
    set(&mut spec.progress_deadline_seconds, 600);
    pod_template(&mut spec.template);
}

pub fn replica_set(obj: &mut apps::ReplicaSet) {
    let spec = &mut obj.spec;
    set(&mut spec.replicas, 1);
    if let Some(t) = spec.template.as_mut() {
        pod_template(t);
    }
}

/// `SetDefaults_ReplicationController`: the selector and labels default to the template's
/// labels; one replica.
pub fn replication_controller(obj: &mut core::ReplicationController) {
    let spec = obj.spec.get_or_insert_with(Default::default);
    let labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .filter(|l| !l.is_empty());
    if let Some(labels) = labels {
        if spec.selector.as_ref().is_none_or(|s| s.is_empty()) {
            spec.selector = Some(labels.clone());
        }
        if obj.metadata.labels.as_ref().is_none_or(|l| l.is_empty()) {
            obj.metadata.labels = Some(labels);
        }
    }
    set(&mut spec.replicas, 1);
    if let Some(t) = spec.template.as_mut() {
        pod_template(t);
    }
}

/// `SetDefaults_PersistentVolume`: phase Pending, reclaim policy Retain, volume mode
/// Filesystem.
pub fn persistent_volume(obj: &mut core::PersistentVolume) {
    let status = obj.status.get_or_insert_with(Default::default);
    set_str(&mut status.phase, "Pending");
    let spec = obj.spec.get_or_insert_with(Default::default);
    set_str(&mut spec.persistent_volume_reclaim_policy, "Retain");
    set(&mut spec.volume_mode, "Filesystem".to_string());
    if let Some(hp) = spec.host_path.as_mut() {
        set(&mut hp.type_, String::new());
    }
}

/// `SetDefaults_PersistentVolumeClaim`: phase Pending, volume mode Filesystem.
pub fn persistent_volume_claim(obj: &mut core::PersistentVolumeClaim) {
    let status = obj.status.get_or_insert_with(Default::default);
    set_str(&mut status.phase, "Pending");
    let spec = obj.spec.get_or_insert_with(Default::default);
    set(&mut spec.volume_mode, "Filesystem".to_string());
}

/// `SetDefaults_StorageClass`: reclaim policy Delete, binding mode Immediate.
pub fn storage_class(obj: &mut storage::StorageClass) {
    set(&mut obj.reclaim_policy, "Delete".to_string());
    set(&mut obj.volume_binding_mode, "Immediate".to_string());
}

pub fn endpoint_slice(obj: &mut discovery::EndpointSlice) {
    for p in obj.ports.iter_mut().flatten() {
        set(&mut p.name, String::new());
        set(&mut p.protocol, "TCP".to_string());
    }
}

pub fn ingress(_obj: &mut networking::Ingress) {}

/// `SetDefaults_IngressClass`: parameters without a scope refer to a cluster-scoped resource.
pub fn ingress_class(obj: &mut networking::IngressClass) {
    if let Some(params) = obj.spec.as_mut().and_then(|s| s.parameters.as_mut()) {
        set_str(&mut params.scope, "Cluster");
    }
}

pub fn network_policy(obj: &mut networking::NetworkPolicy) {
    let spec = obj.spec.get_or_insert_with(Default::default);
    for rule in spec.ingress.iter_mut().flatten() {
        for p in rule.ports.iter_mut().flatten() {
            set_str(&mut p.protocol, "TCP");
        }
    }
    for rule in spec.egress.iter_mut().flatten() {
        for p in rule.ports.iter_mut().flatten() {
            set_str(&mut p.protocol, "TCP");
        }
    }
    if spec.policy_types.as_ref().is_none_or(|t| t.is_empty()) {
        let mut types = vec!["Ingress".to_string()];
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".to_string());
        }
        spec.policy_types = Some(types);
    }
}

pub fn lease(_obj: &mut coordination::Lease) {}

pub fn events_event(_obj: &mut events::Event) {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_by_tag() {
        for (image, want) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.25", "IfNotPresent"),
            ("registry:5000/nginx", "Always"),
            ("registry:5000/nginx:1.0", "IfNotPresent"),
            ("nginx@sha256:abcd", "IfNotPresent"),
        ] {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn service_defaults() {
        let mut svc: core::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "my-service"},
            "spec": {"selector": {"app": "MyApp"}, "ports": [{"port": 80, "targetPort": 9376}, {"port": 81}]}
        }))
        .unwrap();
        service(&mut svc);
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.session_affinity.as_deref(), Some("None"));
        assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.external_traffic_policy, None);
        let ports = spec.ports.unwrap();
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(9376)));
        assert_eq!(ports[1].target_port, Some(IntOrString::Int(81)));

        let mut lb: core::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lb"},
            "spec": {"type": "LoadBalancer", "sessionAffinity": "ClientIP", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}
        }))
        .unwrap();
        service(&mut lb);
        let spec = lb.spec.as_ref().unwrap();
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));
        assert_eq!(
            spec.session_affinity_config
                .as_ref()
                .unwrap()
                .client_ip
                .as_ref()
                .unwrap()
                .timeout_seconds,
            Some(10800)
        );
        let ing = &lb.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0];
        assert_eq!(ing.ip_mode.as_deref(), Some("VIP"));
    }

    #[test]
    fn pod_and_deployment_defaults() {
        let mut d: apps::Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hostnames"},
            "spec": {
                "selector": {"matchLabels": {"app": "hostnames"}},
                "template": {
                    "metadata": {"labels": {"app": "hostnames"}},
                    "spec": {"containers": [{
                        "name": "hostnames", "image": "registry.k8s.io/serve_hostname",
                        "ports": [{"containerPort": 9376}],
                        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "readinessProbe": {"httpGet": {"port": 9376}}
                    }]}
                }
            }
        }))
        .unwrap();
        deployment(&mut d);
        let spec = d.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.revision_history_limit, Some(10));
        assert_eq!(spec.progress_deadline_seconds, Some(600));
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        let ru = strategy.rolling_update.unwrap();
        assert_eq!(ru.max_surge, Some(IntOrString::String("25%".into())));
        let ps = spec.template.spec.unwrap();
        assert_eq!(ps.restart_policy.as_deref(), Some("Always"));
        assert_eq!(ps.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(ps.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(ps.termination_grace_period_seconds, Some(30));
        assert_eq!(ps.enable_service_links, Some(true));
        assert!(ps.security_context.is_some());
        let c = &ps.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(
            c.ports.as_ref().unwrap()[0].protocol.as_deref(),
            Some("TCP")
        );
        let fr = c.env.as_ref().unwrap()[0]
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap();
        assert_eq!(fr.api_version.as_deref(), Some("v1"));
        let rp = c.readiness_probe.as_ref().unwrap();
        assert_eq!(
            (
                rp.timeout_seconds,
                rp.period_seconds,
                rp.success_threshold,
                rp.failure_threshold
            ),
            (Some(1), Some(10), Some(1), Some(3))
        );
        assert_eq!(rp.http_get.as_ref().unwrap().path.as_deref(), Some("/"));
        assert_eq!(
            rp.http_get.as_ref().unwrap().scheme.as_deref(),
            Some("HTTP")
        );
    }

    #[test]
    fn small_kinds() {
        let mut np: networking::NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]}
        }))
        .unwrap();
        network_policy(&mut np);
        let spec = np.spec.unwrap();
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        assert_eq!(
            spec.egress.unwrap()[0].ports.as_ref().unwrap()[0]
                .protocol
                .as_deref(),
            Some("TCP")
        );

        let mut s: core::Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"}, "stringData": {"a": "b"}
        }))
        .unwrap();
        secret(&mut s);
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        assert_eq!(s.data.unwrap()["a"].0, b"b".to_vec());
        assert!(s.string_data.is_none());

        let mut es: discovery::EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e"}, "addressType": "IPv4", "endpoints": [], "ports": [{"port": 80}]
        }))
        .unwrap();
        endpoint_slice(&mut es);
        let p = &es.ports.unwrap()[0];
        assert_eq!(
            (p.name.as_deref(), p.protocol.as_deref()),
            (Some(""), Some("TCP"))
        );

        let mut ns: core::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "team-a"}})).unwrap();
        namespace(&mut ns);
        assert_eq!(ns.metadata.labels.unwrap()[NAMESPACE_NAME_LABEL], "team-a");
    }
}
