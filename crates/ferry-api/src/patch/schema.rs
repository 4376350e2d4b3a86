//! The schema knowledge the patch algorithms need: the type graph of every served kind (which
//! field holds an object, a list, a map or a scalar, and of which type) and, per list or map
//! field, its patch metadata as upstream's OpenAPI publishes it (`x-kubernetes-patch-strategy`,
//! `x-kubernetes-patch-merge-key`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`).
//!
//! The type graph is derived once from the `schemars` schemas of the registered kinds
//! ([`crate::kinds::all`]); the metadata comes from the table in `schema_table.rs`, keyed by
//! OpenAPI definition name and JSON field name. A kind that is registered in `kinds.rs` gets its
//! type graph for free; its list fields default to atomic lists until an entry is added to the
//! table. Objects of unknown kinds use [`TypeRef::UNTYPED`]: every list is atomic (replaced
//! wholesale) and every map is merged, as upstream does for custom resources.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;

use super::schema_table::{ATOMIC_STRUCTS, FIELD_META, KEY_DEFAULTS};

/// Patch metadata of one field, as in upstream's OpenAPI extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FieldMeta {
    /// `x-kubernetes-patch-strategy`: `merge`, `replace`, `retainKeys` or `merge,retainKeys`.
    pub patch_strategy: Option<&'static str>,
    /// `x-kubernetes-patch-merge-key`.
    pub patch_merge_key: Option<&'static str>,
    /// `x-kubernetes-list-type`: `atomic`, `set` or `map`.
    pub list_type: Option<&'static str>,
    /// `x-kubernetes-list-map-keys` (only with `list_type == Some("map")`).
    pub list_map_keys: &'static [&'static str],
    /// `x-kubernetes-map-type`: `atomic` or `granular`.
    pub map_type: Option<&'static str>,
}

impl FieldMeta {
    /// Metadata of a field without any extension.
    pub const NONE: FieldMeta = FieldMeta {
        patch_strategy: None,
        patch_merge_key: None,
        list_type: None,
        list_map_keys: &[],
        map_type: None,
    };

    /// Strategic merge patch merges this list (or map) instead of replacing it.
    pub fn smp_merges(&self) -> bool {
        self.patch_strategy
            .is_some_and(|s| s.split(',').any(|p| p.trim() == "merge"))
    }
    /// Strategic merge patch replaces this field wholesale (`patchStrategy: replace`).
    pub fn smp_replaces(&self) -> bool {
        self.patch_strategy
            .is_some_and(|s| s.split(',').any(|p| p.trim() == "replace"))
    }
}

/// A position in the type graph. `Copy`, cheap, `'static`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeRef(Option<u32>);

#[derive(Debug)]
enum Shape {
    /// Anything whose structure we do not know: maps merge, lists are atomic.
    Untyped,
    Scalar,
    Struct {
        definition: Option<String>,
        fields: HashMap<String, TypeRef>,
        atomic: bool,
    },
    List(TypeRef),
    Map(TypeRef),
}

/// What a [`TypeRef`] points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    Untyped,
    Scalar,
    Struct,
    List,
    Map,
}

#[derive(Debug, Default)]
struct Graph {
    nodes: Vec<Shape>,
    by_definition: HashMap<String, u32>,
    roots: HashMap<(String, String), TypeRef>,
}

impl TypeRef {
    /// The untyped schema: maps are merged, lists replaced.
    pub const UNTYPED: TypeRef = TypeRef(None);

    fn shape(self) -> &'static Shape {
        static UNTYPED: Shape = Shape::Untyped;
        match self.0 {
            Some(i) => graph().nodes.get(i as usize).unwrap_or(&UNTYPED),
            None => &UNTYPED,
        }
    }

    /// What kind of node this is.
    pub fn kind(self) -> TypeKind {
        match self.shape() {
            Shape::Untyped => TypeKind::Untyped,
            Shape::Scalar => TypeKind::Scalar,
            Shape::Struct { .. } => TypeKind::Struct,
            Shape::List(_) => TypeKind::List,
            Shape::Map(_) => TypeKind::Map,
        }
    }

    /// The OpenAPI definition name of a struct (`io.k8s.api.core.v1.ServiceSpec`).
    pub fn definition(self) -> Option<&'static str> {
        match self.shape() {
            Shape::Struct { definition, .. } => definition.as_deref(),
            _ => None,
        }
    }

    /// A struct marked `x-kubernetes-map-type: atomic` (`+structType=atomic`).
    pub fn is_atomic_struct(self) -> bool {
        matches!(self.shape(), Shape::Struct { atomic: true, .. })
    }

    /// The type of a child of a map-like node: a struct field, a map value. Anything else (or an
    /// unknown field) is untyped.
    pub fn child(self, name: &str) -> TypeRef {
        match self.shape() {
            Shape::Struct { fields, .. } => fields.get(name).copied().unwrap_or(TypeRef::UNTYPED),
            Shape::Map(v) => *v,
            _ => TypeRef::UNTYPED,
        }
    }

    /// The patch metadata of a child field (struct fields only; map values and untyped nodes
    /// have none).
    pub fn child_meta(self, name: &str) -> FieldMeta {
        match self.shape() {
            Shape::Struct {
                definition: Some(d),
                ..
            } => field_meta(d, name).unwrap_or(FieldMeta::NONE),
            _ => FieldMeta::NONE,
        }
    }

    /// The element type of a list (untyped for anything else).
    pub fn elem(self) -> TypeRef {
        match self.shape() {
            Shape::List(e) => *e,
            _ => TypeRef::UNTYPED,
        }
    }
}

