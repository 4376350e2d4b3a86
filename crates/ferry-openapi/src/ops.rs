//! The REST paths and operations of every served kind, as a small model rendered to both v3
//! ([`crate::v3`]) and v2 ([`crate::v2`]). Operation ids, actions, parameters and responses follow
//! the conventions of upstream's published OpenAPI.

use ferry_api::kinds::KindInfo;

use crate::schemas::{
    API_RESOURCE_LIST, DELETE_OPTIONS, Gvk, KindDefs, PATCH, SCALE, STATUS, WATCH_EVENT,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Put,
    Post,
    Delete,
    Patch,
}

impl Method {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Put => "put",
            Method::Post => "post",
            Method::Delete => "delete",
            Method::Patch => "patch",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    Path,
    Query,
}

impl Location {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Location::Path => "path",
            Location::Query => "query",
        }
    }
}

/// A non-body parameter.
#[derive(Debug, Clone)]
pub(crate) struct Param {
    pub name: &'static str,
    pub location: Location,
    pub description: String,
    pub required: bool,
    /// `string`, `integer` or `boolean`.
    pub ty: &'static str,
}

/// The query parameters, with their types and descriptions.
const QUERY: &[(&str, &str, &str)] = &[
    (
        "allowWatchBookmarks",
        "boolean",
        "Asks for BOOKMARK watch events; servers may ignore the request.",
    ),
    (
        "continue",
        "string",
        "The continue token returned by a previous list call that was given a limit, to fetch the next chunk.",
    ),
    (
        "dryRun",
        "string",
        "When present, the change is checked but not persisted. The only valid value is All.",
    ),
    (
        "fieldManager",
        "string",
        "The name of the actor making the change, recorded in managedFields. Required for apply patches.",
    ),
    (
        "fieldSelector",
        "string",
        "Selects objects by their fields, for example metadata.name=x. Defaults to everything.",
    ),
    (
        "fieldValidation",
        "string",
        "How the server treats unknown or duplicate fields in the body: Ignore, Warn (the default) or Strict.",
    ),
    (
        "force",
        "boolean",
        "Apply patches only: take ownership of conflicting fields from other managers.",
    ),
    (
        "gracePeriodSeconds",
        "integer",
        "Seconds to wait before the object is deleted; zero means at once.",
    ),
    (
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        "boolean",
        "Deletes objects that cannot be read from storage. Dangerous; disabled by default.",
    ),
    (
        "labelSelector",
        "string",
        "Selects objects by their labels. Defaults to everything.",
    ),
    (
        "limit",
        "integer",
        "The largest number of items to return; the server may return fewer and a continue token.",
    ),
    (
        "orphanDependents",
        "boolean",
        "Deprecated: use propagationPolicy. Whether dependents are orphaned.",
    ),
    ("pretty", "string", "When true, the output is indented."),
    (
        "propagationPolicy",
        "string",
        "How dependents are garbage collected: Orphan, Background or Foreground.",
    ),
    (
        "resourceVersion",
        "string",
        "Which version of the data a list or watch starts from.",
    ),
    (
        "resourceVersionMatch",
        "string",
        "How resourceVersion applies to a list: Exact or NotOlderThan.",
    ),
    (
        "sendInitialEvents",
        "boolean",
        "For watches: start with synthetic ADDED events for the current state.",
    ),
    (
        "timeoutSeconds",
        "integer",
        "Ends a list or watch call after this many seconds.",
    ),
    (
        "watch",
        "boolean",
        "Watch for changes of the described objects instead of listing them.",
    ),
];

fn query(name: &'static str) -> Param {
    let (ty, description) = QUERY
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, t, d)| (*t, *d))
        .unwrap_or(("string", ""));
    Param {
        name,
        location: Location::Query,
        description: description.to_string(),
        required: false,
        ty,
    }
}

fn queries(names: &[&'static str]) -> Vec<Param> {
    names.iter().map(|n| query(n)).collect()
}

const LIST_PARAMS: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE_PARAMS: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
const PATCH_PARAMS: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "force"];
const DELETE_PARAMS: &[&str] = &[
    "dryRun",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "orphanDependents",
    "propagationPolicy",
];
const DELETE_COLLECTION_PARAMS: &[&str] = &[
    "continue",
    "dryRun",
    "fieldSelector",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "labelSelector",
    "limit",
    "orphanDependents",
    "propagationPolicy",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
];

