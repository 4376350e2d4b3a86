//! Admission: changes and checks a write goes through after defaulting and before validation,
//! as kube-apiserver's admission chain. The decisions are pure ([`serviceaccount`]); this module
//! feeds them from the watch cache and words refusals as upstream's `admission.NewForbidden`.

pub mod serviceaccount;

use serde_json::{Value, json};

use crate::api::Api;
use crate::status::ApiError;

/// Upstream's admission refusal: `<resource> "<name>" is forbidden: <reason>` (the name is the
/// `generateName` prefix when the object has no name yet).
pub fn forbidden(resource: &str, group: &str, name: &str, reason: &str) -> ApiError {
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let mut details = json!({"name": name, "kind": resource});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError::new(
        403,
        "Forbidden",
        format!("{qualified} \"{name}\" is forbidden: {reason}"),
    )
    .with_details(details)
}

/// The `ServiceAccount` plugin on a pod create: see [`serviceaccount`]. `name` is how the pod
/// is named in a refusal.
pub async fn service_account(
    api: &Api,
    pod: &mut Value,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let sa_name = match serviceaccount::admit(pod) {
        serviceaccount::Step::Done => return Ok(()),
        serviceaccount::Step::Forbidden(reason) => {
            return Err(forbidden("pods", "", name, &reason));
        }
        serviceaccount::Step::LookUp(n) => n,
    };
    let attempts = if sa_name == serviceaccount::DEFAULT_SERVICE_ACCOUNT {
        serviceaccount::DEFAULT_LOOKUP_ATTEMPTS
    } else {
        1
    };
    let interval = std::time::Duration::from_millis(100 + rand::random_range(0..100));
    let mut sa = None;
    for i in 0..attempts {
        if i > 0 {
            tokio::time::sleep(interval).await;
        }
        sa = crate::auth::lookup(api, "", "serviceaccounts", Some(namespace), &sa_name);
        if sa.is_some() {
            break;
        }
    }
    let Some(sa) = sa else {
        return Err(forbidden(
            "pods",
            "",
            name,
            &serviceaccount::not_found_reason(namespace, &sa_name),
        ));
    };
    serviceaccount::admit_with(pod, &sa, &mut crate::objects::random_suffix);
    Ok(())
}
