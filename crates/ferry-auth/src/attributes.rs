//! What a request asks for, as upstream's `RequestInfoFactory` reads it from the URL: a resource
//! request (verb, API group and version, namespace, resource, subresource, name) or a
//! non-resource request (verb and path).

use crate::user::UserInfo;

/// Upstream's `authorizer.Attributes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub resource_request: bool,
    /// The URL path (non-resource requests).
    pub path: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl Attributes {
    /// A resource request (as a SubjectAccessReview's `resourceAttributes` asks).
    #[allow(clippy::too_many_arguments)]
    pub fn resource(
        user: UserInfo,
        verb: &str,
        namespace: &str,
        api_group: &str,
        api_version: &str,
        resource: &str,
        subresource: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            user,
            verb: verb.into(),
            resource_request: true,
            path: String::new(),
            namespace: namespace.into(),
            api_group: api_group.into(),
            api_version: api_version.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
        }
    }

    /// A non-resource request (as `nonResourceAttributes` asks).
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Attributes {
        Attributes {
            user,
            verb: verb.into(),
            resource_request: false,
            path: path.into(),
            ..Default::default()
        }
    }

    /// `resource` or `resource/subresource`.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `metadata.name=<x>` (or `==`) in a field selector, as `RequiresExactMatch` finds it.
fn exact_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let term = term.trim();
        let v = term
            .strip_prefix("metadata.name==")
            .or_else(|| term.strip_prefix("metadata.name="))?;
        let ok = !v.is_empty() && v != "." && v != ".." && !v.contains('/') && !v.contains('%');
        ok.then(|| v.to_string())
    })
}

/// Reads a request (`method`, URL `path` already percent-decoded per segment by the caller or
/// not, and raw `query`) into attributes for `user`, exactly as upstream's request info
/// resolver does.
pub fn from_request(user: UserInfo, method: &str, path: &str, query: Option<&str>) -> Attributes {
    let non_resource = |user: UserInfo| {
        let verb = match method {
            "GET" | "HEAD" => "get".to_string(),
            m => m.to_ascii_lowercase(),
        };
        Attributes::non_resource(user, &verb, path)
    };
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    if parts.len() < 3 {
        return non_resource(user);
    }
    let (group, rest) = match parts[0].as_str() {
        "api" => ("", &parts[1..]),
        "apis" if parts.len() >= 4 => (parts[1].as_str(), &parts[2..]),
        _ => return non_resource(user),
    };
    let version = rest[0].clone();
    let mut cur: &[String] = &rest[1..];
    let mut verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
    .to_string();
    if let Some(first) = cur.first()
        && (first == "watch" || first == "proxy")
    {
        if cur.len() < 2 {
            return non_resource(user);
        }
        verb = first.clone();
        cur = &cur[1..];
    }
    let mut namespace = String::new();
    if cur.first().map(String::as_str) == Some("namespaces") && cur.len() > 1 {
        namespace = cur[1].clone();
        if cur.len() > 2 && cur[2] != "status" && cur[2] != "finalize" {
            cur = &cur[2..];
        }
    }
    let mut a = Attributes::resource(user, &verb, &namespace, group, &version, "", "", "");
    if cur.len() >= 3 && verb != "proxy" {
        a.subresource = cur[2].clone();
    }
    if cur.len() >= 2 {
        a.name = cur[1].clone();
    }
    if let Some(r) = cur.first() {
        a.resource = r.clone();
    }
    let q = query.unwrap_or("");
    if a.name.is_empty() && a.verb == "get" {
        let watch = query_value(q, "watch")
            .is_some_and(|w| matches!(w.as_str(), "true" | "1" | "True" | "TRUE" | "t" | "T"));
        a.verb = if watch { "watch" } else { "list" }.into();
        if let Some(name) = query_value(q, "fieldSelector").and_then(|s| exact_name(&s)) {
            a.name = name;
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(
        method: &str,
        path: &str,
        q: Option<&str>,
    ) -> (String, String, String, String, String, String) {
        let a = from_request(UserInfo::default(), method, path, q);
        (
            a.verb,
            a.api_group,
            a.namespace,
            a.resource,
            a.subresource,
            a.name,
        )
    }

    fn t(
        v: &str,
        g: &str,
        ns: &str,
        res: &str,
        sub: &str,
        name: &str,
    ) -> (String, String, String, String, String, String) {
        (
            v.into(),
            g.into(),
            ns.into(),
            res.into(),
            sub.into(),
            name.into(),
        )
    }

    #[test]
    fn resource_requests() {
        assert_eq!(
            r("GET", "/api/v1/namespaces/d/pods", None),
            t("list", "", "d", "pods", "", "")
        );
        assert_eq!(
            r(
                "GET",
                "/api/v1/namespaces/d/pods",
                Some("watch=true&resourceVersion=1")
            ),
            t("watch", "", "d", "pods", "", "")
        );
        assert_eq!(
            r("GET", "/api/v1/pods", Some("watch=1")),
            t("watch", "", "", "pods", "", "")
        );
        assert_eq!(
            r("GET", "/api/v1/namespaces/d/pods/p/log", None),
            t("get", "", "d", "pods", "log", "p")
        );
        assert_eq!(
            r("POST", "/api/v1/namespaces/d/pods/p/exec", None),
            t("create", "", "d", "pods", "exec", "p")
        );
        assert_eq!(
            r("DELETE", "/api/v1/namespaces/d/pods", None),
            t("deletecollection", "", "d", "pods", "", "")
        );
        assert_eq!(
            r("DELETE", "/api/v1/namespaces/d/pods/p", None),
            t("delete", "", "d", "pods", "", "p")
        );
        assert_eq!(
            r(
                "PATCH",
                "/apis/apps/v1/namespaces/d/deployments/w/scale",
                None
            ),
            t("patch", "apps", "d", "deployments", "scale", "w")
        );
        assert_eq!(
            r("PUT", "/api/v1/nodes/n1/status", None),
            t("update", "", "", "nodes", "status", "n1")
        );
        // A namespace is its own namespace.
        assert_eq!(
            r("GET", "/api/v1/namespaces/d", None),
            t("get", "", "d", "namespaces", "", "d")
        );
        assert_eq!(
            r("PUT", "/api/v1/namespaces/d/finalize", None),
            t("update", "", "d", "namespaces", "finalize", "d")
        );
        assert_eq!(
            r("GET", "/api/v1/namespaces", None),
            t("list", "", "", "namespaces", "", "")
        );
        // The name from an exact field selector.
        assert_eq!(
            r(
                "GET",
                "/api/v1/namespaces/d/secrets",
                Some("fieldSelector=metadata.name%3Ds1")
            ),
            t("list", "", "d", "secrets", "", "s1")
        );
        // The watch prefix.
        assert_eq!(
            r("GET", "/api/v1/watch/namespaces/d/pods", None),
            t("watch", "", "d", "pods", "", "")
        );
        assert_eq!(
            r(
                "POST",
                "/api/v1/namespaces/d/serviceaccounts/sa/token",
                None
            ),
            t("create", "", "d", "serviceaccounts", "token", "sa")
        );
    }

    #[test]
    fn non_resource_requests() {
        for (m, p, verb) in [
            ("GET", "/api", "get"),
            ("GET", "/api/v1", "get"),
            ("GET", "/apis/apps/v1", "get"),
            ("GET", "/openapi/v3/apis/apps/v1", "get"),
            ("HEAD", "/healthz", "get"),
            ("POST", "/logs", "post"),
        ] {
            let a = from_request(UserInfo::default(), m, p, None);
            assert!(!a.resource_request, "{p}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), (verb, p));
        }
    }
}
