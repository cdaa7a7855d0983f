//! `leasehold operator`: reconciles `DistributedLease` resources.
//!
//! # High availability
//!
//! Run several replicas; one reconciles, the others stand by. By default the
//! active one holds a `coordination.k8s.io` Lease in the operator's namespace
//! (client-go's leader election), so HA needs no infrastructure beyond the
//! cluster; `--election-backend=spanner` elects on a lock row in Cloud
//! Spanner instead, with store-clock expiry and fencing tokens (see
//! [`election`]). `--leader-election=false` runs a single replica without a lock.
//!
//! # Shutdown
//!
//! One [`CancellationToken`] owns shutdown: SIGTERM or SIGINT cancels it, the
//! controller finishes the reconciles in flight, the election releases the
//! operator's lock, the HTTP server drains; a second signal exits at once.

#![warn(unreachable_pub)]

pub mod candidate;
pub mod election;
pub mod http;
pub mod index;
pub mod metrics;
pub(crate) mod observer;
mod partitions;
pub(crate) mod preferred;
pub mod rbac;
pub mod reconcile;
pub mod rollout;
pub mod stores;
/// The scripted API server of the reconcile's tests (the operator's unit
/// tests and the emulator tests, `tests/stores/spanner.rs`): the operator's
/// own test kit, not part of its API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use self::election::{Backend, DEFAULT_LEASE_NAME, Election, LeaseElection, SpannerElection};
use self::http::Role;
use self::index::Selectors;
use self::metrics::Metrics;
use self::reconcile::{Context, FIELD_MANAGER, error_policy, reconcile};
use self::stores::{OpenStores, StoreProvider};
use leasehold_core::lease::timing::parse_duration_flag;
use leasehold_core::lease::{Identity, Timing, parse_cluster_name};
use leasehold_kubernetes::api::contract::{ENV_CLUSTER_NAME, ENV_POD_NAME, ENV_POD_NAMESPACE};
use leasehold_kubernetes::api::{DEFAULT_TABLE, DistributedLease};
use leasehold_stores::spanner::SpannerConfig;

/// Without leader election nobody waits to take over, so reconciles in
/// flight at shutdown get longer to finish.
const STANDALONE_GRACE: Duration = Duration::from_secs(10);

