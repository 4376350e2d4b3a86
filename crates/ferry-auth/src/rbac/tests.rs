use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::attributes::Attributes;
use crate::bootstrap;
use crate::user::UserInfo;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: s(verbs),
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        resource_names: (!names.is_empty()).then(|| s(names)),
        non_resource_urls: None,
    }
}

fn url_rule(verbs: &[&str], urls: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: s(verbs),
        non_resource_urls: Some(s(urls)),
        ..Default::default()
    }
}

fn req(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
    Attributes::resource(
        UserInfo::default(),
        verb,
        "ns",
        group,
        "v1",
        resource,
        sub,
        name,
    )
}

#[test]
fn rule_matching_table() {
    let cases: Vec<(PolicyRule, Attributes, bool)> = vec![
        (
            rule(&["get"], &[""], &["pods"], &[]),
            req("get", "", "pods", "", "p"),
            true,
        ),
        (
            rule(&["get"], &[""], &["pods"], &[]),
            req("list", "", "pods", "", ""),
            false,
        ),
        (
            rule(&["*"], &[""], &["pods"], &[]),
            req("delete", "", "pods", "", "p"),
            true,
        ),
        (
            rule(&["get"], &["*"], &["pods"], &[]),
            req("get", "x.io", "pods", "", ""),
            true,
        ),
        (
            rule(&["get"], &["apps"], &["pods"], &[]),
            req("get", "", "pods", "", ""),
            false,
        ),
        (
            rule(&["get"], &[""], &["*"], &[]),
            req("get", "", "pods", "log", "p"),
            true,
        ),
        // A resource does not grant its subresources, and the reverse.
        (
            rule(&["get"], &[""], &["pods"], &[]),
            req("get", "", "pods", "log", "p"),
            false,
        ),
        (
            rule(&["get"], &[""], &["pods/log"], &[]),
            req("get", "", "pods", "log", "p"),
            true,
        ),
        (
            rule(&["get"], &[""], &["pods/log"], &[]),
            req("get", "", "pods", "", "p"),
            false,
        ),
        (
            rule(&["get"], &[""], &["*/log"], &[]),
            req("get", "", "pods", "log", "p"),
            true,
        ),
        (
            rule(&["get"], &[""], &["*/log"], &[]),
            req("get", "", "pods", "status", "p"),
            false,
        ),
        (
            rule(&["get"], &[""], &["*/log"], &[]),
            req("get", "", "pods", "", "p"),
            false,
        ),
        // resourceNames restrict names; an unnamed request (list) does not match them.
        (
            rule(&["get"], &[""], &["secrets"], &["a"]),
            req("get", "", "secrets", "", "a"),
            true,
        ),
        (
            rule(&["get"], &[""], &["secrets"], &["a"]),
            req("get", "", "secrets", "", "b"),
            false,
        ),
        (
            rule(&["list"], &[""], &["secrets"], &["a"]),
            req("list", "", "secrets", "", ""),
            false,
        ),
        // Resource rules never match non-resource requests and vice versa.
        (
            rule(&["get"], &["*"], &["*"], &[]),
            Attributes::non_resource(UserInfo::default(), "get", "/api"),
            false,
        ),
        (
            url_rule(&["get"], &["/api"]),
            Attributes::non_resource(UserInfo::default(), "get", "/api"),
            true,
        ),
        (
            url_rule(&["get"], &["/api"]),
            Attributes::non_resource(UserInfo::default(), "get", "/api/v1"),
            false,
        ),
        (
            url_rule(&["get"], &["/api/*"]),
            Attributes::non_resource(UserInfo::default(), "get", "/api/v1"),
            true,
        ),
        (
            url_rule(&["get"], &["/api*"]),
            Attributes::non_resource(UserInfo::default(), "get", "/apis"),
            true,
        ),
        (
            url_rule(&["get"], &["*"]),
            Attributes::non_resource(UserInfo::default(), "get", "/x"),
            true,
        ),
        (
            url_rule(&["post"], &["*"]),
            Attributes::non_resource(UserInfo::default(), "get", "/x"),
            false,
        ),
        (
            url_rule(&["get"], &["/api"]),
            req("get", "", "pods", "", ""),
            false,
        ),
    ];
    for (i, (r, a, want)) in cases.iter().enumerate() {
        assert_eq!(rule_allows(a, r), *want, "case {i}: {r:?} vs {a:?}");
    }
}

fn meta(ns: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(String::from),
        ..Default::default()
    }
}

fn subject(kind: &str, name: &str, ns: Option<&str>) -> Subject {
    Subject {
        kind: kind.into(),
        name: name.into(),
        namespace: ns.map(String::from),
        api_group: None,
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: Some(GROUP.into()),
        kind: kind.into(),
        name: name.into(),
    }
}

