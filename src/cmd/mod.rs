//! The `leasehold` command line: one binary, a subcommand per role.
//!
//! Commands use the library layers (`lease`, `store`, `api`, `sidecar`,
//! `operator`); nothing in the library uses a command.
//!
//! The `candidate` feature builds only what a candidate pod runs (`sidecar`,
//! `run` and its watchdog, the runner's installer, `version`); `cli` adds
//! the rest. A command gated here is absent from the candidate binary, so
//! clap refuses it there as any unknown subcommand.

#[cfg(feature = "cli")]
pub(crate) mod advise;
#[cfg(feature = "cli")]
pub(crate) mod check;
#[cfg(feature = "cli")]
pub(crate) mod demo;
#[cfg(feature = "cli")]
pub(crate) mod inject;
pub mod install_self;
pub(crate) mod installed;
pub mod run;
#[cfg(all(feature = "cli", feature = "simulate"))]
pub mod simulate;
#[cfg(feature = "cli")]
pub(crate) mod status;
#[cfg(feature = "cli")]
pub mod transfer;
pub(crate) mod version;

use clap::{Parser, Subcommand, ValueEnum};

#[cfg(feature = "cli")]
use crate::operator;
use crate::sidecar;

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Leader election for Kubernetes pods on Cloud Spanner, PostgreSQL, Redis or Kubernetes Leases, with fencing tokens"
)]
#[cfg_attr(
    not(feature = "cli"),
    command(
        after_help = "The candidate build: a pod's commands only (the operator and the tools are in the full image)."
    )
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "LEASEHOLD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Log filter (tracing-subscriber EnvFilter syntax); default "info", or
    /// "warn" for the one-shot commands (without kube's client's own
    /// request errors, which they print themselves) and "error" for
    /// simulate, whose own output tells the story.
    #[arg(long, global = true, env = "LEASEHOLD_LOG")]
    pub(crate) log: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Which cluster a command talks to, for every command that reads one.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Kubeconfig file(s), a list as in KUBECONFIG (default: ~/.kube/config,
    /// else the pod's ServiceAccount).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<String>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, env = "LEASEHOLD_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    pub async fn client(&self) -> Result<kube::Client, crate::api::client::ClientError> {
        Ok(self.connect().await?.0)
    }

    /// The client, and the URL of the API server it talks to.
    pub async fn connect(&self) -> Result<(kube::Client, String), crate::api::client::ClientError> {
        let kubeconfig = self.kubeconfig.as_deref().filter(|paths| !paths.trim().is_empty());
        crate::api::client::connect(kubeconfig, self.context.as_deref()).await
    }
}

/// How a command prints what it found: for people, or for programs.
#[cfg(feature = "cli")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

// Parsed once at startup: boxing the larger argument structs buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Several candidates in one process: a leader, a crash, a failover, a handover.
    #[cfg(feature = "cli")]
    Demo(demo::Args),
    /// Run the lease loop next to an application container.
    Sidecar(sidecar::Args),
    /// Reconcile DistributedLease resources.
    #[cfg(feature = "cli")]
    Operator(operator::Args),
    /// Print the CustomResourceDefinitions (DistributedLease, LeaseTransfer) as YAML.
    #[cfg(feature = "cli")]
    Crd,
    /// Report what is wrong with an install, in plain words.
    #[cfg(feature = "cli")]
    Check(check::Args),
    /// One line per DistributedLease: holder, term, token age, time since
    /// leadership changed, candidates ready/total, version policy and
    /// conditions; `--watch` follows the changes. As a kubectl plugin:
    /// `kubectl leasehold status` with this binary linked as
    /// `kubectl-leasehold` on PATH.
    #[cfg(feature = "cli")]
    Status(status::Args),
    /// Ask a lease's leader to hand over to a named pod (a LeaseTransfer):
    /// `leasehold transfer LEASE --to POD [--wait]`; as a kubectl plugin
    /// `kubectl leasehold transfer`.
    #[cfg(feature = "cli")]
    Transfer(transfer::Args),
    /// Inject the sidecar into annotated Pods and pod templates in YAML (files
    /// or stdin) as the webhook would; the result goes to stdout, what was
    /// skipped and why to stderr.
    #[cfg(feature = "cli")]
    Inject(inject::Args),
    /// Run the deterministic safety simulation over many seeds (built with
    /// the `simulate` feature).
    #[cfg(all(feature = "cli", feature = "simulate"))]
    Simulate(simulate::Args),
    /// Run a command only while this candidate leads: `leasehold run [flags] -- COMMAND ARGS…`.
    Run(run::Args),
    /// Internal: supervises the command for `leasehold run`.
    #[command(name = "__watchdog", hide = true)]
    Watchdog(run::watchdog::Args),
    /// Internal: copies this binary into a folder, for the init container
    /// that gives a `leasehold.dev/run` container the runner.
    #[command(name = install_self::COMMAND, hide = true)]
    InstallSelf(install_self::Args),
    /// Measure a store's round trips and suggest lease timing (D/R/P).
    #[cfg(feature = "cli")]
    Advise(advise::Args),
    /// Print this binary's version and, when the cluster is reachable, each
    /// installed operator's.
    Version(version::Args),
    /// Print a shell completion script: `source <(leasehold completions bash)`.
    #[cfg(feature = "cli")]
    Completions(CompletionsArgs),
}

