//! The schema definitions served in `components.schemas` (v3) and `definitions` (v2).
//!
//! Every definition comes from the `k8s-openapi` `schemars` implementations, whose schema names are
//! already upstream's definition names (`io.k8s.api.core.v1.Service`). The generator is told to put
//! definitions under `/components/schemas`, so every `$ref` is `#/components/schemas/<name>` from the
//! start. The few places where `k8s-openapi` differs from upstream's published OpenAPI are fixed in
//! [`normalise`]; list kinds (`ServiceList`), which `k8s-openapi` has no schema for, are built here.

use std::collections::{BTreeMap, BTreeSet};

use ferry_api::kinds::KindInfo;
use ferry_api::patch::FieldMeta;
use k8s_openapi::api::autoscaling::v1 as autoscaling;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// Where definitions live in a v3 document, as the prefix of a `$ref`.
pub(crate) const V3_REF: &str = "#/components/schemas/";
/// Where definitions live in a v2 document, as the prefix of a `$ref`.
pub(crate) const V2_REF: &str = "#/definitions/";

pub(crate) const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub(crate) const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub(crate) const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
pub(crate) const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
pub(crate) const API_RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";
pub(crate) const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// A group, version and kind, as upstream writes it in `x-kubernetes-group-version-kind`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    pub(crate) fn new(group: &str, version: &str, kind: &str) -> Gvk {
        Gvk {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
        }
    }
    /// `{"group":…,"kind":…,"version":…}` (upstream's key order).
    pub(crate) fn to_json(&self) -> Value {
        json!({"group": self.group, "kind": self.kind, "version": self.version})
    }
}

/// The definitions of one served kind.
#[derive(Debug, Clone)]
pub(crate) struct KindDefs {
    /// `io.k8s.api.core.v1.Service`.
    pub object: String,
    /// `io.k8s.api.core.v1.ServiceList`.
    pub list: String,
}

/// Every definition, with `$ref`s in v3 form (`#/components/schemas/…`), siblings of `$ref` kept as
/// `k8s-openapi` writes them (the v2 form; [`to_v3`] wraps them in `allOf`).
pub(crate) struct Definitions {
    pub defs: BTreeMap<String, Value>,
    /// Per served kind, in registry order.
    pub kinds: Vec<KindDefs>,
    /// The create-only review kinds ([`REVIEWS`]) with their definition names.
    pub reviews: Vec<Review>,
}

/// A create-only review kind (not stored): `POST` answers the reviewed object.
#[derive(Debug, Clone)]
pub(crate) struct Review {
    pub group: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// `io.k8s.api.authentication.v1.TokenReview`.
    pub object: String,
}

/// The review kinds every kube-apiserver serves (authentication.k8s.io/v1 and
/// authorization.k8s.io/v1): group, plural, kind, namespaced.
pub const REVIEWS: &[(&str, &str, &str, bool)] = &[
    (
        "authentication.k8s.io",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
    ),
    (
        "authentication.k8s.io",
        "tokenreviews",
        "TokenReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        true,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
    ),
];

fn review_schema(generator: &mut SchemaGenerator, kind: &str) -> Option<schemars::Schema> {
    use k8s_openapi::api::{authentication::v1 as authn, authorization::v1 as authz};
    Some(match kind {
        "SelfSubjectReview" => generator.subschema_for::<authn::SelfSubjectReview>(),
        "TokenReview" => generator.subschema_for::<authn::TokenReview>(),
        "LocalSubjectAccessReview" => generator.subschema_for::<authz::LocalSubjectAccessReview>(),
        "SelfSubjectAccessReview" => generator.subschema_for::<authz::SelfSubjectAccessReview>(),
        "SelfSubjectRulesReview" => generator.subschema_for::<authz::SelfSubjectRulesReview>(),
        "SubjectAccessReview" => generator.subschema_for::<authz::SubjectAccessReview>(),
        _ => return None,
    })
}

/// The group versions served, in registry order, each with its kinds.
pub(crate) fn group_versions(infos: &[&KindInfo]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for i in infos {
        let gv = (i.group.to_string(), i.version.to_string());
        if !out.contains(&gv) {
            out.push(gv);
        }
    }
    out
}

/// The fields Ferry serves beyond the k8s-openapi types (`ferry_api::kinds::EXTRA_FIELDS`).
fn add_extra_fields(defs: &mut BTreeMap<String, Value>) {
    if let Some(Value::Object(props)) = defs
        .get_mut("io.k8s.api.core.v1.ServiceSpec")
        .and_then(|s| s.get_mut("properties"))
    {
        props.insert(
            "topologyKeys".into(),
            serde_json::json!({
                "description": "topologyKeys is a preference-order list of topology keys which implementations of services should use to preferentially sort endpoints when accessing this Service: the first key whose value matches the client's node is used, \"*\" (only last) means any endpoint. At most 16 keys. Not allowed with externalTrafficPolicy=Local.",
                "type": "array",
                "items": {"type": "string", "default": ""},
                "x-kubernetes-list-type": "atomic"
            }),
        );
    }
}

