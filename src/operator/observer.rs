//! One batched store read per store and table for every lease on it,
//! shared by all reconciles, instead of a read per lease per retry period.
//!
//! An [`Observer`] per store and table ([`StoreConfig::key`](crate::store::select::StoreConfig::key))
//! keeps the locks reconciles asked about and reads them all with
//! [`LeaseStore::observe_many`] (at most [`BATCH`] a call):
//! * **per P**: every `P` of the smallest retry period among the leases on
//!   the table, so no lease's status is older than its own P (floored at the
//!   reconciler's fastest requeue);
//! * **at once** when a reconcile needs a read its cache cannot give (a lock
//!   not read yet, or a read after a given moment): every reconcile waiting
//!   then shares the next read;
//! * **at once** when the store announces a release ([`LeaseStore::changed_any`]:
//!   PostgreSQL `NOTIFY`, Redis `PUBLISH`, a holder change on the Kubernetes
//!   store's watch of the namespace's Leases); Spanner announces nothing and
//!   is read per P. The Kubernetes store answers the read from that watch,
//!   so it costs no API request.
//!
//! After each read, the leases whose shown state changed (live holder, term,
//! token, version, or whether the read failed) are sent to the controller
//! ([`Observers::triggers`]), so leases at rest are not reconciled per P.
//! A lock no reconcile asked about for [`FORGET_AFTER`] (its resource deleted
//! or pointed elsewhere) is no longer read. Partitioned leases read their
//! sessions themselves (one call per lease, [`PartitionView`](crate::lease::partitions::PartitionView)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::api::DistributedLease;
use crate::lease::{FencingToken, LeaseStore, Observation, StoreError, Version};

/// Locks per batched read: one statement's array (PostgreSQL, Spanner) or
/// one script's keys (Redis) stays small.
pub const BATCH: usize = 1000;
/// A lease the observer watches is reconciled when its lock changes; this
/// requeue is only the net for a lost trigger, so 10,000 leases at rest cost
/// 33 reconciles a second (each from caches: no store read, no API request).
pub const OBSERVED_REQUEUE: Duration = Duration::from_secs(300);
/// A lease no reconcile asked about for this long is no longer observed:
/// every live lease is reconciled at least every [`OBSERVED_REQUEUE`].
pub const FORGET_AFTER: Duration = OBSERVED_REQUEUE.saturating_mul(3);

/// One lock's answer, and when the read that gave it started.
#[derive(Debug, Clone)]
pub struct Stamped {
    pub observation: Result<Observation, StoreError>,
    pub read_at: Instant,
}

type LeaseRef = ObjectRef<DistributedLease>;

/// Every store's observer, and the controllers told of changes.
#[derive(Default)]
pub struct Observers {
    by_store: Mutex<HashMap<String, Arc<Observer>>>,
    triggers: Arc<Triggers>,
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
pub struct Ask<'a> {
    /// The store and table ([`StoreConfig::key`](crate::store::select::StoreConfig::key)).
    pub store_key: String,
    pub store: Arc<dyn LeaseStore>,
    pub lock: &'a str,
    /// The resource asking: reconciled when the lock's shown state changes.
    pub lease: LeaseRef,
    /// Its retry period: the lock is read at least this often.
    pub period: Duration,
    /// A read started at or after this, or (`None`) the last read if there is one.
    pub read_after: Option<Instant>,
}

impl Observers {
    /// The lock's observation, as [`Ask::read_after`] says: from the last
    /// read, or from the next one, which every waiting reconcile shares.
    pub async fn observe(&self, ask: Ask<'_>) -> Stamped {
        let observer = self.observer(&ask.store_key, ask.store);
        let answer = {
            let mut state = observer.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let watched = state.locks.entry(ask.lock.to_string()).or_default();
            watched.leases.insert(ask.lease, (ask.period, Instant::now()));
            let cached = watched
                .last
                .as_ref()
                .filter(|last| ask.read_after.is_none_or(|after| last.read_at >= after));
            if let Some(cached) = cached {
                return cached.clone();
            }
            let (answer, answered) = oneshot::channel();
            state.waiting.push((ask.lock.to_string(), Instant::now(), answer));
            answered
        };
        observer.shared.wake.notify_one();
        answer.await.unwrap_or_else(|_| Stamped {
            observation: Err(StoreError::unavailable("the store's observer stopped")),
            read_at: Instant::now(),
        })
    }

    /// The resources whose lock changed, for the controller to reconcile
    /// (`Controller::reconcile_on`); one stream per controller run.
    pub fn triggers(&self) -> BoxStream<'static, LeaseRef> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.triggers.0.lock().unwrap_or_else(|e| e.into_inner()).push(sender);
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|lease| (lease, receiver))
        })
        .boxed()
    }

    fn observer(&self, key: &str, store: Arc<dyn LeaseStore>) -> Arc<Observer> {
        let mut by_store = self.by_store.lock().unwrap_or_else(|e| e.into_inner());
        by_store
            .entry(key.to_string())
            .or_insert_with(|| Arc::new(Observer::start(store, self.triggers.clone())))
            .clone()
    }
}

/// The reads of one store and table: its task, and the task that wakes it
/// at the store's announcements.
struct Observer {
    shared: Arc<Shared>,
    _reads: AbortOnDropHandle<()>,
    _announcements: AbortOnDropHandle<()>,
}

struct Shared {
    store: Arc<dyn LeaseStore>,
    state: Mutex<State>,
    /// A reconcile is waiting, or the store announced a change.
    wake: Notify,
    triggers: Arc<Triggers>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Watched>,
    /// Reconciles waiting for a read: the lock, when they asked.
    waiting: Vec<(String, Instant, oneshot::Sender<Stamped>)>,
}

