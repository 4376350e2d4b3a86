//! Identities and authorization for Ferry, as kube-apiserver does them — pure decision cores
//! with no IO:
//!
//! - [`user`]: who is asking (name, groups, extra) and the well-known users and groups;
//! - [`attributes`]: what is asked, read from a request's method, path and query
//!   (upstream's `RequestInfoFactory`);
//! - [`rbac`]: upstream's RBAC rule matching, the authorizer over a policy snapshot, the rules a
//!   user holds, and the privilege-escalation check (`Covers`);
//! - [`bootstrap`]: the default ClusterRoles and ClusterRoleBindings and ClusterRole aggregation;
//! - [`jwt`]: ServiceAccount tokens (ES256 JWTs with upstream's claims), minted and verified;
//! - [`impersonation`]: the `Impersonate-*` headers read into what to authorize and whom to
//!   act as (upstream's `WithImpersonation`);
//! - [`message`]: upstream's forbidden messages;
//! - [`node`]: the Node authorizer's graph of pods and the objects they reference.

pub mod attributes;
pub mod bootstrap;
pub mod impersonation;
pub mod jwt;
pub mod message;
pub mod node;
pub mod rbac;
pub mod user;

pub use attributes::Attributes;
pub use user::UserInfo;
