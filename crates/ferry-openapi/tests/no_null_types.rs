//! Kubernetes schemas never allow `null`: kubectl 1.20 refuses a whole v2 document that has a
//! definition with `type: [T, "null"]` ("definitions with multiple types aren't supported").

use serde_json::Value;

/// `v` is a schema, or (when `map` is set) a map of names to schemas (`properties`, definitions).
fn check_in(v: &Value, path: &str, map: bool, bad: &mut Vec<String>) {
    match v {
        Value::Object(m) if map => {
            for (k, c) in m {
                check_in(c, &format!("{path}/{k}"), false, bad);
            }
        }
        Value::Object(m) => {
            if let Some(t) = m.get("type")
                && !t.is_string()
            {
                bad.push(format!("{path}: type {t}"));
            }
            for (k, c) in m {
                let is_map = matches!(
                    k.as_str(),
                    "properties" | "definitions" | "schemas" | "patternProperties"
                );
                check_in(c, &format!("{path}/{k}"), is_map, bad);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                check_in(c, &format!("{path}/{i}"), false, bad);
            }
        }
        _ => {}
    }
}

#[test]
fn every_schema_has_a_single_type() {
    let api = ferry_openapi::OpenApi::build();
    let v2: Value = serde_json::from_slice(api.v2_json()).expect("v2 json");
    let mut bad = Vec::new();
    check_in(&v2["definitions"], "v2", true, &mut bad);
    for gv in api
        .v3_group_versions()
        .map(String::from)
        .collect::<Vec<_>>()
    {
        let (doc, _) = api.v3_document(&gv).expect("doc");
        let v3: Value = serde_json::from_slice(doc).expect("v3 json");
        check_in(&v3["components"]["schemas"], &gv, true, &mut bad);
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
