use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Instant;

use prost::Message;
use serde_json::{Value, json};

use super::*;
use crate::gnostic::{Document, NonBodyParameterKind, ParameterKind, ParametersItemKind};

fn built() -> &'static OpenApi {
    static BUILT: OnceLock<OpenApi> = OnceLock::new();
    BUILT.get_or_init(OpenApi::build)
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("valid JSON")
}

fn gv_key(info: &KindInfo) -> String {
    if info.group.is_empty() {
        format!("api/{}", info.version)
    } else {
        format!("apis/{}/{}", info.group, info.version)
    }
}

fn v3_doc(key: &str) -> Value {
    let (bytes, _) = built()
        .v3_document(key)
        .unwrap_or_else(|| panic!("no v3 document {key}"));
    parse(bytes)
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.pointer(&format!(
        "/components/schemas/{}",
        name.replace('~', "~0").replace('/', "~1")
    ))
    .unwrap_or_else(|| panic!("no schema {name}"))
}

/// The definition a property refers to, directly or through a single-element `allOf`.
fn ref_of(prop: &Value) -> Option<&str> {
    prop.get("$ref")
        .or_else(|| prop.pointer("/allOf/0/$ref"))
        .and_then(Value::as_str)
}

#[test]
fn index_lists_every_group_version_with_its_hash() {
    let index = parse(built().v3_index());
    let paths = index["paths"].as_object().expect("paths");
    let mut want: Vec<String> = ferry_api::kinds::all()
        .iter()
        .map(|s| gv_key(s.info()))
        .collect();
    // The review kinds (TokenReview, SubjectAccessReview, …) are served without a registry kind.
    want.extend([
        "apis/authentication.k8s.io/v1".to_string(),
        "apis/authorization.k8s.io/v1".to_string(),
    ]);
    want.sort();
    want.dedup();
    let got: Vec<String> = paths
        .keys()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(got, want);
    for (key, entry) in paths {
        let (_, hash) = built().v3_document(key).expect("document");
        assert_eq!(
            entry["serverRelativeURL"],
            json!(format!("/openapi/v3/{key}?hash={hash}"))
        );
        assert_eq!(hash.len(), 64);
    }
    assert!(
        built().v3_document("/api/v1").is_some(),
        "a leading slash is accepted"
    );
    assert!(built().v3_document("apis/nope/v1").is_none());
    assert_eq!(built().v3_group_versions().count(), want.len());
}

#[test]
fn every_kind_has_a_patch_operation_with_gvk_and_field_validation() {
    for s in ferry_api::kinds::all() {
        let info = s.info();
        let doc = v3_doc(&gv_key(info));
        assert_eq!(doc["openapi"], "3.0.0");
        let gvk = json!({"group": info.group, "kind": info.kind, "version": info.version});
        let ns = if info.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let prefix = if info.group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{}/{}", info.group, info.version)
        };
        let path = format!("{prefix}/{ns}{}/{{name}}", info.plural);
        let patch = doc["paths"][&path]["patch"].clone();
        assert_eq!(patch["x-kubernetes-group-version-kind"], gvk, "{path}");
        assert_eq!(patch["x-kubernetes-action"], "patch");
        let params = patch["parameters"].as_array().expect("parameters");
        assert!(
            params
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"),
            "{path}: fieldValidation"
        );
        let body = patch["requestBody"]["content"]
            .as_object()
            .expect("patch body");
        for t in [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            assert!(body.contains_key(t), "{path}: {t}");
        }
        // Create and replace carry the parameter as well.
        let collection = format!("{prefix}/{ns}{}", info.plural);
        for (p, method) in [(&collection, "post"), (&path, "put")] {
            let op = &doc["paths"][p][method];
            assert_eq!(op["x-kubernetes-group-version-kind"], gvk, "{p} {method}");
            assert!(
                op["parameters"]
                    .as_array()
                    .expect("params")
                    .iter()
                    .any(|q| q["name"] == "fieldValidation")
            );
        }
        for (sub, present) in [
            ("status", info.status_subresource),
            ("scale", info.scale_subresource),
        ] {
            assert_eq!(
                doc["paths"].get(format!("{path}/{sub}")).is_some(),
                present,
                "{path}/{sub}"
            );
        }
        // The kind's schema and its list carry their GVK.
        let (object, list) = kind_schemas(&doc, info);
        assert_eq!(object["x-kubernetes-group-version-kind"], json!([gvk]));
        assert_eq!(
            list["x-kubernetes-group-version-kind"],
            json!([{"group": info.group, "kind": info.list_kind(), "version": info.version}])
        );
    }
}

