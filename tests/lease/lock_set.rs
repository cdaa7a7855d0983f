//! The many-locks library API ([`Session`]) on the memory store, on paused
//! time: batch locking without waiting, waiting with backoff, the held set
//! and its deadline, release, close, and one renewal per P.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation};
use leasehold::lease::{FencingToken, Identity, Session, SessionStore, StoreError, StoreTime, Timing};
use leasehold::store::{Faults, MemoryStore};

fn timing() -> Timing {
    Timing::new(
        Duration::from_secs(15),
        Duration::from_secs(10),
        Duration::from_secs(2),
        0.2,
    )
    .unwrap()
}

async fn session(store: &MemoryStore, name: &str) -> Session {
    let store: Arc<dyn SessionStore> = Arc::new(store.clone());
    Session::open(store, Identity::new(None, None, name), timing())
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn try_lock_many_takes_the_free_ones_and_reports_the_busy_without_waiting() {
    let store = MemoryStore::new(1);
    let (a, b) = (session(&store, "a").await, session(&store, "b").await);
    let got = a.try_lock_many(&["x", "y"]).await.unwrap();
    assert_eq!(got.busy, Vec::<String>::new());
    let got_b = b.try_lock_many(&["y", "z"]).await.unwrap();
    assert_eq!(got_b.busy, ["y"]);
    assert_eq!(got_b.taken.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["z"]);
    let held = a.held().borrow().clone();
    assert_eq!(held.locks.keys().collect::<Vec<_>>(), ["x", "y"]);
    assert_eq!(held.session, a.id());
    for lock in &got.taken {
        assert_eq!(held.locks[&lock.name], lock.token);
        assert_eq!(
            a.token(&lock.name),
            Some(lock.token),
            "every held lock exposes its token"
        );
    }
    assert_eq!(b.token("y"), None);
}

#[tokio::test(start_paused = true)]
async fn lock_waits_until_the_holder_releases_and_gets_a_higher_token() {
    let store = MemoryStore::new(2);
    let (a, b) = (session(&store, "a").await, Arc::new(session(&store, "b").await));
    let first = a.lock("x").await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("x").await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiter.is_finished(), "busy: it waits");
    assert_eq!(a.release(&["x"]).await.unwrap(), ["x"]);
    assert_eq!(a.token("x"), None, "released: no longer claimed");
    // backon's jitter adds up to the delay again: one backoff is at most 2 P.
    let second = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("taken within one backoff of at most 2 P")
        .unwrap()
        .unwrap();
    assert!(second.token > first.token);
    assert_eq!(b.token("x"), Some(second.token));
}

