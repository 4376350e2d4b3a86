//! Service and endpoint controllers (issue 4). STUB: to be filled in.

use anyhow::Result;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct ServiceArgs {}

pub async fn run(_client: kube::Client, _args: ServiceArgs, stop: CancellationToken) -> Result<()> {
    stop.cancelled().await;
    Ok(())
}
