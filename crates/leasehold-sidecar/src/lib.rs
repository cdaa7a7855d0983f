//! `leasehold sidecar`: runs a candidate next to the main container and
//! publishes what it may work on: the local HTTP API, Prometheus metrics, an
//! optional token file and, inside Kubernetes, the pod's conditions and
//! Events.
//!
//! One start-up ([`run`]) for both modes: the listeners, the own-pod watch,
//! the renewal budget and its publisher, the lease binding and the servers
//! are wired here once; a mode starts what follows its own state and hands
//! back a [`Mode`]: [`single`] (one elector on the lock) or, with
//! `--partitions` / `spec.partitions`, [`partitions`]. A publisher of
//! something both modes have (the budget, the pod) goes in [`run`]; one of a
//! mode's state, in that mode's `start`.
//!
//! The HTTP API starts before the store is reached: a store unreachable at
//! start is retried and reported (`starting`), not an exit. On SIGTERM the
//! candidate stops claiming, waits the drain window, releases and exits 0;
//! a second signal exits at once.

#![warn(unreachable_pub)]

pub mod budget;
mod campaign;
pub mod config;
pub(crate) mod drained;
pub(crate) mod footprint;
pub mod health;
pub mod http;
pub mod lease_store;
pub mod metrics;
pub(crate) mod own_pod;
pub mod partitions;
pub mod pod;
pub mod publish;
pub mod rbac;
pub(crate) mod retire;
mod single;
pub mod starting;
pub(crate) mod store_reach;
pub mod timing_risk;
pub mod token_file;
pub mod transfer;
pub mod versions;