fn policy() -> Policy {
    let mut crs: Vec<ClusterRole> = bootstrap::cluster_roles();
    crs.push(ClusterRole {
        metadata: meta(None, "pod-reader"),
        rules: Some(vec![rule(&["get", "list"], &[""], &["pods"], &[])]),
        aggregation_rule: None,
    });
    let crs = bootstrap::aggregate_all(crs);
    let mut crbs = bootstrap::cluster_role_bindings();
    crbs.push(ClusterRoleBinding {
        metadata: meta(None, "broken"),
        role_ref: role_ref("ClusterRole", "missing"),
        subjects: Some(vec![subject("User", "bob", None)]),
    });
    let rbs = vec![
        RoleBinding {
            metadata: meta(Some("team-a"), "viewers"),
            role_ref: role_ref("ClusterRole", "view"),
            subjects: Some(vec![subject("ServiceAccount", "reader", None)]),
        },
        RoleBinding {
            metadata: meta(Some("team-a"), "cm-writer"),
            role_ref: role_ref("Role", "cm-writer"),
            subjects: Some(vec![subject("Group", "writers", None)]),
        },
        RoleBinding {
            metadata: meta(Some("team-b"), "other-ns-sa"),
            role_ref: role_ref("ClusterRole", "pod-reader"),
            subjects: Some(vec![subject("ServiceAccount", "reader", Some("team-a"))]),
        },
    ];
    let roles = vec![Role {
        metadata: meta(Some("team-a"), "cm-writer"),
        rules: Some(vec![rule(
            &["create", "update"],
            &[""],
            &["configmaps"],
            &[],
        )]),
    }];
    Policy::new(crs, roles, crbs, rbs)
}

fn sa(ns: &str, name: &str) -> UserInfo {
    UserInfo::service_account(ns, name, "")
}

#[test]
fn authorizer_table() {
    let p = policy();
    let reader = sa("team-a", "reader");
    let nobody = sa("team-a", "nobody");
    let admin = UserInfo::authenticated("admin", vec!["system:masters".into()]);
    let writer = UserInfo::authenticated("w", vec!["writers".into()]);
    let at = |u: &UserInfo, verb: &str, ns: &str, g: &str, r: &str, sub: &str, name: &str| {
        Attributes::resource(u.clone(), verb, ns, g, "v1", r, sub, name)
    };
    let cases = vec![
        (at(&reader, "list", "team-a", "", "pods", "", ""), true),
        (at(&reader, "get", "team-a", "", "pods", "log", "p"), true),
        (
            at(&reader, "watch", "team-a", "apps", "deployments", "", ""),
            true,
        ),
        (at(&reader, "get", "team-a", "", "secrets", "", "s"), false),
        (at(&reader, "create", "team-a", "", "pods", "", ""), false),
        (at(&reader, "list", "default", "", "pods", "", ""), false),
        (at(&reader, "list", "", "", "pods", "", ""), false),
        (
            at(&reader, "get", "team-a", "", "namespaces", "", "team-a"),
            true,
        ),
        // A binding in another namespace naming the SA's namespace explicitly.
        (at(&reader, "list", "team-b", "", "pods", "", ""), true),
        (at(&reader, "list", "team-b", "", "services", "", ""), false),
        (at(&nobody, "list", "team-a", "", "pods", "", ""), false),
        (
            at(
                &nobody,
                "create",
                "",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "",
                "",
            ),
            true,
        ),
        (
            at(&writer, "create", "team-a", "", "configmaps", "", ""),
            true,
        ),
        (
            at(&writer, "delete", "team-a", "", "configmaps", "", "x"),
            false,
        ),
        (
            at(&admin, "delete", "kube-system", "", "secrets", "", "x"),
            true,
        ),
    ];
    for (i, (a, want)) in cases.iter().enumerate() {
        assert_eq!(decide(&p, a).allowed, *want, "case {i}: {a:?}");
    }
    let d = decide(
        &p,
        &Attributes::non_resource(nobody.clone(), "get", "/apis"),
    );
    assert!(d.allowed);
    assert_eq!(
        d.reason,
        "RBAC: allowed by ClusterRoleBinding \"system:discovery\" of ClusterRole \"system:discovery\" to Group \"system:authenticated\""
    );
    assert!(!decide(&p, &Attributes::non_resource(nobody, "get", "/metrics")).allowed);
    let d = decide(&p, &at(&reader, "list", "team-a", "", "pods", "", ""));
    assert_eq!(
        d.reason,
        "RBAC: allowed by RoleBinding \"viewers/team-a\" of ClusterRole \"view\" to ServiceAccount \"reader/team-a\""
    );
    // A binding to a missing role is an error in the reason, not an allow.
    let bob = UserInfo::authenticated("bob", vec![]);
    let d = decide(&p, &at(&bob, "get", "", "", "nodes", "", "n"));
    assert_eq!(
        d,
        Decision {
            allowed: false,
            reason: "RBAC: clusterrole.rbac.authorization.k8s.io \"missing\" not found".into()
        }
    );
}

