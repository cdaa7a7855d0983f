//! `leasehold sidecar`: runs the elector next to the main container and
//! publishes who leads: the local HTTP API, Prometheus metrics, an optional
//! token file and, inside Kubernetes, the pod label, the readiness-gate
//! condition and Events.
//!
//! Ordering: on loss or deadline the sidecar stops claiming first (HTTP 503
//! and the watch event come from the elector's state at once; then the
//! readiness condition) and only then fixes labels. On SIGTERM it stops
//! claiming, waits the drain window, releases and exits 0; a second signal
//! exits at once. The HTTP API starts before the store is reached: a store
//! unreachable at start is retried and reported (`starting`), not an exit.
//!
//! A partitioned lock (`--partitions`, `spec.partitions`) runs
//! [`partitions`] instead of the elector.

pub mod budget;
pub mod config;
pub mod footprint;
pub mod health;
pub mod http;
pub mod interface;
pub mod metrics;
pub mod partitions;
pub mod publish;
pub mod rbac;
pub mod starting;
pub mod timing_risk;
pub mod token_file;
pub mod versions;

use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::lease::{Change, Elector, LeaderContext, LeaseStore};
use crate::sidecar::metrics::{MeteredStore, Metrics};
pub use config::Args;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("invalid timing ({flags})")]
    Timing {
        flags: &'static str,
        #[source]
        source: crate::lease::TimingError,
    },
    #[error(transparent)]
    Select(#[from] crate::store::select::SelectError),
    #[error("store")]
    Store(#[from] crate::lease::StoreError),
    #[error("Kubernetes API")]
    Kube(#[from] ::kube::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("signals: {0}")]
    Signals(std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub async fn run(args: Args) -> Result<()> {
    let shutdown = CancellationToken::new();
    crate::shutdown::exit_on_signals(shutdown.clone()).map_err(Error::Signals)?;
    let kube = match args.election.kubernetes() {
        true => Some(::kube::Client::try_default().await?),
        false => None,
    };
    let settings = config::resolve(&args.election, kube.clone()).await?;
    info!(identity = %settings.identity, lock = %settings.lock, store = ?settings.store, timing = ?settings.timing, partitions = ?settings.partitions, "starting");
    if let Some(count) = settings.partitions {
        return partitions::run(args, settings, count, kube, shutdown).await;
    }

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let (starting_tx, starting) = tokio::sync::watch::channel(None);
    let (choice, metered) = (settings.store.clone(), metrics.clone());
    let create_table = args.election.create_table;
    let starting_store: Arc<dyn LeaseStore> = Arc::new(starting::StartingStore::spawn(
        move || {
            let (choice, metrics) = (choice.clone(), metered.clone());
            Box::pin(async move {
                let store: Arc<dyn LeaseStore> =
                    Arc::new(MeteredStore::new(choice.connect(create_table).await?, metrics));
                Ok(store)
            })
        },
        args.election.create_table,
        starting_tx,
    ));
    // The renewal budget watches what the elector sees: every call, once connected.
    let budget = budget::RenewBudget::new(starting_store, &settings.timing, &mut registry);
    let verdicts = budget.verdicts();
    let store: Arc<dyn LeaseStore> = Arc::new(budget);

    let http = bind(args.http_addr).await?;
    let metrics_listener = bind(args.metrics_addr).await?;

    let version = match (&kube, &settings.pod) {
        (Some(client), Some(pod)) => {
            let pods = ::kube::Api::namespaced(client.clone(), &pod.namespace);
            let mut revisions = versions::Revisions::new(::kube::Api::namespaced(client.clone(), &pod.namespace));
            let flags = settings.version.clone();
            versions::own_version(&pods, &mut revisions, &pod.name, args.app_container.as_deref(), flags).await
        }
        _ => settings.version.clone(),
    };
    info!(version = ?version, policy = ?settings.versions, "version");
    let elector = Elector::new(settings.lock.clone(), settings.identity.clone(), settings.timing)
        .with_version(version.clone(), settings.versions.fence);
    let transitions = elector.transitions();
    // Leader work here is the drain window: when stepping down on purpose
    // (SIGTERM, the app turned unhealthy) the main container sees 503 first
    // and gets time to finish before we release.
    let handle = elector.spawn_with_work(store, shutdown.clone(), drain_on_step_down(args.drain));
    let state = handle.subscribe();
    tokio::spawn(footprint::release_start_up_pages(
        state.clone(),
        settings.timing.retry_period,
    ));
    let control = handle.control();
    let app = start_health_sources(&args, kube.clone(), settings.pod.clone(), metrics.clone(), move |on| {
        control.set_campaigning(on)
    });
    let servers = CancellationToken::new();
    let api = crate::sidecar::http::ApiState {
        leader: state.clone(),
        app: app.clone(),
        starting,
    };
    let http_task = tokio::spawn(crate::sidecar::http::serve(
        http,
        crate::sidecar::http::router(api.clone()),
        servers.clone(),
    ));
    let healthz = axum::Router::new()
        .route("/healthz", axum::routing::get(crate::sidecar::http::healthz))
        .with_state(api.clone());
    let metrics_task = tokio::spawn(crate::sidecar::http::serve(
        metrics_listener,
        metrics_router(registry, healthz),
        servers.clone(),
    ));
    tokio::spawn(metrics.follow(state.clone()));
    if let Some(path) = args.election.token_file.clone() {
        tokio::spawn(token_file::follow(path, state.clone()));
    }
    if let (Some(client), Some(pod), Some(lease)) = (kube.clone(), settings.pod.clone(), args.election.lease.clone()) {
        let control = handle.control();
        tokio::spawn(config::watch_lease(client, pod, lease, settings.clone(), move |t| {
            control.set_timing(t)
        }));
    }
    if let (Some(client), Some(pod)) = (kube.clone(), settings.pod.clone()) {
        tokio::spawn(timing_risk::publish(client, pod, verdicts));
    }
    if let (Some(client), Some(pod)) = (kube.clone(), settings.pod.clone())
        && settings.versions.prefer != crate::lease::Prefer::None
    {
        tokio::spawn(versions::follow_peers(
            ::kube::Api::namespaced(client.clone(), &pod.namespace),
            versions::Revisions::new(::kube::Api::namespaced(client, &pod.namespace)),
            versions::Candidate {
                me: pod.name,
                selector: settings.publishing.selector.clone(),
                app_container: args.app_container.clone(),
                mine: version,
                prefer: settings.versions.prefer,
                fence: settings.versions.fence,
            },
            handle.control(),
            handle.subscribe(),
        ));
    }
    let publisher = kube.zip(settings.pod.clone()).map(|(client, pod)| {
        let publisher = publish::Publisher::new(client, pod, settings.publishing.clone());
        tokio::spawn(publisher.run(state.clone(), transitions, app.clone(), handle.control()))
    });

    handle.join().await;
    info!("elector stopped");
    if let Some(publisher) = publisher
        && let Err(e) = publisher.await
    {
        warn!(error = %e, "the Kubernetes publisher ended abnormally");
    }
    servers.cancel();
    for task in [http_task, metrics_task] {
        if let Ok(Err(e)) = task.await {
            warn!(error = %e, "HTTP server error");
        }
    }
    Ok(())
}

/// The sidecar's leader work: when the term ends on purpose (SIGTERM, the
/// app turned unhealthy) wait `drain` before the elector releases; a lost
/// term ends at once.
fn drain_on_step_down(drain: Duration) -> impl FnMut(LeaderContext) -> futures::future::BoxFuture<'static, ()> {
    move |ctx: LeaderContext| {
        Box::pin(async move {
            ctx.cancelled.cancelled().await;
            // The cancellation can arrive (it follows the shutdown token)
            // before the elector publishes why the term ended: read the
            // reason only once the state no longer claims.
            let mut state = ctx.state.clone();
            let ended = state.wait_for(|s| !s.leader).await.map(|s| s.change.clone());
            if ended.is_ok_and(|change| change == Change::SteppingDown) {
                info!(?drain, "stopped claiming; draining before the release");
                tokio::time::sleep(drain).await;
            }
        })
    }
}

/// Starts the configured app health sources; with none, the app counts as
/// healthy and the sidecar always campaigns. With sources, `set_campaigning`
/// is told `false` at once and then follows their verdict.
fn start_health_sources(
    args: &Args,
    kube: Option<::kube::Client>,
    pod: Option<config::PodRef>,
    metrics: Metrics,
    set_campaigning: impl Fn(bool) + Send + 'static,
) -> tokio::sync::watch::Receiver<health::AppHealth> {
    use health::Verdict;
    let mut sources = Vec::new();
    if let Some(url) = args.app_health_url.clone() {
        let (tx, rx) = tokio::sync::watch::channel(Verdict::Unknown(format!("{url} not polled yet")));
        let (interval, timeout, failures) = (
            args.app_health_interval,
            args.app_health_timeout,
            args.app_health_failures,
        );
        tokio::spawn(health::poll_url(url, interval, timeout, failures, tx));
        sources.push(("url", rx));
    }
    if let Some(container) = args.app_container.clone() {
        match kube.zip(pod) {
            Some((client, pod)) => {
                let (tx, rx) = tokio::sync::watch::channel(Verdict::Unknown("pod not read yet".into()));
                let pods = ::kube::Api::namespaced(client, &pod.namespace);
                tokio::spawn(health::watch_container(pods, pod.name, container, tx));
                sources.push(("container", rx));
            }
            None => warn!(%container, "--app-container needs the Kubernetes API; ignoring it"),
        }
    }
    let (health_tx, health_rx) = tokio::sync::watch::channel(health::AppHealth::default());
    if !sources.is_empty() {
        // Campaign only once a source says the app is healthy.
        set_campaigning(false);
        tokio::spawn(health::follow(sources, health_tx, set_campaigning));
        tokio::spawn(metrics.follow_app_health(health_rx.clone()));
    }
    health_rx
}

async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })
}

