//! Service validation (upstream `ValidateService`, `ValidateServiceUpdate`,
//! `ValidateServiceStatusUpdate`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::common::{
    dns1123_label, dns1123_subdomain, go_strings, meta, non_special_ip, port_num_or_name,
    port_protocol, qualified_name, s, slice, validate_labels, validate_object_meta_update,
};
use crate::errors::{ErrorList, FieldError, Path, quote};
use crate::names;

pub(crate) const MAX_CLIENT_IP_SERVICE_AFFINITY_SECONDS: i32 = 86400;
const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const SESSION_AFFINITIES: &[&str] = &["ClientIP", "None"];
const IP_FAMILIES: &[&str] = &["IPv4", "IPv6"];
const IP_FAMILY_POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];
const TRAFFIC_DISTRIBUTIONS: &[&str] = &["PreferClose", "PreferSameNode", "PreferSameZone"];
const LB_IP_MODES: &[&str] = &["Proxy", "VIP"];

fn spec(svc: &core::Service) -> core::ServiceSpec {
    svc.spec.clone().unwrap_or_default()
}

pub(crate) fn is_headless(spec: &core::ServiceSpec) -> bool {
    let ips = slice(&spec.cluster_ips);
    ips.len() == 1 && ips[0] == "None"
}

/// ExternallyAccessible: NodePort, LoadBalancer, or ClusterIP with external IPs.
pub(crate) fn externally_accessible(spec: &core::ServiceSpec) -> bool {
    match s(&spec.type_) {
        "LoadBalancer" | "NodePort" => true,
        "ClusterIP" => !slice(&spec.external_ips).is_empty(),
        _ => false,
    }
}

fn needs_health_check(spec: &core::ServiceSpec) -> bool {
    s(&spec.type_) == "LoadBalancer" && s(&spec.external_traffic_policy) == "Local"
}

/// Go's `%#v` of the internal `core.ServicePort` key upstream uses to find duplicate ports.
fn go_port_key(protocol: &str, port: i32) -> String {
    format!(
        "core.ServicePort{{Name:\"\", Protocol:{}, AppProtocol:(*string)(nil), Port:{port}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
        quote(protocol)
    )
}

fn validate_port(
    sp: &core::ServicePort,
    require_name: bool,
    names_seen: &mut HashSet<String>,
    path: &Path,
) -> ErrorList {
    let mut errs = Vec::new();
    let name = s(&sp.name);
    if require_name && name.is_empty() {
        errs.push(FieldError::required(path.child("name"), ""));
    } else if !name.is_empty() {
        errs.extend(dns1123_label(name, &path.child("name")));
        if !names_seen.insert(name.to_string()) {
            errs.push(FieldError::duplicate(path.child("name"), quote(name)));
        }
    }
    for m in names::is_valid_port_num(i64::from(sp.port)) {
        errs.push(FieldError::invalid(
            path.child("port"),
            sp.port.to_string(),
            m,
        ));
    }
    errs.extend(port_protocol(
        sp.protocol.as_deref(),
        &path.child("protocol"),
    ));
    let target = sp.target_port.clone().unwrap_or(IntOrString::Int(0));
    errs.extend(port_num_or_name(Some(&target), &path.child("targetPort")));
    if let Some(app) = &sp.app_protocol {
        errs.extend(qualified_name(app, &path.child("appProtocol")));
    }
    errs
}

fn validate_client_ip_affinity(
    config: Option<&core::SessionAffinityConfig>,
    path: &Path,
) -> ErrorList {
    let detail = "when session affinity type is ClientIP";
    let Some(config) = config else {
        return vec![FieldError::required(path, detail)];
    };
    let Some(client_ip) = &config.client_ip else {
        return vec![FieldError::required(path.child("clientIP"), detail)];
    };
    let tpath = path.child("clientIP").child("timeoutSeconds");
    let Some(timeout) = client_ip.timeout_seconds else {
        return vec![FieldError::required(tpath, detail)];
    };
    if timeout <= 0 || timeout > MAX_CLIENT_IP_SERVICE_AFFINITY_SECONDS {
        return vec![FieldError::invalid(
            tpath,
            timeout.to_string(),
            format!(
                "must be greater than 0 and less than {MAX_CLIENT_IP_SERVICE_AFFINITY_SECONDS}"
            ),
        )];
    }
    Vec::new()
}

