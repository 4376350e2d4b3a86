//! Privilege-escalation prevention on RBAC writes, as upstream's policy-based storage for
//! roles and bindings: a Role or ClusterRole may only hold rules its author holds (unless the
//! author may `escalate`), a binding may only grant a role whose rules its author holds (unless
//! the author may `bind` it); members of `system:masters` are exempt.

use bytes::Bytes;
use ferry_auth::rbac::{GROUP, confirm_no_escalation};
use ferry_auth::{Attributes, UserInfo};
use http::Method;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role, RoleRef};
use serde_json::{Value, json};

use super::RequestUser;
use crate::api::{Reply, Resource};
use crate::request::{Query, ResourcePath};
use crate::server::Server;
use crate::status::ApiError;

/// Who writes, and the raw query of the request (read before the body is consumed).
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub user: Option<UserInfo>,
    pub raw_query: String,
}

impl Who {
    pub fn of<B>(req: &http::Request<B>) -> Who {
        Who {
            user: req.extensions().get::<RequestUser>().map(|u| u.0.clone()),
            raw_query: req.uri().query().unwrap_or("").to_string(),
        }
    }
}

fn forbidden(plural: &str, name: &str, err: &str) -> ApiError {
    ApiError::new(
        403,
        "Forbidden",
        ferry_auth::message::forbidden_status_message(GROUP, plural, name, err),
    )
    .with_details(json!({"name": name, "group": GROUP, "kind": plural}))
}

/// Refuses the write if it would escalate privileges; `Ok` for everything else.
#[allow(clippy::too_many_arguments)]
pub async fn check(
    server: &Server,
    who: &Who,
    res: &Resource,
    rp: &ResourcePath,
    method: &Method,
    content_type: &str,
    body: &Bytes,
) -> Result<(), ApiError> {
    let info = res.info();
    if info.group != GROUP || rp.subresource.is_some() {
        return Ok(());
    }
    let Some(user) = who.user.as_ref() else {
        return Ok(());
    };
    if user.in_group(ferry_auth::user::SYSTEM_MASTERS) {
        return Ok(());
    }
    let obj = match *method {
        Method::POST | Method::PUT => crate::body::decode(content_type, body)?,
        Method::PATCH => {
            // The object the patch would store: the same patch, dry run.
            let q = Query::parse(Some(&format!("{}&dryRun=All", who.raw_query)));
            match server.api.patch(res, rp, &q, content_type, body).await? {
                Reply::Json { body, .. } => {
                    serde_json::from_slice(&body).map_err(|e| ApiError::internal(e.to_string()))?
                }
                Reply::Stream { .. } => return Ok(()),
            }
        }
        _ => return Ok(()),
    };
    let namespace = rp.namespace.clone().unwrap_or_default();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| rp.name.clone())
        .unwrap_or_default();
    let allowed = |verb: &str, plural: &str, target: &str| {
        let a = Attributes::resource(
            user.clone(),
            verb,
            &namespace,
            GROUP,
            "v1",
            plural,
            "",
            target,
        );
        server.auth.authorize(&server.api, &a).allowed
    };
    let policy = server.auth.policy(&server.api);
    match info.kind {
        "Role" | "ClusterRole" => {
            if allowed("escalate", info.plural, &name) {
                return Ok(());
            }
            let rules: Vec<PolicyRule> = if info.kind == "Role" {
                serde_json::from_value::<Role>(obj)
                    .ok()
                    .and_then(|r| r.rules)
                    .unwrap_or_default()
            } else {
                let cr = serde_json::from_value::<ClusterRole>(obj).ok();
                if cr.as_ref().is_some_and(|c| c.aggregation_rule.is_some()) {
                    return Err(forbidden(
                        info.plural,
                        &name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    ));
                }
                cr.and_then(|c| c.rules).unwrap_or_default()
            };
            confirm_no_escalation(&policy, user, &namespace, &rules)
                .map_err(|e| forbidden(info.plural, &name, &e.to_string()))
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let Some(role_ref) = obj
                .get("roleRef")
                .and_then(|r| serde_json::from_value::<RoleRef>(r.clone()).ok())
            else {
                return Ok(()); // validation refuses it
            };
            let role_plural = if role_ref.kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            if allowed("bind", role_plural, &role_ref.name) {
                return Ok(());
            }
            let rules = policy
                .role_ref_rules(&role_ref, &namespace)
                .map_err(|e| forbidden(info.plural, &name, &e.to_string()))?
                .to_vec();
            confirm_no_escalation(&policy, user, &namespace, &rules)
                .map_err(|e| forbidden(info.plural, &name, &e.to_string()))
        }
        _ => Ok(()),
    }
}
