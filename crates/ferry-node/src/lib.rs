//! `ferry agent`: registers a Node and runs the pods bound to it (issue 7).

pub mod dns;
pub mod envvars;
pub mod images;
pub mod network;
pub mod podstate;

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
