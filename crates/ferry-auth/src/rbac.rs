//! Upstream's RBAC: rule matching (`rbac/v1` helpers), the authorizer walking the bindings that
//! apply to a user (`VisitRulesFor`), the rules a user holds (`RulesFor`), and the
//! privilege-escalation check (`Covers`, `ConfirmNoEscalation`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use crate::attributes::Attributes;
use crate::message::{go_quote, go_quote_list};
use crate::user::{SYSTEM_MASTERS, UserInfo, service_account_username};

pub const GROUP: &str = "rbac.authorization.k8s.io";
const ALL: &str = "*";

fn has(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == v)
}

pub fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    has(&rule.verbs, ALL) || has(&rule.verbs, verb)
}

pub fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups
        .as_deref()
        .is_some_and(|g| has(g, ALL) || has(g, group))
}

/// `combined` is `resource` or `resource/subresource`; `*/subresource` matches any resource's
/// subresource of that name, `*` matches everything.
pub fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    rule.resources
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| {
            r == ALL
                || r == combined
                || (!subresource.is_empty()
                    && r.len() == subresource.len() + 2
                    && r.starts_with("*/")
                    && r.ends_with(subresource))
        })
}

pub fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => has(names, name),
    }
}

/// Exact, `*`, or a prefix ending in `*`.
pub fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|u| url_covers(u, path))
}

fn url_covers(owner: &str, path: &str) -> bool {
    owner == ALL
        || owner == path
        || owner
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Whether one rule allows the request.
pub fn rule_allows(a: &Attributes, rule: &PolicyRule) -> bool {
    if a.resource_request {
        verb_matches(rule, &a.verb)
            && api_group_matches(rule, &a.api_group)
            && resource_matches(rule, &a.combined_resource(), &a.subresource)
            && resource_name_matches(rule, &a.name)
    } else {
        verb_matches(rule, &a.verb) && non_resource_url_matches(rule, &a.path)
    }
}

/// A snapshot of the cluster's RBAC objects.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub cluster_roles: BTreeMap<String, ClusterRole>,
    /// By (namespace, name).
    pub roles: BTreeMap<(String, String), Role>,
    /// Sorted by name.
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// By namespace, each sorted by name.
    pub role_bindings: BTreeMap<String, Vec<RoleBinding>>,
}

fn name_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

