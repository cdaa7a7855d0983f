//! The operator's own leader election: which replica reconciles.
//!
//! Two backends, chosen with `--election-backend`:
//!
//! * `lease` (the default): a `coordination.k8s.io/v1` Lease in the
//!   operator's namespace, so HA needs nothing beyond the cluster. It follows
//!   client-go's `tools/leaderelection` (`leaderelection.go`,
//!   `tryAcquireOrRenew` and `release`): a candidate GETs the Lease and takes
//!   it over only when the holder is empty or the record has not changed for
//!   `leaseDurationSeconds` on the candidate's *own monotonic clock* since it
//!   observed the change (client-go's `observedTime`), so no two clocks are
//!   compared; every write is an update carrying the `resourceVersion` just
//!   read, so of two racing candidates the API server lets exactly one win
//!   (409 Conflict for the other). Unlike client-go, whose renew deadline
//!   starts when a renew round starts, the leader here stops claiming at
//!   `t_send + R` of its last successful renewal, the rule the sidecar keeps
//!   too. A Lease gives no fencing token; the operator's writes are
//!   idempotent and level-triggered, so two replicas overlapping for a moment
//!   (a pause past D − R) repeat work rather than corrupt it.
//! * `spanner`: leasehold's own [`Elector`] on a lock row in Cloud Spanner
//!   (`--election-database`), judged on the store's clock with fencing
//!   tokens, for users who want the operator to keep the guarantees it gives
//!   its users.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ControllerRun;
use super::http::Role;
use super::stores::StoreProvider;
use crate::lease::clock::Jitter;
use crate::lease::{Elector, Identity, LeaderContext, Timing};
use crate::store::select::StoreConfig;
use crate::store::spanner::SpannerConfig;

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
    #[error("cannot open the election store {database}: {source}")]
    Store {
        database: String,
        #[source]
        source: crate::lease::StoreError,
    },
}

/// The operator's election, validated from the flags.
pub enum Election {
    Lease(LeaseElection),
    Spanner(SpannerElection),
}

impl Election {
    pub fn retry_period(&self) -> Duration {
        match self {
            Election::Lease(e) => e.timing.retry_period,
            Election::Spanner(e) => e.timing.retry_period,
        }
    }