fn validate_cluster_ips_related(spec: &core::ServiceSpec) -> ErrorList {
    let mut errs = Vec::new();
    if s(&spec.type_) == "ExternalName" {
        return errs;
    }
    let spec_path = Path::new("spec");
    let ips_path = spec_path.child("clusterIPs");
    let fam_path = spec_path.child("ipFamilies");
    let ips = slice(&spec.cluster_ips);
    let families = slice(&spec.ip_families);
    let cluster_ip = s(&spec.cluster_ip);
    if !cluster_ip.is_empty() {
        if ips.is_empty() {
            errs.push(FieldError::required(&ips_path, ""));
        } else if ips[0] != cluster_ip {
            errs.push(FieldError::invalid(
                &ips_path,
                go_strings(ips),
                "first value must match `clusterIP`",
            ));
        }
    } else if !ips.is_empty() {
        errs.push(FieldError::invalid(
            &ips_path,
            go_strings(ips),
            "must be empty when `clusterIP` is not specified",
        ));
    }
    let mut seen = HashSet::new();
    for (i, fam) in families.iter().enumerate() {
        if !IP_FAMILIES.contains(&fam.as_str()) {
            errs.push(FieldError::not_supported(
                fam_path.index(i),
                fam,
                IP_FAMILIES,
            ));
        }
        if !seen.insert(fam.as_str()) {
            errs.push(FieldError::duplicate(fam_path.index(i), quote(fam)));
        }
    }
    if let Some(policy) = &spec.ip_family_policy
        && !IP_FAMILY_POLICIES.contains(&policy.as_str())
    {
        errs.push(FieldError::not_supported(
            spec_path.child("ipFamilyPolicy"),
            policy,
            IP_FAMILY_POLICIES,
        ));
    }
    let mut has_invalid = false;
    for (i, ip) in ips.iter().enumerate() {
        if i == 0 && ip == "None" {
            if ips.len() > 1 {
                has_invalid = true;
                errs.push(FieldError::invalid(
                    &ips_path,
                    go_strings(ips),
                    "'None' must be the first and only value",
                ));
            }
            continue;
        }
        let e = names::is_valid_ip(&ips_path.index(i), ip);
        has_invalid |= !e.is_empty();
        errs.extend(e);
    }
    if ips.len() > 2 {
        errs.push(FieldError::invalid(
            &ips_path,
            go_strings(ips),
            "may only hold up to 2 values",
        ));
    }
    if has_invalid {
        return errs;
    }
    if ips.len() > 1 {
        let v6 = ips.iter().filter(|ip| names::is_ipv6_string(ip)).count();
        let dual = ips.len() == 2 && v6 == 1;
        if !dual {
            errs.push(FieldError::invalid(
                &ips_path,
                go_strings(ips),
                "may specify no more than one IP for each IP family",
            ));
        }
    }
    if !is_headless(spec) && !ips.is_empty() && !families.is_empty() {
        for (i, ip) in ips.iter().enumerate().take(families.len()) {
            if families[i] == "IPv4" && names::is_ipv6_string(ip) {
                errs.push(FieldError::invalid_str(
                    ips_path.index(i),
                    ip,
                    format!("expected an IPv4 value as indicated by `ipFamilies[{i}]`"),
                ));
            }
            if families[i] == "IPv6" && !names::is_ipv6_string(ip) {
                errs.push(FieldError::invalid_str(
                    ips_path.index(i),
                    ip,
                    format!("expected an IPv6 value as indicated by `ipFamilies[{i}]`"),
                ));
            }
        }
    }
    errs
}

