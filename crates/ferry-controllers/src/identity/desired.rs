//! What the identity controllers want, as pure functions of the informers' contents.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
pub const ROOT_CA_KEY: &str = "ca.crt";
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
pub const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

fn active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
}

fn ns_name(ns: &Namespace) -> String {
    ns.metadata.name.clone().unwrap_or_default()
}

/// The `default` ServiceAccounts to create: one per active namespace that has none.
pub fn missing_default_service_accounts(
    namespaces: &[Namespace],
    accounts: &[ServiceAccount],
) -> Vec<ServiceAccount> {
    let have: BTreeSet<String> = accounts
        .iter()
        .filter(|s| s.metadata.name.as_deref() == Some(DEFAULT_SERVICE_ACCOUNT))
        .filter_map(|s| s.metadata.namespace.clone())
        .collect();
    namespaces
        .iter()
        .filter(|n| active(n) && !have.contains(&ns_name(n)))
        .map(|n| ServiceAccount {
            metadata: ObjectMeta {
                name: Some(DEFAULT_SERVICE_ACCOUNT.into()),
                namespace: Some(ns_name(n)),
                ..Default::default()
            },
            ..Default::default()
        })
        .collect()
}

/// A `kube-root-ca.crt` to create or to bring back to the bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct RootCaChange {
    pub create: bool,
    pub config_map: ConfigMap,
}

/// The root CA ConfigMaps to create (missing) or replace (data or annotation changed), as the
/// root CA publisher keeps them.
pub fn root_ca_changes(
    namespaces: &[Namespace],
    maps: &[ConfigMap],
    ca: &str,
) -> Vec<RootCaChange> {
    let existing: BTreeMap<String, &ConfigMap> = maps
        .iter()
        .filter(|c| c.metadata.name.as_deref() == Some(ROOT_CA_CONFIG_MAP))
        .filter_map(|c| c.metadata.namespace.clone().map(|n| (n, c)))
        .collect();
    let data = BTreeMap::from([(ROOT_CA_KEY.to_string(), ca.to_string())]);
    let mut out = Vec::new();
    for n in namespaces.iter().filter(|n| active(n)) {
        let name = ns_name(n);
        match existing.get(&name) {
            None => out.push(RootCaChange {
                create: true,
                config_map: ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ROOT_CA_CONFIG_MAP.into()),
                        namespace: Some(name),
                        annotations: Some(BTreeMap::from([(
                            DESCRIPTION_ANNOTATION.to_string(),
                            ROOT_CA_DESCRIPTION.to_string(),
                        )])),
                        ..Default::default()
                    },
                    data: Some(data.clone()),
                    ..Default::default()
                },
            }),
            Some(cm) => {
                let annotated = cm
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
                    .is_some_and(|d| d == ROOT_CA_DESCRIPTION);
                if cm.data.as_ref() == Some(&data) && cm.binary_data.is_none() && annotated {
                    continue;
                }
                let mut next = (*cm).clone();
                next.data = Some(data.clone());
                next.binary_data = None;
                next.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(DESCRIPTION_ANNOTATION.into(), ROOT_CA_DESCRIPTION.into());
                out.push(RootCaChange {
                    create: false,
                    config_map: next,
                });
            }
        }
    }
    out
}

/// Aggregated ClusterRoles whose rules differ from the union of the roles they select:
/// (name, rules to set).
pub fn aggregation_changes(roles: &[ClusterRole]) -> Vec<(String, Vec<PolicyRule>)> {
    roles
        .iter()
        .filter_map(|r| {
            let want = ferry_auth::bootstrap::aggregate(r, roles)?;
            let have = r.rules.clone().unwrap_or_default();
            (have != want).then(|| (r.metadata.name.clone().unwrap_or_default(), want))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str, terminating: bool) -> Namespace {
        let mut n = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        if terminating {
            n.status = Some(k8s_openapi::api::core::v1::NamespaceStatus {
                phase: Some("Terminating".into()),
                ..Default::default()
            });
        }
        n
    }

    #[test]
    fn default_service_accounts() {
        let namespaces = vec![ns("a", false), ns("b", false), ns("gone", true)];
        let have = vec![ServiceAccount {
            metadata: ObjectMeta {
                name: Some("default".into()),
                namespace: Some("a".into()),
                ..Default::default()
            },
            ..Default::default()
        }];
        let want = missing_default_service_accounts(&namespaces, &have);
        let where_: Vec<_> = want
            .iter()
            .map(|s| s.metadata.namespace.clone().unwrap_or_default())
            .collect();
        assert_eq!(where_, ["b"]);
        assert_eq!(want[0].metadata.name.as_deref(), Some("default"));
    }

    #[test]
    fn root_ca_maps() {
        let namespaces = vec![ns("a", false), ns("b", false), ns("c", true)];
        let first = root_ca_changes(&namespaces, &[], "PEM1");
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|c| c.create));
        let maps: Vec<ConfigMap> = first.into_iter().map(|c| c.config_map).collect();
        assert!(root_ca_changes(&namespaces, &maps, "PEM1").is_empty());
        // A changed bundle or an edited map is put back.
        let mut edited = maps.clone();
        edited[0].data = Some(BTreeMap::from([("ca.crt".into(), "evil".into())]));
        let back = root_ca_changes(&namespaces, &edited, "PEM1");
        assert_eq!(back.len(), 1);
        assert!(!back[0].create);
        assert_eq!(
            back[0]
                .config_map
                .data
                .as_ref()
                .and_then(|d| d.get("ca.crt"))
                .map(String::as_str),
            Some("PEM1")
        );
        assert_eq!(root_ca_changes(&namespaces, &maps, "PEM2").len(), 2);
    }

    #[test]
    fn aggregation_fills_default_roles_once() {
        let roles = ferry_auth::bootstrap::cluster_roles();
        let changes = aggregation_changes(&roles);
        let names: BTreeSet<_> = changes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["admin", "edit", "view"]));
        let applied = ferry_auth::bootstrap::aggregate_all(roles);
        assert!(aggregation_changes(&applied).is_empty());
    }
}