/// The patch metadata of `field` in the OpenAPI definition `definition`, `None` when the field has
/// no `x-kubernetes-*` patch extension (or is unknown).
pub fn field_meta(definition: &str, field: &str) -> Option<FieldMeta> {
    static INDEX: OnceLock<HashMap<(&'static str, &'static str), FieldMeta>> = OnceLock::new();
    INDEX
        .get_or_init(|| FIELD_META.iter().map(|(d, f, m)| ((*d, *f), *m)).collect())
        .get(&(definition, field))
        .copied()
}

/// The schema default of a list-map key field (`protocol` of a port is `TCP`).
pub fn key_default(definition: &str, field: &str) -> Option<&'static str> {
    KEY_DEFAULTS
        .iter()
        .find(|(d, f, _)| *d == definition && *f == field)
        .map(|(_, _, v)| *v)
}

/// Definitions marked `x-kubernetes-map-type: atomic` (`+structType=atomic` upstream).
pub fn struct_is_atomic(definition: &str) -> bool {
    ATOMIC_STRUCTS.contains(&definition)
}

/// The type of the root object of a served kind.
pub fn root_type(api_version: &str, kind: &str) -> Option<TypeRef> {
    graph()
        .roots
        .get(&(api_version.to_string(), kind.to_string()))
        .copied()
}

/// The type of an OpenAPI definition reachable from a served kind.
pub fn definition_type(definition: &str) -> Option<TypeRef> {
    graph()
        .by_definition
        .get(definition)
        .map(|i| TypeRef(Some(*i)))
}

/// Every definition reachable from the served kinds (sorted).
pub fn definitions() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = graph().by_definition.keys().map(String::as_str).collect();
    v.sort_unstable();
    v
}

fn graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(build_graph)
}

fn build_graph() -> Graph {
    let mut generator = schemars::SchemaGenerator::default();
    let mut roots = Vec::new();
    for s in crate::kinds::all() {
        let schema = s.schema(&mut generator);
        roots.push((
            s.info().api_version(),
            s.info().kind.to_string(),
            schema.as_value().clone(),
        ));
    }
    let defs = generator.definitions().clone();
    let mut b = Builder {
        defs: &defs,
        graph: Graph::default(),
    };
    for (api_version, kind, schema) in roots {
        let t = b.node(&schema);
        b.graph.roots.insert((api_version, kind), t);
    }
    b.graph
}

struct Builder<'a> {
    defs: &'a serde_json::Map<String, Value>,
    graph: Graph,
}

impl Builder<'_> {
    fn push(&mut self, shape: Shape) -> TypeRef {
        self.graph.nodes.push(shape);
        TypeRef(Some((self.graph.nodes.len() - 1) as u32))
    }

    fn node(&mut self, schema: &Value) -> TypeRef {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r
                .rsplit('/')
                .next()
                .unwrap_or(r)
                .replace("~1", "/")
                .replace("~0", "~");
            return self.definition(&name);
        }
        if schema.get("x-kubernetes-int-or-string").is_some() {
            return self.push(Shape::Scalar);
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("array") => {
                let elem = match schema.get("items") {
                    Some(items) => self.node(items),
                    None => TypeRef::UNTYPED,
                };
                self.push(Shape::List(elem))
            }
            Some("object") => {
                if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                    let mut fields = HashMap::new();
                    for (k, v) in props {
                        let t = self.node(v);
                        fields.insert(k.clone(), t);
                    }
                    self.push(Shape::Struct {
                        definition: None,
                        fields,
                        atomic: false,
                    })
                } else if let Some(ap) =
                    schema.get("additionalProperties").filter(|v| v.is_object())
                {
                    let v = self.node(ap);
                    self.push(Shape::Map(v))
                } else {
                    TypeRef::UNTYPED
                }
            }
            Some(_) => self.push(Shape::Scalar),
            None => TypeRef::UNTYPED,
        }
    }

    fn definition(&mut self, name: &str) -> TypeRef {
        if let Some(i) = self.graph.by_definition.get(name) {
            return TypeRef(Some(*i));
        }
        let Some(schema) = self.defs.get(name).cloned() else {
            return TypeRef::UNTYPED;
        };
        let is_struct = schema.get("properties").is_some();
        if !is_struct {
            // A named scalar, map or list (Time, Quantity, IntOrString, FieldsV1, ...).
            let t = self.node(&schema);
            if let Some(i) = t.0 {
                self.graph.by_definition.insert(name.to_string(), i);
            }
            return t;
        }
        // Reserve the node first: the graph is recursive (JSONSchemaProps and friends).
        let me = self.push(Shape::Struct {
            definition: Some(name.to_string()),
            fields: HashMap::new(),
            atomic: false,
        });
        let Some(i) = me.0 else {
            return TypeRef::UNTYPED;
        };
        self.graph.by_definition.insert(name.to_string(), i);
        let mut fields = HashMap::new();
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                let t = self.node(v);
                fields.insert(k.clone(), t);
            }
        }
        let atomic = struct_is_atomic(name);
        self.graph.nodes[i as usize] = Shape::Struct {
            definition: Some(name.to_string()),
            fields,
            atomic,
        };
        me
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::type_complexity)]
mod tests {
    use super::*;

