//! Upstream's message texts: Go's `%q` quoting and the authorizer's forbidden message.

use crate::attributes::Attributes;

/// A string as Go's `%q` prints it (for the names and paths that occur in messages, JSON string
/// escaping gives the same text).
pub fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// A string slice as Go's `%q` prints it: `["a" "b"]`.
pub fn go_quote_list(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter().map(|s| go_quote(s)).collect::<Vec<_>>().join(" ")
    )
}

/// What the user may not do, as upstream's `forbiddenMessage`.
pub fn forbidden_reason(a: &Attributes) -> String {
    let user = go_quote(&a.user.name);
    if !a.resource_request {
        return format!("User {user} cannot {} path {}", a.verb, go_quote(&a.path));
    }
    let resource = go_quote(&a.combined_resource());
    if a.namespace.is_empty() {
        format!(
            "User {user} cannot {} resource {resource} in API group {} at the cluster scope",
            a.verb,
            go_quote(&a.api_group)
        )
    } else {
        format!(
            "User {user} cannot {} resource {resource} in API group {} in the namespace {}",
            a.verb,
            go_quote(&a.api_group),
            go_quote(&a.namespace)
        )
    }
}

/// The whole `Status` message of a 403 as upstream's `responsewriters.Forbidden` builds it:
/// `<resource>[.<group>] ["<name>"] is forbidden: <reason>[: <authorizer reason>]`, or
/// `forbidden: ...` for non-resource requests.
pub fn forbidden_message(a: &Attributes, authorizer_reason: &str) -> String {
    let mut err = forbidden_reason(a);
    if !authorizer_reason.is_empty() {
        err = format!("{err}: {authorizer_reason}");
    }
    forbidden_status_message(&a.api_group, &a.resource, &a.name, &err)
}

/// `apierrors.NewForbidden(group resource, name, err)`'s message.
pub fn forbidden_status_message(group: &str, resource: &str, name: &str, err: &str) -> String {
    let gr = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    if gr.is_empty() {
        format!("forbidden: {err}")
    } else if name.is_empty() {
        format!("{gr} is forbidden: {err}")
    } else {
        format!("{gr} {} is forbidden: {err}", go_quote(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user::UserInfo;

    #[test]
    fn messages_as_upstream() {
        let u = UserInfo::service_account("team-a", "reader", "");
        let a = Attributes::resource(u.clone(), "list", "team-a", "", "v1", "secrets", "", "");
        assert_eq!(
            forbidden_message(&a, ""),
            "secrets is forbidden: User \"system:serviceaccount:team-a:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        );
        let a = Attributes::resource(
            u.clone(),
            "get",
            "",
            "apps",
            "v1",
            "deployments",
            "scale",
            "web",
        );
        assert_eq!(
            forbidden_message(&a, ""),
            "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:team-a:reader\" cannot get resource \"deployments/scale\" in API group \"apps\" at the cluster scope"
        );
        let a = Attributes::non_resource(u, "get", "/metrics");
        assert_eq!(
            forbidden_message(
                &a,
                "RBAC: clusterrole.rbac.authorization.k8s.io \"x\" not found"
            ),
            "forbidden: User \"system:serviceaccount:team-a:reader\" cannot get path \"/metrics\": RBAC: clusterrole.rbac.authorization.k8s.io \"x\" not found"
        );
        assert_eq!(
            go_quote_list(&["a".into(), "b\"".into()]),
            "[\"a\" \"b\\\"\"]"
        );
    }
}
