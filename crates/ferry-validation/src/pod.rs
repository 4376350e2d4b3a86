//! Pod and pod template validation (upstream `ValidatePodCreate`, `ValidatePodSpec`,
//! `ValidatePodUpdate`, `ValidatePodStatusUpdate`, `ValidatePodTemplateSpec`).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1 as core;

use super::common::{
    dns1123_label, go_strings, invalid_each, meta, nonneg, port_num_or_name, port_protocol,
    qualified_name, s, slice, validate_annotations, validate_labels, validate_object_meta_update,
};
use ferry_apimachinery::errors::{ErrorList, FieldError, Path, quote};
use ferry_apimachinery::names;

pub(crate) const MAX_DNS_NAMESERVERS: usize = 3;
pub(crate) const MAX_DNS_SEARCH_PATHS: usize = 32;
pub(crate) const MAX_DNS_SEARCH_LIST_CHARS: usize = 2048;
const MAX_INT32: i64 = i32::MAX as i64;

const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const URI_SCHEMES: &[&str] = &["HTTP", "HTTPS"];
const UPDATABLE_POD_SPEC_FIELDS: &str = "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Where the spec is validated: a Pod requires container images, a template does not (an
/// admission step may fill them in).
#[derive(Clone, Copy)]
pub(crate) struct Opts {
    pub resource_is_pod: bool,
}

fn validate_volumes(volumes: &[core::Volume], path: &Path) -> (HashSet<String>, ErrorList) {
    let mut errs = Vec::new();
    let mut names_ok = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let p = path.index(i);
        let mut el = Vec::new();
        // Count the volume sources that are set: every field but the name is a source.
        let sources: Vec<String> = match serde_json::to_value(v) {
            Ok(serde_json::Value::Object(m)) => {
                m.keys().filter(|k| k.as_str() != "name").cloned().collect()
            }
            _ => Vec::new(),
        };
        if sources.is_empty() {
            el.push(FieldError::required(&p, "must specify a volume type"));
        }
        for extra in sources.iter().skip(1) {
            el.push(FieldError::forbidden(
                p.child(extra),
                "may not specify more than 1 volume type",
            ));
        }
        if v.name.is_empty() {
            el.push(FieldError::required(p.child("name"), ""));
        } else {
            el.extend(dns1123_label(&v.name, &p.child("name")));
        }
        if names_ok.contains(&v.name) {
            el.push(FieldError::duplicate(p.child("name"), quote(&v.name)));
        }
        if el.is_empty() {
            names_ok.insert(v.name.clone());
        } else {
            errs.extend(el);
        }
    }
    (names_ok, errs)
}

fn validate_container_ports(ports: &[core::ContainerPort], path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let mut seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = path.index(i);
        let name = s(&port.name);
        if !name.is_empty() {
            let msgs = names::is_valid_port_name(name);
            if !msgs.is_empty() {
                errs.extend(invalid_each(&p.child("name"), name, msgs));
            } else if !seen.insert(name.to_string()) {
                errs.push(FieldError::duplicate(p.child("name"), quote(name)));
            }
        }
        if port.container_port == 0 {
            errs.push(FieldError::required(p.child("containerPort"), ""));
        } else {
            for m in names::is_valid_port_num(i64::from(port.container_port)) {
                errs.push(FieldError::invalid(
                    p.child("containerPort"),
                    port.container_port.to_string(),
                    m,
                ));
            }
        }
        let hp = port.host_port.unwrap_or(0);
        if hp != 0 {
            for m in names::is_valid_port_num(i64::from(hp)) {
                errs.push(FieldError::invalid(p.child("hostPort"), hp.to_string(), m));
            }
        }
        errs.extend(port_protocol(
            port.protocol.as_deref(),
            &p.child("protocol"),
        ));
    }
    errs
}

fn is_valid_env_field_path(fp: &str) -> bool {
    const PLAIN: &[&str] = &[
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.hostIPs",
        "status.podIP",
        "status.podIPs",
    ];
    if PLAIN.contains(&fp) {
        return true;
    }
    for prefix in ["metadata.labels['", "metadata.annotations['"] {
        if let Some(rest) = fp.strip_prefix(prefix).and_then(|r| r.strip_suffix("']")) {
            return names::is_qualified_name(&rest.to_lowercase()).is_empty();
        }
    }
    false
}

