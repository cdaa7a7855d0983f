//! One batched store read per store and table for every lease on it,
//! shared by all reconciles, instead of a read per lease per retry period.
//!
//! An [`Observer`] per store and table ([`StoreConfig::key`](leasehold_runtime::StoreConfig::key))
//! keeps what reconciles asked about and reads it all in batched reads: the
//! locks of plain leases with one [`LeaseStore::observe_many`] for all of
//! them (one statement or script, whatever their number), the slots and
//! partitions of partitioned leases with
//! [`SessionStore::observe_lock_sets`] (at most
//! [`MAX_LOCKS_PER_CALL`] names a call: 312 leases of 8 partitions):
//! * **per P**: every `P` of the smallest retry period among the leases on
//!   the table, so no lease's status is older than its own P (floored at the
//!   reconciler's fastest requeue);
//! * **at once** when a reconcile needs a read its cache cannot give (a lock
//!   not read yet, or a read after a given moment): every reconcile waiting
//!   then shares the next read;
//! * **at once** when the store announces a release ([`LeaseStore::changed_any`]:
//!   PostgreSQL `NOTIFY`, Redis `PUBLISH`, a holder change on the Kubernetes
//!   store's watch of the namespace's Leases); Spanner announces nothing and
//!   is read per P, and so are sessions on every store. The Kubernetes store
//!   answers the read from that watch, so it costs no API request.
//!
//! After each read, the leases whose shown state changed (live holder, term,
//! token, version, the assignment of partitions, or whether the read failed)
//! are sent to the controller ([`Observers::triggers`]), so leases at rest
//! are not reconciled per P. A lock no reconcile asked about for
//! [`FORGET_AFTER`] (its resource deleted or pointed elsewhere) is no longer
//! read, and an observer with no lock left ends with its store.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use leasehold_core::lease::partitions::PartitionView;
use leasehold_core::lease::session::MAX_LOCKS_PER_CALL;
use leasehold_core::lease::{FencingToken, LeaseStore, Observation, SessionStore, StoreError, Version};
use leasehold_kubernetes::api::DistributedLease;

/// A lease the observer watches is reconciled when its lock changes; this
/// requeue is only the net for a lost trigger, so 10,000 leases at rest cost
/// 33 reconciles a second (each from caches: no store read, no API request).
pub(crate) const OBSERVED_REQUEUE: Duration = Duration::from_secs(300);
/// A lease no reconcile asked about for this long is no longer observed:
/// every live lease is reconciled at least every [`OBSERVED_REQUEUE`].
pub(crate) const FORGET_AFTER: Duration = OBSERVED_REQUEUE.saturating_mul(3);

/// Whether something last asked about at `asked` is still in use at `now`
/// (asked within [`FORGET_AFTER`]): a lease by the observer, a store by
/// the operator's open connections.
pub(crate) fn still_asked(asked: Instant, now: Instant) -> bool {
    now.saturating_duration_since(asked) < FORGET_AFTER
}

/// One answer, and when the read that gave it started.
#[derive(Debug, Clone)]
pub(crate) struct Stamped<A> {
    pub observation: Result<A, StoreError>,
    pub read_at: Instant,
}

type LeaseRef = ObjectRef<DistributedLease>;

/// What one observer reads, in batches.
#[async_trait]
pub(crate) trait Source: Send + Sync + 'static {
    /// What a lease asks about.
    type Key: Clone + Eq + Hash + Send + Sync + 'static;
    /// What a read answers about one key.
    type Answer: Clone + Send + Sync + 'static;

    /// One answer per key, in order, in as few store calls as the batches allow.
    async fn read(&self, keys: &[Self::Key]) -> Vec<Result<Self::Answer, StoreError>>;

    /// Resolves once the store announced a change ([`LeaseStore::changed_any`]).
    async fn changed_any(&self);

    /// Whether a status would show something else after `after` than after `before`.
    fn shown_differs(before: &Result<Self::Answer, StoreError>, after: &Result<Self::Answer, StoreError>) -> bool;
}

