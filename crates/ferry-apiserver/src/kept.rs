//! The field-selector values a cached object keeps, so that lists and watches with a field
//! selector (a node agent's `spec.nodeName=<node>` over 150,000 Pods) are answered without
//! decoding every object. Pure.
//!
//! Each kind with selectable fields beyond `metadata.name` / `metadata.namespace` has a
//! [`FieldSet`]: upstream's field set for it (registry `GetAttrs`/`ToSelectableFields`, as
//! `ferry_selectors` answers them on typed objects). The values are read once, when the object
//! enters the watch cache, from its stored JSON with the same structural scan as
//! [`compact::stamp`](crate::compact::stamp), and kept in two packed strings (values joined by
//! NUL): the values objects share (a Pod's node, phase, restart policy, scheduler, service
//! account...), interned, so that 150,000 Pods on 5,000 nodes hold a few thousand copies; and
//! the values of each object's own (a Pod's IP), appended to the object's name.
//!
//! The values equal what the typed path (`Strategy::field` on the decoded object) answers for
//! every object that decodes as its kind, which every stored object does (writes are decoded
//! and validated). Where the scan meets a value of another JSON type than the kind's (which the
//! typed decode would reject), or a value holding NUL, nothing is kept and the filter decodes
//! the object as before.

use std::borrow::Cow;

use crate::compact::{Members, members, value_end, ws};

/// The selectable fields of one kind and how to read them from stored JSON.
pub struct FieldSet {
    pub group: &'static str,
    pub kind: &'static str,
    /// The kind's store prefix (`/registry/pods/`).
    pub prefix: &'static str,
    /// The fields, in the order their values are kept.
    pub fields: &'static [&'static str],
    /// The fields whose values are the object's own (an IP, a uid): kept apart from the
    /// shared ones, which are interned.
    own: &'static [&'static str],
    /// Other names of a field (`spec.host` is the old name of `spec.nodeName`).
    aliases: &'static [(&'static str, &'static str)],
    extract: fn(&Obj<'_>) -> Option<Vec<Cow<'static, str>>>,
}

impl FieldSet {
    /// The position of `field`'s value; `None` when the kind does not select on it.
    pub fn index(&self, field: &str) -> Option<usize> {
        let field = self
            .aliases
            .iter()
            .find(|(a, _)| *a == field)
            .map_or(field, |(_, f)| f);
        self.fields.iter().position(|f| *f == field)
    }

    /// The values of the stored JSON object `raw`, packed; `None` when they cannot be kept
    /// (see the module docs).
    pub fn extract(&self, raw: &[u8]) -> Option<Kept> {
        let top = Obj::parse(raw, ws(raw, 0))?;
        let values = (self.extract)(&top)?;
        if values.len() != self.fields.len() || values.iter().any(|v| v.contains('\0')) {
            return None;
        }
        let (mut shared, mut own) = (Vec::new(), Vec::new());
        for (f, v) in self.fields.iter().zip(values) {
            if self.own.contains(f) {
                own.push(v);
            } else {
                shared.push(v);
            }
        }
        Some(Kept {
            shared: shared.join("\0"),
            own: own.join("\0"),
        })
    }

    /// The value of the field at `index` from packed values.
    pub fn value<'a>(&self, shared: &'a str, own: &'a str, index: usize) -> Option<&'a str> {
        let field = self.fields.get(index)?;
        let is_own = |f: &str| self.own.contains(&f);
        let before = || self.fields[..index].iter().copied();
        let (packed, pos) = if is_own(field) {
            (own, before().filter(|f| is_own(f)).count())
        } else {
            (shared, before().filter(|f| !is_own(f)).count())
        };
        packed.split('\0').nth(pos)
    }
}

/// The values an object keeps: the shared ones and its own, each joined by NUL in the order of
/// [`FieldSet::fields`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub shared: String,
    pub own: String,
}

/// The field set of the kind stored under `key`'s prefix.
pub fn for_key(key: &str) -> Option<&'static FieldSet> {
    SETS.iter().find(|s| key.starts_with(s.prefix))
}

/// The field set of a kind.
pub fn for_kind(group: &str, kind: &str) -> Option<&'static FieldSet> {
    SETS.iter().find(|s| s.group == group && s.kind == kind)
}

