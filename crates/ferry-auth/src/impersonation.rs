//! Impersonation as upstream's `WithImpersonation` filter decides it: the `Impersonate-*`
//! headers are read into a list of things to act as (a user or ServiceAccount, groups, extra
//! values, a UID); each one is authorized against the requesting user with verb `impersonate`;
//! when all are allowed the request continues as the user they describe.

use std::collections::BTreeMap;

use crate::attributes::Attributes;
use crate::user::{self, UserInfo};

pub const USER_HEADER: &str = "impersonate-user";
pub const GROUP_HEADER: &str = "impersonate-group";
pub const UID_HEADER: &str = "impersonate-uid";
pub const EXTRA_HEADER_PREFIX: &str = "impersonate-extra-";

/// The API group of the `userextras` and `uids` impersonation resources.
pub const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// One thing the request asks to act as (upstream builds an `ObjectReference` for each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Target {
    /// The attributes to authorize for `requestor` acting as this target.
    pub fn attributes(&self, requestor: &UserInfo) -> Attributes {
        let (group, version, namespace, resource, subresource, name) = match self {
            Target::User(n) => ("", "", "", "users", "", n.as_str()),
            Target::ServiceAccount { namespace, name } => (
                "",
                "",
                namespace.as_str(),
                "serviceaccounts",
                "",
                name.as_str(),
            ),
            Target::Group(n) => ("", "", "", "groups", "", n.as_str()),
            Target::Extra { key, value } => (
                AUTHENTICATION_GROUP,
                "v1",
                "",
                "userextras",
                key.as_str(),
                value.as_str(),
            ),
            Target::Uid(u) => (AUTHENTICATION_GROUP, "v1", "", "uids", "", u.as_str()),
        };
        Attributes::resource(
            requestor.clone(),
            "impersonate",
            namespace,
            group,
            version,
            resource,
            subresource,
            name,
        )
    }

    /// Go's `%v` of the `ObjectReference` upstream builds (Kind, Namespace, Name, UID,
    /// APIVersion, ResourceVersion, FieldPath), for its error text.
    fn go_value(&self) -> String {
        let (kind, ns, name, api_version, field_path) = match self {
            Target::User(n) => ("User", "", n.as_str(), "", ""),
            Target::ServiceAccount { namespace, name } => {
                ("ServiceAccount", namespace.as_str(), name.as_str(), "", "")
            }
            Target::Group(n) => ("Group", "", n.as_str(), "", ""),
            Target::Extra { key, value } => (
                "UserExtra",
                "",
                value.as_str(),
                "authentication.k8s.io/v1",
                key.as_str(),
            ),
            Target::Uid(u) => ("UID", "", u.as_str(), "authentication.k8s.io/v1", ""),
        };
        format!("{{{kind} {ns} {name}  {api_version}  {field_path}}}")
    }
}

/// The headers ask for groups, extra values or a UID but no user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requested [{}] without impersonating a user", go_values(.0))]
pub struct WithoutUser(pub Vec<Target>);

fn go_values(targets: &[Target]) -> String {
    targets
        .iter()
        .map(Target::go_value)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the headers ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub targets: Vec<Target>,
    /// `Impersonate-Group` was sent: the groups are exactly those asked for (no ServiceAccount
    /// groups are added).
    pub groups_specified: bool,
}

/// Percent-decodes an extra key as Go's `url.PathUnescape`; a malformed key is kept as sent.
fn path_unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(v) => {
                    out.push(v);
                    i += 3;
                }
                None => return s.to_string(),
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// Reads the impersonation headers (`(name, value)` pairs in the order received, names in any
/// case). `Ok(None)` when there are none.
pub fn parse<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Option<Request>, WithoutUser> {
    let mut user_name: Option<String> = None;
    let mut groups = Vec::new();
    let mut extras: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut uid: Option<String> = None;
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            // Go's Header.Get: the first value.
            USER_HEADER => {
                user_name.get_or_insert_with(|| value.to_string());
            }
            UID_HEADER => {
                uid.get_or_insert_with(|| value.to_string());
            }
            GROUP_HEADER => groups.push(value.to_string()),
            l => {
                if let Some(key) = l.strip_prefix(EXTRA_HEADER_PREFIX) {
                    extras
                        .entry(path_unescape(key))
                        .or_default()
                        .push(value.to_string());
                }
            }
        }
    }
    let user_name = user_name.filter(|u| !u.is_empty());
    let uid = uid.filter(|u| !u.is_empty());
    let mut targets = Vec::new();
    if let Some(u) = &user_name {
        targets.push(match user::split_service_account_username(u) {
            Some((namespace, name)) => Target::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
            },
            None => Target::User(u.clone()),
        });
    }
    let groups_specified = !groups.is_empty();
    targets.extend(groups.into_iter().map(Target::Group));
    let has_extra = !extras.is_empty();
    for (key, values) in extras {
        for value in values {
            targets.push(Target::Extra {
                key: key.clone(),
                value,
            });
        }
    }
    if let Some(u) = uid.clone() {
        targets.push(Target::Uid(u));
    }
    if (groups_specified || has_extra || uid.is_some()) && user_name.is_none() {
        return Err(WithoutUser(targets));
    }
    if targets.is_empty() {
        return Ok(None);
    }
    Ok(Some(Request {
        targets,
        groups_specified,
    }))
}