    /// Campaigns and reconciles while this replica leads, until `shutdown`;
    /// then leadership is released.
    pub async fn run(
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
pub struct LeaseElection {
    pub name: String,
    pub namespace: String,
    pub identity: Identity,
    pub timing: Timing,
}

impl LeaseElection {
    /// Checks what a Lease can store: `leaseDurationSeconds` is whole seconds.
    pub fn new(name: String, namespace: String, identity: Identity, timing: Timing) -> Result<Self, Error> {
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
        let mut lock = LeaseLock {
            api: Api::namespaced(client, &self.namespace),
            name: self.name.clone(),
            identity: self.identity.to_string(),
            lease_seconds: i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
            observed: None,
        };
        let timing = self.timing;
        let mut jitter = Jitter::new(timing.jitter, None);
        let metrics = controller.ctx.metrics.clone();
        let controller = Arc::new(controller);
        info!(identity = %self.identity, lease = %format!("{}/{}", self.namespace, self.name), "campaigning for the operator Lease");
        'campaign: loop {
            set_role(role, Role::Standby);
            // Follower: try every P until the Lease is ours.
            let acquired_sent = loop {
                let sent = Instant::now();
                match lock.try_acquire_or_renew().await {
                    Ok(true) => break sent,
                    Ok(false) => {}
                    Err(e) => warn!(error = %e, "cannot read or write the operator Lease"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => break 'campaign,
                    () = tokio::time::sleep(jitter.apply(timing.retry_period)) => {}
                }
            };
            // Leader: reconcile, renew every P, stop claiming at t_send + R.
            info!("active: reconciling");
            set_role(role, Role::Active);
            metrics.set_leader(true);
            let leading = shutdown.child_token();
            let work = tokio::spawn({
                let (controller, leading) = (controller.clone(), leading.clone());
                async move { controller.run(leading).await }
            });
            let mut deadline = acquired_sent + timing.renew_deadline;
            let mut next_renew = Instant::now() + jitter.apply(timing.retry_period);
            let lost = loop {
                tokio::select! {
                    () = shutdown.cancelled() => break false,
                    () = tokio::time::sleep_until(deadline) => break true,
                    () = tokio::time::sleep_until(next_renew) => {}
                }
                let sent = Instant::now();
                match tokio::time::timeout_at(deadline, lock.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => deadline = sent + timing.renew_deadline,
                    Ok(Ok(false)) => break true,
                    Ok(Err(e)) => {
                        warn!(error = %e, "renewing the operator Lease failed; retrying until the renew deadline")
                    }
                    Err(_) => break true,
                }
                next_renew = Instant::now() + jitter.apply(timing.retry_period);
            };
            // Stop claiming first, then let the reconciles in flight finish.
            if lost {
                warn!("lost the operator Lease; stopped reconciling");
            }
            set_role(role, Role::Standby);
            leading.cancel();
            if let Err(e) = work.await {
                warn!(error = %e, "the controller task failed");
            }
            metrics.set_leader(false);
            if !lost {
                // Shutdown while leading: the deadline has not passed, so the
                // Lease is still ours to free.
                match lock.release().await {
                    Ok(()) => info!("released the operator Lease"),
                    Err(e) => warn!(error = %e, "could not release the operator Lease; it expires after its duration"),
                }
                break;
            }
        }
    }
}

/// What this candidate last saw of the Lease, and when (client-go's
/// `observedRecord` and `observedTime`).
struct Observed {
    lease: Lease,
    at: Instant,
}

/// One candidate's view of the Lease; the mechanics of client-go's
/// `tryAcquireOrRenew` and `release`.
struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_seconds: i32,
    observed: Option<Observed>,
}

impl LeaseLock {
    fn holds(&self) -> bool {
        self.observed
            .as_ref()
            .and_then(|o| o.lease.spec.as_ref()?.holder_identity.as_deref())
            == Some(self.identity.as_str())
    }

    /// Takes or renews the Lease; `Ok(false)` when another candidate holds a
    /// live one or won a race for it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(current) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(created);
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(current.clone());
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let ours = holder == Some(self.identity.as_str());
        if let Some(holder) = holder
            && !ours
        {
            let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
            let observed_at = self.observed.as_ref().map_or_else(Instant::now, |o| o.at);
            if observed_at + duration > Instant::now() {
                tracing::debug!(%holder, "the operator Lease is held");
                return Ok(false);
            }
            info!(%holder, "the operator Lease expired; taking it over");
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        let mut update = current;
        update.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_seconds),
            acquire_time: if ours { spec.acquire_time } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(if ours {
                transitions
            } else {
                transitions.saturating_add(1)
            }),
            ..spec
        });
        // `update` carries the resourceVersion just read: a replace by
        // anyone since then makes this a 409, never a lost update.
        match self.api.replace(&self.name, &PostParams::default(), &update).await {
            Ok(written) => {
                self.observe(written);
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Remembers the Lease, restarting the expiry clock when its record changed.
    fn observe(&mut self, lease: Lease) {
        let changed = self.observed.as_ref().is_none_or(|o| o.lease.spec != lease.spec);
        let at = match &self.observed {
            Some(o) if !changed => o.at,
            _ => Instant::now(),
        };
        self.observed = Some(Observed { lease, at });
    }

    /// Frees the Lease for the next candidate at once: an empty holder, as
    /// client-go's `release` writes, guarded by the last resourceVersion.
    async fn release(&mut self) -> Result<(), kube::Error> {
        if !self.holds() {
            return Ok(());
        }
        let Some(observed) = self.observed.take() else {
            return Ok(());
        };
        let mut lease = observed.lease;
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
        }
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            // Someone else wrote it since: it is not ours to free any more.
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Election on a lock row in Cloud Spanner.
pub struct SpannerElection {
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
        Ok(())
    }
}

#[cfg(test)]
mod tests;
