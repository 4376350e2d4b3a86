//! The `NodeRestriction` admission plugin (upstream's plugin/pkg/admission/noderestriction), as
//! a pure function: a node agent (`system:node:<name>` in `system:nodes`) may only write its
//! own Node and Lease, the status of pods bound to it, delete or evict pods bound to it, create
//! only mirror pods bound to it, and request tokens only for pods bound to it.

use serde_json::Value;

/// What a write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// One write by a node, with what the decision reads.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    /// The node's name (from `system:node:<name>`).
    pub node: &'a str,
    pub operation: Operation,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    /// The object's name (from the URL, else the body).
    pub name: &'a str,
    /// The object sent (create, update), if any.
    pub object: Option<&'a Value>,
    /// The stored object the write touches (pods: the pod; tokens: the pod the token is bound
    /// to), if it exists.
    pub existing: Option<&'a Value>,
}

const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node a user acts for: `system:node:<name>` in group `system:nodes`.
pub fn node_of(user: &str, groups: &[String]) -> Option<String> {
    let name = user.strip_prefix(ferry_auth::bootstrap::NODE_USER_PREFIX)?;
    (!name.is_empty() && groups.iter().any(|g| g == ferry_auth::user::NODES_GROUP))
        .then(|| name.to_string())
}

fn node_name_of(pod: Option<&Value>) -> &str {
    pod.and_then(|p| p.pointer("/spec/nodeName"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Why NodeRestriction refuses a write (worded as upstream's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

impl From<&str> for Denied {
    fn from(s: &str) -> Self {
        Denied(s.to_string())
    }
}

impl From<String> for Denied {
    fn from(s: String) -> Self {
        Denied(s)
    }
}

/// `Ok` when the write is allowed; otherwise the reason.
pub fn decide(w: &Write) -> Result<(), Denied> {
    let node = w.node;
    match (w.group, w.resource) {
        ("", "pods") => match (w.subresource, w.operation) {
            ("", Operation::Create) => {
                let pod = w.object;
                let mirror = pod
                    .and_then(|p| p.pointer("/metadata/annotations"))
                    .and_then(Value::as_object)
                    .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
                if !mirror {
                    return Err(format!(
                        "pod does not have \"{MIRROR_POD_ANNOTATION}\" annotation, node \"{node}\" can only create mirror pods"
                    ).into());
                }
                if node_name_of(pod) != node {
                    return Err(format!(
                        "node \"{node}\" can only create pods with spec.nodeName set to itself"
                    )
                    .into());
                }
                Ok(())
            }
            ("", Operation::Delete) => {
                // A named pod that is gone already: the delete answers 404 (upstream passes
                // the NotFound error on), not a denial. A collection stays denied.
                let gone = w.existing.is_none() && !w.name.is_empty();
                if !gone && node_name_of(w.existing) != node {
                    return Err(format!(
                        "node \"{node}\" can only delete pods with spec.nodeName set to itself"
                    )
                    .into());
                }
                Ok(())
            }
            ("", Operation::Update) => Err("unexpected operation UPDATE".into()),
            ("status", _) => {
                if node_name_of(w.existing) != node {
                    return Err(format!(
                        "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                    ).into());
                }
                Ok(())
            }
            ("eviction", _) => {
                if node_name_of(w.existing) != node {
                    return Err(format!(
                        "node \"{node}\" can only evict pods with spec.nodeName set to itself"
                    )
                    .into());
                }
                Ok(())
            }
            _ => Ok(()),
        },
        ("", "nodes") => {
            if w.name != node {
                return Err(format!(
                    "node \"{node}\" is not allowed to modify node \"{}\"",
                    w.name
                )
                .into());
            }
            Ok(())
        }
        ("coordination.k8s.io", "leases") => {
            if w.namespace != NODE_LEASE_NAMESPACE {
                return Err(format!(
                    "can only access leases in the \"{NODE_LEASE_NAMESPACE}\" system namespace"
                )
                .into());
            }
            if w.name != node {
                return Err(
                    "can only access node lease with the same name as the requesting node".into(),
                );
            }
            Ok(())
        }
        ("", "serviceaccounts") if w.subresource == "token" => {
            let bound = w
                .object
                .and_then(|o| o.pointer("/spec/boundObjectRef"))
                .filter(|r| r.get("kind").and_then(Value::as_str) == Some("Pod"));
            if bound.is_none() {
                return Err("node requested token not bound to a pod".into());
            }
            let uid = bound
                .and_then(|r| r.get("uid"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let existing_uid = w
                .existing
                .and_then(|p| p.pointer("/metadata/uid"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if w.existing.is_none() || (!uid.is_empty() && uid != existing_uid) {
                return Err("node requested token bound to a pod that does not exist".into());
            }
            if node_name_of(w.existing) != node {
                return Err(
                    "node requested token bound to a pod scheduled on a different node".into(),
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::too_many_arguments)]
mod tests {
    use super::*;
    use serde_json::json;

    fn w<'a>(
        operation: Operation,
        group: &'a str,
        resource: &'a str,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
        object: Option<&'a Value>,
        existing: Option<&'a Value>,
    ) -> Write<'a> {
        Write {
            node: "n1",
            operation,
            group,
            resource,
            subresource,
            namespace,
            name,
            object,
            existing,
        }
    }

    #[test]
    fn node_identity() {
        let nodes = vec!["system:nodes".to_string()];
        assert_eq!(node_of("system:node:n1", &nodes), Some("n1".into()));
        assert_eq!(node_of("system:node:n1", &[]), None);
        assert_eq!(node_of("system:node:", &nodes), None);
        assert_eq!(node_of("alice", &nodes), None);
    }

    #[test]
    fn decisions() {
        use Operation::*;
        let mine = json!({"metadata": {"uid": "u1"}, "spec": {"nodeName": "n1"}});
        let theirs = json!({"metadata": {"uid": "u2"}, "spec": {"nodeName": "n2"}});
        let mirror = json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "x"}}, "spec": {"nodeName": "n1"}});
        let mirror_other = json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "x"}}, "spec": {"nodeName": "n2"}});
        let token = |uid: &str| json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "p", "uid": uid}}});
        let (t1, t2, unbound) = (token("u1"), token("u2"), json!({"spec": {}}));
        let ok: Result<(), Denied> = Ok(());
        let table: Vec<(Write, Result<(), Denied>)> = vec![
            (w(Update, "", "pods", "status", "ns", "p", None, Some(&mine)), ok.clone()),
            (w(Update, "", "pods", "status", "ns", "p", None, Some(&theirs)),
                Err("node \"n1\" can only update pod status for pods with spec.nodeName set to itself".into())),
            (w(Delete, "", "pods", "", "ns", "p", None, Some(&mine)), ok.clone()),
            (w(Delete, "", "pods", "", "ns", "p", None, Some(&theirs)),
                Err("node \"n1\" can only delete pods with spec.nodeName set to itself".into())),
            (w(Delete, "", "pods", "", "ns", "p", None, None), ok.clone()),
            (w(Delete, "", "pods", "", "ns", "", None, None),
                Err("node \"n1\" can only delete pods with spec.nodeName set to itself".into())),
            (w(Create, "", "pods", "", "ns", "p", Some(&mine), None),
                Err("pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods".into())),
            (w(Create, "", "pods", "", "ns", "p", Some(&mirror), None), ok.clone()),
            (w(Create, "", "pods", "", "ns", "p", Some(&mirror_other), None),
                Err("node \"n1\" can only create pods with spec.nodeName set to itself".into())),
            (w(Update, "", "pods", "", "ns", "p", Some(&mine), Some(&mine)), Err("unexpected operation UPDATE".into())),
            (w(Create, "", "pods", "eviction", "ns", "p", None, Some(&theirs)),
                Err("node \"n1\" can only evict pods with spec.nodeName set to itself".into())),
            (w(Update, "", "nodes", "status", "", "n1", None, None), ok.clone()),
            (w(Create, "", "nodes", "", "", "n1", None, None), ok.clone()),
            (w(Update, "", "nodes", "", "", "n2", None, None),
                Err("node \"n1\" is not allowed to modify node \"n2\"".into())),
            (w(Delete, "", "nodes", "", "", "n2", None, None),
                Err("node \"n1\" is not allowed to modify node \"n2\"".into())),
            (w(Update, "coordination.k8s.io", "leases", "", "kube-node-lease", "n1", None, None), ok.clone()),
            (w(Update, "coordination.k8s.io", "leases", "", "kube-node-lease", "n2", None, None),
                Err("can only access node lease with the same name as the requesting node".into())),
            (w(Create, "coordination.k8s.io", "leases", "", "kube-system", "n1", None, None),
                Err("can only access leases in the \"kube-node-lease\" system namespace".into())),
            (w(Create, "", "serviceaccounts", "token", "ns", "default", Some(&t1), Some(&mine)), ok.clone()),
            (w(Create, "", "serviceaccounts", "token", "ns", "default", Some(&t2), Some(&theirs)),
                Err("node requested token bound to a pod scheduled on a different node".into())),
            (w(Create, "", "serviceaccounts", "token", "ns", "default", Some(&t2), Some(&mine)),
                Err("node requested token bound to a pod that does not exist".into())),
            (w(Create, "", "serviceaccounts", "token", "ns", "default", Some(&unbound), None),
                Err("node requested token not bound to a pod".into())),
            (w(Create, "", "events", "", "ns", "e", None, None), ok.clone()),
            (w(Create, "", "configmaps", "", "ns", "c", None, None), ok),
        ];
        for (write, want) in table {
            assert_eq!(decide(&write), want, "{write:?}");
        }
    }
}