    #[test]
    fn roots_of_served_kinds() {
        for (av, k, def) in [
            ("v1", "Service", "io.k8s.api.core.v1.Service"),
            ("apps/v1", "Deployment", "io.k8s.api.apps.v1.Deployment"),
            (
                "discovery.k8s.io/v1",
                "EndpointSlice",
                "io.k8s.api.discovery.v1.EndpointSlice",
            ),
            ("events.k8s.io/v1", "Event", "io.k8s.api.events.v1.Event"),
        ] {
            let t = root_type(av, k).unwrap_or_else(|| panic!("{av} {k}"));
            assert_eq!(t.definition(), Some(def));
        }
        assert!(root_type("example.com/v1", "Widget").is_none());
    }

    #[test]
    fn walks_nested_types() {
        let d = root_type("apps/v1", "Deployment").unwrap();
        let pod = d.child("spec").child("template").child("spec");
        assert_eq!(pod.definition(), Some("io.k8s.api.core.v1.PodSpec"));
        let containers = pod.child("containers");
        assert_eq!(containers.kind(), TypeKind::List);
        assert_eq!(
            containers.elem().definition(),
            Some("io.k8s.api.core.v1.Container")
        );
        let m = pod.child_meta("containers");
        assert_eq!(m.patch_merge_key, Some("name"));
        assert!(m.smp_merges());
        let labels = d.child("metadata").child("labels");
        assert_eq!(labels.kind(), TypeKind::Map);
        assert_eq!(labels.child("app").kind(), TypeKind::Scalar);
        assert_eq!(d.child("spec").child("nope"), TypeRef::UNTYPED);
    }

    #[test]
    fn metadata_table_samples() {
        let cases: &[(
            &str,
            &str,
            Option<&str>,
            Option<&str>,
            Option<&str>,
            &[&str],
        )] = &[
            (
                "io.k8s.api.core.v1.ServiceSpec",
                "ports",
                Some("merge"),
                Some("port"),
                Some("map"),
                &["port", "protocol"],
            ),
            (
                "io.k8s.api.core.v1.Container",
                "ports",
                Some("merge"),
                Some("containerPort"),
                Some("map"),
                &["containerPort", "protocol"],
            ),
            (
                "io.k8s.api.core.v1.Container",
                "env",
                Some("merge"),
                Some("name"),
                Some("map"),
                &["name"],
            ),
            (
                "io.k8s.api.core.v1.Container",
                "volumeMounts",
                Some("merge"),
                Some("mountPath"),
                Some("map"),
                &["mountPath"],
            ),
            (
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                "finalizers",
                Some("merge"),
                None,
                Some("set"),
                &[],
            ),
            (
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                "ownerReferences",
                Some("merge"),
                Some("uid"),
                Some("map"),
                &["uid"],
            ),
            (
                "io.k8s.api.core.v1.PodStatus",
                "conditions",
                Some("merge"),
                Some("type"),
                Some("map"),
                &["type"],
            ),
            (
                "io.k8s.api.core.v1.ServiceSpec",
                "clusterIPs",
                None,
                None,
                Some("atomic"),
                &[],
            ),
        ];
        for (d, f, s, k, lt, keys) in cases {
            let m = field_meta(d, f).unwrap_or_else(|| panic!("{d}.{f}"));
            assert_eq!(
                (
                    m.patch_strategy,
                    m.patch_merge_key,
                    m.list_type,
                    m.list_map_keys
                ),
                (*s, *k, *lt, *keys),
                "{d}.{f}"
            );
        }
        let vol = field_meta("io.k8s.api.core.v1.PodSpec", "volumes").unwrap();
        assert!(vol.smp_merges());
        assert_eq!(vol.patch_merge_key, Some("name"));
        assert_eq!(
            field_meta("io.k8s.api.core.v1.ServiceSpec", "selector").and_then(|m| m.map_type),
            Some("atomic")
        );
    }

    /// Every list field of every reachable struct is described by the table (a missing entry
    /// would silently make the list atomic).
    #[test]
    fn every_list_field_has_metadata() {
        let mut missing = Vec::new();
        for d in definitions() {
            let Some(t) = definition_type(d) else {
                continue;
            };
            if let Shape::Struct { fields, .. } = t.shape() {
                for (f, ft) in fields {
                    if ft.kind() == TypeKind::List && field_meta(d, f).is_none() {
                        missing.push(format!("{d}.{f}"));
                    }
                }
            }
        }
        missing.sort();
        assert!(
            missing.is_empty(),
            "list fields without metadata: {missing:#?}"
        );
    }
}