pub static SETS: &[FieldSet] = &[
    FieldSet {
        group: "",
        kind: "Pod",
        prefix: "/registry/pods/",
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        own: &["status.podIP"],
        aliases: &[("spec.host", "spec.nodeName")],
        extract: pod,
    },
    FieldSet {
        group: "",
        kind: "Node",
        prefix: "/registry/nodes/",
        fields: &["spec.unschedulable"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![boolean(o.child("spec")?.get("unschedulable"))?]),
    },
    FieldSet {
        group: "",
        kind: "Namespace",
        prefix: "/registry/namespaces/",
        fields: &["status.phase"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![text(o.child("status")?.get("phase"))?]),
    },
    FieldSet {
        group: "",
        kind: "Secret",
        prefix: "/registry/secrets/",
        fields: &["type"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![text(o.get("type"))?]),
    },
    FieldSet {
        group: "",
        kind: "Service",
        prefix: "/registry/services/",
        fields: &["spec.clusterIP", "spec.type"],
        own: &["spec.clusterIP"],
        aliases: &[],
        extract: |o| {
            let spec = o.child("spec")?;
            Some(vec![text(spec.get("clusterIP"))?, text(spec.get("type"))?])
        },
    },
    FieldSet {
        group: "",
        kind: "Event",
        prefix: "/registry/events/",
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        own: &[
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.resourceVersion",
        ],
        aliases: &[],
        extract: event,
    },
    FieldSet {
        group: "apps",
        kind: "ReplicaSet",
        prefix: "/registry/apps/replicasets/",
        fields: &["status.replicas"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![int(o.child("status")?.get("replicas"))?]),
    },
    FieldSet {
        group: "",
        kind: "ReplicationController",
        prefix: "/registry/replicationcontrollers/",
        fields: &["status.replicas"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![int(o.child("status")?.get("replicas"))?]),
    },
    FieldSet {
        group: "",
        kind: "PersistentVolume",
        prefix: "/registry/persistentvolumes/",
        fields: &["status.phase"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![text(o.child("status")?.get("phase"))?]),
    },
    FieldSet {
        group: "",
        kind: "PersistentVolumeClaim",
        prefix: "/registry/persistentvolumeclaims/",
        fields: &["status.phase"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![text(o.child("status")?.get("phase"))?]),
    },
    FieldSet {
        group: "batch",
        kind: "Job",
        prefix: "/registry/batch/jobs/",
        fields: &["status.successful"],
        own: &[],
        aliases: &[],
        extract: |o| Some(vec![int(o.child("status")?.get("succeeded"))?]),
    },
];

fn pod(o: &Obj<'_>) -> Option<Vec<Cow<'static, str>>> {
    let spec = o.child("spec")?;
    let status = o.child("status")?;
    // The first of `status.podIPs` when there is one, else `status.podIP`.
    let ip = match status.get("podIPs").filter(|v| !is_null(v)) {
        None => None,
        Some(list) => match first_element(list)? {
            None => None,
            Some(first) => Some(text(Obj::parse(first, 0)?.get("ip"))?),
        },
    };
    let ip = match ip {
        Some(ip) => ip,
        None => text(status.get("podIP"))?,
    };
    Some(vec![
        text(spec.get("nodeName"))?,
        text(spec.get("restartPolicy"))?,
        text(spec.get("schedulerName"))?,
        text(spec.get("serviceAccountName"))?,
        boolean(spec.get("hostNetwork"))?,
        text(status.get("phase"))?,
        ip,
        text(status.get("nominatedNodeName"))?,
    ])
}

fn event(o: &Obj<'_>) -> Option<Vec<Cow<'static, str>>> {
    let io = o.child("involvedObject")?;
    let reporting = text(o.get("reportingComponent"))?;
    let component = text(o.child("source")?.get("component"))?;
    let source = if component.is_empty() {
        reporting.clone()
    } else {
        component
    };
    Some(vec![
        text(io.get("kind"))?,
        text(io.get("namespace"))?,
        text(io.get("name"))?,
        text(io.get("uid"))?,
        text(io.get("apiVersion"))?,
        text(io.get("resourceVersion"))?,
        text(io.get("fieldPath"))?,
        text(o.get("reason"))?,
        reporting,
        source,
        text(o.get("type"))?,
    ])
}

/// A JSON object's members (an absent or null object has none).
pub struct Obj<'a> {
    raw: &'a [u8],
    members: Members<'a>,
}

impl<'a> Obj<'a> {
    fn parse(raw: &'a [u8], at: usize) -> Option<Obj<'a>> {
        members(raw, at).map(|(members, _)| Obj { raw, members })
    }

    /// The raw value of `key` (the last of a repeated key, as decoders keep).
    fn get(&self, key: &str) -> Option<&'a [u8]> {
        self.members
            .iter()
            .rev()
            .find(|(k, _, _)| k == key)
            .map(|&(_, s, e)| &self.raw[s..e])
    }

    /// The object at `key`: empty when absent or null, `None` when not an object.
    fn child(&self, key: &str) -> Option<Obj<'a>> {
        match self.get(key) {
            None => Some(Obj::empty()),
            Some(v) if is_null(v) => Some(Obj::empty()),
            Some(v) => Obj::parse(v, 0),
        }
    }

    fn empty() -> Obj<'a> {
        Obj {
            raw: &[],
            members: Vec::new(),
        }
    }
}

