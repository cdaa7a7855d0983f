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
pub mod drained;
pub mod footprint;
pub mod health;
pub mod http;
pub mod metrics;
pub mod own_pod;
pub mod partitions;
pub mod pod;
pub mod publish;
pub mod rbac;
pub mod retire;
pub mod starting;
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

use crate::lease::{Change, Elector, LeaderContext, LeaseStore};
use crate::sidecar::metrics::{MeteredStore, Metrics};
pub use config::Args;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error("store")]
    Store(#[from] crate::lease::StoreError),
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
    crate::shutdown::exit_on_signals_noting(shutdown.clone(), move |_| noted.cancel()).map_err(Error::Signals)?;
    let kube = match args.election.kubernetes() {
        true => Some(::kube::Client::try_default().await?),
        false => None,
    };
    let settings = config::resolve(&args.election, kube.clone()).await?;
    info!(identity = %settings.identity, lock = %settings.lock, store = ?settings.store, timing = ?settings.timing, partitions = ?settings.partitions, "starting");
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
    if let Some(count) = settings.partitions {
        let retired = follow_lease(bound.clone(), &settings, &shutdown, |_| {
            warn!("the lease's timing changed; a partitioned sidecar applies it after a restart");
        });
        partitions::run(args, settings, count, kube, shutdown).await?;
        return after_stop(bound, retired, &signalled).await;
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

    let (http, metrics_listener) = bind_listeners(&args).await?;

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
    // The holder carries the pod UID, so that the next process of this pod
    // (the kubelet restarting this container) takes the lease over at once
    // instead of waiting D. Only the sidecar: a `leasehold run` command may
    // outlive its dead runner by the watchdog's grace period.
    let identity = match args.election.pod_uid.as_deref() {
        Some(uid) => settings.identity.clone().in_pod(uid).map_err(config::Error::PodUid)?,
        None => settings.identity.clone(),
    };
    let elector = Elector::new(settings.lock.clone(), identity, settings.timing)
        .with_version(version.clone(), settings.versions.fence);
    let transitions = elector.transitions();
    let own = watch_own_pod(kube.clone(), settings.pod.as_ref(), args.app_container.clone());
    // Leader work here is the drain window: when stepping down on purpose
    // (SIGTERM, the pod deleted, the app turned unhealthy) the main
    // container sees 503 first and gets time to finish before we release.
    let reserve = own_pod::release_reserve(&settings.timing);
    let (drained, acked) = tokio::sync::watch::channel(None);
    let work = drain_on_step_down(args.drain, reserve, own.clone(), signalled.clone(), acked);
    let handle = elector.spawn_with_work(store, shutdown.clone(), work);
    let state = handle.subscribe();
    tokio::spawn(footprint::release_start_up_pages(
        state.clone(),
        settings.timing.retry_period,
    ));
    let control = handle.control();
    let app = start_health_sources(&args, own.clone(), metrics.clone(), move |on| {
        control.set_campaigning(on)
    });
    let servers = CancellationToken::new();
    let api = http::ApiState {
        leader: state.clone(),
        app: app.clone(),
        starting,
    };
    // The drain acknowledgement, on the local API only (never the metrics port).
    let acks = drained::Acks {
        leader: state.clone(),
        drained,
    };
    let local_api = http::router(api.clone()).merge(drained::router(acks));
    let http_task = tokio::spawn(http::serve(http, local_api, servers.clone()));
    let healthz = axum::Router::new()
        .route("/healthz", axum::routing::get(http::healthz))
        .route(crate::api::contract::GATE_PROBE_PATH, axum::routing::get(http::gate))
        .with_state(api.clone());
    let metrics_task = tokio::spawn(http::serve(
        metrics_listener,
        metrics_router(registry, healthz),
        servers.clone(),
    ));
    tokio::spawn(metrics.follow(settings.lock.clone(), state.clone()));
    if let Some(path) = args.election.token_file.clone() {
        tokio::spawn(token_file::follow(path, state.clone()));
    }
    let control = handle.control();
    let retired = follow_lease(bound.clone(), &settings, &shutdown, move |t| control.set_timing(t));
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
    if let Some(((client, pod), lease)) = bound.clone() {
        let transfers = transfer::Transfers {
            transfers: ::kube::Api::namespaced(client.clone(), &pod.namespace),
            pods: ::kube::Api::namespaced(client.clone(), &pod.namespace),
            lease: lease.name,
            selector: settings.publishing.selector.clone(),
            window: settings.timing.lease_duration,
            drain: args.drain,
            recorder: pod::pod_recorder(client, &pod).0,
            me: pod,
        };
        tokio::spawn(transfers.follow(handle.control(), handle.subscribe()));
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
    // Retired: the servers go on answering "follower" until the re-exec.
    let retiring = after_stop(bound, retired, &signalled);
    let result = retiring.await;
    servers.cancel();
    for task in [http_task, metrics_task] {
        if let Ok(Err(e)) = task.await {
            warn!(error = %e, "HTTP server error");
        }
    }
    result
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
    set_timing: impl Fn(crate::lease::Timing) + Send + 'static,
) -> Arc<std::sync::OnceLock<config::Retirement>> {
    let retired = Arc::new(std::sync::OnceLock::new());
    if let Some(((client, pod), lease)) = bound {
        let (noted, shutdown, started) = (retired.clone(), shutdown.clone(), settings.clone());
        tokio::spawn(async move {
            let retirement = config::watch_lease(client, &pod.namespace, lease, started, set_timing).await;
            warn!(why = %retirement.why, "retiring from the lease: stopping to claim, then releasing");
            let _ = noted.set(retirement);
            shutdown.cancel();
        });
    }
    retired
}

/// After the elector (or the partitioned run) stopped: a retired sidecar
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

/// The sidecar's leader work: when the term ends on purpose (SIGTERM, the
/// pod deleted, the app turned unhealthy) drain before the elector releases:
/// `drain` at most, over as soon as the app container run that led has
/// exited, and never past `reserve` before the pod's grace period ends
/// ([`own_pod::drain`]), or as soon as the app acknowledges the term's
/// drain ([`drained`]); a lost term ends at once. `signalled`: a signal
/// came (not a retirement, which drains like any step-down).
fn drain_on_step_down(
    drain: Duration,
    reserve: Duration,
    own: Option<tokio::sync::watch::Receiver<own_pod::OwnPod>>,
    signalled: CancellationToken,
    acked: tokio::sync::watch::Receiver<Option<crate::lease::FencingToken>>,
) -> impl FnMut(LeaderContext) -> futures::future::BoxFuture<'static, ()> {
    move |ctx: LeaderContext| {
        let (own, signalled, acked) = (own.clone(), signalled.clone(), acked.clone());
        // The app run this term leads for: its end ends the drain.
        let led = own.as_ref().and_then(|o| o.borrow().app);
        Box::pin(async move {
            ctx.cancelled.cancelled().await;
            // The cancellation can arrive (it follows the shutdown token)
            // before the elector publishes why the term ended: read the
            // reason only once the state no longer claims.
            let mut state = ctx.state.clone();
            let ended = state.wait_for(|s| !s.leader).await.map(|s| s.change.clone());
            if ended.is_ok_and(|change| change == Change::SteppingDown) {
                info!(?drain, "stopped claiming; draining before the release");
                tokio::select! {
                    () = own_pod::drain(drain, reserve, own, led, signalled) => {}
                    () = drained::acknowledged(acked, ctx.token) => info!("the app acknowledged the drain; releasing"),
                }
            }
        })
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

/// Starts the configured app health sources and the campaign that follows
/// them and the pod's deletion; with no source, the app counts as healthy.
/// With sources, the elector stops campaigning at once until one says the
/// app is healthy.
fn start_health_sources(
    args: &Args,
    own: Option<tokio::sync::watch::Receiver<own_pod::OwnPod>>,
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
        match own.clone() {
            Some(own) => {
                let (tx, rx) = tokio::sync::watch::channel(Verdict::Unknown("pod not read yet".into()));
                tokio::spawn(own_pod::follow_app_verdict(own, tx));
                sources.push(("container", rx));
            }
            None => warn!(%container, "--app-container needs the Kubernetes API; ignoring it"),
        }
    }
    let (health_tx, health_rx) = tokio::sync::watch::channel(health::AppHealth::default());
    if !sources.is_empty() {
        // Campaign only once a source says the app is healthy.
        set_campaigning(false);
        tokio::spawn(health::follow(sources, health_tx));
        tokio::spawn(metrics.follow_app_health(health_rx.clone()));
    }
    tokio::spawn(own_pod::steer_campaign(health_rx.clone(), own, set_campaigning));
    health_rx
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
    use prometheus_client::registry::Registry;

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
        let handle = elector.spawn_with_work(
            Arc::new(store.clone()),
            shutdown.clone(),
            drain_on_step_down(drain, Duration::ZERO, None, shutdown.clone(), never_acked()),
        );
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

    /// A drain no app acknowledges.
    fn never_acked() -> tokio::sync::watch::Receiver<Option<crate::lease::FencingToken>> {
        tokio::sync::watch::channel(None).1
    }

    /// Issue 35: the app's acknowledgement of the term it stood aside from
    /// ends the drain at once; the release follows.
    #[tokio::test(start_paused = true)]
    async fn an_acknowledged_drain_releases_at_once() {
        let drain = Duration::from_secs(60);
        let store = MemoryStore::new(1);
        let elector = Elector::new("drain", Identity::new(None, None, "pod-0"), Timing::default());
        let shutdown = CancellationToken::new();
        let (drained, acked) = tokio::sync::watch::channel(None);
        let handle = elector.spawn_with_work(
            Arc::new(store.clone()),
            shutdown.clone(),
            drain_on_step_down(drain, Duration::ZERO, None, shutdown.clone(), acked),
        );
        let mut state = handle.subscribe();
        let token = state.wait_for(|s| s.leader).await.unwrap().token;
        shutdown.cancel();
        state.wait_for(|s| !s.leader).await.unwrap();
        let stopped = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            store.observe("drain").await.unwrap().live_holder().is_some(),
            "draining"
        );
        drained.send_replace(token);
        handle.join().await;
        assert!(
            stopped.elapsed() < drain / 10,
            "released {:?} after stopping",
            stopped.elapsed()
        );
        assert_eq!(store.observe("drain").await.unwrap().live_holder(), None);
    }

    /// The metrics port, which listens on every address, has no drain
    /// acknowledgement.
    #[tokio::test]
    async fn the_metrics_port_serves_no_drain_acknowledgement() {
        use tower::ServiceExt;
        let router = metrics_router(Registry::default(), axum::Router::new());
        let request = axum::http::Request::post(format!("{}?token=1", drained::PATH))
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::NOT_FOUND);
    }

    /// web-0's sidecar as `run` wires it (own-pod watch, health, campaign,
    /// drain), on the API server model and a memory store, leading with
    /// its app container running: the store, the model and the elector.
    struct LeaderPod {
        api: crate::testing::api::ApiServer,
        store: MemoryStore,
        handle: crate::lease::ElectorHandle,
        /// SIGTERM.
        shutdown: CancellationToken,
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The app container's status: running (and ready) or terminated.
    fn app_status(running: bool, restarts: i32) -> serde_json::Value {
        let state = match running {
            true => serde_json::json!({"running": {"startedAt": "2026-11-25T09:00:00Z"}}),
            false => serde_json::json!({"terminated": {"exitCode": 137, "reason": "Error",
                "startedAt": "2026-11-25T09:00:00Z", "finishedAt": "2026-11-25T09:01:00Z"}}),
        };
        serde_json::json!({"name": "app", "ready": running, "restartCount": restarts,
            "image": "app", "imageID": "", "state": state})
    }

    /// A lease that outlasts the drains and grace periods here (D = 2 min,
    /// P = 2 s): an undrained lease must not simply expire under the test.
    fn long_lease() -> Timing {
        Timing::new(
            Duration::from_secs(120),
            Duration::from_secs(60),
            Duration::from_secs(2),
            0.0,
        )
        .unwrap()
    }

    impl LeaderPod {
        /// `native`: the sidecar is an init container with `restartPolicy: Always`.
        async fn start(drain: &str, native: bool) -> LeaderPod {
            use crate::testing::api::{ApiServer, pods};
            use clap::Parser;
            let api = ApiServer::new(Some(rbac::allows_request));
            let mut pod = pods::pod("web-0", "prod", serde_json::json!({"app": "web"}), None);
            pod["status"]["containerStatuses"] = serde_json::json!([app_status(true, 0)]);
            if native {
                pod["spec"]["initContainers"] =
                    serde_json::json!([{"name": crate::api::contract::SIDECAR_CONTAINER, "restartPolicy": "Always"}]);
            }
            api.insert(&pods::collection("prod"), pod);
            let cli = Cli::parse_from(["sidecar", "--app-container", "app", "--drain", drain]);
            let pod = pod::PodRef {
                name: "web-0".into(),
                namespace: "prod".into(),
                uid: Some("uid-0".into()),
            };
            let timing = long_lease();
            let own = watch_own_pod(Some(api.client("prod")), Some(&pod), cli.args.app_container.clone());
            let store = MemoryStore::new(1);
            let elector = Elector::new("web", Identity::new(None, Some("prod".into()), "web-0"), timing);
            let shutdown = CancellationToken::new();
            let reserve = own_pod::release_reserve(&timing);
            let work = drain_on_step_down(cli.args.drain, reserve, own.clone(), shutdown.clone(), never_acked());
            let handle = elector.spawn_with_work(Arc::new(store.clone()), shutdown.clone(), work);
            let control = handle.control();
            let metrics = Metrics::new(&mut Registry::default());
            start_health_sources(&cli.args, own, metrics, move |on| control.set_campaigning(on));
            handle.subscribe().wait_for(|s| s.leader).await.unwrap();
            LeaderPod {
                api,
                store,
                handle,
                shutdown,
            }
        }

        fn update(&self, change: impl FnOnce(&mut serde_json::Value)) {
            use crate::testing::api::pods;
            let mut pod = self.api.get(&pods::collection("prod"), "web-0").unwrap();
            change(&mut pod);
            self.api.insert(&pods::collection("prod"), pod);
        }

        /// Marks the pod deleted with `grace`, as the API server does.
        fn delete(&self, grace: Duration) {
            let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + grace).to_string();
            self.update(|pod| {
                pod["metadata"]["deletionTimestamp"] = serde_json::json!(at);
                pod["metadata"]["deletionGracePeriodSeconds"] = serde_json::json!(grace.as_secs());
            });
        }

        fn app(&self, running: bool, restarts: i32) {
            self.update(|pod| pod["status"]["containerStatuses"] = serde_json::json!([app_status(running, restarts)]));
        }

        async fn held(&self) -> bool {
            self.store.observe("web").await.unwrap().live_holder().is_some()
        }

        /// Waits (paused time) for the release; how long it took.
        async fn released(&self) -> Duration {
            let started = tokio::time::Instant::now();
            while self.held().await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            started.elapsed()
        }
    }

    /// Item 1 of issue 25: the pod deleted while its app ignores SIGTERM.
    /// The leader stops claiming at once, keeps the lease through the drain
    /// (60 s here), and releases before the grace period (30 s) runs out,
    /// leaving the release its reserve (P): a sidecar is never killed
    /// holding a lease it could have released.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_leader_pod_stops_claiming_at_once_and_releases_before_its_grace_period_ends() {
        let pod = LeaderPod::start("60s", false).await;
        let grace = Duration::from_secs(30);
        let reserve = own_pod::release_reserve(&long_lease());
        pod.delete(grace);
        let mut state = pod.handle.subscribe();
        state.wait_for(|s| !s.leader).await.unwrap();
        assert!(pod.held().await, "stopped claiming, still holding the lease to drain");
        // The deletion timestamp has whole seconds, as the API server's.
        tokio::time::sleep(grace - reserve - Duration::from_secs(2)).await;
        assert!(pod.held().await, "the app still runs: the drain goes on");
        let released = pod.released().await;
        assert!(
            released <= Duration::from_secs(2),
            "released {released:?} after the reserve began: the grace period ends {reserve:?} later"
        );
        assert_eq!(pod.handle.state().change, Change::Released);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!pod.held().await, "a terminating pod never campaigns again");
        assert!(!pod.handle.state().campaigning);
    }

    /// With the app container gone there is nothing left to drain: a
    /// deleted pod releases as soon as its status shows the app exited.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_leader_pod_releases_as_soon_as_its_app_has_exited() {
        let pod = LeaderPod::start("60s", false).await;
        pod.delete(Duration::from_secs(30));
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(pod.held().await, "the app still runs: draining");
        pod.app(false, 0);
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the app exited"
        );
    }

    /// Item 3 of issue 25: an app container that terminated releases at
    /// once, without the drain (60 s here); restarted and ready, it leads again.
    #[tokio::test(start_paused = true)]
    async fn an_app_container_that_exited_releases_at_once_and_campaigns_again_when_restarted() {
        let pod = LeaderPod::start("60s", false).await;
        pod.app(false, 0);
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the app exited"
        );
        pod.app(true, 1);
        pod.handle.subscribe().wait_for(|s| s.leader).await.unwrap();
    }

    /// The drain ends when the run of the app that led has ended, also when
    /// the kubelet has already restarted it (running again, one more restart).
    #[tokio::test(start_paused = true)]
    async fn an_app_restarted_between_two_looks_ends_the_drain() {
        let pod = LeaderPod::start("60s", false).await;
        pod.update(|p| {
            let mut restarted = app_status(true, 1);
            restarted["ready"] = serde_json::json!(false);
            p["status"]["containerStatuses"] = serde_json::json!([restarted]);
        });
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the restart"
        );
    }

    /// A native sidecar gets SIGTERM only once the app containers have
    /// exited, while the pod's status still shows the app running (the
    /// kubelet writes it once the whole pod has stopped): the SIGTERM ends
    /// the drain.
    #[tokio::test(start_paused = true)]
    async fn sigterm_to_a_native_sidecar_of_a_deleted_pod_ends_the_drain() {
        let pod = LeaderPod::start("60s", true).await;
        pod.delete(Duration::from_secs(30));
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(pod.held().await, "the app still runs: draining");
        pod.shutdown.cancel();
        let released = pod.released().await;
        assert!(released < Duration::from_secs(1), "released {released:?} after SIGTERM");
    }

    /// A sidecar that is a regular container gets SIGTERM together with the
    /// app: the app may still be running, so the drain goes on.
    #[tokio::test(start_paused = true)]
    async fn sigterm_to_a_sidecar_container_keeps_the_drain() {
        let pod = LeaderPod::start("60s", false).await;
        pod.delete(Duration::from_secs(30));
        pod.shutdown.cancel();
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(pod.held().await, "the app may still run: draining");
    }
}