#[tokio::test(start_paused = true)]
async fn the_held_set_is_emptied_at_the_deadline_and_restored_if_the_session_lived() {
    let store = MemoryStore::new(3);
    let a = session(&store, "a").await;
    let mut held = a.held();
    let taken = a.try_lock_many(&["x", "y"]).await.unwrap();
    let sent = tokio::time::Instant::now();
    store.set_faults(Faults {
        down: true,
        ..Default::default()
    });
    // No renewal succeeds: within R of the last successful send, nothing is claimed.
    let within = timing().renew_deadline + Duration::from_millis(1);
    let emptied = tokio::time::timeout(within, held.wait_for(|h| h.locks.is_empty()))
        .await
        .expect("emptied by the deadline")
        .unwrap()
        .clone();
    assert!(tokio::time::Instant::now() <= sent + timing().renew_deadline);
    assert_eq!(emptied.deadline, None);
    assert_eq!(a.token("x"), None);
    // The store comes back before D: the session never expired, so its locks
    // were never anyone else's and are claimed again, with the same tokens.
    store.set_faults(Faults::default());
    let restored = tokio::time::timeout(timing().retry_period * 2, held.wait_for(|h| !h.locks.is_empty()))
        .await
        .expect("restored after the next renewal")
        .unwrap()
        .clone();
    for lock in taken.taken {
        assert_eq!(restored.locks[&lock.name], lock.token);
    }
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_is_replaced_and_holds_nothing_from_the_old_one() {
    let store = MemoryStore::new(4);
    let a = session(&store, "a").await;
    let b = session(&store, "b").await;
    a.try_lock_many(&["x"]).await.unwrap();
    let old = a.id();
    store.set_faults(Faults {
        down: true,
        ..Default::default()
    });
    // Past D the store expires a's session.
    tokio::time::sleep(timing().lease_duration + timing().retry_period).await;
    store.set_faults(Faults::default());
    // b renews fine and takes x: a's session expired by the store's clock.
    let got = tokio::time::timeout(Duration::from_secs(5), b.lock("x"))
        .await
        .unwrap()
        .unwrap();
    let mut held = a.held();
    let replaced = tokio::time::timeout(timing().retry_period * 3, held.wait_for(|h| h.session != old))
        .await
        .expect("a new session")
        .unwrap()
        .clone();
    assert!(replaced.locks.is_empty(), "the new session holds nothing: {replaced:?}");
    assert_eq!(a.token("x"), None);
    assert_eq!(b.token("x"), Some(got.token));
    let stale = store.renew_session(&old).await;
    assert!(
        matches!(stale, Err(StoreError::Lost { .. })),
        "never revived: {stale:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_renewal_per_period_however_many_locks() {
    let store = MemoryStore::new(5);
    let a = session(&store, "a").await;
    let names: Vec<String> = (0..1000).map(|i| format!("lock-{i}")).collect();
    let got = a.try_lock_many(&names).await.unwrap();
    assert_eq!(got.taken.len(), 1000);
    let before = store.calls().writes;
    let periods = 30;
    tokio::time::sleep(timing().retry_period * periods).await;
    let writes = store.calls().writes - before;
    // Every P × (1 + u), u in [0, 0.2): between 25 and 30 renewals.
    assert!(
        (25..=periods as u64).contains(&writes),
        "{writes} writes in {periods} periods"
    );
    assert_eq!(a.held().borrow().locks.len(), 1000, "all still held");
}

#[tokio::test(start_paused = true)]
async fn close_frees_every_lock_at_once() {
    let store = MemoryStore::new(6);
    let (a, b) = (session(&store, "a").await, session(&store, "b").await);
    a.try_lock_many(&["x", "y"]).await.unwrap();
    let mut held = a.held();
    a.close().await.unwrap();
    assert!(held.borrow_and_update().locks.is_empty());
    let got = b.try_lock_many(&["x", "y"]).await.unwrap();
    assert_eq!(got.taken.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_release_the_store_did_not_confirm_is_retried_after_a_renewal() {
    let store = MemoryStore::new(7);
    let (a, b) = (session(&store, "a").await, session(&store, "b").await);
    a.try_lock_many(&["x"]).await.unwrap();
    store.set_faults(Faults {
        down: true,
        ..Default::default()
    });
    assert!(a.release(&["x"]).await.is_err());
    assert_eq!(a.token("x"), None, "stopped claiming before asking the store");
    store.set_faults(Faults::default());
    tokio::time::sleep(timing().retry_period * 2).await;
    let got = b.try_lock_many(&["x"]).await.unwrap();
    assert_eq!(got.taken.len(), 1, "freed by the retry, long before a's session ends");
}

#[tokio::test(start_paused = true)]
async fn a_batch_whose_reply_was_lost_is_confirmed_by_asking_again() {
    let store = MemoryStore::new(8);
    let a = session(&store, "a").await;
    store.set_faults(Faults {
        drop_reply_after_commit: 1.0,
        ..Default::default()
    });
    let lost = a.try_lock_many(&["x", "y"]).await;
    assert!(
        matches!(lost, Err(StoreError::OutcomeUnknown { .. })),
        "never success: {lost:?}"
    );
    assert_eq!(a.token("x"), None, "not claimed on an unknown outcome");
    store.set_faults(Faults::default());
    let again = a.try_lock_many(&["x", "y"]).await.unwrap();
    assert_eq!(again.taken.len(), 2, "it did commit: the session holds both");
    let observed = store.observe_locks(&["x".into(), "y".into()]).await.unwrap();
    for (lock, held) in observed.locks.iter().zip(&again.taken) {
        assert_eq!(lock.token, Some(held.token), "the same token the lost commit gave");
    }
}

/// A memory store whose first unlock does not arrive in time: the client
/// hears "outcome unknown", and the request is held back for the test to
/// deliver late (as a slow network or a duplicated request would).
struct LateUnlock {
    inner: MemoryStore,
    /// The session and locks of the unlock held back.
    held_back: std::sync::Mutex<Option<HeldBackUnlock>>,
}

type HeldBackUnlock = (String, Vec<(String, FencingToken)>);

#[async_trait]
impl SessionStore for LateUnlock {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        self.inner.ensure_session_schema().await
    }
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        self.inner.open_session(session, owner, lease).await
    }
    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        self.inner.renew_session(session).await
    }
    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        self.inner.close_session(session).await
    }
    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        self.inner.observe_session(session).await
    }
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        self.inner.try_lock(session, names).await
    }
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        let first = {
            let mut held_back = self.held_back.lock().unwrap();
            held_back
                .is_none()
                .then(|| *held_back = Some((session.to_string(), locks.to_vec())))
                .is_some()
        };
        if first {
            return Err(StoreError::outcome_unknown("unlock still on its way (test)"));
        }
        self.inner.unlock(session, locks).await
    }
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        self.inner.observe_locks(names).await
    }
    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.inner.collect_garbage().await
    }
}