fn is_null(v: &[u8]) -> bool {
    v == b"null"
}

/// The first element of a JSON array: `Some(None)` when it is empty, `None` when not an array.
fn first_element(v: &[u8]) -> Option<Option<&[u8]>> {
    if v.first() != Some(&b'[') {
        return None;
    }
    let i = ws(v, 1);
    if v.get(i) == Some(&b']') {
        return Some(None);
    }
    let e = value_end(v, i)?;
    Some(Some(&v[i..e]))
}

/// A leaf as the typed decode reads an optional field (absent and null are the default), in
/// the selector's text form; `None` when it is of another type.
fn leaf<T: serde::de::DeserializeOwned + Default + ToString>(
    v: Option<&[u8]>,
) -> Option<Cow<'static, str>> {
    let t = match v {
        None => T::default(),
        Some(v) => serde_json::from_slice::<Option<T>>(v)
            .ok()?
            .unwrap_or_default(),
    };
    Some(Cow::Owned(t.to_string()))
}

fn text(v: Option<&[u8]>) -> Option<Cow<'static, str>> {
    leaf::<String>(v)
}

fn boolean(v: Option<&[u8]>) -> Option<Cow<'static, str>> {
    leaf::<bool>(v)
}

fn int(v: Option<&[u8]>) -> Option<Cow<'static, str>> {
    leaf::<i32>(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::kinds::Strategy as KindStrategy;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn strategy(group: &str, kind: &str) -> &'static dyn KindStrategy {
        ferry_api::kinds::all()
            .iter()
            .map(|s| s.as_ref())
            .find(|s| s.info().group == group && s.info().kind == kind)
            .unwrap_or_else(|| panic!("no strategy for {group}/{kind}"))
    }

    /// What the filter reads for `field`: the kept value, or (nothing kept) the decoded one.
    fn kept_or_decoded(set: &FieldSet, v: &Value, field: &str) -> Option<String> {
        let raw = serde_json::to_vec(v).expect("json");
        let s = strategy(set.group, set.kind);
        match (set.extract(&raw), set.index(field)) {
            (Some(k), Some(i)) => set.value(&k.shared, &k.own, i).map(str::to_string),
            _ => s.field(v, field),
        }
    }

    /// Every field of every set, plus names no kind selects on.
    fn candidates() -> Vec<&'static str> {
        let mut c: Vec<&str> = SETS.iter().flat_map(|s| s.fields.iter().copied()).collect();
        c.extend([
            "spec.host",
            "spec.nodeNames",
            "status.podIPs",
            "regarding.name",
            "spec",
            "",
        ]);
        c
    }

    #[test]
    fn sets_are_the_kinds_field_sets_and_store_prefixes() {
        for set in SETS {
            let s = strategy(set.group, set.kind);
            let sample = |_: &FieldSet| json!({"apiVersion": s.info().api_version(), "kind": set.kind, "metadata": {"name": "a"}});
            assert_eq!(
                crate::api::store_prefix(s.info()),
                set.prefix,
                "{}",
                set.kind
            );
            for f in candidates() {
                assert_eq!(
                    s.field(&sample(set), f).is_some(),
                    set.index(f).is_some(),
                    "{}: {f}",
                    set.kind
                );
            }
        }
        // Kinds without a set select on no field of the candidates.
        for s in ferry_api::kinds::all() {
            let info = s.info();
            // Kinds stored as another (events.k8s.io Events) are filtered by decoding.
            if for_kind(info.group, info.kind).is_some() || s.store_as().is_some() {
                continue;
            }
            let sample = json!({"apiVersion": info.api_version(), "kind": info.kind, "metadata": {"name": "a"}});
            for f in candidates() {
                assert!(s.field(&sample, f).is_none(), "{}: {f}", info.kind);
            }
        }
    }

    #[test]
    fn table() {
        let pod = for_kind("", "Pod").expect("pod set");
        for (obj, field, want) in [
            (
                json!({"spec": {"nodeName": "n1"}}),
                "spec.nodeName",
                Some("n1"),
            ),
            (json!({"spec": {"nodeName": "n1"}}), "spec.host", Some("n1")),
            (
                json!({"spec": {"nodeName": null}}),
                "spec.nodeName",
                Some(""),
            ),
            (json!({}), "spec.hostNetwork", Some("false")),
            (
                json!({"spec": {"hostNetwork": true}}),
                "spec.hostNetwork",
                Some("true"),
            ),
            (
                json!({"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "fd00::1"}]}}),
                "status.podIP",
                Some("fd00::1"),
            ),
            (
                json!({"status": {"podIP": "10.0.0.1", "podIPs": []}}),
                "status.podIP",
                Some("10.0.0.1"),
            ),
            (
                json!({"status": {"podIPs": [{}]}}),
                "status.podIP",
                Some(""),
            ),
            (
                json!({"spec": {"nodeName": "a\"\u{e9}\\"}}),
                "spec.nodeName",
                Some("a\"\u{e9}\\"),
            ),
            (json!({}), "spec.nodeNames", None),
        ] {
            let mut obj = obj;
            obj["apiVersion"] = json!("v1");
            obj["kind"] = json!("Pod");
            obj["metadata"] = json!({"name": "p", "namespace": "ns"});
            assert_eq!(
                kept_or_decoded(pod, &obj, field).as_deref(),
                want,
                "{obj} {field}"
            );
            assert_eq!(
                strategy("", "Pod").field(&obj, field).as_deref(),
                want,
                "{obj} {field}"
            );
        }
        // A repeated key: the last one, as a decoder keeps.
        let raw = br#"{"metadata":{"name":"p"},"spec":{"nodeName":"a","nodeName":"b"}}"#;
        let k = pod.extract(raw).expect("kept");
        assert_eq!(pod.value(&k.shared, &k.own, 0), Some("b"));
        // Shared values apart from the object's own.
        let raw = br#"{"spec":{"nodeName":"n","hostNetwork":true},"status":{"podIP":"10.0.0.9"}}"#;
        let k = pod.extract(raw).expect("kept");
        assert_eq!(k.shared, "n\0\0\0\0true\0\0");
        assert_eq!(k.own, "10.0.0.9");
        assert_eq!(pod.value(&k.shared, &k.own, 6), Some("10.0.0.9"));
        assert_eq!(pod.value(&k.shared, &k.own, 7), Some(""));
        assert_eq!(pod.value(&k.shared, &k.own, 8), None);
        // Another type than the kind's: nothing kept (the filter decodes).
        assert!(pod.extract(br#"{"spec":{"nodeName":1}}"#).is_none());
        assert!(pod.extract(br#"{"spec":[]}"#).is_none());
        // NUL in a value: nothing kept.
        assert!(
            pod.extract(br#"{"spec":{"nodeName":"a\u0000b"}}"#)
                .is_none()
        );
    }

    fn opt_str() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            "[a-z0-9\"\\\\é.:-]{0,6}".prop_map(|s| Some(Value::String(s))),
        ]
    }

    fn opt_of(v: BoxedStrategy<Value>) -> impl Strategy<Value = Option<Value>> {
        prop_oneof![Just(None), Just(Some(Value::Null)), v.prop_map(Some)]
    }

    /// An object with `keys` each absent, null or generated by `leaf`.
    fn object(
        keys: &'static [&'static str],
        leaf: impl Fn(&str) -> BoxedStrategy<Option<Value>>,
    ) -> impl Strategy<Value = Value> {
        let parts: Vec<_> = keys.iter().map(|k| leaf(k)).collect();
        parts.prop_map(move |vals| {
            let mut m = serde_json::Map::new();
            for (k, v) in keys.iter().zip(vals) {
                if let Some(v) = v {
                    m.insert(k.to_string(), v);
                }
            }
            Value::Object(m)
        })
    }

    fn pod_value() -> impl Strategy<Value = Value> {
        let spec = object(
            &[
                "nodeName",
                "restartPolicy",
                "schedulerName",
                "serviceAccountName",
                "hostNetwork",
            ],
            |k| match k {
                "hostNetwork" => opt_of(any::<bool>().prop_map(Value::Bool).boxed()).boxed(),
                _ => opt_str().boxed(),
            },
        );
        let pod_ips = prop::collection::vec(
            opt_str().prop_map(|ip| match ip {
                Some(ip) => json!({"ip": ip}),
                None => json!({}),
            }),
            0..3,
        )
        .prop_map(Value::Array)
        .boxed();
        let status = object(
            &["phase", "podIP", "podIPs", "nominatedNodeName"],
            move |k| match k {
                "podIPs" => opt_of(pod_ips.clone()).boxed(),
                _ => opt_str().boxed(),
            },
        );
        (opt_of(spec.boxed()), opt_of(status.boxed())).prop_map(|(spec, status)| {
            let mut v = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
            if let Some(s) = spec {
                v["spec"] = s;
            }
            if let Some(s) = status {
                v["status"] = s;
            }
            v
        })
    }

    fn event_value() -> impl Strategy<Value = Value> {
        let io = object(
            &[
                "kind",
                "namespace",
                "name",
                "uid",
                "apiVersion",
                "resourceVersion",
                "fieldPath",
            ],
            |_| opt_str().boxed(),
        );
        let source = object(&["component", "host"], |_| opt_str().boxed());
        (
            opt_of(io.boxed()),
            opt_of(source.boxed()),
            opt_str(),
            opt_str(),
            opt_str(),
        )
            .prop_map(|(io, source, reason, reporting, type_)| {
                let mut v = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}});
                for (k, x) in [
                    ("involvedObject", io),
                    ("source", source),
                    ("reason", reason),
                    ("reportingComponent", reporting),
                    ("type", type_),
                ] {
                    if let Some(x) = x {
                        v[k] = x;
                    }
                }
                v
            })
    }

    fn other_value() -> impl Strategy<Value = (&'static str, &'static str, Value)> {
        prop_oneof![
            opt_of(any::<bool>().prop_map(Value::Bool).boxed()).prop_map(|u| (
                "",
                "Node",
                json!({"spec": u.map_or(json!({}), |u| json!({"unschedulable": u}))})
            )),
            opt_str().prop_map(|p| ("", "Namespace", json!({"status": {"phase": p}}))),
            opt_str().prop_map(|t| ("", "Secret", json!({"type": t}))),
            (opt_str(), opt_str()).prop_map(|(c, t)| (
                "",
                "Service",
                json!({"spec": {"clusterIP": c, "type": t}})
            )),
            opt_of((0i32..5).prop_map(|n| json!(n)).boxed()).prop_map(|r| (
                "apps",
                "ReplicaSet",
                json!({"status": {"replicas": r}})
            )),
            opt_str().prop_map(|p| ("", "PersistentVolume", json!({"status": {"phase": p}}))),
            opt_str().prop_map(|p| ("", "PersistentVolumeClaim", json!({"status": {"phase": p}}))),
            opt_of((0i32..5).prop_map(|n| json!(n)).boxed()).prop_map(|r| (
                "",
                "ReplicationController",
                json!({"status": {"replicas": r}})
            )),
            opt_of((0i32..5).prop_map(|n| json!(n)).boxed()).prop_map(|r| (
                "batch",
                "Job",
                json!({"status": {"succeeded": r}})
            )),
        ]
    }

    fn check(set: &FieldSet, v: &Value) {
        let s = strategy(set.group, set.kind);
        let raw = serde_json::to_vec(v).expect("json");
        assert!(set.extract(&raw).is_some(), "nothing kept for {v}");
        for f in candidates() {
            assert_eq!(kept_or_decoded(set, v, f), s.field(v, f), "{v} {f}");
        }
    }

    proptest! {
        #[test]
        fn pods_kept_equal_decoded(v in pod_value()) {
            check(for_kind("", "Pod").expect("set"), &v);
        }

        #[test]
        fn events_kept_equal_decoded(v in event_value()) {
            check(for_kind("", "Event").expect("set"), &v);
        }

        #[test]
        fn others_kept_equal_decoded((group, kind, mut v) in other_value()) {
            v["metadata"] = json!({"name": "x"});
            v["apiVersion"] = json!(strategy(group, kind).info().api_version());
            v["kind"] = json!(kind);
            check(for_kind(group, kind).expect("set"), &v);
        }
    }
}
