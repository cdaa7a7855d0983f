//! The operator's own leader election: which replica reconciles.
//!
//! Two backends, chosen with `--election-backend`:
//!
//! * `lease` (the default): a `coordination.k8s.io/v1` Lease in the
//!   operator's namespace, so HA needs nothing beyond the cluster: the
//!   Kubernetes store ([`leasehold_kubernetes::store`]) under leasehold's own
//!   [`Elector`], the code every sidecar on `store: {kubernetes: {}}` runs.
//!   It follows client-go's observed-change rule (expiry on the candidate's
//!   own monotonic clock since it saw the record change; every write guarded
//!   by the `resourceVersion` it was judged on), the leader stops claiming at
//!   `t_send + R` of its last successful renewal, and it hands out fencing
//!   tokens (unused here: the operator's writes are idempotent and
//!   level-triggered).
//! * `spanner`: leasehold's own [`Elector`] on a lock row in Cloud Spanner
//!   (`--election-database`), judged on the store's clock with fencing
//!   tokens, for users who want the operator to keep the guarantees it gives
//!   its users.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::ControllerRun;
use super::http::Role;
use super::stores::StoreProvider;
use leasehold_core::lease::{Elector, Identity, LeaderContext, LeaseStore, Timing};
use leasehold_kubernetes::store::KubernetesStore;
use leasehold_runtime::StoreConfig;
use leasehold_stores::spanner::SpannerConfig;

/// The operator's Lease unless `--election-lease-name` says otherwise (the
/// chart's name for a release called `leasehold`).
pub const DEFAULT_LEASE_NAME: &str = "leasehold-operator";

/// Where the operator's election lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A coordination.k8s.io Lease: no infrastructure beyond the cluster.
    Lease,
    /// A lock row in Cloud Spanner (`--election-database`).
    Spanner,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--election-lease-duration ({0:?}) must be a whole number of seconds: a Lease stores leaseDurationSeconds")]
    FractionalLeaseDuration(Duration),
    #[error("cannot open the election store {database}")]
    Store {
        database: String,
        #[source]
        source: leasehold_core::lease::StoreError,
    },
}

/// The operator's election, validated from the flags.
pub(crate) enum Election {
    Lease(LeaseElection),
    Spanner(SpannerElection),
}

impl Election {
    pub(crate) fn retry_period(&self) -> Duration {
        match self {
            Election::Lease(e) => e.timing.retry_period,
            Election::Spanner(e) => e.timing.retry_period,
        }
    }

    /// Campaigns and reconciles while this replica leads, until `shutdown`;
    /// then leadership is released.
    pub(crate) async fn run(
        self,
        client: Client,
        stores: Arc<dyn StoreProvider>,
        controller: ControllerRun,
        role: &watch::Sender<Role>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        match self {
            Election::Lease(election) => {
                election.run(client, controller, role, shutdown).await;
                Ok(())
            }
            Election::Spanner(election) => election.run(stores, controller, role, shutdown).await,
        }
    }
}

/// Sets the replica's role unless it is already stopping.
fn set_role(role: &watch::Sender<Role>, now: Role) {
    role.send_if_modified(|r| {
        let changed = *r != now && *r != Role::Stopping;
        if changed {
            *r = now;
        }
        changed
    });
}

/// Election on a `coordination.k8s.io/v1` Lease.
pub(crate) struct LeaseElection {
    pub name: String,
    pub namespace: String,
    pub identity: Identity,
    pub timing: Timing,
}

impl LeaseElection {
    /// Checks what a Lease can store: `leaseDurationSeconds` is whole seconds.
    pub(crate) fn new(name: String, namespace: String, identity: Identity, timing: Timing) -> Result<Self, Error> {
        if timing.lease_duration.subsec_nanos() != 0 {
            return Err(Error::FractionalLeaseDuration(timing.lease_duration));
        }
        Ok(LeaseElection {
            name,
            namespace,
            identity,
            timing,
        })
    }

    async fn run(
        self,
        client: Client,
        controller: ControllerRun,
        role: &watch::Sender<Role>,
        shutdown: &CancellationToken,
    ) {
        let store = Arc::new(KubernetesStore::new(client, Some(&self.namespace)));
        info!(identity = %self.identity, lease = %format!("{}/{}", self.namespace, self.name), "campaigning for the operator Lease");
        elect(store, self.name, self.identity, self.timing, controller, role, shutdown).await;
    }
}

/// Campaigns for `lock` on `store` and reconciles while leading; the
/// elector releases the lease on shutdown.
async fn elect(
    store: Arc<dyn LeaseStore>,
    lock: String,
    identity: Identity,
    timing: Timing,
    controller: ControllerRun,
    role: &watch::Sender<Role>,
    shutdown: &CancellationToken,
) {
    let metrics = controller.ctx.metrics.clone();
    let controller = Arc::new(controller);
    let elector = Elector::new(lock, identity, timing);
    let handle = elector.spawn_with_work(store, shutdown.clone(), move |leader: LeaderContext| {
        let controller = controller.clone();
        let metrics = metrics.clone();
        async move {
            info!(term = leader.term, token = %leader.token, "active: reconciling");
            metrics.set_leader(true);
            controller.run(leader.cancelled.clone()).await;
            metrics.set_leader(false);
            info!(term = leader.term, "no longer active: stopped reconciling");
        }
    });
    let mut state = handle.subscribe();
    loop {
        let leading = state.borrow_and_update().leader;
        set_role(role, if leading { Role::Active } else { Role::Standby });
        if state.changed().await.is_err() {
            break;
        }
    }
    handle.join().await;
}

/// Election on a lock row in Cloud Spanner.
pub(crate) struct SpannerElection {
    pub config: SpannerConfig,
    pub timing: Timing,
    pub lock: String,
    pub identity: Identity,
}

impl SpannerElection {
    async fn run(
        self,
        stores: Arc<dyn StoreProvider>,
        controller: ControllerRun,
        role: &watch::Sender<Role>,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let SpannerElection {
            config,
            timing,
            lock,
            identity,
        } = self;
        let prepared = async {
            let store = stores.store(&StoreConfig::Spanner(config.clone())).await?;
            store.ensure_schema().await?;
            Ok(store)
        };
        let store = prepared.await.map_err(|source| Error::Store {
            database: config.database.clone(),
            source,
        })?;
        info!(%identity, %lock, database = %config.database, "campaigning for the operator lock");
        elect(store, lock, identity, timing, controller, role, shutdown).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