impl Policy {
    pub fn new(
        cluster_roles: Vec<ClusterRole>,
        roles: Vec<Role>,
        cluster_role_bindings: Vec<ClusterRoleBinding>,
        role_bindings: Vec<RoleBinding>,
    ) -> Policy {
        let mut p = Policy {
            cluster_roles: cluster_roles
                .into_iter()
                .map(|r| (name_of(&r.metadata), r))
                .collect(),
            roles: roles
                .into_iter()
                .map(|r| {
                    (
                        (
                            r.metadata.namespace.clone().unwrap_or_default(),
                            name_of(&r.metadata),
                        ),
                        r,
                    )
                })
                .collect(),
            cluster_role_bindings,
            role_bindings: BTreeMap::new(),
        };
        p.cluster_role_bindings
            .sort_by_key(|b| name_of(&b.metadata));
        for b in role_bindings {
            p.role_bindings
                .entry(b.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .push(b);
        }
        for v in p.role_bindings.values_mut() {
            v.sort_by_key(|b| name_of(&b.metadata));
        }
        p
    }

    /// The rules a role reference grants (`GetRoleReferenceRules`).
    pub fn role_ref_rules(
        &self,
        role_ref: &RoleRef,
        namespace: &str,
    ) -> Result<&[PolicyRule], RbacError> {
        match role_ref.kind.as_str() {
            "Role" => self
                .roles
                .get(&(namespace.to_string(), role_ref.name.clone()))
                .map(|r| r.rules.as_deref().unwrap_or_default())
                .ok_or_else(|| RbacError::RoleNotFound(role_ref.name.clone())),
            "ClusterRole" => self
                .cluster_roles
                .get(&role_ref.name)
                .map(|r| r.rules.as_deref().unwrap_or_default())
                .ok_or_else(|| RbacError::ClusterRoleNotFound(role_ref.name.clone())),
            k => Err(RbacError::UnsupportedRoleRefKind(k.to_string())),
        }
    }

    /// Walks every rule that applies to `user` in `namespace` (cluster-wide bindings first, then
    /// the namespace's), as upstream's `VisitRulesFor`; `visit` returns false to stop.
    pub fn visit_rules_for(
        &self,
        user: &UserInfo,
        namespace: &str,
        mut visit: impl FnMut(Option<&Source<'_>>, Option<&PolicyRule>, Option<String>) -> bool,
    ) {
        for b in &self.cluster_role_bindings {
            let Some(subject) = applies_to(user, b.subjects.as_deref().unwrap_or_default(), "")
            else {
                continue;
            };
            match self.role_ref_rules(&b.role_ref, "") {
                Err(e) => {
                    if !visit(None, None, Some(e.to_string())) {
                        return;
                    }
                }
                Ok(rules) => {
                    let src = Source::ClusterRoleBinding(b, subject);
                    for r in rules {
                        if !visit(Some(&src), Some(r), None) {
                            return;
                        }
                    }
                }
            }
        }
        if namespace.is_empty() {
            return;
        }
        for b in self.role_bindings.get(namespace).into_iter().flatten() {
            let Some(subject) =
                applies_to(user, b.subjects.as_deref().unwrap_or_default(), namespace)
            else {
                continue;
            };
            match self.role_ref_rules(&b.role_ref, namespace) {
                Err(e) => {
                    if !visit(None, None, Some(e.to_string())) {
                        return;
                    }
                }
                Ok(rules) => {
                    let src = Source::RoleBinding(b, subject);
                    for r in rules {
                        if !visit(Some(&src), Some(r), None) {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// RBAC's decision on one request (never "deny": RBAC only allows or has no opinion).
    pub fn authorize(&self, a: &Attributes) -> Decision {
        let mut allowed = None;
        let mut errors = Vec::new();
        self.visit_rules_for(&a.user, &a.namespace, |src, rule, err| {
            if let (Some(src), Some(rule)) = (src, rule)
                && rule_allows(a, rule)
            {
                allowed = Some(format!("RBAC: allowed by {src}"));
                return false;
            }
            if let Some(e) = err {
                errors.push(e);
            }
            true
        });
        match allowed {
            Some(reason) => Decision {
                allowed: true,
                reason,
            },
            None => Decision {
                allowed: false,
                reason: if errors.is_empty() {
                    String::new()
                } else {
                    format!("RBAC: {}", aggregate(&errors))
                },
            },
        }
    }

    /// The rules `user` holds in `namespace` (cluster-wide ones included), and the errors met
    /// resolving them (`RulesFor`).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        self.visit_rules_for(user, namespace, |_, rule, err| {
            if let Some(r) = rule {
                rules.push(r.clone());
            }
            if let Some(e) = err {
                errors.push(e);
            }
            true
        });
        (rules, errors)
    }
}

/// The authorizer chain of kube-apiserver with `--authorization-mode=RBAC`: members of
/// `system:masters` may do anything, everyone else what RBAC allows.
pub fn decide(policy: &Policy, a: &Attributes) -> Decision {
    if a.user.in_group(SYSTEM_MASTERS) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    policy.authorize(a)
}

/// Formats errors as upstream's `utilerrors.NewAggregate(...).Error()`.
fn aggregate(errors: &[String]) -> String {
    let uniq: Vec<&String> = {
        let mut seen = BTreeSet::new();
        errors.iter().filter(|e| seen.insert(e.as_str())).collect()
    };
    if uniq.len() == 1 {
        uniq[0].clone()
    } else {
        format!(
            "[{}]",
            uniq.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// An authorization answer with upstream's reason text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Which binding granted a rule (for reasons).
pub enum Source<'a> {
    ClusterRoleBinding(&'a ClusterRoleBinding, &'a Subject),
    RoleBinding(&'a RoleBinding, &'a Subject),
}

fn describe_subject(s: &Subject, binding_namespace: &str) -> String {
    if s.kind == "ServiceAccount" {
        let ns = s
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(binding_namespace);
        format!("{} {}", s.kind, go_quote(&format!("{}/{}", s.name, ns)))
    } else {
        format!("{} {}", s.kind, go_quote(&s.name))
    }
}

impl fmt::Display for Source<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ClusterRoleBinding(b, s) => write!(
                f,
                "ClusterRoleBinding {} of {} {} to {}",
                go_quote(&name_of(&b.metadata)),
                b.role_ref.kind,
                go_quote(&b.role_ref.name),
                describe_subject(s, "")
            ),
            Source::RoleBinding(b, s) => {
                let ns = b.metadata.namespace.clone().unwrap_or_default();
                write!(
                    f,
                    "RoleBinding {} of {} {} to {}",
                    go_quote(&format!("{}/{}", name_of(&b.metadata), ns)),
                    b.role_ref.kind,
                    go_quote(&b.role_ref.name),
                    describe_subject(s, &ns)
                )
            }
        }
    }
}

/// The first subject that names `user` (`appliesTo`); a ServiceAccount subject without a
/// namespace means the binding's.
pub fn applies_to<'a>(
    user: &UserInfo,
    subjects: &'a [Subject],
    namespace: &str,
) -> Option<&'a Subject> {
    subjects
        .iter()
        .find(|s| applies_to_user(user, s, namespace))
}

fn applies_to_user(user: &UserInfo, s: &Subject, namespace: &str) -> bool {
    match s.kind.as_str() {
        "User" => user.name == s.name,
        "Group" => user.in_group(&s.name),
        "ServiceAccount" => {
            let ns = s
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(namespace);
            !ns.is_empty() && service_account_username(ns, &s.name) == user.name
        }
        _ => false,
    }
}

// ---- escalation checks ----

/// One rule per (group, resource, verb[, name]) and per (URL, verb) (`BreakdownRule`).
pub fn breakdown_rule(rule: &PolicyRule) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    let names = rule.resource_names.as_deref().unwrap_or_default();
    for g in rule.api_groups.as_deref().unwrap_or_default() {
        for r in rule.resources.as_deref().unwrap_or_default() {
            for v in &rule.verbs {
                let base = PolicyRule {
                    api_groups: Some(vec![g.clone()]),
                    resources: Some(vec![r.clone()]),
                    verbs: vec![v.clone()],
                    ..Default::default()
                };
                if names.is_empty() {
                    out.push(base);
                } else {
                    for n in names {
                        out.push(PolicyRule {
                            resource_names: Some(vec![n.clone()]),
                            ..base.clone()
                        });
                    }
                }
            }
        }
    }
    for u in rule.non_resource_urls.as_deref().unwrap_or_default() {
        for v in &rule.verbs {
            out.push(PolicyRule {
                non_resource_urls: Some(vec![u.clone()]),
                verbs: vec![v.clone()],
                ..Default::default()
            });
        }
    }
    out
}

fn has_all(set: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| has(set, w))
}