/// The lock rows of plain leases.
pub(crate) struct Locks(pub Arc<dyn LeaseStore>);

#[async_trait]
impl Source for Locks {
    type Key = String;
    type Answer = Observation;

    /// One call for every lock: reads per P stay one per table whatever the
    /// number of leases (10,000 locks are one array of names on PostgreSQL
    /// and Spanner, one script of 20,000 `HMGET`s on Redis; BENCHMARKS.md,
    /// "The operator at many leases").
    async fn read(&self, locks: &[String]) -> Vec<Result<Observation, StoreError>> {
        match self.0.observe_many(locks).await {
            Ok(observed) => observed.into_iter().map(Ok).collect(),
            Err(e) => locks.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn changed_any(&self) {
        self.0.changed_any().await
    }

    fn shown_differs(before: &Result<Observation, StoreError>, after: &Result<Observation, StoreError>) -> bool {
        Shown::of(before) != Shown::of(after)
    }
}

/// The assignments of partitioned leases, each `(lock, partitions)`. No
/// store announces a change of sessions: they are read per P.
pub(crate) struct Partitioned(pub Arc<dyn SessionStore>);

#[async_trait]
impl Source for Partitioned {
    type Key = (String, u32);
    type Answer = PartitionView;

    async fn read(&self, locks: &[(String, u32)]) -> Vec<Result<PartitionView, StoreError>> {
        let mut answers = Vec::with_capacity(locks.len());
        let mut rest = locks;
        while !rest.is_empty() {
            // As many leases as fit one call; a lease alone always fits
            // (its names are at most 2 × MAX_PARTITIONS).
            let mut names = 0;
            let fit = rest
                .iter()
                .take_while(|(_, n)| {
                    names += PartitionView::names_read(*n);
                    names <= MAX_LOCKS_PER_CALL
                })
                .count()
                .max(1);
            let (batch, later) = rest.split_at(fit);
            match PartitionView::observe_many(&*self.0, batch).await {
                Ok(views) => answers.extend(views.into_iter().map(Ok)),
                Err(e) => answers.extend(batch.iter().map(|_| Err(e.clone()))),
            }
            rest = later;
        }
        answers
    }

    async fn changed_any(&self) {
        futures::future::pending::<()>().await
    }

    fn shown_differs(before: &Result<PartitionView, StoreError>, after: &Result<PartitionView, StoreError>) -> bool {
        match (before, after) {
            (Ok(before), Ok(after)) => before != after,
            (before, after) => before.is_ok() != after.is_ok(),
        }
    }
}

/// Every store's observers, and the controllers told of changes.
#[derive(Default)]
pub(crate) struct Observers {
    locks: Registry<Locks>,
    partitions: Registry<Partitioned>,
    triggers: Arc<Triggers>,
}

/// The observers of one [`Source`], by store and table.
struct Registry<S: Source>(Mutex<HashMap<String, Arc<Observer<S>>>>);

impl<S: Source> Default for Registry<S> {
    fn default() -> Self {
        Registry(Mutex::default())
    }
}

/// The senders of every [`Observers::triggers`] stream still read.
#[derive(Default)]
struct Triggers(Mutex<Vec<mpsc::UnboundedSender<LeaseRef>>>);

impl Triggers {
    fn send(&self, leases: &[LeaseRef]) {
        if leases.is_empty() {
            return;
        }
        let mut senders = self.0.lock().unwrap_or_else(|e| e.into_inner());
        senders.retain(|sender| leases.iter().all(|lease| sender.send(lease.clone()).is_ok()));
    }
}

/// What a reconcile asks of the observer.
pub(crate) struct Ask<S: Source> {
    /// The store and table ([`StoreConfig::key`](leasehold_runtime::StoreConfig::key)).
    pub store_key: String,
    /// What reads the table, used when its observer starts.
    pub source: S,
    pub key: S::Key,
    /// The resource asking: reconciled when what its status shows changes.
    pub lease: LeaseRef,
    /// Its retry period: the key is read at least this often.
    pub period: Duration,
    /// A read started at or after this, or (`None`) the last read if there is one.
    pub read_after: Option<Instant>,
}

impl Observers {
    /// A plain lease's lock, as [`Ask::read_after`] says: from the last
    /// read, or from the next one, which every waiting reconcile shares.
    pub(crate) async fn observe(&self, ask: Ask<Locks>) -> Stamped<Observation> {
        self.locks.observe(ask, &self.triggers).await
    }

    /// A partitioned lease's assignment, as [`Observers::observe`] reads a lock.
    pub(crate) async fn observe_partitions(&self, ask: Ask<Partitioned>) -> Stamped<PartitionView> {
        self.partitions.observe(ask, &self.triggers).await
    }

    /// The resources whose lock changed, for the controller to reconcile
    /// (`Controller::reconcile_on`); one stream per controller run.
    pub(crate) fn triggers(&self) -> BoxStream<'static, LeaseRef> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.triggers.0.lock().unwrap_or_else(|e| e.into_inner()).push(sender);
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|lease| (lease, receiver))
        })
        .boxed()
    }
}