#[cfg(feature = "cli")]
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        abort_on_panic();
        // kube's client logs each failed request at ERROR; the one-shot
        // commands print the failure themselves, once, with its causes.
        const ONE_SHOT: &str = "warn,kube_client=off";
        let default_filter = match self.command {
            #[cfg(all(feature = "cli", feature = "simulate"))]
            Command::Simulate(_) => "error",
            #[cfg(feature = "cli")]
            Command::Demo(_)
            | Command::Check(_)
            | Command::Advise(_)
            | Command::Status(_)
            | Command::Transfer(_)
            | Command::Completions(_) => ONE_SHOT,
            Command::Version(_) => ONE_SHOT,
            _ => "info",
        };
        let filter = self.log.clone().unwrap_or_else(|| default_filter.to_string());
        init_logging(self.log_format, &filter)?;
        match self.command {
            // Each seed runs a paused runtime of its own.
            #[cfg(all(feature = "cli", feature = "simulate"))]
            Command::Simulate(args) => simulate::run(args),
            #[cfg(feature = "cli")]
            Command::Crd => {
                print!("{}", crate::api::crd_yaml()?);
                Ok(())
            }
            #[cfg(feature = "cli")]
            Command::Inject(args) => run_inject(&args),
            #[cfg(feature = "cli")]
            Command::Demo(args) => block_on(async { Ok(demo::run(args).await?) }),
            Command::Sidecar(args) => one_thread()?.block_on(async { Ok(sidecar::run(args).await?) }),
            #[cfg(feature = "cli")]
            Command::Operator(args) => block_on(async { Ok(operator::run(args).await?) }),
            // The command's exit code is the runner's (and the watchdog's).
            Command::Run(args) => std::process::exit(one_thread()?.block_on(run::run(args))?),
            Command::Watchdog(args) => std::process::exit(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(run::watchdog::run(args))?,
            ),
            Command::InstallSelf(args) => {
                let installed = install_self::install(&args.dir)?;
                tracing::info!(path = %installed.display(), "installed");
                Ok(())
            }
            #[cfg(feature = "cli")]
            Command::Check(args) => block_on(async { Ok(check::run(args).await?) }),
            #[cfg(feature = "cli")]
            Command::Status(args) => block_on(async { Ok(status::run(args).await?) }),
            // The exit code says whether the target leads.
            #[cfg(feature = "cli")]
            Command::Transfer(args) => std::process::exit(runtime()?.block_on(transfer::run(args))?),
            #[cfg(feature = "cli")]
            Command::Advise(args) => block_on(async { Ok(advise::run(args).await?) }),
            Command::Version(args) => block_on(async {
                version::run(args).await;
                Ok(())
            }),
            #[cfg(feature = "cli")]
            Command::Completions(args) => {
                use clap::CommandFactory;
                clap_complete::generate(args.shell, &mut Cli::command(), "leasehold", &mut std::io::stdout());
                Ok(())
            }
        }
    }
}

/// Fail-stop in every build, not only in release builds (`panic = "abort"`):
/// once the default hook has printed the panic, the process aborts. A task
/// that panicked would otherwise end alone (tokio catches it) while the
/// elector kept leading; the debug build the end-to-end image runs must
/// behave as the release build.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        report(panic);
        std::process::abort();
    }));
}

#[cfg(feature = "cli")]
fn run_inject(args: &inject::Args) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Read;
    let mut input = String::new();
    let stdin = args.files.is_empty() || args.files.iter().any(|f| f.as_os_str() == "-");
    if stdin {
        std::io::stdin().read_to_string(&mut input).context("reading stdin")?;
    }
    for file in args.files.iter().filter(|f| f.as_os_str() != "-") {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        input.push_str("\n---\n");
        input.push_str(&text);
    }
    let injected = inject::inject(&input, &args.injection())?;
    for note in &injected.notes {
        eprintln!("{note}");
    }
    print!("{}", injected.yaml);
    anyhow::ensure!(
        injected.refused == 0,
        "{} pod template(s) ask for leasehold but were not injected (see above)",
        injected.refused
    );
    Ok(())
}

fn block_on(task: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    runtime()?.block_on(task)
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}

/// The sidecar and the runner run in every candidate pod, so their footprint
/// is multiplied by the fleet, and their work is mostly waiting: one thread
/// runs it, and the few blocking calls (file writes) share a small pool.
fn one_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(2)
        .enable_all()
        .build()
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
