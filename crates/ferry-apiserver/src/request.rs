//! Request parsing: the resource path, query parameters and content negotiation.

use std::collections::HashMap;

use crate::status::ApiError;

/// Percent-decodes a query component (`+` is a space).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Query parameters (last value wins).
#[derive(Debug, Default, Clone)]
pub struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut m = HashMap::new();
        if let Some(q) = q {
            for part in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                m.insert(percent_decode(k), percent_decode(v));
            }
        }
        Query(m)
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    /// Sets `k` to `v` (used for server-side defaults of parameters).
    pub fn set(&mut self, k: &str, v: &str) {
        self.0.insert(k.to_string(), v.to_string());
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True" | ""))
    }
    pub fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}"))),
        }
    }
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(v) => Err(ApiError::bad_request(format!(
                "Invalid dry run value: {v:?}. Valid values are \"All\""
            ))),
        }
    }
}

/// How the client wants the answer encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Json,
    /// `meta.k8s.io/v1` Table (`v1beta1` answered the same way, with its apiVersion).
    Table {
        v1beta1: bool,
    },
}

pub fn negotiate(accept: &str) -> Want {
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("as=Table") && p.contains("g=meta.k8s.io") {
            return Want::Table {
                v1beta1: p.contains("v=v1beta1"),
            };
        }
        if p.starts_with("application/json")
            || p.starts_with("*/*")
            || p.starts_with("application/yaml")
        {
            return Want::Json;
        }
    }
    Want::Json
}

/// The parts of a resource URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<g>/<v>/...` resource paths. `cluster_scoped` tells whether
/// a plural names a cluster-scoped resource (needed to read `namespaces/<x>/...`).
pub fn parse_resource_path(path: &str) -> Option<ResourcePath> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return None,
    };
    let rest: Vec<String> = rest.iter().map(|s| percent_decode(s)).collect();
    let mk = |namespace: Option<String>,
              resource: &str,
              name: Option<&String>,
              sub: Option<&String>| ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        resource: resource.to_string(),
        name: name.cloned(),
        subresource: sub.cloned(),
    };
    match rest.as_slice() {
        // namespaces/<ns>/<resource>[/<name>[/<sub>]] — but namespaces/<name>/status|finalize is the
        // Namespace's own subresource.
        [ns, n, sub]
            if ns == "namespaces"
                && group.is_empty()
                && (sub == "status" || sub == "finalize")
                && !n.is_empty() =>
        {
            // Ambiguous only if a namespaced resource were called "status"/"finalize": none is.
            Some(mk(None, "namespaces", Some(n), Some(sub)))
        }
        [ns, n, res, tail @ ..] if ns == "namespaces" => match tail {
            [] => Some(mk(Some(n.clone()), res, None, None)),
            [name] => Some(mk(Some(n.clone()), res, Some(name), None)),
            [name, sub] => Some(mk(Some(n.clone()), res, Some(name), Some(sub))),
            _ => None,
        },
        [res] => Some(mk(None, res, None, None)),
        [res, name] => Some(mk(None, res, Some(name), None)),
        [res, name, sub] => Some(mk(None, res, Some(name), Some(sub))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = parse_resource_path("/api/v1/namespaces/default/services/web").expect("parses");
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.resource, "services");
        assert_eq!(p.name.as_deref(), Some("web"));
        let p = parse_resource_path("/api/v1/namespaces/default").expect("parses");
        assert_eq!(
            (p.resource.as_str(), p.name.as_deref()),
            ("namespaces", Some("default"))
        );
        let p = parse_resource_path("/api/v1/namespaces/x/status").expect("parses");
        assert_eq!(
            (p.resource.as_str(), p.subresource.as_deref()),
            ("namespaces", Some("status"))
        );
        let p =
            parse_resource_path("/apis/apps/v1/namespaces/d/deployments/w/scale").expect("parses");
        assert_eq!(p.subresource.as_deref(), Some("scale"));
        let p = parse_resource_path("/api/v1/services").expect("parses");
        assert_eq!((p.namespace, p.name), (None, None));
        assert!(parse_resource_path("/api/v1").is_none());
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some(
            "labelSelector=app%3Dnginx&fieldSelector=metadata.name%3Dx&watch=1&limit=500",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=nginx"));
        assert!(q.flag("watch"));
        assert_eq!(q.int("limit").ok().flatten(), Some(500));
    }

    #[test]
    fn accept() {
        assert_eq!(
            negotiate(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Want::Table { v1beta1: false }
        );
        assert_eq!(
            negotiate("application/vnd.kubernetes.protobuf,application/json"),
            Want::Json
        );
    }
}