impl<S: Source> Registry<S> {
    async fn observe(&self, ask: Ask<S>, triggers: &Arc<Triggers>) -> Stamped<S::Answer> {
        let observer = {
            let mut by_store = self.0.lock().unwrap_or_else(|e| e.into_inner());
            // An observer left with nothing to read ends, and its store
            // with it (a deleted namespace's Lease watch, a dropped
            // database's pool): a store asked about again is observed
            // afresh, through the connection its reconcile opened.
            by_store.retain(|_, observer| !observer.shared.idle());
            by_store
                .entry(ask.store_key)
                .or_insert_with(|| Arc::new(Observer::start(ask.source, triggers.clone())))
                .clone()
        };
        let answer = {
            let mut state = observer.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let watched = state.keys.entry(ask.key.clone()).or_default();
            watched.leases.insert(ask.lease, (ask.period, Instant::now()));
            let cached = watched
                .last
                .as_ref()
                .filter(|last| ask.read_after.is_none_or(|after| last.read_at >= after));
            if let Some(cached) = cached {
                return cached.clone();
            }
            let (answer, answered) = oneshot::channel();
            state.waiting.push((ask.key, Instant::now(), answer));
            answered
        };
        observer.shared.wake.notify_one();
        answer.await.unwrap_or_else(|_| Stamped {
            observation: Err(StoreError::unavailable("the store's observer stopped")),
            read_at: Instant::now(),
        })
    }
}

/// The reads of one store and table: its task, and the task that wakes it
/// at the store's announcements.
struct Observer<S: Source> {
    shared: Arc<Shared<S>>,
    _reads: AbortOnDropHandle<()>,
    _announcements: AbortOnDropHandle<()>,
}

struct Shared<S: Source> {
    source: S,
    state: Mutex<State<S>>,
    /// A reconcile is waiting, or the store announced a change.
    wake: Notify,
    triggers: Arc<Triggers>,
}

type Waiting<S> = (
    <S as Source>::Key,
    Instant,
    oneshot::Sender<Stamped<<S as Source>::Answer>>,
);

struct State<S: Source> {
    keys: HashMap<S::Key, Watched<S::Answer>>,
    /// Reconciles waiting for a read: the key, when they asked.
    waiting: Vec<Waiting<S>>,
}

impl<S: Source> Default for State<S> {
    fn default() -> Self {
        State {
            keys: HashMap::new(),
            waiting: Vec::new(),
        }
    }
}

struct Watched<A> {
    /// The resources asking: their retry period, and when they last asked.
    leases: HashMap<LeaseRef, (Duration, Instant)>,
    last: Option<Stamped<A>>,
}

impl<A> Default for Watched<A> {
    fn default() -> Self {
        Watched {
            leases: HashMap::new(),
            last: None,
        }
    }
}

/// What a status shows of a lock's read: a change of it reconciles the lock's resources.
#[derive(PartialEq, Eq)]
enum Shown {
    Failed,
    Read {
        live_holder: Option<String>,
        term: Option<u64>,
        token: Option<FencingToken>,
        version: Option<Version>,
    },
}

