//! `leasehold simulate` (in progress).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("simulate is not built yet")
}
