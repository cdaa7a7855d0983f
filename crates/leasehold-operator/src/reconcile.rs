//! One reconcile of one `DistributedLease`, testable without the controller
//! runtime: everything it touches comes in through [`Context`]. It looks
//! ([`context::look`]), decides in a pure [`plan`] (status, Events, label
//! repairs, requeue) and applies the plan ([`apply`]); a delete releases
//! the row ([`delete`]).
//!
//! Order of work, and why:
//! 1. deletion: the finalizer stays until every running candidate has
//!    retired from the resource and the store shows no live holder
//!    ([`delete`]: releasing a dead holder's row by check-and-set), so a
//!    resource recreated on another store never has a second leader;
//! 2. finalizer first, so a delete can never skip that decision;
//! 3. validate; an invalid spec is a status, not an error (no crash loop);
//! 4. take the candidate pods from the pod watch's cache *before* reading
//!    the row, so a pod that acquired after our read cannot have its fresh
//!    `true` label repaired away: a label seen before the read that the read
//!    does not back is stale;
//! 5. with the readiness gate on, check the candidates' Deployments for a
//!    strategy that would stall rollouts (`RolloutSafe`);
//! 6. read the row (creating the table the first time), repair labels,
//!    publish Events, and write status only when something users see
//!    changed (holder, term, token, conditions, counts): a renewal alone
//!    writes nothing, so a steady lease costs no writes and no extra reconcile.
//!    A partitioned lease reads its whole assignment instead
//!    ([`PartitionView`](leasehold_core::lease::partitions::PartitionView), from the
//!    same kind of batched observer), and shows it in `status.partitions`;
//! 7. after a successful read, collect the store's dead sessions when its
//!    turn came ([`GC_INTERVAL`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::metrics::Outcome;
use leasehold_core::lease::StoreError;
use leasehold_kubernetes::api::DistributedLease;

mod apply;
mod context;
mod delete;
pub(crate) mod plan;
mod prefer;

pub use context::Context;
pub use plan::without_sidecar;

/// The field manager of every status write.
pub(crate) const FIELD_MANAGER: &str = "leasehold-operator";
/// Held on every resource until its lock row is released.
pub const FINALIZER: &str = "leasehold.dev/release";

