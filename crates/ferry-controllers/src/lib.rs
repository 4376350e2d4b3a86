//! Ferry's controllers, as ordinary Kubernetes API clients (kube-rs): they run against Ferry's
//! API server or any kube-apiserver, under leader election through a `coordination.k8s.io/v1`
//! Lease, as kube-controller-manager does.

pub mod error;
pub mod identity;
pub mod leader;
pub mod lifecycle;
pub mod runtime;
pub mod services;
pub mod storage;
pub mod workloads2;

use std::future::Future;
use std::path::PathBuf;

pub use error::{Error, Result};

/// Flags of `ferry controllers` (and of the controllers inside `ferry up`).
#[derive(clap::Args, Debug, Clone)]
pub struct ControllersArgs {
    /// The kubeconfig to reach the API server (default: `$KUBECONFIG`, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub leader: leader::LeaderArgs,
    #[command(flatten)]
    pub services: services::ServiceArgs,
    #[command(flatten)]
    pub lifecycle: lifecycle::LifecycleArgs,
    #[command(flatten)]
    pub identity: identity::IdentityArgs,
    #[command(flatten)]
    pub storage: storage::StorageArgs,
}

/// A kube client from the kubeconfig flag.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
    Ok(ferry_kubeclient::client(kubeconfig).await?)
}

/// Runs every controller until `shutdown` completes; only while this process holds the lease.
pub async fn run(
    args: ControllersArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let work_client = client.clone();
    let a = args.clone();
    let root_ca = identity::root_ca(&args.identity, args.kubeconfig.as_deref());
    leader::run_elected(
        client,
        args.leader.clone(),
        move |stop| {
            let client = work_client.clone();
            let a = a.clone();
            let root_ca = root_ca.clone();
            async move {
                // One watch (and one cache) of Pods for every controller that reads them.
                let informers = runtime::Informers::new(client.clone(), stop.clone());
                let (s, l, (), (), ()) = tokio::join!(
                    services::run_with(
                        client.clone(),
                        a.services.clone(),
                        informers.clone(),
                        stop.clone()
                    ),
                    lifecycle::run_with(
                        client.clone(),
                        a.lifecycle.clone(),
                        informers.clone(),
                        stop.clone()
                    ),
                    workloads2::run(client.clone(), informers.clone(), stop.clone()),
                    storage::run(client.clone(), a.storage.clone(), informers, stop.clone()),
                    identity::run(client, root_ca, stop)
                );
                s.and(l)
            }
        },
        shutdown,
    )
    .await
}
