//! What every reconcile needs ([`Context`]) and how it looks: the
//! candidates from the pod watch's cache, the store through cached
//! connections and Secret reads, and the store's garbage collection.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::core::Selector;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::plan::{Found, Read, Seen, StoreSeen};
use super::{Error, GC_INTERVAL, MIN_REQUEUE, POD_CACHE_WAIT, Result, SECRET_REFRESH};
use crate::candidate::CandidatePod;
use crate::index::{PodCache, pod_cache};
use crate::metrics::Metrics;
use crate::observer::{Ask, Locks, Observers, Partitioned};
use crate::preferred::Pending;
use crate::rollout;
use crate::stores::{StoreProvider, read_url, target_of};
use leasehold_core::lease::holder::HolderPod;
use leasehold_core::lease::partitions::PartitionView;
use leasehold_core::lease::session::Collected;
use leasehold_core::lease::{LeaseStore, Observation, StoreError, StoreIdentity};
use leasehold_kubernetes::api::{DistributedLease, ValidLease, validate};
use leasehold_runtime::StoreConfig;
use leasehold_stores::StoreUrl;

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
    pub(super) cluster: Option<String>,
    /// The pod watch's cache, indexed by label: the candidates of every lease.
    pods: PodCache,
    /// The Deployment watch's cache: the readiness-gated candidates' owners.
    deployments: Store<Deployment>,
    /// The stores (by [`StoreConfig::key`]) whose table is known to exist.
    schemas: Arc<Mutex<HashSet<String>>>,
    /// Store URLs read from Secrets, with when.
    urls: Arc<Mutex<HashMap<SecretKey, (StoreUrl, Instant)>>>,
    /// What each store (by [`StoreConfig::key`]) said it is, with when:
    /// read again with the URL, every [`SECRET_REFRESH`] or after a failure.
    identities: Arc<Mutex<HashMap<String, (StoreIdentity, Instant)>>>,
    /// Per lease uid, the store its recorded identity was last read through:
    /// what status keeps reading while its Secret reaches another store.
    recorded: Arc<Mutex<HashMap<String, StoreConfig>>>,
    /// When each store's dead sessions were last collected.
    gc: Arc<GcSchedule>,
    /// The batched reads of every store's locks.
    pub(crate) observers: Arc<Observers>,
    /// Preferred candidates: what each lease had pending at its last look.
    preferences: Arc<Mutex<Preferences>>,
}

/// Per lease (`namespace/name`): the pending move, and the unparsable
/// priorities last warned about. In memory: an operator that restarts
/// starts every stabilisation period again, which delays a move and never
/// hastens one.
#[derive(Default)]
struct Preferences {
    pending: HashMap<String, Pending>,
    warned: HashMap<String, String>,
}

