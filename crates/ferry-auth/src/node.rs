//! The Node authorizer (upstream's `plugin/pkg/auth/authorizer/node`): a node agent
//! (`system:node:<name>` in `system:nodes`) may read a Secret, ConfigMap, PersistentVolumeClaim,
//! PersistentVolume or ServiceAccount — and create a ServiceAccount token — only when that object
//! is reachable from a pod bound to its node:
//!
//! ```text
//! node <- pod <- secret | configmap | serviceaccount | pvc <- pv
//! ```
//!
//! [`NodeGraph`] is the pure graph, fed pod and PVC changes; [`NodeGraph::authorize`] is the
//! decision. Requests the Node authorizer has no opinion on fall through to RBAC, as upstream's
//! union authorizer does (`reason` is then joined into the 403 message).

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::attributes::Attributes;
use crate::bootstrap::NODE_USER_PREFIX;
use crate::user::{NODES_GROUP, UserInfo};

/// What kind of object a vertex is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Secret,
    ConfigMap,
    ServiceAccount,
    Pvc,
}

/// The objects one pod references (namespace-local names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRefs {
    pub node: String,
    pub namespace: String,
    pub refs: BTreeSet<(Kind, String)>,
}

fn s<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn arr<'a>(v: &'a Value, ptr: &str) -> impl Iterator<Item = &'a Value> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// The node a pod is bound to and every object it references, as upstream's
/// `VisitPodSecretNames`, `VisitPodConfigmapNames`, the PVC and ephemeral-volume claims and the
/// ServiceAccount. `None` for a pod not bound to a node.
pub fn pod_refs(pod: &Value) -> Option<PodRefs> {
    let node = s(pod, "/spec/nodeName")?.to_string();
    let namespace = s(pod, "/metadata/namespace")
        .unwrap_or("default")
        .to_string();
    let name = s(pod, "/metadata/name").unwrap_or("");
    let mut refs = BTreeSet::new();
    let mut add = |k: Kind, n: Option<&str>| {
        if let Some(n) = n {
            refs.insert((k, n.to_string()));
        }
    };
    let sa = s(pod, "/spec/serviceAccountName").or_else(|| s(pod, "/spec/serviceAccount"));
    add(Kind::ServiceAccount, sa);
    for p in arr(pod, "/spec/imagePullSecrets") {
        add(Kind::Secret, s(p, "/name"));
    }
    for list in [
        "/spec/initContainers",
        "/spec/containers",
        "/spec/ephemeralContainers",
    ] {
        for c in arr(pod, list) {
            for e in arr(c, "/envFrom") {
                add(Kind::Secret, s(e, "/secretRef/name"));
                add(Kind::ConfigMap, s(e, "/configMapRef/name"));
            }
            for e in arr(c, "/env") {
                add(Kind::Secret, s(e, "/valueFrom/secretKeyRef/name"));
                add(Kind::ConfigMap, s(e, "/valueFrom/configMapKeyRef/name"));
            }
        }
    }
    for v in arr(pod, "/spec/volumes") {
        add(Kind::Secret, s(v, "/secret/secretName"));
        add(Kind::ConfigMap, s(v, "/configMap/name"));
        for src in arr(v, "/projected/sources") {
            add(Kind::Secret, s(src, "/secret/name"));
            add(Kind::ConfigMap, s(src, "/configMap/name"));
        }
        for ptr in [
            "/azureFile/secretName",
            "/cephfs/secretRef/name",
            "/cinder/secretRef/name",
            "/flexVolume/secretRef/name",
            "/iscsi/secretRef/name",
            "/rbd/secretRef/name",
            "/scaleIO/secretRef/name",
            "/storageos/secretRef/name",
            "/csi/nodePublishSecretRef/name",
        ] {
            add(Kind::Secret, s(v, ptr));
        }
        add(Kind::Pvc, s(v, "/persistentVolumeClaim/claimName"));
        if v.get("ephemeral").is_some_and(|e| !e.is_null())
            && let Some(vn) = s(v, "/name")
        {
            // The claim the ephemeral volume controller creates: `<pod>-<volume>`.
            add(Kind::Pvc, Some(&format!("{name}-{vn}")));
        }
    }
    Some(PodRefs {
        node,
        namespace,
        refs,
    })
}

type ObjKey = (Kind, String, String);