/// The user the request acts as once every target is allowed.
pub fn user(req: &Request) -> UserInfo {
    let mut out = UserInfo::default();
    for t in &req.targets {
        match t {
            Target::User(n) => out.name = n.clone(),
            Target::ServiceAccount { namespace, name } => {
                out.name = user::service_account_username(namespace, name);
                if !req.groups_specified {
                    out.groups = vec![
                        user::ALL_SERVICE_ACCOUNTS.into(),
                        format!("{}{namespace}", user::SERVICE_ACCOUNT_GROUP_PREFIX),
                    ];
                }
            }
            Target::Group(g) => out.groups.push(g.clone()),
            Target::Extra { key, value } => out
                .extra
                .entry(key.clone())
                .or_default()
                .push(value.clone()),
            Target::Uid(u) => out.uid = u.clone(),
        }
    }
    let authenticated = out.in_group(user::ALL_AUTHENTICATED);
    let unauthenticated = out.in_group(user::ALL_UNAUTHENTICATED);
    if out.name != user::ANONYMOUS {
        if !authenticated && !unauthenticated {
            out.groups.push(user::ALL_AUTHENTICATED.into());
        }
    } else if !unauthenticated {
        out.groups.push(user::ALL_UNAUTHENTICATED.into());
    }
    out
}

/// Whether a header is one of the impersonation headers (removed before the request goes on).
pub fn is_header(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l == USER_HEADER || l == GROUP_HEADER || l == UID_HEADER || l.starts_with(EXTRA_HEADER_PREFIX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::message::forbidden_message;

    fn req(h: &[(&'static str, &'static str)]) -> Result<Option<Request>, WithoutUser> {
        parse(h.iter().copied())
    }

    #[test]
    fn no_headers_no_impersonation() {
        assert_eq!(req(&[("Accept", "x")]), Ok(None));
        assert_eq!(req(&[("Impersonate-User", "")]), Ok(None));
    }

    #[test]
    fn plain_user_gets_authenticated_group() {
        let r = req(&[("Impersonate-User", "jane")]).unwrap().unwrap();
        assert_eq!(r.targets, [Target::User("jane".into())]);
        let u = user(&r);
        assert_eq!(u.name, "jane");
        assert_eq!(u.groups, ["system:authenticated"]);
    }

    #[test]
    fn service_account_gets_its_groups_unless_groups_given() {
        let r = req(&[("impersonate-user", "system:serviceaccount:ux:default")])
            .unwrap()
            .unwrap();
        assert_eq!(
            r.targets,
            [Target::ServiceAccount {
                namespace: "ux".into(),
                name: "default".into()
            }]
        );
        let u = user(&r);
        assert_eq!(u.name, "system:serviceaccount:ux:default");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ux",
                "system:authenticated"
            ]
        );
        let r = req(&[
            ("Impersonate-User", "system:serviceaccount:ux:default"),
            ("Impersonate-Group", "devs"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(user(&r).groups, ["devs", "system:authenticated"]);
    }

    #[test]
    fn groups_extras_uid() {
        let r = req(&[
            ("Impersonate-User", "jane"),
            ("Impersonate-Group", "a"),
            ("Impersonate-Group", "system:unauthenticated"),
            ("Impersonate-Extra-Scopes", "view"),
            ("Impersonate-Extra-Scopes", "edit"),
            ("Impersonate-Extra-example.com%2Fteam", "x"),
            ("Impersonate-Uid", "1234"),
        ])
        .unwrap()
        .unwrap();
        let u = user(&r);
        assert_eq!(u.groups, ["a", "system:unauthenticated"]);
        assert_eq!(u.uid, "1234");
        assert_eq!(u.extra["scopes"], ["view", "edit"]);
        assert_eq!(u.extra["example.com/team"], ["x"]);
        let extra = r
            .targets
            .iter()
            .find(|t| matches!(t, Target::Extra { value, .. } if value == "x"))
            .unwrap();
        let a = extra.attributes(&UserInfo::authenticated("bob", vec![]));
        assert_eq!(
            (
                a.verb.as_str(),
                a.api_group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.name.as_str()
            ),
            (
                "impersonate",
                "authentication.k8s.io",
                "userextras",
                "example.com/team",
                "x"
            )
        );
    }

    #[test]
    fn anonymous_gets_unauthenticated() {
        let r = req(&[("Impersonate-User", "system:anonymous")])
            .unwrap()
            .unwrap();
        assert_eq!(user(&r).groups, ["system:unauthenticated"]);
    }

    #[test]
    fn groups_without_user_refused() {
        let e = req(&[("Impersonate-Group", "g")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "requested [{Group  g    }] without impersonating a user"
        );
        assert!(req(&[("Impersonate-Uid", "1")]).is_err());
        assert!(req(&[("Impersonate-Extra-a", "1")]).is_err());
    }

    #[test]
    fn forbidden_text_as_upstream() {
        let r = req(&[("Impersonate-User", "nobody")]).unwrap().unwrap();
        let a = r.targets[0].attributes(&UserInfo::authenticated("x", vec![]));
        assert_eq!(
            forbidden_message(&a, ""),
            "users \"nobody\" is forbidden: User \"x\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        );
        let r = req(&[("Impersonate-User", "system:serviceaccount:ux:default")])
            .unwrap()
            .unwrap();
        let a = r.targets[0].attributes(&UserInfo::authenticated("x", vec![]));
        assert_eq!(
            forbidden_message(&a, ""),
            "serviceaccounts \"default\" is forbidden: User \"x\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"ux\""
        );
    }

    #[test]
    fn header_names() {
        assert!(is_header("Impersonate-Extra-foo"));
        assert!(is_header("impersonate-user"));
        assert!(!is_header("Impersonate"));
    }
}
