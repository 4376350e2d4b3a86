//! The smaller core kinds: Namespace, Node, Endpoints, ConfigMap, Secret, ServiceAccount, Event
//! (core and events.k8s.io), and coordination's Lease.

use std::collections::HashSet;

use k8s_openapi::api::coordination::v1 as coordination;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::events::v1 as events;

use super::common::{
    dns1123_label, go_strings, immutable, invalid_each, kube_finalizer_name, meta, non_special_ip,
    port_protocol, qualified_name, s, slice, validate_object_meta_update,
};
use ferry_apimachinery::errors::{ErrorList, FieldError, Path, quote};
use ferry_apimachinery::names;

/// core.MaxSecretSize: the total size of ConfigMap or Secret data.
pub(crate) const MAX_SECRET_SIZE: usize = 1024 * 1024;
const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const REASON_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;

pub(crate) fn namespace(ns: &core::Namespace, old: Option<&core::Namespace>) -> ErrorList {
    let mut errs = meta(
        &ns.metadata,
        old.map(|o| &o.metadata),
        false,
        names::name_is_dns_label,
    );
    if old.is_none() {
        let path = Path::new("spec").child("finalizers");
        for f in ns
            .spec
            .as_ref()
            .map(|sp| slice(&sp.finalizers))
            .unwrap_or(&[])
        {
            errs.extend(qualified_name(f, &path));
            errs.extend(kube_finalizer_name(f, &path));
        }
    }
    errs
}

pub(crate) fn namespace_status(ns: &core::Namespace, old: &core::Namespace) -> ErrorList {
    let mut errs = validate_object_meta_update(&ns.metadata, &old.metadata, &Path::new("metadata"));
    let phase = ns.status.as_ref().map(|st| s(&st.phase)).unwrap_or("");
    let path = Path::new("status").child("Phase");
    if ns.metadata.deletion_timestamp.is_none() {
        if phase != "Active" {
            errs.push(FieldError::invalid_str(
                path,
                phase,
                "may only be 'Active' if `deletionTimestamp` is empty",
            ));
        }
    } else if phase != "Terminating" {
        errs.push(FieldError::invalid_str(
            path,
            phase,
            "may only be 'Terminating' if `deletionTimestamp` is not empty",
        ));
    }
    errs
}

fn node_taints(taints: &[core::Taint], path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for (i, t) in taints.iter().enumerate() {
        let p = path.index(i);
        errs.extend(qualified_name(&t.key, &p.child("key")));
        let value = s(&t.value);
        let msgs = names::is_valid_label_value(value);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid_str(
                p.child("value"),
                value,
                msgs.join(";"),
            ));
        }
        match t.effect.as_str() {
            "" => errs.push(FieldError::required(p.child("effect"), "")),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute" => {}
            other => errs.push(FieldError::not_supported(
                p.child("effect"),
                other,
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            )),
        }
        if !seen.insert((t.effect.clone(), t.key.clone())) {
            let mut e = FieldError::duplicate(
                &p,
                format!(
                    "core.Taint{{Key:{}, Value:{}, Effect:{}, TimeAdded:<nil>}}",
                    quote(&t.key),
                    quote(value),
                    quote(&t.effect)
                ),
            );
            e.detail = "taints must be unique by key and effect pair".to_string();
            errs.push(e);
        }
    }
    errs
}