/// `/metrics`, and `healthz` (a router serving `/healthz` for the mode run).
fn metrics_router(registry: Registry, healthz: axum::Router) -> axum::Router {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Identity, Timing};
    use crate::store::MemoryStore;

    /// SIGTERM: 503 at once, the drain, then the release. On a current-thread
    /// runtime with paused time the leader work wakes on shutdown in the same
    /// turn as the elector, so a check made before the elector says
    /// "stepping down" would skip the drain.
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_claiming_then_drains_then_releases() {
        let drain = Duration::from_secs(5);
        let store = MemoryStore::new(1);
        let timing = Timing::default();
        let elector = Elector::new("drain", Identity::new(None, None, "pod-0"), timing);
        let shutdown = CancellationToken::new();
        let handle = elector.spawn_with_work(Arc::new(store.clone()), shutdown.clone(), drain_on_step_down(drain));
        let mut state = handle.subscribe();
        state.wait_for(|s| s.leader).await.unwrap();
        shutdown.cancel();
        state.wait_for(|s| !s.leader).await.unwrap();
        let stopped = tokio::time::Instant::now();
        let joined = tokio::spawn(handle.join());
        tokio::time::sleep(drain - Duration::from_millis(1)).await;
        let held = store.observe("drain").await.unwrap();
        assert!(
            held.live_holder().is_some(),
            "released {:?} into a {drain:?} drain",
            stopped.elapsed()
        );
        joined.await.unwrap();
        assert!(stopped.elapsed() >= drain);
        assert_eq!(
            store.observe("drain").await.unwrap().live_holder(),
            None,
            "released after the drain"
        );
    }
}
