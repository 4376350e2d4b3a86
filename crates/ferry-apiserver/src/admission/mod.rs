//! Admission: changes and checks a write goes through after defaulting and before validation,
//! as kube-apiserver's admission chain. The decisions are pure ([`serviceaccount`]); this module
//! feeds them from the watch cache and words refusals as upstream's `admission.NewForbidden`.

pub mod defaults;
pub mod noderestriction;
pub mod serviceaccount;
pub mod storage;

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

/// `DefaultIngressClass` on an Ingress create, with the IngressClasses of the watch cache.
pub fn default_ingress_class(api: &Api, ingress: &mut Value) {
    let classes: Vec<Value> = api
        .resource("networking.k8s.io", "v1", "ingressclasses")
        .and_then(|r| api.cache.resource(&r.prefix).map(|c| c.list(&r.prefix)))
        .unwrap_or_default()
        .iter()
        .map(|o| o.value())
        .collect();
    defaults::ingress_class(ingress, &classes);
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

/// The `NodeRestriction` plugin on a write by a node agent (see [`noderestriction`]); other
/// users and reads pass.
pub async fn node_restriction(
    api: &Api,
    who: &crate::auth::escalation::Who,
    res: &crate::api::Resource,
    rp: &crate::request::ResourcePath,
    method: &http::Method,
    content_type: &str,
    body: &bytes::Bytes,
) -> Result<(), ApiError> {
    use noderestriction::Operation;
    let Some(user) = who.user.as_ref() else {
        return Ok(());
    };
    let Some(node) = noderestriction::node_of(&user.name, &user.groups) else {
        return Ok(());
    };
    let operation = match *method {
        http::Method::POST => Operation::Create,
        http::Method::PUT | http::Method::PATCH => Operation::Update,
        http::Method::DELETE => Operation::Delete,
        _ => return Ok(()),
    };
    let info = res.info();
    let object = if matches!(*method, http::Method::POST | http::Method::PUT) {
        crate::body::decode(content_type, body).ok()
    } else {
        None
    };
    let name = rp
        .name
        .clone()
        .or_else(|| {
            object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let namespace = rp.namespace.clone().unwrap_or_default();
    let subresource = rp.subresource.clone().unwrap_or_default();
    let existing = match (info.group, info.plural, subresource.as_str()) {
        ("", "pods", _) if !name.is_empty() => {
            crate::auth::lookup(api, "", "pods", Some(&namespace), &name)
        }
        ("", "serviceaccounts", "token") => object
            .as_ref()
            .and_then(|o| o.pointer("/spec/boundObjectRef/name"))
            .and_then(Value::as_str)
            .and_then(|pod| crate::auth::lookup(api, "", "pods", Some(&namespace), pod)),
        _ => None,
    };
    let write = noderestriction::Write {
        node: &node,
        operation,
        group: info.group,
        resource: info.plural,
        subresource: &subresource,
        namespace: &namespace,
        name: &name,
        object: object.as_ref(),
        existing: existing.as_ref(),
    };
    noderestriction::decide(&write)
        .map_err(|reason| forbidden(info.plural, info.group, &name, &reason.0))
}

/// `DefaultStorageClass` and `StorageObjectInUseProtection` on a claim create (see
/// [`storage`]): the StorageClasses come from the watch cache.
pub fn persistent_volume_claim(api: &Api, claim: &mut Value) {
    let classes: Vec<Value> = api
        .resource("storage.k8s.io", "v1", "storageclasses")
        .and_then(|res| {
            let rc = api.cache.resource(&res.prefix)?;
            Some(rc.list(&res.prefix).iter().map(|o| o.value()).collect())
        })
        .unwrap_or_default();
    storage::admit_claim_class(claim, &classes);
    storage::add_finalizer(claim, storage::PVC_PROTECTION);
}