/// The kind's schema and its list schema, found through the GET operations.
fn kind_schemas<'a>(doc: &'a Value, info: &KindInfo) -> (&'a Value, &'a Value) {
    let mut object = None;
    let mut list = None;
    for item in doc["paths"].as_object().expect("paths").values() {
        let Some(get) = item.get("get") else { continue };
        if get["x-kubernetes-group-version-kind"]["kind"] != info.kind {
            continue;
        }
        let name = get
            .pointer("/responses/200/content/application~1json/schema/$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix(schemas::V3_REF))
            .expect("200 schema");
        match get["x-kubernetes-action"].as_str() {
            Some("get") if !name.ends_with("Scale") => object = Some(schema(doc, name)),
            Some("list") => list = Some(schema(doc, name)),
            _ => {}
        }
    }
    (object.expect("object schema"), list.expect("list schema"))
}

#[test]
fn every_ref_resolves() {
    for key in built().v3_group_versions() {
        let doc = v3_doc(key);
        let mut refs = BTreeSet::new();
        schemas::collect_refs(&doc, "", &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let name = r
                .strip_prefix(schemas::V3_REF)
                .unwrap_or_else(|| panic!("{key}: foreign ref {r}"));
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{key}: {r} does not resolve"
            );
        }
    }
    let v2 = parse(built().v2_json());
    let mut refs = BTreeSet::new();
    schemas::collect_refs(&v2, "", &mut refs);
    for r in refs {
        let name = r
            .strip_prefix(schemas::V2_REF)
            .unwrap_or_else(|| panic!("v2: foreign ref {r}"));
        assert!(
            v2["definitions"].get(name).is_some(),
            "v2: {r} does not resolve"
        );
    }
}

#[test]
fn explain_paths_exist() {
    // (document, kind schema, field path, definition reached)
    let cases = [
        (
            "api/v1",
            "io.k8s.api.core.v1.Service",
            &["spec", "ports"][..],
            "io.k8s.api.core.v1.ServicePort",
        ),
        (
            "api/v1",
            "io.k8s.api.core.v1.Service",
            &["metadata"][..],
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        ),
        (
            "api/v1",
            "io.k8s.api.core.v1.Pod",
            &["spec", "containers", "ports"][..],
            "io.k8s.api.core.v1.ContainerPort",
        ),
        (
            "apis/apps/v1",
            "io.k8s.api.apps.v1.Deployment",
            &["spec", "template", "spec", "containers", "ports"][..],
            "io.k8s.api.core.v1.ContainerPort",
        ),
        (
            "apis/discovery.k8s.io/v1",
            "io.k8s.api.discovery.v1.EndpointSlice",
            &["endpoints", "conditions"][..],
            "io.k8s.api.discovery.v1.EndpointConditions",
        ),
    ];
    for (key, root, fields, want) in cases {
        let doc = v3_doc(key);
        let mut current = root.to_string();
        for field in fields {
            let prop = &schema(&doc, &current)["properties"][field];
            let target = if prop["type"] == "array" {
                &prop["items"]
            } else {
                prop
            };
            current = ref_of(target)
                .and_then(|r| r.strip_prefix(schemas::V3_REF))
                .unwrap_or_else(|| panic!("{root}: {field} has no ref: {prop}"))
                .to_string();
        }
        assert_eq!(current, want, "{root}.{}", fields.join("."));
        let port = schema(&doc, want);
        assert!(port["properties"].is_object(), "{want} has properties");
    }
    let doc = v3_doc("api/v1");
    assert_eq!(
        schema(&doc, "io.k8s.apimachinery.pkg.util.intstr.IntOrString")["format"],
        "int-or-string",
        "int-or-string as upstream"
    );
    assert_eq!(
        schema(&doc, schemas::STATUS)["x-kubernetes-group-version-kind"],
        json!([{"group": "", "kind": "Status", "version": "v1"}])
    );
    // Refs with a description are wrapped in allOf in v3, as upstream does.
    let meta = &schema(&doc, "io.k8s.api.core.v1.Service")["properties"]["metadata"];
    assert!(
        meta.get("$ref").is_none()
            && meta["allOf"][0]["$ref"].is_string()
            && meta["description"].is_string()
    );
    let apps = v3_doc("apis/apps/v1");
    assert_eq!(
        schema(&apps, schemas::SCALE)["x-kubernetes-group-version-kind"][0]["group"],
        "autoscaling"
    );
}

