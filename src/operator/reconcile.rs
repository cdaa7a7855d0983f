//! One reconcile of one `DistributedLease`, testable without the controller
//! runtime: everything it touches comes in through [`Context`].
//!
//! Order of work, and why:
//! 1. deletion: release the row by check-and-set only when its holder is
//!    gone (no candidate pod of that name runs), then drop the finalizer;
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
//!    A partitioned lease reads its whole assignment instead, in one store
//!    call ([`PartitionView`]), and shows it in `status.partitions`;
//! 7. after a successful read, collect the store's dead sessions when its
//!    turn came ([`GC_INTERVAL`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::metrics::{Metrics, Outcome};
use super::partitions;
use super::rollout;
use super::stores::{StoreProvider, read_url, target_of};
use super::webhook;
use crate::api::{DistributedLease, DistributedLeaseStatus, PartitionsStatus, ValidLease, ValidStore, validate};
use crate::lease::partitions::PartitionView;
use crate::lease::session::{Collected, session_owner};
use crate::lease::{Identity, LeaseStore, Observation, StoreError};
use crate::sidecar::interface::TIMING_CONDITION;
use crate::store::StoreUrl;
use crate::store::select::StoreConfig;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "leasehold-operator";
/// Held on every resource until its lock row is released.
pub const FINALIZER: &str = "leasehold.dev/release";

/// An invalid spec only changes when someone edits it, which triggers a
/// reconcile anyway; this slow requeue just re-checks now and then.
pub const INVALID_REQUEUE: Duration = Duration::from_secs(300);
/// After a store error: soon enough to notice recovery, slow enough not to hammer.
pub const STORE_ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// After a failed Kubernetes call (error policy).
pub const ERROR_REQUEUE: Duration = Duration::from_secs(30);
/// After a write conflict.
const CONFLICT_REQUEUE: Duration = Duration::from_secs(1);
/// The fastest healthy requeue, whatever retryPeriod says.
const MIN_REQUEUE: Duration = Duration::from_secs(1);
/// How long a store URL read from a Secret is used before it is read again
/// (sooner after a failed store call): a rotated credential is picked up
/// within this, and a steady lease costs one Secret read per this.
pub const SECRET_REFRESH: Duration = Duration::from_secs(300);
/// How often the dead sessions of one store are collected: often enough that
/// rows of crashed candidates do not pile up, rarely enough to cost nothing
/// (one transaction per store per interval, whatever the number of leases).
pub const GC_INTERVAL: Duration = Duration::from_secs(300);
/// How long a reconcile waits for the pod watch's first list.
const POD_CACHE_WAIT: Duration = Duration::from_secs(30);
/// How long a delete waits for an unreachable store before it drops the
/// finalizer anyway. The release only spares successors the wait: an
/// unreleased row expires by the store's clock after D, so nothing unsafe is
/// left, and deleting a namespace (whose Secret, and often whose store, go
/// with it) does not hang on the finalizer.
pub const RELEASE_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("the resource has no {0}")]
    Incomplete(&'static str),
    #[error("releasing lock {lock} on delete failed: {source}")]
    Release { lock: String, source: StoreError },
    #[error("the pod watch has not listed the pods yet")]
    PodsNotListed,
}

impl Error {
    /// A write lost an optimistic-concurrency race (HTTP 409): the resource
    /// changed under us, and the watch delivers the new version at once.
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 409)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A Secret key: (namespace, name, key).
type SecretKey = (String, String, String);

/// What every reconcile needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub stores: Arc<dyn StoreProvider>,
    pub metrics: Arc<Metrics>,
    /// This cluster's name, as the sidecars put it in their identities; tells
    /// a holder in another cluster from a local pod of the same name.
    cluster: Option<String>,
    /// The pod watch's cache: the candidates of every lease.
    pods: Store<Pod>,
    /// The stores (by [`StoreConfig::key`]) whose table is known to exist.
    schemas: Arc<Mutex<HashSet<String>>>,
    /// Store URLs read from Secrets, with when.
    urls: Arc<Mutex<HashMap<SecretKey, (StoreUrl, Instant)>>>,
    /// When each store's dead sessions were last collected.
    gc: Arc<GcSchedule>,
}

