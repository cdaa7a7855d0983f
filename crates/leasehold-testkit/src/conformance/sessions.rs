//! The conformance suite of [`SessionStore`]: one set of checks every
//! backend with sessions must pass, run by `tests/stores/memory.rs` and
//! `tests/stores/spanner.rs` through
//! [`session_conformance_tests!`](crate::session_conformance_tests).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use leasehold_core::lease::partitions::PartitionView;
use leasehold_core::lease::session::{Collected, GARBAGE_BATCH, SessionObservation, SessionStore};
use leasehold_core::lease::{Assigned, FencingToken, Identity, Partitioner, Session, StoreError, Timing};

/// What a backend offers the suite: a session store, kept alive (with any
/// server it needs) for as long as the target lives.
pub trait SessionTarget: Send + Sync {
    fn sessions(&self) -> Arc<dyn SessionStore>;
}

const LONG: Duration = Duration::from_secs(30);
/// Short enough to wait out, long enough for a renewal on a busy emulator.
const SHORT: Duration = Duration::from_millis(1500);

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn is_lost<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Lost { .. }))
}

async fn open(store: &dyn SessionStore, id: &str, lease: Duration) {
    store.ensure_session_schema().await.expect("ensure_session_schema");
    store
        .open_session(id, &format!("owner-of-{id}"), lease)
        .await
        .expect("open_session");
}