fn validate_env(vars: &[core::EnvVar], path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    for (i, ev) in vars.iter().enumerate() {
        let p = path.index(i);
        if ev.name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        }
        errs.extend(invalid_each(
            &p.child("name"),
            &ev.name,
            names::is_relaxed_env_var_name(&ev.name),
        ));
        let Some(from) = &ev.value_from else { continue };
        let vp = p.child("valueFrom");
        let mut sources = 0;
        if let Some(fr) = &from.field_ref {
            sources += 1;
            let fp = vp.child("fieldRef");
            if s(&fr.api_version).is_empty() {
                errs.push(FieldError::required(fp.child("apiVersion"), ""));
            } else if fr.field_path.is_empty() {
                errs.push(FieldError::required(fp.child("fieldPath"), ""));
            } else if !is_valid_env_field_path(&fr.field_path) {
                errs.push(FieldError::not_supported(
                    fp.child("fieldPath"),
                    &fr.field_path,
                    &[
                        "metadata.annotations",
                        "metadata.labels",
                        "metadata.name",
                        "metadata.namespace",
                        "metadata.uid",
                        "spec.nodeName",
                        "spec.serviceAccountName",
                        "status.hostIP",
                        "status.hostIPs",
                        "status.podIP",
                        "status.podIPs",
                    ],
                ));
            }
        }
        if let Some(rf) = &from.resource_field_ref {
            sources += 1;
            if rf.resource.is_empty() {
                errs.push(FieldError::required(
                    vp.child("resourceFieldRef").child("resource"),
                    "",
                ));
            }
        }
        if let Some(cm) = &from.config_map_key_ref {
            sources += 1;
            let kp = vp.child("configMapKeyRef");
            if cm.name.is_empty() {
                errs.push(FieldError::required(kp.child("name"), ""));
            }
            if cm.key.is_empty() {
                errs.push(FieldError::required(kp.child("key"), ""));
            } else {
                errs.extend(invalid_each(
                    &kp.child("key"),
                    &cm.key,
                    names::is_config_map_key(&cm.key),
                ));
            }
        }
        if let Some(sk) = &from.secret_key_ref {
            sources += 1;
            let kp = vp.child("secretKeyRef");
            if sk.name.is_empty() {
                errs.push(FieldError::required(kp.child("name"), ""));
            }
            if sk.key.is_empty() {
                errs.push(FieldError::required(kp.child("key"), ""));
            } else {
                errs.extend(invalid_each(
                    &kp.child("key"),
                    &sk.key,
                    names::is_config_map_key(&sk.key),
                ));
            }
        }
        if from.file_key_ref.is_some() {
            sources += 1;
        }
        if sources == 0 {
            errs.push(FieldError::invalid_str(
                &vp,
                "",
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
            ));
        } else if !s(&ev.value).is_empty() {
            errs.push(FieldError::invalid_str(
                &vp,
                "",
                "may not be specified when `value` is not empty",
            ));
        } else if sources > 1 {
            errs.push(FieldError::invalid_str(
                &vp,
                "",
                "may not have more than one field specified at a time",
            ));
        }
    }
    errs
}

fn validate_volume_mounts(
    mounts: &[core::VolumeMount],
    volumes: &HashSet<String>,
    path: &Path,
) -> ErrorList {
    let mut errs = Vec::new();
    let mut paths = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let p = path.index(i);
        if m.name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else if !volumes.contains(&m.name) {
            errs.push(FieldError::not_found(p.child("name"), quote(&m.name)));
        }
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(p.child("mountPath"), ""));
        } else if !paths.insert(m.mount_path.clone()) {
            errs.push(FieldError::invalid_str(
                p.child("mountPath"),
                &m.mount_path,
                "must be unique",
            ));
        }
    }
    errs
}

