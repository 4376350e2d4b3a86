//! Authentication, authorization and the identity APIs, on top of the pure cores of
//! [`ferry_auth`]:
//!
//! - who: the admin bearer token (user `admin` in `system:masters`), client certificates the
//!   cluster CA signed (CN = user, O = groups), ServiceAccount JWTs this server signed (checked
//!   against the ServiceAccount and the object they are bound to);
//! - as whom: [`impersonation`] (the `Impersonate-*` headers, each authorized with verb
//!   `impersonate`), a stage of its own between authentication and authorization;
//! - may they: `system:masters`, then the [`node`] authorizer (node agents read only what their
//!   pods reference), then RBAC over the Roles and bindings in the watch cache, with upstream's
//!   403 message;
//! - [`reviews`]: SelfSubjectAccessReview, SubjectAccessReview, LocalSubjectAccessReview,
//!   SelfSubjectRulesReview, SelfSubjectReview, TokenReview and the `serviceaccounts/token`
//!   TokenRequest;
//! - [`escalation`]: no Role or binding grants what its author does not hold;
//! - [`audit`]: the optional `audit.k8s.io/v1` log.

pub mod audit;
pub mod certs;
pub mod escalation;
pub mod impersonation;
pub mod node;
pub mod reviews;

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{Context, Error, Result};
use ferry_auth::jwt::{self, Signer, Verifier};
use ferry_auth::rbac::{Decision, Policy};
use ferry_auth::{Attributes, UserInfo};
use http::header;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::api::Api;
use crate::status::ApiError;

/// The admin token's user.
pub const ADMIN_USER: &str = "admin";

/// A client certificate's identity, put on each request of its connection.
#[derive(Debug, Clone)]
pub struct PeerUser(pub UserInfo);

/// The authenticated user of a request (request extension).
#[derive(Debug, Clone)]
pub struct RequestUser(pub UserInfo);

type PolicyKey = Vec<(usize, i64)>;