impl Context {
    pub fn new(client: Client, reporter: Reporter, stores: Arc<dyn StoreProvider>, metrics: Arc<Metrics>) -> Self {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            stores,
            metrics,
            cluster: None,
            pods: kube::runtime::reflector::store().0,
            schemas: Arc::default(),
            urls: Arc::default(),
            gc: Arc::default(),
        }
    }

    /// This context reading candidates from `pods`, the cache of one run's
    /// pod watch (see [`candidates_of`]).
    pub fn with_pods(&self, pods: Store<Pod>) -> Context {
        Context {
            client: self.client.clone(),
            recorder: self.recorder.clone(),
            stores: self.stores.clone(),
            metrics: self.metrics.clone(),
            cluster: self.cluster.clone(),
            pods,
            schemas: self.schemas.clone(),
            urls: self.urls.clone(),
            gc: self.gc.clone(),
        }
    }

    /// Waits until the pod watch has listed the pods once.
    async fn pods_listed(&self) -> Result<()> {
        tokio::time::timeout(POD_CACHE_WAIT, self.pods.wait_until_ready())
            .await
            .map_err(|_| Error::PodsNotListed)?
            .map_err(|_| Error::PodsNotListed)
    }

    /// Whether a pod of this name runs in `namespace` (exists and has not
    /// finished), from the pod watch's cache.
    async fn pod_runs(&self, namespace: &str, name: &str) -> Result<bool> {
        self.pods_listed().await?;
        let pod = self.pods.get(&ObjectRef::new(name).within(namespace));
        Ok(pod.is_some_and(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        }))
    }

    /// The candidate pods of a lease, from the pod watch's cache, once it
    /// has listed the pods.
    async fn candidates(&self, namespace: &str, selector: &Selector) -> Result<Vec<Arc<Pod>>> {
        self.pods_listed().await?;
        Ok(self
            .pods
            .state()
            .into_iter()
            .filter(|pod| pod.namespace().as_deref() == Some(namespace) && selector.matches(pod.labels()))
            .collect())
    }

    /// Names this cluster (see the sidecar's cluster name).
    pub fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Publishes an Event; a failure is logged and counted, never fatal.
    async fn publish(
        &self,
        lease: &DistributedLease,
        kind: EventType,
        reason: &'static str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &lease.object_ref(&())).await {
            warn!(reason, error = %e, "could not publish event");
            self.metrics.event_failed(reason);
        }
    }

    /// The store a valid lease names. A PostgreSQL or Redis URL is read
    /// from the resource's Secret and kept for [`SECRET_REFRESH`], or until
    /// a store call fails, so a rotated credential is picked up.
    async fn store_of(
        &self,
        valid: &ValidLease,
        namespace: &str,
    ) -> Result<(StoreConfig, Arc<dyn LeaseStore>), StoreError> {
        let target = self.target_of(valid, namespace).await?;
        let store = self.stores.store(&target).await?;
        Ok((target, store))
    }

    /// Where a valid lease's store is, its URL read as [`Context::store_of`] says.
    async fn target_of(&self, valid: &ValidLease, namespace: &str) -> Result<StoreConfig, StoreError> {
        let url = match valid.store.url_secret() {
            None => None,
            Some(secret) => {
                let key = (namespace.to_string(), secret.name.clone(), secret.key.clone());
                let cached = self.urls.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
                match cached {
                    Some((url, read)) if read.elapsed() < SECRET_REFRESH => Some(url),
                    _ => {
                        let url = read_url(&self.client, namespace, secret).await?;
                        self.urls
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key, (url.clone(), Instant::now()));
                        Some(url)
                    }
                }
            }
        };
        target_of(valid, namespace, url)
    }

    /// Forgets the URL read for `valid`, so the next reconcile reads its Secret again.
    fn forget_url(&self, valid: &ValidLease, namespace: &str) {
        if let Some(secret) = valid.store.url_secret() {
            let key = (namespace.to_string(), secret.name.clone(), secret.key.clone());
            self.urls.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        }
    }

    /// Reads the lease row, creating the table the first time where the
    /// operator has the rights.
    async fn observe(&self, valid: &ValidLease, namespace: &str) -> Result<Observation, StoreError> {
        let read = async {
            let (target, store) = self.store_of(valid, namespace).await?;
            let store = &store;
            self.with_schema(target.key(), valid, store.ensure_schema(), || {
                store.observe(&valid.lock)
            })
            .await
        };
        let observed = read.await;
        if observed.is_err() {
            self.forget_url(valid, namespace);
        }
        observed
    }

    /// Reads the assignment of a partitioned lease in one store call,
    /// creating the session tables the first time where the operator has
    /// the rights.
    async fn observe_partitions(
        &self,
        valid: &ValidLease,
        namespace: &str,
        partitions: u32,
    ) -> Result<PartitionView, StoreError> {
        let read = async {
            let target = self.target_of(valid, namespace).await?;
            let sessions = self.stores.sessions(&target).await?;
            let key = format!("{}\nsessions", target.key());
            let sessions = &*sessions;
            self.with_schema(key, valid, sessions.ensure_session_schema(), || {
                PartitionView::observe(sessions, &valid.lock, partitions)
            })
            .await
        };
        let observed = read.await;
        if observed.is_err() {
            self.forget_url(valid, namespace);
        }
        observed
    }

    /// `read`, after `ensure` created the tables the first time for `key`.
    /// Without the rights to create them (a role that may only read and
    /// write rows) the tables may exist already: the read says whether they do.
    async fn with_schema<T, R>(
        &self,
        key: String,
        valid: &ValidLease,
        ensure: impl Future<Output = Result<(), StoreError>>,
        read: impl Fn() -> R,
    ) -> Result<T, StoreError>
    where
        R: Future<Output = Result<T, StoreError>>,
    {
        let known = self.schemas.lock().unwrap_or_else(|e| e.into_inner()).contains(&key);
        if !known {
            match ensure.await {
                Ok(()) => info!(store = %valid.store, "tables ready"),
                Err(created @ StoreError::Invalid { .. }) => {
                    let observed = read().await.map_err(|e| {
                        StoreError::invalid(format!("cannot create the table ({}), nor read it", created.chain()))
                            .caused_by(e)
                    })?;
                    info!(store = %valid.store, error = %created.chain(), "the table exists; the operator may not create tables");
                    self.schemas.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                    return Ok(observed);
                }
                Err(e) => return Err(e),
            }
            self.schemas.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        }
        read().await
    }

    /// Deletes the dead sessions of the lease's store, and the lock rows
    /// they left, at most once per [`GC_INTERVAL`] per store (whichever of
    /// its leases comes first), for stores that keep sessions. The store
    /// judges death by its own clock in the deleting transaction, so a
    /// live session is never touched. A failure waits for the next turn.
    async fn collect_garbage(&self, valid: &ValidLease, namespace: &str) {
        let Ok(target) = self.target_of(valid, namespace).await else {
            return;
        };
        if !self.gc.due(target.key(), Instant::now()) {
            return;
        }
        let collected = match self.stores.sessions(&target).await {
            Ok(sessions) => sessions.collect_garbage().await,
            Err(_) => return,
        };
        match collected {
            Ok(collected) => {
                self.metrics.collected(collected);
                if collected != Collected::default() {
                    info!(store = %valid.store, sessions = collected.sessions, locks = collected.locks, "collected dead sessions");
                }
            }
            // A database whose session tables were never created has nothing to collect.
            Err(e @ StoreError::Invalid { .. }) => {
                debug!(store = %valid.store, error = %e.chain(), "no sessions to collect")
            }
            Err(e) => {
                warn!(store = %valid.store, error = %e.chain(), "collecting dead sessions failed; trying again later")
            }
        }
    }
}

