//! One store for Events: `events.k8s.io/v1` Events are kept as `core/v1` Events (as upstream,
//! where both APIs share the `/registry/events/` keys) and converted on the way in and out.
//!
//! The field mapping follows upstream's `events/v1` conversion:
//! `regarding` ↔ `involvedObject`, `note` ↔ `message`, `deprecatedSource` ↔ `source`,
//! `deprecatedFirstTimestamp`/`deprecatedLastTimestamp`/`deprecatedCount` ↔
//! `firstTimestamp`/`lastTimestamp`/`count`, `reportingController` ↔ `reportingComponent`;
//! `action`, `reason`, `related`, `series`, `eventTime`, `type`, `reportingInstance` and the
//! metadata are the same in both.

use serde_json::{Map, Value};

use crate::decode::{DecodeError, Decoded};
use crate::errors::ErrorList;
use crate::kinds::{Column, KindInfo, Strategy};

/// (events.k8s.io/v1 name, core/v1 name) of the renamed fields.
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];
/// Fields with the same name in both versions.
const SAME: [&str; 8] = [
    "metadata",
    "action",
    "reason",
    "related",
    "series",
    "eventTime",
    "type",
    "reportingInstance",
];

fn rename(v: &Value, api_version: &str, from_events: bool) -> Value {
    let Value::Object(m) = v else {
        return v.clone();
    };
    let mut out = Map::new();
    out.insert("kind".into(), Value::String("Event".into()));
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    for k in SAME {
        if let Some(x) = m.get(k) {
            out.insert(k.into(), x.clone());
        }
    }
    for (ev, core) in RENAMED {
        let (src, dst) = if from_events { (ev, core) } else { (core, ev) };
        if let Some(x) = m.get(src).filter(|x| !x.is_null()) {
            out.insert(dst.into(), x.clone());
        }
    }
    Value::Object(out)
}

/// A stored `core/v1` Event as `events.k8s.io/v1` (`None` when it is not a core Event).
pub fn core_to_events(v: &Value) -> Option<Value> {
    (v.get("apiVersion").and_then(Value::as_str) == Some("v1"))
        .then(|| rename(v, "events.k8s.io/v1", false))
}

/// An `events.k8s.io/v1` Event as the `core/v1` Event that is stored.
pub fn events_to_core(v: &Value) -> Value {
    rename(v, "v1", true)
}

/// The `events.k8s.io/v1` strategy over the shared core store: everything as the wrapped
/// strategy, on objects converted from storage; writes converted back to `core/v1`.
pub struct StoredAsCore {
    pub inner: Box<dyn Strategy>,
}

impl Strategy for StoredAsCore {
    fn info(&self) -> &KindInfo {
        self.inner.info()
    }
    fn decode(&self, value: &Value) -> Result<Decoded<Value>, DecodeError> {
        self.inner.decode(value)
    }
    fn default(&self, value: &mut Value) {
        self.inner.default(value)
    }
    fn prepare_create(&self, value: &mut Value) {
        self.inner.prepare_create(value)
    }
    fn prepare_update(&self, new: &mut Value, old: &Value) {
        self.inner.prepare_update(new, old)
    }
    fn validate(&self, value: &Value, old: Option<&Value>) -> ErrorList {
        self.inner.validate(value, old)
    }
    fn validate_status(&self, value: &Value, old: &Value) -> ErrorList {
        self.inner.validate_status(value, old)
    }
    fn columns(&self) -> Vec<Column> {
        self.inner.columns()
    }
    fn row(&self, value: &Value) -> Vec<Value> {
        self.inner.row(value)
    }
    /// Field selectors are evaluated on stored objects: convert first.
    fn field(&self, value: &Value, field: &str) -> Option<String> {
        match core_to_events(value) {
            Some(v) => self.inner.field(&v, field),
            None => self.inner.field(value, field),
        }
    }
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        self.inner.schema(generator)
    }
    fn on_read(&self, value: &Value) -> Option<Value> {
        core_to_events(value)
    }
    fn to_storage(&self, value: &Value) -> Option<Value> {
        Some(events_to_core(value))
    }
    fn store_as(&self) -> Option<(&'static str, &'static str)> {
        Some(("", "events"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn events_v1() -> Value {
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "default", "uid": "u", "resourceVersion": "7"},
            "eventTime": "2026-11-24T05:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-11-24T05:01:00.000000Z"},
            "reportingController": "ferry.dev/test", "reportingInstance": "test-1",
            "action": "Probe", "reason": "Unhealthy", "note": "probe failed", "type": "Warning",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default", "apiVersion": "v1"},
            "related": {"kind": "Node", "name": "n"},
            "deprecatedSource": {"component": "kubelet", "host": "n"},
            "deprecatedFirstTimestamp": "2026-11-24T04:00:00Z",
            "deprecatedLastTimestamp": "2026-11-24T04:30:00Z",
            "deprecatedCount": 3})
    }

    #[test]
    fn events_v1_round_trips_through_core() {
        let core = events_to_core(&events_v1());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "probe failed");
        assert_eq!(core["source"]["component"], "kubelet");
        assert_eq!(core["count"], 3);
        assert_eq!(core["firstTimestamp"], "2026-11-24T04:00:00Z");
        assert_eq!(core["reportingComponent"], "ferry.dev/test");
        assert_eq!(core["series"]["count"], 2);
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        assert_eq!(core_to_events(&core).unwrap(), events_v1());
    }

    #[test]
    fn core_events_read_as_events_v1() {
        let core = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "x.1", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "x"}, "reason": "Started",
            "message": "Started container", "source": {"component": "kubelet"},
            "firstTimestamp": "2026-11-24T04:00:00Z", "lastTimestamp": "2026-11-24T04:00:00Z",
            "count": 1, "type": "Normal", "reportingComponent": ""});
        let ev = core_to_events(&core).unwrap();
        assert_eq!(ev["apiVersion"], "events.k8s.io/v1");
        assert_eq!(ev["regarding"]["name"], "x");
        assert_eq!(ev["note"], "Started container");
        assert_eq!(ev["deprecatedCount"], 1);
        assert_eq!(ev["reportingController"], "");
        // Already converted objects are left alone.
        assert!(core_to_events(&ev).is_none());
    }
}
