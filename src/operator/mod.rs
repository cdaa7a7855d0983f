//! `leasehold operator` (in progress).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("leasehold operator is not built yet")
}

pub mod webhook;