fn resource_covers_all(set: &[String], wanted: &[String]) -> bool {
    if has(set, ALL) {
        return true;
    }
    wanted.iter().all(|w| {
        has(set, w)
            || w.split_once('/')
                .is_some_and(|(_, sub)| has(set, &format!("*/{sub}")))
    })
}

fn urls_cover_all(set: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| set.iter().any(|o| url_covers(o, w)))
}

fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let o_groups = owner.api_groups.as_deref().unwrap_or_default();
    let o_res = owner.resources.as_deref().unwrap_or_default();
    let o_names = owner.resource_names.as_deref().unwrap_or_default();
    let s_names = sub.resource_names.as_deref().unwrap_or_default();
    let verbs = has(&owner.verbs, ALL) || has_all(&owner.verbs, &sub.verbs);
    let groups =
        has(o_groups, ALL) || has_all(o_groups, sub.api_groups.as_deref().unwrap_or_default());
    let resources = resource_covers_all(o_res, sub.resources.as_deref().unwrap_or_default());
    let urls = urls_cover_all(
        owner.non_resource_urls.as_deref().unwrap_or_default(),
        sub.non_resource_urls.as_deref().unwrap_or_default(),
    );
    let names = if s_names.is_empty() {
        o_names.is_empty()
    } else {
        o_names.is_empty() || has_all(o_names, s_names)
    };
    verbs && groups && resources && names && urls
}