/// An invalid spec only changes when someone edits it, which triggers a
/// reconcile anyway; this slow requeue just re-checks now and then.
pub(crate) const INVALID_REQUEUE: Duration = Duration::from_secs(300);
/// The observer owns it (the reconcile reads the observer, not back).
pub(crate) use super::observer::OBSERVED_REQUEUE;
/// After a store error: soon enough to notice recovery, slow enough not to hammer.
pub(crate) const STORE_ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// After a failed Kubernetes call (error policy).
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(30);
/// After a write conflict.
const CONFLICT_REQUEUE: Duration = Duration::from_secs(1);
/// The fastest healthy requeue, whatever retryPeriod says.
pub(crate) const MIN_REQUEUE: Duration = Duration::from_secs(1);
/// How long a store URL read from a Secret is used before it is read again
/// (sooner after a failed store call): a rotated credential is picked up
/// within this, and a steady lease costs one Secret read per this.
pub(crate) const SECRET_REFRESH: Duration = Duration::from_secs(300);
/// How often the dead sessions of one store are collected: often enough that
/// rows of crashed candidates do not pile up, rarely enough to cost nothing
/// (one transaction per store per interval, whatever the number of leases).
pub(crate) const GC_INTERVAL: Duration = Duration::from_secs(300);
/// While a delete waits for its candidates to retire or its holder to
/// release: pod changes (the retirement annotations) reconcile sooner.
const DELETE_REQUEUE: Duration = Duration::from_secs(2);
/// The condition a deleted resource carries while its finalizer waits.
pub(crate) const RELEASED: &str = "Released";
/// How long a reconcile waits for the pod watch's first list.
const POD_CACHE_WAIT: Duration = Duration::from_secs(30);
/// How long a delete waits for an unreachable store before it drops the
/// finalizer anyway, once every candidate has retired (no live process
/// campaigns under the resource any more). The release only spares
/// successors the wait: an unreleased row expires by the store's clock
/// after D, so nothing unsafe is left, and deleting a namespace (whose
/// Secret, and often whose store, go with it) does not hang on the finalizer.
pub(crate) const RELEASE_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a Kubernetes API call failed")]
    Kube(#[from] kube::Error),
    #[error("the resource has no {0}")]
    Incomplete(&'static str),
    #[error("releasing lock {lock} on delete failed")]
    Release { lock: String, source: StoreError },
    #[error("the pod watch has not listed the pods yet")]
    PodsNotListed,
    #[error("the Deployment watch has not listed the Deployments yet")]
    DeploymentsNotListed,
}

impl Error {
    /// A write lost an optimistic-concurrency race (HTTP 409): the resource
    /// changed under us, and the watch delivers the new version at once.
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 409)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The controller's reconcile function.
pub async fn reconcile(lease: Arc<DistributedLease>, ctx: Arc<Context>) -> Result<Action> {
    let span = info_span!(
        "reconcile",
        resource = %format!("{}/{}", lease.namespace().unwrap_or_default(), lease.name_any()),
        generation = lease.metadata.generation.unwrap_or_default(),
    );
    async move {
        let started = Instant::now();
        let result = reconcile_once(&lease, &ctx).await;
        let outcome = result.as_ref().map_or(Outcome::Error, |(_, outcome)| *outcome);
        ctx.metrics.reconciled(outcome, started.elapsed());
        match result {
            Ok((action, _)) => Ok(action),
            Err(e) if e.is_conflict() => {
                debug!(error = %leasehold_kubernetes::api::errors::chain(&e), "resource changed during reconcile; retrying");
                Err(e)
            }
            Err(e) => {
                warn!(error = %leasehold_kubernetes::api::errors::chain(&e), "reconcile failed");
                ctx.publish(
                    &lease,
                    EventType::Warning,
                    "ReconcileFailed",
                    "Reconcile",
                    leasehold_kubernetes::api::errors::message(&e),
                )
                .await;
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}

/// The controller's error policy: a lost write race retries at once, other
/// failures at a steady pace.
pub(crate) fn error_policy(_lease: Arc<DistributedLease>, error: &Error, _ctx: Arc<Context>) -> Action {
    if error.is_conflict() {
        Action::requeue(CONFLICT_REQUEUE)
    } else {
        Action::requeue(ERROR_REQUEUE)
    }
}

async fn reconcile_once(lease: &DistributedLease, ctx: &Context) -> Result<(Action, Outcome)> {
    let namespace = lease.namespace().ok_or(Error::Incomplete("namespace"))?;
    lease.meta().name.as_ref().ok_or(Error::Incomplete("name"))?;
    let leases: Api<DistributedLease> = Api::namespaced(ctx.client.clone(), &namespace);
    let has_finalizer = lease.finalizers().iter().any(|f| f == FINALIZER);

    if lease.meta().deletion_timestamp.is_some() {
        ctx.forget_preference(&format!("{namespace}/{}", lease.name_any()));
        if has_finalizer {
            match delete::release_on_delete(lease, &namespace, ctx).await? {
                delete::Gate::Open => {
                    apply::remove_finalizer(&leases, lease).await?;
                    ctx.forget_store(lease);
                }
                delete::Gate::Waiting(why) => {
                    apply::deletion_waits(&leases, lease, ctx, &why).await?;
                    return Ok((Action::requeue(DELETE_REQUEUE), Outcome::Ok));
                }
            }
        }
        return Ok((Action::await_change(), Outcome::Ok));
    }
    if !has_finalizer {
        apply::add_finalizer(&leases, lease).await?;
    }
    let (mut found, read) = context::look(lease, &namespace, ctx, context::Need::Cached).await?;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // Preferred candidates decide on the same look, before the plan takes it.
    let preferred = prefer::act(lease, ctx, &found, now.0).await?;
    found.held_off(preferred.held_off.clone());
    let mut plan = plan::plan(lease, ctx.cluster.as_deref(), &now, found);
    if read == context::ReadWas::BeforeCandidates && !plan.repairs.is_empty() {
        // A label the cached read does not back may be newer than that read:
        // repair only on a read made after the candidates were taken (the
        // order of work above), which every reconcile waiting shares.
        let (mut found, _) = context::look(lease, &namespace, ctx, context::Need::AfterCandidates).await?;
        found.held_off(preferred.held_off);
        plan = plan::plan(lease, ctx.cluster.as_deref(), &now, found);
    }
    let (action, outcome) = apply::apply(lease, ctx, plan).await?;
    // The plan requeues after P at most or after the observer's net; a
    // pending move must be looked at again when its period ends, and no
    // watch event marks that moment.
    Ok(match preferred.wake {
        Some(after) => (Action::requeue(after), outcome),
        None => (action, outcome),
    })
}

/// The condition type that says a readiness-gated lease's candidates have
/// rolled out: `kubectl wait dlease/NAME --for=condition=RolledOut`.
pub(crate) const ROLLED_OUT: &str = "RolledOut";

#[cfg(test)]
mod tests;