/// The seed 1864 two-holders defect: a release whose outcome is unknown,
/// then the same lock asked for again while the store still has it under
/// the old token. The store answers "yours, token T"; the late unlock then
/// frees it by check-and-set on T, and another session takes it. Claiming
/// T again would make two holders: the lock is busy until the release is
/// confirmed, and only a new acquisition (a new token) is claimed.
#[tokio::test(start_paused = true)]
async fn a_hold_whose_release_is_unconfirmed_is_not_claimed_again_under_its_token() {
    let store = MemoryStore::new(11);
    let late = Arc::new(LateUnlock {
        inner: store.clone(),
        held_back: std::sync::Mutex::new(None),
    });
    let a = Session::open(late.clone(), Identity::new(None, None, "a"), timing())
        .await
        .unwrap();
    let b = session(&store, "b").await;
    let first = a.try_lock_many(&["x"]).await.unwrap().taken[0].token;
    assert!(a.release(&["x"]).await.is_err(), "the unlock's outcome is unknown");
    let again = a.try_lock_many(&["x"]).await.unwrap();
    assert!(
        again.taken.is_empty() && again.busy == ["x"],
        "the store still has x under the released token: busy, not taken: {again:?}"
    );
    assert_eq!(a.token("x"), None, "not claimed under the released token");
    // The unlock arrives late and frees x by check-and-set on that token.
    let (session_id, locks) = late.held_back.lock().unwrap().clone().unwrap();
    assert_eq!(locks, [("x".to_string(), first)]);
    assert_eq!(store.unlock(&session_id, &locks).await.unwrap(), ["x"]);
    let taken = b.try_lock_many(&["x"]).await.unwrap();
    assert_eq!(taken.taken.len(), 1, "b takes the freed lock");
    assert_eq!(a.token("x"), None, "one holder: b");
    // Once b lets go, a new acquisition by a is a new hold with a new token.
    b.release(&["x"]).await.unwrap();
    tokio::time::sleep(timing().retry_period * 2).await;
    let retaken = a.try_lock_many(&["x"]).await.unwrap();
    assert_eq!(retaken.taken.len(), 1, "{retaken:?}");
    assert!(retaken.taken[0].token > first);
    assert_eq!(a.token("x"), Some(retaken.taken[0].token));
}

