//! The built-in image program on its own (the `ferry` binary offers the same as
//! `ferry builtin-image ...`); integration tests point the agent at this one.

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    Ok(ferry_node::images::builtin_main(std::env::args().skip(1).collect()).await?)
}