use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;
pub use config::Args;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error("store")]
    Store(#[from] leasehold_core::lease::StoreError),
    #[error("Kubernetes API")]
    Kube(#[from] ::kube::Error),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install the signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("cannot write the ready file {}", path.display())]
    ReadyFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("re-executing the sidecar after retiring from the lease")]
    Reexec(#[source] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub async fn run(args: Args) -> Result<()> {
    // `shutdown` stops claiming and releases, on a signal or when the sidecar
    // retires from its lease; `signalled` says a signal came (SIGTERM ends a
    // native sidecar's drain, and the wait of a retired one).
    let (shutdown, signalled) = (CancellationToken::new(), CancellationToken::new());
    let noted = signalled.clone();
    leasehold_runtime::shutdown::exit_on_signals_noting(shutdown.clone(), move |_| noted.cancel())
        .map_err(Error::Signals)?;
    let kube = match args.election.kubernetes() {
        true => Some(::kube::Client::try_default().await?),
        false => None,
    };
    // Before the lease is read: a delete's finalizer waits for this pod
    // from now on (`api::contract::CAMPAIGNS_FOR_ANNOTATION`).
    if let (Some(client), Some(lease), Some(pod), Some(namespace)) = (
        &kube,
        &args.election.lease,
        &args.election.pod_name,
        &args.election.pod_namespace,
    ) {
        let pods = ::kube::Api::namespaced(client.clone(), namespace);
        let annotation = leasehold_kubernetes::api::contract::CAMPAIGNS_FOR_ANNOTATION;
        tokio::select! {
            _ = retire::mark(pods, pod, annotation, lease) => {}
            _ = signalled.cancelled() => return Ok(()),
        }
    }
    let settings = config::resolve(&args.election, kube.clone()).await?;
    info!(identity = %settings.identity, lock = %settings.lock, store = ?settings.store, timing = ?settings.timing, partitions = settings.partitions, "starting");
    let bound = kube.clone().zip(settings.pod.clone()).zip(settings.lease.clone());
    if let Some(((client, pod), lease)) = &bound
        && lease.deleting
    {
        // Created (or restarted) after the delete: never campaign on it.
        let retirement = config::Retirement {
            uid: lease.uid.clone(),
            why: "the DistributedLease was being deleted at start".into(),
        };
        return retire::retire(client.clone(), pod, &lease.name, retirement, &signalled).await;
    }

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    // Registered for both modes: a single lease's renewals and a session's
    // count against the same R − P (LeaseholdTimingAtRisk, issue 38).
    let budget = budget::RenewBudget::new(&settings.timing, &mut registry);
    let (starting_tx, starting) = tokio::sync::watch::channel(None);
    let (http, metrics_listener) = bind_listeners(&args).await?;
    let own = watch_own_pod(kube.clone(), settings.pod.as_ref(), args.app_container.clone());
    // Bound to a lease: campaign only on the store it recorded (issue 54).
    let (recorded_tx, recorded) =
        tokio::sync::watch::channel(bound.as_ref().and_then(|(_, lease)| lease.store_identity.clone()));
    let start = Start {
        args: &args,
        settings: &settings,
        kube: &kube,
        metrics,
        budget: budget.clone(),
        starting: Starting {
            sender: starting_tx,
            problem: starting,
        },
        own,
        signalled: &signalled,
        shutdown: &shutdown,
        bound: &bound,
        recorded: bound.is_some().then_some(recorded),
    };
    let mode = match settings.partitions {
        None => single::start(start).await?,
        Some(count) => partitions::start(start, count),
    };
    let servers = CancellationToken::new();
    let http_task = tokio::spawn(http::serve(http, mode.api, servers.clone()));
    let metrics_task = tokio::spawn(http::serve(
        metrics_listener,
        metrics_router(registry, mode.healthz),
        servers.clone(),
    ));
    let retired = follow_lease(bound.clone(), &settings, &shutdown, mode.set_timing, recorded_tx);
    if let (Some(client), Some(pod)) = (kube, settings.pod.clone()) {
        tokio::spawn(timing_risk::publish(client, pod, budget.verdicts()));
    }

    mode.running.await;
    // Retired: the servers go on answering "follower" until the re-exec.
    let result = after_stop(bound, retired, &signalled).await;
    servers.cancel();
    for task in [http_task, metrics_task] {
        if let Ok(Err(e)) = task.await {
            warn!(error = %e, "HTTP server error");
        }
    }
    result
}

/// What both modes start from.
struct Start<'a> {
    args: &'a Args,
    settings: &'a config::Settings,
    kube: &'a Option<::kube::Client>,
    metrics: Metrics,
    budget: budget::RenewBudget,
    starting: Starting,
    own: Option<tokio::sync::watch::Receiver<own_pod::OwnPod>>,
    /// A signal came (not a retirement).
    signalled: &'a CancellationToken,
    /// Stops claiming and releases: a signal, or retiring from the lease.
    shutdown: &'a CancellationToken,
    /// The bound lease, whose LeaseTransfers a single-lease leader follows.
    bound: &'a Bound,
    /// The store the bound lease recorded, which alone is campaigned on.
    recorded: Option<lease_store::Recorded>,
}

/// A problem reaching the store at start, for `/healthz` (`None`: none).
struct Starting {
    sender: tokio::sync::watch::Sender<Option<String>>,
    problem: tokio::sync::watch::Receiver<Option<String>>,
}

/// A started mode: what the common start-up serves, and what it awaits.
struct Mode {
    /// The HTTP API.
    api: axum::Router,
    /// `/healthz` (and the mode's probes) on the metrics listener.
    healthz: axum::Router,
    /// Applies a timing the bound lease changed to.
    set_timing: Box<dyn Fn(leasehold_core::lease::Timing) + Send>,
    /// Runs until the candidate has stopped: released, or its session closed.
    running: futures::future::BoxFuture<'static, ()>,
}

/// The bound lease's client, pod and binding (`--lease` inside Kubernetes).
type Bound = Option<((::kube::Client, pod::PodRef), config::LeaseBinding)>;

