//! Label and field selectors of lists and watches, on values and on cached objects.

use std::sync::Arc;

use serde_json::Value;

use super::Resource;
use crate::cache::CachedObject;
use crate::objects;
use crate::request::Query;
use crate::status::ApiError;

/// Label and field selectors of a list or watch.
pub struct Filter {
    labels: Option<ferry_api::selectors::LabelSelector>,
    fields: Option<ferry_api::selectors::FieldSelector>,
}

impl Filter {
    pub fn parse(q: &Query) -> Result<Filter, ApiError> {
        let labels =
            match q.get("labelSelector").filter(|s| !s.trim().is_empty()) {
                Some(s) => Some(ferry_api::selectors::parse_label_selector(s).map_err(|e| {
                    ApiError::bad_request(format!("unable to parse requirement: {e}"))
                })?),
                None => None,
            };
        let fields = match q.get("fieldSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(
                ferry_api::selectors::parse_field_selector(s)
                    .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?,
            ),
            None => None,
        };
        Ok(Filter { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    /// Whether `v` matches; `Err` (a 400) when a field selector names a field the kind lacks.
    pub fn try_matches(&self, res: &Resource, v: &Value) -> Result<bool, ApiError> {
        if let Some(l) = &self.labels
            && !l.matches(&objects::labels(v))
        {
            return Ok(false);
        }
        if let Some(f) = &self.fields {
            return f
                .matches(|field| field_value(res, v, field))
                .map_err(ApiError::bad_request);
        }
        Ok(true)
    }

    pub fn matches(&self, res: &Resource, v: &Value) -> bool {
        self.try_matches(res, v).unwrap_or(false)
    }

    /// [`Filter::try_matches`] on a cached object: labels, `metadata.name` and
    /// `metadata.namespace` from its compact metadata, the kind's other selectable fields from
    /// the values it keeps ([`crate::kept`]); the object is decoded (once) only for fields
    /// nothing keeps (custom kinds, kinds served from another's store, objects whose values
    /// could not be kept).
    pub fn try_matches_cached(&self, res: &Resource, o: &CachedObject) -> Result<bool, ApiError> {
        if let Some(l) = &self.labels
            && !l.is_empty()
            && !l.matches(&o.labels())
        {
            return Ok(false);
        }
        if let Some(f) = &self.fields {
            let decoded: std::cell::OnceCell<Value> = std::cell::OnceCell::new();
            let set = res
                .as_stored
                .then(|| crate::kept::for_kind(res.info().group, res.info().kind))
                .flatten();
            return f
                .matches(|field| match field {
                    "metadata.name" => Some(o.name().to_string()),
                    "metadata.namespace" if res.info().namespaced => {
                        Some(o.namespace().to_string())
                    }
                    _ => match set.and_then(|s| o.kept_field(s, s.index(field)?)) {
                        Some(v) => Some(v.to_string()),
                        None => field_value(res, decoded.get_or_init(|| o.value()), field),
                    },
                })
                .map_err(ApiError::bad_request);
        }
        Ok(true)
    }

    pub fn matches_cached(&self, res: &Resource, o: &CachedObject) -> bool {
        self.try_matches_cached(res, o).unwrap_or(false)
    }

    /// Keeps the matching objects; a 400 for an unsupported field.
    pub fn apply(
        &self,
        res: &Resource,
        items: Vec<Arc<CachedObject>>,
    ) -> Result<Vec<Arc<CachedObject>>, ApiError> {
        if self.is_empty() {
            return Ok(items);
        }
        let mut out = Vec::with_capacity(items.len());
        for o in items {
            if self.try_matches_cached(res, &o)? {
                out.push(o);
            }
        }
        Ok(out)
    }
}

fn field_value(res: &Resource, v: &Value, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(objects::name(v).to_string()),
        "metadata.namespace" if res.info().namespaced => Some(objects::namespace(v).to_string()),
        _ => res.strategy.field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(group: &str, kind: &str) -> Resource {
        let strategy = ferry_api::kinds::all()
            .iter()
            .map(|s| s.as_ref())
            .find(|s| s.info().group == group && s.info().kind == kind)
            .expect("kind");
        Resource {
            strategy,
            prefix: super::super::kind_prefix(strategy),
            as_stored: strategy.store_as().is_none(),
        }
    }

    fn filter(fields: &str, labels: &str) -> Filter {
        let q = Query::parse(Some(&format!(
            "fieldSelector={fields}&labelSelector={labels}"
        )));
        Filter::parse(&q).expect("selector")
    }

    fn outcome(r: Result<bool, ApiError>) -> Result<bool, u16> {
        r.map_err(|e| e.code)
    }

    /// Filtering a cached object (kept fields, no decode) answers as filtering the decoded
    /// object, matches, mismatches and unsupported fields (400) alike.
    #[test]
    fn cached_filter_equals_decoded_filter() {
        let pods = [
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x"}},
                "spec": {"nodeName": "n1", "restartPolicy": "Always", "hostNetwork": true},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b", "namespace": "ns"},
                "spec": {"schedulerName": "s", "serviceAccountName": "sa"},
                "status": {"phase": "Pending", "nominatedNodeName": "n2"}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "c", "namespace": "o"}}),
        ];
        let selectors = [
            "spec.nodeName=n1",
            "spec.nodeName!=n1",
            "spec.host=n1",
            "spec.nodeName=",
            "spec.nodeName=n1,status.phase=Running",
            "spec.nodeName=n1,status.phase!=Running",
            "spec.hostNetwork=true",
            "spec.hostNetwork=false",
            "spec.restartPolicy=Always",
            "spec.schedulerName=s",
            "spec.serviceAccountName=sa",
            "status.podIP=10.0.0.1",
            "status.nominatedNodeName=n2",
            "metadata.name=a,spec.nodeName=n1",
            "metadata.namespace=o",
            "spec.containers=x",
            "spec.nodeName=n1,spec.bogus=1",
        ];
        let res = resource("", "Pod");
        for v in &pods {
            let key = res.key(Some(crate::objects::namespace(v)), crate::objects::name(v));
            let raw = serde_json::to_vec(v).expect("json");
            let o = CachedObject::from_stored_key(&key, &raw, 5).expect("object");
            let set = crate::kept::for_kind("", "Pod").expect("set");
            assert!(o.kept_field(set, 0).is_some(), "{v}: values kept");
            assert_eq!(o.name(), crate::objects::name(v));
            for sel in selectors {
                for labels in ["", "app=x"] {
                    let f = filter(sel, labels);
                    assert_eq!(
                        outcome(f.try_matches_cached(&res, &o)),
                        outcome(f.try_matches(&res, v)),
                        "{v} {sel} {labels}"
                    );
                }
            }
        }
        let events = [
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ns"},
                "involvedObject": {"kind": "Pod", "name": "a", "namespace": "ns", "uid": "u1"},
                "reason": "Scheduled", "source": {"component": "sched"}, "type": "Normal"}),
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "f", "namespace": "ns"},
                "involvedObject": {"kind": "Node", "name": "n1"}, "reportingComponent": "kubelet"}),
        ];
        let ev_selectors = [
            "involvedObject.name=a,involvedObject.namespace=ns,involvedObject.uid=u1",
            "involvedObject.kind=Node",
            "source=kubelet",
            "source=sched",
            "reportingComponent=kubelet",
            "reason=Scheduled,type=Normal",
            "regarding.name=a",
        ];
        for res in [resource("", "Event"), resource("events.k8s.io", "Event")] {
            for v in &events {
                let key = res.key(Some("ns"), crate::objects::name(v));
                let raw = serde_json::to_vec(v).expect("json");
                let o = CachedObject::from_stored_key(&key, &raw, 5).expect("object");
                for sel in ev_selectors {
                    let f = filter(sel, "");
                    assert_eq!(
                        outcome(f.try_matches_cached(&res, &o)),
                        outcome(f.try_matches(&res, v)),
                        "{} {v} {sel}",
                        res.info().group
                    );
                }
            }
        }
    }
}
