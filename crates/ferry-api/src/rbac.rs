//! `rbac.authorization.k8s.io/v1` kinds: Role, ClusterRole, RoleBinding, ClusterRoleBinding —
//! defaulting, validation and Table printing as upstream (`pkg/apis/rbac/validation`,
//! `pkg/apis/rbac/v1/defaults.go`, the server-side printers).

use jiff::Timestamp;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::errors::{ErrorList, FieldError, Path, quote};
use crate::kinds::{Column, Hooks, KindInfo, StatusOnCreate, Typed};
use crate::names::is_dns1123_subdomain;
use crate::validation::{
    validate_label_selector, validate_object_meta, validate_object_meta_update,
};
use ferry_printers::columns::{AGE as CREATED, col};

pub const GROUP: &str = "rbac.authorization.k8s.io";

fn info(
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
) -> KindInfo {
    KindInfo {
        group: GROUP,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        short_names: &[],
        categories: &[],
        status_subresource: false,
        status_on_create: StatusOnCreate::Keep,
        generation: false,
        delete_returns_object: false,
        scale_subresource: false,
    }
}

pub fn role_strategy() -> Typed<Role> {
    Typed {
        info: info("Role", "roles", "role", true),
        hooks: Hooks {
            default: |_| {},
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: validate_role,
            validate_status: |_, _| Vec::new(),
            columns: role_columns,
            row: |r| role_row(&r.metadata, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn cluster_role_strategy() -> Typed<ClusterRole> {
    Typed {
        info: info("ClusterRole", "clusterroles", "clusterrole", false),
        hooks: Hooks {
            default: |_| {},
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: validate_cluster_role,
            validate_status: |_, _| Vec::new(),
            columns: role_columns,
            row: |r| role_row(&r.metadata, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn role_binding_strategy() -> Typed<RoleBinding> {
    Typed {
        info: info("RoleBinding", "rolebindings", "rolebinding", true),
        hooks: Hooks {
            default: |b| default_binding(&mut b.role_ref, &mut b.subjects),
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: validate_role_binding,
            validate_status: |_, _| Vec::new(),
            columns: binding_columns,
            row: |b| binding_row(&b.metadata, &b.role_ref, &b.subjects, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

pub fn cluster_role_binding_strategy() -> Typed<ClusterRoleBinding> {
    Typed {
        info: info(
            "ClusterRoleBinding",
            "clusterrolebindings",
            "clusterrolebinding",
            false,
        ),
        hooks: Hooks {
            default: |b| default_binding(&mut b.role_ref, &mut b.subjects),
            prepare_create: |_| {},
            prepare_update: |_, _| {},
            validate: validate_cluster_role_binding,
            validate_status: |_, _| Vec::new(),
            columns: binding_columns,
            row: |b| binding_row(&b.metadata, &b.role_ref, &b.subjects, Timestamp::now()),
            field: |_, _| None,
        },
    }
}

// ---- defaulting ----

/// `roleRef.apiGroup` and each subject's `apiGroup` (empty for ServiceAccounts, the RBAC group
/// for users and groups).
pub fn default_binding(role_ref: &mut RoleRef, subjects: &mut Option<Vec<Subject>>) {
    if role_ref.api_group.as_deref().unwrap_or("").is_empty() {
        role_ref.api_group = Some(GROUP.into());
    }
    for s in subjects.iter_mut().flatten() {
        if s.api_group.as_deref().unwrap_or("").is_empty() {
            match s.kind.as_str() {
                "ServiceAccount" => s.api_group = Some(String::new()),
                "User" | "Group" => s.api_group = Some(GROUP.into()),
                _ => {}
            }
        }
    }
}

// ---- validation ----

/// `path.IsValidPathSegmentName` (and its prefix form).
pub fn name_is_path_segment(name: &str, prefix: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !prefix && (name == "." || name == "..") {
        out.push(format!("may not be '{name}'"));
        return out;
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            out.push(format!("may not contain '{bad}'"));
        }
    }
    out
}

fn list_value(v: &[String]) -> String {
    format!(
        "[]string{{{}}}",
        v.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")
    )
}

fn validate_policy_rule(rule: &PolicyRule, namespaced: bool, path: &Path) -> ErrorList {
    let mut errs = Vec::new();
    if rule.verbs.is_empty() {
        errs.push(FieldError::required(
            path.child("verbs"),
            "verbs must contain at least one value",
        ));
    }
    let urls = rule.non_resource_urls.as_deref().unwrap_or_default();
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    let resources = rule.resources.as_deref().unwrap_or_default();
    let names = rule.resource_names.as_deref().unwrap_or_default();
    if !urls.is_empty() {
        if namespaced {
            errs.push(FieldError::invalid(
                path.child("nonResourceURLs"),
                list_value(urls),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if !groups.is_empty() || !resources.is_empty() || !names.is_empty() {
            errs.push(FieldError::invalid(
                path.child("nonResourceURLs"),
                list_value(urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return errs;
    }
    if groups.is_empty() {
        errs.push(FieldError::required(
            path.child("apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if resources.is_empty() {
        errs.push(FieldError::required(
            path.child("resources"),
            "resource rules must supply at least one resource",
        ));
    }
    errs
}

fn meta_errors<'a>(
    new: &'a ObjectMeta,
    old: Option<&'a ObjectMeta>,
    namespaced: bool,
) -> ErrorList {
    let mp = Path::new("metadata");
    match old {
        None => validate_object_meta(new, namespaced, name_is_path_segment, &mp),
        Some(o) => validate_object_meta_update(new, o, &mp),
    }
}

fn rules_errors(rules: &Option<Vec<PolicyRule>>, namespaced: bool) -> ErrorList {
    let p = Path::new("rules");
    rules
        .iter()
        .flatten()
        .enumerate()
        .flat_map(|(i, r)| validate_policy_rule(r, namespaced, &p.index(i)))
        .collect()
}

pub fn validate_role(r: &Role, old: Option<&Role>) -> ErrorList {
    let mut errs = meta_errors(&r.metadata, old.map(|o| &o.metadata), true);
    errs.extend(rules_errors(&r.rules, true));
    errs
}

pub fn validate_cluster_role(r: &ClusterRole, old: Option<&ClusterRole>) -> ErrorList {
    let mut errs = meta_errors(&r.metadata, old.map(|o| &o.metadata), false);
    errs.extend(rules_errors(&r.rules, false));
    if let Some(agg) = &r.aggregation_rule {
        let p = Path::new("aggregationRule").child("clusterRoleSelectors");
        let sels = agg.cluster_role_selectors.as_deref().unwrap_or_default();
        if sels.is_empty() {
            errs.push(FieldError::required(
                p.clone(),
                "at least one clusterRoleSelector required if aggregationRule is non-nil",
            ));
        }
        for (i, s) in sels.iter().enumerate() {
            errs.extend(validate_label_selector(Some(s), &p.index(i)));
        }
    }
    errs
}

fn role_ref_errors(r: &RoleRef, kinds: &[&str]) -> ErrorList {
    let mut errs = Vec::new();
    let p = Path::new("roleRef");
    let group = r.api_group.as_deref().unwrap_or("");
    if group != GROUP {
        errs.push(FieldError::not_supported(
            p.child("apiGroup"),
            group,
            &[GROUP],
        ));
    }
    if !kinds.contains(&r.kind.as_str()) {
        errs.push(FieldError::not_supported(p.child("kind"), &r.kind, kinds));
    }
    if r.name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    } else {
        for m in name_is_path_segment(&r.name, false) {
            errs.push(FieldError::invalid_str(p.child("name"), &r.name, m));
        }
    }
    errs
}

fn subject_errors(s: &Subject, namespaced: bool, p: &Path) -> ErrorList {
    let mut errs = Vec::new();
    if s.name.is_empty() {
        errs.push(FieldError::required(p.child("name"), ""));
    }
    let group = s.api_group.as_deref().unwrap_or("");
    match s.kind.as_str() {
        "ServiceAccount" => {
            if !s.name.is_empty() {
                for m in is_dns1123_subdomain(&s.name) {
                    errs.push(FieldError::invalid_str(p.child("name"), &s.name, m));
                }
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(p.child("apiGroup"), group, &[""]));
            }
            if !namespaced && s.namespace.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required(p.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                errs.push(FieldError::not_supported(
                    p.child("apiGroup"),
                    group,
                    &[GROUP],
                ));
            }
        }
        k => errs.push(FieldError::not_supported(
            p.child("kind"),
            k,
            &["ServiceAccount", "User", "Group"],
        )),
    }
    errs
}

fn binding_errors(
    role_ref: &RoleRef,
    subjects: &Option<Vec<Subject>>,
    old_ref: Option<&RoleRef>,
    kinds: &[&str],
    namespaced: bool,
) -> ErrorList {
    let mut errs = role_ref_errors(role_ref, kinds);
    let p = Path::new("subjects");
    for (i, s) in subjects.iter().flatten().enumerate() {
        errs.extend(subject_errors(s, namespaced, &p.index(i)));
    }
    if let Some(o) = old_ref
        && o != role_ref
    {
        errs.push(FieldError::invalid(
            Path::new("roleRef"),
            format!(
                "rbac.RoleRef{{APIGroup:{}, Kind:{}, Name:{}}}",
                quote(role_ref.api_group.as_deref().unwrap_or("")),
                quote(&role_ref.kind),
                quote(&role_ref.name)
            ),
            "cannot change roleRef",
        ));
    }
    errs
}

pub fn validate_role_binding(b: &RoleBinding, old: Option<&RoleBinding>) -> ErrorList {
    let mut errs = meta_errors(&b.metadata, old.map(|o| &o.metadata), true);
    errs.extend(binding_errors(
        &b.role_ref,
        &b.subjects,
        old.map(|o| &o.role_ref),
        &["Role", "ClusterRole"],
        true,
    ));
    errs
}

pub fn validate_cluster_role_binding(
    b: &ClusterRoleBinding,
    old: Option<&ClusterRoleBinding>,
) -> ErrorList {
    let mut errs = meta_errors(&b.metadata, old.map(|o| &o.metadata), false);
    errs.extend(binding_errors(
        &b.role_ref,
        &b.subjects,
        old.map(|o| &o.role_ref),
        &["ClusterRole"],
        false,
    ));
    errs
}

// ---- printing ----

pub fn role_columns() -> Vec<Column> {
    vec![Column::name_column(), col("Created At", "date", CREATED, 0)]
}

pub fn role_row(meta: &ObjectMeta, _now: Timestamp) -> Vec<Value> {
    let created = meta
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    vec![
        Value::String(meta.name.clone().unwrap_or_default()),
        Value::String(created),
    ]
}

pub fn binding_columns() -> Vec<Column> {
    vec![
        Column::name_column(),
        col(
            "Role",
            "string",
            "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error. This field is immutable.",
            0,
        ),
        col("Age", "string", CREATED, 0),
        col("Users", "string", "Users in the roleBinding", 1),
        col("Groups", "string", "Groups in the roleBinding", 1),
        col(
            "ServiceAccounts",
            "string",
            "ServiceAccounts in the roleBinding",
            1,
        ),
    ]
}

pub fn binding_row(
    meta: &ObjectMeta,
    role_ref: &RoleRef,
    subjects: &Option<Vec<Subject>>,
    now: Timestamp,
) -> Vec<Value> {
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for s in subjects.iter().flatten() {
        match s.kind.as_str() {
            "User" => users.push(s.name.clone()),
            "Group" => groups.push(s.name.clone()),
            "ServiceAccount" => sas.push(format!(
                "{}/{}",
                s.namespace.as_deref().unwrap_or(""),
                s.name
            )),
            _ => {}
        }
    }
    vec![
        Value::String(meta.name.clone().unwrap_or_default()),
        Value::String(format!("{}/{}", role_ref.kind, role_ref.name)),
        Value::String(crate::printers::since(
            meta.creation_timestamp.as_ref().map(|t| t.0),
            now,
        )),
        Value::String(users.join(", ")),
        Value::String(groups.join(", ")),
        Value::String(sas.join(", ")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(errs: &ErrorList) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect()
    }

    fn role(json: serde_json::Value) -> Role {
        serde_json::from_value(json).expect("role")
    }

    #[test]
    fn role_rules() {
        let ok = role(
            serde_json::json!({"metadata": {"name": "r", "namespace": "d"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        );
        assert!(validate_role(&ok, None).is_empty());
        let bad = role(
            serde_json::json!({"metadata": {"name": "a/b", "namespace": "d"},
            "rules": [{"verbs": [], "apiGroups": [], "resources": []},
                      {"verbs": ["get"], "nonResourceURLs": ["/x"]}]}),
        );
        assert_eq!(
            fields(&validate_role(&bad, None)),
            [
                "metadata.name: may not contain '/'",
                "rules[0].verbs: verbs must contain at least one value",
                "rules[0].apiGroups: resource rules must supply at least one api group",
                "rules[0].resources: resource rules must supply at least one resource",
                "rules[1].nonResourceURLs: namespaced rules cannot apply to non-resource URLs",
            ]
        );
        let cr: ClusterRole =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "system:x"},
            "rules": [{"verbs": ["get"], "nonResourceURLs": ["/x"], "resources": ["pods"]}],
            "aggregationRule": {"clusterRoleSelectors": []}}))
            .expect("cr");
        assert_eq!(
            fields(&validate_cluster_role(&cr, None)),
            [
                "rules[0].nonResourceURLs: rules cannot apply to both regular resources and non-resource URLs",
                "aggregationRule.clusterRoleSelectors: at least one clusterRoleSelector required if aggregationRule is non-nil",
            ]
        );
    }

    #[test]
    fn bindings() {
        let mut b: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b", "namespace": "d", "resourceVersion": "1"},
            "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader"}, {"kind": "User", "name": "jane"}]}))
        .expect("rb");
        default_binding(&mut b.role_ref, &mut b.subjects);
        assert_eq!(b.role_ref.api_group.as_deref(), Some(GROUP));
        let subjects = b.subjects.clone().unwrap_or_default();
        assert_eq!(subjects[0].api_group.as_deref(), Some(""));
        assert_eq!(subjects[1].api_group.as_deref(), Some(GROUP));
        assert!(validate_role_binding(&b, None).is_empty());
        let mut changed = b.clone();
        changed.role_ref.name = "edit".into();
        assert_eq!(
            fields(&validate_role_binding(&changed, Some(&b))),
            ["roleRef: cannot change roleRef"]
        );
        let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader"}, {"kind": "Robot", "name": "r"}]}))
        .expect("crb");
        assert_eq!(
            fields(&validate_cluster_role_binding(&crb, None)),
            [
                "roleRef.kind: supported values: \"ClusterRole\"",
                "subjects[0].namespace: ",
                "subjects[1].kind: supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
        let row = binding_row(&b.metadata, &b.role_ref, &b.subjects, Timestamp::now());
        assert_eq!(row[1], "ClusterRole/view");
        assert_eq!(row[3], "jane");
        assert_eq!(row[5], "/reader");
    }
}
