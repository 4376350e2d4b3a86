use super::*;
use serde_json::json;

#[test]
fn smoke() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [{"rule": "self.a < self.b", "message": "a must be less than b"}],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}});
    let v = Validator::new(&schema);
    assert!(v.validate(&json!({"spec": {"a": 1, "b": 2}}), None).is_empty());
    let errs = v.validate(&json!({"spec": {"a": 3, "b": 2}}), None);
    assert_eq!(errs.len(), 1, "{errs:?}");
}
