//! `leasehold run -- COMMAND ARGS…`: campaigns like the sidecar and runs the
//! command only while this candidate leads.
//!
//! The rule that makes it safe: the command is gone before the lease can
//! expire in the store. The elector's deadline is `t_send + R` and the store
//! keeps the lease until at least `t_send + D`; the stop sequence (SIGTERM to
//! the command's process group, SIGKILL `grace` later) starts at the deadline
//! at the latest, so it ends by `t_send + R + grace`, and `grace < D − R` is
//! checked at start. The watchdog process (see [`watchdog`]) enforces the
//! deadline even when the runner is stopped or dead.
//!
//! Exit: the command exiting on its own ends the runner (release, then exit
//! with its code) unless `--restart-on-failure` restarts a failed one; losing
//! leadership stops the command and the runner campaigns again; SIGTERM or
//! SIGINT is passed to the command, then release and exit with its code.
//!
//! Metrics: with `--metrics-addr` (the webhook sets it on a wrapped
//! container) the runner serves the sidecar's lease metrics
//! ([`crate::sidecar::metrics`], `leasehold_renew_budget_used`), so the
//! chart's PodMonitor, alerts and dashboard see run-wrapped locks too.

pub mod launch;
pub(crate) mod watchdog;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rustix::process::Signal;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::contract;
use crate::lease::{Elector, LeaderContext, LeaseStore, StoreError, Timing};
use crate::runtime::StoreConfig;
use crate::sidecar::config::{self, ElectionArgs};
use crate::sidecar::metrics::{MeteredStore, Metrics};
use crate::sidecar::{budget::RenewBudget, http, http::LeaderView, publish, timing_risk, token_file};
use launch::{Launcher, Supervised, WatchdogLauncher};
use watchdog::Heartbeat;

