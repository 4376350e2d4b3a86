//! The identity APIs: `authorization.k8s.io/v1` SelfSubjectAccessReview, SubjectAccessReview,
//! LocalSubjectAccessReview, SelfSubjectRulesReview; `authentication.k8s.io/v1`
//! SelfSubjectReview and TokenReview; and the `serviceaccounts/<name>/token` TokenRequest.
//! All are create-only and stored nowhere (TokenRequest mints a JWT).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use ferry_auth::jwt::{Claims, ObjectRef};
use ferry_auth::rbac::Decision;
use ferry_auth::{Attributes, UserInfo};
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::{RequestUser, lookup};
use crate::server::{Body, Server, error_response};
use crate::status::ApiError;

const MAX_REVIEW_BODY: usize = 1024 * 1024;
/// Upstream's default TokenRequest lifetime, minimum, and the kubelet's "warn only" lifetime that
/// is extended to a year for pod-bound tokens of the API audiences.
const DEFAULT_EXPIRATION: i64 = 3600;
const MIN_EXPIRATION: i64 = 600;
const MAX_EXPIRATION: i64 = 1 << 32;
const WARN_ONLY_EXPIRATION: i64 = 3607;
const EXTENDED_EXPIRATION: i64 = 24 * 365 * 60 * 60;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Review {
    SelfSubjectAccess,
    SubjectAccess,
    LocalSubjectAccess,
    SelfSubjectRules,
    SelfSubject,
    Token,
    TokenRequest,
}

/// The review kinds (for discovery): (group, plural, kind, namespaced); the same table the
/// OpenAPI documents are built from.
pub const VIRTUAL: &[(&str, &str, &str, bool)] = ferry_openapi::REVIEWS;

fn which(a: &Attributes) -> Option<Review> {
    if !a.resource_request || a.api_version != "v1" {
        return None;
    }
    let r = match (
        a.api_group.as_str(),
        a.resource.as_str(),
        a.subresource.as_str(),
    ) {
        ("", "serviceaccounts", "token") if !a.name.is_empty() => Review::TokenRequest,
        ("authorization.k8s.io", "selfsubjectaccessreviews", "") => Review::SelfSubjectAccess,
        ("authorization.k8s.io", "subjectaccessreviews", "") => Review::SubjectAccess,
        ("authorization.k8s.io", "localsubjectaccessreviews", "") => Review::LocalSubjectAccess,
        ("authorization.k8s.io", "selfsubjectrulesreviews", "") => Review::SelfSubjectRules,
        ("authentication.k8s.io", "selfsubjectreviews", "") => Review::SelfSubject,
        ("authentication.k8s.io", "tokenreviews", "") => Review::Token,
        _ => return None,
    };
    // Namespaced only where upstream serves them so.
    let ns_ok = match r {
        Review::TokenRequest | Review::LocalSubjectAccess => !a.namespace.is_empty(),
        _ => a.namespace.is_empty(),
    };
    ns_ok.then_some(r)
}

/// Serves the request if it is one of the identity APIs; hands it back otherwise.
pub async fn route(
    server: &Arc<Server>,
    a: &Attributes,
    req: Request<Incoming>,
) -> Result<Request<Incoming>, Response<Body>> {
    let Some(kind) = which(a) else {
        return Ok(req);
    };
    if !a.name.is_empty() && kind != Review::TokenRequest {
        return Err(error_response(&ApiError::method_not_allowed()));
    }
    if req.method() != http::Method::POST {
        return Err(error_response(&ApiError::method_not_allowed()));
    }
    let user = req
        .extensions()
        .get::<RequestUser>()
        .map(|u| u.0.clone())
        .unwrap_or_default();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let body: Bytes = match Limited::new(req.into_body(), MAX_REVIEW_BODY)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return Err(error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
            )));
        }
    };
    let result = match crate::body::decode(&content_type, &body) {
        Err(e) => Err(e),
        Ok(v) => match kind {
            Review::SelfSubjectAccess => access_review(server, &user, v, kind, ""),
            Review::SubjectAccess => access_review(server, &user, v, kind, ""),
            Review::LocalSubjectAccess => access_review(server, &user, v, kind, &a.namespace),
            Review::SelfSubjectRules => rules_review(server, &user, v),
            Review::SelfSubject => Ok(self_subject_review(&user, v)),
            Review::Token => token_review(server, v),
            Review::TokenRequest => token_request(server, &a.namespace, &a.name, v).await,
        },
    };
    Err(match result {
        Ok(v) => super::json_reply(201, &v),
        Err(e) => error_response(&e),
    })
}

