//! Leader election through a `coordination.k8s.io/v1` Lease. STUB: to be filled in (issue 3).

use std::future::Future;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Elect a leader among `ferry controllers` processes through a Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
}

/// Runs `work` while this process leads; `work` gets a token cancelled when leadership is lost
/// or on shutdown. STUB: runs `work` at once without a lease.
pub async fn run_elected<F, Fut>(
    _client: kube::Client,
    _args: LeaderArgs,
    work: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()>
where
    F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let stop = CancellationToken::new();
    let s2 = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        s2.cancel();
    });
    work(stop).await
}