fn path_param(name: &'static str, description: String) -> Param {
    Param {
        name,
        location: Location::Path,
        description,
        required: true,
        ty: "string",
    }
}

/// The request body of an operation.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    /// The object itself (create, replace); required.
    Object(String),
    /// A patch document of any of the patch content types; required.
    Patch,
    /// Optional `DeleteOptions`.
    DeleteOptions,
}

impl Body {
    pub(crate) fn schema(&self) -> &str {
        match self {
            Body::Object(s) => s,
            Body::Patch => PATCH,
            Body::DeleteOptions => DELETE_OPTIONS,
        }
    }
    pub(crate) fn required(&self) -> bool {
        !matches!(self, Body::DeleteOptions)
    }
}

pub(crate) const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];
pub(crate) const OBJECT_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];
pub(crate) const STREAM_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf;stream=watch",
];

#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub code: &'static str,
    pub description: &'static str,
    /// The definition name of the body.
    pub schema: Option<String>,
}

fn ok(schema: &str, codes: &[(&'static str, &'static str)]) -> Vec<Response> {
    let mut v: Vec<Response> = codes
        .iter()
        .map(|(code, description)| Response {
            code,
            description,
            schema: Some(schema.to_string()),
        })
        .collect();
    v.push(Response {
        code: "401",
        description: "Unauthorized",
        schema: None,
    });
    v
}

#[derive(Debug, Clone)]
pub(crate) struct Operation {
    pub method: Method,
    pub id: String,
    pub description: String,
    pub tag: String,
    /// `x-kubernetes-action`.
    pub action: &'static str,
    pub gvk: Option<Gvk>,
    pub params: Vec<Param>,
    pub body: Option<Body>,
    pub responses: Vec<Response>,
    /// The response content types.
    pub produces: &'static [&'static str],
}

#[derive(Debug, Clone)]
pub(crate) struct PathItem {
    pub path: String,
    pub params: Vec<Param>,
    pub ops: Vec<Operation>,
}

/// All paths of one group version.
#[derive(Debug, Clone)]
pub(crate) struct GroupVersion {
    pub group: String,
    pub version: String,
    /// `api/v1` or `apis/apps/v1`: the key of the v3 index.
    pub key: String,
    pub paths: Vec<PathItem>,
}

/// `CoreV1`, `AppsV1`, `DiscoveryV1`, `FlowcontrolApiserverV1`: upstream's operation id infix.
pub(crate) fn gv_ident(group: &str, version: &str) -> String {
    let mut out = String::new();
    for part in group_parts(group) {
        out.push_str(&capitalise(part));
    }
    out.push_str(&capitalise(version));
    out
}

/// `core_v1`, `apps_v1`, `discovery_v1`: upstream's tag.
pub(crate) fn gv_tag(group: &str, version: &str) -> String {
    let mut out = String::new();
    for (i, part) in group_parts(group).into_iter().enumerate() {
        if i == 0 {
            out.push_str(part)
        } else {
            out.push_str(&capitalise(part))
        }
    }
    out.push('_');
    out.push_str(version);
    out
}

