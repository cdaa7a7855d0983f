//! Prometheus metrics of the sidecar, and the store decorator that counts
//! every store call (reads vs read-write transactions, latency, failures).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use leasehold_core::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation};
use leasehold_core::lease::{
    Assigned, Change, Claim, FencingToken, Grant, Held, Identity, LeaderState, LeaseStore, Observation, Release,
    SessionStore, StoreError, StoreTime,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// observe, acquire, renew, release, ensure_schema; partitioned:
    /// open_session, renew_session, close_session, observe_session,
    /// try_lock, unlock, observe_locks, collect_garbage,
    /// ensure_session_schema.
    pub op: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub op: &'static str,
    /// lost, unavailable, outcome_unknown, invalid.
    pub kind: &'static str,
}

/// Why this candidate's leadership changed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    /// acquired; or how it stopped leading: stepped down on purpose, named
    /// by the reason its release records in the store and the history
    /// shows ([`EndReason::as_str`]: released, transferred, preempted,
    /// pod_terminating, app_unhealthy); release_failed (stepped down, the
    /// lease left to expire); lost (the store says another holds it);
    /// expired (no renewal within the renew deadline).
    pub reason: &'static str,
}

impl ChangeLabels {
    /// The reason of a change of leadership to `leads`, as the elector's
    /// last change and the end it recorded explain it.
    pub fn of(leads: bool, state: &LeaderState) -> Self {
        let reason = match (leads, &state.change) {
            (true, _) => "acquired",
            (false, Change::SteppingDown | Change::Released) => state.ending.unwrap_or_default().as_str(),
            (false, Change::ReleaseFailed(_)) => "release_failed",
            (false, Change::Lost(_)) => "lost",
            // DeadlineMissed, or the deadline passed before the elector said so.
            (false, _) => "expired",
        };
        ChangeLabels { reason }
    }
}

/// client-go's leader-election metric labels: the lock's name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ElectionLabels {
    pub name: String,
}