/// Pods bound to nodes and what they reference, kept current from pod and PVC events.
#[derive(Debug, Default, Clone)]
pub struct NodeGraph {
    /// (namespace, pod) -> its node and references.
    pods: HashMap<(String, String), PodRefs>,
    /// (kind, namespace, name) -> node -> how many of the node's pods reference it.
    edges: HashMap<ObjKey, HashMap<String, usize>>,
    /// (namespace, claim) -> the PersistentVolume it is bound to (`spec.volumeName`).
    pvc_volume: HashMap<(String, String), String>,
    /// PersistentVolume -> the claims bound to it.
    pv_claims: HashMap<String, BTreeSet<(String, String)>>,
}

impl NodeGraph {
    pub fn new() -> NodeGraph {
        NodeGraph::default()
    }

    /// Sets pod `namespace/name` to `pod` (`None`: deleted).
    pub fn set_pod(&mut self, namespace: &str, name: &str, pod: Option<&Value>) {
        let key = (namespace.to_string(), name.to_string());
        let new = pod.and_then(pod_refs);
        if self.pods.get(&key) == new.as_ref() {
            return;
        }
        if let Some(old) = self.pods.remove(&key) {
            for (k, n) in &old.refs {
                let ok = (*k, old.namespace.clone(), n.clone());
                if let Some(nodes) = self.edges.get_mut(&ok) {
                    if let Some(c) = nodes.get_mut(&old.node) {
                        *c -= 1;
                        if *c == 0 {
                            nodes.remove(&old.node);
                        }
                    }
                    if nodes.is_empty() {
                        self.edges.remove(&ok);
                    }
                }
            }
        }
        if let Some(new) = new {
            for (k, n) in &new.refs {
                *self
                    .edges
                    .entry((*k, new.namespace.clone(), n.clone()))
                    .or_default()
                    .entry(new.node.clone())
                    .or_default() += 1;
            }
            self.pods.insert(key, new);
        }
    }

    /// Sets claim `namespace/name` to `pvc` (`None`: deleted): records its bound volume.
    pub fn set_pvc(&mut self, namespace: &str, name: &str, pvc: Option<&Value>) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(pv) = self.pvc_volume.remove(&key)
            && let Some(claims) = self.pv_claims.get_mut(&pv)
        {
            claims.remove(&key);
            if claims.is_empty() {
                self.pv_claims.remove(&pv);
            }
        }
        if let Some(pv) = pvc.and_then(|p| s(p, "/spec/volumeName")) {
            self.pv_claims
                .entry(pv.to_string())
                .or_default()
                .insert(key.clone());
            self.pvc_volume.insert(key, pv.to_string());
        }
    }

    /// Forgets every pod and claim (before a rebuild from a snapshot).
    pub fn clear(&mut self) {
        *self = NodeGraph::default();
    }

    /// Pods in the graph.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Whether a pod bound to `node` references `kind` `namespace/name`.
    pub fn reachable(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        self.edges
            .get(&(kind, namespace.to_string(), name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
    }

    /// Whether PersistentVolume `pv` is bound to a claim a pod on `node` uses.
    pub fn pv_reachable(&self, node: &str, pv: &str) -> bool {
        self.pv_claims.get(pv).is_some_and(|claims| {
            claims
                .iter()
                .any(|(ns, c)| self.reachable(node, Kind::Pvc, ns, c))
        })
    }

    /// Upstream's `NodeAuthorizer.Authorize` for the resources it subdivides. `None`: not a node
    /// request or not a resource the Node authorizer decides (RBAC decides alone).
    pub fn authorize(&self, a: &Attributes) -> Option<NodeDecision> {
        let node = node_identity(&a.user)?;
        if !a.resource_request || !a.api_group.is_empty() {
            return None;
        }
        let no = |reason: String| {
            Some(NodeDecision {
                allowed: false,
                reason,
            })
        };
        if node.is_empty() {
            return no(format!(
                "unknown node for user {}",
                crate::message::go_quote(&a.user.name)
            ));
        }
        let related = |ok: bool| {
            if ok {
                Some(NodeDecision {
                    allowed: true,
                    reason: String::new(),
                })
            } else {
                no(format!(
                    "no relationship found between node '{node}' and this object"
                ))
            }
        };
        let kind = match a.resource.as_str() {
            "secrets" => Kind::Secret,
            "configmaps" => Kind::ConfigMap,
            "persistentvolumeclaims" => Kind::Pvc,
            "serviceaccounts" => Kind::ServiceAccount,
            "persistentvolumes" => {
                if a.verb != "get" {
                    return no("can only get individual resources of this type".into());
                }
                if !a.subresource.is_empty() {
                    return no("cannot get subresource".into());
                }
                if a.name.is_empty() {
                    return no("No Object name found".into());
                }
                return related(self.pv_reachable(node, &a.name));
            }
            _ => return None,
        };
        match kind {
            Kind::Secret | Kind::ConfigMap => {
                if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
                    return no("can only read resources of this type".into());
                }
                if !a.subresource.is_empty() {
                    return no("cannot read subresource".into());
                }
                if a.namespace.is_empty() {
                    return no("can only read namespaced object of this type".into());
                }
            }
            Kind::Pvc => {
                if a.verb != "get" {
                    return no("can only get individual resources of this type".into());
                }
                if !a.subresource.is_empty() {
                    return no("cannot get subresource".into());
                }
            }
            Kind::ServiceAccount => {
                // Upstream subdivides only `create serviceaccounts/token`; Ferry also lets a
                // node read the ServiceAccount of its own pods (and nothing else).
                let token = a.verb == "create" && a.subresource == "token";
                let read = a.verb == "get" && a.subresource.is_empty();
                if !(token || read) || a.name.is_empty() {
                    return no("can only create tokens for individual service accounts".into());
                }
            }
        }
        if a.name.is_empty() {
            return no("No Object name found".into());
        }
        related(self.reachable(node, kind, &a.namespace, &a.name))
    }
}