/// The API server's authentication and authorization state.
pub struct Auth {
    signer: Signer,
    verifier: Verifier,
    /// `--service-account-issuer`.
    pub issuer: String,
    /// `--api-audiences` (default: the issuer).
    pub audiences: Vec<String>,
    policy: Mutex<Option<(PolicyKey, Arc<Policy>)>>,
    pub audit: Option<audit::AuditLog>,
    /// The Node authorizer (before RBAC, as upstream's `--authorization-mode=Node,RBAC`).
    pub node: node::NodeAuthorizer,
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Why a ServiceAccount token is refused (upstream's texts).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Jwt(#[from] jwt::Error),
    #[error("{what} {object} has been deleted")]
    Deleted { what: &'static str, object: String },
    #[error("{what} UID ({got}) does not match claim ({claim})")]
    UidMismatch {
        what: &'static str,
        got: String,
        claim: String,
    },
    #[error("service account token has been invalidated")]
    Invalidated,
}

impl Auth {
    /// Loads (or creates, mode 0600) the ServiceAccount signing key `pki/sa.key` in `data_dir`.
    pub fn load(data_dir: &Path, audit_log: Option<&Path>) -> Result<Auth> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("sa.key");
        if !path.exists() {
            let pem = Signer::generate_pem()?;
            write_private(&path, &pem)?;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!("{} had mode {mode:o}; setting 0600", path.display());
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
        }
        let pem = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let signer = Signer::from_pem(&pem).with_context(|| path.display().to_string())?;
        let audit = audit_log.map(audit::AuditLog::open).transpose()?;
        Ok(Auth {
            verifier: signer.verifier(),
            signer,
            issuer: jwt::DEFAULT_ISSUER.into(),
            audiences: vec![jwt::DEFAULT_ISSUER.into()],
            policy: Mutex::new(None),
            audit,
            node: node::NodeAuthorizer::default(),
        })
    }

    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// The RBAC objects in the cache, rebuilt only when one of them changed.
    pub fn policy(&self, api: &Api) -> Arc<Policy> {
        let plurals = [
            "clusterroles",
            "roles",
            "clusterrolebindings",
            "rolebindings",
        ];
        let mut lists = Vec::new();
        let mut key = Vec::new();
        for p in plurals {
            let items = api
                .resource(ferry_auth::rbac::GROUP, "v1", p)
                .and_then(|r| api.cache.resource(&r.prefix).map(|c| c.list(&r.prefix)))
                .unwrap_or_default();
            key.push((
                items.len(),
                items.iter().map(|o| o.revision).max().unwrap_or(0),
            ));
            lists.push(items);
        }
        let mut slot = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, p)) = slot.as_ref()
            && *k == key
        {
            return p.clone();
        }
        fn typed<T: DeserializeOwned>(items: &[Arc<crate::cache::CachedObject>]) -> Vec<T> {
            items.iter().filter_map(|o| o.typed()).collect()
        }
        let policy = Arc::new(Policy::new(
            typed(&lists[0]),
            typed(&lists[1]),
            typed(&lists[2]),
            typed(&lists[3]),
        ));
        *slot = Some((key, policy.clone()));
        policy
    }

    pub fn authorize(&self, api: &Api, a: &Attributes) -> Decision {
        if a.user.in_group(ferry_auth::user::SYSTEM_MASTERS) {
            return Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        // Node, then RBAC, as upstream's union authorizer: the first to allow wins; the reasons
        // of those without an opinion are joined for the 403 message.
        let node = self.node.authorize(api, a);
        if let Some(d) = &node
            && d.allowed
        {
            return Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        let mut rbac = ferry_auth::rbac::decide(&self.policy(api), a);
        if !rbac.allowed
            && let Some(d) = node.filter(|d| !d.reason.is_empty())
        {
            rbac.reason = if rbac.reason.is_empty() {
                d.reason
            } else {
                format!("{}\n{}", d.reason, rbac.reason)
            };
        }
        rbac
    }

    /// Checks a ServiceAccount token: signature, issuer, time, audience (one of `audiences`),
    /// then that its ServiceAccount and bound object still exist with the UIDs it names.
    pub fn verify_service_account_token(
        &self,
        api: &Api,
        token: &str,
        audiences: &[String],
    ) -> Result<jwt::Claims, TokenError> {
        let now = jiff::Timestamp::now().as_second();
        let claims = self.verifier.verify(token, now, &self.issuer, audiences)?;
        let k = &claims.kubernetes;
        let ns = k.namespace.as_str();
        let check =
            |plural: &str, name: &str, uid: &str, what: &'static str| -> Result<(), TokenError> {
                let obj = lookup(
                    api,
                    "",
                    plural,
                    Some(ns).filter(|_| plural != "nodes"),
                    name,
                )
                .ok_or_else(|| TokenError::Deleted {
                    what,
                    object: format!("{ns}/{name}"),
                })?;
                let got = obj
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !uid.is_empty() && got != uid {
                    return Err(TokenError::UidMismatch {
                        what,
                        got: got.to_string(),
                        claim: uid.to_string(),
                    });
                }
                if let Some(ts) = obj
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    && let Ok(t) = ts.parse::<jiff::Timestamp>()
                    && t.as_second() < now - 60
                {
                    return Err(TokenError::Invalidated);
                }
                Ok(())
            };
        check(
            "serviceaccounts",
            &k.serviceaccount.name,
            &k.serviceaccount.uid,
            "service account",
        )?;
        if let Some(p) = &k.pod {
            check("pods", &p.name, &p.uid, "pod")?;
        }
        if let Some(s) = &k.secret {
            check("secrets", &s.name, &s.uid, "secret")?;
        }
        Ok(claims)
    }

    /// Who sent `req`: `Ok(None)` without credentials, `Err` with bad ones.
    pub fn authenticate<B>(
        &self,
        api: &Api,
        req: &http::Request<B>,
        admin_token_ok: bool,
    ) -> Result<Option<UserInfo>, Unauthenticated> {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if let Some(token) = bearer {
            if admin_token_ok {
                return Ok(Some(admin_user()));
            }
            if jwt::peek_issuer(token).as_deref() == Some(self.issuer.as_str()) {
                return match self.verify_service_account_token(api, token, &self.audiences) {
                    Ok(c) => Ok(Some(c.user())),
                    Err(e) => {
                        tracing::debug!("service account token refused: {e}");
                        Err(Unauthenticated)
                    }
                };
            }
            return Err(Unauthenticated);
        }
        if let Some(PeerUser(u)) = req.extensions().get::<PeerUser>() {
            return Ok(Some(u.clone()));
        }
        Ok(None)
    }
}

/// Credentials were sent but are not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unauthenticated;

/// The admin token's identity: all-powerful through `system:masters`.
pub fn admin_user() -> UserInfo {
    UserInfo::authenticated(ADMIN_USER, vec![ferry_auth::user::SYSTEM_MASTERS.into()])
}

/// An object from the cache (core group when `group` is empty).
pub fn lookup(api: &Api, group: &str, plural: &str, ns: Option<&str>, name: &str) -> Option<Value> {
    let res = api.resource(group, "v1", plural)?;
    let rc = api.cache.resource(&res.prefix)?;
    rc.get(&res.key(ns, name)).map(|o| o.value())
}

/// A 403 with upstream's message and details.
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let msg = ferry_auth::message::forbidden_message(a, reason);
    let mut details = serde_json::Map::new();
    if a.resource_request {
        if !a.name.is_empty() {
            details.insert("name".into(), json!(a.name));
        }
        if !a.api_group.is_empty() {
            details.insert("group".into(), json!(a.api_group));
        }
        if !a.resource.is_empty() {
            details.insert("kind".into(), json!(a.resource));
        }
    }
    ApiError::new(403, "Forbidden", msg).with_details(Value::Object(details))
}