/// Why the operator could not start or ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid operator election timing (--election-lease-duration/-renew-deadline/-retry-period)")]
    ElectionTiming(#[source] leasehold_core::lease::TimingError),
    #[error("{0} is required for --election-backend={1}")]
    ElectionFlagMissing(&'static str, &'static str),
    #[error(transparent)]
    Election(#[from] election::Error),
    #[error("cannot listen for SIGTERM and SIGINT")]
    Signals(#[source] std::io::Error),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] leasehold_kubernetes::api::client::ClientError),
    #[error("the injection webhook failed")]
    Webhook(#[from] webhook::Error),
    #[error("the HTTP server failed")]
    Http(#[source] std::io::Error),
    #[error("a task of the operator ended abnormally")]
    Task(#[from] tokio::task::JoinError),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address of the /metrics, /healthz and /readyz endpoints.
    #[arg(long, env = "LEASEHOLD_OPERATOR_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Reconcile only while this replica holds the operator lock (run several replicas).
    #[arg(long, env = "LEASEHOLD_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Where the operator's election lives: a Kubernetes Lease (no extra
    /// infrastructure) or a lock row in Cloud Spanner.
    #[arg(long, env = "LEASEHOLD_ELECTION_BACKEND", value_enum, default_value_t = Backend::Lease)]
    pub election_backend: Backend,
    /// Name of the operator's coordination.k8s.io Lease (lease backend).
    #[arg(long, env = "LEASEHOLD_ELECTION_LEASE_NAME", default_value = DEFAULT_LEASE_NAME)]
    pub election_lease_name: String,
    /// Namespace of the operator's Lease (lease backend; default: --pod-namespace).
    #[arg(long, env = "LEASEHOLD_ELECTION_LEASE_NAMESPACE")]
    pub election_lease_namespace: Option<String>,
    /// Spanner database of the operator lock (spanner backend):
    /// projects/<p>/instances/<i>/databases/<d>.
    #[arg(long, env = "LEASEHOLD_ELECTION_DATABASE")]
    pub election_database: Option<String>,
    /// Table of the operator lock (spanner backend; created when missing).
    #[arg(long, env = "LEASEHOLD_ELECTION_TABLE", default_value = DEFAULT_TABLE)]
    pub election_table: String,
    /// Name of the operator lock (spanner backend).
    #[arg(
        long,
        env = "LEASEHOLD_ELECTION_LOCK",
        default_value = "leasehold-system/leasehold-operator"
    )]
    pub election_lock: String,
    /// Operator lock duration (D; whole seconds with the lease backend) [default: 15s].
    #[arg(long, env = "LEASEHOLD_ELECTION_LEASE_DURATION", value_parser = parse_duration_flag)]
    pub election_lease_duration: Option<Duration>,
    /// Operator lock renew deadline (R < D) [default: D·10/15, so 10s].
    #[arg(long, env = "LEASEHOLD_ELECTION_RENEW_DEADLINE", value_parser = parse_duration_flag)]
    pub election_renew_deadline: Option<Duration>,
    /// Operator lock retry period (P < R) [default: R·2/10, so 2s].
    #[arg(long, env = "LEASEHOLD_ELECTION_RETRY_PERIOD", value_parser = parse_duration_flag)]
    pub election_retry_period: Option<Duration>,
    /// This replica's pod name, part of its identity (defaults to the host
    /// name); downward API, as for the sidecar.
    #[arg(long, env = ENV_POD_NAME)]
    pub pod_name: Option<String>,
    /// This replica's namespace, part of its identity (downward API).
    #[arg(long, env = ENV_POD_NAMESPACE)]
    pub pod_namespace: Option<String>,
    /// This cluster's name, as the sidecars put it in their identities
    /// (`cluster/namespace/pod#nonce@uid`), for locks shared across clusters.
    /// The webhook passes it on to every sidecar it injects.
    #[arg(long, env = ENV_CLUSTER_NAME, value_parser = parse_cluster_name)]
    pub cluster_name: Option<String>,
    /// Watch DistributedLeases in this namespace only (default: all namespaces).
    #[arg(long, env = "LEASEHOLD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Reconciles running at once.
    // A node failure changes many holders at once, and each change costs an
    // Event and a status write: 16 keeps the API server busy where 4 queued
    // them (BENCHMARKS.md, the operator at many leases: a burst of 200
    // changes showed in status at p99 4.8 s instead of 6.1 s).
    #[arg(long, env = "LEASEHOLD_OPERATOR_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    #[command(flatten)]
    pub webhook: webhook::WebhookArgs,
}

impl Args {
    /// The operator's election, or `None` when it is off.
    fn election(&self, identity: &Identity) -> Result<Option<Election>, Error> {
        if !self.leader_election {
            return Ok(None);
        }
        let timing = Timing::default()
            .with_given(
                self.election_lease_duration,
                self.election_renew_deadline,
                self.election_retry_period,
            )
            .map_err(Error::ElectionTiming)?;
        let election = match self.election_backend {
            Backend::Lease => {
                let Some(namespace) = self
                    .election_lease_namespace
                    .clone()
                    .or_else(|| self.pod_namespace.clone())
                else {
                    return Err(Error::ElectionFlagMissing(
                        "--election-lease-namespace (LEASEHOLD_ELECTION_LEASE_NAMESPACE) or --pod-namespace \
                         (POD_NAMESPACE)",
                        "lease",
                    ));
                };
                Election::Lease(LeaseElection::new(
                    self.election_lease_name.clone(),
                    namespace,
                    identity.clone(),
                    timing,
                )?)
            }
            Backend::Spanner => {
                let Some(database) = self.election_database.clone() else {
                    return Err(Error::ElectionFlagMissing(
                        "--election-database (LEASEHOLD_ELECTION_DATABASE)",
                        "spanner",
                    ));
                };
                Election::Spanner(SpannerElection {
                    config: SpannerConfig {
                        database,
                        table: self.election_table.clone(),
                    },
                    timing,
                    lock: self.election_lock.clone(),
                    identity: identity.clone(),
                })
            }
        };
        Ok(Some(election))
    }

    /// The webhook's injection settings (`None` when it is off): every
    /// injected sidecar gets this operator's `--cluster-name`.
    fn injection(&self) -> Result<Option<webhook::InjectionConfig>, Error> {
        Ok(self.webhook.injection(self.cluster_name.clone())?)
    }

    /// A fresh identity for this process run (one per run, shared by the
    /// election and the Events this replica publishes).
    fn identity(&self) -> Identity {
        let name = self
            .pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| FIELD_MANAGER.to_string());
        Identity::new(self.cluster_name.clone(), self.pod_namespace.clone(), name)
    }
}

pub async fn run(args: Args) -> Result<(), Error> {
    let shutdown = CancellationToken::new();
    leasehold_runtime::shutdown::exit_on_signals(shutdown.clone()).map_err(Error::Signals)?;
    // Checked before anything connects, so a bad flag fails fast and clearly.
    let identity = args.identity();
    let election = args.election(&identity)?;
    let injection = args.injection()?;

    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let (role, role_rx) = watch::channel(Role::Starting);
    let listener = TcpListener::bind(args.listen).await.map_err(|source| Error::Listen {
        addr: args.listen,
        source,
    })?;
    let address = listener.local_addr().unwrap_or(args.listen);
    info!(%address, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(http::serve(listener, http::router(registry, role_rx), shutdown.clone()));

    let client = leasehold_kubernetes::api::client::client(None, None).await?;
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity.to_string()),
    };
    // Every replica serves the webhook, active or standby: the Service
    // routes admission requests to any of them.
    let webhook = injection.map(|injection| {
        let namespace = args.pod_namespace.clone().unwrap_or_else(|| "leasehold-system".into());
        let (args, client, shutdown) = (args.webhook.clone(), client.clone(), shutdown.clone());
        tokio::spawn(async move {
            let served = webhook::run(&args, injection, &namespace, client, shutdown.clone()).await;
            if let Err(e) = &served {
                // Without its webhook the operator is broken: stop, visibly.
                error!(error = %leasehold_kubernetes::api::errors::chain(e), "the injection webhook failed; shutting down");
                shutdown.cancel();
            }
            served
        })
    });
    let stores: Arc<dyn StoreProvider> = Arc::new(OpenStores::default());
    let ctx = Arc::new(
        Context::new(client.clone(), reporter, stores.clone(), metrics.clone()).with_cluster(args.cluster_name.clone()),
    );
    let controller = ControllerRun {
        ctx,
        namespace: args.watch_namespace.clone(),
        concurrency: args.concurrency,
        // The active replica stops claiming the operator lock first; its
        // reconciles get one retry period before a successor may start.
        grace: election.as_ref().map_or(STANDALONE_GRACE, Election::retry_period),
    };

    let result = match election {
        None => {
            warn!("leader election is off: run exactly one replica");
            role.send_replace(Role::Active);
            metrics.set_leader(true);
            controller.run(shutdown.clone()).await;
            Ok(())
        }
        Some(election) => Ok(election.run(client, stores, controller, &role, &shutdown).await?),
    };
    role.send_replace(Role::Stopping);
    shutdown.cancel();
    if let Some(webhook) = webhook {
        webhook.await??;
    }
    server.await?.map_err(Error::Http)?;
    result
}

/// The DistributedLease controller, run until `stop` fires.
pub(crate) struct ControllerRun {
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    /// How long reconciles in flight may finish after `stop`. kube's graceful
    /// shutdown also waits for the initial list of resources, which never
    /// comes while the API server is unreachable; past this they are dropped.
    grace: Duration,
}

impl ControllerRun {
    /// Watches the resources and the pods: one pod watch fills the cache the
    /// reconciles read candidates from and triggers the leases whose
    /// selectors match a pod that changed, so counts and label repair follow
    /// pod events instead of a list per lease per retry period.
    async fn run(&self, stop: CancellationToken) {
        let client = self.ctx.client.clone();
        let (leases, pods, deployments): (Api<DistributedLease>, Api<Pod>, Api<Deployment>) = match &self.namespace {
            Some(namespace) => (
                Api::namespaced(client.clone(), namespace),
                Api::namespaced(client.clone(), namespace),
                Api::namespaced(client, namespace),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client)),
        };
        let (pod_cache, mut pod_writer) = index::pod_cache();
        let pod_events = watcher(pods, watcher::Config::default().any_semantic())
            .default_backoff()
            .inspect_ok(move |event| pod_writer.apply_watcher_event(event))
            .touched_objects();
        // Readiness-gated leases check their candidates' Deployments: one
        // watch keeps them (a GET per reconcile would grow with the leases),
        // and a Deployment's change (its status follows the rollout after
        // the pods do) reconciles the gated leases selecting its pods.
        let (deployment_cache, deployment_writer) = reflector::store();
        let deployment_events = watcher(deployments, watcher::Config::default().any_semantic())
            .default_backoff()
            .modify(rollout::keep_what_rollout_checks_read)
            .reflect(deployment_writer)
            .touched_objects();
        let ctx = Arc::new(self.ctx.with_caches(pod_cache, deployment_cache));
        // The resources' managed fields are half of each object's size and no
        // reconcile reads them (status goes out by server-side apply, which
        // the API server merges): at 10,000 leases the cache would hold them
        // for nothing. `Controller::new` is this stream without `modify`.
        let (lease_cache, lease_writer) = reflector::store();
        let selectors = Arc::new(Selectors::default());
        let lease_events = watcher(leases, watcher::Config::default().any_semantic())
            .modify(|lease: &mut DistributedLease| lease.metadata.managed_fields = None)
            .reflect(lease_writer)
            .inspect_ok({
                let selectors = selectors.clone();
                move |event| selectors.follow(event)
            })
            .applied_objects();
        let gated_selectors = selectors.clone();
        let controller = Controller::for_stream(lease_events, lease_cache)
            .watches_stream(pod_events, move |pod| selectors.leases_selecting(&pod))
            .watches_stream(deployment_events, move |deployment| {
                gated_selectors.gated_leases_of(&deployment)
            })
            // The leases whose lock changed, from the batched store reads.
            .reconcile_on(ctx.observers.triggers())
            .with_config(controller::Config::default().concurrency(self.concurrency))
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                match result {
                    Ok((resource, _)) => debug!(resource = %resource, "reconciled"),
                    Err(e) => warn!(error = %leasehold_kubernetes::api::errors::chain(&e), "controller"),
                }
            });
        let grace_over = async {
            stop.cancelled().await;
            tokio::time::sleep(self.grace).await;
        };
        tokio::select! {
            () = controller => {}
            () = grace_over => warn!(grace = ?self.grace, "reconciles still running after the grace period; dropped"),
        }
    }
}

#[cfg(test)]
mod tests;
