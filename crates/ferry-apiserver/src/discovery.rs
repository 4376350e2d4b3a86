//! `/version` and API discovery: legacy (APIVersions, APIGroupList, APIResourceList) and
//! aggregated (`apidiscovery.k8s.io` v2 and v2beta1, negotiated by Accept).

use ferry_api::kinds::KindInfo;
use serde_json::{Value, json};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn infos() -> Vec<&'static KindInfo> {
    let mut v: Vec<&'static KindInfo> = ferry_api::kinds::all().iter().map(|s| s.info()).collect();
    // The custom kinds of established CRDs, each group's versions in priority order.
    let mut custom: Vec<&'static KindInfo> = ferry_api::custom::resource::served()
        .into_iter()
        .map(<ferry_api::custom::resource::CustomKind as ferry_api::kinds::Strategy>::info)
        .collect();
    custom.sort_by(|a, b| {
        a.group
            .cmp(b.group)
            .then(ferry_crd::definition::version_order(a.version, b.version))
    });
    v.extend(custom);
    v
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": concat!("v1.33.0-ferry.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// Group versions in discovery order: core first, then groups by name.
fn groups() -> Vec<(&'static str, &'static str)> {
    let mut gv: Vec<(&str, &str)> = Vec::new();
    for i in infos() {
        if !i.group.is_empty() && !gv.contains(&(i.group, i.version)) {
            gv.push((i.group, i.version));
        }
    }
    for (g, ..) in crate::auth::reviews::VIRTUAL {
        if !gv.contains(&(g, "v1")) {
            gv.push((g, "v1"));
        }
    }
    gv
}

/// The create-only review kinds of `group`/`version` (not stored, not in the kind registry).
fn reviews(
    group: &str,
    version: &str,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, bool)> {
    crate::auth::reviews::VIRTUAL
        .iter()
        .filter(move |(g, ..)| *g == group && version == "v1")
}

pub fn api_versions(server_addr: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_addr}]})
}

pub fn api_group_list() -> Value {
    // One entry per group, with all its versions (a CRD's group may serve several).
    let mut names: Vec<&str> = Vec::new();
    for (g, _) in groups() {
        if !names.contains(&g) {
            names.push(g);
        }
    }
    let groups: Vec<Value> = names.iter().map(|g| api_group(g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = groups()
        .iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions, "preferredVersion": preferred})
}

pub fn has_group(group: &str) -> bool {
    groups().iter().any(|(g, _)| *g == group)
}

pub fn has_group_version(group: &str, version: &str) -> bool {
    infos()
        .iter()
        .any(|i| i.group == group && i.version == version)
        || reviews(group, version).next().is_some()
}