/// When each store's dead sessions were last collected, by [`StoreConfig::key`].
#[derive(Default)]
struct GcSchedule(Mutex<HashMap<String, Instant>>);

impl GcSchedule {
    /// Whether the store `key` is due at `now`; if so, the turn is taken
    /// (before the call, so a failing store also waits a whole interval).
    fn due(&self, key: String, now: Instant) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match last.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < GC_INTERVAL => false,
            _ => {
                last.insert(key, now);
                true
            }
        }
    }
}

/// What a reconcile read from the store.
enum Read {
    Lease(Observation),
    Partitions(PartitionView),
}

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
                debug!(error = %e, "resource changed during reconcile; retrying");
                Err(e)
            }
            Err(e) => {
                warn!(error = %e, "reconcile failed");
                ctx.publish(
                    &lease,
                    EventType::Warning,
                    "ReconcileFailed",
                    "Reconcile",
                    e.to_string(),
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
pub fn error_policy(_lease: Arc<DistributedLease>, error: &Error, _ctx: Arc<Context>) -> Action {
    if error.is_conflict() {
        Action::requeue(CONFLICT_REQUEUE)
    } else {
        Action::requeue(ERROR_REQUEUE)
    }
}

async fn reconcile_once(lease: &DistributedLease, ctx: &Context) -> Result<(Action, Outcome)> {
    let namespace = lease.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = lease.meta().name.clone().ok_or(Error::Incomplete("name"))?;
    let leases: Api<DistributedLease> = Api::namespaced(ctx.client.clone(), &namespace);
    let has_finalizer = lease.finalizers().iter().any(|f| f == FINALIZER);

    if lease.meta().deletion_timestamp.is_some() {
        if has_finalizer {
            release_on_delete(lease, &namespace, ctx).await?;
            remove_finalizer(&leases, lease).await?;
        }
        return Ok((Action::await_change(), Outcome::Ok));
    }
    if !has_finalizer {
        add_finalizer(&leases, lease).await?;
    }

    let old = lease.status.clone().unwrap_or_default();
    let generation = lease.metadata.generation;
    let valid = match validate(lease) {
        Ok(valid) => valid,
        Err(e) => {
            let message = e.to_string();
            warn!(%message, "invalid spec");
            if changed_message(&old, "Valid", "False", &message) {
                ctx.publish(lease, EventType::Warning, "InvalidSpec", "Validate", message.clone())
                    .await;
            }
            let status = DistributedLeaseStatus {
                conditions: vec![
                    condition(&old, generation, "Valid", "False", "InvalidSpec", &message),
                    condition(
                        &old,
                        generation,
                        "StoreReady",
                        "Unknown",
                        "InvalidSpec",
                        "the spec is invalid",
                    ),
                    condition(&old, generation, "Ready", "False", "InvalidSpec", "the spec is invalid"),
                ],
                observed_generation: generation,
                ..old.clone()
            };
            write_status(&leases, &name, &old, status).await?;
            return Ok((Action::requeue(INVALID_REQUEUE), Outcome::Invalid));
        }
    };

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let candidates = ctx.candidates(&namespace, &valid.selector).await?;
    let ready = candidates.iter().filter(|pod| pod_ready(pod)).count();
    // Readiness-gated: the candidates' Deployments, read once for both
    // `RolloutSafe` and `RolledOut`.
    let owners = if valid.readiness_gate {
        Some(rollout::owners(&Api::namespaced(ctx.client.clone(), &namespace), &candidates).await)
    } else {
        None
    };
    let rollout = match &owners {
        Some(owners) => {
            let moves = rollout::leader_moves_to_new(&valid);
            Some(rollout_condition(lease, ctx, owners, &old, moves).await)
        }
        None => None,
    };

    let timing = timing_condition(&old, generation, &candidates);
    let observed = match valid.partitions {
        None => ctx.observe(&valid, &namespace).await.map(Read::Lease),
        Some(n) => ctx
            .observe_partitions(&valid, &namespace, n)
            .await
            .map(Read::Partitions),
    };
    let valid_condition = condition(&old, generation, "Valid", "True", "SpecValid", "the spec is valid");
    let counts = DistributedLeaseStatus {
        candidates: u32::try_from(candidates.len()).unwrap_or(u32::MAX),
        ready_candidates: u32::try_from(ready).unwrap_or(u32::MAX),
        candidates_without_sidecar: without_sidecar(&candidates),
        observed_generation: generation,
        ..old.clone()
    };
    let observed = match observed {
        Ok(observed) => observed,
        Err(e) => {
            let (reason, message) = store_problem(&valid, &e);
            warn!(%message, "store not ready");
            if changed_message(&old, "StoreReady", "False", &message) {
                ctx.publish(lease, EventType::Warning, reason, "ReadLease", message.clone())
                    .await;
            }
            let status = DistributedLeaseStatus {
                conditions: [
                    valid_condition,
                    condition(&old, generation, "StoreReady", "False", reason, &message),
                    condition(&old, generation, "Ready", "False", "StoreNotReady", &message),
                ]
                .into_iter()
                .chain(rollout)
                .chain(owners.as_ref().map(|_| {
                    condition(
                        &old,
                        generation,
                        ROLLED_OUT,
                        "Unknown",
                        "StoreNotReady",
                        "the store does not say who leads",
                    )
                }))
                .chain([timing])
                .collect(),
                ..counts
            };
            write_status(&leases, &name, &old, status).await?;
            return Ok((Action::requeue(STORE_ERROR_REQUEUE), Outcome::StoreError));
        }
    };

    ctx.collect_garbage(&valid, &namespace).await;
    let observed = match observed {
        Read::Lease(observed) => observed,
        Read::Partitions(view) => {
            let members: Vec<HolderPod> = view.members.iter().map(|m| HolderPod::of_session(m)).collect();
            repair_labels(lease, ctx, &pods, &candidates, &valid.label_key, &members).await;
            let shown = partitions::partitions_status(&view);
            if let Some(note) = partitions::assignment_change(old.partitions.as_ref(), &shown, &valid.lock) {
                info!(%note, "partition assignment changed");
                ctx.publish(lease, EventType::Normal, "PartitionsChanged", "ReadPartitions", note)
                    .await;
            }
            let mut status = partitioned_status(&old, generation, &valid, shown, valid_condition, counts);
            status.conditions.extend(rollout);
            status.conditions.push(timing);
            write_status(&leases, &name, &old, status).await?;
            return Ok((Action::requeue(valid.timing.retry_period.max(MIN_REQUEUE)), Outcome::Ok));
        }
    };
    let holder: Vec<HolderPod> = observed.live_holder().map(HolderPod::parse).into_iter().collect();
    repair_labels(lease, ctx, &pods, &candidates, &valid.label_key, &holder).await;

    let mut status = observed_status(&old, generation, &valid, &observed, valid_condition, counts);
    status.conditions.extend(rollout);
    if let Some(owners) = &owners {
        let leader = holder
            .first()
            .filter(|h| h.is_local(ctx.cluster.as_deref(), &namespace))
            .and_then(HolderPod::pod);
        status
            .conditions
            .push(rolled_out_condition(&old, generation, owners, &candidates, leader));
    }
    status.conditions.push(timing);
    if status.holder != old.holder {
        let note = match &status.holder {
            Some(holder) => format!(
                "lock {} is held by {holder} (term {})",
                valid.lock,
                status.term.unwrap_or(0)
            ),
            None => format!("lock {} has no live holder", valid.lock),
        };
        info!(holder = status.holder.as_deref().unwrap_or(""), "holder changed");
        ctx.publish(lease, EventType::Normal, "HolderChanged", "ReadLease", note)
            .await;
    }
    if let Some((kind, note)) = version_move(&old, &status, &valid.lock) {
        info!(%note, "leader version changed");
        ctx.publish(lease, kind, "LeaderVersionChanged", "ReadLease", note)
            .await;
    }
    write_status(&leases, &name, &old, status).await?;
    Ok((Action::requeue(valid.timing.retry_period.max(MIN_REQUEUE)), Outcome::Ok))
}

/// The status after a successful read of the row.
fn observed_status(
    old: &DistributedLeaseStatus,
    generation: Option<i64>,
    valid: &ValidLease,
    observed: &Observation,
    valid_condition: Condition,
    counts: DistributedLeaseStatus,
) -> DistributedLeaseStatus {
    let record = observed.record.as_ref();
    // An absent row is term 0, so the very first acquisition counts as a transition.
    let term = record.map_or(0, |r| r.term);
    let transitions = match old.term {
        Some(old_term) => old.transitions + term.saturating_sub(old_term),
        None => old.transitions,
    };
    let holder = observed.live_holder().map(str::to_string);
    let ready = match &holder {
        Some(holder) => condition(
            old,
            generation,
            "Ready",
            "True",
            "LeaderElected",
            &format!("{holder} leads"),
        ),
        None => {
            let message = match record.and_then(|r| r.holder.as_deref()) {
                Some(expired) => format!("the lease of {expired} expired and no candidate has taken it"),
                None => "no candidate holds the lease".to_string(),
            };
            condition(old, generation, "Ready", "False", "NoLeader", &message)
        }
    };
    DistributedLeaseStatus {
        conditions: read_conditions(old, generation, valid, valid_condition, ready),
        holder,
        term: Some(term),
        token: record.and_then(|r| r.token).map(|t| t.to_string()),
        renewed_at: record.and_then(|r| r.renewed_at).map(|t| t.to_rfc3339()),
        leader_version: record.and_then(|r| r.version.as_ref()).map(ToString::to_string),
        leader_revision: record.and_then(|r| r.version.as_ref()).map(|v| v.revision),
        transitions,
        partitions: None,
        ..counts
    }
}

/// The conditions after a successful store read: valid, the store's tables
/// ready, and `ready` as the lease's kind judges it.
fn read_conditions(
    old: &DistributedLeaseStatus,
    generation: Option<i64>,
    valid: &ValidLease,
    valid_condition: Condition,
    ready: Condition,
) -> Vec<Condition> {
    let store_ready = condition(
        old,
        generation,
        "StoreReady",
        "True",
        "TableReady",
        &tables_ready(valid),
    );
    vec![valid_condition, store_ready, ready]
}

/// The status after a read of a partitioned lease: the assignment `shown`,
/// and `Ready` while every partition has a live owner (work may be unevenly
/// shared for a while after a join, but none is left undone). The
/// single-lock fields stay empty: there is no one leader.
fn partitioned_status(
    old: &DistributedLeaseStatus,
    generation: Option<i64>,
    valid: &ValidLease,
    shown: PartitionsStatus,
    valid_condition: Condition,
    counts: DistributedLeaseStatus,
) -> DistributedLeaseStatus {
    let ready = match (shown.unowned, shown.members) {
        (0, members) => condition(
            old,
            generation,
            "Ready",
            "True",
            "PartitionsOwned",
            &format!(
                "all {} partitions are owned; {members} members, balance {}",
                shown.count, shown.balance
            ),
        ),
        (unowned, 0) => condition(
            old,
            generation,
            "Ready",
            "False",
            "NoMembers",
            &format!(
                "no live candidate is a member; {unowned} of {} partitions are unowned",
                shown.count
            ),
        ),
        (unowned, members) => condition(
            old,
            generation,
            "Ready",
            "False",
            "PartitionsUnowned",
            &format!(
                "{unowned} of {} partitions have no live owner; {members} members",
                shown.count
            ),
        ),
    };
    DistributedLeaseStatus {
        conditions: read_conditions(old, generation, valid, valid_condition, ready),
        holder: None,
        term: None,
        token: None,
        renewed_at: None,
        leader_version: None,
        leader_revision: None,
        partitions: Some(shown),
        ..counts
    }
}

/// The `StoreReady` message of a store that answered.
fn tables_ready(valid: &ValidLease) -> String {
    match &valid.store {
        ValidStore::Spanner(c) => format!("table {} in {} is ready", c.table, c.database),
        other => format!("{other} is ready"),
    }
}

/// The Event when the recorded leader version changed since the last
/// status (a new version acquired), or `None`. The first sighting is no move.
fn version_move(old: &DistributedLeaseStatus, new: &DistributedLeaseStatus, lock: &str) -> Option<(EventType, String)> {
    if new.leader_version == old.leader_version || old.term.is_none() {
        return None;
    }
    let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "no version".into());
    let backwards = matches!((old.leader_revision, new.leader_revision), (Some(o), Some(n)) if n < o);
    let kind = if backwards {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let note = format!(
        "leadership of lock {lock} moved from {} to {}{}",
        shown(&old.leader_version),
        shown(&new.leader_version),
        if backwards { ", an older revision" } else { "" }
    );
    Some((kind, note))
}

/// The condition type that says a readiness-gated lease's candidates have
/// rolled out: `kubectl wait dlease/NAME --for=condition=RolledOut`.
pub const ROLLED_OUT: &str = "RolledOut";

/// `RolledOut`, for readiness-gated leases: every candidate's Deployment
/// runs only its current revision and a candidate pod leads and is Ready.
/// `kubectl rollout status` cannot say this: only one pod is ever Ready.
fn rolled_out_condition(
    old: &DistributedLeaseStatus,
    generation: Option<i64>,
    owners: &Result<Vec<Deployment>, kube::Error>,
    candidates: &[Arc<Pod>],
    leader: Option<&str>,
) -> Condition {
    let owners = match owners {
        Ok(owners) => owners,
        Err(e) => {
            let message = format!("could not read the candidates' Deployments: {e}");
            return condition(old, generation, ROLLED_OUT, "Unknown", "CheckFailed", &message);
        }
    };
    let pending: Vec<String> = owners.iter().filter_map(rollout::pending_rollout).collect();
    if !pending.is_empty() {
        return condition(
            old,
            generation,
            ROLLED_OUT,
            "False",
            "RolloutInProgress",
            &pending.join("; "),
        );
    }
    let leader_pod = leader.and_then(|name| candidates.iter().find(|p| p.meta().name.as_deref() == Some(name)));
    match leader_pod {
        Some(pod) if pod_ready(pod) => condition(
            old,
            generation,
            ROLLED_OUT,
            "True",
            "RolloutComplete",
            &format!(
                "every candidate runs its Deployment's current revision and {} leads, Ready",
                pod.name_any()
            ),
        ),
        Some(pod) => condition(
            old,
            generation,
            ROLLED_OUT,
            "False",
            "LeaderNotReady",
            &format!("{} leads but is not Ready yet", pod.name_any()),
        ),
        None => condition(
            old,
            generation,
            ROLLED_OUT,
            "False",
            "NoLeader",
            "no candidate pod holds the lease",
        ),
    }
}

/// `RolloutSafe`, for readiness-gated leases: whether a rolling update of the
/// candidates' Deployments can make progress while only the leader is Ready.
async fn rollout_condition(
    lease: &DistributedLease,
    ctx: &Context,
    owners: &Result<Vec<Deployment>, kube::Error>,
    old: &DistributedLeaseStatus,
    leader_moves_to_new: bool,
) -> Condition {
    let generation = lease.metadata.generation;
    match owners
        .as_ref()
        .map(|owners| rollout::stall_reasons(owners, leader_moves_to_new))
    {
        Ok(reasons) if reasons.is_empty() => condition(
            old,
            generation,
            "RolloutSafe",
            "True",
            "NoStall",
            "rolling updates of the candidates' Deployments can proceed with only the leader Ready",
        ),
        Ok(reasons) => {
            let message = reasons.join("; ");
            warn!(%message, "readiness gate would stall rollouts");
            if changed_message(old, "RolloutSafe", "False", &message) {
                ctx.publish(
                    lease,
                    EventType::Warning,
                    "RolloutWouldStall",
                    "CheckRollout",
                    message.clone(),
                )
                .await;
            }
            condition(old, generation, "RolloutSafe", "False", "RolloutWouldStall", &message)
        }
        Err(e) => {
            warn!(error = %e, "could not read the candidates' Deployments");
            let message = format!("could not read the candidates' Deployments: {e}");
            condition(old, generation, "RolloutSafe", "Unknown", "CheckFailed", &message)
        }
    }
}

/// A condition, keeping its last transition time while its status stays the same.
fn condition(
    old: &DistributedLeaseStatus,
    generation: Option<i64>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Condition {
    let last_transition_time = old
        .conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time,
        observed_generation: generation,
    }
}

/// True unless the old status already carried this exact condition: Events
/// for a persisting problem are published once, not on every requeue.
fn changed_message(old: &DistributedLeaseStatus, kind: &str, status: &str, message: &str) -> bool {
    !old.conditions
        .iter()
        .any(|c| c.type_ == kind && c.status == status && c.message == message)
}

/// Reason and message for a store that could not be used, naming what to fix.
fn store_problem(valid: &ValidLease, error: &StoreError) -> (&'static str, String) {
    let place = valid.store.to_string();
    match error {
        StoreError::Invalid { .. } => (
            "StoreMisconfigured",
            format!("store {place} cannot be used: {}", error.chain()),
        ),
        StoreError::Unavailable { .. } | StoreError::OutcomeUnknown { .. } => {
            ("StoreUnavailable", format!("store {place}: {}", error.chain()))
        }
        StoreError::Lost { reason, .. } => ("StoreUnavailable", format!("store {place}: {reason}")),
    }
}

/// Writes the status by server-side apply, only when something users see
/// differs from what the resource already shows: `renewedAt` alone moves on
/// every renewal and is refreshed only with another change, so a steady
/// lease costs no writes (and no watch event, so no extra reconcile).
async fn write_status(
    leases: &Api<DistributedLease>,
    name: &str,
    old: &DistributedLeaseStatus,
    status: DistributedLeaseStatus,
) -> Result<()> {
    let visible = |s: &DistributedLeaseStatus| DistributedLeaseStatus {
        renewed_at: None,
        ..s.clone()
    };
    if visible(old) == visible(&status) {
        debug!("status unchanged");
        return Ok(());
    }
    let patch = json!({
        "apiVersion": DistributedLease::api_version(&()),
        "kind": DistributedLease::kind(&()),
        "status": status,
    });
    leases
        .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// Adds the finalizer by merge patch, guarded by the resource version so a
/// concurrent finalizer change is not lost (the conflict retries).
async fn add_finalizer(leases: &Api<DistributedLease>, lease: &DistributedLease) -> Result<()> {
    let mut finalizers = lease.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    patch_finalizers(leases, lease, finalizers).await
}

async fn remove_finalizer(leases: &Api<DistributedLease>, lease: &DistributedLease) -> Result<()> {
    let finalizers: Vec<String> = lease.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    patch_finalizers(leases, lease, finalizers).await
}

async fn patch_finalizers(
    leases: &Api<DistributedLease>,
    lease: &DistributedLease,
    finalizers: Vec<String>,
) -> Result<()> {
    let patch = json!({
        "metadata": {
            "resourceVersion": lease.resource_version(),
            "finalizers": finalizers,
        }
    });
    leases
        .patch(&lease.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The names of the candidates that cannot campaign, sorted.
pub fn without_sidecar(candidates: &[Arc<Pod>]) -> Vec<String> {
    let mut names: Vec<String> = candidates
        .iter()
        .filter(|pod| pod.spec.as_ref().and_then(webhook::injected_container).is_none())
        .map(|pod| pod.name_any())
        .collect();
    names.sort();
    names
}

/// On delete: frees the row by check-and-set with the holder and token just
/// read, so a new resource with the same lock starts clean, but only when
/// the holder is gone: a live holder whose pod still runs keeps its lease
/// (its sidecar still believes it leads, and releases on its own shutdown
/// after its work stopped, S8); deleting the resource then just drops the
/// finalizer.
///
/// A live holder outside this namespace is left alone too: another
/// cluster's or namespace's resource may name the same lock, and its leader
/// is not ours to depose. An invalid spec or a store that cannot hold the
/// table has nothing to release; an unreachable store keeps the finalizer
/// until it answers, for [`RELEASE_PATIENCE`] after the delete.
async fn release_on_delete(lease: &DistributedLease, namespace: &str, ctx: &Context) -> Result<()> {
    match try_release_on_delete(lease, namespace, ctx).await {
        Err(Error::Release { lock, source }) if deleted_for(lease) >= RELEASE_PATIENCE => {
            warn!(%lock, error = %source.chain(), "store unreachable since the delete; the row expires after D");
            ctx.publish(
                lease,
                EventType::Warning,
                "ReleaseSkipped",
                "Release",
                format!(
                    "could not release lock {lock} for {}: {source}; it expires by itself after the lease duration",
                    humantime::format_duration(RELEASE_PATIENCE)
                ),
            )
            .await;
            Ok(())
        }
        other => other,
    }
}

/// How long ago the resource was deleted (zero if it is not).
fn deleted_for(lease: &DistributedLease) -> Duration {
    let Some(deleted) = &lease.meta().deletion_timestamp else {
        return Duration::ZERO;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(deleted.0);
    Duration::try_from(age).unwrap_or(Duration::ZERO)
}

async fn try_release_on_delete(lease: &DistributedLease, namespace: &str, ctx: &Context) -> Result<()> {
    let Ok(valid) = validate(lease) else {
        info!("invalid spec: no lock row to release");
        return Ok(());
    };
    if valid.partitions.is_some() {
        // Each candidate frees its partitions when it stops (closing its
        // session); a dead candidate's expire with its session and are
        // collected. There is no row of the resource's own to release.
        info!("partitioned: the candidates' sessions free the partitions");
        return Ok(());
    }
    if valid.store == ValidStore::Kubernetes {
        // The operator only reads Leases (operator::rbac::STORE_RULES); a
        // dead holder's Lease expires D after its last renewal.
        info!("Kubernetes store: the operator does not write Leases; a dead holder's expires by itself");
        return Ok(());
    }
    let observed = async {
        let (_, store) = ctx.store_of(&valid, namespace).await?;
        let observed = store.observe(&valid.lock).await?;
        Ok((store, observed))
    }
    .await;
    let (store, observed) = match observed {
        Ok(found) => found,
        Err(e @ StoreError::Invalid { .. }) => {
            warn!(error = %e.chain(), "store cannot hold the lock; nothing to release");
            return Ok(());
        }
        Err(source) => {
            return Err(Error::Release {
                lock: valid.lock,
                source,
            });
        }
    };
    let Some((holder, token)) = observed
        .record
        .as_ref()
        .and_then(|record| Some((record.holder.clone()?, record.token?)))
    else {
        return Ok(());
    };
    if observed.live_holder().is_some() {
        let pod = HolderPod::parse(&holder);
        if !pod.is_local(ctx.cluster.as_deref(), namespace) {
            info!(%holder, "holder belongs to another namespace or cluster; not releasing");
            return Ok(());
        }
        if let Some(name) = pod.pod()
            && ctx.pod_runs(namespace, name).await?
        {
            info!(%holder, "the holder's pod still runs; its sidecar releases the lease itself");
            return Ok(());
        }
    }
    match store.release(&valid.lock, &holder, token).await {
        Ok(()) | Err(StoreError::Lost { .. }) => {
            info!(lock = %valid.lock, %holder, "released the lock row");
            ctx.publish(
                lease,
                EventType::Normal,
                "Released",
                "Release",
                format!("released lock {} held by {holder}, whose pod is gone", valid.lock),
            )
            .await;
            Ok(())
        }
        Err(source) => Err(Error::Release {
            lock: valid.lock,
            source,
        }),
    }
}

/// Sets the leader label back to `"false"` on candidates that show `"true"`
/// but are none of `holders` (a sidecar that died before clearing it): the
/// lease's live holder, or for a partitioned lease its members (a member
/// may label itself while it holds partitions, and one holding none yet is
/// left alone rather than raced). Failures are reported and left for the
/// next reconcile.
async fn repair_labels(
    lease: &DistributedLease,
    ctx: &Context,
    pods: &Api<Pod>,
    candidates: &[Arc<Pod>],
    label_key: &str,
    holders: &[HolderPod],
) {
    let namespace = lease.namespace().unwrap_or_default();
    for pod in candidates {
        let labelled = pod.labels().get(label_key).is_some_and(|v| v == "true");
        let pod_name = pod.name_any();
        let holds = holders.iter().any(|holder| {
            holder.pod() == Some(pod_name.as_str()) && holder.may_be_local(ctx.cluster.as_deref(), &namespace)
        });
        if !labelled || holds {
            continue;
        }
        // Guarded by the resource version: if the pod changed since the list,
        // the patch conflicts and the next reconcile decides again.
        let patch = json!({
            "metadata": {
                "resourceVersion": pod.resource_version(),
                "labels": { label_key: "false" },
            }
        });
        match pods
            .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(pod = %pod_name, "cleared a stale leader label");
                ctx.metrics.label_repaired();
                ctx.publish(
                    lease,
                    EventType::Normal,
                    "StaleLabelCleared",
                    "RepairLabel",
                    format!("pod {pod_name} had {label_key}=true without holding the lease"),
                )
                .await;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                debug!(pod = %pod_name, "pod changed since listed; deciding next time");
            }
            Err(e) => {
                warn!(pod = %pod_name, error = %e, "could not clear a stale leader label");
                ctx.publish(
                    lease,
                    EventType::Warning,
                    "LabelRepairFailed",
                    "RepairLabel",
                    format!("could not set {label_key}=false on pod {pod_name}: {e}"),
                )
                .await;
            }
        }
    }
}

/// Where a holder identity `[cluster/][namespace/]pod#nonce` runs; a
/// holder that is not such an identity (another tool's row) runs nowhere we
/// know of.
#[derive(Debug, PartialEq, Eq)]
struct HolderPod(Option<Identity>);

impl HolderPod {
    fn parse(holder: &str) -> Self {
        HolderPod(holder.parse().ok())
    }

    /// The owner of a session id ([`session_owner`]).
    fn of_session(session: &str) -> Self {
        HolderPod(session_owner(session))
    }

    /// The holder's pod name, when the holder is an identity.
    fn pod(&self) -> Option<&str> {
        self.0.as_ref().map(Identity::name)
    }

    /// Could be a pod in `namespace` of this cluster: when either side does
    /// not name its cluster, assume it is. Used before clearing a label, where
    /// the cautious answer is "maybe the holder".
    fn may_be_local(&self, cluster: Option<&str>, namespace: &str) -> bool {
        let Some(identity) = &self.0 else { return true };
        let cluster_matches = match (identity.cluster(), cluster) {
            (Some(theirs), Some(ours)) => theirs == ours,
            _ => true,
        };
        cluster_matches && identity.namespace().is_none_or(|ns| ns == namespace)
    }

    /// Certainly a pod in `namespace` of this cluster. Used before releasing,
    /// where the cautious answer is "not ours": an unreleased lease expires.
    fn is_local(&self, cluster: Option<&str>, namespace: &str) -> bool {
        self.0.as_ref().is_some_and(|identity| {
            identity.cluster() == cluster && identity.namespace().is_none_or(|ns| ns == namespace)
        })
    }
}

/// `TimingAtRisk`: True while a candidate's sidecar reports (in its pod
/// condition [`TIMING_CONDITION`]) that its renewals use more than their
/// share of R − P, naming the pods and what they measured. The sidecar
/// changes that condition only when the verdict crosses the threshold, so
/// this costs no status writes while it holds.
fn timing_condition(old: &DistributedLeaseStatus, generation: Option<i64>, candidates: &[Arc<Pod>]) -> Condition {
    let at_risk: Vec<String> = candidates
        .iter()
        .filter_map(|pod| {
            let reported = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == TIMING_CONDITION && c.status == "True")?;
            Some(format!(
                "{}: {}",
                pod.name_any(),
                reported.message.as_deref().unwrap_or_default()
            ))
        })
        .collect();
    match at_risk.is_empty() {
        true => condition(
            old,
            generation,
            "TimingAtRisk",
            "False",
            "RenewalsWithinBudget",
            "no candidate reports renewals over their share of R - P",
        ),
        false => condition(
            old,
            generation,
            "TimingAtRisk",
            "True",
            "RenewalsSlow",
            &at_risk.join("; "),
        ),
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The scripted API server of the reconcile's tests (here and in the
/// emulator tests, `tests/stores/spanner.rs`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod fixtures;
#[cfg(test)]
mod tests;
