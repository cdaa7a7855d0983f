//! The `leasehold` command line: one binary, a subcommand per role.

use clap::{Parser, Subcommand, ValueEnum};

use crate::{demo, operator, sidecar, sim};

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Leader election for Kubernetes pods on Cloud Spanner, with fencing tokens"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "LEASEHOLD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, global = true, env = "LEASEHOLD_LOG", default_value = "info")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// Parsed once at startup: boxing the larger argument structs buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Several candidates in one process: a leader, a crash, a failover, a handover.
    Demo(demo::Args),
    /// Run the lease loop next to an application container.
    Sidecar(sidecar::Args),
    /// Reconcile DistributedLease resources.
    Operator(operator::Args),
    /// Print the DistributedLease CustomResourceDefinition as YAML.
    Crd,
    /// Run the deterministic safety simulation over many seeds.
    Simulate(sim::Args),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        init_logging(self.log_format, &self.log)?;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async move {
            match self.command {
                Command::Demo(args) => demo::run(args).await?,
                Command::Sidecar(args) => sidecar::run(args).await?,
                Command::Operator(args) => operator::run(args).await?,
                Command::Crd => print!("{}", crate::api::crd_yaml()?),
                Command::Simulate(args) => sim::run(args)?,
            }
            Ok(())
        })
    }
}

fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}