/// Whether `owner` rules cover every permission in `servant`; the uncovered pieces otherwise.
pub fn covers(owner: &[PolicyRule], servant: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let mut missing = Vec::new();
    for s in servant {
        for sub in breakdown_rule(s) {
            if !owner.iter().any(|o| rule_covers(o, &sub)) {
                missing.push(sub);
            }
        }
    }
    (missing.is_empty(), missing)
}

/// Merges single-group single-resource rules that differ only in verbs (`CompactRules`).
pub fn compact_rules(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    let mut index: BTreeMap<(String, String, Vec<String>), usize> = BTreeMap::new();
    for r in rules {
        let groups = r.api_groups.as_deref().unwrap_or_default();
        let res = r.resources.as_deref().unwrap_or_default();
        let simple = groups.len() == 1
            && res.len() == 1
            && r.non_resource_urls
                .as_deref()
                .unwrap_or_default()
                .is_empty();
        if simple {
            let key = (
                groups[0].clone(),
                res[0].clone(),
                r.resource_names.clone().unwrap_or_default(),
            );
            if let Some(&i) = index.get(&key) {
                for v in &r.verbs {
                    if !has(&out[i].verbs, v) {
                        out[i].verbs.push(v.clone());
                    }
                }
                continue;
            }
            index.insert(key, out.len());
        }
        out.push(r.clone());
    }
    out
}

/// `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get" "list"]}` as upstream's
/// `CompactString`.
pub fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    let mut add = |label: &str, v: &[String]| {
        if !v.is_empty() {
            parts.push(format!("{label}:{}", go_quote_list(v)));
        }
    };
    add("APIGroups", r.api_groups.as_deref().unwrap_or_default());
    add("Resources", r.resources.as_deref().unwrap_or_default());
    add(
        "NonResourceURLs",
        r.non_resource_urls.as_deref().unwrap_or_default(),
    );
    add(
        "ResourceNames",
        r.resource_names.as_deref().unwrap_or_default(),
    );
    add("Verbs", &r.verbs);
    format!("{{{}}}", parts.join(", "))
}

/// `ConfirmNoEscalation`: `Ok` when `user` already holds every rule in `requested` within
/// `namespace`; otherwise upstream's message naming the missing permissions.
pub fn confirm_no_escalation(
    policy: &Policy,
    user: &UserInfo,
    namespace: &str,
    requested: &[PolicyRule],
) -> Result<(), RbacError> {
    let (owner, errors) = policy.rules_for(user, namespace);
    let (ok, missing) = covers(&owner, requested);
    if ok {
        return Ok(());
    }
    let descriptions: BTreeSet<String> =
        compact_rules(&missing).iter().map(compact_string).collect();
    Err(RbacError::Escalation {
        user: user.name.clone(),
        groups: user.groups.clone(),
        missing: descriptions.into_iter().collect(),
        resolution_errors: errors,
    })
}

/// Why a role reference resolves to no rules, or why a grant is refused; the texts are
/// upstream's (the API server returns them in a `403 Forbidden`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RbacError {
    #[error("role.{GROUP} {} not found", go_quote(.0))]
    RoleNotFound(String),
    #[error("clusterrole.{GROUP} {} not found", go_quote(.0))]
    ClusterRoleNotFound(String),
    #[error("unsupported role reference kind: {}", go_quote(.0))]
    UnsupportedRoleRefKind(String),
    /// `user` would grant rules it does not hold (`missing`, compacted as upstream prints them).
    #[error(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}{}",
        go_quote(.user),
        go_quote_list(.groups),
        .missing.join("\n"),
        resolution_suffix(.resolution_errors)
    )]
    Escalation {
        user: String,
        groups: Vec<String>,
        missing: Vec<String>,
        resolution_errors: Vec<String>,
    },
}

fn resolution_suffix(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!("; resolution errors: [{}]", errors.join(" "))
    }
}

#[cfg(test)]
mod tests;