fn validate_probe(probe: Option<&core::Probe>, path: &Path, kind: &str) -> ErrorList {
    let mut errs = Vec::new();
    let Some(probe) = probe else { return errs };
    // The handler: exactly one of exec, httpGet, tcpSocket, grpc.
    let mut handlers = 0;
    if let Some(exec) = &probe.exec {
        handlers += 1;
        if slice(&exec.command).is_empty() {
            errs.push(FieldError::required(
                path.child("exec").child("command"),
                "",
            ));
        }
    }
    if let Some(http) = &probe.http_get {
        if handlers > 0 {
            errs.push(FieldError::forbidden(
                path.child("httpGet"),
                "may not specify more than 1 handler type",
            ));
        } else {
            handlers += 1;
            let hp = path.child("httpGet");
            if s(&http.path).is_empty() {
                errs.push(FieldError::required(hp.child("path"), ""));
            }
            errs.extend(port_num_or_name(Some(&http.port), &hp.child("port")));
            let scheme = s(&http.scheme);
            if !URI_SCHEMES.contains(&scheme) {
                errs.push(FieldError::not_supported(
                    hp.child("scheme"),
                    scheme,
                    URI_SCHEMES,
                ));
            }
        }
    }
    if let Some(tcp) = &probe.tcp_socket {
        if handlers > 0 {
            errs.push(FieldError::forbidden(
                path.child("tcpSocket"),
                "may not specify more than 1 handler type",
            ));
        } else {
            handlers += 1;
            errs.extend(port_num_or_name(
                Some(&tcp.port),
                &path.child("tcpSocket").child("port"),
            ));
        }
    }
    if let Some(grpc) = &probe.grpc {
        if handlers > 0 {
            errs.push(FieldError::forbidden(
                path.child("grpc"),
                "may not specify more than 1 handler type",
            ));
        } else {
            handlers += 1;
            for m in names::is_valid_port_num(i64::from(grpc.port)) {
                errs.push(FieldError::invalid(
                    path.child("grpc").child("port"),
                    grpc.port.to_string(),
                    m,
                ));
            }
        }
    }
    if handlers == 0 {
        errs.push(FieldError::required(path, "must specify a handler type"));
    }
    errs.extend(nonneg(
        i64::from(probe.initial_delay_seconds.unwrap_or(0)),
        &path.child("initialDelaySeconds"),
    ));
    errs.extend(nonneg(
        i64::from(probe.timeout_seconds.unwrap_or(0)),
        &path.child("timeoutSeconds"),
    ));
    errs.extend(nonneg(
        i64::from(probe.period_seconds.unwrap_or(0)),
        &path.child("periodSeconds"),
    ));
    errs.extend(nonneg(
        i64::from(probe.success_threshold.unwrap_or(0)),
        &path.child("successThreshold"),
    ));
    errs.extend(nonneg(
        i64::from(probe.failure_threshold.unwrap_or(0)),
        &path.child("failureThreshold"),
    ));
    match kind {
        "liveness" | "startup" => {
            let st = probe.success_threshold.unwrap_or(0);
            if st != 1 {
                errs.push(FieldError::invalid(
                    path.child("successThreshold"),
                    st.to_string(),
                    "must be 1",
                ));
            }
            if let Some(t) = probe.termination_grace_period_seconds
                && t <= 0
            {
                errs.push(FieldError::invalid(
                    path.child("terminationGracePeriodSeconds"),
                    t.to_string(),
                    "must be greater than 0",
                ));
            }
        }
        _ => {
            if let Some(t) = probe.termination_grace_period_seconds {
                errs.push(FieldError::invalid(
                    path.child("terminationGracePeriodSeconds"),
                    t.to_string(),
                    "must not be set for readinessProbes",
                ));
            }
        }
    }
    errs
}

