//! `ferry agent`: registers a Node and runs the pods bound to it (issue 7). STUB.

use std::future::Future;

use anyhow::Result;

#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

pub async fn run(
    _args: AgentArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    shutdown.await;
    Ok(())
}
