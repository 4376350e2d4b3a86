//! Custom resources: the [`Strategy`] of one served version of an established CRD, and the
//! process-wide registry of them that [`crate::kinds::by_resource`] and
//! [`crate::kinds::by_kind`] consult after the built-in kinds.
//!
//! The registry holds `&'static` strategies (as the built-in kinds are): a strategy is leaked
//! once per distinct (CRD, version, definition) and reused while that definition is unchanged, so
//! memory grows only with CRD changes, not with syncs.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use ferry_crd::definition::{Definition, Version};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::decode::{DecodeError, Decoded};
use crate::errors::{ErrorList, Path};
use crate::kinds::{Column, KindInfo, StatusOnCreate, Strategy};

/// One served version of a custom kind.
pub struct CustomKind {
    info: KindInfo,
    /// The CRD's name (`crontabs.stable.example.com`).
    pub crd: String,
    pub version: Version,
    /// The storage version's name.
    pub storage_version: String,
    columns: Vec<Column>,
    has_defaults: bool,
    /// The version schema's `x-kubernetes-validations`, compiled once.
    rules: ferry_crd::validations::Validator,
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_list(v: &[String]) -> &'static [&'static str] {
    Box::leak(
        v.iter()
            .map(|s| leak(s))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

fn schema_has_defaults(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.contains_key("default") || m.values().any(schema_has_defaults),
        Value::Array(a) => a.iter().any(schema_has_defaults),
        _ => false,
    }
}

/// Upstream's OpenAPI definition name of a custom kind: the reversed group, version and kind
/// (`com.example.stable.v1.CronTab`).
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    format!("{}.{version}.{kind}", parts.join("."))
}

impl CustomKind {
    pub fn new(def: &Definition, version: &Version) -> CustomKind {
        let info = KindInfo {
            group: leak(&def.group),
            version: leak(&version.name),
            kind: leak(&def.kind),
            plural: leak(&def.plural),
            singular: leak(&def.singular),
            namespaced: def.namespaced,
            short_names: leak_list(&def.short_names),
            categories: leak_list(&def.categories),
            status_subresource: version.status,
            status_on_create: if version.status {
                StatusOnCreate::Reset
            } else {
                StatusOnCreate::Keep
            },
            generation: true,
            delete_returns_object: true,
            scale_subresource: version.scale.is_some(),
        };
        let mut columns = vec![Column::name_column()];
        for c in &version.columns {
            columns.push(Column {
                name: leak(&c.name),
                type_: leak(&c.type_),
                format: leak(&c.format),
                description: leak(&c.description),
                priority: c.priority,
            });
        }
        CustomKind {
            info,
            crd: def.name.clone(),
            version: version.clone(),
            storage_version: def
                .storage_version()
                .map(|v| v.name.clone())
                .unwrap_or_default(),
            columns,
            has_defaults: schema_has_defaults(&version.schema),
            rules: ferry_crd::validations::Validator::new(&version.schema),
        }
    }

