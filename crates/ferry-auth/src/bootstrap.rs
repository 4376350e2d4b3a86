//! The default ClusterRoles and ClusterRoleBindings an API server creates at start (upstream's
//! `bootstrappolicy`), Ferry's component roles, and ClusterRole aggregation.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::rbac::GROUP;
use crate::user;

pub const AUTOUPDATE_ANNOTATION: &str = "rbac.authorization.kubernetes.io/autoupdate";
pub const BOOTSTRAPPING_LABEL: &str = "kubernetes.io/bootstrapping";
pub const AGGREGATE_TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
pub const AGGREGATE_TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
pub const AGGREGATE_TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The identities of Ferry's own components (client certificates issued by `ferry up`).
pub const CONTROLLERS_USER: &str = "system:kube-controller-manager";
pub const PROXY_USER: &str = "system:kube-proxy";
pub const DNS_USER: &str = "system:ferry:dns";
pub const INGRESS_USER: &str = "system:ferry:ingress";
pub const NETPOL_USER: &str = "system:ferry:netpol";
/// Node agents are `system:node:<name>` in group `system:nodes`.
pub const NODE_USER_PREFIX: &str = "system:node:";

const READ: &[&str] = &["get", "list", "watch"];
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: strs(verbs),
        api_groups: Some(strs(groups)),
        resources: Some(strs(resources)),
        ..Default::default()
    }
}

fn urls(verbs: &[&str], u: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: strs(verbs),
        non_resource_urls: Some(strs(u)),
        ..Default::default()
    }
}

fn bootstrap_meta(name: &str, extra_labels: &[(&str, &str)]) -> ObjectMeta {
    let mut labels =
        BTreeMap::from([(BOOTSTRAPPING_LABEL.to_string(), "rbac-defaults".to_string())]);
    for (k, v) in extra_labels {
        labels.insert(k.to_string(), v.to_string());
    }
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            AUTOUPDATE_ANNOTATION.to_string(),
            "true".to_string(),
        )])),
        ..Default::default()
    }
}

fn role(name: &str, labels: &[(&str, &str)], rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_meta(name, labels),
        rules: Some(rules),
        aggregation_rule: None,
    }
}

fn aggregated(name: &str, labels: &[(&str, &str)], selector_label: &str) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_meta(name, labels),
        rules: Some(Vec::new()),
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    selector_label.to_string(),
                    "true".to_string(),
                )])),
                match_expressions: None,
            }]),
        }),
    }
}