fn group_parts(group: &str) -> Vec<&str> {
    if group.is_empty() {
        return vec!["core"];
    }
    let trimmed = group.strip_suffix(".k8s.io").unwrap_or(group);
    trimmed.split('.').filter(|p| !p.is_empty()).collect()
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Whether upstream's DELETE answers with the object (rather than a `Status`) for this kind.
fn delete_returns_object(info: &KindInfo) -> bool {
    info.group.is_empty() && matches!(info.kind, "Pod" | "Service" | "ServiceAccount")
}

/// The paths of the served kinds, grouped by group version in registry order.
pub(crate) fn build(kinds: &[(&KindInfo, &KindDefs)]) -> Vec<GroupVersion> {
    let mut out: Vec<GroupVersion> = Vec::new();
    for (info, defs) in kinds {
        let idx = match out
            .iter()
            .position(|gv| gv.group == info.group && gv.version == info.version)
        {
            Some(i) => i,
            None => {
                out.push(group_version(info.group, info.version));
                out.len() - 1
            }
        };
        let gv = &mut out[idx];
        kind_paths(info, defs, &mut gv.paths);
    }
    out
}

/// Adds the create-only review kinds (upstream's `authentication.k8s.io/v1` and
/// `authorization.k8s.io/v1`): one `POST` per kind, in a group version of its own.
pub(crate) fn add_reviews(out: &mut Vec<GroupVersion>, reviews: &[crate::schemas::Review]) {
    for r in reviews {
        let idx = match out
            .iter()
            .position(|gv| gv.group == r.group && gv.version == "v1")
        {
            Some(i) => i,
            None => {
                out.push(group_version(r.group, "v1"));
                out.len() - 1
            }
        };
        let p = prefix(r.group, "v1");
        let gv = gv_ident(r.group, "v1");
        let (path, ns) = if r.namespaced {
            (
                format!("{p}/namespaces/{{namespace}}/{}", r.plural),
                "Namespaced",
            )
        } else {
            (format!("{p}/{}", r.plural), "")
        };
        let mut params = Vec::new();
        if r.namespaced {
            params.push(path_param(
                "namespace",
                "object name and auth scope, such as for teams and projects".to_string(),
            ));
        }
        let mut op_params = queries(&["dryRun", "fieldManager", "fieldValidation"]);
        op_params.push(query("pretty"));
        out[idx].paths.push(PathItem {
            path,
            params,
            ops: vec![Operation {
                method: Method::Post,
                id: format!("create{gv}{ns}{}", r.kind),
                description: format!("create a {}", r.kind),
                tag: gv_tag(r.group, "v1"),
                action: "post",
                gvk: Some(Gvk::new(r.group, "v1", r.kind)),
                params: op_params,
                body: Some(Body::Object(r.object.clone())),
                responses: ok(
                    &r.object,
                    &[("200", "OK"), ("201", "Created"), ("202", "Accepted")],
                ),
                produces: OBJECT_TYPES,
            }],
        });
    }
}

fn prefix(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

fn group_version(group: &str, version: &str) -> GroupVersion {
    let p = prefix(group, version);
    let root = PathItem {
        path: format!("{p}/"),
        params: Vec::new(),
        ops: vec![Operation {
            method: Method::Get,
            id: format!("get{}APIResources", gv_ident(group, version)),
            description: "get available resources".to_string(),
            tag: gv_tag(group, version),
            action: "",
            gvk: None,
            params: Vec::new(),
            body: None,
            responses: ok(API_RESOURCE_LIST, &[("200", "OK")]),
            produces: OBJECT_TYPES,
        }],
    };
    GroupVersion {
        group: group.to_string(),
        version: version.to_string(),
        key: p.trim_start_matches('/').to_string(),
        paths: vec![root],
    }
}

fn kind_paths(info: &KindInfo, defs: &KindDefs, paths: &mut Vec<PathItem>) {
    let p = prefix(info.group, info.version);
    let gv = gv_ident(info.group, info.version);
    let tag = gv_tag(info.group, info.version);
    let kind = info.kind;
    let gvk = Gvk::new(info.group, info.version, kind);
    let plural = info.plural;
    let (scope_path, watch_scope_path, ns) = if info.namespaced {
        (
            format!("{p}/namespaces/{{namespace}}/{plural}"),
            format!("{p}/watch/namespaces/{{namespace}}/{plural}"),
            "Namespaced",
        )
    } else {
        (format!("{p}/{plural}"), format!("{p}/watch/{plural}"), "")
    };
    let namespace = || path_param("namespace", "The namespace of the objects.".to_string());
    let name = || path_param("name", format!("The name of the {kind}."));
    let mut collection_params = Vec::new();
    let mut item_params = vec![name()];
    if info.namespaced {
        collection_params.push(namespace());
        item_params.push(namespace());
    }
    collection_params.push(query("pretty"));
    item_params.push(query("pretty"));

    let op = |method,
              id: String,
              description: String,
              action,
              gvk: &Gvk,
              params,
              body,
              responses,
              produces| Operation {
        method,
        id,
        description,
        tag: tag.clone(),
        action,
        gvk: Some(gvk.clone()),
        params,
        body,
        responses,
        produces,
    };
    let object = defs.object.as_str();
    let delete_body = if delete_returns_object(info) {
        object
    } else {
        STATUS
    };

    // The collection.
    paths.push(PathItem {
        path: scope_path.clone(),
        params: collection_params.clone(),
        ops: vec![
            op(
                Method::Get,
                format!("list{gv}{ns}{kind}"),
                format!("list or watch objects of kind {kind}"),
                "list",
                &gvk,
                queries(LIST_PARAMS),
                None,
                ok(&defs.list, &[("200", "OK")]),
                STREAM_TYPES,
            ),
            op(
                Method::Post,
                format!("create{gv}{ns}{kind}"),
                format!("create a {kind}"),
                "post",
                &gvk,
                queries(WRITE_PARAMS),
                Some(Body::Object(object.to_string())),
                ok(
                    object,
                    &[("200", "OK"), ("201", "Created"), ("202", "Accepted")],
                ),
                OBJECT_TYPES,
            ),
            op(
                Method::Delete,
                format!("delete{gv}Collection{ns}{kind}"),
                format!("delete collection of {kind}"),
                "deletecollection",
                &gvk,
                queries(DELETE_COLLECTION_PARAMS),
                Some(Body::DeleteOptions),
                ok(STATUS, &[("200", "OK")]),
                OBJECT_TYPES,
            ),
        ],
    });

    // One object.
    let item_path = format!("{scope_path}/{{name}}");
    paths.push(PathItem {
        path: item_path.clone(),
        params: item_params.clone(),
        ops: vec![
            op(
                Method::Get,
                format!("read{gv}{ns}{kind}"),
                format!("read the specified {kind}"),
                "get",
                &gvk,
                Vec::new(),
                None,
                ok(object, &[("200", "OK")]),
                OBJECT_TYPES,
            ),
            op(
                Method::Put,
                format!("replace{gv}{ns}{kind}"),
                format!("replace the specified {kind}"),
                "put",
                &gvk,
                queries(WRITE_PARAMS),
                Some(Body::Object(object.to_string())),
                ok(object, &[("200", "OK"), ("201", "Created")]),
                OBJECT_TYPES,
            ),
            op(
                Method::Delete,
                format!("delete{gv}{ns}{kind}"),
                format!("delete a {kind}"),
                "delete",
                &gvk,
                queries(DELETE_PARAMS),
                Some(Body::DeleteOptions),
                ok(delete_body, &[("200", "OK"), ("202", "Accepted")]),
                OBJECT_TYPES,
            ),
            op(
                Method::Patch,
                format!("patch{gv}{ns}{kind}"),
                format!("partially update the specified {kind}"),
                "patch",
                &gvk,
                queries(PATCH_PARAMS),
                Some(Body::Patch),
                ok(object, &[("200", "OK"), ("201", "Created")]),
                OBJECT_TYPES,
            ),
        ],
    });

    // Subresources.
    let mut sub = |name: &str, schema: &str, sub_gvk: &Gvk| {
        let suffix = capitalise(name);
        paths.push(PathItem {
            path: format!("{item_path}/{name}"),
            params: item_params.clone(),
            ops: vec![
                op(
                    Method::Get,
                    format!("read{gv}{ns}{kind}{suffix}"),
                    format!("read {name} of the specified {kind}"),
                    "get",
                    sub_gvk,
                    Vec::new(),
                    None,
                    ok(schema, &[("200", "OK")]),
                    OBJECT_TYPES,
                ),
                op(
                    Method::Put,
                    format!("replace{gv}{ns}{kind}{suffix}"),
                    format!("replace {name} of the specified {kind}"),
                    "put",
                    sub_gvk,
                    queries(WRITE_PARAMS),
                    Some(Body::Object(schema.to_string())),
                    ok(schema, &[("200", "OK"), ("201", "Created")]),
                    OBJECT_TYPES,
                ),
                op(
                    Method::Patch,
                    format!("patch{gv}{ns}{kind}{suffix}"),
                    format!("partially update {name} of the specified {kind}"),
                    "patch",
                    sub_gvk,
                    queries(PATCH_PARAMS),
                    Some(Body::Patch),
                    ok(schema, &[("200", "OK"), ("201", "Created")]),
                    OBJECT_TYPES,
                ),
            ],
        });
    };
    if info.scale_subresource {
        sub("scale", SCALE, &Gvk::new("autoscaling", "v1", "Scale"));
    }
    if info.status_subresource {
        sub("status", object, &gvk);
    }

    // Lists across namespaces.
    let mut list_level = queries(LIST_PARAMS);
    list_level.insert(5, query("pretty"));
    if info.namespaced {
        paths.push(PathItem {
            path: format!("{p}/{plural}"),
            params: list_level.clone(),
            ops: vec![op(
                Method::Get,
                format!("list{gv}{kind}ForAllNamespaces"),
                format!("list or watch objects of kind {kind}"),
                "list",
                &gvk,
                Vec::new(),
                None,
                ok(&defs.list, &[("200", "OK")]),
                STREAM_TYPES,
            )],
        });
    }

    // The deprecated watch paths.
    let with = |mut scope: Vec<Param>| {
        let mut v = list_level.clone();
        v.append(&mut scope);
        v
    };
    let watch = |id: String, description: String, action| {
        op(
            Method::Get,
            id,
            description,
            action,
            &gvk,
            Vec::new(),
            None,
            ok(WATCH_EVENT, &[("200", "OK")]),
            STREAM_TYPES,
        )
    };
    let scope_params = || {
        if info.namespaced {
            vec![namespace()]
        } else {
            Vec::new()
        }
    };
    paths.push(PathItem {
        path: watch_scope_path.clone(),
        params: with(scope_params()),
        ops: vec![watch(
            format!("watch{gv}{ns}{kind}List"),
            format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead."),
            "watchlist",
        )],
    });
    let mut named = vec![name()];
    named.extend(scope_params());
    paths.push(PathItem {
        path: format!("{watch_scope_path}/{{name}}"),
        params: with(named),
        ops: vec![watch(
            format!("watch{gv}{ns}{kind}"),
            format!("watch changes to an object of kind {kind}. deprecated: use the 'watch' parameter with a list operation instead, filtered to a single item with the 'fieldSelector' parameter."),
            "watch",
        )],
    });
    if info.namespaced {
        paths.push(PathItem {
            path: format!("{p}/watch/{plural}"),
            params: list_level.clone(),
            ops: vec![watch(
                format!("watch{gv}{kind}ListForAllNamespaces"),
                format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead."),
                "watchlist",
            )],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_upstream() {
        let cases = [
            ("", "v1", "CoreV1", "core_v1"),
            ("apps", "v1", "AppsV1", "apps_v1"),
            ("discovery.k8s.io", "v1", "DiscoveryV1", "discovery_v1"),
            ("networking.k8s.io", "v1", "NetworkingV1", "networking_v1"),
            (
                "flowcontrol.apiserver.k8s.io",
                "v1",
                "FlowcontrolApiserverV1",
                "flowcontrolApiserver_v1",
            ),
            (
                "rbac.authorization.k8s.io",
                "v1",
                "RbacAuthorizationV1",
                "rbacAuthorization_v1",
            ),
            (
                "ferry.dev",
                "v1alpha1",
                "FerryDevV1alpha1",
                "ferryDev_v1alpha1",
            ),
        ];
        for (group, version, ident, tag) in cases {
            assert_eq!(gv_ident(group, version), ident);
            assert_eq!(gv_tag(group, version), tag);
        }
    }

    #[test]
    fn every_query_parameter_is_described() {
        for names in [
            LIST_PARAMS,
            WRITE_PARAMS,
            PATCH_PARAMS,
            DELETE_PARAMS,
            DELETE_COLLECTION_PARAMS,
        ] {
            for n in names {
                assert!(QUERY.iter().any(|(q, _, d)| q == n && !d.is_empty()), "{n}");
            }
        }
    }
}