fn check_kind(v: &Value, api_version: &str, kind: &str) -> Result<(), ApiError> {
    let av = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(api_version);
    let k = v.get("kind").and_then(Value::as_str).unwrap_or(kind);
    if av != api_version || k != kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({api_version})"
        ))
        .with_details(json!({})));
    }
    Ok(())
}

fn s(v: &Value, ptr: &str) -> String {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn strings(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn invalid(kind: &str, group: &str, field: &str, value: &str, detail: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("{kind}.{group} \"\" is invalid: {field}: Invalid value: {value}: {detail}"),
    )
    .with_details(json!({"group": group, "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": format!("Invalid value: {value}: {detail}"), "field": field}]}))
}

fn meta_of(v: &Value) -> Value {
    let mut m = v.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(o) = &mut m {
        o.insert("creationTimestamp".into(), Value::Null);
    }
    m
}

fn access_review(
    server: &Server,
    requester: &UserInfo,
    v: Value,
    kind: Review,
    url_namespace: &str,
) -> Result<Value, ApiError> {
    let (kind_name, api_group) = match kind {
        Review::SelfSubjectAccess => ("SelfSubjectAccessReview", "authorization.k8s.io"),
        Review::LocalSubjectAccess => ("LocalSubjectAccessReview", "authorization.k8s.io"),
        _ => ("SubjectAccessReview", "authorization.k8s.io"),
    };
    check_kind(&v, "authorization.k8s.io/v1", kind_name)?;
    let spec = v.get("spec").cloned().unwrap_or_else(|| json!({}));
    let ra = spec.get("resourceAttributes").filter(|x| !x.is_null());
    let nra = spec.get("nonResourceAttributes").filter(|x| !x.is_null());
    if ra.is_some() == nra.is_some() {
        return Err(invalid(
            kind_name,
            api_group,
            "spec.resourceAttributes",
            "\"null\"",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    let subject = if kind == Review::SelfSubjectAccess {
        requester.clone()
    } else {
        let name = s(&spec, "/user");
        let groups = strings(&spec, "/groups");
        if name.is_empty() && groups.is_empty() {
            return Err(invalid(
                kind_name,
                api_group,
                "spec.user",
                "\"\"",
                "at least one of user or group must be specified",
            ));
        }
        let mut extra = BTreeMap::new();
        if let Some(Value::Object(m)) = spec.get("extra") {
            for (k, x) in m {
                extra.insert(
                    k.clone(),
                    x.as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|y| y.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default(),
                );
            }
        }
        UserInfo {
            name,
            uid: s(&spec, "/uid"),
            groups,
            extra,
        }
    };
    let attrs = match (ra, nra) {
        (Some(r), _) => {
            let ns = s(r, "/namespace");
            if kind == Review::LocalSubjectAccess && ns != url_namespace {
                return Err(ApiError::bad_request(format!(
                    "spec.resourceAttributes.namespace must match namespace: {url_namespace}"
                )));
            }
            Attributes::resource(
                subject,
                &s(r, "/verb"),
                &ns,
                &s(r, "/group"),
                &s(r, "/version"),
                &s(r, "/resource"),
                &s(r, "/subresource"),
                &s(r, "/name"),
            )
        }
        (None, Some(n)) => {
            if kind == Review::LocalSubjectAccess {
                return Err(invalid(
                    kind_name,
                    api_group,
                    "spec.nonResourceAttributes",
                    "\"non-null\"",
                    "disallowed on this kind of request",
                ));
            }
            Attributes::non_resource(subject, &s(n, "/verb"), &s(n, "/path"))
        }
        (None, None) => return Err(ApiError::bad_request("no attributes")),
    };
    let Decision { allowed, reason } = server.auth.authorize(&server.api, &attrs);
    let mut status = json!({"allowed": allowed});
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    Ok(json!({
        "kind": kind_name, "apiVersion": "authorization.k8s.io/v1",
        "metadata": meta_of(&v), "spec": spec, "status": status,
    }))
}

fn rules_review(server: &Server, user: &UserInfo, v: Value) -> Result<Value, ApiError> {
    check_kind(&v, "authorization.k8s.io/v1", "SelfSubjectRulesReview")?;
    let spec = v.get("spec").cloned().unwrap_or_else(|| json!({}));
    let ns = s(&spec, "/namespace");
    let (rules, errors) = server.auth.policy(&server.api).rules_for(user, &ns);
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for r in &rules {
        let res = r.resources.clone().unwrap_or_default();
        let urls = r.non_resource_urls.clone().unwrap_or_default();
        if !res.is_empty() {
            let mut o = json!({"verbs": r.verbs, "apiGroups": r.api_groups.clone().unwrap_or_default(), "resources": res});
            if let Some(n) = r.resource_names.as_ref().filter(|n| !n.is_empty()) {
                o["resourceNames"] = json!(n);
            }
            resource_rules.push(o);
        }
        if !urls.is_empty() {
            non_resource_rules.push(json!({"verbs": r.verbs, "nonResourceURLs": urls}));
        }
    }
    let mut status = json!({
        "resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
        "incomplete": !errors.is_empty(),
    });
    if !errors.is_empty() {
        status["evaluationError"] = json!(errors.join(", "));
    }
    Ok(json!({
        "kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1",
        "metadata": meta_of(&v), "spec": spec, "status": status,
    }))
}

fn user_info_json(u: &UserInfo) -> Value {
    let mut o = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        o["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        o["extra"] = json!(u.extra);
    }
    o
}

fn self_subject_review(user: &UserInfo, v: Value) -> Value {
    json!({
        "kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
        "metadata": meta_of(&v), "status": {"userInfo": user_info_json(user)},
    })
}

fn token_review(server: &Server, v: Value) -> Result<Value, ApiError> {
    check_kind(&v, "authentication.k8s.io/v1", "TokenReview")?;
    let spec = v.get("spec").cloned().unwrap_or_else(|| json!({}));
    let token = s(&spec, "/token");
    if token.is_empty() {
        return Err(invalid(
            "TokenReview",
            "authentication.k8s.io",
            "spec.token",
            "\"\"",
            "token must not be empty",
        ));
    }
    let wanted = {
        let a = strings(&spec, "/audiences");
        if a.is_empty() {
            server.auth.audiences.clone()
        } else {
            a
        }
    };
    let status = match server
        .auth
        .verify_service_account_token(&server.api, &token, &wanted)
    {
        Ok(c) => {
            let aud: Vec<String> = c
                .aud
                .iter()
                .filter(|a| wanted.contains(a))
                .cloned()
                .collect();
            json!({"authenticated": true, "user": user_info_json(&c.user()), "audiences": aud})
        }
        Err(e) => json!({"user": {}, "error": format!("[invalid bearer token, {e}]")}),
    };
    Ok(json!({
        "kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
        "metadata": meta_of(&v), "spec": spec, "status": status,
    }))
}

fn uid_of(v: &Value) -> String {
    s(v, "/metadata/uid")
}

async fn token_request(
    server: &Server,
    namespace: &str,
    name: &str,
    v: Value,
) -> Result<Value, ApiError> {
    check_kind(&v, "authentication.k8s.io/v1", "TokenRequest")?;
    let api = &server.api;
    // Read what was just written (a pod created a moment ago).
    if let Ok(rev) = api.store.current_revision().await {
        api.cache
            .wait_for(rev, std::time::Duration::from_secs(5))
            .await;
    }
    let mut spec = v.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut audiences = strings(&spec, "/audiences");
    if audiences.is_empty() {
        audiences = server.auth.audiences.clone();
    }
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION,
        Some(x) => x
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    if expiration < MIN_EXPIRATION {
        return Err(invalid(
            "TokenRequest",
            "authentication.k8s.io",
            "spec.expirationSeconds",
            &expiration.to_string(),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > MAX_EXPIRATION {
        return Err(invalid(
            "TokenRequest",
            "authentication.k8s.io",
            "spec.expirationSeconds",
            &expiration.to_string(),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(expiration);
    if spec.get("boundObjectRef").is_some_and(Value::is_null) {
        spec.as_object_mut().map(|o| o.remove("boundObjectRef"));
    }
    let sa_info = ferry_api::kinds::by_resource("", "v1", "serviceaccounts")
        .map(|s| s.info())
        .ok_or_else(|| ApiError::internal("serviceaccounts are not served"))?;
    let sa = lookup(api, "", "serviceaccounts", Some(namespace), name)
        .ok_or_else(|| ApiError::not_found(sa_info, name))?;
    let now = jiff::Timestamp::now().as_second();
    let mut claims = Claims::new(
        &server.auth.issuer,
        audiences.clone(),
        now,
        expiration,
        namespace,
        ObjectRef {
            name: name.into(),
            uid: uid_of(&sa),
        },
    );
    claims.jti = uuid::Uuid::new_v4().to_string();
    if let Some(r) = spec.get("boundObjectRef").cloned() {
        let kind = s(&r, "/kind");
        let api_version = {
            let av = s(&r, "/apiVersion");
            if av.is_empty() { "v1".to_string() } else { av }
        };
        let obj_name = s(&r, "/name");
        let want_uid = s(&r, "/uid");
        let (plural, ns) = match (api_version.as_str(), kind.as_str()) {
            ("v1", "Pod") => ("pods", Some(namespace)),
            ("v1", "Secret") => ("secrets", Some(namespace)),
            ("v1", "Node") => ("nodes", None),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount \"{name}\" to object of type \"{}\"",
                    gvk_string(&api_version, &kind)
                )));
            }
        };
        let info = ferry_api::kinds::by_resource("", "v1", plural)
            .map(|s| s.info())
            .ok_or_else(|| ApiError::internal("bound kind is not served"))?;
        let obj = lookup(api, "", plural, ns, &obj_name)
            .ok_or_else(|| ApiError::not_found(info, &obj_name))?;
        let uid = uid_of(&obj);
        if !want_uid.is_empty() && want_uid != uid {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {kind} \"{obj_name}\": the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            )
            .with_details(json!({"name": obj_name, "kind": kind})));
        }
        let oref = ObjectRef {
            name: obj_name.clone(),
            uid: uid.clone(),
        };
        match plural {
            "pods" => {
                let node = s(&obj, "/spec/nodeName");
                if !node.is_empty() {
                    let node_uid = lookup(api, "", "nodes", None, &node)
                        .map(|n| uid_of(&n))
                        .unwrap_or_default();
                    claims.kubernetes.node = Some(ObjectRef {
                        name: node,
                        uid: node_uid,
                    });
                }
                claims.kubernetes.pod = Some(oref);
                let api_audiences = audiences.iter().all(|a| server.auth.audiences.contains(a));
                if expiration == WARN_ONLY_EXPIRATION && api_audiences {
                    claims.kubernetes.warnafter = Some(now + WARN_ONLY_EXPIRATION);
                    claims.exp = now + EXTENDED_EXPIRATION;
                }
            }
            "secrets" => claims.kubernetes.secret = Some(oref),
            _ => claims.kubernetes.node = Some(oref),
        }
        let mut r = r.clone();
        r["uid"] = json!(uid);
        r["apiVersion"] = json!(api_version);
        spec["boundObjectRef"] = r;
    }
    let token = server
        .auth
        .signer()
        .sign(&claims)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let expires = jiff::Timestamp::from_second(now + expiration)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    let mut meta = meta_of(&v);
    meta["name"] = json!(name);
    meta["namespace"] = json!(namespace);
    Ok(json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": meta, "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

fn gvk_string(api_version: &str, kind: &str) -> String {
    // schema.GroupVersionKind.String(): "group/version, Kind=kind".
    match api_version.split_once('/') {
        Some((g, v)) => format!("{g}/{v}, Kind={kind}"),
        None => format!("/{api_version}, Kind={kind}"),
    }
}