    /// The structural schema's checks, then its CEL rules unless a value has the wrong type
    /// (as upstream: the rules are not run on a mistyped object).
    fn validate_schema(&self, value: &Value, old: Option<&Value>) -> ErrorList {
        let schema_errs = ferry_crd::schema::validate(&self.version.schema, value, "");
        let blocking = schema_errs
            .iter()
            .any(|e| e.detail.contains(" in body must be of type "));
        let mut errs: ErrorList = schema_errs
            .into_iter()
            .map(crate::custom::crd::convert)
            .collect();
        if self.rules.has_rules() {
            if blocking {
                errs.push(crate::errors::FieldError::invalid(
                    "<nil>",
                    "\"null\"",
                    "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                ));
            } else {
                errs.extend(
                    self.rules
                        .validate(value, old)
                        .into_iter()
                        .map(crate::custom::crd::convert),
                );
            }
        }
        errs
    }

    /// One row cell of a printer column, as upstream's table convertor renders it.
    fn cell(&self, c: &ferry_crd::definition::Column, v: &Value, now: Timestamp) -> Value {
        let Some(steps) = ferry_crd::jsonpath::parse(&c.json_path) else {
            return Value::Null;
        };
        let found = ferry_crd::jsonpath::eval(&steps, v);
        if found.is_empty() {
            return Value::Null;
        }
        if c.type_ == "date" {
            let t = found[0].as_str().and_then(|s| s.parse::<Timestamp>().ok());
            return match t {
                Some(t) => json!(crate::printers::duration::since(Some(t), now)),
                None => Value::Null,
            };
        }
        if found.len() == 1 {
            return match (c.type_.as_str(), found[0]) {
                ("string", Value::String(_)) => found[0].clone(),
                ("string", other) => json!(other.to_string()),
                (_, other) => other.clone(),
            };
        }
        let parts: Vec<String> = found
            .iter()
            .map(|x| match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        json!(parts.join(","))
    }
}

impl Strategy for CustomKind {
    fn info(&self) -> &KindInfo {
        &self.info
    }

    fn decode(&self, value: &Value) -> Result<Decoded<Value>, DecodeError> {
        let Value::Object(_) = value else {
            return Err(DecodeError::MissingKind);
        };
        let mut object = value.clone();
        let mut unknown = Vec::new();
        if let Some(meta) = value.get("metadata") {
            let d = crate::decode::decode::<ObjectMeta>(meta)
                .map_err(|e| DecodeError::Metadata(Box::new(e)))?;
            unknown.extend(d.unknown.into_iter().map(|u| format!("metadata.{u}")));
            object["metadata"] = serde_json::to_value(&d.object).map_err(DecodeError::Encode)?;
        }
        unknown.extend(ferry_crd::schema::prune(&self.version.schema, &mut object));
        if let Value::Object(m) = &mut object {
            m.insert("apiVersion".into(), json!(self.info.api_version()));
            m.insert("kind".into(), json!(self.info.kind));
        }
        Ok(Decoded { object, unknown })
    }

    fn default(&self, value: &mut Value) {
        ferry_crd::schema::default(&self.version.schema, value);
    }

    fn prepare_create(&self, _value: &mut Value) {}

    /// Without a status subresource `status` is an ordinary field: changing it bumps
    /// `metadata.generation` too (the API server bumps it for everything but metadata and
    /// status).
    fn prepare_update(&self, new: &mut Value, old: &Value) {
        if self.version.status || new.get("status") == old.get("status") {
            return;
        }
        let rest = |v: &Value| {
            let mut c = v.clone();
            if let Value::Object(m) = &mut c {
                for k in ["metadata", "status", "kind", "apiVersion"] {
                    m.remove(k);
                }
            }
            c
        };
        if rest(new) != rest(old) {
            return;
        }
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if let Some(Value::Object(m)) = new.get_mut("metadata") {
            m.insert("generation".into(), json!(g + 1));
        }
    }

    fn validate(&self, value: &Value, old: Option<&Value>) -> ErrorList {
        let meta = |v: &Value| -> ObjectMeta {
            v.get("metadata")
                .and_then(|m| serde_json::from_value(m.clone()).ok())
                .unwrap_or_default()
        };
        let mp = Path::new("metadata");
        let mut errs = match old {
            None => crate::validation::validate_object_meta(
                &meta(value),
                self.info.namespaced,
                crate::names::name_is_dns_subdomain,
                &mp,
            ),
            Some(o) => crate::validation::validate_object_meta_update(&meta(value), &meta(o), &mp),
        };
        errs.extend(self.validate_schema(value, old));
        errs
    }

    fn validate_status(&self, value: &Value, old: &Value) -> ErrorList {
        self.validate_schema(value, Some(old))
    }

    fn columns(&self) -> Vec<Column> {
        self.columns.clone()
    }

    fn row(&self, value: &Value) -> Vec<Value> {
        let now = Timestamp::now();
        let mut cells = vec![json!(
            value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
        )];
        for c in &self.version.columns {
            cells.push(self.cell(c, value, now));
        }
        cells
    }

    fn field(&self, value: &Value, field: &str) -> Option<String> {
        if !self.version.selectable.iter().any(|f| f == field) {
            return None;
        }
        let found = ferry_crd::jsonpath::get(&format!(".{field}"), value);
        Some(match found {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        })
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let meta_ref = generator.subschema_for::<ObjectMeta>().to_value();
        let mut s = self.version.schema.clone();
        if let Value::Object(m) = &mut s {
            let props = m
                .entry("properties")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(std::mem::take)
                .unwrap_or_default();
            let mut out = serde_json::Map::new();
            out.insert("apiVersion".into(), json!({"description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources", "type": "string"}));
            out.insert("kind".into(), json!({"description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds", "type": "string"}));
            let mut meta = meta_ref.clone();
            if let Value::Object(mm) = &mut meta {
                mm.insert("description".into(), json!("Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"));
            }
            out.insert("metadata".into(), meta);
            for (k, v) in props {
                if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    out.insert(k, v);
                }
            }
            m.insert("properties".into(), Value::Object(out));
        }
        let name = definition_name(self.info.group, self.info.version, self.info.kind);
        generator.definitions_mut().insert(name.clone(), s);
        let r = json!({"$ref": format!("#/components/schemas/{name}")});
        schemars::Schema::try_from(r).unwrap_or_default()
    }

    fn on_read(&self, value: &Value) -> Option<Value> {
        let av = self.info.api_version();
        let rewrite = value.get("apiVersion").and_then(Value::as_str) != Some(av.as_str());
        if !rewrite && !self.has_defaults {
            return None;
        }
        let mut v = value.clone();
        if rewrite && let Value::Object(m) = &mut v {
            m.insert("apiVersion".into(), json!(av));
        }
        if self.has_defaults {
            ferry_crd::schema::default(&self.version.schema, &mut v);
        }
        if &v == value { None } else { Some(v) }
    }

    fn scale_paths(&self) -> Option<(&str, &str, Option<&str>)> {
        self.version.scale.as_ref().map(|s| {
            (
                s.spec_replicas_path.as_str(),
                s.status_replicas_path.as_str(),
                s.label_selector_path.as_deref(),
            )
        })
    }
}

struct Registry {
    /// Every served custom kind version.
    served: Vec<&'static CustomKind>,
    /// Strategies made so far, by fingerprint, reused while the definition is unchanged.
    made: HashMap<String, &'static CustomKind>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        RwLock::new(Registry {
            served: Vec::new(),
            made: HashMap::new(),
        })
    })
}