pub(crate) fn node(node: &core::Node, old: Option<&core::Node>) -> ErrorList {
    let mut errs = meta(
        &node.metadata,
        old.map(|o| &o.metadata),
        false,
        names::name_is_dns_subdomain,
    );
    let spec = node.spec.clone().unwrap_or_default();
    // Upstream reports taints under `metadata.taints`.
    errs.extend(node_taints(
        slice(&spec.taints),
        &Path::new("metadata").child("taints"),
    ));
    let cidrs = slice(&spec.pod_cidrs);
    let cidr_path = Path::new("spec").child("podCIDRs");
    if old.is_none() && !cidrs.is_empty() {
        for (i, c) in cidrs.iter().enumerate() {
            errs.extend(names::is_valid_cidr(&cidr_path.index(i), c));
        }
        if cidrs.len() > 1 {
            let v6 = cidrs.iter().filter(|c| c.contains(':')).count();
            if cidrs.len() > 2 || v6 != 1 {
                errs.push(FieldError::invalid(
                    &cidr_path,
                    go_strings(cidrs),
                    "may specify no more than one CIDR for each IP family",
                ));
            }
            let mut seen = HashSet::new();
            for (i, c) in cidrs.iter().enumerate() {
                if !seen.insert(c) {
                    errs.push(FieldError::duplicate(cidr_path.index(i), quote(c)));
                }
            }
        }
    }
    if let Some(old) = old {
        let old_spec = old.spec.clone().unwrap_or_default();
        let old_cidrs = slice(&old_spec.pod_cidrs);
        if !old_cidrs.is_empty() && old_cidrs != cidrs {
            errs.push(FieldError::forbidden(
                &cidr_path,
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        let old_pid = s(&old_spec.provider_id);
        if !old_pid.is_empty() && old_pid != s(&spec.provider_id) {
            errs.push(FieldError::forbidden(
                Path::new("spec").child("providerID"),
                "node updates may not change providerID except from \"\" to valid",
            ));
        }
        if spec.external_id != old_spec.external_id {
            errs.push(FieldError::forbidden(
                Path::new("spec").child("externalID"),
                "may not be updated",
            ));
        }
        let mut seen = HashSet::new();
        for (i, a) in node
            .status
            .as_ref()
            .map(|st| slice(&st.addresses))
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            if !seen.insert((a.type_.clone(), a.address.clone())) {
                errs.push(FieldError::duplicate(
                    Path::new("status").child("addresses").index(i),
                    format!(
                        "core.NodeAddress{{Type:{}, Address:{}}}",
                        quote(&a.type_),
                        quote(&a.address)
                    ),
                ));
            }
        }
    }
    errs
}

fn endpoint_address(a: &core::EndpointAddress, path: &Path) -> ErrorList {
    let mut errs = names::is_valid_ip(&path.child("ip"), &a.ip);
    let hostname = s(&a.hostname);
    if !hostname.is_empty() {
        errs.extend(dns1123_label(hostname, &path.child("hostname")));
    }
    if let Some(node) = &a.node_name {
        errs.extend(invalid_each(
            &path.child("nodeName"),
            node,
            names::is_dns1123_subdomain(node),
        ));
    }
    errs.extend(non_special_ip(&a.ip, &path.child("ip")));
    errs
}

pub(crate) fn endpoints(ep: &core::Endpoints, old: Option<&core::Endpoints>) -> ErrorList {
    let mut errs = meta(
        &ep.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let path = Path::new("subsets");
    for (i, ss) in slice(&ep.subsets).iter().enumerate() {
        let p = path.index(i);
        let (addrs, not_ready) = (slice(&ss.addresses), slice(&ss.not_ready_addresses));
        if addrs.is_empty() && not_ready.is_empty() {
            errs.push(FieldError::required(
                &p,
                "must specify `addresses` or `notReadyAddresses`",
            ));
        }
        for (j, a) in addrs.iter().enumerate() {
            errs.extend(endpoint_address(a, &p.child("addresses").index(j)));
        }
        for (j, a) in not_ready.iter().enumerate() {
            errs.extend(endpoint_address(a, &p.child("notReadyAddresses").index(j)));
        }
        let ports = slice(&ss.ports);
        for (j, port) in ports.iter().enumerate() {
            let pp = p.child("ports").index(j);
            let name = s(&port.name);
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(pp.child("name"), ""));
            } else if !name.is_empty() {
                errs.extend(dns1123_label(name, &pp.child("name")));
            }
            for m in names::is_valid_port_num(i64::from(port.port)) {
                errs.push(FieldError::invalid(
                    pp.child("port"),
                    port.port.to_string(),
                    m,
                ));
            }
            errs.extend(port_protocol(
                port.protocol.as_deref(),
                &pp.child("protocol"),
            ));
            if let Some(app) = &port.app_protocol {
                errs.extend(qualified_name(app, &pp.child("appProtocol")));
            }
        }
    }
    errs
}

pub(crate) fn config_map(cm: &core::ConfigMap, old: Option<&core::ConfigMap>) -> ErrorList {
    let mut errs = meta(
        &cm.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    if let Some(old) = old
        && old.immutable == Some(true)
    {
        if cm.immutable != Some(true) {
            errs.push(FieldError::forbidden(
                Path::new("immutable"),
                "field is immutable when `immutable` is set",
            ));
        }
        if cm.data != old.data {
            errs.push(FieldError::forbidden(
                Path::new("data"),
                "field is immutable when `immutable` is set",
            ));
        }
        if cm.binary_data != old.binary_data {
            errs.push(FieldError::forbidden(
                Path::new("binaryData"),
                "field is immutable when `immutable` is set",
            ));
        }
    }
    let mut total = 0usize;
    let binary = cm.binary_data.clone().unwrap_or_default();
    for (k, v) in cm.data.iter().flatten() {
        let p = Path::new("data").key(k);
        errs.extend(invalid_each(&p, k, names::is_config_map_key(k)));
        if binary.contains_key(k) {
            errs.push(FieldError::invalid_str(
                &p,
                k,
                "duplicate of key present in binaryData",
            ));
        }
        total += v.len();
    }
    for (k, v) in &binary {
        errs.extend(invalid_each(
            &Path::new("binaryData").key(k),
            k,
            names::is_config_map_key(k),
        ));
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(Path::new(""), MAX_SECRET_SIZE));
    }
    errs
}

pub(crate) fn secret(secret: &core::Secret, old: Option<&core::Secret>) -> ErrorList {
    let mut errs = meta(
        &secret.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    if let Some(old) = old {
        errs.extend(immutable(
            &s(&secret.type_),
            &s(&old.type_),
            &Path::new("type"),
            || quote(s(&secret.type_)),
        ));
        if old.immutable == Some(true) {
            if secret.immutable != Some(true) {
                errs.push(FieldError::forbidden(
                    Path::new("immutable"),
                    "field is immutable when `immutable` is set",
                ));
            }
            if secret.data != old.data {
                errs.push(FieldError::forbidden(
                    Path::new("data"),
                    "field is immutable when `immutable` is set",
                ));
            }
        }
    }
    let data_path = Path::new("data");
    let data = secret.data.clone().unwrap_or_default();
    let mut total = 0usize;
    for (k, v) in &data {
        errs.extend(invalid_each(
            &data_path.key(k),
            k,
            names::is_config_map_key(k),
        ));
        total += v.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(&data_path, MAX_SECRET_SIZE));
    }
    let redacted = "\"<secret contents redacted>\"";
    match s(&secret.type_) {
        "kubernetes.io/service-account-token" => {
            let name = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/service-account.name"))
                .map(String::as_str)
                .unwrap_or("");
            if name.is_empty() {
                errs.push(FieldError::required(
                    Path::new("metadata")
                        .child("annotations")
                        .key("kubernetes.io/service-account.name"),
                    "",
                ));
            }
        }
        t @ ("kubernetes.io/dockercfg" | "kubernetes.io/dockerconfigjson") => {
            let key = if t == "kubernetes.io/dockercfg" {
                ".dockercfg"
            } else {
                ".dockerconfigjson"
            };
            match data.get(key) {
                None => errs.push(FieldError::required(data_path.key(key), "")),
                Some(v) => {
                    if let Err(e) =
                        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&v.0)
                    {
                        errs.push(FieldError::invalid(
                            data_path.key(key),
                            redacted,
                            e.to_string(),
                        ));
                    }
                }
            }
        }
        "kubernetes.io/basic-auth"
            if !data.contains_key("username") && !data.contains_key("password") =>
        {
            errs.push(FieldError::required(data_path.key("username"), ""));
            errs.push(FieldError::required(data_path.key("password"), ""));
        }
        "kubernetes.io/ssh-auth" if data.get("ssh-privatekey").is_none_or(|v| v.0.is_empty()) => {
            errs.push(FieldError::required(data_path.key("ssh-privatekey"), ""));
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !data.contains_key(key) {
                    errs.push(FieldError::required(data_path.key(key), ""));
                }
            }
        }
        _ => {}
    }
    errs
}

