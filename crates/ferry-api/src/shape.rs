//! The fields upstream always serializes. Go's API structs hold `spec` and `status` (and some
//! nested structs and counters) by value without `omitempty`, so kube-apiserver always sends
//! them, even empty (`"status":{"loadBalancer":{}}` on a new Service); k8s-openapi's types make
//! them optional. Clients and scripts rely on their presence (`.status.loadBalancer` in jq,
//! typed clients that index `status`), so stored objects get them filled in. Pure.

use serde_json::{Map, Value, json};

use crate::kinds::KindInfo;

/// The always-present skeleton of a kind (merged under what the object has).
pub fn skeleton(info: &KindInfo) -> Option<Value> {
    Some(match (info.group, info.kind) {
        ("", "Pod") | ("", "Namespace") | ("", "Node") => json!({"spec": {}, "status": {}}),
        ("", "Service") => json!({"spec": {}, "status": {"loadBalancer": {}}}),
        ("", "PersistentVolume") | ("", "PersistentVolumeClaim") => {
            json!({"spec": {}, "status": {}})
        }
        ("", "ReplicationController") => json!({"spec": {}, "status": {"replicas": 0}}),
        ("", "ResourceQuota") => json!({"spec": {}, "status": {}}),
        ("", "LimitRange") => json!({"spec": {}}),
        ("apps", "Deployment") => json!({"spec": {}, "status": {}}),
        ("apps", "ReplicaSet") => json!({"spec": {}, "status": {"replicas": 0}}),
        ("apps", "StatefulSet") => {
            json!({"spec": {}, "status": {"replicas": 0, "availableReplicas": 0}})
        }
        ("apps", "DaemonSet") => json!({"spec": {}, "status": {
            "currentNumberScheduled": 0, "numberMisscheduled": 0,
            "desiredNumberScheduled": 0, "numberReady": 0}}),
        ("batch", "Job") | ("batch", "CronJob") => json!({"spec": {}, "status": {}}),
        ("networking.k8s.io", "Ingress") => json!({"spec": {}, "status": {"loadBalancer": {}}}),
        ("networking.k8s.io", "IngressClass") | ("networking.k8s.io", "NetworkPolicy") => {
            json!({"spec": {}})
        }
        ("policy", "PodDisruptionBudget") => json!({"spec": {}, "status": {
            "disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}}),
        ("coordination.k8s.io", "Lease") => json!({"spec": {}}),
        ("autoscaling", "HorizontalPodAutoscaler") => {
            json!({"spec": {}, "status": {"desiredReplicas": 0}})
        }
        _ => return None,
    })
}

/// Fills in what upstream always serializes and `obj` lacks; never changes a present value.
pub fn fill_always_present(info: &KindInfo, obj: &mut Value) {
    if let (Some(sk), Some(o)) = (skeleton(info), obj.as_object_mut())
        && let Value::Object(sk) = sk
    {
        merge_missing(o, &sk);
    }
}

fn merge_missing(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
            (Some(Value::Null), _) => {
                into.insert(k.clone(), v.clone());
            }
            (Some(Value::Object(have)), Value::Object(want)) => merge_missing(have, want),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(group: &'static str, kind: &'static str) -> KindInfo {
        KindInfo {
            group,
            version: "v1",
            kind,
            plural: "x",
            singular: "x",
            namespaced: true,
            short_names: &[],
            categories: &[],
            status_subresource: true,
            status_on_create: crate::kinds::StatusOnCreate::Keep,
            generation: true,
            delete_returns_object: false,
            scale_subresource: false,
        }
    }

    #[test]
    fn fills_only_what_is_missing() {
        let svc = info("", "Service");
        let mut v = json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}});
        fill_always_present(&svc, &mut v);
        assert_eq!(v["status"], json!({"loadBalancer": {}}));
        assert_eq!(v["spec"]["ports"][0]["port"], 80);
        let mut v = json!({"status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}});
        fill_always_present(&svc, &mut v);
        assert_eq!(v["status"]["loadBalancer"]["ingress"][0]["ip"], "1.2.3.4");
        assert_eq!(v["spec"], json!({}));
        let mut v = json!({"status": {"replicas": 3}});
        fill_always_present(&info("apps", "ReplicaSet"), &mut v);
        assert_eq!(v["status"]["replicas"], 3);
        let mut cm = json!({"data": {"a": "b"}});
        fill_always_present(&info("", "ConfigMap"), &mut cm);
        assert_eq!(cm, json!({"data": {"a": "b"}}));
    }
}