#[test]
fn v2_protobuf_decodes_and_carries_the_patch_contract() {
    let doc = Document::decode(built().v2_protobuf()).expect("decodes");
    assert_eq!(doc.swagger, "2.0");
    assert_eq!(
        doc.info.as_ref().map(|i| i.title.as_str()),
        Some("Kubernetes")
    );
    let paths = doc.paths.as_ref().expect("paths");
    let mut patched = BTreeSet::new();
    let mut patch_ops = 0;
    for item in &paths.path {
        let Some(value) = &item.value else { continue };
        let Some(op) = &value.patch else { continue };
        patch_ops += 1;
        let ext = op
            .vendor_extension
            .iter()
            .find(|e| e.name == "x-kubernetes-group-version-kind")
            .expect("gvk extension");
        let yaml = &ext.value.as_ref().expect("value").yaml;
        // JSON text is YAML; kubectl's YAML decoder reads it.
        let gvk: Value = serde_json::from_str(yaml).expect("gvk text");
        assert!(
            gvk["kind"].is_string() && gvk["version"].is_string() && gvk["group"].is_string(),
            "{yaml}"
        );
        let has_field_validation = op.parameters.iter().any(|p| match &p.oneof {
            Some(ParametersItemKind::Parameter(param)) => match &param.oneof {
                Some(ParameterKind::NonBodyParameter(nb)) => matches!(
                    &nb.oneof,
                    Some(NonBodyParameterKind::QueryParameterSubSchema(q)) if q.name == "fieldValidation" && q.r#in == "query"
                ),
                _ => false,
            },
            _ => false,
        });
        assert!(has_field_validation, "{}: fieldValidation", item.name);
        patched.insert((
            gvk["group"].as_str().unwrap_or("").to_string(),
            gvk["kind"].as_str().unwrap_or("").to_string(),
        ));
    }
    assert!(patch_ops > 0);
    for s in ferry_api::kinds::all() {
        let i = s.info();
        assert!(
            patched.contains(&(i.group.to_string(), i.kind.to_string())),
            "{} {}",
            i.group,
            i.kind
        );
    }
    // Definitions: kinds carry a GVK list, refs point into #/definitions.
    let defs = doc.definitions.as_ref().expect("definitions");
    let service = defs
        .additional_properties
        .iter()
        .find(|d| d.name == "io.k8s.api.core.v1.Service")
        .and_then(|d| d.value.as_ref())
        .expect("Service definition");
    let ext = service
        .vendor_extension
        .iter()
        .find(|e| e.name == "x-kubernetes-group-version-kind")
        .expect("gvk");
    let gvks: Value = serde_json::from_str(&ext.value.as_ref().expect("value").yaml).expect("json");
    assert_eq!(
        gvks,
        json!([{"group": "", "kind": "Service", "version": "v1"}])
    );
    assert!(
        service.required.is_empty(),
        "metadata is not required upstream"
    );
    // The protobuf is the JSON document, converted.
    assert_eq!(doc, gnostic::document(&parse(built().v2_json())));
}

#[test]
fn v2_definitions_match_upstream_where_validation_looks() {
    let v2 = parse(built().v2_json());
    let defs = &v2["definitions"];
    assert_eq!(
        defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["type"],
        "string"
    );
    assert_eq!(
        defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"],
        "int-or-string"
    );
    assert_eq!(
        defs["io.k8s.apimachinery.pkg.api.resource.Quantity"]["type"],
        "string"
    );
    assert!(
        defs["io.k8s.api.apps.v1.Deployment"]
            .get("required")
            .is_none()
    );
    assert_eq!(
        defs["io.k8s.api.core.v1.Event"]["required"],
        json!(["involvedObject", "metadata"])
    );
    assert_eq!(
        defs["io.k8s.api.discovery.v1.EndpointSlice"]["required"],
        json!(["addressType"])
    );
    assert_eq!(
        defs["io.k8s.api.core.v1.PodSpec"]["required"],
        json!(["containers"])
    );
    // No `allOf` schema construct (a property of that name, as in the CRD kind's
    // JSONSchemaProps, is fine).
    fn has_all_of(v: &Value, in_properties: bool) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, x)| {
                (k == "allOf" && !in_properties)
                    || has_all_of(x, k == "properties" && !in_properties)
            }),
            Value::Array(a) => a.iter().any(|x| has_all_of(x, false)),
            _ => false,
        }
    }
    assert!(!has_all_of(&v2, false), "v2 has no allOf");
    assert!(has_all_of(&json!({"a": {"allOf": []}}), false));
    assert!(!has_all_of(
        &json!({"properties": {"allOf": {"type": "array"}}}),
        false
    ));
    assert_eq!(v2["swagger"], "2.0");
}