pub(crate) fn service_account(
    sa: &core::ServiceAccount,
    old: Option<&core::ServiceAccount>,
) -> ErrorList {
    meta(
        &sa.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    )
}

pub(crate) fn lease(lease: &coordination::Lease, old: Option<&coordination::Lease>) -> ErrorList {
    let mut errs = meta(
        &lease.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let Some(spec) = &lease.spec else { return errs };
    let path = Path::new("spec");
    if let Some(d) = spec.lease_duration_seconds
        && d <= 0
    {
        errs.push(FieldError::invalid(
            path.child("leaseDurationSeconds"),
            d.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(t) = spec.lease_transitions
        && t < 0
    {
        errs.push(FieldError::invalid(
            path.child("leaseTransitions"),
            t.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(strategy) = &spec.strategy {
        if strategy.is_empty() {
            errs.push(FieldError::required(path.child("strategy"), ""));
        } else if strategy != "OldestEmulationVersion" {
            errs.push(FieldError::not_supported(
                path.child("strategy"),
                strategy,
                &["OldestEmulationVersion"],
            ));
        }
    }
    if !s(&spec.preferred_holder).is_empty() && s(&spec.strategy).is_empty() {
        errs.push(FieldError::forbidden(
            path.child("preferredHolder"),
            "may only be specified if `strategy` is defined",
        ));
    }
    errs
}

/// The fields an event carries, whichever API it came through.
struct EventView<'a> {
    namespace: &'a str,
    involved_namespace: &'a str,
    has_event_time: bool,
    reporting_controller: &'a str,
    reporting_controller_field: &'static str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    message: &'a str,
}

/// Upstream's `legacyValidateEvent`.
fn legacy_event(e: &EventView<'_>) -> ErrorList {
    let mut errs = Vec::new();
    let ns_path = Path::new("involvedObject").child("namespace");
    if !e.has_event_time {
        if e.involved_namespace.is_empty() {
            if !e.namespace.is_empty() && e.namespace != "default" {
                errs.push(FieldError::invalid_str(
                    &ns_path,
                    e.involved_namespace,
                    "does not match event.namespace",
                ));
            }
        } else if e.namespace != e.involved_namespace {
            errs.push(FieldError::invalid_str(
                &ns_path,
                e.involved_namespace,
                "does not match event.namespace",
            ));
        }
    } else {
        if e.involved_namespace.is_empty()
            && e.namespace != "default"
            && e.namespace != "kube-system"
        {
            errs.push(FieldError::invalid_str(
                &ns_path,
                e.involved_namespace,
                "does not match event.namespace",
            ));
        }
        let rc = Path::new(e.reporting_controller_field);
        if e.reporting_controller.is_empty() {
            errs.push(FieldError::required(&rc, ""));
        }
        errs.extend(qualified_name(e.reporting_controller, &rc));
        let limits = [
            (
                "reportingInstance",
                e.reporting_instance,
                REPORTING_INSTANCE_LENGTH_LIMIT,
                true,
            ),
            ("action", e.action, ACTION_LENGTH_LIMIT, true),
            ("reason", e.reason, REASON_LENGTH_LIMIT, true),
            ("message", e.message, NOTE_LENGTH_LIMIT, false),
        ];
        for (field, value, limit, required) in limits {
            if required && value.is_empty() {
                errs.push(FieldError::required(Path::new(field), ""));
            }
            if value.len() > limit {
                errs.push(FieldError::invalid_str(
                    Path::new(field),
                    "",
                    format!("can have at most {limit} characters"),
                ));
            }
        }
    }
    errs.extend(invalid_each(
        &Path::new("namespace"),
        e.namespace,
        names::is_dns1123_subdomain(e.namespace),
    ));
    errs
}

fn event_name_required(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> ErrorList {
    if s(&m.name).is_empty() {
        vec![FieldError::required(
            Path::new("metadata").child("name"),
            "name or generateName is required",
        )]
    } else {
        Vec::new()
    }
}

pub(crate) fn core_event(ev: &core::Event, old: Option<&core::Event>) -> ErrorList {
    let mut errs = match old {
        Some(old) => {
            validate_object_meta_update(&ev.metadata, &old.metadata, &Path::new("metadata"))
        }
        None => event_name_required(&ev.metadata),
    };
    errs.extend(legacy_event(&EventView {
        namespace: s(&ev.metadata.namespace),
        involved_namespace: s(&ev.involved_object.namespace),
        has_event_time: ev.event_time.is_some(),
        reporting_controller: s(&ev.reporting_component),
        reporting_controller_field: "reportingComponent",
        reporting_instance: s(&ev.reporting_instance),
        action: s(&ev.action),
        reason: s(&ev.reason),
        message: s(&ev.message),
    }));
    errs
}

pub(crate) fn events_event(ev: &events::Event, old: Option<&events::Event>) -> ErrorList {
    let regarding = ev.regarding.clone().unwrap_or_default();
    let mut errs = legacy_event(&EventView {
        namespace: s(&ev.metadata.namespace),
        involved_namespace: s(&regarding.namespace),
        has_event_time: ev.event_time.is_some(),
        reporting_controller: s(&ev.reporting_controller),
        reporting_controller_field: "reportingController",
        reporting_instance: s(&ev.reporting_instance),
        action: s(&ev.action),
        reason: s(&ev.reason),
        message: s(&ev.note),
    });
    errs.extend(meta(
        &ev.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    ));
    if old.is_none() {
        if ev.event_time.is_none() {
            errs.push(FieldError::required(Path::new("eventTime"), ""));
        }
        let t = s(&ev.type_);
        if t != "Normal" && t != "Warning" {
            errs.push(FieldError::invalid_str(
                Path::new("type"),
                "",
                format!("has invalid value: {t}"),
            ));
        }
        if ev.deprecated_first_timestamp.is_some() {
            errs.push(FieldError::invalid_str(
                Path::new("firstTimestamp"),
                "",
                "needs to be unset",
            ));
        }
        if ev.deprecated_last_timestamp.is_some() {
            errs.push(FieldError::invalid_str(
                Path::new("lastTimestamp"),
                "",
                "needs to be unset",
            ));
        }
        if ev.deprecated_count.unwrap_or(0) != 0 {
            errs.push(FieldError::invalid_str(
                Path::new("count"),
                "",
                "needs to be unset",
            ));
        }
        if let Some(src) = &ev.deprecated_source
            && (!s(&src.component).is_empty() || !s(&src.host).is_empty())
        {
            errs.push(FieldError::invalid_str(
                Path::new("source"),
                "",
                "needs to be unset",
            ));
        }
        if let Some(series) = &ev.series
            && series.count < 2
        {
            {
                errs.push(FieldError::invalid(
                    Path::new("series").child("count"),
                    "\"\"",
                    format!("should be at least 2, got {}", series.count),
                ));
            }
        }
    }
    errs
}
