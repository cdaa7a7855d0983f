//! The `leasehold` command line: one binary, a subcommand per role.

use clap::{Parser, Subcommand, ValueEnum};

use crate::{advise, demo, operator, sidecar, sim};

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
    /// Log filter (tracing-subscriber EnvFilter syntax); default "info", or
    /// "warn" for demo and "error" for simulate, whose own output tells the story.
    #[arg(long, global = true, env = "LEASEHOLD_LOG")]
    pub log: Option<String>,
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
    /// Measure a store's round trips and suggest lease timing (D/R/P).
    Advise(advise::Args),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        let default_filter = match self.command {
            Command::Simulate(_) => "error",
            Command::Demo(_) | Command::Advise(_) => "warn",
            _ => "info",
        };
        let filter = self.log.clone().unwrap_or_else(|| default_filter.to_string());
        init_logging(self.log_format, &filter)?;
        match self.command {
            // Each seed runs a paused runtime of its own.
            Command::Simulate(args) => sim::run(args),
            Command::Crd => {
                print!("{}", crate::api::crd_yaml()?);
                Ok(())
            }
            Command::Demo(args) => block_on(async { Ok(demo::run(args).await?) }),
            Command::Sidecar(args) => block_on(async { Ok(sidecar::run(args).await?) }),
            Command::Operator(args) => block_on(operator::run(args)),
            Command::Advise(args) => block_on(async { Ok(advise::run(args).await?) }),
        }
    }
}

fn block_on(task: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(task)
}

fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid log filter {filter:?}: {e}"))?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}