fn validate_containers(
    containers: &[core::Container],
    volumes: &HashSet<String>,
    path: &Path,
    opts: Opts,
    init: bool,
    names_seen: &mut HashSet<String>,
) -> ErrorList {
    let mut errs = Vec::new();
    if containers.is_empty() && !init {
        return vec![FieldError::required(path, "")];
    }
    for (i, c) in containers.iter().enumerate() {
        let p = path.index(i);
        if c.name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else {
            errs.extend(dns1123_label(&c.name, &p.child("name")));
        }
        if !c.name.is_empty() && !names_seen.insert(c.name.clone()) {
            errs.push(FieldError::duplicate(p.child("name"), quote(&c.name)));
        }
        let image = s(&c.image);
        if image.is_empty() {
            if opts.resource_is_pod {
                errs.push(FieldError::required(p.child("image"), ""));
            }
        } else if image.len() != image.trim().len() {
            errs.push(FieldError::invalid_str(
                p.child("image"),
                image,
                "must not have leading or trailing whitespace",
            ));
        }
        errs.extend(validate_container_ports(slice(&c.ports), &p.child("ports")));
        errs.extend(validate_env(slice(&c.env), &p.child("env")));
        errs.extend(validate_volume_mounts(
            slice(&c.volume_mounts),
            volumes,
            &p.child("volumeMounts"),
        ));
        let pull = s(&c.image_pull_policy);
        if pull.is_empty() {
            errs.push(FieldError::required(p.child("imagePullPolicy"), ""));
        } else if !PULL_POLICIES.contains(&pull) {
            errs.push(FieldError::not_supported(
                p.child("imagePullPolicy"),
                pull,
                PULL_POLICIES,
            ));
        }
        let tmp = s(&c.termination_message_policy);
        if tmp.is_empty() {
            errs.push(FieldError::required(
                p.child("terminationMessagePolicy"),
                "",
            ));
        } else if !TERMINATION_MESSAGE_POLICIES.contains(&tmp) {
            errs.push(FieldError::not_supported(
                p.child("terminationMessagePolicy"),
                tmp,
                TERMINATION_MESSAGE_POLICIES,
            ));
        }
        let sidecar = init && s(&c.restart_policy) == "Always";
        if !init || sidecar {
            errs.extend(validate_probe(
                c.liveness_probe.as_ref(),
                &p.child("livenessProbe"),
                "liveness",
            ));
            errs.extend(validate_probe(
                c.readiness_probe.as_ref(),
                &p.child("readinessProbe"),
                "readiness",
            ));
            errs.extend(validate_probe(
                c.startup_probe.as_ref(),
                &p.child("startupProbe"),
                "startup",
            ));
        } else {
            for (field, set) in [
                ("lifecycle", c.lifecycle.is_some()),
                ("livenessProbe", c.liveness_probe.is_some()),
                ("readinessProbe", c.readiness_probe.is_some()),
                ("startupProbe", c.startup_probe.is_some()),
            ] {
                if set {
                    errs.push(FieldError::forbidden(
                        p.child(field),
                        "may not be set for init containers without restartPolicy=Always",
                    ));
                }
            }
        }
    }
    errs
}

fn validate_dns_config(
    config: Option<&core::PodDNSConfig>,
    policy: &str,
    path: &Path,
) -> ErrorList {
    let mut errs = Vec::new();
    if policy == "None" {
        let Some(cfg) = config else {
            return vec![FieldError::required(
                path,
                "must provide `dnsConfig` when `dnsPolicy` is None",
            )];
        };
        if slice(&cfg.nameservers).is_empty() {
            return vec![FieldError::required(
                path.child("nameservers"),
                "must provide at least one DNS nameserver when `dnsPolicy` is None",
            )];
        }
    }
    let Some(cfg) = config else { return errs };
    let ns = slice(&cfg.nameservers);
    if ns.len() > MAX_DNS_NAMESERVERS {
        errs.push(FieldError::invalid(
            path.child("nameservers"),
            go_strings(ns),
            format!("must not have more than {MAX_DNS_NAMESERVERS} nameservers"),
        ));
    }
    for (i, n) in ns.iter().enumerate() {
        errs.extend(names::is_valid_ip(&path.child("nameservers").index(i), n));
    }
    let searches = slice(&cfg.searches);
    if searches.len() > MAX_DNS_SEARCH_PATHS {
        errs.push(FieldError::invalid(
            path.child("searches"),
            go_strings(searches),
            format!("must not have more than {MAX_DNS_SEARCH_PATHS} search paths"),
        ));
    }
    if searches.join(" ").len() > MAX_DNS_SEARCH_LIST_CHARS {
        errs.push(FieldError::invalid(
            path.child("searches"),
            go_strings(searches),
            format!("must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters (including spaces) in the search list"),
        ));
    }
    for (i, search) in searches.iter().enumerate() {
        if search == "." {
            continue;
        }
        let trimmed = search.strip_suffix('.').unwrap_or(search);
        errs.extend(invalid_each(
            &path.child("searches").index(i),
            trimmed,
            names::is_dns1123_subdomain_with_underscore(trimmed),
        ));
    }
    for (i, o) in slice(&cfg.options).iter().enumerate() {
        if s(&o.name).is_empty() {
            errs.push(FieldError::required(
                path.child("options").index(i),
                "Option.Name must not be empty",
            ));
        }
    }
    errs
}