fn fingerprint(def: &Definition, v: &Version) -> String {
    format!("{def:?}/{}", v.name)
}

/// Replaces the served custom kinds with those of these definitions (each served version).
/// Returns the strategies now served.
pub fn install(defs: &[Definition]) -> Vec<&'static CustomKind> {
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    let mut served = Vec::new();
    for d in defs {
        for v in d.versions.iter().filter(|v| v.served) {
            let fp = fingerprint(d, v);
            let k = match r.made.get(&fp) {
                Some(k) => *k,
                None => {
                    let k: &'static CustomKind = Box::leak(Box::new(CustomKind::new(d, v)));
                    r.made.insert(fp, k);
                    k
                }
            };
            served.push(k);
        }
    }
    r.served = served.clone();
    served
}

/// The custom kinds served now.
pub fn served() -> Vec<&'static CustomKind> {
    registry()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .served
        .clone()
}

pub fn by_resource(group: &str, version: &str, plural: &str) -> Option<&'static CustomKind> {
    served()
        .into_iter()
        .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
}

pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static CustomKind> {
    served()
        .into_iter()
        .find(|k| k.info.api_version() == api_version && k.info.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> Definition {
        let mut crd = json!({
            "metadata": {"name": "crontabs.stable.example.com", "uid": "u1"},
            "spec": {
                "group": "stable.example.com", "scope": "Namespaced",
                "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "listKind": "CronTabList", "shortNames": ["ct"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                        "cronSpec": {"type": "string"}, "replicas": {"type": "integer", "default": 1, "maximum": 10}}}}}},
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "additionalPrinterColumns": [{"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"},
                                                  {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                                                  {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]},
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
                ]
            }
        });
        crd["status"] = ferry_crd::definition::desired_status(&crd, &[], "2026-01-01T00:00:00Z");
        Definition::from_crd(&crd).expect("established")
    }

    #[test]
    fn decode_prunes_and_reports_unknown() {
        let d = def();
        let k = CustomKind::new(&d, &d.versions[0]);
        let body = json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "a", "namespace": "default", "bogusMeta": 1}, "spec": {"cronSpec": "x", "bogus": true}});
        let out = k.decode(&body).expect("decodes");
        assert_eq!(out.unknown, vec!["metadata.bogusMeta", "spec.bogus"]);
        assert_eq!(out.object["spec"], json!({"cronSpec": "x"}));
        let mut o = out.object;
        k.default(&mut o);
        assert_eq!(o["spec"]["replicas"], json!(1));
        let errs = k.validate(&o, None);
        assert!(errs.is_empty(), "{errs:?}");
        o["spec"]["replicas"] = json!(11);
        let errs = k.validate(&o, None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.replicas");
        o["metadata"]["name"] = json!("Bad_Name");
        assert_eq!(k.validate(&o, None).len(), 2);
    }

    #[test]
    fn rows_and_columns() {
        let d = def();
        let k = CustomKind::new(&d, &d.versions[0]);
        let cols: Vec<&str> = k.columns().iter().map(|c| c.name).collect();
        assert_eq!(cols, vec!["Name", "Spec", "Replicas", "Age"]);
        let now = Timestamp::now();
        let created = now
            .checked_sub(jiff::SignedDuration::from_secs(300))
            .expect("time");
        let obj = json!({"metadata": {"name": "a", "creationTimestamp": created.to_string()}, "spec": {"cronSpec": "* * * * */5", "replicas": 3}});
        let row = k.row(&obj);
        assert_eq!(row[0], json!("a"));
        assert_eq!(row[1], json!("* * * * */5"));
        assert_eq!(row[2], json!(3));
        assert!(
            row[3]
                .as_str()
                .is_some_and(|s| s.starts_with("5m") || s.starts_with("4m")),
            "{row:?}"
        );
        // The default column when a version lists none.
        let k2 = CustomKind::new(&d, &d.versions[1]);
        let cols: Vec<&str> = k2.columns().iter().map(|c| c.name).collect();
        assert_eq!(cols, vec!["Name", "Age"]);
    }

    #[test]
    fn versions_rewrite_api_version() {
        let d = def();
        let v1beta1 = CustomKind::new(&d, &d.versions[1]);
        // Objects written through v1 read as v1beta1 through v1beta1 (the `None` strategy).
        let stored = json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "a"}});
        let read = v1beta1.on_read(&stored).expect("rewritten");
        assert_eq!(read["apiVersion"], json!("stable.example.com/v1beta1"));
        let v1 = CustomKind::new(&d, &d.versions[0]);
        // Defaults apply on read too.
        let read = v1
            .on_read(&json!({"apiVersion": "stable.example.com/v1", "spec": {}}))
            .expect("defaulted");
        assert_eq!(read["spec"]["replicas"], json!(1));
    }

    #[test]
    fn registry_reuses_strategies() {
        let d = def();
        let a = install(std::slice::from_ref(&d));
        let b = install(std::slice::from_ref(&d));
        assert_eq!(a.len(), 2);
        assert!(std::ptr::eq(a[0], b[0]));
        assert!(by_resource("stable.example.com", "v1beta1", "crontabs").is_some());
        assert!(by_kind("stable.example.com/v1", "CronTab").is_some());
        install(&[]);
        assert!(by_resource("stable.example.com", "v1", "crontabs").is_none());
    }

    #[test]
    fn status_without_subresource_bumps_generation() {
        let d = def();
        let with = CustomKind::new(&d, &d.versions[0]);
        let without = CustomKind::new(&d, &d.versions[1]);
        let old = json!({"metadata": {"generation": 3}, "spec": {"a": 1}, "status": {"x": 1}});
        let mut new = json!({"metadata": {"generation": 3}, "spec": {"a": 1}, "status": {"x": 2}});
        with.prepare_update(&mut new, &old);
        assert_eq!(new["metadata"]["generation"], json!(3));
        without.prepare_update(&mut new, &old);
        assert_eq!(new["metadata"]["generation"], json!(4));
        // A spec change is the API server's to count (once).
        let mut new = json!({"metadata": {"generation": 3}, "spec": {"a": 2}, "status": {"x": 2}});
        without.prepare_update(&mut new, &old);
        assert_eq!(new["metadata"]["generation"], json!(3));
    }

    #[test]
    fn definition_names() {
        assert_eq!(
            definition_name("stable.example.com", "v1", "CronTab"),
            "com.example.stable.v1.CronTab"
        );
    }
}