/// The longest wait between restarts of a failing command.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Time between SIGTERM and SIGKILL when the command is stopped; must be
    /// shorter than D − R (lease duration − renew deadline) so the command is
    /// gone before the lease can expire. Default: half of D − R.
    #[arg(long, env = "LEASEHOLD_GRACE_PERIOD", value_parser = crate::lease::timing::parse_duration_flag)]
    pub grace_period: Option<Duration>,
    /// Restart a command that exits non-zero (after a backoff, while still
    /// leader) instead of releasing and exiting with its code.
    #[arg(long, env = "LEASEHOLD_RESTART_ON_FAILURE")]
    pub restart_on_failure: bool,
    /// The first wait before a restart; doubles on each failure in a term, up to 1 minute.
    #[arg(long, env = "LEASEHOLD_RESTART_BACKOFF", default_value = "1s", value_parser = crate::lease::timing::parse_duration_flag)]
    pub restart_backoff: Duration,
    /// Serve the lease metrics (as the sidecar's /metrics) here; none without it.
    #[arg(long, env = contract::ENV_METRICS_ADDR)]
    pub metrics_addr: Option<SocketAddr>,
    /// Once the metrics listener is bound, write its address here as JSON
    /// ({"metrics": ...}), replaced atomically; with port 0 the system picks the port.
    #[arg(long, env = "LEASEHOLD_READY_FILE", requires = "metrics_addr")]
    pub ready_file: Option<PathBuf>,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Settings(#[from] config::Error),
    #[error(
        "--grace-period ({grace:?}) must be shorter than leaseDuration − renewDeadline ({gap:?}): \
         the command must be gone before the lease can expire"
    )]
    GraceTooLong { grace: Duration, gap: Duration },
    #[error("Kubernetes API")]
    Kube(#[from] ::kube::Error),
    #[error("store")]
    Store(#[from] StoreError),
    #[error(
        "leadership prefers {0:?}, which needs the sidecar's watch of its peer pods; leasehold run records \
         --revision/--version-name and honours the version fence only: run it as the sidecar, or prefer None"
    )]
    PreferNeedsSidecar(crate::lease::Prefer),
    #[error(
        "the lock is shared as {0} partitions, which leasehold run cannot hold (it runs one command while it \
         leads): run it as the sidecar, whose /partitions tells the app which partitions it holds"
    )]
    PartitionsNeedSidecar(u32),
    #[error("cannot find this executable to start the watchdog")]
    Exe(#[source] std::io::Error),
    #[error("signals")]
    Signals(#[source] std::io::Error),
    #[error("cannot listen on {addr} for metrics")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the ready file {}", path.display())]
    ReadyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The `--ready-file` document: where the metrics listener is bound.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Listening {
    pub metrics: SocketAddr,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The grace period, defaulted and checked against the safety gap.
pub fn grace_period(timing: &Timing, grace: Option<Duration>) -> Result<Duration> {
    let gap = timing.safety_gap();
    match grace {
        None => Ok(gap / 2),
        Some(grace) if grace < gap => Ok(grace),
        Some(grace) => Err(Error::GraceTooLong { grace, gap }),
    }
}

/// Runs until the command exits on its own or a signal arrives; returns
/// the exit code for the runner (the command's, or 0 if it never ran).
pub async fn run(args: Args) -> Result<i32> {
    let shutdown = CancellationToken::new();
    let received = Arc::new(OnceLock::new());
    let noted = received.clone();
    crate::shutdown::exit_on_signals_noting(shutdown.clone(), move |signal| {
        let _ = noted.set(signal);
    })
    .map_err(Error::Signals)?;
    let kube = match args.election.kubernetes() {
        true => Some(::kube::Client::try_default().await?),
        false => None,
    };
    let settings = config::resolve(&args.election, kube.clone()).await?;
    let grace = grace_period(&settings.timing, args.grace_period)?;
    if settings.versions.prefer != crate::lease::Prefer::None {
        return Err(Error::PreferNeedsSidecar(settings.versions.prefer));
    }
    if let Some(n) = settings.partitions {
        return Err(Error::PartitionsNeedSidecar(n));
    }
    info!(identity = %settings.identity, lock = %settings.lock, timing = ?settings.timing, ?grace, command = ?args.command, "starting");
    // Bound to a lease: run only on the store it recorded (issue 54).
    if let (Some(client), Some(pod), Some(lease)) = (&kube, &settings.pod, &settings.lease)
        && settings.store.reached_by_url()
    {
        tokio::select! {
            () = admitted(client.clone(), &pod.namespace, &lease.name, &settings.store) => {}
            () = shutdown.cancelled() => return Ok(0),
        }
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::new(&mut registry);
    // No app health source: the command is the app.
    metrics.app_healthy.set(-1);
    let store: Arc<dyn LeaseStore> = Arc::new(MeteredStore::new(
        settings.store.connect(args.election.create_table).await?,
        metrics.clone(),
    ));
    if args.election.create_table {
        store.ensure_schema().await?;
    }
    // The renewal budget watches what the elector sees, as in the sidecar.
    let budget = RenewBudget::new(&settings.timing, &mut registry);
    let verdicts = budget.verdicts();
    let store: Arc<dyn LeaseStore> = Arc::new(budget.time(store));
    let servers = CancellationToken::new();
    let metrics_server = match args.metrics_addr {
        Some(addr) => {
            let listener = bind_metrics(addr, args.ready_file.as_deref()).await?;
            let router = crate::sidecar::metrics_router(registry, axum::Router::new());
            Some(tokio::spawn(http::serve(listener, router, servers.clone())))
        }
        None => None,
    };
    let launcher = WatchdogLauncher {
        exe: std::env::current_exe().map_err(Error::Exe)?,
        command: args.command.clone(),
        grace,
    };
    let runner = Runner::new(
        Arc::new(launcher),
        args.restart_on_failure.then_some(args.restart_backoff),
        shutdown.clone(),
        received,
        args.election.token_file.clone(),
    );
    let elector = Elector::new(settings.lock.clone(), settings.identity.clone(), settings.timing)
        .with_version(settings.version.clone(), settings.versions.fence);
    let transitions = elector.transitions();
    let work = runner.clone();
    let handle = elector.spawn_with_work(store, shutdown.clone(), move |ctx| work.clone().lead(ctx));
    tokio::spawn(metrics.follow(settings.lock.clone(), handle.subscribe()));
    if let (Some(client), Some(pod)) = (kube.clone(), settings.pod.clone()) {
        tokio::spawn(timing_risk::publish(client, pod, verdicts));
    }
    // The token file is the command's: written before each start (see
    // `lead`), not followed, so no second writer races that write.
    let state = handle.subscribe();
    // The timing is read once: a grace period checked against one D − R
    // must not meet another, so a changed DistributedLease needs a restart.
    let publisher = kube.zip(settings.pod.clone()).map(|(client, pod)| {
        // No app health source: the command is the app, and it runs only while leading.
        let (app_health, app) = tokio::sync::watch::channel(Default::default());
        let publisher = publish::Publisher::new(client, pod, settings.publishing.clone());
        let control = handle.control();
        tokio::spawn(async move {
            publisher.run(state, transitions, app, control).await;
            drop(app_health);
        })
    });
    handle.join().await;
    if let Some(publisher) = publisher
        && let Err(e) = publisher.await
    {
        warn!(error = %e, "the Kubernetes publisher ended abnormally");
    }
    servers.cancel();
    if let Some(server) = metrics_server
        && let Ok(Err(e)) = server.await
    {
        warn!(error = %e, "metrics server error");
    }
    Ok(runner.exit_code())
}

/// Waits until the store `choice` reaches is the one the lease `name` in
/// `namespace` recorded, reading the lease again between attempts: for
/// `leasehold run`, which follows no lease watch. Every failure is logged
/// at most once per [`REPORT_EVERY`](crate::sidecar::starting::REPORT_EVERY); a
/// mismatch never ends (the command never runs on another store).
async fn admitted(client: kube::Client, namespace: &str, name: &str, choice: &StoreConfig) {
    use backon::BackoffBuilder;
    let leases: kube::Api<crate::api::DistributedLease> = kube::Api::namespaced(client, namespace);
    let mut backoff = crate::sidecar::capped_backoff().build();
    let mut throttle = crate::sidecar::starting::Throttle::new(crate::sidecar::starting::REPORT_EVERY);
    loop {
        let checked = async {
            let lease = leases.get(name).await.map_err(|e| {
                StoreError::unavailable(format!("reading DistributedLease {name}"))
                    .caused_by(crate::api::errors::KubeCause::of(&e))
            })?;
            let recorded = lease.status.and_then(|s| s.store_identity);
            crate::sidecar::lease_store::admit(choice, &tokio::sync::watch::channel(recorded).1).await
        };
        match checked.await {
            Ok(()) => return,
            Err(e) => {
                if let Some(attempts) = throttle.due(tokio::time::Instant::now()) {
                    tracing::warn!(problem = %e.chain(), attempts, "not campaigning yet; retrying with backoff");
                }
                tokio::time::sleep(backoff.next().unwrap_or(crate::sidecar::BACKOFF_CAP)).await;
            }
        }
    }
}

/// Binds the metrics listener; then, with `--ready-file`, says where (with
/// port 0 the system picked the port, so whoever started the runner learns
/// it only from this file).
async fn bind_metrics(addr: SocketAddr, ready_file: Option<&std::path::Path>) -> Result<tokio::net::TcpListener> {
    let listen = |source| Error::Listen { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
    if let Some(path) = ready_file {
        let listening = Listening {
            metrics: listener.local_addr().map_err(listen)?,
        };
        token_file::write(path, &listening)
            .await
            .map_err(|source| Error::ReadyFile {
                path: path.to_path_buf(),
                source,
            })?;
    }
    Ok(listener)
}

/// The leader work: the command, for as long as the term lasts.
struct Runner {
    launcher: Arc<dyn Launcher>,
    /// `Some(first backoff)` with `--restart-on-failure`.
    restart: Option<Duration>,
    shutdown: CancellationToken,
    /// The signal that shut the runner down, passed on to the command.
    received: Arc<OnceLock<i32>>,
    token_file: Option<PathBuf>,
    /// The runner's exit code, once the command's outcome decides it.
    outcome: Mutex<Option<i32>>,
}

/// How one run of the command ended.
enum Ended {
    /// It exited by itself.
    Exited(i32),
    /// We stopped it: the term ended.
    Stopped(i32),
}

impl Runner {
    fn new(
        launcher: Arc<dyn Launcher>,
        restart: Option<Duration>,
        shutdown: CancellationToken,
        received: Arc<OnceLock<i32>>,
        token_file: Option<PathBuf>,
    ) -> Arc<Self> {
        Arc::new(Runner {
            launcher,
            restart,
            shutdown,
            received,
            token_file,
            outcome: Mutex::new(None),
        })
    }

    fn exit_code(&self) -> i32 {
        self.outcome.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(0)
    }

    /// Ends the runner with `code`: the elector releases once we return.
    fn finish(&self, code: i32) {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(code);
        self.shutdown.cancel();
    }

    async fn lead(self: Arc<Self>, ctx: LeaderContext) {
        // Doubling from the first delay up to MAX_RESTART_BACKOFF, for as
        // long as this term lasts: a new term starts from the first delay.
        let mut delays = self.restart.map(|first| {
            ExponentialBuilder::default()
                .with_min_delay(first)
                .with_max_delay(MAX_RESTART_BACKOFF)
                .without_max_times()
                .build()
        });
        loop {
            let leading = ctx.still_leading();
            let state = ctx.state.borrow().clone();
            let Some(deadline) = state.deadline.filter(|_| leading) else {
                return;
            };
            if let Some(path) = &self.token_file {
                // Before the command starts, so it never reads a stale token.
                let view = LeaderView::of(&state, tokio::time::Instant::now());
                if let Err(e) = token_file::write(path, &view).await {
                    warn!(path = %path.display(), error = %e, "cannot write the token file");
                }
            }
            let env = vec![
                ("LEASEHOLD_TOKEN", ctx.token.to_string()),
                ("LEASEHOLD_TERM", ctx.term.to_string()),
                ("LEASEHOLD_HOLDER", state.identity.clone()),
            ];
            let supervised = match self.launcher.start(env, deadline) {
                Ok(supervised) => supervised,
                Err(e) => {
                    warn!(error = %e, "cannot start the watchdog; stepping down");
                    return self.finish(126);
                }
            };
            info!(term = ctx.term, token = %ctx.token, "leading: the command runs");
            match self.supervise(&ctx, supervised).await {
                Ended::Stopped(code) if self.shutdown.is_cancelled() => {
                    info!(code, "the command stopped; releasing");
                    return self.finish(code);
                }
                Ended::Stopped(code) => {
                    warn!(code, "leadership ended: the command was stopped");
                    return;
                }
                Ended::Exited(0) => {
                    info!("the command exited 0; releasing");
                    return self.finish(0);
                }
                Ended::Exited(code) => match delays.as_mut().and_then(Iterator::next) {
                    Some(delay) => {
                        warn!(
                            code,
                            ?delay,
                            "the command failed; restarting after a backoff while leading"
                        );
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = ctx.cancelled.cancelled() => {
                                if self.shutdown.is_cancelled() {
                                    self.finish(code);
                                }
                                return;
                            }
                        }
                    }
                    None => {
                        warn!(code, "the command failed; releasing");
                        return self.finish(code);
                    }
                },
            }
        }
    }

    /// Passes every renewal on to the watchdog until the command exits or the
    /// term ends; then stops it and waits.
    async fn supervise(&self, ctx: &LeaderContext, mut supervised: Supervised) -> Ended {
        let mut state = ctx.state.clone();
        loop {
            tokio::select! {
                code = &mut supervised.exit => return Ended::Exited(code.unwrap_or(1)),
                _ = ctx.cancelled.cancelled() => break,
                Ok(()) = state.changed() => {
                    let current = state.borrow_and_update();
                    if let (true, Some(deadline)) = (current.leader && current.token == Some(ctx.token), current.deadline) {
                        let _ = supervised.heartbeats.send(Heartbeat::Deadline(deadline));
                    }
                }
            }
        }
        let signal = self.received.get().copied().unwrap_or(Signal::TERM.as_raw());
        let _ = supervised.heartbeats.send(Heartbeat::Stop(signal));
        Ended::Stopped(supervised.exit.await.unwrap_or(1))
    }
}
