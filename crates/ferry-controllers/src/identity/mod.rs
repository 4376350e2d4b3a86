//! Identity controllers of kube-controller-manager: the ServiceAccount controller (a `default`
//! ServiceAccount in every namespace), the root CA publisher (`kube-root-ca.crt` in every
//! namespace) and the ClusterRole aggregation controller. The decisions are pure functions
//! ([`desired`]); the loops only feed them from informers and apply their output.

pub mod desired;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::lifecycle::informer;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct IdentityArgs {
    /// `--root-ca-file`: the CA bundle published as `kube-root-ca.crt` in every namespace
    /// (default: the certificate authority of the kubeconfig, or the in-cluster one).
    #[arg(long = "root-ca-file")]
    pub root_ca_file: Option<PathBuf>,
}

const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
const RESYNC: Duration = Duration::from_secs(30);

/// The CA bundle to publish: `--root-ca-file`, else the kubeconfig's certificate authority of the
/// current context, else the in-cluster CA.
pub fn root_ca(args: &IdentityArgs, kubeconfig: Option<&Path>) -> Option<String> {
    use base64::Engine;
    if let Some(p) = &args.root_ca_file {
        return std::fs::read_to_string(p).ok();
    }
    if let Some(path) = kubeconfig
        && let Ok(kc) = kube::config::Kubeconfig::read_from(path)
    {
        let ctx = kc.current_context.clone().unwrap_or_default();
        let cluster_name = kc
            .contexts
            .iter()
            .find(|c| c.name == ctx)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone());
        let cluster = kc
            .clusters
            .iter()
            .find(|c| Some(&c.name) == cluster_name.as_ref())
            .or_else(|| kc.clusters.first())
            .and_then(|c| c.cluster.clone());
        if let Some(c) = cluster {
            if let Some(d) = c.certificate_authority_data {
                return base64::engine::general_purpose::STANDARD
                    .decode(d.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
            }
            if let Some(f) = c.certificate_authority {
                return std::fs::read_to_string(f).ok();
            }
        }
        return None;
    }
    std::fs::read_to_string(IN_CLUSTER_CA).ok()
}

/// Runs the three controllers until `stop`.
pub async fn run(client: kube::Client, root_ca: Option<String>, stop: CancellationToken) {
    let notify = Arc::new(Notify::new());
    let namespaces = informer::<Namespace>(&client, notify.clone(), stop.clone());
    let accounts = informer::<ServiceAccount>(&client, notify.clone(), stop.clone());
    let config_maps = informer::<ConfigMap>(&client, notify.clone(), stop.clone());
    let roles = informer::<ClusterRole>(&client, notify.clone(), stop.clone());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = notify.notified() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
        // Coalesce a burst of events into one pass.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ns: Vec<Namespace> = namespaces.state().iter().map(|n| (**n).clone()).collect();
        let sas: Vec<ServiceAccount> = accounts.state().iter().map(|n| (**n).clone()).collect();
        let cms: Vec<ConfigMap> = config_maps.state().iter().map(|n| (**n).clone()).collect();
        let crs: Vec<ClusterRole> = roles.state().iter().map(|n| (**n).clone()).collect();
        if let Err(e) = sync(&client, &ns, &sas, &cms, &crs, root_ca.as_deref()).await {
            tracing::debug!("identity controllers: {e}");
        }
    }
}

async fn sync(
    client: &kube::Client,
    ns: &[Namespace],
    sas: &[ServiceAccount],
    cms: &[ConfigMap],
    crs: &[ClusterRole],
    root_ca: Option<&str>,
) -> Result<()> {
    for sa in desired::missing_default_service_accounts(ns, sas) {
        let namespace = sa.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 403 || e.code == 404 => {}
            Err(e) => tracing::warn!("creating the default ServiceAccount in {namespace}: {e}"),
        }
    }
    if let Some(ca) = root_ca {
        for change in desired::root_ca_changes(ns, cms, ca) {
            let namespace = change
                .config_map
                .metadata
                .namespace
                .clone()
                .unwrap_or_default();
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let r = if change.create {
                api.create(&PostParams::default(), &change.config_map)
                    .await
                    .map(|_| ())
            } else {
                api.replace(
                    desired::ROOT_CA_CONFIG_MAP,
                    &PostParams::default(),
                    &change.config_map,
                )
                .await
                .map(|_| ())
            };
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if matches!(e.code, 409 | 403 | 404) => {}
                Err(e) => tracing::warn!("publishing kube-root-ca.crt in {namespace}: {e}"),
            }
        }
    }
    let api: Api<ClusterRole> = Api::all(client.clone());
    for (name, rules) in desired::aggregation_changes(crs) {
        let patch = serde_json::json!({"rules": rules});
        if let Err(e) = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!("aggregating ClusterRole {name}: {e}");
        }
    }
    Ok(())
}