fn validate_spec(svc: &core::Service) -> ErrorList {
    let spec = spec(svc);
    let mut errs = Vec::new();
    let spec_path = Path::new("spec");
    let ports = slice(&spec.ports);
    let type_ = s(&spec.type_);
    let headless = is_headless(&spec);

    if ports.is_empty() && !headless && type_ != "ExternalName" {
        errs.push(FieldError::required(spec_path.child("ports"), ""));
    }
    match type_ {
        "LoadBalancer" | "NodePort" if headless => {
            errs.push(FieldError::invalid_str(
                spec_path.child("clusterIPs").index(0),
                "None",
                format!("may not be set to 'None' for {type_} services"),
            ));
        }
        "ExternalName" => {
            if !slice(&spec.cluster_ips).is_empty() {
                errs.push(FieldError::forbidden(
                    spec_path.child("clusterIPs"),
                    "may not be set for ExternalName services",
                ));
            }
            if !slice(&spec.ip_families).is_empty() {
                errs.push(FieldError::forbidden(
                    spec_path.child("ipFamilies"),
                    "may not be set for ExternalName services",
                ));
            }
            if spec.ip_family_policy.is_some() {
                errs.push(FieldError::forbidden(
                    spec_path.child("ipFamilyPolicy"),
                    "may not be set for ExternalName services",
                ));
            }
            let cname = s(&spec.external_name);
            let cname = cname.strip_suffix('.').unwrap_or(cname);
            if cname.is_empty() {
                errs.push(FieldError::required(spec_path.child("externalName"), ""));
            } else {
                errs.extend(dns1123_subdomain(cname, &spec_path.child("externalName")));
            }
        }
        _ => {}
    }

    let mut port_names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        errs.extend(validate_port(
            p,
            ports.len() > 1,
            &mut port_names,
            &spec_path.child("ports").index(i),
        ));
    }

    if spec.selector.is_some() {
        errs.extend(validate_labels(
            spec.selector.as_ref(),
            &spec_path.child("selector"),
        ));
    }

    let affinity = s(&spec.session_affinity);
    if affinity.is_empty() {
        errs.push(FieldError::required(spec_path.child("sessionAffinity"), ""));
    } else if !SESSION_AFFINITIES.contains(&affinity) {
        errs.push(FieldError::not_supported(
            spec_path.child("sessionAffinity"),
            affinity,
            SESSION_AFFINITIES,
        ));
    }
    if affinity == "ClientIP" {
        errs.extend(validate_client_ip_affinity(
            spec.session_affinity_config.as_ref(),
            &spec_path.child("sessionAffinityConfig"),
        ));
    } else if affinity == "None" && spec.session_affinity_config.is_some() {
        errs.push(FieldError::forbidden(
            spec_path.child("sessionAffinityConfig"),
            "must not be set when session affinity is None",
        ));
    }

    errs.extend(validate_cluster_ips_related(&spec));

    for (i, ip) in slice(&spec.external_ips).iter().enumerate() {
        let p = spec_path.child("externalIPs").index(i);
        let e = names::is_valid_ip(&p, ip);
        if e.is_empty() {
            errs.extend(non_special_ip(ip, &p));
        } else {
            errs.extend(e);
        }
    }

    if type_.is_empty() {
        errs.push(FieldError::required(spec_path.child("type"), ""));
    } else if !SERVICE_TYPES.contains(&type_) {
        errs.push(FieldError::not_supported(
            spec_path.child("type"),
            type_,
            SERVICE_TYPES,
        ));
    }

    if type_ == "ClusterIP" {
        for (i, p) in ports.iter().enumerate() {
            if p.node_port.unwrap_or(0) != 0 {
                errs.push(FieldError::forbidden(
                    spec_path.child("ports").index(i).child("nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            }
        }
    }

    let mut node_ports = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let np = p.node_port.unwrap_or(0);
        if np == 0 {
            continue;
        }
        if !node_ports.insert((s(&p.protocol).to_string(), np)) {
            errs.push(FieldError::duplicate(
                spec_path.child("ports").index(i).child("nodePort"),
                np.to_string(),
            ));
        }
    }
    let mut port_keys = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let proto = s(&p.protocol);
        if !port_keys.insert((proto.to_string(), p.port)) {
            errs.push(FieldError::duplicate(
                spec_path.child("ports").index(i),
                go_port_key(proto, p.port),
            ));
        }
    }

    let ranges = slice(&spec.load_balancer_source_ranges);
    if !ranges.is_empty() {
        let p = spec_path.child("LoadBalancerSourceRanges");
        if type_ != "LoadBalancer" {
            errs.push(FieldError::forbidden(
                &p,
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        for (i, r) in ranges.iter().enumerate() {
            errs.extend(names::is_valid_cidr(&p.index(i), r.trim()));
        }
    } else if let Some(val) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("service.beta.kubernetes.io/load-balancer-source-ranges"))
    {
        let p = Path::new("metadata")
            .child("annotations")
            .key("service.beta.kubernetes.io/load-balancer-source-ranges");
        if type_ != "LoadBalancer" {
            errs.push(FieldError::forbidden(
                &p,
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }
        let val = val.trim();
        if !val.is_empty() {
            for r in val.split(',') {
                errs.extend(names::is_valid_cidr(&p, r.trim()));
            }
        }
    }

    if spec.allocate_load_balancer_node_ports.is_some() && type_ != "LoadBalancer" {
        errs.push(FieldError::forbidden(
            spec_path.child("allocateLoadBalancerNodePorts"),
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }
    if type_ == "LoadBalancer" && spec.allocate_load_balancer_node_ports.is_none() {
        errs.push(FieldError::required(
            Path::new("allocateLoadBalancerNodePorts"),
            "",
        ));
    }

    // loadBalancerClass
    if type_ == "LoadBalancer" {
        if let Some(class) = &spec.load_balancer_class {
            errs.extend(qualified_name(class, &spec_path.child("loadBalancerClass")));
        }
    } else if spec.load_balancer_class.is_some() {
        errs.push(FieldError::forbidden(
            spec_path.child("loadBalancerClass"),
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }

    // externalTrafficPolicy / healthCheckNodePort
    let etp = s(&spec.external_traffic_policy);
    if !externally_accessible(&spec) {
        if !etp.is_empty() {
            errs.push(FieldError::invalid_str(
                spec_path.child("externalTrafficPolicy"),
                etp,
                "may only be set for externally-accessible services",
            ));
        }
    } else if etp.is_empty() {
        errs.push(FieldError::required(
            spec_path.child("externalTrafficPolicy"),
            "",
        ));
    } else if !TRAFFIC_POLICIES.contains(&etp) {
        errs.push(FieldError::not_supported(
            spec_path.child("externalTrafficPolicy"),
            etp,
            TRAFFIC_POLICIES,
        ));
    }
    let hcnp = spec.health_check_node_port.unwrap_or(0);
    if !needs_health_check(&spec) {
        if hcnp != 0 {
            errs.push(FieldError::invalid(
                spec_path.child("healthCheckNodePort"),
                hcnp.to_string(),
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            ));
        }
    } else if hcnp == 0 {
        errs.push(FieldError::required(
            spec_path.child("healthCheckNodePort"),
            "",
        ));
    } else {
        for m in names::is_valid_port_num(i64::from(hcnp)) {
            errs.push(FieldError::invalid(
                spec_path.child("healthCheckNodePort"),
                hcnp.to_string(),
                m,
            ));
        }
    }

    // internalTrafficPolicy
    match &spec.internal_traffic_policy {
        None if matches!(type_, "NodePort" | "LoadBalancer" | "ClusterIP") => {
            errs.push(FieldError::required(
                spec_path.child("internalTrafficPolicy"),
                "",
            ));
        }
        Some(p) if !TRAFFIC_POLICIES.contains(&p.as_str()) => {
            errs.push(FieldError::not_supported(
                spec_path.child("internalTrafficPolicy"),
                p,
                TRAFFIC_POLICIES,
            ));
        }
        _ => {}
    }

    if let Some(td) = &spec.traffic_distribution
        && !TRAFFIC_DISTRIBUTIONS.contains(&td.as_str())
    {
        errs.push(FieldError::not_supported(
            spec_path.child("trafficDistribution"),
            td,
            TRAFFIC_DISTRIBUTIONS,
        ));
    }
    errs
}

fn validate_topology_annotations(svc: &core::Service) -> ErrorList {
    let ann = svc.metadata.annotations.as_ref();
    let hints = ann.and_then(|a| a.get("service.kubernetes.io/topology-aware-hints"));
    let mode = ann.and_then(|a| a.get("service.kubernetes.io/topology-mode"));
    match (hints, mode) {
        (Some(h), Some(m)) if h != m => vec![FieldError::invalid_str(
            Path::new("metadata")
                .child("annotations")
                .key("service.kubernetes.io/topology-mode"),
            m,
            "must match annotations[service.kubernetes.io/topology-aware-hints] when both are specified",
        )],
        _ => Vec::new(),
    }
}

fn validate_update(new: &core::ServiceSpec, old: &core::ServiceSpec) -> ErrorList {
    let mut errs = Vec::new();
    let ips_path = Path::new("spec").child("clusterIPs");
    let fam_path = Path::new("spec").child("ipFamilies");
    let (nt, ot) = (s(&new.type_), s(&old.type_));
    if nt != "ExternalName" && ot != "ExternalName" {
        let (ni, oi) = (slice(&new.cluster_ips), slice(&old.cluster_ips));
        let (nh, oh) = (is_headless(new), is_headless(old));
        if !(nh && oh) {
            if ni.len() == oi.len() {
                for (i, ip) in oi.iter().enumerate() {
                    if ip != &ni[i] {
                        errs.push(FieldError::invalid(
                            ips_path.index(i),
                            go_strings(ni),
                            "may not change once set",
                        ));
                    }
                }
            } else if oi.len() > ni.len() {
                if ni.is_empty() {
                    errs.push(FieldError::invalid(
                        ips_path.index(0),
                        go_strings(ni),
                        "primary clusterIP can not be unset",
                    ));
                }
                if !oi.is_empty() && !ni.is_empty() && ni[0] != oi[0] {
                    errs.push(FieldError::invalid(
                        ips_path.index(0),
                        go_strings(ni),
                        "may not change once set",
                    ));
                }
                if ni.len() == 1 && s(&new.ip_family_policy) != "SingleStack" {
                    errs.push(FieldError::invalid(
                        Path::new("spec").child("ipFamilyPolicy"),
                        new.ip_family_policy
                            .as_deref()
                            .map(quote)
                            .unwrap_or_else(|| "null".into()),
                        "must be set to 'SingleStack' when releasing the secondary clusterIP",
                    ));
                }
            } else if !oi.is_empty() && ni[0] != oi[0] {
                errs.push(FieldError::invalid(
                    ips_path.index(0),
                    go_strings(ni),
                    "may not change once set",
                ));
            }
        }
        // ipFamilies
        let (nf, of) = (slice(&new.ip_families), slice(&old.ip_families));
        if nh == oh && !nh {
            if nf.len() == of.len() {
                for (i, f) in of.iter().enumerate() {
                    if f != &nf[i] {
                        errs.push(FieldError::invalid(
                            fam_path.index(0),
                            go_strings(nf),
                            "may not change once set",
                        ));
                    }
                }
            } else if of.len() > nf.len() {
                if ni.is_empty() {
                    errs.push(FieldError::invalid(
                        fam_path.index(0),
                        go_strings(nf),
                        "primary ipFamily can not be unset",
                    ));
                }
                if !nf.is_empty() && nf[0] != of[0] {
                    errs.push(FieldError::invalid(
                        fam_path.index(0),
                        go_strings(ni),
                        "may not change once set",
                    ));
                }
                if nf.len() == 1 && s(&new.ip_family_policy) != "SingleStack" {
                    errs.push(FieldError::invalid(
                        Path::new("spec").child("ipFamilyPolicy"),
                        new.ip_family_policy
                            .as_deref()
                            .map(quote)
                            .unwrap_or_else(|| "null".into()),
                        "must be set to 'SingleStack' when releasing the secondary ipFamily",
                    ));
                }
            } else if !of.is_empty() && !nf.is_empty() && nf[0] != of[0] {
                errs.push(FieldError::invalid(
                    fam_path.index(0),
                    go_strings(ni),
                    "may not change once set",
                ));
            }
        }
    }
    if nt == "LoadBalancer"
        && ot == "LoadBalancer"
        && new.load_balancer_class != old.load_balancer_class
    {
        errs.push(FieldError::invalid(
            Path::new("spec").child("loadBalancerClass"),
            new.load_balancer_class
                .as_deref()
                .map(quote)
                .unwrap_or_else(|| "null".into()),
            "may not change once set",
        ));
    }
    if needs_health_check(old)
        && needs_health_check(new)
        && new.health_check_node_port != old.health_check_node_port
    {
        errs.push(FieldError::forbidden(
            Path::new("spec").child("healthCheckNodePort"),
            "field is immutable",
        ));
    }
    errs
}

pub(crate) fn service(svc: &core::Service, old: Option<&core::Service>) -> ErrorList {
    let mut errs = meta(
        &svc.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns1035_label,
    );
    if let Some(old) = old {
        errs.extend(validate_update(&spec(svc), &spec(old)));
    }
    errs.extend(validate_topology_annotations(svc));
    errs.extend(validate_spec(svc));
    errs
}

/// ValidateLoadBalancerStatus for a Service.
fn load_balancer_status(svc: &core::Service, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .map(|lb| slice(&lb.ingress).to_vec())
        .unwrap_or_default();
    let ing_path = path.child("ingress");
    let type_ = svc.spec.as_ref().map(|sp| s(&sp.type_)).unwrap_or("");
    if type_ != "LoadBalancer" && !ingress.is_empty() {
        errs.push(FieldError::forbidden(
            &ing_path,
            "may only be used when `spec.type` is 'LoadBalancer'",
        ));
        return errs;
    }
    for (i, ing) in ingress.iter().enumerate() {
        let p = ing_path.index(i);
        let ip = s(&ing.ip);
        if !ip.is_empty() {
            errs.extend(names::is_valid_ip(&p.child("ip"), ip));
        }
        match &ing.ip_mode {
            None if !ip.is_empty() => {
                errs.push(FieldError::required(
                    p.child("ipMode"),
                    "must be specified when `ip` is set",
                ));
            }
            Some(_) if ip.is_empty() => {
                errs.push(FieldError::forbidden(
                    p.child("ipMode"),
                    "may not be specified when `ip` is not set",
                ));
            }
            Some(m) if !LB_IP_MODES.contains(&m.as_str()) => {
                errs.push(FieldError::not_supported(p.child("ipMode"), m, LB_IP_MODES));
            }
            _ => {}
        }
        let host = s(&ing.hostname);
        if !host.is_empty() {
            errs.extend(dns1123_subdomain(host, &p.child("hostname")));
            if names::parse_ip_sloppy(host).is_some() {
                errs.push(FieldError::invalid_str(
                    p.child("hostname"),
                    host,
                    "must be a DNS name, not an IP address",
                ));
            }
        }
    }
    errs
}

pub(crate) fn service_status(svc: &core::Service, old: &core::Service) -> ErrorList {
    let mut errs =
        validate_object_meta_update(&svc.metadata, &old.metadata, &Path::new("metadata"));
    errs.extend(load_balancer_status(
        svc,
        &Path::new("status").child("loadBalancer"),
    ));
    errs
}