impl Shown {
    fn of(observation: &Result<Observation, StoreError>) -> Shown {
        match observation {
            Err(_) => Shown::Failed,
            Ok(observed) => Shown::Read {
                live_holder: observed.live_holder().map(str::to_string),
                term: observed.record.as_ref().map(|r| r.term),
                token: observed.record.as_ref().and_then(|r| r.token),
                version: observed.record.as_ref().and_then(|r| r.version.clone()),
            },
        }
    }
}

impl<S: Source> Observer<S> {
    fn start(source: S, triggers: Arc<Triggers>) -> Observer<S> {
        let shared = Arc::new(Shared {
            source,
            state: Mutex::default(),
            wake: Notify::new(),
            triggers,
        });
        let announced = shared.clone();
        Observer {
            _reads: AbortOnDropHandle::new(tokio::spawn(reads(shared.clone()))),
            _announcements: AbortOnDropHandle::new(tokio::spawn(async move {
                loop {
                    announced.source.changed_any().await;
                    announced.wake.notify_one();
                }
            })),
            shared,
        }
    }
}

/// The observer's loop: wait for the period, a waiting reconcile or an
/// announcement; read every key; answer, remember, trigger.
async fn reads<S: Source>(shared: Arc<Shared<S>>) {
    let mut last_read: Option<Instant> = None;
    loop {
        let due = shared
            .period()
            .map(|period| last_read.map_or_else(Instant::now, |at| at + period));
        match due {
            Some(due) => {
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(due) => {}
                }
            }
            None => shared.wake.notified().await,
        }
        let read_at = Instant::now();
        let keys = shared.keys_to_read(read_at);
        let answers = shared.source.read(&keys).await;
        last_read = Some(read_at);
        let changed = shared.remember(&keys, answers, read_at);
        shared.triggers.send(&changed);
    }
}

impl<S: Source> Shared<S> {
    /// No lease is observed (each was forgotten after [`FORGET_AFTER`]) and
    /// no reconcile waits.
    fn idle(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.keys.is_empty() && state.waiting.is_empty()
    }

