//! Kind-specific create/update preparation (upstream's `PrepareForCreate` / `PrepareForUpdate`
//! beyond the generic metadata and status handling the API server does for every kind).

use k8s_openapi::api::core::v1 as core;

/// Every Namespace carries the immutable label `kubernetes.io/metadata.name=<name>`.
fn namespace_name_label(ns: &mut core::Namespace) {
    if let Some(name) = ns.metadata.name.clone().filter(|n| !n.is_empty()) {
        ns.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("kubernetes.io/metadata.name".to_string(), name);
    }
}

/// A new Namespace is `Active` and carries the `kubernetes` finalizer in its spec.
pub fn namespace_create(ns: &mut core::Namespace) {
    namespace_name_label(ns);
    let status = ns.status.get_or_insert_with(Default::default);
    status.phase = Some("Active".to_string());
    let spec = ns.spec.get_or_insert_with(Default::default);
    let finalizers = spec.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == "kubernetes") {
        finalizers.push("kubernetes".to_string());
    }
}

/// A Namespace update keeps the spec finalizers as they were (only `/finalize` changes them).
pub fn namespace_update(ns: &mut core::Namespace, old: &core::Namespace) {
    namespace_name_label(ns);
    let old_finalizers = old.spec.as_ref().and_then(|s| s.finalizers.clone());
    ns.spec.get_or_insert_with(Default::default).finalizers = old_finalizers;
}

/// A new Pod is `Pending`, with its QoS class.
pub fn pod_create(pod: &mut core::Pod) {
    let qos = qos_class(pod);
    let status = pod.status.get_or_insert_with(Default::default);
    status.phase = Some("Pending".to_string());
    status.qos_class = Some(qos.to_string());
}

/// The QoS class of a pod from its containers' requests and limits.
pub fn qos_class(pod: &core::Pod) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "BestEffort";
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let req = requests.and_then(|m| m.get(name));
            let lim = limits.and_then(|m| m.get(name));
            if req.is_some() || lim.is_some() {
                any = true;
            }
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if r != l => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}