pub(crate) fn validate_tolerations(tolerations: &[core::Toleration], path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    for (i, t) in tolerations.iter().enumerate() {
        let p = path.index(i);
        let key = s(&t.key);
        let op = s(&t.operator);
        let effect = s(&t.effect);
        if !key.is_empty() {
            errs.extend(qualified_name(key, &p.child("key")));
        }
        if key.is_empty() && op != "Exists" {
            errs.push(FieldError::invalid_str(
                p.child("operator"),
                op,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            errs.push(FieldError::invalid_str(
                p.child("effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        let value = s(&t.value);
        match op {
            "Equal" | "" => {
                let msgs = names::is_valid_label_value(value);
                if !msgs.is_empty() {
                    errs.push(FieldError::invalid_str(
                        p.child("operator"),
                        value,
                        msgs.join(";"),
                    ));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errs.push(FieldError::invalid(
                        p.child("operator"),
                        format!(
                            "core.Toleration{{Key:{}, Operator:\"Exists\", Value:{}, Effect:{}, TolerationSeconds:(*int64)(nil)}}",
                            quote(key),
                            quote(value),
                            quote(effect)
                        ),
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                p.child("operator"),
                other,
                &["Equal", "Exists"],
            )),
        }
        if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
            errs.push(FieldError::not_supported(
                p.child("effect"),
                effect,
                TAINT_EFFECTS,
            ));
        }
    }
    errs
}

/// ValidatePodSpec.
pub(crate) fn validate_pod_spec(spec: &core::PodSpec, path: &Path, opts: Opts) -> ErrorList {
    let mut errs = Vec::new();
    let (volumes, verrs) = validate_volumes(slice(&spec.volumes), &path.child("volumes"));
    errs.extend(verrs);
    let mut container_names = HashSet::new();
    errs.extend(validate_containers(
        &spec.containers,
        &volumes,
        &path.child("containers"),
        opts,
        false,
        &mut container_names,
    ));
    errs.extend(validate_containers(
        slice(&spec.init_containers),
        &volumes,
        &path.child("initContainers"),
        opts,
        true,
        &mut container_names,
    ));
    if spec.host_network == Some(true) {
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, port) in slice(&c.ports).iter().enumerate() {
                let hp = port.host_port.unwrap_or(0);
                if hp != 0 && hp != port.container_port {
                    errs.push(FieldError::invalid(
                        path.child("containers")
                            .index(i)
                            .child("ports")
                            .index(j)
                            .child("hostPort"),
                        hp.to_string(),
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    let rp = s(&spec.restart_policy);
    if rp.is_empty() {
        errs.push(FieldError::required(path.child("restartPolicy"), ""));
    } else if !RESTART_POLICIES.contains(&rp) {
        errs.push(FieldError::not_supported(
            path.child("restartPolicy"),
            rp,
            RESTART_POLICIES,
        ));
    }
    let dp = s(&spec.dns_policy);
    if dp.is_empty() {
        errs.push(FieldError::required(path.child("dnsPolicy"), ""));
    } else if !DNS_POLICIES.contains(&dp) {
        errs.push(FieldError::not_supported(
            path.child("dnsPolicy"),
            dp,
            DNS_POLICIES,
        ));
    }
    errs.extend(validate_labels(
        spec.node_selector.as_ref(),
        &path.child("nodeSelector"),
    ));
    for (i, secret) in slice(&spec.image_pull_secrets).iter().enumerate() {
        if secret.name.is_empty() {
            errs.push(FieldError::required(
                path.child("imagePullSecrets").index(i).child("name"),
                "",
            ));
        }
    }
    errs.extend(validate_dns_config(
        spec.dns_config.as_ref(),
        dp,
        &path.child("dnsConfig"),
    ));
    for (i, g) in slice(&spec.readiness_gates).iter().enumerate() {
        errs.extend(qualified_name(
            &g.condition_type,
            &path.child("readinessGates").index(i).child("conditionType"),
        ));
    }
    let sa = s(&spec.service_account_name);
    if !sa.is_empty() {
        errs.extend(invalid_each(
            &path.child("serviceAccountName"),
            sa,
            names::is_dns1123_subdomain(sa),
        ));
    }
    let node = s(&spec.node_name);
    if !node.is_empty() {
        errs.extend(invalid_each(
            &path.child("nodeName"),
            node,
            names::is_dns1123_subdomain(node),
        ));
    }
    if let Some(ads) = spec.active_deadline_seconds
        && !(1..=MAX_INT32).contains(&ads)
    {
        errs.push(FieldError::invalid(
            path.child("activeDeadlineSeconds"),
            ads.to_string(),
            names::inclusive_range_error(1, MAX_INT32),
        ));
    }
    let hostname = s(&spec.hostname);
    if !hostname.is_empty() {
        errs.extend(dns1123_label(hostname, &path.child("hostname")));
    }
    let subdomain = s(&spec.subdomain);
    if !subdomain.is_empty() {
        errs.extend(dns1123_label(subdomain, &path.child("subdomain")));
    }
    errs.extend(validate_tolerations(
        slice(&spec.tolerations),
        &path.child("tolerations"),
    ));
    for (i, ha) in slice(&spec.host_aliases).iter().enumerate() {
        let p = path.child("hostAliases").index(i);
        errs.extend(names::is_valid_ip(&p.child("ip"), &ha.ip));
        for (j, h) in slice(&ha.hostnames).iter().enumerate() {
            errs.extend(invalid_each(
                &p.child("hostnames").index(j),
                h,
                names::is_dns1123_subdomain(h),
            ));
        }
    }
    let pcn = s(&spec.priority_class_name);
    if !pcn.is_empty() {
        errs.extend(invalid_each(
            &path.child("priorityClassName"),
            pcn,
            names::is_dns1123_subdomain(pcn),
        ));
    }
    if let Some(os) = &spec.os {
        if os.name.is_empty() {
            errs.push(FieldError::required(
                path.child("os").child("name"),
                "cannot be empty",
            ));
        } else if !["linux", "windows"].contains(&os.name.as_str()) {
            errs.push(FieldError::not_supported(
                path.child("os"),
                &os.name,
                &["linux", "windows"],
            ));
        }
    }
    errs
}

/// ValidatePodTemplateSpec (a template inside a workload).
pub(crate) fn validate_pod_template_spec(t: &core::PodTemplateSpec, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let meta = t.metadata.clone().unwrap_or_default();
    errs.extend(validate_labels(meta.labels.as_ref(), &path.child("labels")));
    errs.extend(validate_annotations(
        meta.annotations.as_ref(),
        &path.child("annotations"),
    ));
    let spec = t.spec.clone().unwrap_or_default();
    errs.extend(validate_pod_spec(
        &spec,
        &path.child("spec"),
        Opts {
            resource_is_pod: false,
        },
    ));
    if !slice(&spec.ephemeral_containers).is_empty() {
        errs.push(FieldError::forbidden(
            path.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    errs
}

fn validate_pod_ips(pod: &core::Pod) -> ErrorList {
    let mut errs = Vec::new();
    let Some(status) = &pod.status else {
        return errs;
    };
    let path = Path::new("status").child("podIPs");
    let ips = slice(&status.pod_ips);
    for (i, ip) in ips.iter().enumerate() {
        errs.extend(names::is_valid_ip(&path.index(i), &ip.ip));
    }
    let pod_ip = s(&status.pod_ip);
    if !pod_ip.is_empty() {
        if ips.is_empty() {
            errs.extend(names::is_valid_ip(
                &Path::new("status").child("podIP"),
                pod_ip,
            ));
        } else if ips[0].ip != pod_ip {
            errs.push(FieldError::invalid_str(
                path.index(0).child("ip"),
                &ips[0].ip,
                "must match `podIP`",
            ));
        }
    }
    if ips.len() > 1 {
        let v6 = ips
            .iter()
            .filter(|ip| names::is_ipv6_string(&ip.ip))
            .count();
        if ips.len() > 2 || v6 != 1 {
            let rendered = format!(
                "[]core.PodIP{{{}}}",
                ips.iter()
                    .map(|ip| format!("core.PodIP{{IP:{}}}", quote(&ip.ip)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            errs.push(FieldError::invalid(
                &path,
                rendered,
                "may specify no more than one IP for each IP family",
            ));
        }
        let mut seen = HashSet::new();
        for (i, ip) in ips.iter().enumerate() {
            if !seen.insert(ip.ip.as_str()) {
                errs.push(FieldError::duplicate(
                    path.index(i),
                    format!("core.PodIP{{IP:{}}}", quote(&ip.ip)),
                ));
            }
        }
    }
    let host_ips = slice(&status.host_ips);
    for (i, ip) in host_ips.iter().enumerate() {
        errs.extend(names::is_valid_ip(
            &Path::new("status").child("hostIPs").index(i),
            &ip.ip,
        ));
    }
    errs
}

fn spec_of(pod: &core::Pod) -> core::PodSpec {
    pod.spec.clone().unwrap_or_default()
}

fn validate_pod_metadata_and_spec(pod: &core::Pod, old: Option<&core::Pod>) -> ErrorList {
    let mut errs = meta(
        &pod.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = spec_of(pod);
    errs.extend(validate_pod_spec(
        &spec,
        &Path::new("spec"),
        Opts {
            resource_is_pod: true,
        },
    ));
    errs
}

fn tolerations_only_added(
    new: &[core::Toleration],
    old: &[core::Toleration],
    path: &Path,
) -> ErrorList {
    for o in old {
        let found = new.iter().any(|n| {
            let mut clone = o.clone();
            clone.toleration_seconds = n.toleration_seconds;
            &clone == n
        });
        if !found {
            return vec![FieldError::forbidden(
                path,
                "existing toleration can not be modified except its tolerationSeconds",
            )];
        }
    }
    Vec::new()
}

fn validate_pod_update(new: &core::Pod, old: &core::Pod) -> ErrorList {
    let mut errs = Vec::new();
    let spec_path = Path::new("spec");
    let (ns, os) = (spec_of(new), spec_of(old));
    for (field, nc, oc) in [
        ("containers", &ns.containers[..], &os.containers[..]),
        (
            "initContainers",
            slice(&ns.init_containers),
            slice(&os.init_containers),
        ),
    ] {
        if nc.len() != oc.len() {
            errs.push(FieldError::forbidden(
                spec_path.child(field),
                "pod updates may not add or remove containers",
            ));
            return errs;
        }
        for (i, c) in nc.iter().enumerate() {
            if s(&c.image).is_empty() {
                errs.push(FieldError::required(
                    spec_path.child(field).index(i).child("image"),
                    "",
                ));
            }
        }
    }
    match (ns.active_deadline_seconds, os.active_deadline_seconds) {
        (Some(n), old_ads) => {
            if !(0..=MAX_INT32).contains(&n) {
                errs.push(FieldError::invalid(
                    spec_path.child("activeDeadlineSeconds"),
                    n.to_string(),
                    names::inclusive_range_error(0, MAX_INT32),
                ));
                return errs;
            }
            if let Some(o) = old_ads
                && o < n
            {
                errs.push(FieldError::invalid(
                    spec_path.child("activeDeadlineSeconds"),
                    n.to_string(),
                    "must be less than or equal to previous value",
                ));
                return errs;
            }
        }
        (None, Some(_)) => errs.push(FieldError::invalid(
            spec_path.child("activeDeadlineSeconds"),
            "null",
            "must not update from a positive integer to nil value",
        )),
        (None, None) => {}
    }
    errs.extend(tolerations_only_added(
        slice(&ns.tolerations),
        slice(&os.tolerations),
        &spec_path.child("tolerations"),
    ));
    if ns == os {
        return errs;
    }
    // Replace what may change with the old values; anything left that differs is forbidden.
    let mut munged = ns.clone();
    for (m, o) in munged.containers.iter_mut().zip(os.containers.iter()) {
        m.image = o.image.clone();
    }
    if let (Some(mi), Some(oi)) = (munged.init_containers.as_mut(), os.init_containers.as_ref()) {
        for (m, o) in mi.iter_mut().zip(oi.iter()) {
            m.image = o.image.clone();
        }
    }
    munged.active_deadline_seconds = os.active_deadline_seconds;
    munged.tolerations = os.tolerations.clone();
    if os.termination_grace_period_seconds.is_some_and(|v| v < 0)
        && ns.termination_grace_period_seconds == Some(1)
    {
        munged.termination_grace_period_seconds = os.termination_grace_period_seconds;
    }
    // Scheduling gates may only be removed.
    let old_gates: Vec<String> = slice(&os.scheduling_gates)
        .iter()
        .map(|g| g.name.clone())
        .collect();
    if slice(&ns.scheduling_gates)
        .iter()
        .all(|g| old_gates.contains(&g.name))
    {
        munged.scheduling_gates = os.scheduling_gates.clone();
    }
    if munged != os {
        errs.push(FieldError::forbidden(
            &spec_path,
            format!(
                "pod updates may not change fields other than {UPDATABLE_POD_SPEC_FIELDS}\n{}",
                spec_diff(&os, &munged)
            ),
        ));
    }
    errs
}

/// A short description of what changed between two specs (upstream prints a `cmp.Diff`).
fn spec_diff(old: &core::PodSpec, new: &core::PodSpec) -> String {
    let (Ok(serde_json::Value::Object(o)), Ok(serde_json::Value::Object(n))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return String::new();
    };
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = String::from("  core.PodSpec{\n");
    for k in keys {
        let (ov, nv) = (o.get(k), n.get(k));
        if ov != nv {
            if let Some(v) = ov {
                out.push_str(&format!("-  {k}: {v},\n"));
            }
            if let Some(v) = nv {
                out.push_str(&format!("+  {k}: {v},\n"));
            }
        }
    }
    out.push_str("  }\n");
    out
}

fn validate_pod_specific_annotations(pod: &core::Pod) -> ErrorList {
    let mut errs = Vec::new();
    let path = Path::new("metadata").child("annotations");
    let ann: BTreeMap<String, String> = pod.metadata.annotations.clone().unwrap_or_default();
    if let Some(v) = ann.get("kubernetes.io/config.mirror")
        && spec_of(pod).node_name.as_deref().unwrap_or("").is_empty()
    {
        errs.push(FieldError::invalid_str(
            path.key("kubernetes.io/config.mirror"),
            v,
            "must set spec.nodeName if mirror pod annotation is set",
        ));
    }
    if let Some(v) = ann.get("controller.kubernetes.io/pod-deletion-cost")
        && v.parse::<i32>().is_err()
    {
        errs.push(FieldError::invalid_str(
            path.key("controller.kubernetes.io/pod-deletion-cost"),
            v,
            "must be a 32bit integer",
        ));
    }
    errs
}

pub(crate) fn pod(pod: &core::Pod, old: Option<&core::Pod>) -> ErrorList {
    let mut errs = validate_pod_metadata_and_spec(pod, old);
    errs.extend(validate_pod_specific_annotations(pod));
    match old {
        None => {
            let spec = spec_of(pod);
            if !slice(&spec.ephemeral_containers).is_empty() {
                errs.push(FieldError::forbidden(
                    Path::new("spec").child("ephemeralContainers"),
                    "cannot be set on create",
                ));
            }
            if !s(&spec.node_name).is_empty() && !slice(&spec.scheduling_gates).is_empty() {
                errs.push(FieldError::forbidden(
                    Path::new("spec").child("nodeName"),
                    "cannot be set until all schedulingGates have been cleared",
                ));
            }
            errs.extend(validate_pod_ips(pod));
        }
        Some(old) => errs.extend(validate_pod_update(pod, old)),
    }
    errs
}

pub(crate) fn pod_status(pod: &core::Pod, old: &core::Pod) -> ErrorList {
    let mut errs =
        validate_object_meta_update(&pod.metadata, &old.metadata, &Path::new("metadata"));
    let status = pod.status.clone().unwrap_or_default();
    let path = Path::new("status");
    let nominated = s(&status.nominated_node_name);
    if !nominated.is_empty() {
        errs.extend(invalid_each(
            &path.child("nominatedNodeName"),
            nominated,
            names::is_dns1123_subdomain(nominated),
        ));
    }
    for (i, c) in slice(&status.conditions).iter().enumerate() {
        if ["PodScheduled", "Ready", "Initialized", "ContainersReady"].contains(&c.type_.as_str()) {
            continue;
        }
        errs.extend(qualified_name(
            &c.type_,
            &path.child("conditions").index(i).child("Type"),
        ));
    }
    errs.extend(validate_pod_ips(pod));
    errs
}
