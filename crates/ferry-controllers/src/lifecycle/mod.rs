//! Cluster lifecycle controllers (issue 5). STUB: to be filled in.

use anyhow::Result;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct LifecycleArgs {}

pub async fn run(
    _client: kube::Client,
    _args: LifecycleArgs,
    stop: CancellationToken,
) -> Result<()> {
    stop.cancelled().await;
    Ok(())
}