/// The sidecar's metrics.
#[derive(Clone)]
pub struct Metrics {
    pub is_leader: Gauge,
    /// 1 while this candidate follows a live holder of another cluster
    /// (both name their cluster, the names differ), as last read from the
    /// store: the cluster stands by, and `LeaseholdNoLeader` keeps quiet.
    pub leader_elsewhere: Gauge,
    /// `leader_election_master_status{name}`: `is_leader`, labelled by the
    /// lock's name, the metric client-go
    /// (k8s.io/client-go/tools/leaderelection/metrics.go) and
    /// controller-runtime export, which existing dashboards already use.
    pub(crate) master_status: Family<ElectionLabels, Gauge>,
    /// 1 healthy, 0 unhealthy, -1 cannot tell.
    pub app_healthy: Gauge,
    pub transitions: Counter,
    /// `transitions` by why leadership changed.
    pub leadership_changes: Family<ChangeLabels, Counter>,
    pub seconds_since_renew: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub store_calls: Family<OpLabels, Counter>,
    pub store_failures: Family<FailureLabels, Counter>,
    pub store_latency: Family<OpLabels, Histogram>,
    /// Partitioned: how many partitions this candidate may work on now.
    pub partitions_held: Gauge,
    /// Partitioned: the members sharing the partitions, in the last read.
    pub partition_members: Gauge,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            is_leader: Gauge::default(),
            leader_elsewhere: Gauge::default(),
            master_status: Family::default(),
            app_healthy: Gauge::default(),
            transitions: Counter::default(),
            leadership_changes: Family::default(),
            seconds_since_renew: Gauge::default(),
            store_calls: Family::default(),
            store_failures: Family::default(),
            store_latency: Family::new_with_constructor(|| {
                Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
            }),
            partitions_held: Gauge::default(),
            partition_members: Gauge::default(),
        };
        registry.register(
            "leader_election_master_status",
            "1 while this candidate leads the lock `name`, else 0 (as client-go's leader election exports it)",
            metrics.master_status.clone(),
        );
        let r = registry.sub_registry_with_prefix("leasehold");
        r.register("is_leader", "1 while this candidate leads", metrics.is_leader.clone());
        r.register(
            "leader_elsewhere",
            "1 while this candidate follows a live holder that names another cluster, as last read from the store",
            metrics.leader_elsewhere.clone(),
        );
        r.register(
            "app_healthy",
            "Whether the main container is healthy: 1 yes, 0 no, -1 cannot tell (no health source answers)",
            metrics.app_healthy.clone(),
        );
        r.register(
            "transitions",
            "Leadership acquisitions and losses",
            metrics.transitions.clone(),
        );
        r.register(
            "leadership_changes",
            "Leadership changes by reason: acquired; released, transferred, preempted, pod_terminating, app_unhealthy, as its release records it; release_failed, lost, expired",
            metrics.leadership_changes.clone(),
        );
        r.register(
            "seconds_since_renew",
            "Seconds since the last successful acquire or renew was sent (leaders only)",
            metrics.seconds_since_renew.clone(),
        );
        r.register(
            "store_calls",
            "Store calls by operation (observe is a read, the rest read-write transactions)",
            metrics.store_calls.clone(),
        );
        r.register(
            "store_failures",
            "Failed store calls by operation and kind",
            metrics.store_failures.clone(),
        );
        r.register(
            "store_latency_seconds",
            "Store call latency by operation (renew is the renew latency)",
            metrics.store_latency.clone(),
        );
        r.register(
            "partitions_held",
            "Partitions this candidate holds and may work on (0 unless the lock is partitioned)",
            metrics.partitions_held.clone(),
        );
        r.register(
            "partition_members",
            "Candidates sharing the partitions, in the last read (0 unless the lock is partitioned)",
            metrics.partition_members.clone(),
        );
        metrics
    }

    /// Partitioned: follows what this candidate may work on.
    pub(crate) async fn follow_partitions(self, mut assigned: tokio::sync::watch::Receiver<Assigned>) {
        loop {
            {
                let current = assigned.borrow_and_update();
                self.partitions_held.set(current.partitions.len() as i64);
                self.partition_members.set(current.members as i64);
            }
            if assigned.changed().await.is_err() {
                return;
            }
        }
    }

    /// Follows the elector's state of `lock`: leadership gauges, transitions,
    /// and the time since the last renewal (refreshed every second).
    pub async fn follow(self, lock: String, mut state: tokio::sync::watch::Receiver<LeaderState>) {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        let mut led = false;
        let leads_gauge = self.master_status.get_or_create(&ElectionLabels { name: lock }).clone();
        loop {
            let current = state.borrow_and_update().clone();
            let leads = current.is_leader_at(Instant::now());
            if leads != led {
                self.transitions.inc();
                self.leadership_changes
                    .get_or_create(&ChangeLabels::of(leads, &current))
                    .inc();
                led = leads;
            }
            self.is_leader.set(i64::from(leads));
            leads_gauge.set(i64::from(leads));
            self.leader_elsewhere.set(i64::from(
                !leads && holder_elsewhere(&current.identity, current.holder.as_deref()),
            ));
            let since = current
                .renewed
                .filter(|_| leads)
                .map_or(0.0, |r| r.elapsed().as_secs_f64());
            self.seconds_since_renew.set(since);
            tokio::select! {
                changed = state.changed() => if changed.is_err() { return },
                _ = ticker.tick() => {}
            }
        }
    }
}

/// Whether `holder` certainly runs in another cluster than the candidate
/// `me` (both identities; see [`Identity::cluster_other_than`]).
fn holder_elsewhere(me: &str, holder: Option<&str>) -> bool {
    let (Ok(me), Some(Ok(holder))) = (me.parse::<Identity>(), holder.map(str::parse::<Identity>)) else {
        return false;
    };
    holder.cluster_other_than(me.cluster()).is_some()
}