/// Follows the bound lease ([`config::watch_lease`]); when the sidecar must
/// retire from it, records why and cancels `shutdown`: the one path that
/// stops claiming and releases ([`retire`]).
fn follow_lease(
    bound: Bound,
    settings: &config::Settings,
    shutdown: &CancellationToken,
    set_timing: impl Fn(leasehold_core::lease::Timing) + Send + 'static,
    recorded: tokio::sync::watch::Sender<Option<String>>,
) -> Arc<std::sync::OnceLock<config::Retirement>> {
    let retired = Arc::new(std::sync::OnceLock::new());
    if let Some(((client, pod), lease)) = bound {
        let (noted, shutdown, started) = (retired.clone(), shutdown.clone(), settings.clone());
        tokio::spawn(async move {
            let retirement = config::watch_lease(client, &pod.namespace, lease, started, set_timing, recorded).await;
            warn!(why = %retirement.why, "retiring from the lease: stopping to claim, then releasing");
            let _ = noted.set(retirement);
            shutdown.cancel();
        });
    }
    retired
}

/// After the mode stopped: a retired sidecar
/// marks its pod and re-executes onto the new resource ([`retire`]).
async fn after_stop(
    bound: Bound,
    retired: Arc<std::sync::OnceLock<config::Retirement>>,
    signalled: &CancellationToken,
) -> Result<()> {
    match (bound, retired.get()) {
        (Some(((client, pod), lease)), Some(retirement)) if !signalled.is_cancelled() => {
            retire::retire(client, &pod, &lease.name, retirement.clone(), signalled).await
        }
        _ => Ok(()),
    }
}

/// Our own pod's watch, inside Kubernetes.
pub(crate) fn watch_own_pod(
    kube: Option<::kube::Client>,
    pod: Option<&pod::PodRef>,
    app_container: Option<String>,
) -> Option<tokio::sync::watch::Receiver<own_pod::OwnPod>> {
    let (client, pod) = kube.zip(pod)?;
    let (tx, rx) = tokio::sync::watch::channel(own_pod::OwnPod::default());
    let pods = ::kube::Api::namespaced(client, &pod.namespace);
    tokio::spawn(own_pod::watch(pods, pod.name.clone(), app_container, tx));
    Some(rx)
}

async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })
}

/// The `--ready-file` document: where the listeners are bound.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Listening {
    pub http: std::net::SocketAddr,
    pub metrics: std::net::SocketAddr,
}

/// Binds the HTTP API and the metrics listener; then, with `--ready-file`,
/// says where they are (with port 0 the system picked the ports, so
/// whoever started the process learns them only from this file).
async fn bind_listeners(args: &Args) -> Result<(TcpListener, TcpListener)> {
    let http = bind(args.http_addr).await?;
    let metrics = bind(args.metrics_addr).await?;
    if let Some(path) = &args.ready_file {
        let listening = Listening {
            http: http.local_addr().map_err(|source| Error::Listen {
                addr: args.http_addr,
                source,
            })?,
            metrics: metrics.local_addr().map_err(|source| Error::Listen {
                addr: args.metrics_addr,
                source,
            })?,
        };
        token_file::write(path, &listening)
            .await
            .map_err(|source| Error::ReadyFile {
                path: path.clone(),
                source,
            })?;
    }
    Ok((http, metrics))
}

/// `/metrics`, and `healthz` (a router serving `/healthz` for the mode run;
/// `leasehold run` serves `/metrics` alone).
pub fn metrics_router(registry: Registry, healthz: axum::Router) -> axum::Router {
    let registry = Arc::new(registry);
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move {
                    let mut text = String::new();
                    match prometheus_client::encoding::text::encode(&mut text, &registry) {
                        Ok(()) => (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                            .into_response(),
                        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                    }
                }
            }),
        )
        .merge(healthz)
}

/// The longest wait between two attempts at anything the sidecar retries
/// against the Kubernetes API or, at start, the store (before jitter, which
/// adds up to as much again): a write, a watch, a connection.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Exponential from 100 ms to [`BACKOFF_CAP`], jittered, never giving up.
pub fn capped_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(BACKOFF_CAP)
        .with_jitter()
        .without_max_times()
}