#[test]
fn rules_for_lists_every_binding() {
    let p = policy();
    let (rules, errors) = p.rules_for(&sa("team-a", "reader"), "team-a");
    assert!(errors.is_empty());
    assert!(rules.iter().any(|r| {
        r.resources
            .as_deref()
            .unwrap_or_default()
            .contains(&"pods/log".to_string())
    }));
    assert!(rules.iter().any(|r| {
        r.non_resource_urls
            .as_deref()
            .unwrap_or_default()
            .contains(&"/version".to_string())
    }));
    let (rules_b, _) = p.rules_for(&sa("team-a", "reader"), "team-b");
    assert!(rules_b.len() < rules.len());
}

#[test]
fn covers_table() {
    let owner = vec![
        rule(&["get", "list"], &[""], &["pods", "*/status"], &[]),
        rule(&["*"], &["apps"], &["deployments"], &["web"]),
        url_rule(&["get"], &["/healthz", "/api/*"]),
    ];
    let cases = vec![
        (rule(&["get"], &[""], &["pods"], &[]), true),
        (rule(&["get", "list"], &[""], &["pods"], &["x"]), true),
        (rule(&["watch"], &[""], &["pods"], &[]), false),
        (rule(&["get"], &[""], &["pods/log"], &[]), false),
        (rule(&["get"], &[""], &["services/status"], &[]), true),
        (rule(&["get"], &["*"], &["pods"], &[]), false),
        (
            rule(&["delete"], &["apps"], &["deployments"], &["web"]),
            true,
        ),
        (rule(&["delete"], &["apps"], &["deployments"], &[]), false),
        (url_rule(&["get"], &["/api/v1"]), true),
        (url_rule(&["get"], &["/apis"]), false),
        (url_rule(&["post"], &["/healthz"]), false),
    ];
    for (i, (r, want)) in cases.iter().enumerate() {
        assert_eq!(
            covers(&owner, std::slice::from_ref(r)).0,
            *want,
            "case {i}: {r:?}"
        );
    }
    // cluster-admin covers everything.
    let all = vec![rule(&["*"], &["*"], &["*"], &[]), url_rule(&["*"], &["*"])];
    for (r, _) in &cases {
        assert!(covers(&all, std::slice::from_ref(r)).0);
    }
}

#[test]
fn escalation_message() {
    let p = policy();
    let reader = sa("team-a", "reader");
    assert!(
        confirm_no_escalation(
            &p,
            &reader,
            "team-a",
            &[rule(&["get"], &[""], &["pods"], &[])]
        )
        .is_ok()
    );
    let err = confirm_no_escalation(
        &p,
        &reader,
        "team-a",
        &[
            rule(&["get", "list"], &[""], &["secrets"], &[]),
            rule(&["get"], &[""], &["pods"], &[]),
        ],
    )
    .expect_err("escalation");
    assert_eq!(
        err.to_string(),
        "user \"system:serviceaccount:team-a:reader\" (groups=[\"system:serviceaccounts\" \"system:serviceaccounts:team-a\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}"
    );
}

mod props {
    use proptest::prelude::*;

    use super::*;

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            Just("".to_string()),
            Just("pods".to_string()),
            Just("pods/log".to_string()),
            Just("*/log".to_string()),
            Just("get".to_string()),
            Just("list".to_string()),
            Just("apps".to_string()),
            Just("a".to_string()),
        ]
    }

    fn any_rule() -> impl Strategy<Value = PolicyRule> {
        (
            prop::collection::vec(word(), 1..3),
            prop::collection::vec(word(), 1..3),
            prop::collection::vec(word(), 1..3),
            prop::collection::vec(word(), 0..2),
        )
            .prop_map(|(verbs, groups, resources, names)| PolicyRule {
                verbs,
                api_groups: Some(groups),
                resources: Some(resources),
                resource_names: Some(names),
                non_resource_urls: None,
            })
    }

    proptest! {
        /// Every rule covers itself, and whatever a covered rule allows, its owner allows.
        #[test]
        fn covered_rules_allow_no_more(owner in any_rule(), servant in any_rule(),
                                       verb in word(), group in word(), res in word(), name in word()) {
            prop_assert!(covers(std::slice::from_ref(&owner), std::slice::from_ref(&owner)).0);
            if covers(std::slice::from_ref(&owner), std::slice::from_ref(&servant)).0 {
                let (r, sub) = match res.split_once('/') {
                    Some((r, s)) => (r.to_string(), s.to_string()),
                    None => (res.clone(), String::new()),
                };
                let a = Attributes::resource(UserInfo::default(), &verb, "ns", &group, "v1", &r, &sub, &name);
                if rule_allows(&a, &servant) {
                    prop_assert!(rule_allows(&a, &owner), "{owner:?} covers {servant:?} but not {a:?}");
                }
            }
        }
    }
}
