//! Who is asking: upstream's `user.Info` and the well-known users and groups.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Members of this group are allowed everything (upstream's privileged-group authorizer).
pub const SYSTEM_MASTERS: &str = "system:masters";
/// Every authenticated request carries this group.
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
/// Anonymous requests carry this group.
pub const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
pub const ANONYMOUS: &str = "system:anonymous";
/// Every ServiceAccount is in this group, and in `system:serviceaccounts:<namespace>`.
pub const ALL_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
pub const SERVICE_ACCOUNT_GROUP_PREFIX: &str = "system:serviceaccounts:";
pub const NODES_GROUP: &str = "system:nodes";

/// Extra keys upstream sets for ServiceAccount tokens bound to a pod.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with these groups; `system:authenticated` is added as upstream's authenticator
    /// group adder does (unless already present, and never to the anonymous user).
    pub fn authenticated(name: impl Into<String>, groups: Vec<String>) -> UserInfo {
        let mut u = UserInfo {
            name: name.into(),
            groups,
            ..Default::default()
        };
        u.add_authenticated();
        u
    }

    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS.into(),
            groups: vec![ALL_UNAUTHENTICATED.into()],
            ..Default::default()
        }
    }

    fn add_authenticated(&mut self) {
        if self.name != ANONYMOUS && !self.groups.iter().any(|g| g == ALL_AUTHENTICATED) {
            self.groups.push(ALL_AUTHENTICATED.into());
        }
    }

    /// The user of a ServiceAccount, with its groups.
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> UserInfo {
        let mut u = UserInfo {
            name: service_account_username(namespace, name),
            uid: uid.to_string(),
            groups: vec![
                ALL_SERVICE_ACCOUNTS.into(),
                format!("{SERVICE_ACCOUNT_GROUP_PREFIX}{namespace}"),
            ],
            ..Default::default()
        };
        u.add_authenticated();
        u
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// `system:serviceaccount:<namespace>:<name>`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}")
}

/// The namespace and name of a ServiceAccount username, if it is one.
pub fn split_service_account_username(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    if ns.is_empty() || name.is_empty() || name.contains(':') {
        return None;
    }
    Some((ns, name))
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let acc = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(acc) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_users() {
        let u = UserInfo::service_account("ns1", "builder", "u-1");
        assert_eq!(u.name, "system:serviceaccount:ns1:builder");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns1",
                "system:authenticated"
            ]
        );
        assert_eq!(
            split_service_account_username(&u.name),
            Some(("ns1", "builder"))
        );
        assert_eq!(
            split_service_account_username("system:serviceaccount:ns"),
            None
        );
        assert_eq!(
            split_service_account_username("system:serviceaccount:a:b:c"),
            None
        );
        assert_eq!(split_service_account_username("admin"), None);
    }

    #[test]
    fn groups_added_once() {
        let u = UserInfo::authenticated("admin", vec!["system:masters".into()]);
        assert_eq!(u.groups, ["system:masters", "system:authenticated"]);
        let u = UserInfo::authenticated("x", vec!["system:authenticated".into()]);
        assert_eq!(u.groups, ["system:authenticated"]);
        assert!(!UserInfo::anonymous().in_group(ALL_AUTHENTICATED));
    }

    #[test]
    fn constant_time() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
