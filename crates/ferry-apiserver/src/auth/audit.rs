//! The optional audit log (`--audit-log-path`): one `audit.k8s.io/v1` Event per request, as JSON
//! lines at the Metadata level (who, what, from where, the authorization decision; never
//! bodies), in a file of mode 0600.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use crate::error::{Context, Result};
use ferry_auth::rbac::Decision;
use ferry_auth::{Attributes, UserInfo};
use serde_json::{Value, json};

pub struct AuditLog {
    file: Mutex<std::fs::File>,
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

fn user_agent<B>(req: &http::Request<B>) -> Option<String> {
    req.headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

fn user_info(u: &UserInfo) -> Value {
    let mut v = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        v["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        v["extra"] = json!(u.extra);
    }
    v
}

impl AuditLog {
    pub fn open(path: &Path) -> Result<AuditLog> {
        let mut o = std::fs::OpenOptions::new();
        o.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o600);
        }
        let file = o
            .open(path)
            .with_context(|| format!("opening the audit log {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(AuditLog {
            file: Mutex::new(file),
        })
    }

    fn write(&self, event: &Value) {
        let mut line = serde_json::to_vec(event).unwrap_or_default();
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f.write_all(&line) {
            tracing::warn!("audit log: {e}");
        }
    }

    fn base<B>(req: &http::Request<B>, verb: &str, stage: &str) -> Value {
        let uri = req.uri().to_string();
        let ips: Vec<String> = req
            .extensions()
            .get::<super::PeerAddr>()
            .map(|p| vec![p.0.ip().to_string()])
            .unwrap_or_default();
        let mut ev = json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": uuid::Uuid::new_v4().to_string(), "stage": stage,
            "requestURI": uri, "verb": verb,
            "sourceIPs": ips, "requestReceivedTimestamp": now(), "stageTimestamp": now(),
        });
        if let Some(ua) = user_agent(req) {
            ev["userAgent"] = json!(ua);
        }
        ev
    }

    /// An authenticated request with its authorization decision; `impersonator` is the
    /// authenticated user when the request acts as another (`a.user`, the `impersonatedUser`).
    pub fn request<B>(
        &self,
        a: &Attributes,
        impersonator: Option<&UserInfo>,
        req: &http::Request<B>,
        d: &Decision,
    ) {
        let mut ev = Self::base(req, &a.verb, "ResponseStarted");
        match impersonator {
            Some(by) => {
                ev["user"] = user_info(by);
                ev["impersonatedUser"] = user_info(&a.user);
            }
            None => ev["user"] = user_info(&a.user),
        }
        if a.resource_request {
            let mut o = json!({"resource": a.resource, "apiVersion": a.api_version});
            if !a.namespace.is_empty() {
                o["namespace"] = json!(a.namespace);
            }
            if !a.name.is_empty() {
                o["name"] = json!(a.name);
            }
            if !a.api_group.is_empty() {
                o["apiGroup"] = json!(a.api_group);
            }
            if !a.subresource.is_empty() {
                o["subresource"] = json!(a.subresource);
            }
            ev["objectRef"] = o;
        }
        let mut ann = json!({
            "authorization.k8s.io/decision": if d.allowed { "allow" } else { "forbid" },
            "authorization.k8s.io/reason": d.reason,
        });
        if !d.allowed {
            ev["stage"] = json!("ResponseComplete");
            ev["responseStatus"] =
                json!({"metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403});
        } else if let Some(o) = ann.as_object_mut() {
            o.retain(|_, v| v.as_str().is_some_and(|s| !s.is_empty()));
        }
        ev["annotations"] = ann;
        self.write(&ev);
    }

    /// A request whose credentials were missing or refused.
    pub fn unauthenticated<B>(&self, method: &str, req: &http::Request<B>) {
        let mut ev = Self::base(req, &method.to_ascii_lowercase(), "ResponseComplete");
        ev["user"] = json!({});
        ev["responseStatus"] =
            json!({"metadata": {}, "status": "Failure", "reason": "Unauthorized", "code": 401});
        self.write(&ev);
    }
}