/// Generates every definition reachable from the served kinds plus the meta schemas the operations
/// reference.
pub(crate) fn generate(kinds: &[&dyn ferry_api::kinds::Strategy]) -> Definitions {
    let mut generator: SchemaGenerator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();

    let mut roots = Vec::with_capacity(kinds.len());
    let mut inline: Vec<(String, Value)> = Vec::new();
    for s in kinds {
        let info = s.info();
        let schema = s.schema(&mut generator);
        let name = match schema
            .as_value()
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix(V3_REF))
        {
            Some(n) => n.to_string(),
            None => {
                // A kind whose schema is inlined: give it a stable name of its own.
                let group = if info.group.is_empty() {
                    "core"
                } else {
                    info.group
                };
                let name = format!("io.ferry.api.{group}.{}.{}", info.version, info.kind);
                inline.push((name.clone(), schema.to_value()));
                name
            }
        };
        roots.push(name);
    }
    generator.subschema_for::<meta::Status>();
    generator.subschema_for::<meta::DeleteOptions>();
    generator.subschema_for::<meta::Patch>();
    generator.subschema_for::<meta::WatchEvent<Value>>();
    generator.subschema_for::<meta::APIResourceList>();
    generator.subschema_for::<meta::ListMeta>();
    if kinds.iter().any(|s| s.info().scale_subresource) {
        generator.subschema_for::<autoscaling::Scale>();
    }
    let mut reviews = Vec::new();
    for (group, plural, kind, namespaced) in REVIEWS {
        let object = review_schema(&mut generator, kind)
            .and_then(|s| {
                s.as_value()
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.strip_prefix(V3_REF))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| {
                format!("io.k8s.api.{}.v1.{kind}", group.trim_end_matches(".k8s.io"))
            });
        reviews.push(Review {
            group,
            plural,
            kind,
            namespaced: *namespaced,
            object,
        });
    }

    let mut defs: BTreeMap<String, Value> = generator.take_definitions(false).into_iter().collect();
    defs.extend(inline);
    add_extra_fields(&mut defs);

    // Kinds and their lists.
    let infos: Vec<&KindInfo> = kinds.iter().map(|s| s.info()).collect();
    let mut out_kinds = Vec::with_capacity(kinds.len());
    for (info, object) in infos.iter().zip(roots) {
        let list = format!("{object}List");
        defs.insert(list.clone(), list_schema(info, &object));
        set_gvk(
            &mut defs,
            &object,
            vec![Gvk::new(info.group, info.version, info.kind)],
        );
        set_gvk(
            &mut defs,
            &list,
            vec![Gvk::new(info.group, info.version, &info.list_kind())],
        );
        out_kinds.push(KindDefs { object, list });
    }

    // Meta kinds: upstream lists one entry per group version for the kinds every group serves.
    let gvs = group_versions(&infos);
    let per_gv = |kind: &str| -> Vec<Gvk> {
        let mut v: Vec<Gvk> = gvs.iter().map(|(g, ver)| Gvk::new(g, ver, kind)).collect();
        v.sort();
        v
    };
    for r in &reviews {
        set_gvk(&mut defs, &r.object, vec![Gvk::new(r.group, "v1", r.kind)]);
    }
    set_gvk(&mut defs, STATUS, vec![Gvk::new("", "v1", "Status")]);
    set_gvk(&mut defs, DELETE_OPTIONS, per_gv("DeleteOptions"));
    set_gvk(&mut defs, WATCH_EVENT, per_gv("WatchEvent"));
    set_gvk(
        &mut defs,
        SCALE,
        vec![Gvk::new("autoscaling", "v1", "Scale")],
    );

    for (name, schema) in defs.iter_mut() {
        normalise(name, schema);
        if let Value::Object(map) = schema {
            annotate(name, map);
        }
    }
    Definitions {
        defs,
        kinds: out_kinds,
        reviews,
    }
}

fn set_gvk(defs: &mut BTreeMap<String, Value>, name: &str, gvks: Vec<Gvk>) {
    if let Some(Value::Object(m)) = defs.get_mut(name) {
        m.insert(
            "x-kubernetes-group-version-kind".into(),
            Value::Array(gvks.iter().map(Gvk::to_json).collect()),
        );
    }
}