pub fn api_resource_list(group: &str, version: &str) -> Value {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for i in infos()
        .into_iter()
        .filter(|i| i.group == group && i.version == version)
    {
        let mut r = json!({
            "name": i.plural,
            "singularName": i.singular,
            "namespaced": i.namespaced,
            "kind": i.kind,
            "verbs": VERBS,
        });
        if !i.short_names.is_empty() {
            r["shortNames"] = json!(i.short_names);
        }
        if !i.categories.is_empty() {
            r["categories"] = json!(i.categories);
        }
        resources.push(r);
        if i.status_subresource {
            resources.push(json!({"name": format!("{}/status", i.plural), "singularName": "", "namespaced": i.namespaced, "kind": i.kind, "verbs": ["get", "patch", "update"]}));
        }
        if i.scale_subresource {
            resources.push(json!({"name": format!("{}/scale", i.plural), "singularName": "", "namespaced": i.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        if i.group.is_empty() && i.kind == "Namespace" {
            resources.push(json!({"name": "namespaces/finalize", "singularName": "", "namespaced": false, "kind": "Namespace", "verbs": ["update"]}));
        }
        if i.group.is_empty() && i.kind == "Pod" {
            resources.push(json!({"name": "pods/ephemeralcontainers", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "patch", "update"]}));
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
        if let Some(kind) = proxy_kind(i) {
            resources.push(json!({"name": format!("{}/proxy", i.plural), "singularName": "", "namespaced": i.namespaced, "kind": kind, "verbs": PROXY_VERBS}));
        }
        if i.group.is_empty() && i.kind == "ServiceAccount" {
            resources.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
    }
    for (_, plural, kind, namespaced) in reviews(group, version) {
        resources.push(json!({"name": plural, "singularName": kind.to_ascii_lowercase(), "namespaced": namespaced, "kind": kind, "verbs": ["create"]}));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// The verbs of a `proxy` subresource, as upstream lists them.
const PROXY_VERBS: &[&str] = &["create", "delete", "get", "patch", "update"];

/// The kinds with a `proxy` subresource (pods, services, nodes), with upstream's response kind.
fn proxy_kind(i: &KindInfo) -> Option<&'static str> {
    match (i.group, i.kind) {
        ("", "Pod") => Some("PodProxyOptions"),
        ("", "Service") => Some("ServiceProxyOptions"),
        ("", "Node") => Some("NodeProxyOptions"),
        _ => None,
    }
}

fn aggregated_resource(i: &KindInfo) -> Value {
    let mut r = json!({
        "resource": i.plural,
        "responseKind": {"group": i.group, "version": i.version, "kind": i.kind},
        "scope": if i.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": i.singular,
        "verbs": VERBS,
    });
    if !i.short_names.is_empty() {
        r["shortNames"] = json!(i.short_names);
    }
    if !i.categories.is_empty() {
        r["categories"] = json!(i.categories);
    }
    let mut subs = Vec::new();
    if i.status_subresource {
        subs.push(json!({"subresource": "status", "responseKind": {"group": i.group, "version": i.version, "kind": i.kind}, "verbs": ["get", "patch", "update"]}));
    }
    if i.scale_subresource {
        subs.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": ["get", "patch", "update"]}));
    }
    if i.group.is_empty() && i.kind == "Namespace" {
        subs.push(json!({"subresource": "finalize", "responseKind": {"group": "", "version": "v1", "kind": "Namespace"}, "verbs": ["update"]}));
    }
    if i.group.is_empty() && i.kind == "Pod" {
        subs.push(json!({"subresource": "ephemeralcontainers", "responseKind": {"group": "", "version": "v1", "kind": "Pod"}, "verbs": ["get", "patch", "update"]}));
        subs.push(json!({"subresource": "eviction", "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"}, "verbs": ["create"]}));
    }
    if let Some(kind) = proxy_kind(i) {
        subs.push(json!({"subresource": "proxy", "responseKind": {"group": "", "version": "v1", "kind": kind}, "verbs": PROXY_VERBS}));
    }
    if i.group.is_empty() && i.kind == "ServiceAccount" {
        subs.push(json!({"subresource": "token", "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}, "verbs": ["create"]}));
    }
    if !subs.is_empty() {
        r["subresources"] = json!(subs);
    }
    r
}

/// Aggregated discovery for `/api` (core) or `/apis` (groups). `version` is "v2" or "v2beta1".
pub fn aggregated(core: bool, version: &str) -> Value {
    let mut items = Vec::new();
    if core {
        let res: Vec<Value> = infos()
            .into_iter()
            .filter(|i| i.group.is_empty())
            .map(aggregated_resource)
            .collect();
        items.push(json!({"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": res, "freshness": "Current"}]}));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for (g, _) in groups() {
            if seen.contains(&g) {
                continue;
            }
            seen.push(g);
            let versions: Vec<Value> = groups()
                .iter()
                .filter(|(gg, _)| *gg == g)
                .map(|(_, v)| {
                    let res: Vec<Value> = infos()
                        .into_iter()
                        .filter(|i| i.group == g && i.version == *v)
                        .map(aggregated_resource)
                        .chain(reviews(g, v).map(|(g, plural, kind, namespaced)| {
                            json!({"resource": plural,
                                "responseKind": {"group": g, "version": "v1", "kind": kind},
                                "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": kind.to_ascii_lowercase(), "verbs": ["create"]})
                        }))
                        .collect();
                    json!({"version": v, "resources": res, "freshness": "Current"})
                })
                .collect();
            items.push(json!({"metadata": {"name": g}, "versions": versions}));
        }
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"), "metadata": {}, "items": items})
}

/// Which aggregated discovery version the Accept header asks for, if any (first offered wins).
pub fn aggregated_version(accept: &str) -> Option<&'static str> {
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("g=apidiscovery.k8s.io") && p.contains("as=APIGroupDiscoveryList") {
            if p.contains("v=v2beta1") {
                return Some("v2beta1");
            }
            if p.contains("v=v2") {
                return Some("v2");
            }
        }
        if p.starts_with("application/json") && !p.contains(';') {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(
            aggregated_version(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Some("v2")
        );
        assert_eq!(
            aggregated_version(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Some("v2beta1")
        );
        assert_eq!(aggregated_version("application/json, */*"), None);
    }

    #[test]
    fn core_resources_listed() {
        let l = api_resource_list("", "v1");
        let names: Vec<&str> = l["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            names.contains(&"services")
                && names.contains(&"services/status")
                && names.contains(&"pods")
        );
    }
}
