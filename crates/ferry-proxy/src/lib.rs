//! `ferry proxy`: the service proxy (issue 7). STUB.

use std::future::Future;

use anyhow::Result;

#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

pub async fn run(
    _args: ProxyArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    shutdown.await;
    Ok(())
}