/// The schema of `<Kind>List`, shaped like upstream's list types.
fn list_schema(info: &KindInfo, object: &str) -> Value {
    json!({
        "description": format!("{}List is a list of {} objects.", info.kind, info.kind),
        "type": "object",
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
                "type": "string",
            },
            "items": {
                "description": format!("The {} objects of the list.", info.kind),
                "type": "array",
                "items": {"$ref": format!("{V3_REF}{object}")},
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
                "type": "string",
            },
            "metadata": {
                "$ref": format!("{V3_REF}{LIST_META}"),
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            },
        },
        "required": ["items"],
    })
}

/// Brings a `k8s-openapi` definition in line with upstream's published OpenAPI.
fn normalise(name: &str, schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    match name {
        // Upstream publishes these as strings with a format; `k8s-openapi` marks them with
        // `x-kubernetes-int-or-string` and no type. Old kubectl validates against the type (a string
        // schema accepts any scalar), explain prints it.
        INT_OR_STRING => {
            map.remove("x-kubernetes-int-or-string");
            map.insert("type".into(), "string".into());
            map.insert("format".into(), "int-or-string".into());
        }
        QUANTITY => {
            map.remove("x-kubernetes-int-or-string");
            map.insert("type".into(), "string".into());
        }
        _ => {}
    }
    // `k8s-openapi` makes `metadata` (and some `spec`s) non-optional in Rust and lists them as
    // required; upstream's Go types mark them `omitempty`, so upstream does not require them. The one
    // exception among served kinds is core/v1 Event, whose metadata upstream does require.
    let is_object = map
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key("apiVersion"));
    if is_object && let Some(Value::Array(req)) = map.get_mut("required") {
        req.retain(|f| match f.as_str() {
            Some("spec") => false,
            Some("metadata") => name == "io.k8s.api.core.v1.Event",
            _ => true,
        });
        if req.is_empty() {
            map.remove("required");
        }
    }
}

/// The list/map metadata of one field (from `ferry_api::patch`, the table the strategic merge
/// patch uses, so that kubectl computes its patches with the same merge keys the server applies).
fn field_extensions(definition: &str, field: &str) -> Option<FieldMeta> {
    ferry_api::patch::field_meta(definition, field)
}

/// Adds upstream's `x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`,
/// `x-kubernetes-list-type`, `x-kubernetes-list-map-keys` and `x-kubernetes-map-type` extensions to
/// the properties of one definition.
pub(crate) fn annotate(definition: &str, schema: &mut Map<String, Value>) {
    let Some(Value::Object(props)) = schema.get_mut("properties") else {
        return;
    };
    for (field, prop) in props.iter_mut() {
        let (Some(ext), Value::Object(p)) = (field_extensions(definition, field), prop) else {
            continue;
        };
        apply_extensions(&ext, p);
    }
}

fn apply_extensions(ext: &FieldMeta, p: &mut Map<String, Value>) {
    if !ext.list_map_keys.is_empty() {
        p.insert(
            "x-kubernetes-list-map-keys".into(),
            ext.list_map_keys.iter().map(|k| Value::from(*k)).collect(),
        );
    }
    if let Some(t) = ext.list_type {
        p.insert("x-kubernetes-list-type".into(), t.into());
    }
    if let Some(t) = ext.map_type {
        p.insert("x-kubernetes-map-type".into(), t.into());
    }
    if let Some(k) = ext.patch_merge_key {
        p.insert("x-kubernetes-patch-merge-key".into(), k.into());
    }
    if let Some(s) = ext.patch_strategy {
        p.insert("x-kubernetes-patch-strategy".into(), s.into());
    }
}

/// Every definition name referenced (with `prefix`) anywhere inside `value`.
pub(crate) fn collect_refs(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "$ref" {
                    if let Some(name) = v.as_str().and_then(|r| r.strip_prefix(prefix)) {
                        out.insert(name.to_string());
                    }
                } else {
                    collect_refs(v, prefix, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, prefix, out)),
        _ => {}
    }
}

/// The definitions each definition refers to directly.
pub(crate) fn ref_graph(defs: &BTreeMap<String, Value>) -> BTreeMap<&str, BTreeSet<String>> {
    defs.iter()
        .map(|(name, schema)| {
            let mut refs = BTreeSet::new();
            collect_refs(schema, V3_REF, &mut refs);
            (name.as_str(), refs)
        })
        .collect()
}

/// The names of `roots` plus every definition they reach.
pub(crate) fn closure(
    graph: &BTreeMap<&str, BTreeSet<String>>,
    roots: BTreeSet<String>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.into_iter().collect();
    while let Some(name) = todo.pop() {
        if seen.contains(&name) {
            continue;
        }
        if let Some(refs) = graph.get(name.as_str()) {
            todo.extend(refs.iter().filter(|r| !seen.contains(*r)).cloned());
        }
        seen.insert(name);
    }
    seen
}