/// Waits until the store's clock is past the session's expiry.
pub async fn wait_until_expired(store: &dyn SessionStore, session: &str) -> SessionObservation {
    let end = store
        .observe_session(session)
        .await
        .expect("observe_session")
        .record
        .expect("the session has a row")
        .expires_at();
    let waited = std::time::Instant::now();
    loop {
        let observed = store.observe_session(session).await.expect("observe_session");
        if observed.now > end {
            assert!(!observed.is_live(), "past its end by the store's clock it is not live");
            return observed;
        }
        assert!(waited.elapsed() < LONG, "the store's clock never passed {end:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session renews by check-and-set until it expires by the store's
/// clock, and never after: it takes nothing and cannot be revived.
pub async fn an_expired_session_is_never_renewed(store: Arc<dyn SessionStore>) {
    open(&*store, "s-expiring", SHORT).await;
    let first = store.observe_session("s-expiring").await.unwrap();
    assert!(first.is_live());
    let renewed = store.renew_session("s-expiring").await.expect("renew while live");
    assert!(renewed > first.record.as_ref().unwrap().renewed_at);
    let observed = store.observe_session("s-expiring").await.unwrap();
    assert_eq!(observed.record.as_ref().unwrap().renewed_at, renewed);
    assert_eq!(
        observed.record.as_ref().unwrap().expires_at(),
        renewed.saturating_add(SHORT)
    );
    wait_until_expired(&*store, "s-expiring").await;
    assert!(
        is_lost(&store.renew_session("s-expiring").await),
        "expired: dead for good"
    );
    assert!(
        is_lost(&store.try_lock("s-expiring", &names(&["x"])).await),
        "an expired session takes nothing"
    );
    assert!(!store.observe_session("s-expiring").await.unwrap().is_live());
    assert!(is_lost(&store.renew_session("never-opened").await));
    let reused = store.open_session("s-expiring", "someone", LONG).await;
    assert!(
        matches!(reused, Err(StoreError::Invalid { .. } | StoreError::Unavailable { .. })),
        "an id is never opened twice: {reused:?}"
    );
}

/// Two live sessions never hold one lock; asking again for a lock the
/// session holds confirms it with the same token.
pub async fn locks_are_exclusive_between_live_sessions(store: Arc<dyn SessionStore>) {
    open(&*store, "s-a", LONG).await;
    open(&*store, "s-b", LONG).await;
    let a = store.try_lock("s-a", &names(&["x", "y"])).await.expect("a locks");
    assert_eq!(a.busy, Vec::<String>::new());
    let tokens: HashMap<_, _> = a.taken.iter().cloned().collect();
    assert_eq!(tokens.len(), 2);
    let b = store.try_lock("s-b", &names(&["y", "z"])).await.expect("b locks");
    assert_eq!(b.busy, names(&["y"]));
    assert_eq!(b.taken.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["z"]);
    let again = store.try_lock("s-a", &names(&["x"])).await.expect("a asks again");
    assert_eq!(again.taken, vec![("x".to_string(), tokens["x"])], "same token");
    let observed = store.observe_locks(&names(&["x", "y", "z", "w"])).await.unwrap();
    let holders: Vec<_> = observed.locks.iter().map(|l| l.holder.as_deref()).collect();
    assert_eq!(holders, [Some("s-a"), Some("s-a"), Some("s-b"), None]);
    assert_eq!(observed.locks[0].token, Some(tokens["x"]));
    assert_eq!(observed.locks[3].token, None, "never taken: no row");
}

/// Several sets of locks read in one call are answered as
/// [`SessionStore::observe_locks`] answers each: in the order given, a lock
/// in two sets in both, an empty set empty, all at one store time no
/// earlier than the writes before; and partitioned locks read together
/// ([`PartitionView::observe_many`]) are each what a read of its own shows.
pub async fn lock_sets_are_answered_as_each_alone(store: Arc<dyn SessionStore>) {
    open(&*store, "s-sets-a", LONG).await;
    open(&*store, "s-sets-b", LONG).await;
    store.try_lock("s-sets-a", &names(&["sets-x", "sets-y"])).await.unwrap();
    let b = store.try_lock("s-sets-b", &names(&["sets-z"])).await.unwrap();
    let sets = [
        names(&["sets-x", "sets-absent", "sets-z"]),
        names(&[]),
        names(&["sets-z", "sets-y"]),
    ];
    let answered = store.observe_lock_sets(&sets).await.expect("observe_lock_sets");
    assert_eq!(answered.len(), sets.len(), "{answered:?}");
    for (set, observed) in sets.iter().zip(&answered) {
        let alone = store.observe_locks(set).await.unwrap();
        assert_eq!(observed.locks, alone.locks, "{set:?}");
        assert_eq!(observed.now, answered[0].now, "one read, one store time");
    }
    let holders = |i: usize| -> Vec<Option<&str>> { answered[i].locks.iter().map(|l| l.holder.as_deref()).collect() };
    assert_eq!(holders(0), [Some("s-sets-a"), None, Some("s-sets-b")]);
    assert_eq!(holders(2), [Some("s-sets-b"), Some("s-sets-a")]);
    assert!(
        answered[0].now.0 >= b.taken[0].1.0,
        "read before the last write: {answered:?}"
    );
    assert!(store.observe_lock_sets(&[]).await.unwrap().is_empty());

    let member = |lock: &str, slot: u32, partitions: &[u32]| {
        std::iter::once(format!("{lock}/m/{slot}"))
            .chain(partitions.iter().map(|i| format!("{lock}/p/{i}")))
            .collect::<Vec<_>>()
    };
    store
        .try_lock("s-sets-a", &member("sets-jobs", 0, &[0, 2]))
        .await
        .unwrap();
    store.try_lock("s-sets-b", &member("sets-jobs", 1, &[1])).await.unwrap();
    store.try_lock("s-sets-b", &member("sets-work", 2, &[3])).await.unwrap();
    let locks = [
        ("sets-jobs".to_string(), 4),
        ("sets-idle".to_string(), 2),
        ("sets-work".to_string(), 4),
    ];
    let views = PartitionView::observe_many(&*store, &locks).await.unwrap();
    assert_eq!(views.len(), locks.len());
    for ((lock, n), view) in locks.iter().zip(&views) {
        assert_eq!(
            view,
            &PartitionView::observe(&*store, lock, *n).await.unwrap(),
            "{lock}"
        );
    }
    assert_eq!(views[0].members, names(&["s-sets-a", "s-sets-b"]));
    assert_eq!(views[0].unowned(), 1);
    assert_eq!((views[1].members.len(), views[1].unowned()), (0, 2));
    assert_eq!(views[2].owners[3].as_deref(), Some("s-sets-b"));
}

/// A successful batch renews its session by the same commit.
pub async fn a_batch_renews_its_session(store: Arc<dyn SessionStore>) {
    open(&*store, "s-busy", LONG).await;
    let before = store
        .observe_session("s-busy")
        .await
        .unwrap()
        .record
        .unwrap()
        .renewed_at;
    store.try_lock("s-busy", &names(&["x"])).await.unwrap();
    let after = store.observe_session("s-busy").await.unwrap().record.unwrap();
    assert!(after.renewed_at > before, "renewed by the batch: {after:?}");
    let token = store.observe_locks(&names(&["x"])).await.unwrap().locks[0]
        .token
        .unwrap();
    assert_eq!(after.renewed_at.0, token.0, "the same commit");
    let empty = store.try_lock("s-busy", &[]).await.expect("an empty batch");
    assert_eq!((empty.taken.len(), empty.busy.len()), (0, 0));
    assert!(store.observe_locks(&[]).await.expect("an empty read").locks.is_empty());
}

/// A lock whose session expired is free by the store's clock, and its next
/// token is higher.
pub async fn a_lock_of_an_expired_session_is_free(store: Arc<dyn SessionStore>) {
    open(&*store, "s-short", SHORT).await;
    open(&*store, "s-long", LONG).await;
    let first = store.try_lock("s-short", &names(&["x"])).await.unwrap().taken[0].1;
    let busy = store.try_lock("s-long", &names(&["x"])).await.unwrap();
    assert_eq!(busy.busy, names(&["x"]), "held while its session is live");
    wait_until_expired(&*store, "s-short").await;
    let observed = store.observe_locks(&names(&["x"])).await.unwrap();
    assert_eq!(observed.locks[0].holder, None, "free once its session expired");
    let taken = store.try_lock("s-long", &names(&["x"])).await.unwrap();
    assert_eq!(taken.taken.len(), 1);
    assert!(taken.taken[0].1 > first, "token {} not above {first}", taken.taken[0].1);
    assert!(is_lost(&store.renew_session("s-short").await));
    let freed = store.unlock("s-short", &[("x".to_string(), first)]).await.unwrap();
    assert!(
        freed.is_empty(),
        "the old session cannot release what is no longer its own"
    );
}

/// Unlock is check-and-set on session and token; a freed lock is free at once.
pub async fn unlock_is_check_and_set(store: Arc<dyn SessionStore>) {
    open(&*store, "s-a", LONG).await;
    open(&*store, "s-b", LONG).await;
    let batch = store.try_lock("s-a", &names(&["x", "y"])).await.unwrap();
    let token = |name: &str| batch.taken.iter().find(|(n, _)| n == name).unwrap().1;
    let (x, y) = (token("x"), token("y"));
    assert!(
        store.unlock("s-b", &[("x".into(), x)]).await.unwrap().is_empty(),
        "not b's"
    );
    assert!(
        store
            .unlock("s-a", &[("x".into(), FencingToken(x.0 - 1))])
            .await
            .unwrap()
            .is_empty(),
        "wrong token"
    );
    let freed = store.unlock("s-a", &[("x".into(), x), ("y".into(), y)]).await.unwrap();
    assert_eq!(
        {
            let mut f = freed;
            f.sort();
            f
        },
        names(&["x", "y"])
    );
    assert!(
        store.unlock("s-a", &[("x".into(), x)]).await.unwrap().is_empty(),
        "once only"
    );
    let observed = store.observe_locks(&names(&["x"])).await.unwrap();
    assert_eq!(observed.locks[0].holder, None);
    assert_eq!(observed.locks[0].token, Some(x), "a released lock keeps its last token");
    let next = store.try_lock("s-b", &names(&["x"])).await.unwrap();
    assert!(next.taken[0].1 > x, "free at once, with a higher token");
}

/// Closing a session frees all its locks at once and ends it for good.
pub async fn closing_frees_every_lock(store: Arc<dyn SessionStore>) {
    open(&*store, "s-a", LONG).await;
    open(&*store, "s-b", LONG).await;
    let held = store.try_lock("s-a", &names(&["x", "y"])).await.unwrap();
    store.close_session("s-a").await.expect("close");
    assert_eq!(store.observe_session("s-a").await.unwrap().record, None);
    let taken = store.try_lock("s-b", &names(&["x", "y"])).await.unwrap();
    assert_eq!(taken.taken.len(), 2, "{taken:?}");
    for ((_, old), (_, new)) in held.taken.iter().zip(&taken.taken) {
        assert!(new > old);
    }
    assert!(is_lost(&store.renew_session("s-a").await));
    assert!(is_lost(&store.close_session("s-a").await));
}

/// Garbage collection removes expired sessions and free lock rows, never a
/// live session or its locks; tokens keep increasing over collected rows.
pub async fn garbage_collection_spares_live_sessions(store: Arc<dyn SessionStore>) {
    open(&*store, "s-live", LONG).await;
    open(&*store, "s-dying", SHORT).await;
    store.try_lock("s-live", &names(&["a", "r"])).await.unwrap();
    let e = store.try_lock("s-dying", &names(&["e"])).await.unwrap().taken[0].1;
    let r = store.observe_locks(&names(&["r"])).await.unwrap().locks[0]
        .token
        .unwrap();
    assert_eq!(store.unlock("s-live", &[("r".into(), r)]).await.unwrap(), names(&["r"]));
    wait_until_expired(&*store, "s-dying").await;
    let collected = store.collect_garbage().await.expect("collect");
    assert_eq!((collected.sessions, collected.locks), (1, 2), "{collected:?}");
    assert_eq!(store.observe_session("s-dying").await.unwrap().record, None);
    store
        .renew_session("s-live")
        .await
        .expect("the live session is untouched");
    let observed = store.observe_locks(&names(&["a", "e", "r"])).await.unwrap();
    let holders: Vec<_> = observed.locks.iter().map(|l| l.holder.as_deref()).collect();
    assert_eq!(holders, [Some("s-live"), None, None]);
    assert_eq!(observed.locks[1].token, None, "e's row was collected");
    assert_eq!(
        store.collect_garbage().await.unwrap(),
        Default::default(),
        "nothing left"
    );
    let again = store.try_lock("s-live", &names(&["e"])).await.unwrap();
    assert!(again.taken[0].1 > e, "a recreated lock row's token is still higher");
}

/// S5 for lock sets: sessions racing for the same locks each get a
/// disjoint share; every lock has exactly one holder, the one told so.
pub async fn racing_sessions_share_disjointly(store: Arc<dyn SessionStore>, sessions: usize) {
    let wanted: Vec<String> = (0..20).map(|i| format!("race-{i}")).collect();
    for s in 0..sessions {
        open(&*store, &format!("s-{s}"), LONG).await;
    }
    let racers = (0..sessions).map(|s| {
        let (store, wanted) = (store.clone(), wanted.clone());
        tokio::spawn(async move { store.try_lock(&format!("s-{s}"), &wanted).await })
    });
    let results: Vec<_> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.expect("join"))
        .collect();
    let mut told: HashMap<String, String> = HashMap::new();
    // Racing batches may get an ambiguous answer to their commit (the
    // Spanner emulator answers contention with NOT_FOUND "Transaction not
    // found" on the commit): such a batch may or may not have taken locks.
    let mut unknown = Vec::new();
    for (s, result) in results.iter().enumerate() {
        match result {
            Ok(batch) => {
                assert_eq!(batch.taken.len() + batch.busy.len(), wanted.len());
                for (name, _) in &batch.taken {
                    let before = told.insert(name.clone(), format!("s-{s}"));
                    assert!(before.is_none(), "{name} taken by {before:?} and s-{s}");
                }
            }
            Err(StoreError::OutcomeUnknown { .. }) => unknown.push(format!("s-{s}")),
            Err(e) => assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}"),
        }
    }
    let observed = store.observe_locks(&wanted).await.unwrap();
    assert!(
        observed.locks.iter().any(|l| l.holder.is_some()),
        "somebody took something: {results:?}"
    );
    for lock in observed.locks {
        match told.get(&lock.name) {
            // Told taken: held by exactly that session.
            Some(holder) => assert_eq!(lock.holder.as_ref(), Some(holder), "{}", lock.name),
            // Nobody was told: free, or taken by a batch whose outcome is unknown.
            None => assert!(
                lock.holder.as_ref().is_none_or(|h| unknown.contains(h)),
                "{} is held by {:?}, which was never told it took it (outcome unknown for {unknown:?})",
                lock.name,
                lock.holder
            ),
        }
    }
}

/// Garbage collection deletes more than one batch's worth, in bounded
/// transactions of at most [`GARBAGE_BATCH`] rows per table, until nothing
/// is left.
pub async fn garbage_collection_takes_as_many_batches_as_needed(store: Arc<dyn SessionStore>) {
    open(&*store, "s-many", LONG).await;
    let wanted: Vec<String> = (0..GARBAGE_BATCH * 5 / 2).map(|i| format!("many-{i}")).collect();
    let batch = store.try_lock("s-many", &wanted).await.expect("take them all");
    assert_eq!(batch.taken.len(), wanted.len());
    let freed = store.unlock("s-many", &batch.taken).await.expect("free them all");
    assert_eq!(freed.len(), wanted.len());
    let collected = store.collect_garbage().await.expect("collect");
    assert_eq!(
        collected,
        Collected {
            sessions: 0,
            locks: wanted.len() as u64
        },
        "every released row, over several batches"
    );
    let observed = store.observe_locks(&wanted[..3]).await.unwrap();
    assert!(observed.locks.iter().all(|l| l.token.is_none()), "{observed:?}");
    store
        .renew_session("s-many")
        .await
        .expect("the live session is untouched");
}

/// One member of [`partitions_are_shared_and_taken_over`].
struct Member {
    assigned: watch::Receiver<Assigned>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<leasehold_core::lease::store::Result<()>>,
}

async fn member(store: &Arc<dyn SessionStore>, name: &str, partitions: u32) -> Member {
    let timing = Timing::new(
        Duration::from_secs(3),
        Duration::from_secs(2),
        Duration::from_millis(400),
        0.2,
    )
    .expect("timing");
    let session = Session::open(store.clone(), Identity::new(None, None, name), timing)
        .await
        .expect("open session");
    let partitioner = Partitioner::new(session, "jobs", partitions, Duration::from_millis(200));
    let assigned = partitioner.assigned();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(partitioner.run(shutdown.clone()));
    Member {
        assigned,
        shutdown,
        task,
    }
}

/// The first partition two of `assigned` claim at `at`, with both members.
fn claimed_twice(assigned: &[Assigned], at: leasehold_core::lease::clock::Instant) -> Option<(u32, usize, usize)> {
    let mut claimed = HashMap::new();
    for (m, assigned) in assigned.iter().enumerate() {
        for index in assigned.partitions.keys() {
            if assigned.token_at(*index, at).is_some()
                && let Some(other) = claimed.insert(*index, m)
            {
                return Some((*index, other, m));
            }
        }
    }
    None
}

/// Polls the members until `done` holds for their shares, checking at each
/// poll that no partition is claimed by two of them at once.
async fn wait_for_shares(members: &[&Member], what: &str, done: impl Fn(&[usize]) -> bool) -> Vec<usize> {
    let started = std::time::Instant::now();
    loop {
        let at = leasehold_core::lease::clock::now();
        let assigned: Vec<Assigned> = members.iter().map(|m| m.assigned.borrow().clone()).collect();
        if let Some((index, a, b)) = claimed_twice(&assigned, at) {
            panic!("partition {index} claimed by members {a} and {b} at once");
        }
        let shares: Vec<usize> = members.iter().map(|m| m.assigned.borrow().partitions.len()).collect();
        if done(&shares) {
            return shares;
        }
        assert!(started.elapsed() < LONG, "{what}: shares still {shares:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Partitions through the one [`Partitioner`] on this store: three members
/// share six partitions two each; one dies without a word (as kill -9: its
/// session is never closed) and the other two take its partitions once its
/// session expired by the store's clock, each with a higher token; no
/// partition is ever claimed by two members at once.
pub async fn partitions_are_shared_and_taken_over(store: Arc<dyn SessionStore>) {
    store.ensure_session_schema().await.expect("ensure_session_schema");
    let (a, b, c) = (
        member(&store, "a", 6).await,
        member(&store, "b", 6).await,
        member(&store, "c", 6).await,
    );
    wait_for_shares(&[&a, &b, &c], "6 over 3", |s| s == [2, 2, 2]).await;
    c.task.abort();
    let _ = c.task.await;
    let orphaned = c.assigned.borrow().partitions.clone();
    wait_for_shares(&[&a, &b], "6 over the 2 left", |s| s == [3, 3]).await;
    for (index, token) in orphaned {
        let new = [&a, &b]
            .iter()
            .find_map(|m| m.assigned.borrow().partitions.get(&index).copied())
            .expect("orphan picked up");
        assert!(new > token, "partition {index}: token {new} not above {token}");
    }
    for m in [a, b] {
        m.shutdown.cancel();
        m.task.await.expect("join").expect("a clean shutdown");
    }
    let left = PartitionView::observe(&*store, "jobs", 6).await.unwrap();
    assert_eq!((left.members.len(), left.unowned()), (0, 6), "closing frees everything");
}

/// Generates one `#[tokio::test]` per session check for a backend. `$make`
/// is an async expression yielding a [`SessionTarget`].
#[macro_export]
macro_rules! session_conformance_tests {
    ($make:expr) => {
        mod sessions {
            use super::*;
            use $crate::conformance::sessions as suite;
            #[tokio::test]
            async fn an_expired_session_is_never_renewed() {
                let target = $make.await;
                suite::an_expired_session_is_never_renewed(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn locks_are_exclusive_between_live_sessions() {
                let target = $make.await;
                suite::locks_are_exclusive_between_live_sessions(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn lock_sets_are_answered_as_each_alone() {
                let target = $make.await;
                suite::lock_sets_are_answered_as_each_alone(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn a_batch_renews_its_session() {
                let target = $make.await;
                suite::a_batch_renews_its_session(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn a_lock_of_an_expired_session_is_free() {
                let target = $make.await;
                suite::a_lock_of_an_expired_session_is_free(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn unlock_is_check_and_set() {
                let target = $make.await;
                suite::unlock_is_check_and_set(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn closing_frees_every_lock() {
                let target = $make.await;
                suite::closing_frees_every_lock(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn garbage_collection_spares_live_sessions() {
                let target = $make.await;
                suite::garbage_collection_spares_live_sessions(suite::SessionTarget::sessions(&target)).await;
            }
            #[tokio::test]
            async fn garbage_collection_takes_as_many_batches_as_needed() {
                let target = $make.await;
                suite::garbage_collection_takes_as_many_batches_as_needed(suite::SessionTarget::sessions(&target))
                    .await;
            }
            #[tokio::test]
            async fn racing_sessions_share_disjointly() {
                let target = $make.await;
                suite::racing_sessions_share_disjointly(suite::SessionTarget::sessions(&target), 5).await;
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The partitions check catches a partition two members claim, and
    /// only while both claims last.
    #[test]
    fn a_partition_claimed_twice_is_caught() {
        let now = leasehold_core::lease::clock::now();
        let member = |partitions: &[u32], deadline| Assigned {
            partitions: partitions
                .iter()
                .map(|i| (*i, FencingToken(1)))
                .collect::<BTreeMap<_, _>>(),
            deadline: Some(deadline),
            ..Default::default()
        };
        let later = now + Duration::from_secs(1);
        let fair = [member(&[0, 1], later), member(&[2], later)];
        assert_eq!(claimed_twice(&fair, now), None);
        let broken = [member(&[0, 1], later), member(&[2], later), member(&[1], later)];
        assert_eq!(claimed_twice(&broken, now), Some((1, 0, 2)));
        let expired = [member(&[0, 1], now), member(&[1], later)];
        assert_eq!(claimed_twice(&expired, now), None, "a claim ends at its deadline");
    }
}
