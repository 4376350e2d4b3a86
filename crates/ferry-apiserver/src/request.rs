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
    /// `meta.k8s.io` PartialObjectMetadata (`list`: PartialObjectMetadataList was asked for,
    /// which only a list can be answered with; PartialObjectMetadata only a single object or a
    /// watch event).
    Metadata {
        v1beta1: bool,
        list: bool,
    },
}

/// The media types upstream names when nothing in an Accept header can be served.
pub const ACCEPTED_MEDIA_TYPES: &str =
    "application/json, application/yaml, application/vnd.kubernetes.protobuf";

/// The media types answered (all of them as JSON, which is also YAML; protobuf clients always
/// offer JSON too, and decode by the answer's Content-Type), in upstream's preference order.
const SERVED: [(&str, &str); 3] = [
    ("application", "json"),
    ("application", "yaml"),
    ("application", "vnd.kubernetes.protobuf"),
];

/// One clause of an Accept header.
#[derive(Debug)]
struct Clause<'a> {
    ty: &'a str,
    sub: &'a str,
    q: f64,
    params: Vec<(&'a str, &'a str)>,
}

fn clauses(accept: &str) -> Vec<Clause<'_>> {
    let mut out: Vec<Clause<'_>> = Vec::new();
    for part in accept.split(',') {
        let mut it = part.split(';');
        let range = it.next().unwrap_or("").trim();
        let (ty, sub) = range.split_once('/').unwrap_or((range, "*"));
        let (ty, sub) = (ty.trim(), sub.trim());
        if ty.is_empty() || sub.is_empty() {
            continue;
        }
        let mut q = 1.0;
        let mut params = Vec::new();
        for p in it {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let (k, v) = (k.trim(), v.trim().trim_matches('"'));
            if k == "q" {
                q = v.parse().unwrap_or(1.0);
            } else if !k.is_empty() {
                params.push((k, v));
            }
        }
        if q > 0.0 {
            out.push(Clause { ty, sub, q, params });
        }
    }
    // Higher quality first; at equal quality, specific types before wildcards (goautoneg's
    // order); otherwise the client's order.
    out.sort_by(|a, b| {
        b.q.partial_cmp(&a.q)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then((a.ty == "*").cmp(&(b.ty == "*")))
            .then((a.sub == "*").cmp(&(b.sub == "*")))
    });
    out
}

/// What a clause asks of a media type the server answers: `None` when the endpoint cannot
/// (an unknown `as`/`g`/`v` conversion, a Table in protobuf, a stream other than `watch`), as
/// upstream's `acceptMediaTypeOptions` + `AllowsMediaTypeTransform`.
fn accept_options(c: &Clause<'_>, sub: &str) -> Option<Want> {
    let (mut kind, mut group, mut version, mut convert) = ("", "", "", false);
    for &(k, v) in &c.params {
        match k {
            "as" => (kind, convert) = (v, true),
            "g" => (group, convert) = (v, true),
            "v" => (version, convert) = (v, true),
            "stream" if !v.is_empty() && (v != "watch" || sub == "yaml") => return None,
            _ => {}
        }
    }
    if !convert {
        return Some(Want::Json);
    }
    if group != "meta.k8s.io" || !matches!(version, "v1" | "v1beta1") {
        return None;
    }
    let v1beta1 = version == "v1beta1";
    match kind {
        "Table" if matches!(sub, "json" | "yaml") => Some(Want::Table { v1beta1 }),
        "PartialObjectMetadata" => Some(Want::Metadata {
            v1beta1,
            list: false,
        }),
        "PartialObjectMetadataList" => Some(Want::Metadata {
            v1beta1,
            list: true,
        }),
        _ => None,
    }
}

/// Negotiates the answer's encoding from an Accept header as upstream's
/// `NegotiateOutputMediaType`: the first clause (by quality, then specificity) naming a media
/// type the server answers with options it can honour wins; an empty header is JSON; nothing
/// acceptable is 406 NotAcceptable.
pub fn negotiate(accept: &str) -> Result<Want, ApiError> {
    if accept.trim().is_empty() {
        return Ok(Want::Json);
    }
    for c in clauses(accept) {
        for (ty, sub) in SERVED {
            let matches = (c.ty.eq_ignore_ascii_case(ty)
                && (c.sub.eq_ignore_ascii_case(sub) || c.sub == "*"))
                || (c.ty == "*" && c.sub == "*");
            if let Some(w) = matches.then(|| accept_options(&c, sub)).flatten() {
                return Ok(w);
            }
        }
    }
    Err(ApiError::new(
        406,
        "NotAcceptable",
        format!("only the following media types are accepted: {ACCEPTED_MEDIA_TYPES}"),
    ))
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
        let meta = |v1beta1, list| Want::Metadata { v1beta1, list };
        let table = |v1beta1| Want::Table { v1beta1 };
        let not_acceptable = |a: &str| {
            let e = negotiate(a)
                .err()
                .unwrap_or_else(|| panic!("{a}: accepted"));
            let s = e.to_status();
            assert_eq!(
                (s["code"].as_i64(), s["reason"].as_str()),
                (Some(406), Some("NotAcceptable")),
                "{a}"
            );
            assert_eq!(
                s["message"],
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
            );
        };
        let cases: &[(&str, Want)] = &[
            ("", Want::Json),
            ("application/json", Want::Json),
            ("*/*", Want::Json),
            ("application/*", Want::Json),
            ("application/yaml", Want::Json),
            ("application/json;stream=watch", Want::Json),
            (
                "application/vnd.kubernetes.protobuf,application/json",
                Want::Json,
            ),
            // kubectl get
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
                table(false),
            ),
            (
                "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
                table(true),
            ),
            // Tables only in JSON or YAML.
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json",
                Want::Json,
            ),
            // kube-rs list_metadata / client-go metadata client (lists, then get and watch)
            (
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                meta(false, true),
            ),
            (
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
                meta(false, false),
            ),
            (
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                meta(false, true),
            ),
            (
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
                meta(true, false),
            ),
            (
                "application/json; as=PartialObjectMetadataList; g=meta.k8s.io; v=v1beta1",
                meta(true, true),
            ),
            // A conversion the server cannot do: the next clause.
            (
                "application/json;as=Foo;g=meta.k8s.io;v=v1,application/json",
                Want::Json,
            ),
            (
                "application/json;as=PartialObjectMetadata;g=apps;v=v1,application/json",
                Want::Json,
            ),
            (
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2,application/json",
                Want::Json,
            ),
            (
                "application/json;as=PartialObjectMetadata,application/json",
                Want::Json,
            ),
            // Quality first, then specificity.
            (
                "application/json;q=0.5,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
                meta(false, false),
            ),
            (
                "*/*;q=0.8,application/json;as=Table;g=meta.k8s.io;v=v1",
                table(false),
            ),
            ("text/html,application/xhtml+xml,*/*;q=0.8", Want::Json),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept).ok(), Some(*want), "{accept}");
        }
        for a in [
            "text/plain",
            "application/json;as=Foo;g=meta.k8s.io;v=v1",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v3",
            "application/json;q=0",
            "application/yaml;stream=watch",
            "application/json;stream=other",
        ] {
            not_acceptable(a);
        }
    }
}