    /// The smallest retry period among the leases observed; `None` with none.
    fn period(&self) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .keys
            .values()
            .flat_map(|watched| watched.leases.values().map(|(period, _)| *period))
            .min()
    }

    /// Forgets the leases not asked about for [`FORGET_AFTER`], and lists the keys left.
    fn keys_to_read(&self, now: Instant) -> Vec<S::Key> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { keys, waiting } = &mut *state;
        for watched in keys.values_mut() {
            watched.leases.retain(|_, (_, asked)| still_asked(*asked, now));
        }
        keys.retain(|key, watched| !watched.leases.is_empty() || waiting.iter().any(|(w, _, _)| w == key));
        keys.keys().cloned().collect()
    }

    /// Keeps each key's answer, answers the reconciles that waited for
    /// this read (they asked before it started), and returns the resources
    /// whose key changed what a status shows.
    fn remember(
        &self,
        keys: &[S::Key],
        answers: Vec<Result<S::Answer, StoreError>>,
        read_at: Instant,
    ) -> Vec<LeaseRef> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = Vec::new();
        for (key, observation) in keys.iter().zip(answers) {
            let Some(watched) = state.keys.get_mut(key) else {
                continue;
            };
            let stamped = Stamped { observation, read_at };
            if let Some(last) = &watched.last
                && S::shown_differs(&last.observation, &stamped.observation)
            {
                changed.extend(watched.leases.keys().cloned());
            }
            watched.last = Some(stamped);
        }
        // Answered: those that asked before this read started, about a key it read.
        let (answerable, still): (Vec<_>, Vec<_>) =
            std::mem::take(&mut state.waiting)
                .into_iter()
                .partition(|(key, asked, _)| {
                    let read_now = state.keys.get(key).and_then(|w| w.last.as_ref()).map(|l| l.read_at);
                    *asked <= read_at && read_now == Some(read_at)
                });
        state.waiting = still;
        for (key, _, answer) in answerable {
            if let Some(last) = state.keys.get(&key).and_then(|w| w.last.clone()) {
                // The reconcile may have given up; nothing to do then.
                let _ = answer.send(last);
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use futures::StreamExt;

    use super::*;
    use leasehold_core::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation, new_session_id};
    use leasehold_core::lease::store::Result;
    use leasehold_core::lease::{Claim, Grant, Identity, Release, StoreTime};
    use leasehold_core::store::memory::MemoryStore;

    /// A memory store that counts its reads: one by one, and batched; and
    /// its session reads (`observe_locks`: every read of a partitioned lock).
    struct Counted {
        store: MemoryStore,
        single: AtomicUsize,
        batched: AtomicUsize,
        lock_reads: AtomicUsize,
    }

    #[async_trait]
    impl SessionStore for Counted {
        async fn ensure_session_schema(&self) -> Result<()> {
            Ok(())
        }
        async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime> {
            self.store.open_session(session, owner, lease).await
        }
        async fn renew_session(&self, session: &str) -> Result<StoreTime> {
            self.store.renew_session(session).await
        }
        async fn close_session(&self, session: &str) -> Result<()> {
            self.store.close_session(session).await
        }
        async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
            self.store.observe_session(session).await
        }
        async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
            self.store.try_lock(session, names).await
        }
        async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
            self.store.unlock(session, locks).await
        }
        async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
            self.lock_reads.fetch_add(1, Ordering::SeqCst);
            self.store.observe_locks(names).await
        }
        async fn collect_garbage(&self) -> Result<Collected> {
            self.store.collect_garbage().await
        }
    }

    #[async_trait]
    impl LeaseStore for Counted {
        fn kind(&self) -> &'static str {
            "counted"
        }
        async fn ensure_schema(&self) -> Result<()> {
            Ok(())
        }
        async fn observe(&self, lock: &str) -> Result<Observation> {
            self.single.fetch_add(1, Ordering::SeqCst);
            self.store.observe(lock).await
        }
        async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
            self.batched.fetch_add(1, Ordering::SeqCst);
            self.store.observe_many(locks).await
        }
        async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
            self.store.acquire_as(lock, claim, lease).await
        }
        async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
            self.store.renew(lock, holder, token, lease).await
        }
        async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
            self.store.release_for(lock, holder, token, release).await
        }
    }

    const P: Duration = Duration::from_secs(2);
    const LEASES: usize = 2500;

    fn lock(i: usize) -> String {
        format!("lock-{i}")
    }

    fn lease(i: usize) -> LeaseRef {
        ObjectRef::new(&format!("lease-{i}")).within("ns")
    }

    fn ask(store: &Arc<Counted>, i: usize, lock: &str, period: Duration, read_after: Option<Instant>) -> Ask<Locks> {
        Ask {
            store_key: "one table".into(),
            source: Locks(store.clone()),
            key: lock.to_string(),
            lease: lease(i),
            period,
            read_after,
        }
    }

    fn counted() -> Arc<Counted> {
        Arc::new(Counted {
            store: MemoryStore::new(1),
            single: AtomicUsize::new(0),
            batched: AtomicUsize::new(0),
            lock_reads: AtomicUsize::new(0),
        })
    }

    /// 2,500 leases asking at once share one read (one `observe_many`);
    /// at rest the table is read once per P whatever the number of leases,
    /// reconciles answer from the last read, and only the lease whose lock
    /// changed is triggered. Planted: reading lock by lock in `reads`
    /// (`observe` per lock) fails the counts.
    #[tokio::test(start_paused = true)]
    async fn many_leases_cost_one_batched_read_per_period() {
        let store = counted();
        let observers = Observers::default();
        let mut triggers = observers.triggers();
        store
            .acquire("lock-7", "pod-a", Duration::from_secs(600))
            .await
            .unwrap();
        let locks: Vec<String> = (0..LEASES).map(lock).collect();
        let first = futures::future::join_all(
            locks
                .iter()
                .enumerate()
                .map(|(i, lock)| observers.observe(ask(&store, i, lock, P, None))),
        )
        .await;
        // The first read may start before every ask is in; all that came
        // during it share the next one: at most two reads in all.
        let started = store.batched.load(Ordering::SeqCst);
        assert!(started <= 2, "{started} reads for {LEASES} leases asking at once");
        let reads: HashSet<Instant> = first.iter().map(|s| s.read_at).collect();
        assert!(reads.len() <= 2, "{} reads answered", reads.len());
        assert_eq!(first[7].observation.as_ref().unwrap().live_holder(), Some("pod-a"));

        // At rest: one read per P, and reconciles answer from it.
        tokio::time::sleep(P * 10 + P / 2).await;
        assert_eq!(store.batched.load(Ordering::SeqCst), started + 10);
        for (i, lock) in locks.iter().enumerate() {
            observers
                .observe(ask(&store, i, lock, P, None))
                .await
                .observation
                .unwrap();
        }
        assert_eq!(store.batched.load(Ordering::SeqCst), started + 10);
        assert_eq!(store.single.load(Ordering::SeqCst), 0, "no lock was read on its own");

        // A change reconciles its lease, and only it, at the next read.
        let grant = store
            .acquire("lock-9", "pod-b", Duration::from_secs(600))
            .await
            .unwrap();
        tokio::time::sleep(P).await;
        assert_eq!(triggers.next().await, Some(lease(9)));
        store.release("lock-9", "pod-b", grant.token).await.unwrap();
        tokio::time::sleep(P).await;
        assert_eq!(triggers.next().await, Some(lease(9)));
        tokio::time::sleep(P * 3).await;
        let quiet = tokio::time::timeout(P, triggers.next()).await;
        assert!(quiet.is_err(), "nothing changed, yet {quiet:?} was triggered");
    }

    /// A store no lease asks about any more is let go: once its only lease
    /// is forgotten ([`FORGET_AFTER`] without an ask), the next ask for any
    /// store ends its observer, and the observer's hold on the store (a
    /// namespace's Lease watch, a pool) with it. Planted: keeping idle
    /// observers fails the count.
    #[tokio::test(start_paused = true)]
    async fn an_observer_with_nothing_left_to_read_lets_its_store_go() {
        let (gone, kept) = (counted(), counted());
        let observers = Observers::default();
        observers
            .observe(ask(&gone, 0, "lock-0", P, None))
            .await
            .observation
            .unwrap();
        assert!(Arc::strong_count(&gone) > 1, "observed: the observer holds the store");
        tokio::time::sleep(FORGET_AFTER + P * 2).await;
        let mut elsewhere = ask(&kept, 1, "lock-1", P, None);
        elsewhere.store_key = "another table".into();
        observers.observe(elsewhere).await.observation.unwrap();
        // The ended observer's tasks are dropped at their next poll.
        tokio::time::sleep(P).await;
        assert_eq!(Arc::strong_count(&gone), 1, "the idle observer let its store go");
        assert!(Arc::strong_count(&kept) > 1, "the store in use is still observed");
    }

    /// With different P on one table the smallest is the period; a read
    /// asked for after a moment starts at or after it.
    #[tokio::test(start_paused = true)]
    async fn the_smallest_period_reads_and_a_fresh_read_follows_the_ask() {
        let store = counted();
        let observers = Observers::default();
        observers
            .observe(ask(&store, 0, "slow", P * 5, None))
            .await
            .observation
            .unwrap();
        observers
            .observe(ask(&store, 1, "fast", P, None))
            .await
            .observation
            .unwrap();
        let before = store.batched.load(Ordering::SeqCst);
        tokio::time::sleep(P * 5 + P / 2).await;
        assert_eq!(
            store.batched.load(Ordering::SeqCst),
            before + 5,
            "read per the smallest P"
        );

        let asked = Instant::now();
        let fresh = observers.observe(ask(&store, 0, "slow", P * 5, Some(asked))).await;
        assert!(fresh.read_at >= asked);
        assert_eq!(
            store.batched.load(Ordering::SeqCst),
            before + 6,
            "the fresh read was a new one"
        );
    }

    /// Partitioned leases follow the same rule: 1,250 leases of 4
    /// partitions (8 names each) asking at once share one read of
    /// 2 calls ([`MAX_LOCKS_PER_CALL`] names a call); at rest the table is
    /// read once per P in those 2 calls, reconciles answer from the last
    /// read, and only the lease whose assignment changed is triggered.
    /// Planted: reading lease by lease in [`Partitioned::read`]
    /// (`PartitionView::observe` per key) fails the counts.
    #[tokio::test(start_paused = true)]
    async fn many_partitioned_leases_cost_one_batched_read_per_period() {
        const PARTITIONED: usize = 1250;
        const PARTITIONS: u32 = 4;
        let store = counted();
        let observers = Observers::default();
        let mut triggers = observers.triggers();
        let ask = |i: usize, read_after| Ask {
            store_key: "one table\nsessions".into(),
            source: Partitioned(store.clone()),
            key: (lock(i), PARTITIONS),
            lease: lease(i),
            period: P,
            read_after,
        };
        let member = |pod: &str| new_session_id(&Identity::new(None, Some("ns".into()), pod), 1);
        let a = member("pod-a");
        store.open_session(&a, "pod-a", Duration::from_secs(600)).await.unwrap();
        store
            .try_lock(&a, &["lock-7/m/0".into(), "lock-7/p/2".into()])
            .await
            .unwrap();

        let first =
            futures::future::join_all((0..PARTITIONED).map(|i| observers.observe_partitions(ask(i, None)))).await;
        let calls = (PARTITIONED * PartitionView::names_read(PARTITIONS)).div_ceil(MAX_LOCKS_PER_CALL);
        assert_eq!(calls, 2);
        let started = store.lock_reads.load(Ordering::SeqCst);
        assert!(
            started <= 2 * calls,
            "{started} reads for {PARTITIONED} leases asking at once"
        );
        let reads: HashSet<Instant> = first.iter().map(|s| s.read_at).collect();
        assert!(reads.len() <= 2, "{} reads answered", reads.len());
        let seven = first[7].observation.as_ref().unwrap();
        assert_eq!(seven.members, vec![a.clone()]);
        assert_eq!(seven.owners[2].as_deref(), Some(a.as_str()));
        assert_eq!(first[8].observation.as_ref().unwrap().unowned(), 4);

        // At rest: one batched read per P, and reconciles answer from it.
        tokio::time::sleep(P * 10 + P / 2).await;
        assert_eq!(store.lock_reads.load(Ordering::SeqCst), started + calls * 10);
        for i in 0..PARTITIONED {
            observers.observe_partitions(ask(i, None)).await.observation.unwrap();
        }
        assert_eq!(store.lock_reads.load(Ordering::SeqCst), started + calls * 10);

        // A member joining reconciles its lease, and only it, at the next read.
        let b = member("pod-b");
        store.open_session(&b, "pod-b", Duration::from_secs(600)).await.unwrap();
        store.try_lock(&b, &["lock-9/m/1".into()]).await.unwrap();
        tokio::time::sleep(P).await;
        assert_eq!(triggers.next().await, Some(lease(9)));
        tokio::time::sleep(P * 3).await;
        let quiet = tokio::time::timeout(P, triggers.next()).await;
        assert!(quiet.is_err(), "nothing changed, yet {quiet:?} was triggered");
        // A read asked for after a moment is a new one, of every lease together.
        let before = store.lock_reads.load(Ordering::SeqCst);
        let asked = Instant::now();
        let fresh = observers.observe_partitions(ask(9, Some(asked))).await;
        assert!(fresh.read_at >= asked);
        assert_eq!(fresh.observation.unwrap().members, vec![b]);
        assert_eq!(store.lock_reads.load(Ordering::SeqCst), before + calls);
    }
}