#[derive(Default)]
struct Watched {
    /// The resources naming the lock: their retry period, and when they last asked.
    leases: HashMap<LeaseRef, (Duration, Instant)>,
    last: Option<Stamped>,
}

/// What a status shows of a read: a change of it reconciles the lock's resources.
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

impl Observer {
    fn start(store: Arc<dyn LeaseStore>, triggers: Arc<Triggers>) -> Observer {
        let shared = Arc::new(Shared {
            store,
            state: Mutex::default(),
            wake: Notify::new(),
            triggers,
        });
        let announced = shared.clone();
        Observer {
            _reads: AbortOnDropHandle::new(tokio::spawn(reads(shared.clone()))),
            _announcements: AbortOnDropHandle::new(tokio::spawn(async move {
                loop {
                    announced.store.changed_any().await;
                    announced.wake.notify_one();
                }
            })),
            shared,
        }
    }
}

/// The observer's loop: wait for the period, a waiting reconcile or an
/// announcement; read every lock; answer, remember, trigger.
async fn reads(shared: Arc<Shared>) {
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
        let locks = shared.locks_to_read(read_at);
        let mut answers = Vec::with_capacity(locks.len());
        for batch in locks.chunks(BATCH) {
            match shared.store.observe_many(batch).await {
                Ok(observed) => answers.extend(observed.into_iter().map(Ok)),
                Err(e) => answers.extend(batch.iter().map(|_| Err(e.clone()))),
            }
        }
        last_read = Some(read_at);
        let changed = shared.remember(&locks, answers, read_at);
        shared.triggers.send(&changed);
    }
}

impl Shared {
    /// The smallest retry period among the leases observed; `None` with none.
    fn period(&self) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .locks
            .values()
            .flat_map(|watched| watched.leases.values().map(|(period, _)| *period))
            .min()
    }

    /// Forgets the leases not asked about for [`FORGET_AFTER`], and lists the locks left.
    fn locks_to_read(&self, now: Instant) -> Vec<String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State { locks, waiting } = &mut *state;
        for watched in locks.values_mut() {
            watched
                .leases
                .retain(|_, (_, asked)| now.saturating_duration_since(*asked) < FORGET_AFTER);
        }
        locks.retain(|lock, watched| !watched.leases.is_empty() || waiting.iter().any(|(w, _, _)| w == lock));
        locks.keys().cloned().collect()
    }

    /// Keeps each lock's answer, answers the reconciles that waited for
    /// this read (they asked before it started), and returns the resources
    /// whose lock changed what a status shows.
    fn remember(
        &self,
        locks: &[String],
        answers: Vec<Result<Observation, StoreError>>,
        read_at: Instant,
    ) -> Vec<LeaseRef> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = Vec::new();
        for (lock, observation) in locks.iter().zip(answers) {
            let Some(watched) = state.locks.get_mut(lock) else {
                continue;
            };
            let stamped = Stamped { observation, read_at };
            if let Some(last) = &watched.last
                && Shown::of(&last.observation) != Shown::of(&stamped.observation)
            {
                changed.extend(watched.leases.keys().cloned());
            }
            watched.last = Some(stamped);
        }
        // Answered: those that asked before this read started, about a lock it read.
        let (answerable, still): (Vec<_>, Vec<_>) =
            std::mem::take(&mut state.waiting)
                .into_iter()
                .partition(|(lock, asked, _)| {
                    let read_now = state.locks.get(lock).and_then(|w| w.last.as_ref()).map(|l| l.read_at);
                    *asked <= read_at && read_now == Some(read_at)
                });
        state.waiting = still;
        for (lock, _, answer) in answerable {
            if let Some(last) = state.locks.get(&lock).and_then(|w| w.last.clone()) {
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
    use crate::lease::store::Result;
    use crate::lease::{Claim, Grant, Release};
    use crate::store::MemoryStore;

    /// A memory store that counts its reads: one by one, and batched.
    struct Counted {
        store: MemoryStore,
        single: AtomicUsize,
        batched: AtomicUsize,
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

    fn ask<'a>(
        store: &Arc<Counted>,
        i: usize,
        lock: &'a str,
        period: Duration,
        read_after: Option<Instant>,
    ) -> Ask<'a> {
        Ask {
            store_key: "one table".into(),
            store: store.clone(),
            lock,
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
        })
    }

    /// 2,500 leases asking at once share one read (in batches of [`BATCH`]);
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
        let batches = LEASES.div_ceil(BATCH);
        let started = store.batched.load(Ordering::SeqCst);
        assert!(
            started <= 2 * batches,
            "{started} reads for {LEASES} leases asking at once"
        );
        let reads: HashSet<Instant> = first.iter().map(|s| s.read_at).collect();
        assert!(reads.len() <= 2, "{} reads answered", reads.len());
        assert_eq!(first[7].observation.as_ref().unwrap().live_holder(), Some("pod-a"));

        // At rest: one read per P, and reconciles answer from it.
        tokio::time::sleep(P * 10 + P / 2).await;
        assert_eq!(store.batched.load(Ordering::SeqCst), started + batches * 10);
        for (i, lock) in locks.iter().enumerate() {
            observers
                .observe(ask(&store, i, lock, P, None))
                .await
                .observation
                .unwrap();
        }
        assert_eq!(store.batched.load(Ordering::SeqCst), started + batches * 10);
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
}