/// The default ClusterRoles (the upstream ones Ferry's API serves, and Ferry's components').
pub fn cluster_roles() -> Vec<ClusterRole> {
    vec![
        role(
            "cluster-admin",
            &[],
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        role(
            "system:discovery",
            &[],
            vec![urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
            ],
        ),
        role(
            "system:public-info-viewer",
            &[],
            vec![urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        role(
            "system:monitoring",
            &[],
            vec![urls(
                &["get"],
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/readyz",
                    "/readyz/*",
                    "/metrics",
                    "/metrics/slis",
                ],
            )],
        ),
        aggregated("admin", &[], AGGREGATE_TO_ADMIN),
        aggregated("edit", &[(AGGREGATE_TO_ADMIN, "true")], AGGREGATE_TO_EDIT),
        aggregated("view", &[(AGGREGATE_TO_EDIT, "true")], AGGREGATE_TO_VIEW),
        role(
            "system:aggregate-to-admin",
            &[(AGGREGATE_TO_ADMIN, "true")],
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                rule(READ_WRITE, &[GROUP], &["rolebindings", "roles"]),
            ],
        ),
        role(
            "system:aggregate-to-edit",
            &[(AGGREGATE_TO_EDIT, "true")],
            vec![
                rule(&["impersonate"], &[""], &["serviceaccounts"]),
                rule(
                    READ_WRITE,
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/proxy",
                        "pods/exec",
                        "pods/portforward",
                    ],
                ),
                rule(&["create"], &[""], &["pods/eviction"]),
                rule(
                    READ_WRITE,
                    &[""],
                    &[
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                        "persistentvolumeclaims",
                        "configmaps",
                        "secrets",
                        "events",
                    ],
                ),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
                rule(
                    READ_WRITE,
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                ),
                rule(READ_WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                rule(READ_WRITE, &["batch"], &["jobs", "cronjobs"]),
                rule(
                    READ_WRITE,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "ingresses",
                        "networkpolicies",
                        "replicasets",
                        "replicasets/scale",
                        "replicationcontrollers/scale",
                    ],
                ),
                rule(READ_WRITE, &["policy"], &["poddisruptionbudgets"]),
                rule(
                    READ_WRITE,
                    &["networking.k8s.io"],
                    &["networkpolicies", "ingresses"],
                ),
                rule(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
            ],
        ),
        role(
            "system:aggregate-to-view",
            &[(AGGREGATE_TO_VIEW, "true")],
            vec![
                rule(
                    READ,
                    &[""],
                    &[
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "configmaps",
                    ],
                ),
                rule(
                    READ,
                    &[""],
                    &[
                        "limitranges",
                        "resourcequotas",
                        "bindings",
                        "events",
                        "pods/status",
                        "resourcequotas/status",
                        "namespaces/status",
                        "replicationcontrollers/status",
                        "pods/log",
                    ],
                ),
                rule(READ, &[""], &["namespaces"]),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
                rule(
                    READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                ),
                rule(
                    READ,
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                rule(
                    READ,
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                ),
                rule(
                    READ,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "ingresses",
                        "ingresses/status",
                        "networkpolicies",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "replicationcontrollers/scale",
                    ],
                ),
                rule(
                    READ,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                rule(
                    READ,
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                ),
            ],
        ),
        role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        role(
            "system:kube-dns",
            &[],
            vec![
                rule(&["list", "watch"], &[""], &["endpoints", "services"]),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        role(
            "system:node-proxier",
            &[],
            vec![
                rule(&["list", "watch"], &[""], &["services", "endpoints"]),
                rule(&["get", "list", "watch"], &[""], &["nodes"]),
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        role(
            "system:node",
            &[],
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews", "localsubjectaccessreviews"],
                ),
                rule(READ, &[""], &["services"]),
                rule(&["create", "get", "list", "watch"], &[""], &["nodes"]),
                rule(&["update", "patch"], &[""], &["nodes/status"]),
                rule(&["update", "patch"], &[""], &["nodes"]),
                rule(
                    &["create", "update", "patch"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(READ, &[""], &["pods"]),
                rule(&["create", "delete"], &[""], &["pods"]),
                rule(&["update", "patch"], &[""], &["pods/status"]),
                rule(&["create"], &[""], &["pods/eviction"]),
                // Secrets, ConfigMaps, PersistentVolumeClaims, PersistentVolumes,
                // ServiceAccounts and their tokens: only through the Node authorizer
                // (`ferry_auth::node`), for objects the node's own pods reference.
                rule(&["get"], &[""], &["endpoints"]),
                rule(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
                // Ferry's agent also runs the node's service proxy and NetworkPolicy.
                rule(&["list", "watch"], &[""], &["endpoints", "namespaces"]),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
                rule(
                    &["list", "watch"],
                    &["networking.k8s.io"],
                    &["networkpolicies"],
                ),
            ],
        ),
        role(
            "system:kube-controller-manager",
            &[],
            vec![
                // Ferry runs every controller under one identity: the garbage collector and
                // namespace controller need to read and delete any kind, as upstream's do.
                rule(
                    &[
                        "get",
                        "list",
                        "watch",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection",
                    ],
                    &["*"],
                    &["*"],
                ),
                rule(
                    &["create"],
                    &[
                        "",
                        "apps",
                        "discovery.k8s.io",
                        "events.k8s.io",
                        "coordination.k8s.io",
                    ],
                    &[
                        "pods",
                        "endpoints",
                        "events",
                        "serviceaccounts",
                        "configmaps",
                        "replicasets",
                        "endpointslices",
                        "leases",
                    ],
                ),
                // The PV controller's provisioner and the StatefulSet controller's claims.
                rule(
                    &["create"],
                    &[""],
                    &["persistentvolumes", "persistentvolumeclaims"],
                ),
                rule(&["create"], &[""], &["pods/binding", "bindings"]),
                // StatefulSet/DaemonSet revisions, CronJob Jobs (issue 16).
                rule(
                    &["create"],
                    &["apps", "batch"],
                    &["controllerrevisions", "jobs"],
                ),
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                // The ClusterRole aggregation controller writes rules it may not hold itself.
                rule(&["escalate"], &[GROUP], &["clusterroles"]),
            ],
        ),
        role(
            "system:ferry:dns",
            &[],
            vec![
                rule(
                    &["list", "watch"],
                    &[""],
                    &["endpoints", "services", "namespaces", "pods"],
                ),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        role(
            "system:ferry:ingress",
            &[],
            vec![
                rule(
                    READ,
                    &["networking.k8s.io"],
                    &["ingresses", "ingressclasses"],
                ),
                rule(
                    &["update", "patch"],
                    &["networking.k8s.io"],
                    &["ingresses/status"],
                ),
                rule(READ, &[""], &["services", "endpoints", "secrets"]),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
            ],
        ),
        role(
            "system:ferry:netpol",
            &[],
            vec![
                rule(
                    &["list", "watch"],
                    &["networking.k8s.io"],
                    &["networkpolicies"],
                ),
                rule(&["list", "watch"], &[""], &["pods", "namespaces", "nodes"]),
                // Warning Events about policies that cannot be enforced.
                rule(
                    &["list", "create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
            ],
        ),
    ]
}

fn binding(name: &str, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: bootstrap_meta(name, &[]),
        role_ref: RoleRef {
            api_group: Some(GROUP.into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(subjects),
    }
}

fn subj(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
    Subject {
        api_group: (kind != "ServiceAccount").then(|| GROUP.to_string()),
        kind: kind.into(),
        name: name.into(),
        namespace: namespace.map(String::from),
    }
}

/// The default ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    vec![
        binding(
            "cluster-admin",
            "cluster-admin",
            vec![subj("Group", user::SYSTEM_MASTERS, None)],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            vec![subj("Group", user::ALL_AUTHENTICATED, None)],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            vec![subj("Group", user::ALL_AUTHENTICATED, None)],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![
                subj("Group", user::ALL_AUTHENTICATED, None),
                subj("Group", user::ALL_UNAUTHENTICATED, None),
            ],
        ),
        binding(
            "system:monitoring",
            "system:monitoring",
            vec![subj("Group", "system:monitoring", None)],
        ),
        binding(
            "system:kube-dns",
            "system:kube-dns",
            vec![subj("ServiceAccount", "kube-dns", Some("kube-system"))],
        ),
        binding(
            "system:node-proxier",
            "system:node-proxier",
            vec![subj("User", PROXY_USER, None)],
        ),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            vec![subj("User", CONTROLLERS_USER, None)],
        ),
        // Upstream leaves this binding without subjects and has the Node authorizer apply the
        // role's rules; Ferry binds the group of node agents here instead, and the role holds
        // no reads of Secrets, ConfigMaps, volumes or ServiceAccounts: those go through the
        // Node authorizer (`ferry_auth::node`), which runs before RBAC.
        binding(
            "system:node",
            "system:node",
            vec![subj("Group", user::NODES_GROUP, None)],
        ),
        binding(
            "system:ferry:dns",
            "system:ferry:dns",
            vec![subj("User", DNS_USER, None)],
        ),
        binding(
            "system:ferry:ingress",
            "system:ferry:ingress",
            vec![subj("User", INGRESS_USER, None)],
        ),
        binding(
            "system:ferry:netpol",
            "system:ferry:netpol",
            vec![subj("User", NETPOL_USER, None)],
        ),
    ]
}

/// Upstream's aggregation controller matches with `LabelSelectorAsSelector`; a selector that
/// does not parse selects nothing.
fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    ferry_selectors::labels::from_label_selector(sel).is_ok_and(|s| s.matches(labels))
}

/// The rules an aggregated ClusterRole should hold: the union (in order, without duplicates)
/// of the rules of every other ClusterRole one of its selectors matches, as upstream's
/// ClusterRole aggregation controller computes; `None` if `role` does not aggregate.
pub fn aggregate(role: &ClusterRole, all: &[ClusterRole]) -> Option<Vec<PolicyRule>> {
    let selectors = role
        .aggregation_rule
        .as_ref()?
        .cluster_role_selectors
        .as_deref()?;
    let me = role.metadata.name.as_deref();
    let mut sources: Vec<&ClusterRole> = all
        .iter()
        .filter(|r| r.metadata.name.as_deref() != me)
        .filter(|r| {
            let empty = BTreeMap::new();
            let labels = r.metadata.labels.as_ref().unwrap_or(&empty);
            selectors.iter().any(|s| selector_matches(s, labels))
        })
        .collect();
    sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for r in sources {
        for rule in r.rules.as_deref().unwrap_or_default() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    Some(rules)
}

/// Aggregates every aggregating role until nothing changes (roles may aggregate aggregated
/// roles: admin ⊇ edit ⊇ view).
pub fn aggregate_all(mut roles: Vec<ClusterRole>) -> Vec<ClusterRole> {
    for _ in 0..roles.len().max(1) {
        let mut changed = false;
        for i in 0..roles.len() {
            if let Some(rules) = aggregate(&roles[i], &roles)
                && roles[i].rules.as_ref() != Some(&rules)
            {
                roles[i].rules = Some(rules);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    roles
}

/// The stored `system:node` ClusterRole brought to this version's rules, when it must change:
/// earlier versions let it read every Secret and ConfigMap, which the Node authorizer now
/// restricts, and Ferry binds the role to `system:nodes` (upstream leaves that binding empty).
/// A role whose owners set `rbac.authorization.kubernetes.io/autoupdate: "false"` is kept.
pub fn reconcile_node_role(existing: &ClusterRole) -> Option<ClusterRole> {
    let autoupdate = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AUTOUPDATE_ANNOTATION))
        .is_none_or(|v| v == "true");
    let want = cluster_roles()
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some("system:node"))?;
    if !autoupdate || existing.rules == want.rules {
        return None;
    }
    let mut role = existing.clone();
    role.rules = want.rules;
    Some(role)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attributes::Attributes;
    use crate::rbac::{Policy, covers};
    use crate::user::UserInfo;

    fn by_name<'a>(roles: &'a [ClusterRole], n: &str) -> &'a ClusterRole {
        roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(n))
            .expect("role")
    }

    #[test]
    fn admin_edit_view_nest() {
        let roles = aggregate_all(cluster_roles());
        let rules = |n| by_name(&roles, n).rules.clone().unwrap_or_default();
        let (view, edit, admin) = (rules("view"), rules("edit"), rules("admin"));
        assert!(!view.is_empty());
        assert!(covers(&edit, &view).0, "edit covers view");
        assert!(covers(&admin, &edit).0, "admin covers edit");
        assert!(!covers(&view, &edit).0);
        // view reads no secrets; edit does; only admin writes roles.
        let secrets = vec![rule(&["get"], &[""], &["secrets"])];
        assert!(!covers(&view, &secrets).0 && covers(&edit, &secrets).0);
        let roles_rule = vec![rule(&["create"], &[GROUP], &["roles"])];
        assert!(!covers(&edit, &roles_rule).0 && covers(&admin, &roles_rule).0);
    }

    #[test]
    fn aggregation_follows_labels() {
        let mut roles = cluster_roles();
        roles.push(ClusterRole {
            metadata: ObjectMeta {
                name: Some("widgets-view".into()),
                labels: Some(BTreeMap::from([(
                    AGGREGATE_TO_VIEW.to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            rules: Some(vec![rule(&["get"], &["example.com"], &["widgets"])]),
            aggregation_rule: None,
        });
        let roles = aggregate_all(roles);
        let w = rule(&["get"], &["example.com"], &["widgets"]);
        for n in ["view", "edit", "admin"] {
            assert!(
                by_name(&roles, n)
                    .rules
                    .as_deref()
                    .unwrap_or_default()
                    .contains(&w),
                "{n}"
            );
        }
        assert!(aggregate(by_name(&roles, "cluster-admin"), &roles).is_none());
    }

    #[test]
    fn bootstrap_bindings_resolve() {
        let p = Policy::new(
            aggregate_all(cluster_roles()),
            vec![],
            cluster_role_bindings(),
            vec![],
        );
        for b in cluster_role_bindings() {
            assert!(
                p.role_ref_rules(&b.role_ref, "").is_ok(),
                "{:?}",
                b.metadata.name
            );
        }
        let proxy = UserInfo::authenticated(PROXY_USER, vec![]);
        let a = Attributes::resource(
            proxy.clone(),
            "watch",
            "",
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "",
            "",
        );
        assert!(p.authorize(&a).allowed);
        let a = Attributes::resource(proxy, "list", "", "", "v1", "secrets", "", "");
        assert!(!p.authorize(&a).allowed);
        let anon = UserInfo::anonymous();
        assert!(
            p.authorize(&Attributes::non_resource(anon.clone(), "get", "/version"))
                .allowed
        );
        assert!(
            !p.authorize(&Attributes::non_resource(anon, "get", "/api"))
                .allowed
        );
    }

    #[test]
    fn node_role_loses_broad_reads_unless_pinned() {
        let want = cluster_roles()
            .into_iter()
            .find(|r| r.metadata.name.as_deref() == Some("system:node"))
            .expect("system:node");
        assert_eq!(reconcile_node_role(&want), None, "current: unchanged");
        let mut old = want.clone();
        if let Some(rules) = old.rules.as_mut() {
            rules.push(rule(
                &["get", "list", "watch"],
                &[""],
                &["configmaps", "secrets"],
            ));
        }
        let fixed = reconcile_node_role(&old).expect("updated");
        assert_eq!(fixed.rules, want.rules);
        assert_eq!(fixed.metadata, old.metadata);
        if let Some(a) = old.metadata.annotations.as_mut() {
            a.insert(AUTOUPDATE_ANNOTATION.into(), "false".into());
        }
        assert_eq!(reconcile_node_role(&old), None, "pinned by its owners");
    }
}