/// A Node authorizer answer: allowed, or no opinion with upstream's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecision {
    pub allowed: bool,
    pub reason: String,
}

/// Upstream's `NodeIdentity`: `Some(name)` for a user in `system:nodes` named
/// `system:node:<name>` (`Some("")` when in the group but named otherwise), `None` otherwise.
pub fn node_identity(user: &UserInfo) -> Option<&str> {
    if !user.in_group(NODES_GROUP) {
        return None;
    }
    Some(user.name.strip_prefix(NODE_USER_PREFIX).unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, node: &str, spec_extra: Value) -> Value {
        let mut spec = json!({"nodeName": node, "containers": [{"name": "c", "image": "x"}]});
        if let (Some(o), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})
    }

    fn node_user(n: &str) -> UserInfo {
        UserInfo::authenticated(format!("system:node:{n}"), vec![NODES_GROUP.into()])
    }

    fn attrs(node: &str, verb: &str, ns: &str, res: &str, sub: &str, name: &str) -> Attributes {
        Attributes::resource(node_user(node), verb, ns, "", "v1", res, sub, name)
    }

    fn allowed(g: &NodeGraph, a: &Attributes) -> Option<bool> {
        g.authorize(a).map(|d| d.allowed)
    }

    #[test]
    fn pod_refs_finds_every_reference() {
        let p = pod(
            "ns",
            "web",
            "n1",
            json!({
                "serviceAccountName": "sa",
                "imagePullSecrets": [{"name": "pull"}],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
                "containers": [{"name": "c",
                    "envFrom": [{"configMapRef": {"name": "cm-env"}}, {"secretRef": {"name": "s-env"}}],
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "k"}}},
                            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                            {"name": "C", "value": "plain"}]}],
                "ephemeralContainers": [{"name": "e", "env": [{"name": "D", "valueFrom": {"secretKeyRef": {"name": "eph"}}}]}],
                "volumes": [
                    {"name": "v1", "secret": {"secretName": "vol-s"}},
                    {"name": "v2", "configMap": {"name": "vol-cm"}},
                    {"name": "v3", "projected": {"sources": [
                        {"secret": {"name": "proj-s"}}, {"configMap": {"name": "proj-cm"}},
                        {"serviceAccountToken": {"path": "token"}}]}},
                    {"name": "v4", "persistentVolumeClaim": {"claimName": "claim"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "v6", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-s"}}},
                    {"name": "v7", "emptyDir": {}}
                ]
            }),
        );
        let r = pod_refs(&p).expect("bound pod");
        assert_eq!(r.node, "n1");
        assert_eq!(r.namespace, "ns");
        let mut want = BTreeSet::new();
        for n in [
            "pull", "init-env", "s-env", "s-key", "eph", "vol-s", "proj-s", "csi-s",
        ] {
            want.insert((Kind::Secret, n.to_string()));
        }
        for n in ["cm-env", "cm-key", "vol-cm", "proj-cm"] {
            want.insert((Kind::ConfigMap, n.to_string()));
        }
        want.insert((Kind::ServiceAccount, "sa".into()));
        want.insert((Kind::Pvc, "claim".into()));
        want.insert((Kind::Pvc, "web-scratch".into()));
        assert_eq!(r.refs, want);
        let mut unbound = p.clone();
        unbound["spec"]["nodeName"] = json!("");
        assert_eq!(pod_refs(&unbound), None);
    }

    #[test]
    fn add_update_delete_pods() {
        let mut g = NodeGraph::new();
        let p = pod(
            "ns",
            "a",
            "n1",
            json!({"volumes": [{"name": "v", "secret": {"secretName": "tls"}}]}),
        );
        g.set_pod("ns", "a", Some(&p));
        assert!(g.reachable("n1", Kind::Secret, "ns", "tls"));
        assert!(!g.reachable("n2", Kind::Secret, "ns", "tls"));
        assert!(!g.reachable("n1", Kind::Secret, "other", "tls"));
        assert!(!g.reachable("n1", Kind::ConfigMap, "ns", "tls"));
        // Update: the secret is swapped for a configmap.
        let p2 = pod(
            "ns",
            "a",
            "n1",
            json!({"volumes": [{"name": "v", "configMap": {"name": "conf"}}]}),
        );
        g.set_pod("ns", "a", Some(&p2));
        assert!(!g.reachable("n1", Kind::Secret, "ns", "tls"));
        assert!(g.reachable("n1", Kind::ConfigMap, "ns", "conf"));
        // Applying the same state twice changes nothing.
        g.set_pod("ns", "a", Some(&p2));
        assert!(g.reachable("n1", Kind::ConfigMap, "ns", "conf"));
        g.set_pod("ns", "a", None);
        assert!(!g.reachable("n1", Kind::ConfigMap, "ns", "conf"));
        assert_eq!(g.pod_count(), 0);
        assert!(g.edges.is_empty());
        // A pod not yet scheduled references nothing.
        let mut pending = p.clone();
        pending["spec"]
            .as_object_mut()
            .map(|o| o.remove("nodeName"));
        g.set_pod("ns", "a", Some(&pending));
        assert!(g.edges.is_empty());
    }

    #[test]
    fn shared_secret_on_two_nodes_and_a_pod_moving() {
        let mut g = NodeGraph::new();
        let spec = json!({"imagePullSecrets": [{"name": "shared"}]});
        g.set_pod("ns", "a", Some(&pod("ns", "a", "n1", spec.clone())));
        g.set_pod("ns", "b", Some(&pod("ns", "b", "n2", spec.clone())));
        g.set_pod("ns", "c", Some(&pod("ns", "c", "n2", spec.clone())));
        for n in ["n1", "n2"] {
            assert!(g.reachable(n, Kind::Secret, "ns", "shared"));
        }
        g.set_pod("ns", "b", None);
        assert!(
            g.reachable("n2", Kind::Secret, "ns", "shared"),
            "c is still on n2"
        );
        // c moves (delete + recreate with the same name on another node).
        g.set_pod("ns", "c", Some(&pod("ns", "c", "n3", spec.clone())));
        assert!(!g.reachable("n2", Kind::Secret, "ns", "shared"));
        assert!(g.reachable("n3", Kind::Secret, "ns", "shared"));
        g.set_pod("ns", "a", None);
        assert!(!g.reachable("n1", Kind::Secret, "ns", "shared"));
        assert!(g.reachable("n3", Kind::Secret, "ns", "shared"));
    }

    #[test]
    fn persistent_volumes_through_their_claims() {
        let mut g = NodeGraph::new();
        let spec =
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        g.set_pod("ns", "a", Some(&pod("ns", "a", "n1", spec)));
        assert!(!g.pv_reachable("n1", "pv-1"));
        g.set_pvc("ns", "data", Some(&json!({"spec": {"volumeName": "pv-1"}})));
        assert!(g.pv_reachable("n1", "pv-1"));
        assert!(!g.pv_reachable("n2", "pv-1"));
        g.set_pvc("ns", "data", Some(&json!({"spec": {"volumeName": "pv-2"}})));
        assert!(!g.pv_reachable("n1", "pv-1"));
        assert!(g.pv_reachable("n1", "pv-2"));
        g.set_pvc("ns", "data", None);
        assert!(!g.pv_reachable("n1", "pv-2"));
        assert!(g.pv_claims.is_empty());
    }

    #[test]
    fn decisions() {
        let mut g = NodeGraph::new();
        let spec = json!({
            "serviceAccountName": "sa",
            "volumes": [{"name": "v", "secret": {"secretName": "tls"}},
                        {"name": "c", "configMap": {"name": "conf"}},
                        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        g.set_pod("ns", "web", Some(&pod("ns", "web", "n1", spec)));
        g.set_pvc("ns", "data", Some(&json!({"spec": {"volumeName": "pv-1"}})));
        let no_rel = "no relationship found between node 'n2' and this object";
        // (node, verb, ns, resource, subresource, name) -> Some(allowed) / None (RBAC decides).
        type Row<'a> = (
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            Option<bool>,
        );
        let table: Vec<Row> = vec![
            ("n1", "get", "ns", "secrets", "", "tls", Some(true)),
            ("n1", "list", "ns", "secrets", "", "tls", Some(true)),
            ("n1", "watch", "ns", "configmaps", "", "conf", Some(true)),
            ("n1", "list", "ns", "secrets", "", "", Some(false)),
            ("n1", "list", "", "secrets", "", "", Some(false)),
            ("n1", "get", "ns", "secrets", "", "other", Some(false)),
            ("n1", "update", "ns", "secrets", "", "tls", Some(false)),
            ("n1", "delete", "ns", "configmaps", "", "conf", Some(false)),
            ("n2", "get", "ns", "secrets", "", "tls", Some(false)),
            (
                "n1",
                "get",
                "ns",
                "persistentvolumeclaims",
                "",
                "data",
                Some(true),
            ),
            (
                "n1",
                "list",
                "ns",
                "persistentvolumeclaims",
                "",
                "data",
                Some(false),
            ),
            ("n1", "get", "", "persistentvolumes", "", "pv-1", Some(true)),
            (
                "n2",
                "get",
                "",
                "persistentvolumes",
                "",
                "pv-1",
                Some(false),
            ),
            (
                "n1",
                "create",
                "ns",
                "serviceaccounts",
                "token",
                "sa",
                Some(true),
            ),
            (
                "n2",
                "create",
                "ns",
                "serviceaccounts",
                "token",
                "sa",
                Some(false),
            ),
            (
                "n1",
                "create",
                "ns",
                "serviceaccounts",
                "token",
                "default",
                Some(false),
            ),
            ("n1", "get", "ns", "serviceaccounts", "", "sa", Some(true)),
            ("n1", "list", "ns", "serviceaccounts", "", "", Some(false)),
            ("n1", "get", "ns", "pods", "", "web", None),
            ("n1", "list", "", "nodes", "", "", None),
        ];
        for (node, verb, ns, res, sub, name, want) in table {
            let a = attrs(node, verb, ns, res, sub, name);
            assert_eq!(
                allowed(&g, &a),
                want,
                "{node} {verb} {ns} {res}/{sub} {name}"
            );
        }
        let d = g
            .authorize(&attrs("n2", "get", "ns", "secrets", "", "tls"))
            .expect("decided");
        assert_eq!(d.reason, no_rel);
        let d = g
            .authorize(&attrs("n1", "list", "ns", "secrets", "", ""))
            .expect("decided");
        assert_eq!(d.reason, "No Object name found");
        let d = g
            .authorize(&attrs("n1", "update", "ns", "secrets", "", "tls"))
            .expect("decided");
        assert_eq!(d.reason, "can only read resources of this type");
        // Not a node: no opinion.
        let mut a = attrs("n1", "get", "ns", "secrets", "", "tls");
        a.user = UserInfo::authenticated("alice", vec![]);
        assert_eq!(g.authorize(&a), None);
        // In the group but not named as a node.
        a.user = UserInfo::authenticated("bob", vec![NODES_GROUP.into()]);
        assert_eq!(
            g.authorize(&a).map(|d| d.reason),
            Some("unknown node for user \"bob\"".to_string())
        );
    }
}
