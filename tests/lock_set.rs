//! The many-locks library API ([`Session`]) on the memory store, on paused
//! time: batch locking without waiting, waiting with backoff, the held set
//! and its deadline, release, close, and one renewal per P.

use std::sync::Arc;
use std::time::Duration;

use leasehold::lease::{Identity, Session, SessionStore, StoreError, Timing};
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
    let second = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("taken within one backoff of at most P")
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