impl Metrics {
    /// Follows the app's health as the sidecar acts on it.
    pub(crate) async fn follow_app_health(self, mut health: tokio::sync::watch::Receiver<crate::health::AppHealth>) {
        loop {
            let value = match health.borrow_and_update().healthy {
                Some(true) => 1,
                Some(false) => 0,
                None => -1,
            };
            self.app_healthy.set(value);
            if health.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Counts and times every call into the wrapped store: a lease store
/// (`dyn LeaseStore`) or, partitioned, a session store (`dyn SessionStore`).
pub struct MeteredStore<S: ?Sized = dyn LeaseStore> {
    inner: Arc<S>,
    metrics: Metrics,
}

impl<S: ?Sized> MeteredStore<S> {
    pub fn new(inner: Arc<S>, metrics: Metrics) -> Self {
        MeteredStore { inner, metrics }
    }

    async fn measure<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        self.metrics.store_calls.get_or_create(&OpLabels { op }).inc();
        self.metrics
            .store_latency
            .get_or_create(&OpLabels { op })
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            let kind = match e {
                StoreError::Lost { .. } => "lost",
                StoreError::Unavailable { .. } => "unavailable",
                StoreError::OutcomeUnknown { .. } => "outcome_unknown",
                StoreError::Invalid { .. } => "invalid",
            };
            self.metrics
                .store_failures
                .get_or_create(&FailureLabels { op, kind })
                .inc();
        }
        result
    }
}

#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for MeteredStore<S> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.measure("ensure_schema", self.inner.ensure_schema()).await
    }
    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        self.measure("observe", self.inner.observe(lock)).await
    }
    async fn observe_followed(&self, lock: &str) -> Result<Observation, StoreError> {
        self.measure("observe_followed", self.inner.observe_followed(lock))
            .await
    }
    async fn changed(&self, lock: &str, seen: &Observation) {
        self.inner.changed(lock, seen).await
    }
    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        self.measure("acquire", self.inner.acquire_as(lock, claim, lease)).await
    }
    async fn take_over(
        &self,
        lock: &str,
        claim: &Claim<'_>,
        from: Held<'_>,
        lease: Duration,
    ) -> Result<Grant, StoreError> {
        self.measure("take_over", self.inner.take_over(lock, claim, from, lease))
            .await
    }
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        self.measure("renew", self.inner.renew(lock, holder, token, lease))
            .await
    }
    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        self.measure("release", self.inner.release_for(lock, holder, token, release))
            .await
    }
}