#[tokio::test(start_paused = true)]
async fn bad_lock_names_are_refused_naming_what_is_wrong() {
    let store = MemoryStore::new(9);
    let a = session(&store, "a").await;
    let twice = a.try_lock_many(&["x", "x"]).await.unwrap_err();
    assert!(matches!(twice, StoreError::Invalid { .. }));
    assert!(
        twice.chain().contains("lock name \"x\" is given twice"),
        "{}",
        twice.chain()
    );
    let empty = a.lock("").await.unwrap_err();
    assert!(
        empty.chain().contains("lock name must not be empty"),
        "{}",
        empty.chain()
    );
    assert!(a.held().borrow().locks.is_empty());
}

/// A memory store that records how many calls were in flight at once and
/// how many renewals it saw.
struct Overlaps {
    inner: MemoryStore,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    renewals: AtomicUsize,
}

impl Overlaps {
    fn new(inner: MemoryStore) -> Arc<Self> {
        Arc::new(Overlaps {
            inner,
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            renewals: AtomicUsize::new(0),
        })
    }

    async fn counted<T>(&self, call: impl Future<Output = T>) -> T {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let result = call.await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

#[async_trait]
impl SessionStore for Overlaps {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        self.inner.ensure_session_schema().await
    }
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        self.counted(self.inner.open_session(session, owner, lease)).await
    }
    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.counted(self.inner.renew_session(session)).await
    }
    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        self.counted(self.inner.close_session(session)).await
    }
    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        self.counted(self.inner.observe_session(session)).await
    }
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        self.counted(self.inner.try_lock(session, names)).await
    }
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        self.counted(self.inner.unlock(session, locks)).await
    }
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        self.counted(self.inner.observe_locks(names)).await
    }
    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.counted(self.inner.collect_garbage()).await
    }
}

/// Batches that each take longer than P: the renewals still happen, but
/// between batches, never beside one (both write the session row; on the
/// emulator a second transaction on one client's session ends the first).
#[tokio::test(start_paused = true)]
async fn a_session_makes_one_store_call_at_a_time() {
    let store = MemoryStore::new(10);
    let overlaps = Overlaps::new(store.clone());
    let a = Session::open(overlaps.clone(), Identity::new(None, None, "a"), timing())
        .await
        .unwrap();
    store.set_faults(Faults {
        latency: timing().retry_period,
        ..Default::default()
    });
    for i in 0..6 {
        let got = a.try_lock_many(&[format!("lock-{i}")]).await.unwrap();
        assert_eq!(got.taken.len(), 1);
    }
    assert!(
        overlaps.renewals.load(Ordering::SeqCst) >= 2,
        "renewals got in between the batches"
    );
    assert_eq!(overlaps.most.load(Ordering::SeqCst), 1, "never two calls at once");
    assert_eq!(a.held().borrow().locks.len(), 6);
}

/// A batch that hangs past the deadline holds up the renewal behind it; the
/// held set is still emptied at the deadline, not when the batch gives up.
#[tokio::test(start_paused = true)]
async fn a_hung_batch_does_not_keep_the_held_set_past_the_deadline() {
    let store = MemoryStore::new(11);
    let a = session(&store, "a").await;
    let mut held = a.held();
    a.try_lock_many(&["x"]).await.unwrap();
    let sent = tokio::time::Instant::now();
    store.set_faults(Faults {
        latency: timing().lease_duration,
        ..Default::default()
    });
    let a = Arc::new(a);
    let hung = tokio::spawn({
        let a = a.clone();
        async move { a.try_lock_many(&["y"]).await }
    });
    tokio::time::timeout(
        timing().renew_deadline + Duration::from_millis(1),
        held.wait_for(|h| h.locks.is_empty()),
    )
    .await
    .expect("emptied by the deadline")
    .unwrap();
    assert!(tokio::time::Instant::now() <= sent + timing().renew_deadline);
    assert!(!hung.is_finished() || hung.await.unwrap().is_err());
}
