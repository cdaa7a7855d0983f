//! `leasehold operator` (in progress).

pub mod metrics;
pub mod reconcile;
pub mod stores;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("leasehold operator is not built yet")
}