#[async_trait]
impl<S: SessionStore + ?Sized> SessionStore for MeteredStore<S> {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        self.measure("ensure_session_schema", self.inner.ensure_session_schema())
            .await
    }
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        self.measure("open_session", self.inner.open_session(session, owner, lease))
            .await
    }
    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        self.measure("renew_session", self.inner.renew_session(session)).await
    }
    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        self.measure("close_session", self.inner.close_session(session)).await
    }
    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        self.measure("observe_session", self.inner.observe_session(session))
            .await
    }
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        self.measure("try_lock", self.inner.try_lock(session, names)).await
    }
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        self.measure("unlock", self.inner.unlock(session, locks)).await
    }
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        self.measure("observe_locks", self.inner.observe_locks(names)).await
    }
    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.measure("collect_garbage", self.inner.collect_garbage()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lease::EndReason;
    use leasehold_core::store::memory::{Faults, MemoryStore};

    #[tokio::test]
    async fn metrics_shows_every_gauge_the_readme_documents() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.app_healthy.set(-1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let readme = include_str!("../../../README.md");
        for gauge in [
            "leasehold_is_leader",
            "leasehold_leader_elsewhere",
            "leasehold_app_healthy",
            "leasehold_seconds_since_renew",
            "leasehold_partitions_held",
            "leasehold_partition_members",
        ] {
            assert!(readme.contains(gauge), "README documents {gauge}");
            assert!(
                text.contains(&format!("# TYPE {gauge} gauge")),
                "{gauge} missing in\n{text}"
            );
        }
        assert!(text.contains("leasehold_app_healthy -1"), "{text}");
    }

    /// `leader_election_master_status{name}` follows leadership as
    /// client-go's does, and the README documents it.
    #[tokio::test]
    async fn the_client_go_leader_metric_follows_leadership() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let (tx, rx) = tokio::sync::watch::channel(LeaderState::default());
        let following = tokio::spawn(metrics.clone().follow("jobs".into(), rx));
        let encoded = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
            text
        };
        let shows = async |value: u8| {
            let wanted = format!("leader_election_master_status{{name=\"jobs\"}} {value}");
            let deadline = Instant::now() + Duration::from_secs(5);
            while !encoded(&registry).contains(&wanted) {
                assert!(Instant::now() < deadline, "no {wanted} in {}", encoded(&registry));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        shows(0).await;
        tx.send_replace(LeaderState {
            leader: true,
            deadline: Some(Instant::now() + Duration::from_secs(60)),
            ..LeaderState::default()
        });
        shows(1).await;
        assert!(include_str!("../../../README.md").contains("leader_election_master_status"));
        drop(tx);
        following.await.unwrap();
    }

    /// A holder is elsewhere only when both identities name their cluster
    /// and the names differ.
    #[test]
    fn a_holder_is_elsewhere_only_when_both_name_different_clusters() {
        let me = "west/prod/web-0#0a0b0c0d@uid-w";
        let cases = [
            (me, Some("east/prod/web-0#01020304@uid-e"), true),
            (me, Some("west/prod/web-1#01020304@uid-x"), false),
            (me, Some("prod/web-1#01020304"), false),
            ("prod/web-0#0a0b0c0d", Some("east/prod/web-0#01020304"), false),
            (me, Some("not an identity"), false),
            (me, None, false),
        ];
        for (identity, holder, elsewhere) in cases {
            assert_eq!(
                holder_elsewhere(identity, holder),
                elsewhere,
                "{identity} following {holder:?}"
            );
        }
    }

    /// `leasehold_leader_elsewhere` follows the elector's state: 1 while
    /// following another cluster's holder, 0 while leading or following a
    /// holder of its own cluster. Each step changes the value, so waiting
    /// for it shows the step was taken.
    #[tokio::test]
    async fn the_leader_elsewhere_gauge_follows_the_holders_cluster() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let (tx, rx) = tokio::sync::watch::channel(LeaderState::default());
        let following = tokio::spawn(metrics.clone().follow("jobs".into(), rx));
        let me = "west/prod/web-0#0a0b0c0d@uid-w";
        let east = "east/prod/web-0#01020304@uid-e";
        let steps = [
            (Some(east), false, 1),
            (Some(me), true, 0),
            (Some(east), false, 1),
            (Some("west/prod/web-1#01020304@uid-x"), false, 0),
        ];
        for (holder, leader, wanted) in steps {
            tx.send_replace(LeaderState {
                identity: me.into(),
                holder: holder.map(String::from),
                leader,
                deadline: leader.then(|| Instant::now() + Duration::from_secs(60)),
                ..LeaderState::default()
            });
            let deadline = Instant::now() + Duration::from_secs(5);
            while metrics.leader_elsewhere.get() != wanted {
                assert!(
                    Instant::now() < deadline,
                    "following {holder:?} (leading: {leader}): leader_elsewhere is {}, not {wanted}",
                    metrics.leader_elsewhere.get()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        drop(tx);
        following.await.unwrap();
    }

    #[tokio::test]
    async fn leadership_changes_are_counted_by_reason() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let (tx, rx) = tokio::sync::watch::channel(LeaderState::default());
        let following = tokio::spawn(metrics.clone().follow("jobs".into(), rx));
        let count = |reason: &'static str| metrics.leadership_changes.get_or_create(&ChangeLabels { reason }).get();
        let until = async |reason: &'static str, wanted: u64| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while count(reason) != wanted {
                assert!(Instant::now() < deadline, "{reason}: {} not {wanted}", count(reason));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let leading = |change| LeaderState {
            leader: true,
            deadline: Some(Instant::now() + Duration::from_secs(60)),
            change,
            ..LeaderState::default()
        };
        tx.send_replace(leading(Change::Acquired));
        until("acquired", 1).await;
        tx.send_replace(LeaderState {
            change: Change::Lost("another holder".into()),
            ..LeaderState::default()
        });
        until("lost", 1).await;
        tx.send_replace(leading(Change::Acquired));
        until("acquired", 2).await;
        tx.send_replace(LeaderState {
            change: Change::Released,
            ..LeaderState::default()
        });
        until("released", 1).await;
        assert_eq!((count("expired"), count("release_failed")), (0, 0));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("leasehold_leadership_changes_total{reason=\"acquired\"} 2"),
            "{text}"
        );
        // The help names every label value. `restarted` is none: the
        // process whose term a restarted sidecar took over is gone, and the
        // new one counts `acquired`.
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP leasehold_leadership_changes"))
            .unwrap();
        for ending in EndReason::ALL.into_iter().filter(|e| *e != EndReason::Restarted) {
            assert!(help.contains(ending.as_str()), "{ending:?}: {help}");
        }
        assert!(include_str!("../../../README.md").contains("leasehold_leadership_changes_total"));
        drop(tx);
        following.await.unwrap();
    }

    #[test]
    fn a_change_of_leadership_is_named_by_the_electors_last_change() {
        let reason = |leads, change: Change| {
            let state = LeaderState {
                change,
                ..LeaderState::default()
            };
            ChangeLabels::of(leads, &state).reason
        };
        assert_eq!(reason(true, Change::Acquired), "acquired");
        assert_eq!(reason(false, Change::SteppingDown), "released");
        assert_eq!(reason(false, Change::Released), "released");
        for ending in EndReason::ALL {
            for change in [Change::SteppingDown, Change::Released] {
                let state = LeaderState {
                    change,
                    ending: Some(ending),
                    ..LeaderState::default()
                };
                let label = ChangeLabels::of(false, &state).reason;
                assert_eq!(label, ending.as_str(), "the label is the end the release records");
            }
        }
        assert_eq!(reason(false, Change::ReleaseFailed("e".into())), "release_failed");
        assert_eq!(reason(false, Change::Lost("e".into())), "lost");
        assert_eq!(reason(false, Change::DeadlineMissed), "expired");
        assert_eq!(
            reason(false, Change::Renewed),
            "expired",
            "the deadline passed unrenewed"
        );
    }

    #[tokio::test]
    async fn the_metered_store_counts_calls_failures_and_latency() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let memory = MemoryStore::new(1);
        let store = MeteredStore::<dyn LeaseStore>::new(Arc::new(memory.clone()), metrics.clone());
        let grant = store.acquire("m", "a", Duration::from_secs(10)).await.unwrap();
        store.observe("m").await.unwrap();
        store
            .renew("m", "a", grant.token, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(store.acquire("m", "b", Duration::from_secs(10)).await.is_err());
        memory.set_faults(Faults {
            down: true,
            ..Default::default()
        });
        assert!(store.observe("m").await.is_err());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "leasehold_store_calls_total{op=\"acquire\"} 2",
            "leasehold_store_calls_total{op=\"observe\"} 2",
            "leasehold_store_calls_total{op=\"renew\"} 1",
            "leasehold_store_failures_total{op=\"acquire\",kind=\"lost\"} 1",
            "leasehold_store_failures_total{op=\"observe\",kind=\"unavailable\"} 1",
            "leasehold_store_latency_seconds_count{op=\"renew\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    /// Partitioned: session calls are counted by operation, and the gauges
    /// follow what the partitioner publishes.
    #[tokio::test]
    async fn the_partitioned_sidecar_meters_session_calls_and_shows_held_partitions() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let store = MeteredStore::<dyn SessionStore>::new(Arc::new(MemoryStore::new(1)), metrics.clone());
        store.open_session("s", "o", Duration::from_secs(10)).await.unwrap();
        store.try_lock("s", &["p/0".into()]).await.unwrap();
        store.renew_session("s").await.unwrap();
        assert!(store.renew_session("gone").await.is_err());
        let (tx, rx) = tokio::sync::watch::channel(Assigned::default());
        let following = tokio::spawn(metrics.clone().follow_partitions(rx));
        tx.send_replace(Assigned {
            partitions: [(0, FencingToken(1)), (5, FencingToken(2))].into(),
            members: 3,
            ..Default::default()
        });
        drop(tx);
        following.await.unwrap();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "leasehold_store_calls_total{op=\"open_session\"} 1",
            "leasehold_store_calls_total{op=\"try_lock\"} 1",
            "leasehold_store_calls_total{op=\"renew_session\"} 2",
            "leasehold_store_failures_total{op=\"renew_session\",kind=\"lost\"} 1",
            "leasehold_partitions_held 2",
            "leasehold_partition_members 3",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
