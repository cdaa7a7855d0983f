use clap::Parser;

fn main() -> anyhow::Result<()> {
    leasehold::cli::Cli::parse().run()
}