/// A definition in v3 form: a `$ref` with siblings (a description) becomes
/// `{"allOf":[{"$ref":…}], …siblings}`, as upstream's v3 documents write it.
pub(crate) fn to_v3(value: &Value) -> Value {
    match value {
        Value::Object(m) => {
            if m.contains_key("$ref") && m.len() > 1 {
                let mut out = Map::with_capacity(m.len());
                let mut r = Map::new();
                for (k, v) in m {
                    if k == "$ref" {
                        r.insert(k.clone(), v.clone());
                        out.insert(
                            "allOf".into(),
                            Value::Array(vec![Value::Object(std::mem::take(&mut r))]),
                        );
                    } else {
                        out.insert(k.clone(), to_v3(v));
                    }
                }
                Value::Object(out)
            } else {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), to_v3(v))).collect())
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(to_v3).collect()),
        other => other.clone(),
    }
}

/// A definition in v2 form: `$ref`s point at `#/definitions/`.
pub(crate) fn to_v2(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(
                    |(k, v)| match (k.as_str(), v.as_str().and_then(|r| r.strip_prefix(V3_REF))) {
                        ("$ref", Some(name)) => {
                            (k.clone(), Value::String(format!("{V2_REF}{name}")))
                        }
                        _ => (k.clone(), to_v2(v)),
                    },
                )
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(to_v2).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_wraps_refs_with_siblings_only() {
        let cases = [
            (
                json!({"$ref": "#/components/schemas/A"}),
                json!({"$ref": "#/components/schemas/A"}),
            ),
            (
                json!({"$ref": "#/components/schemas/A", "description": "d"}),
                json!({"allOf": [{"$ref": "#/components/schemas/A"}], "description": "d"}),
            ),
            (
                json!({"type": "array", "items": {"$ref": "#/components/schemas/A", "description": "x"}}),
                json!({"type": "array", "items": {"allOf": [{"$ref": "#/components/schemas/A"}], "description": "x"}}),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(to_v3(&input), want);
        }
    }

    #[test]
    fn v2_rewrites_ref_prefix() {
        let cases = [
            (
                json!({"$ref": "#/components/schemas/A"}),
                json!({"$ref": "#/definitions/A"}),
            ),
            (
                json!({"p": [{"$ref": "#/components/schemas/B", "description": "d"}]}),
                json!({"p": [{"$ref": "#/definitions/B", "description": "d"}]}),
            ),
            (json!({"$ref": "#/other/C"}), json!({"$ref": "#/other/C"})),
        ];
        for (input, want) in cases {
            assert_eq!(to_v2(&input), want);
        }
    }

    #[test]
    fn normalise_fixes_int_or_string_and_required() {
        let mut ios = json!({"description": "d", "x-kubernetes-int-or-string": true});
        normalise(INT_OR_STRING, &mut ios);
        assert_eq!(
            ios,
            json!({"description": "d", "type": "string", "format": "int-or-string"})
        );

        let cases = [
            (
                "io.k8s.api.apps.v1.Deployment",
                json!(["metadata", "spec"]),
                None,
            ),
            (
                "io.k8s.api.core.v1.Event",
                json!(["involvedObject", "metadata"]),
                Some(json!(["involvedObject", "metadata"])),
            ),
            (
                "io.k8s.api.discovery.v1.EndpointSlice",
                json!(["addressType", "metadata"]),
                Some(json!(["addressType"])),
            ),
        ];
        for (name, req, want) in cases {
            let mut s = json!({"properties": {"apiVersion": {}, "metadata": {}}, "required": req});
            normalise(name, &mut s);
            assert_eq!(s.get("required").cloned(), want, "{name}");
        }
        // Not a top-level object: `required` is left alone.
        let mut spec = json!({"properties": {"metadata": {}}, "required": ["metadata"]});
        normalise("x.Spec", &mut spec);
        assert_eq!(spec["required"], json!(["metadata"]));
    }

    #[test]
    fn extensions_are_written_like_upstream() {
        let ext = FieldMeta {
            patch_strategy: Some("merge"),
            patch_merge_key: Some("port"),
            list_type: Some("map"),
            list_map_keys: &["port", "protocol"],
            map_type: None,
        };
        let mut p = Map::new();
        apply_extensions(&ext, &mut p);
        assert_eq!(
            Value::Object(p),
            json!({
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "x-kubernetes-list-type": "map",
                "x-kubernetes-patch-merge-key": "port",
                "x-kubernetes-patch-strategy": "merge",
            })
        );
    }
}