impl Context {
    pub fn new(client: Client, reporter: Reporter, stores: Arc<dyn StoreProvider>, metrics: Arc<Metrics>) -> Self {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            stores,
            metrics,
            cluster: None,
            pods: pod_cache().0,
            deployments: kube::runtime::reflector::store().0,
            schemas: Arc::default(),
            urls: Arc::default(),
            identities: Arc::default(),
            recorded: Arc::default(),
            gc: Arc::default(),
            observers: Arc::default(),
            preferences: Arc::default(),
        }
    }

    /// This context reading candidates from `pods` and their Deployments
    /// from `deployments`, the caches of one run's watches.
    pub(crate) fn with_caches(&self, pods: PodCache, deployments: Store<Deployment>) -> Context {
        Context {
            deployments,
            client: self.client.clone(),
            recorder: self.recorder.clone(),
            stores: self.stores.clone(),
            metrics: self.metrics.clone(),
            cluster: self.cluster.clone(),
            pods,
            schemas: self.schemas.clone(),
            urls: self.urls.clone(),
            identities: self.identities.clone(),
            recorded: self.recorded.clone(),
            gc: self.gc.clone(),
            observers: self.observers.clone(),
            preferences: self.preferences.clone(),
        }
    }

    /// Waits until the pod watch has listed the pods once.
    async fn pods_listed(&self) -> Result<()> {
        tokio::time::timeout(POD_CACHE_WAIT, self.pods.store().wait_until_ready())
            .await
            .map_err(|_| Error::PodsNotListed)?
            .map_err(|_| Error::PodsNotListed)
    }

    /// The Deployments owning `candidates`, from the Deployment watch's
    /// cache once it has listed them: no request per reconcile.
    async fn owners(&self, namespace: &str, candidates: &[Arc<CandidatePod>]) -> Result<Vec<Deployment>> {
        tokio::time::timeout(POD_CACHE_WAIT, self.deployments.wait_until_ready())
            .await
            .map_err(|_| Error::DeploymentsNotListed)?
            .map_err(|_| Error::DeploymentsNotListed)?;
        Ok(rollout::cached_owners(&self.deployments, namespace, candidates))
    }

    /// Whether the holder's pod runs in `namespace` (exists, is the
    /// holder's by [`HolderPod::is_pod`], and has not finished), from the
    /// pod watch's cache.
    pub(super) async fn pod_runs(&self, namespace: &str, name: &str, holder: &HolderPod) -> Result<bool> {
        self.pods_listed().await?;
        let pod = self.pods.store().get(&ObjectRef::new(name).within(namespace));
        Ok(pod.is_some_and(|pod| !pod.finished && holder.is_pod(&pod.name, pod.uid.as_deref())))
    }

    /// The candidate pods of a lease, from the pod watch's cache, once it
    /// has listed the pods.
    async fn candidates(&self, namespace: &str, selector: &Selector) -> Result<Vec<Arc<CandidatePod>>> {
        self.pods_listed().await?;
        Ok(self.pods.selected(namespace, selector))
    }

    fn preferences(&self) -> std::sync::MutexGuard<'_, Preferences> {
        self.preferences.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The move pending for lease `key` at its last look.
    pub(super) fn preference(&self, key: &str) -> Option<Pending> {
        self.preferences().pending.get(key).cloned()
    }

    pub(super) fn remember_preference(&self, key: &str, pending: Option<Pending>) {
        let mut preferences = self.preferences();
        match pending {
            Some(pending) => preferences.pending.insert(key.to_string(), pending),
            None => preferences.pending.remove(key),
        };
    }

    /// Forgets lease `key` (deleted, invalid, or its store unread).
    pub(super) fn forget_preference(&self, key: &str) {
        let mut preferences = self.preferences();
        preferences.pending.remove(key);
        preferences.warned.remove(key);
    }

    /// Records `message` as lease `key`'s priority problems; true when it
    /// differs from the last one recorded.
    pub(super) fn warned_priorities(&self, key: &str, message: &str) -> bool {
        let mut preferences = self.preferences();
        let previous = preferences.warned.insert(key.to_string(), message.to_string());
        previous.as_deref().unwrap_or_default() != message
    }

    /// Names this cluster (see the sidecar's cluster name).
    pub(crate) fn with_cluster(mut self, cluster: Option<String>) -> Self {
        self.cluster = cluster;
        self
    }

    /// The store of a valid lease and its connection ([`Context::target`]).
    pub(super) async fn store_of(
        &self,
        lease: &DistributedLease,
        valid: &ValidLease,
        namespace: &str,
    ) -> Result<(Target, Arc<dyn LeaseStore>), StoreError> {
        let target = self.target(lease, valid, namespace).await?;
        let store = self.stores.store(&target.config).await?;
        Ok((target, store))
    }

    /// The store the lease's candidates campaign on. A PostgreSQL or Redis
    /// URL is read from the resource's Secret and kept for
    /// [`SECRET_REFRESH`], or until a store call fails, so a rotated
    /// credential is picked up; the store it reaches must be the one
    /// `status.storeIdentity` recorded (none recorded yet: this one, which
    /// the plan records). A Secret reaching another store is not followed:
    /// the recorded store is read through the last configuration that
    /// reached it, and without one the lease's store cannot be read
    /// (docs/migrating-stores.md, "The store's identity").
    pub(super) async fn target(
        &self,
        lease: &DistributedLease,
        valid: &ValidLease,
        namespace: &str,
    ) -> Result<Target, StoreError> {
        let configured = self.configured(valid, namespace).await?;
        let reached = match self.identity_of(&configured).await {
            Ok(reached) => reached,
            Err(e) => {
                self.forget_url(valid, namespace, &configured);
                return Err(e);
            }
        };
        let uid = lease.metadata.uid.clone().unwrap_or_default();
        let recorded = lease.status.as_ref().and_then(|s| s.store_identity.as_deref());
        let mut known = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        match recorded {
            Some(recorded) if recorded != reached.as_str() => {
                let elsewhere = format!(
                    "the store's Secret now reaches store {reached}, not {recorded}, which the candidates campaign \
                     on (status.storeIdentity): no candidate campaigns there; set the Secret back, or move the \
                     lease by deleting and re-creating it (docs/migrating-stores.md)"
                );
                match known.get(&uid) {
                    Some(config) => Ok(Target {
                        config: config.clone(),
                        identity: StoreIdentity::new(recorded),
                        elsewhere: Some(elsewhere),
                    }),
                    None => Err(StoreError::invalid(format!(
                        "{elsewhere}; the operator has no way to the recorded store until then"
                    ))),
                }
            }
            _ => {
                known.insert(uid, configured.clone());
                Ok(Target {
                    config: configured,
                    identity: reached,
                    elsewhere: None,
                })
            }
        }
    }

    /// Forgets what was known of a deleted lease's store.
    pub(super) fn forget_store(&self, lease: &DistributedLease) {
        let uid = lease.metadata.uid.as_deref().unwrap_or_default();
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    /// Which store `target` reaches, read at most once per [`SECRET_REFRESH`].
    async fn identity_of(&self, target: &StoreConfig) -> Result<StoreIdentity, StoreError> {
        refreshed(&self.identities, target.key(), || self.stores.identity(target)).await
    }

    /// Where a valid lease's Secret (or spec) says its store is.
    async fn configured(&self, valid: &ValidLease, namespace: &str) -> Result<StoreConfig, StoreError> {
        let url = match valid.store.url_secret() {
            None => None,
            Some(secret) => {
                let key = (namespace.to_string(), secret.name.clone(), secret.key.clone());
                Some(refreshed(&self.urls, key, || read_url(&self.client, namespace, secret)).await?)
            }
        };
        target_of(valid, namespace, url)
    }

    /// `read` of `target`; when it fails, the URL read for `valid` and the
    /// store's identity are forgotten (a rotated credential is read again
    /// at the next reconcile).
    async fn forgetting_url<T>(
        &self,
        valid: &ValidLease,
        namespace: &str,
        target: &StoreConfig,
        read: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let observed = read.await;
        if observed.is_err() {
            self.forget_url(valid, namespace, target);
        }
        observed
    }

    /// Forgets the URL read for `valid` and what its store said it is, so
    /// the next reconcile reads its Secret and the store's identity again.
    fn forget_url(&self, valid: &ValidLease, namespace: &str, target: &StoreConfig) {
        if let Some(secret) = valid.store.url_secret() {
            let key = (namespace.to_string(), secret.name.clone(), secret.key.clone());
            self.urls.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        }
        self.identities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&target.key());
    }

    /// The lease row from its store's observer ([`crate::observer`]),
    /// as `need` says, creating the table the first time where the operator
    /// has the rights.
    async fn observe(
        &self,
        lease: &DistributedLease,
        valid: &ValidLease,
        namespace: &str,
        target: &StoreConfig,
        read_after: Option<Instant>,
    ) -> Result<(Observation, Instant), StoreError> {
        let read = async {
            let store = self.stores.store(target).await?;
            let key = target.key();
            let ask = || {
                let ask = Ask {
                    store_key: key.clone(),
                    source: Locks(store.clone()),
                    key: valid.lock.clone(),
                    lease: ObjectRef::from_obj(lease),
                    period: valid.timing.retry_period.max(MIN_REQUEUE),
                    read_after,
                };
                async move {
                    let stamped = self.observers.observe(ask).await;
                    stamped.observation.map(|observed| (observed, stamped.read_at))
                }
            };
            self.with_schema(key.clone(), valid, store.ensure_schema(), ask).await
        };
        self.forgetting_url(valid, namespace, target, read).await
    }

    /// The assignment of a partitioned lease from its session tables'
    /// observer, as `read_after` says (as [`Context::observe`] reads a
    /// plain lease's row), creating the session tables the first time
    /// where the operator has the rights.
    pub(super) async fn observe_partitions(
        &self,
        lease: &DistributedLease,
        valid: &ValidLease,
        namespace: &str,
        target: &StoreConfig,
        partitions: u32,
        read_after: Option<Instant>,
    ) -> Result<(PartitionView, Instant), StoreError> {
        let read = async {
            let sessions = self.stores.sessions(target).await?;
            let key = format!("{}\nsessions", target.key());
            let ask = || {
                let ask = Ask {
                    store_key: key.clone(),
                    source: Partitioned(sessions.clone()),
                    key: (valid.lock.clone(), partitions),
                    lease: ObjectRef::from_obj(lease),
                    period: valid.timing.retry_period.max(MIN_REQUEUE),
                    read_after,
                };
                async move {
                    let stamped = self.observers.observe_partitions(ask).await;
                    stamped.observation.map(|view| (view, stamped.read_at))
                }
            };
            self.with_schema(key.clone(), valid, sessions.ensure_session_schema(), ask)
                .await
        };
        self.forgetting_url(valid, namespace, target, read).await
    }

    /// `read`, after `ensure` created the tables the first time for `key`,
    /// and again whenever the read finds them invalid: a table the
    /// operator created once may be gone since (the database re-created,
    /// or the URL now naming another server at the same address), and
    /// what was done once is no proof of what the store holds now.
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
        if known {
            match read().await {
                Err(StoreError::Invalid { .. }) => {
                    self.schemas.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                }
                read => return read,
            }
        }
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
        read().await
    }

    /// Deletes the dead sessions of the lease's store, and the lock rows
    /// they left, at most once per [`GC_INTERVAL`] per store (whichever of
    /// its leases comes first), for stores that keep sessions. The store
    /// judges death by its own clock in the deleting transaction, so a
    /// live session is never touched. A failure waits for the next turn.
    async fn collect_garbage(&self, valid: &ValidLease, target: &StoreConfig) {
        if !self.gc.due(target.key(), Instant::now()) {
            return;
        }
        let collected = match self.stores.sessions(target).await {
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

/// What `cache` holds for `key` while younger than [`SECRET_REFRESH`];
/// else what `read` answers, kept with the time it was read. The one rule
/// for the Secrets' URLs and the stores' identities: both are read again
/// then, and sooner once a store call failed (`Context::forget_url`).
async fn refreshed<K, V, F>(
    cache: &Mutex<HashMap<K, (V, Instant)>>,
    key: K,
    read: impl FnOnce() -> F,
) -> Result<V, StoreError>
where
    K: Eq + std::hash::Hash,
    V: Clone,
    F: Future<Output = Result<V, StoreError>>,
{
    let cached = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    match cached {
        Some((value, read_at)) if read_at.elapsed() < SECRET_REFRESH => Ok(value),
        _ => {
            let value = read().await?;
            cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, (value.clone(), Instant::now()));
            Ok(value)
        }
    }
}

/// When each store's dead sessions were last collected, by [`StoreConfig::key`].
#[derive(Default)]
pub(super) struct GcSchedule(Mutex<HashMap<String, Instant>>);

impl GcSchedule {
    /// Whether the store `key` is due at `now`; if so, the turn is taken
    /// (before the call, so a failing store also waits a whole interval).
    pub(super) fn due(&self, key: String, now: Instant) -> bool {
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

/// What a reconcile needs of the store read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    /// The observer's last read of the lock will do.
    Cached,
    /// A read started after the candidates were taken.
    AfterCandidates,
}

/// Whether the store read a plan rests on started before the candidates
/// were taken from the pod cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadWas {
    BeforeCandidates,
    AfterCandidates,
}

/// Looks at everything a live resource's plan needs, in the order the
/// module's doc gives: the spec, the candidates, the candidates'
/// Deployments when readiness-gated, the store (its observer's last read,
/// or one after the candidates, as `need` says); then collects the store's
/// dead sessions when their turn came.
pub(super) async fn look(
    lease: &DistributedLease,
    namespace: &str,
    ctx: &Context,
    need: Need,
) -> Result<(Found, ReadWas)> {
    let valid = match validate(lease) {
        Ok(valid) => valid,
        Err(e) => {
            return Ok((
                Found::Invalid(leasehold_kubernetes::api::errors::message(&e)),
                ReadWas::AfterCandidates,
            ));
        }
    };
    let taken = Instant::now();
    let candidates = ctx.candidates(namespace, &valid.selector).await?;
    // Readiness-gated: the candidates' Deployments, read once for both
    // `RolloutSafe` and `RolledOut`.
    let owners = match valid.readiness_gate {
        true => Some(Ok(ctx.owners(namespace, &candidates).await?)),
        false => None,
    };
    let mut was = ReadWas::AfterCandidates;
    let read_after = (need == Need::AfterCandidates).then_some(taken);
    let target = ctx.target(lease, &valid, namespace).await;
    let read = match &target {
        Err(e) => Err(e.clone()),
        Ok(target) => match valid.partitions {
            None => ctx
                .observe(lease, &valid, namespace, &target.config, read_after)
                .await
                .map(|(observed, read_at)| {
                    if read_at < taken {
                        was = ReadWas::BeforeCandidates;
                    }
                    Read::Lease(observed)
                }),
            Some(n) => ctx
                .observe_partitions(lease, &valid, namespace, &target.config, n, read_after)
                .await
                .map(|(view, read_at)| {
                    if read_at < taken {
                        was = ReadWas::BeforeCandidates;
                    }
                    Read::Partitions(view)
                }),
        },
    };
    let store = target.ok();
    if let (Ok(_), Some(store)) = (&read, &store) {
        ctx.collect_garbage(&valid, &store.config).await;
    }
    let found = Found::Valid(Box::new(Seen {
        valid,
        candidates,
        owners,
        store: store.map(|target| StoreSeen {
            identity: target.identity,
            elsewhere: target.elsewhere,
        }),
        read,
        held_off: None,
    }));
    Ok((found, was))
}

/// The store a lease's candidates campaign on ([`Context::target`]).
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// How to reach it.
    pub config: StoreConfig,
    /// Its identity: the recorded one, or (none recorded yet) the one to record.
    pub identity: StoreIdentity,
    /// Why the Secret no longer leads there, when it reaches another store.
    pub elsewhere: Option<String>,
}

#[cfg(test)]
mod tests;