#[test]
fn hashes_are_stable_and_distinct() {
    let again = OpenApi::build();
    let first = built();
    assert_eq!(first.v3_index(), again.v3_index());
    assert_eq!(first.v2_etag(), again.v2_etag());
    assert_eq!(first.v2_protobuf(), again.v2_protobuf());
    let mut hashes = BTreeSet::new();
    for key in first.v3_group_versions() {
        let (a, ha) = first.v3_document(key).expect("doc");
        let (b, hb) = again.v3_document(key).expect("doc");
        assert_eq!((a, ha), (b, hb), "{key}");
        assert_eq!(ha, hex_sha256(a));
        assert!(
            hashes.insert(ha.to_string()),
            "{key}: hash shared with another document"
        );
    }
    assert!(first.v2_etag().starts_with('"') && first.v2_etag().ends_with('"'));
}

#[test]
fn build_time_and_sizes() {
    let start = Instant::now();
    let api = OpenApi::build();
    let elapsed = start.elapsed();
    eprintln!("build(): {elapsed:?}");
    for key in api.v3_group_versions() {
        let (doc, _) = api.v3_document(key).expect("doc");
        eprintln!("v3 {key}: {} bytes", doc.len());
    }
    let start_v2 = Instant::now();
    let protobuf = api.v2_protobuf().len();
    let v2_elapsed = start_v2.elapsed();
    eprintln!(
        "v2 (built on first use): {v2_elapsed:?}; json: {} bytes, protobuf: {protobuf} bytes",
        api.v2_json().len()
    );
    // Optimised builds must stay well inside the start-up budget; debug builds get slack.
    let budget = if cfg!(debug_assertions) { 5_000 } else { 200 };
    assert!(elapsed.as_millis() < budget, "build() took {elapsed:?}");
    assert!(v2_elapsed.as_millis() < budget, "v2 took {v2_elapsed:?}");
}

#[test]
fn patch_extensions_come_from_the_patch_table() {
    // (document, definition, field, merge key, strategy, list type)
    let cases = [
        (
            "api/v1",
            "io.k8s.api.core.v1.ServiceSpec",
            "ports",
            Some("port"),
            Some("merge"),
            Some("map"),
        ),
        (
            "api/v1",
            "io.k8s.api.core.v1.PodSpec",
            "containers",
            Some("name"),
            Some("merge"),
            Some("map"),
        ),
        (
            "api/v1",
            "io.k8s.api.core.v1.Container",
            "ports",
            Some("containerPort"),
            Some("merge"),
            Some("map"),
        ),
        (
            "api/v1",
            "io.k8s.api.core.v1.Container",
            "args",
            None,
            None,
            Some("atomic"),
        ),
        (
            "apis/apps/v1",
            "io.k8s.api.apps.v1.DeploymentSpec",
            "strategy",
            None,
            Some("retainKeys"),
            None,
        ),
    ];
    let v2 = parse(built().v2_json());
    for (key, def, field, merge_key, strategy, list_type) in cases {
        let doc = v3_doc(key);
        for prop in [
            &schema(&doc, def)["properties"][field],
            &v2["definitions"][def]["properties"][field],
        ] {
            assert_eq!(
                prop["x-kubernetes-patch-merge-key"].as_str(),
                merge_key,
                "{def}.{field}"
            );
            assert_eq!(
                prop["x-kubernetes-patch-strategy"].as_str(),
                strategy,
                "{def}.{field}"
            );
            assert_eq!(
                prop["x-kubernetes-list-type"].as_str(),
                list_type,
                "{def}.{field}"
            );
        }
    }
    let doc = v3_doc("api/v1");
    assert_eq!(
        schema(&doc, "io.k8s.api.core.v1.ServiceSpec")["properties"]["ports"]["x-kubernetes-list-map-keys"],
        json!(["port", "protocol"])
    );
}
