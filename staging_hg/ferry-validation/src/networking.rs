//! EndpointSlice (discovery.k8s.io), Ingress, IngressClass and NetworkPolicy
//! (networking.k8s.io) validation.

use std::collections::HashSet;

use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::common::{
    dns1123_label, dns1123_subdomain, immutable, invalid_each, meta, non_special_ip,
    qualified_name, s, slice, validate_label_selector, validate_labels,
    validate_object_meta_update,
};
use crate::errors::{ErrorList, FieldError, Path, quote};
use crate::names;

const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 100;
const MAX_ENDPOINTS: usize = 1000;
const MAX_TOPOLOGY_LABELS: usize = 16;
const MAX_HINTS: usize = 8;
const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];
const INVALID_PATH_SEQUENCES: &[&str] = &["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: &[&str] = &["/..", "/."];
const MAX_LEN_INGRESS_CLASS_CONTROLLER: usize = 250;

/// IsFullyQualifiedDomainName: at least two labels, trailing dot allowed.
fn fully_qualified_domain_name(path: &Path, name: &str) -> ErrorList {
    if name.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    let msgs = names::is_dns1123_subdomain(name);
    if !msgs.is_empty() {
        return vec![FieldError::invalid_str(path, name, msgs.join(","))];
    }
    if name.split('.').count() < 2 {
        return vec![FieldError::invalid_str(
            path,
            name,
            "should be a domain with at least two segments separated by dots",
        )];
    }
    for label in name.split('.') {
        let msgs = names::is_dns1123_label(label);
        if !msgs.is_empty() {
            return vec![FieldError::invalid_str(path, label, msgs.join(","))];
        }
    }
    Vec::new()
}

pub(crate) fn endpoint_slice(
    es: &discovery::EndpointSlice,
    old: Option<&discovery::EndpointSlice>,
) -> ErrorList {
    let mut errs = meta(
        &es.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let at = es.address_type.as_str();
    let at_path = Path::new("addressType");
    if at.is_empty() {
        errs.push(FieldError::required(&at_path, ""));
    } else if !(ADDRESS_TYPES.contains(&at) || (old.is_some() && at == "IP")) {
        errs.push(FieldError::not_supported(&at_path, at, ADDRESS_TYPES));
    }
    let endpoints = slice(&es.endpoints);
    let ep_path = Path::new("endpoints");
    if endpoints.len() > MAX_ENDPOINTS {
        errs.push(FieldError::too_many(
            &ep_path,
            endpoints.len(),
            MAX_ENDPOINTS,
        ));
    } else {
        for (i, ep) in endpoints.iter().enumerate() {
            let p = ep_path.index(i);
            let ap = p.child("addresses");
            if ep.addresses.is_empty() {
                errs.push(FieldError::required(&ap, "must contain at least 1 address"));
            } else if ep.addresses.len() > MAX_ADDRESSES {
                errs.push(FieldError::too_many(&ap, ep.addresses.len(), MAX_ADDRESSES));
            }
            for (j, addr) in ep.addresses.iter().enumerate() {
                let aip = ap.index(j);
                match at {
                    "IP" => errs.extend(names::is_valid_ip(&aip, addr)),
                    "IPv4" => {
                        errs.extend(names::is_valid_ipv4_address(&aip, addr));
                        errs.extend(non_special_ip(addr, &aip));
                    }
                    "IPv6" => {
                        errs.extend(names::is_valid_ipv6_address(&aip, addr));
                        errs.extend(non_special_ip(addr, &aip));
                    }
                    "FQDN" => errs.extend(fully_qualified_domain_name(&aip, addr)),
                    _ => {}
                }
            }
            let topo = ep.deprecated_topology.as_ref();
            let tp = p.child("deprecatedTopology");
            if let Some(t) = topo
                && t.len() > MAX_TOPOLOGY_LABELS
            {
                errs.push(FieldError::too_many(&tp, t.len(), MAX_TOPOLOGY_LABELS));
            }
            errs.extend(validate_labels(topo, &tp));
            if let Some(h) = &ep.hostname {
                errs.extend(dns1123_label(h, &p.child("hostname")));
            }
            if let Some(n) = &ep.node_name {
                errs.extend(invalid_each(
                    &p.child("nodeName"),
                    n,
                    names::is_dns1123_subdomain(n),
                ));
            }
            if let Some(hints) = &ep.hints {
                let zones = slice(&hints.for_zones);
                let zp = p.child("hints").child("forZones");
                if zones.len() > MAX_HINTS {
                    errs.push(FieldError::too_many(&zp, zones.len(), MAX_HINTS));
                } else {
                    let mut seen = HashSet::new();
                    for (j, z) in zones.iter().enumerate() {
                        let zn = zp.index(j).child("name");
                        if !seen.insert(z.name.as_str()) {
                            errs.push(FieldError::duplicate(&zn, quote(&z.name)));
                        } else {
                            errs.extend(invalid_each(
                                &zn,
                                &z.name,
                                names::is_valid_label_value(&z.name),
                            ));
                        }
                    }
                }
            }
        }
    }
    let ports = slice(&es.ports);
    let pp = Path::new("ports");
    if ports.len() > MAX_PORTS {
        errs.push(FieldError::too_many(&pp, ports.len(), MAX_PORTS));
    } else {
        let mut seen = HashSet::new();
        for (i, port) in ports.iter().enumerate() {
            let p = pp.index(i);
            let name = s(&port.name);
            if !name.is_empty() {
                errs.extend(dns1123_label(name, &p.child("name")));
            }
            if !seen.insert(name.to_string()) {
                errs.push(FieldError::duplicate(p.child("name"), quote(name)));
            }
            match port.protocol.as_deref() {
                None => errs.push(FieldError::required(p.child("protocol"), "")),
                Some(proto) if !["SCTP", "TCP", "UDP"].contains(&proto) => {
                    errs.push(FieldError::not_supported(
                        p.child("protocol"),
                        proto,
                        &["SCTP", "TCP", "UDP"],
                    ));
                }
                _ => {}
            }
            if let Some(app) = &port.app_protocol {
                errs.extend(qualified_name(app, &p.child("appProtocol")));
            }
        }
    }
    if let Some(old) = old {
        errs.extend(immutable(
            &es.address_type,
            &old.address_type,
            &at_path,
            || quote(&es.address_type),
        ));
    }
    errs
}

fn host_rule(host: &str, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    if host.contains('*') {
        errs.extend(invalid_each(
            path,
            host,
            names::is_wildcard_dns1123_subdomain(host),
        ));
    } else {
        errs.extend(dns1123_subdomain(host, path));
    }
    errs
}

fn ingress_backend(b: &networking::IngressBackend, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    match (&b.resource, &b.service) {
        (Some(_), Some(_)) => errs.push(FieldError::invalid_str(
            path,
            "",
            "cannot set both resource and service backends",
        )),
        (Some(r), None) => {
            let rp = path.child("resource");
            if r.kind.is_empty() {
                errs.push(FieldError::required(rp.child("kind"), ""));
            }
            if r.name.is_empty() {
                errs.push(FieldError::required(rp.child("name"), ""));
            }
            if let Some(g) = &r.api_group {
                errs.extend(dns1123_subdomain(g, &rp.child("apiGroup")));
            }
        }
        (None, Some(svc)) => {
            let sp = path.child("service");
            if svc.name.is_empty() {
                errs.push(FieldError::required(sp.child("name"), ""));
            } else {
                errs.extend(invalid_each(
                    &sp.child("name"),
                    &svc.name,
                    names::is_dns1035_label(&svc.name),
                ));
            }
            let port = svc.port.clone().unwrap_or_default();
            let name = s(&port.name);
            let number = port.number.unwrap_or(0);
            match (!name.is_empty(), number != 0) {
                (true, true) => errs.push(FieldError::invalid_str(
                    path,
                    "",
                    "cannot set both port name & port number",
                )),
                (true, false) => {
                    errs.extend(invalid_each(
                        &sp.child("port").child("name"),
                        name,
                        names::is_valid_port_name(name),
                    ));
                }
                (false, true) => {
                    for m in names::is_valid_port_num(i64::from(number)) {
                        errs.push(FieldError::invalid(
                            sp.child("port").child("number"),
                            number.to_string(),
                            m,
                        ));
                    }
                }
                (false, false) => errs.push(FieldError::required(
                    path,
                    "port name or number is required",
                )),
            }
        }
        (None, None) => errs.push(FieldError::invalid_str(
            path,
            "",
            "resource or service backend is required",
        )),
    }
    errs
}

fn http_path(p: &networking::HTTPIngressPath, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let value = s(&p.path);
    match p.path_type.as_str() {
        "" => errs.push(FieldError::required(
            path.child("pathType"),
            "pathType must be specified",
        )),
        "Exact" | "Prefix" => {
            if !value.starts_with('/') {
                errs.push(FieldError::invalid_str(
                    path.child("path"),
                    value,
                    "must be an absolute path",
                ));
            }
            if !value.is_empty() {
                for seq in INVALID_PATH_SEQUENCES {
                    if value.contains(seq) {
                        errs.push(FieldError::invalid_str(
                            path.child("path"),
                            value,
                            format!("must not contain '{seq}'"),
                        ));
                    }
                }
                for suffix in INVALID_PATH_SUFFIXES {
                    if value.ends_with(suffix) {
                        errs.push(FieldError::invalid_str(
                            path.child("path"),
                            value,
                            format!("cannot end with '{suffix}'"),
                        ));
                    }
                }
            }
        }
        "ImplementationSpecific" => {
            if !value.is_empty() && !value.starts_with('/') {
                errs.push(FieldError::invalid_str(
                    path.child("path"),
                    value,
                    "must be an absolute path",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            path.child("pathType"),
            other,
            PATH_TYPES,
        )),
    }
    errs.extend(ingress_backend(&p.backend, &path.child("backend")));
    errs
}

fn ingress_spec(spec: &networking::IngressSpec, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let rules = slice(&spec.rules);
    if let Some(b) = &spec.default_backend {
        errs.extend(ingress_backend(b, &path.child("defaultBackend")));
    } else if rules.is_empty() {
        errs.push(FieldError::invalid(
            path.child("rules"),
            "[]networking.IngressRule(nil)",
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    for (i, r) in rules.iter().enumerate() {
        let p = path.child("rules").index(i);
        let host = s(&r.host);
        if !host.is_empty() {
            errs.extend(host_rule(host, &p.child("host")));
            if names::parse_ip_sloppy(host).is_some() {
                errs.push(FieldError::invalid_str(
                    p.child("host"),
                    host,
                    "must be a DNS name, not an IP address",
                ));
            }
        }
        if let Some(http) = &r.http {
            let hp = p.child("http");
            if http.paths.is_empty() {
                errs.push(FieldError::required(hp.child("paths"), ""));
            }
            for (j, hpath) in http.paths.iter().enumerate() {
                errs.extend(http_path(hpath, &hp.child("paths").index(j)));
            }
        }
    }
    for (i, tls) in slice(&spec.tls).iter().enumerate() {
        let p = path.child("tls").index(i);
        for (j, host) in slice(&tls.hosts).iter().enumerate() {
            errs.extend(host_rule(host, &p.child("hosts").index(j)));
        }
        let secret = s(&tls.secret_name);
        if !secret.is_empty() {
            errs.extend(invalid_each(
                &p.child("secretName"),
                secret,
                names::is_dns1123_subdomain(secret),
            ));
        }
    }
    if let Some(class) = &spec.ingress_class_name {
        errs.extend(invalid_each(
            &path.child("ingressClassName"),
            class,
            names::is_dns1123_subdomain(class),
        ));
    }
    errs
}

pub(crate) fn ingress(ing: &networking::Ingress, old: Option<&networking::Ingress>) -> ErrorList {
    let mut errs = meta(
        &ing.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = ing.spec.clone().unwrap_or_default();
    errs.extend(ingress_spec(&spec, &Path::new("spec")));
    if old.is_none()
        && spec.ingress_class_name.is_some()
        && let Some(v) = ing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/ingress.class"))
    {
        errs.push(FieldError::invalid_str(
            Path::new("annotations").child("kubernetes.io/ingress.class"),
            v,
            "can not be set when the class field is also set",
        ));
    }
    errs
}

pub(crate) fn ingress_status(ing: &networking::Ingress, old: &networking::Ingress) -> ErrorList {
    let mut errs =
        validate_object_meta_update(&ing.metadata, &old.metadata, &Path::new("metadata"));
    let path = Path::new("status").child("loadBalancer").child("ingress");
    let ingress = ing
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .map(|lb| slice(&lb.ingress).to_vec())
        .unwrap_or_default();
    for (i, lb) in ingress.iter().enumerate() {
        let p = path.index(i);
        let ip = s(&lb.ip);
        if !ip.is_empty() {
            errs.extend(names::is_valid_ip(&p.child("ip"), ip));
        }
        let host = s(&lb.hostname);
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

pub(crate) fn ingress_class(
    ic: &networking::IngressClass,
    old: Option<&networking::IngressClass>,
) -> ErrorList {
    let mut errs = meta(
        &ic.metadata,
        old.map(|o| &o.metadata),
        false,
        names::name_is_dns_subdomain,
    );
    let spec = ic.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    let controller = s(&spec.controller);
    let cp = path.child("controller");
    if controller.len() > MAX_LEN_INGRESS_CLASS_CONTROLLER {
        errs.push(FieldError::too_long(&cp, MAX_LEN_INGRESS_CLASS_CONTROLLER));
    }
    errs.extend(names::is_domain_prefixed_path(&cp, controller));
    if let Some(params) = &spec.parameters {
        let pp = path.child("parameters");
        if params.kind.is_empty() {
            errs.push(FieldError::required(pp.child("kind"), ""));
        }
        if params.name.is_empty() {
            errs.push(FieldError::required(pp.child("name"), ""));
        }
        if let Some(g) = &params.api_group {
            errs.extend(dns1123_subdomain(g, &pp.child("apiGroup")));
        }
        match params.scope.as_deref() {
            None => errs.push(FieldError::required(pp.child("scope"), "")),
            Some("Namespace") => {
                if s(&params.namespace).is_empty() {
                    errs.push(FieldError::required(
                        pp.child("namespace"),
                        "`parameters.scope` is set to 'Namespace'",
                    ));
                }
            }
            Some("Cluster") => {
                if params.namespace.is_some() {
                    errs.push(FieldError::forbidden(
                        pp.child("namespace"),
                        "`parameters.scope` is set to 'Cluster'",
                    ));
                }
            }
            Some(other) => errs.push(FieldError::not_supported(
                pp.child("scope"),
                other,
                &["Cluster", "Namespace"],
            )),
        }
    }
    if let Some(old) = old {
        let old_controller = old
            .spec
            .as_ref()
            .map(|sp| s(&sp.controller))
            .unwrap_or("")
            .to_string();
        errs.extend(immutable(
            &controller.to_string(),
            &old_controller,
            &cp,
            || quote(controller),
        ));
    }
    errs
}

fn network_policy_port(port: &networking::NetworkPolicyPort, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    if let Some(proto) = &port.protocol
        && !["SCTP", "TCP", "UDP"].contains(&proto.as_str())
    {
        errs.push(FieldError::not_supported(
            path.child("protocol"),
            proto,
            &["SCTP", "TCP", "UDP"],
        ));
    }
    match &port.port {
        Some(IntOrString::Int(n)) => {
            for m in names::is_valid_port_num(i64::from(*n)) {
                errs.push(FieldError::invalid(path.child("port"), n.to_string(), m));
            }
            if let Some(end) = port.end_port {
                if end < *n {
                    errs.push(FieldError::invalid(
                        path.child("endPort"),
                        n.to_string(),
                        "must be greater than or equal to `port`",
                    ));
                }
                for m in names::is_valid_port_num(i64::from(end)) {
                    errs.push(FieldError::invalid(
                        path.child("endPort"),
                        end.to_string(),
                        m,
                    ));
                }
            }
        }
        Some(IntOrString::String(name)) => {
            if port.end_port.is_some() {
                errs.push(FieldError::forbidden(
                    path.child("endPort"),
                    "may not be specified when `port` is non-numeric",
                ));
            }
            errs.extend(invalid_each(
                &path.child("port"),
                name,
                names::is_valid_port_name(name),
            ));
        }
        None => {
            if port.end_port.is_some() {
                errs.push(FieldError::required(
                    path.child("port"),
                    "must be specified when `endPort` is specified",
                ));
            }
        }
    }
    errs
}

fn ip_block(block: &networking::IPBlock, path: &Path) -> ErrorList {
    let cp = path.child("cidr");
    if block.cidr.is_empty() {
        return vec![FieldError::required(cp, "")];
    }
    let Some((_, net)) = names::parse_cidr_sloppy(&block.cidr) else {
        return names::is_valid_cidr(&cp, &block.cidr);
    };
    let mut errs = Vec::new();
    for (i, ex) in slice(&block.except).iter().enumerate() {
        let ep = path.child("except").index(i);
        let e = names::is_valid_cidr(&ep, ex);
        if !e.is_empty() {
            errs.extend(e);
            continue;
        }
        let Some((_, exnet)) = names::parse_cidr_sloppy(ex) else {
            continue;
        };
        if !net.contains(&exnet.network()) || exnet.prefix_len() <= net.prefix_len() {
            errs.push(FieldError::invalid_str(
                ep,
                &exnet.to_string(),
                "must be a strict subset of `cidr`",
            ));
        }
    }
    errs
}

fn network_policy_peer(peer: &networking::NetworkPolicyPeer, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    let mut n = 0;
    if let Some(sel) = &peer.pod_selector {
        n += 1;
        errs.extend(validate_label_selector(
            Some(sel),
            &path.child("podSelector"),
        ));
    }
    if let Some(sel) = &peer.namespace_selector {
        n += 1;
        errs.extend(validate_label_selector(
            Some(sel),
            &path.child("namespaceSelector"),
        ));
    }
    if let Some(b) = &peer.ip_block {
        n += 1;
        errs.extend(ip_block(b, &path.child("ipBlock")));
    }
    if n == 0 {
        errs.push(FieldError::required(path, "must specify a peer"));
    } else if peer.ip_block.is_some() && n > 1 {
        errs.push(FieldError::forbidden(
            path,
            "may not specify both ipBlock and another peer",
        ));
    }
    errs
}

pub(crate) fn network_policy(
    np: &networking::NetworkPolicy,
    old: Option<&networking::NetworkPolicy>,
) -> ErrorList {
    let mut errs = meta(
        &np.metadata,
        old.map(|o| &o.metadata),
        true,
        names::name_is_dns_subdomain,
    );
    let spec = np.spec.clone().unwrap_or_default();
    let path = Path::new("spec");
    errs.extend(validate_label_selector(
        spec.pod_selector.as_ref(),
        &path.child("podSelector"),
    ));
    for (i, rule) in slice(&spec.ingress).iter().enumerate() {
        let p = path.child("ingress").index(i);
        for (j, port) in slice(&rule.ports).iter().enumerate() {
            errs.extend(network_policy_port(port, &p.child("ports").index(j)));
        }
        for (j, peer) in slice(&rule.from).iter().enumerate() {
            errs.extend(network_policy_peer(peer, &p.child("from").index(j)));
        }
    }
    for (i, rule) in slice(&spec.egress).iter().enumerate() {
        let p = path.child("egress").index(i);
        for (j, port) in slice(&rule.ports).iter().enumerate() {
            errs.extend(network_policy_port(port, &p.child("ports").index(j)));
        }
        for (j, peer) in slice(&rule.to).iter().enumerate() {
            errs.extend(network_policy_peer(peer, &p.child("to").index(j)));
        }
    }
    let types = slice(&spec.policy_types);
    for (i, t) in types.iter().enumerate() {
        if t != "Ingress" && t != "Egress" {
            errs.push(FieldError::not_supported(
                path.child("policyTypes").index(i),
                t,
                &["Ingress", "Egress"],
            ));
        }
    }
    if types.len() > 2 {
        errs.push(FieldError::invalid(
            path.child("policyTypes"),
            super::common::go_strings(types),
            "may not specify more than two policyTypes",
        ));
    }
    errs
}