/// Authenticates and authorizes `req` (401 / 403 as upstream), logs it to the audit log, and
/// answers the identity APIs itself; otherwise hands the request back, carrying its
/// [`RequestUser`], for the REST handlers.
pub async fn admit(
    server: &Arc<crate::server::Server>,
    mut req: http::Request<hyper::body::Incoming>,
) -> Result<http::Request<hyper::body::Incoming>, http::Response<crate::server::Body>> {
    let admin_token_ok = server.authorized(&req);
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let user = match server.auth.authenticate(&server.api, &req, admin_token_ok) {
        Ok(Some(u)) => u,
        _ => {
            if let Some(a) = &server.auth.audit {
                a.unauthenticated(&method, &req);
            }
            return Err(crate::server::error_response(&ApiError::unauthorized()));
        }
    };
    // Impersonation: the request acts as the user its headers name, once each is allowed.
    let (user, impersonator) = match impersonation::impersonate(server, &user, &mut req) {
        Ok(None) => (user, None),
        Ok(Some(as_user)) => (as_user, Some(user)),
        Err(impersonation::Refused::Malformed(e)) => {
            let uri = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| path.clone());
            return Err(impersonation::internal_error(&uri, &e));
        }
        Err(impersonation::Refused::Forbidden(refused)) => {
            let (target, decision) = *refused;
            if let Some(a) = &server.auth.audit {
                let attrs = ferry_auth::attributes::from_request(
                    user.clone(),
                    &method,
                    &path,
                    query.as_deref(),
                );
                a.request(&attrs, None, &req, &decision);
            }
            return Err(crate::server::error_response(&forbidden(
                &target,
                &decision.reason,
            )));
        }
    };
    let attrs =
        ferry_auth::attributes::from_request(user.clone(), &method, &path, query.as_deref());
    let decision = server.auth.authorize(&server.api, &attrs);
    if let Some(a) = &server.auth.audit {
        a.request(&attrs, impersonator.as_ref(), &req, &decision);
    }
    if !decision.allowed {
        return Err(crate::server::error_response(&forbidden(
            &attrs,
            &decision.reason,
        )));
    }
    req.extensions_mut().insert(RequestUser(user));
    reviews::route(server, &attrs, req).await
}

/// The client's address (request extension, set per connection).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// A JSON answer.
pub fn json_reply(code: u16, v: &Value) -> http::Response<crate::server::Body> {
    use http_body_util::BodyExt;
    http::Response::builder()
        .status(http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK))
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            http_body_util::Full::new(bytes::Bytes::from(
                serde_json::to_vec(v).unwrap_or_default(),
            ))
            .boxed(),
        )
        .unwrap_or_else(|_| {
            http::Response::new(http_body_util::Full::new(bytes::Bytes::new()).boxed())
        })
}

/// Creates the default ClusterRoles and ClusterRoleBindings that are missing (upstream's
/// bootstrap policy; existing ones are left as the cluster's owners changed them).
pub async fn bootstrap_policy(api: &Api) -> Result<()> {
    let objects: Vec<(&str, Value)> = ferry_auth::bootstrap::cluster_roles()
        .into_iter()
        .filter_map(|r| serde_json::to_value(r).ok().map(|v| ("clusterroles", v)))
        .chain(
            ferry_auth::bootstrap::cluster_role_bindings()
                .into_iter()
                .filter_map(|b| {
                    serde_json::to_value(b)
                        .ok()
                        .map(|v| ("clusterrolebindings", v))
                }),
        )
        .collect();
    for (plural, mut body) in objects {
        let Some(res) = api.resource(ferry_auth::rbac::GROUP, "v1", plural).cloned() else {
            continue;
        };
        let name = body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(existing) = lookup(api, ferry_auth::rbac::GROUP, plural, None, &name) {
            // Earlier versions' `system:node` read every Secret: bring it to the current rules.
            if plural == "clusterroles"
                && name == "system:node"
                && let Ok(role) = serde_json::from_value(existing)
                && let Some(fixed) = ferry_auth::bootstrap::reconcile_node_role(&role)
                && let Ok(mut body) = serde_json::to_value(fixed)
            {
                body["apiVersion"] = json!(format!("{}/v1", ferry_auth::rbac::GROUP));
                body["kind"] = json!(res.info().kind);
                let p = crate::request::ResourcePath {
                    group: ferry_auth::rbac::GROUP.into(),
                    version: "v1".into(),
                    namespace: None,
                    resource: plural.into(),
                    name: Some(name.clone()),
                    subresource: None,
                };
                match api
                    .update(&res, &p, &crate::request::Query::default(), body)
                    .await
                {
                    Ok(_) => {
                        tracing::info!("updated ClusterRole system:node to this version's rules")
                    }
                    Err(e) => tracing::warn!("updating ClusterRole system:node: {}", e.message),
                }
            }
            continue;
        }
        body["apiVersion"] = json!(format!("{}/v1", ferry_auth::rbac::GROUP));
        body["kind"] = json!(res.info().kind);
        let p = crate::request::ResourcePath {
            group: ferry_auth::rbac::GROUP.into(),
            version: "v1".into(),
            namespace: None,
            resource: plural.into(),
            name: None,
            subresource: None,
        };
        match api
            .create(&res, &p, &crate::request::Query::default(), body)
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => {
                return Err(Error::Bootstrap {
                    what: format!("{plural} {name}"),
                    message: e.message,
                });
            }
        }
    }
    Ok(())
}
