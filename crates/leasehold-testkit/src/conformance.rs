//! The conformance suite: one set of checks every [`LeaseStore`] must pass,
//! run by `tests/stores/memory.rs` and `tests/stores/spanner.rs` through
//! [`conformance_tests!`](crate::conformance_tests).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use leasehold_core::lease::{
    Claim, EndReason, Ended, FencingToken, Grant, Handoff, Held, LeaseStore, Release, StoreError, StoreTime, Version,
};

pub mod sessions;

/// What a backend offers the suite beyond the trait: its store, and the
/// test-only powers the suite needs.
#[async_trait]
pub trait Target: Send + Sync {
    fn store(&self) -> Arc<dyn LeaseStore>;
    /// Deletes the row outright (an operator with SQL access could).
    async fn delete_row(&self, lock: &str);
    /// Runs `call` on `lock` so that it commits and its reply is lost
    /// (memory: injected; the servers: a proxy holds the replies back past
    /// the client's deadline after forwarding the request), on a store
    /// warmed up by running `call` on another lock first. `holder` is who
    /// the call makes the holder; `round_trips`, how many the call takes up
    /// to its commit's reply on Spanner (whose target aims its deadline
    /// between the two). The suite fails when the call did not commit: the
    /// unknown-outcome path went untested.
    async fn with_lost_reply(
        &self,
        lock: &str,
        holder: &str,
        round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError>;
}

/// A write the suite runs through [`Target::with_lost_reply`]: on a store,
/// for a lock.
pub type StoreCall = dyn Fn(Arc<dyn LeaseStore>, String) -> BoxFuture<'static, Result<Grant, StoreError>> + Send + Sync;

/// [`Target::with_lost_reply`] for a server that `store` reaches through
/// `proxy`, its calls timing out after `timeout`: `call` on another lock
/// first while replies flow (the connection opens, the statement or script
/// is prepared), then on `lock` with replies held back past the timeout, so
/// it commits and its reply is lost.
pub async fn with_replies_held_back(
    proxy: &super::TcpProxy,
    timeout: Duration,
    store: Arc<dyn LeaseStore>,
    lock: &str,
    call: &StoreCall,
) -> Result<Grant, StoreError> {
    let warm = call(store.clone(), "warm-up".into()).await;
    assert!(matches!(warm, Ok(_) | Err(StoreError::Lost { .. })), "{warm:?}");
    proxy.set(super::ProxyMode::DelayReplies(timeout * 3));
    let result = call(store, lock.to_string()).await;
    proxy.set(super::ProxyMode::Forward);
    result
}

const LEASE: Duration = Duration::from_secs(30);

fn is_lost<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Lost { .. }))
}

/// `candidates` acquisitions of `lock` at once, by `candidate-<i>`.
async fn race(store: &Arc<dyn LeaseStore>, lock: &'static str, candidates: usize) -> Vec<Result<Grant, StoreError>> {
    let racers = (0..candidates).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { store.acquire(lock, &format!("candidate-{i}"), LEASE).await })
    });
    futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.expect("join"))
        .collect()
}

/// S5: N candidates race for a free lock; exactly one wins, the others lose.
pub async fn racing_candidates_one_wins(target: &dyn Target, candidates: usize) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let results = race(&store, "race", candidates).await;
    let winners: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one racer must win: {results:?}");
    for r in results.iter().filter(|r| r.is_err()) {
        assert!(
            matches!(r, Err(StoreError::Lost { .. } | StoreError::Unavailable { .. })),
            "losers lose or retry later, never anything else: {r:?}"
        );
    }
    let observed = store.observe("race").await.expect("observe");
    let holder = observed.live_holder().expect("the winner holds it").to_string();
    let grant = winners[0].as_ref().unwrap();
    assert_eq!(observed.record.as_ref().unwrap().token, Some(grant.token));
    assert!(holder.starts_with("candidate-"));
    // The lease is taken: a late racer loses too.
    assert!(is_lost(&store.acquire("race", "latecomer", LEASE).await));
}

/// S5 on a row that exists: N candidates race for a released lock; exactly
/// one wins. (On an absent row a create's uniqueness alone decides the
/// race; here only the check-and-set of the write can.)
pub async fn racing_for_a_released_lock_one_wins(target: &dyn Target, candidates: usize) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let first = store.acquire("rerace", "first", LEASE).await.expect("acquire");
    store.release("rerace", "first", first.token).await.expect("release");
    let results = race(&store, "rerace", candidates).await;
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one racer must win: {results:?}");
    assert!(winners[0].token > first.token, "{results:?}");
    let observed = store.observe("rerace").await.expect("observe");
    assert_eq!(observed.record.as_ref().unwrap().token, Some(winners[0].token));
}

/// S6/S7: renew is check-and-set; a superseded token is lost.
pub async fn superseded_token_cannot_renew(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let short = Duration::from_millis(300);
    let first = store.acquire("supersede", "a", short).await.expect("a acquires");
    let renewed = store
        .renew("supersede", "a", first.token, short)
        .await
        .expect("a renews");
    assert_eq!(renewed.token, first.token, "renewal keeps the token");
    assert_eq!(renewed.term, first.term);
    assert!(renewed.committed_at > first.committed_at);
    // While a holds it, b cannot take it.
    assert!(is_lost(&store.acquire("supersede", "b", short).await));
    // Let it expire by the store's clock; b takes it.
    tokio::time::sleep(short * 2).await;
    let second = store
        .acquire("supersede", "b", short)
        .await
        .expect("b acquires the expired lease");
    assert_eq!(second.term, first.term + 1);
    assert!(second.token > first.token);
    // a's renewal with its old token must fail as lost, and change nothing.
    assert!(is_lost(&store.renew("supersede", "a", first.token, short).await));
    // a wrong token under the right holder name is lost too.
    assert!(is_lost(&store.renew("supersede", "b", first.token, short).await));
    let row = store.observe("supersede").await.unwrap().record.unwrap();
    assert_eq!(row.holder.as_deref(), Some("b"));
    assert_eq!(row.token, Some(second.token));
}

/// S8: release only with our holder and token; it frees the row and keeps term and token.
pub async fn release_needs_our_token(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let grant = store.acquire("release", "a", LEASE).await.expect("acquire");
    assert!(
        is_lost(&store.release("release", "b", grant.token).await),
        "another holder cannot release"
    );
    assert!(
        is_lost(&store.release("release", "a", FencingToken(grant.token.0 - 1)).await),
        "a wrong token cannot release"
    );
    assert!(store.observe("release").await.unwrap().live_holder() == Some("a"));
    store
        .release("release", "a", grant.token)
        .await
        .expect("release with our token");
    let row = store.observe("release").await.unwrap().record.unwrap();
    assert_eq!(row.holder, None);
    assert_eq!(row.term, grant.term, "release keeps the term");
    assert_eq!(row.token, Some(grant.token), "release keeps the token");
    assert!(
        is_lost(&store.release("release", "a", grant.token).await),
        "a second release is lost"
    );
    assert!(
        is_lost(&store.renew("release", "a", grant.token, LEASE).await),
        "no renewal after release"
    );
    // A released lease is free at once.
    let next = store.acquire("release", "b", LEASE).await.expect("free after release");
    assert_eq!(next.term, grant.term + 1);
    assert!(next.token > grant.token);
}

/// Waits (bounded) until the store's clock has reached `at`.
async fn wait_for_store_time(store: &Arc<dyn LeaseStore>, lock: &str, at: StoreTime) {
    let waited = std::time::Instant::now();
    while store.observe(lock).await.expect("observe").now < at {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the store's clock never reached {at:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `holder` acquires `lock` as the term after `previous`, with a higher
/// token, and the row keeps no reservation.
async fn acquires_the_next_term(
    store: &Arc<dyn LeaseStore>,
    lock: &str,
    holder: &str,
    lease: Duration,
    previous: &Grant,
) -> Grant {
    let taken = store.acquire(lock, holder, lease).await.expect("acquire");
    assert_eq!(taken.term, previous.term + 1);
    assert!(taken.token > previous.token);
    let row = store.observe(lock).await.expect("observe").record.expect("the row");
    assert_eq!(row.holder.as_deref(), Some(holder));
    assert_eq!(row.reservation, None, "the acquire cleared the reservation");
    taken
}

/// Holder identities of pods for the reservation checks: `name#nonce@uid`.
fn pod_holder(name: &str, nonce: &str, uid: &str) -> String {
    format!("prod/{name}#{nonce}@{uid}")
}

/// Issue 35: a release with a handoff reserves the row for one pod UID, on
/// the store's clock, for at most the row's lease duration: every other
/// claimant is refused (another pod, a new pod of the target's name, a
/// holder without a UID) until then, and anyone may acquire after, with
/// the next term and a higher token; the acquire clears the reservation.
pub async fn a_reservation_admits_only_its_pod_until_it_ends(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    // Long enough for the refusals below to commit inside it on a busy
    // emulator (as in expiry_is_judged_by_the_store_clock); the window
    // asked for is far longer, so the cap at D is what ends it.
    let lease = Duration::from_secs(4);
    let leader = pod_holder("web-0", "n1", "uid-0");
    let grant = store.acquire("reserve", &leader, lease).await.expect("acquire");
    let handoff = Handoff::new("uid-1", Duration::from_secs(60)).expect("a handoff");
    let transfer = Release::handing_over(handoff, false);
    assert!(
        is_lost(
            &store
                .release_for("reserve", &leader, FencingToken(grant.token.0 - 1), &transfer)
                .await
        ),
        "a handoff release is check-and-set on the token"
    );
    store
        .release_for("reserve", &leader, grant.token, &transfer)
        .await
        .expect("release with a handoff");
    let observed = store.observe("reserve").await.expect("observe");
    let row = observed.record.clone().expect("the row");
    assert_eq!(
        (row.holder.as_deref(), row.term, row.token),
        (None, grant.term, Some(grant.token))
    );
    let reservation = row.reservation.clone().expect("the release wrote a reservation");
    assert_eq!(reservation.pod_uid, "uid-1");
    assert!(
        observed.now < reservation.until && reservation.until.since(observed.now) <= lease,
        "in force, and never longer than the lease: {reservation:?} at {:?}",
        observed.now
    );
    for other in [
        pod_holder("web-2", "n2", "uid-2"),
        pod_holder("web-1", "n3", "uid-1-new"),
        "prod/web-3#n4".to_string(),
        leader.clone(),
    ] {
        let refused = store.acquire("reserve", &other, lease).await;
        assert!(is_lost(&refused), "{other} must wait for the reservation: {refused:?}");
    }
    let row = store
        .observe("reserve")
        .await
        .expect("observe")
        .record
        .expect("the row");
    assert_eq!(
        (row.holder, row.term),
        (None, grant.term),
        "the refusals changed nothing"
    );
    wait_for_store_time(&store, "reserve", reservation.until).await;
    let other = pod_holder("web-2", "n2", "uid-2");
    acquires_the_next_term(&store, "reserve", &other, lease, &grant).await;
}

/// Issue 35: inside the window the reserved pod acquires (any process run
/// of it, whatever its name), as an ordinary acquire: the next term, a
/// higher token, the reservation cleared; its plain release leaves none, so
/// anyone acquires at once.
pub async fn the_reserved_pod_acquires_inside_the_window(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let leader = pod_holder("web-0", "n1", "uid-0");
    let grant = store.acquire("handoff", &leader, LEASE).await.expect("acquire");
    let handoff = Handoff::new("uid-1", LEASE).expect("a handoff");
    store
        .release_for("handoff", &leader, grant.token, &Release::handing_over(handoff, true))
        .await
        .expect("release with a handoff");
    let target_pod = pod_holder("web-1", "n2", "uid-1");
    let taken = acquires_the_next_term(&store, "handoff", &target_pod, LEASE, &grant).await;
    assert_eq!(
        ended(&store, "handoff").await,
        Some(Ended {
            term: grant.term,
            reason: EndReason::Preempted
        }),
        "the target's acquire keeps why the term before it ended"
    );
    store
        .release("handoff", &target_pod, taken.token)
        .await
        .expect("plain release");
    let next = store
        .acquire("handoff", &pod_holder("web-2", "n3", "uid-2"), LEASE)
        .await
        .expect("a plain release reserves nothing");
    assert_eq!(next.term, taken.term + 1);
    assert!(next.token > taken.token);
}

/// The end the row records (`LeaseRecord::ended`).
async fn ended(store: &Arc<dyn LeaseStore>, lock: &str) -> Option<Ended> {
    store
        .observe(lock)
        .await
        .expect("observe")
        .record
        .expect("the row")
        .ended
}

/// Issue 35: a release records why its term ended, for every reason, in
/// its own check-and-set; renewals and the next acquire keep it (so a
/// reader that missed the term still learns why it ended), and a release
/// with a stale token records nothing.
pub async fn a_release_records_why_its_term_ended(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let lock = "ended";
    let mut previous = None;
    for reason in EndReason::ALL {
        let holder = format!("holder-{}", reason.as_str());
        let grant = store.acquire(lock, &holder, LEASE).await.expect("acquire");
        assert_eq!(ended(&store, lock).await, previous, "the acquire keeps the last end");
        store.renew(lock, &holder, grant.token, LEASE).await.expect("renew");
        assert_eq!(ended(&store, lock).await, previous, "a renewal keeps it");
        let stale = FencingToken(grant.token.0 - 1);
        let refused = store.release_for(lock, &holder, stale, &Release::because(reason)).await;
        assert!(is_lost(&refused), "{refused:?}");
        assert_eq!(ended(&store, lock).await, previous, "a refused release records nothing");
        store
            .release_for(lock, &holder, grant.token, &Release::because(reason))
            .await
            .expect("release");
        let written = Some(Ended {
            term: grant.term,
            reason,
        });
        assert_eq!(ended(&store, lock).await, written, "{reason:?}");
        previous = written;
    }
}

/// Issue 35: an acquire of a term nobody ended records it `Expired` (only
/// an expired lease could be acquired unreleased), and a takeover records
/// the term it replaces as `Restarted`.
pub async fn an_acquire_records_an_expiry_and_a_takeover_a_restart(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let lock = "lapsed";
    // As in expiry_is_judged_by_the_store_clock: long enough for a busy emulator.
    let short = Duration::from_secs(4);
    let first = store
        .acquire(lock, "prod/web-0#n1@uid-a", short)
        .await
        .expect("acquire");
    let end = store
        .observe(lock)
        .await
        .expect("observe")
        .record
        .and_then(|r| r.expires_at())
        .expect("a held lease has an end");
    wait_for_store_time(&store, lock, StoreTime(end.0 + 1)).await;
    let holder = "prod/web-1#n2@uid-b";
    let second = store.acquire(lock, holder, LEASE).await.expect("acquire after expiry");
    let expired = Ended {
        term: first.term,
        reason: EndReason::Expired,
    };
    assert_eq!(ended(&store, lock).await, Some(expired));
    let from = Held {
        holder,
        token: second.token,
    };
    store
        .take_over(lock, &Claim::unversioned("prod/web-1#n3@uid-b"), from, LEASE)
        .await
        .expect("a restarted sidecar of the pod takes over");
    let restarted = Ended {
        term: second.term,
        reason: EndReason::Restarted,
    };
    assert_eq!(ended(&store, lock).await, Some(restarted));
}

/// Tokens strictly increase over many terms, across delete and recreate of the row.
pub async fn tokens_strictly_increase(target: &dyn Target, terms: u64) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let mut last: Option<FencingToken> = None;
    let mut seen = HashSet::new();
    for term in 0..terms {
        let holder = format!("holder-{term}");
        let grant = store.acquire("tokens", &holder, LEASE).await.expect("acquire");
        if let Some(previous) = last {
            assert!(
                grant.token > previous,
                "term {term}: token {} not above {}",
                grant.token,
                previous
            );
        }
        assert!(seen.insert(grant.token));
        last = Some(grant.token);
        store.release("tokens", &holder, grant.token).await.expect("release");
        if term % 10 == 9 {
            target.delete_row("tokens").await;
            assert!(store.observe("tokens").await.unwrap().record.is_none(), "row deleted");
        }
    }
}

/// S3: expiry is the store's judgement on its own clock: the lease ends at
/// the grant's commit time + D by the store's clock, not before, and the
/// lock is free right after. (No client time enters the store's API, so a
/// pod's clock cannot move this; the elector's side of S3 is the monotonic
/// deadline, checked in the simulation.)
pub async fn expiry_is_judged_by_the_store_clock(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    // Long enough that the observe and the second acquire below commit
    // before it ends even on an emulator busy with other tests' transactions
    // (1.5 s was not, once).
    let short = Duration::from_secs(4);
    let grant = store.acquire("expiry", "a", short).await.expect("acquire");
    let observed = store.observe("expiry").await.expect("observe");
    let end = observed
        .record
        .as_ref()
        .and_then(|r| r.expires_at())
        .expect("a held lease has an end");
    assert_eq!(
        end,
        grant.committed_at.saturating_add(short),
        "the lease ends at commit + D"
    );
    assert!(
        is_lost(&store.acquire("expiry", "b", short).await),
        "valid by the store's clock until {end:?}"
    );
    wait_for_store_time(&store, "expiry", StoreTime(end.0 + 1)).await;
    let taken = store
        .acquire("expiry", "b", short)
        .await
        .expect("free once the store's clock is past commit + D");
    assert!(taken.token > grant.token);
    assert_eq!(taken.term, grant.term + 1);
}

/// S9: a commit whose reply was lost is reported as unknown, never as
/// success; observing afterwards shows what really happened.
pub async fn unknown_outcome_is_not_success(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let acquire: &StoreCall = &|store, lock| Box::pin(async move { store.acquire(&lock, "a", LEASE).await });
    // An absent row: update (no match), read, insert, commit.
    let result = target.with_lost_reply("unknown", "a", 4, acquire).await;
    a_lost_reply_is_judged_by_what_happened(&*store, "unknown", "a", result).await;
}

/// S9 for a takeover: one whose reply was lost is never success either.
pub async fn an_unknown_takeover_is_not_success(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let old = store
        .acquire("unknown-takeover", "pod-0#1@uid", LEASE)
        .await
        .expect("acquire");
    let take_over: &StoreCall = &move |store, lock| {
        Box::pin(async move {
            let from = Held {
                holder: "pod-0#1@uid",
                token: old.token,
            };
            store
                .take_over(&lock, &Claim::unversioned("pod-0#2@uid"), from, LEASE)
                .await
        })
    };
    // One update, then the commit.
    let result = target
        .with_lost_reply("unknown-takeover", "pod-0#2@uid", 2, take_over)
        .await;
    a_lost_reply_is_judged_by_what_happened(&*store, "unknown-takeover", "pod-0#2@uid", result).await;
}

/// `result` of a write for `holder` that committed with its reply lost:
/// an unknown outcome, never success.
async fn a_lost_reply_is_judged_by_what_happened(
    store: &dyn LeaseStore,
    lock: &str,
    holder: &str,
    result: Result<Grant, StoreError>,
) {
    let observed = store.observe(lock).await.expect("observe");
    assert_eq!(
        observed.live_holder(),
        Some(holder),
        "the write must commit with its reply lost, or this tests nothing: {result:?}"
    );
    // It did commit: success would hide the loss of the reply, and
    // "unavailable" (nothing happened) would be a lie.
    assert!(
        matches!(result, Err(StoreError::OutcomeUnknown { .. })),
        "committed but reported {result:?}"
    );
    assert!(
        is_lost(&store.acquire(lock, "b", LEASE).await),
        "and nobody else gets in"
    );
}

/// Issue 25: a takeover replaces exactly the holder and token it names,
/// never another holder, a superseded or future token, or a released lease;
/// the new term's token is above the replaced one, and the replaced holder
/// can neither renew nor release any more. Of racing takeovers, one wins.
pub async fn a_takeover_replaces_only_the_holder_and_token_it_names(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let (lock, earlier, later) = ("takeover", "prod/web-0#1@uid-a", "prod/web-0#2@uid-a");
    let old = store.acquire(lock, earlier, LEASE).await.expect("acquire");
    let claim = Claim::unversioned(later);
    let wrong = [
        ("another holder", "prod/web-0#1@uid-b", old.token),
        ("an older token", earlier, FencingToken(old.token.0 - 1)),
        ("a newer token", earlier, FencingToken(old.token.0 + 1)),
    ];
    for (what, holder, token) in wrong {
        let refused = store.take_over(lock, &claim, Held { holder, token }, LEASE).await;
        assert!(is_lost(&refused), "{what}: {refused:?}");
    }
    let row = store.observe(lock).await.unwrap().record.unwrap();
    assert_eq!(
        (row.holder.as_deref(), row.term, row.token),
        (Some(earlier), old.term, Some(old.token)),
        "a refused takeover changes nothing"
    );

    let from = Held {
        holder: earlier,
        token: old.token,
    };
    let new = store
        .take_over(lock, &claim, from, LEASE)
        .await
        .expect("the exact holder and token are taken over");
    assert_eq!(new.term, old.term + 1, "a new term");
    assert!(new.token > old.token, "a higher token: {new:?} after {old:?}");
    let row = store.observe(lock).await.unwrap().record.unwrap();
    assert_eq!((row.holder.as_deref(), row.token), (Some(later), Some(new.token)));
    assert!(
        is_lost(&store.renew(lock, earlier, old.token, LEASE).await),
        "the replaced term cannot renew"
    );
    assert!(is_lost(&store.release(lock, earlier, old.token).await), "nor release");
    let again = store
        .take_over(lock, &Claim::unversioned("prod/web-0#3@uid-a"), from, LEASE)
        .await;
    assert!(is_lost(&again), "a replaced term is not taken over twice: {again:?}");

    // Racing takeovers of the same term: at most one is told it won, and the
    // store holds exactly one of them. (The Spanner emulator aborts
    // concurrent transactions, sometimes at the commit: an unknown outcome.)
    let current = Held {
        holder: later,
        token: new.token,
    };
    let racers = (0..4).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let holder = format!("prod/web-0#racer{i}@uid-a");
            store
                .take_over(lock, &Claim::unversioned(&holder), current, LEASE)
                .await
        })
    });
    let results: Vec<_> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.expect("join"))
        .collect();
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert!(winners.len() <= 1, "at most one takeover wins: {results:?}");
    for result in results.iter().filter(|r| r.is_err()) {
        assert!(
            !matches!(result, Err(StoreError::Invalid { .. })),
            "losers lose, retry later or do not know: {result:?}"
        );
    }
    let row = store.observe(lock).await.unwrap().record.unwrap();
    let (holder, token) = (row.holder.unwrap_or_default(), row.token.unwrap());
    assert!(
        holder.contains("#racer") && token > new.token,
        "one racer holds it: {holder} {token}"
    );
    if let Some(winner) = winners.first() {
        assert_eq!(winner.token, token, "the one told it won holds it");
    }

    // A released lease is acquired, not taken over.
    store.release(lock, &holder, token).await.expect("release");
    let from = Held { holder: &holder, token };
    let after_release = store.take_over(lock, &Claim::unversioned(later), from, LEASE).await;
    assert!(
        is_lost(&after_release),
        "a released lease is not taken over: {after_release:?}"
    );
}

/// Issue 25: a takeover honours the version fence in its own transaction,
/// as acquire does, and records the taker's version.
pub async fn a_takeover_honours_the_version_fence(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let held = acquire_at(&*store, "takeover-fence", "web-0#1@u", Some(5), true)
        .await
        .unwrap();
    let from = Held {
        holder: "web-0#1@u",
        token: held.token,
    };
    let older = version(4);
    let fenced = Claim {
        holder: "web-0#2@u",
        version: Some(&older),
        fence: true,
    };
    let refused = store.take_over("takeover-fence", &fenced, from, LEASE).await;
    assert!(is_lost(&refused), "an older revision behind the fence: {refused:?}");
    let same = version(5);
    let claim = Claim {
        version: Some(&same),
        ..fenced
    };
    store
        .take_over("takeover-fence", &claim, from, LEASE)
        .await
        .expect("the same revision takes over");
    let row = store.observe("takeover-fence").await.unwrap().record.unwrap();
    assert_eq!((row.holder.as_deref(), row.version), (Some("web-0#2@u"), Some(same)));
}

/// A store that counts the observations made through it.
struct Counted {
    inner: Arc<dyn LeaseStore>,
    observes: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl LeaseStore for Counted {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.inner.ensure_schema().await
    }
    async fn observe(&self, lock: &str) -> Result<leasehold_core::lease::Observation, StoreError> {
        self.observes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.observe(lock).await
    }
    async fn changed(&self, lock: &str, seen: &leasehold_core::lease::Observation) {
        self.inner.changed(lock, seen).await
    }
    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        self.inner.acquire_as(lock, claim, lease).await
    }
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        self.inner.renew(lock, holder, token, lease).await
    }
    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        self.inner.release_for(lock, holder, token, release).await
    }
}

/// Issue 25: a follower learns of a release by the store's push (PostgreSQL
/// `NOTIFY`, Redis `PUBLISH`), not by its poll. Its poll is 5 minutes
/// apart, so a follower that only polled could not lead within this test;
/// it leads after exactly one observation since the release, the one the
/// notice woke. `leader` and `follower` are two stores (two connections) on
/// one server.
pub async fn a_release_wakes_a_waiting_follower(leader: Arc<dyn LeaseStore>, follower: Arc<dyn LeaseStore>) {
    use leasehold_core::lease::{Elector, Identity, Timing};
    let minutes = |m: u64| Duration::from_secs(60 * m);
    let timing = Timing::new(minutes(20), minutes(10), minutes(5), 0.0).expect("timing");
    leader.ensure_schema().await.expect("ensure_schema");
    let held = leader
        .acquire("pushed", "leader#1", minutes(20))
        .await
        .expect("acquire");

    // The follower's store listens from its first wait on. Until it does,
    // a release is not announced to it: release a probe lock until one
    // wakes it (each try bounded, the loop by the test's own timeout).
    let probe_seen = follower.observe("probe").await.expect("observe");
    loop {
        let waiting = follower.changed("probe", &probe_seen);
        let probe = leader.acquire("probe", "prober", LEASE).await.expect("probe acquire");
        let released = async {
            leader
                .release("probe", "prober", probe.token)
                .await
                .expect("probe release");
            futures::future::pending::<()>().await
        };
        let woke = tokio::select! {
            () = waiting => true,
            () = released => false,
            () = tokio::time::sleep(Duration::from_secs(1)) => false,
        };
        if woke {
            break;
        }
    }

    let counted = Arc::new(Counted {
        inner: follower,
        observes: Default::default(),
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let handle =
        Elector::new("pushed", Identity::with_nonce("follower", "1"), timing).spawn(counted.clone(), shutdown.clone());
    let mut state = handle.subscribe();
    state
        .wait_for(|s| s.holder.as_deref() == Some("leader#1"))
        .await
        .expect("the follower sees the leader");
    let before = counted.observes.load(std::sync::atomic::Ordering::SeqCst);
    leader.release("pushed", "leader#1", held.token).await.expect("release");
    tokio::time::timeout(minutes(1), state.wait_for(|s| s.leader))
        .await
        .expect("the follower leads long before its next poll (5 min)")
        .expect("the elector runs");
    let looks = counted.observes.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert_eq!(
        looks, 1,
        "one observation between the release and the acquisition: the notice's, no poll"
    );
    shutdown.cancel();
    handle.join().await;
}

/// TLS: a store checking the server's certificate against the CA that
/// signed it renews; one checking against another CA is refused before
/// anything is sent, naming the certificate.
pub async fn tls_checks_the_certificate(trusting: &dyn LeaseStore, distrusting: &dyn LeaseStore) {
    let lease = Duration::from_secs(30);
    let grant = trusting.acquire("tls", "a", lease).await.expect("acquire over TLS");
    trusting
        .renew("tls", "a", grant.token, lease)
        .await
        .expect("renew over TLS");
    let refused = distrusting.observe("tls").await.unwrap_err();
    assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
    assert!(
        refused.chain().contains("invalid peer certificate"),
        "{}",
        refused.chain()
    );
}

/// TLS checks the server's host name: to the same server with the same CA,
/// by a name its certificate covers the store answers; by a name it does
/// not cover the connection is refused, saying why.
pub async fn tls_checks_the_host_name(covered: &dyn LeaseStore, uncovered: &dyn LeaseStore) {
    covered
        .observe("tls-name")
        .await
        .expect("observe by a name the certificate covers");
    let refused = uncovered.observe("tls-name").await.unwrap_err();
    assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
    let chain = refused.chain();
    assert!(
        chain.contains("invalid peer certificate") && chain.contains("not valid for name"),
        "refused for the name: {chain}"
    );
}

/// Issue 16: once `ensure_schema` has upgraded a table from before versions,
/// its row `old` (term 4, written without a version) reads with no version
/// recorded, and the next acquisition records one.
pub async fn an_upgraded_table_keeps_its_row_and_records_versions(store: &dyn LeaseStore) {
    let row = store.observe("old").await.unwrap().record.unwrap();
    assert_eq!(
        (row.term, row.version),
        (4, None),
        "the old row is kept, with no version"
    );
    let version = Version {
        revision: 2,
        name: "abc/app:2".into(),
    };
    let claim = Claim {
        holder: "a",
        version: Some(&version),
        fence: true,
    };
    store.acquire_as("old", &claim, Duration::from_secs(5)).await.unwrap();
    let row = store.observe("old").await.unwrap().record.unwrap();
    assert_eq!((row.term, row.version), (5, Some(version)));
}

fn version(revision: u64) -> Version {
    Version {
        revision,
        name: format!("hash{revision}/app:v{revision}"),
    }
}

/// Acquires `lock` for `holder` at `revision` (none: unversioned), with or without the fence.
async fn acquire_at(
    store: &dyn LeaseStore,
    lock: &str,
    holder: &str,
    revision: Option<u64>,
    fence: bool,
) -> Result<Grant, StoreError> {
    let version = revision.map(version);
    let claim = Claim {
        holder,
        version: version.as_ref(),
        fence,
    };
    store.acquire_as(lock, &claim, LEASE).await
}

/// Issue 16: the row records the version of whoever acquired it, keeps it
/// on release (as it keeps the term), and replaces it at the next
/// acquisition; an unversioned acquisition records none.
pub async fn the_holders_version_is_recorded_and_kept_on_release(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let recorded = |lock: &'static str| {
        let store = store.clone();
        async move { store.observe(lock).await.unwrap().record.unwrap().version }
    };
    let grant = acquire_at(&*store, "versions", "a", Some(7), false).await.unwrap();
    assert_eq!(recorded("versions").await, Some(version(7)));
    store.release("versions", "a", grant.token).await.unwrap();
    assert_eq!(recorded("versions").await, Some(version(7)), "kept on release");
    let grant = acquire_at(&*store, "versions", "b", Some(3), false).await.unwrap();
    assert_eq!(
        recorded("versions").await,
        Some(version(3)),
        "without the fence, any version may follow"
    );
    store.release("versions", "b", grant.token).await.unwrap();
    store.acquire("versions", "c", LEASE).await.unwrap();
    assert_eq!(recorded("versions").await, None, "an unversioned holder records none");
}

/// Issue 16: with the fence, a lower revision (or none) cannot acquire once
/// a higher one has led, judged in the acquiring transaction: of older and
/// newer candidates racing for the free lease, only a newer one can win.
pub async fn the_version_fence_refuses_older_revisions_in_the_acquire(target: &dyn Target) {
    let store = target.store();
    store.ensure_schema().await.expect("ensure_schema");
    let grant = acquire_at(&*store, "fence", "new", Some(2), true).await.unwrap();
    store.release("fence", "new", grant.token).await.unwrap();
    for (revision, who) in [(Some(1), "older"), (None, "unversioned")] {
        let refused = acquire_at(&*store, "fence", who, revision, true).await;
        let Err(StoreError::Lost { reason, .. }) = &refused else {
            panic!("{who} must be refused as lost: {refused:?}");
        };
        assert!(reason.contains("version fence"), "{who}: {reason}");
    }
    assert_eq!(
        store.observe("fence").await.unwrap().live_holder(),
        None,
        "nothing taken"
    );
    // The fence is the acquirer's to ask for: without it an older one may lead.
    let older = acquire_at(&*store, "fence", "older", Some(1), false).await.unwrap();
    store.release("fence", "older", older.token).await.unwrap();
    let same = acquire_at(&*store, "fence", "same", Some(1), true).await.unwrap();
    store.release("fence", "same", same.token).await.unwrap();
    let newest = acquire_at(&*store, "fence", "newest", Some(5), true).await.unwrap();
    store.release("fence", "newest", newest.token).await.unwrap();

    let racers = (0..8).map(|i| {
        let store = store.clone();
        let revision = if i % 2 == 0 { 4 } else { 6 };
        tokio::spawn(async move {
            let holder = format!("racer-{i}-r{revision}");
            (
                revision,
                acquire_at(&*store, "fence", &holder, Some(revision), true).await,
            )
        })
    });
    let results: Vec<_> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.expect("join"))
        .collect();
    for (revision, result) in &results {
        // Any failure but "invalid" is a loser's (the Spanner emulator
        // aborts concurrent transactions, sometimes at the commit).
        assert!(
            !matches!(result, Err(StoreError::Invalid { .. })) && (*revision == 6 || result.is_err()),
            "revision {revision}: {result:?} (4 must never pass the fence at 5)"
        );
    }
    let winners = results.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(winners <= 1, "{results:?}");
    let row = store.observe("fence").await.unwrap().record.unwrap();
    let want = if row.holder.is_some() { 6 } else { 5 };
    assert_eq!(row.version, Some(version(want)), "only revision 6 may take it");
    assert!(
        winners == 0 || row.holder.is_some(),
        "a winner holds the lease: {results:?}"
    );
}

/// S4: a store whose server cannot be reached answers observe and acquire
/// promptly with `Unavailable`: nothing was sent, so nothing happened.
pub async fn an_unreachable_server_is_unavailable_promptly(store: &dyn LeaseStore) {
    let started = std::time::Instant::now();
    for result in [
        store.observe("x").await.map(|_| ()),
        store.acquire("x", "a", Duration::from_secs(5)).await.map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable { .. }),
            "nothing was sent, so nothing happened: {err:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// S4/S9: the connection of `through` (which reaches the server by `proxy`)
/// is cut under a held lease: the renewal is never success, and the store,
/// read `direct`ly, still has the lease. Returns the grant, for the
/// backend's own check of how it reconnects.
pub async fn a_cut_connection_is_not_success(
    through: &dyn LeaseStore,
    proxy: &super::TcpProxy,
    direct: &dyn LeaseStore,
) -> Grant {
    use super::ProxyMode;
    let grant = through.acquire("cut", "a", Duration::from_secs(30)).await.unwrap();
    proxy.set(ProxyMode::Cut);
    let err = through
        .renew("cut", "a", grant.token, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable { .. } | StoreError::OutcomeUnknown { .. }),
        "{err:?}"
    );
    proxy.set(ProxyMode::Forward);
    let observed = direct.observe("cut").await.unwrap();
    assert_eq!(observed.live_holder(), Some("a"), "the store still has the lease");
    grant
}

/// The batched read answers each lock as [`LeaseStore::observe`] does: in
/// the order asked, a lock named twice twice, an absent lock as absent, a
/// released one with its term and token kept, every answer at a clock no
/// earlier than the writes before it; and it reads many locks, and none.
pub async fn observe_many_answers_each_lock_as_observe(target: &dyn Target) {
    let store = target.store();
    let held = store.acquire("many-held", "a", LEASE).await.unwrap();
    let released = store.acquire("many-released", "b", LEASE).await.unwrap();
    store.release("many-released", "b", released.token).await.unwrap();
    let locks: Vec<String> = ["many-released", "many-absent", "many-held", "many-released"]
        .map(String::from)
        .to_vec();
    let many = store.observe_many(&locks).await.unwrap();
    assert_eq!(many.len(), locks.len(), "{many:?}");
    for (lock, observed) in locks.iter().zip(&many) {
        assert_eq!(observed.record, store.observe(lock).await.unwrap().record, "{lock}");
        assert!(
            observed.now >= released.committed_at,
            "{lock}: read before the release: {observed:?}"
        );
    }
    assert_eq!(many[2].live_holder(), Some("a"));
    assert_eq!(many[2].record.as_ref().and_then(|r| r.token), Some(held.token));
    assert_eq!(many[0].live_holder(), None);
    assert_eq!(many[0].record.as_ref().and_then(|r| r.token), Some(released.token));
    assert!(many[1].record.is_none(), "{:?}", many[1]);
    // The same record; the clock only on stores that read it once per
    // batch (the Kubernetes store reads each lock on its own).
    assert_eq!(many[3].record, many[0].record);

    // Every third of 30 locks held, asked for in reverse: each answer is its own lock's.
    let bulk: Vec<String> = (0..30).map(|i| format!("many-bulk-{i}")).collect();
    for (i, lock) in bulk.iter().enumerate().step_by(3) {
        store.acquire(lock, &format!("holder-{i}"), LEASE).await.unwrap();
    }
    let asked: Vec<String> = bulk.iter().rev().cloned().collect();
    let answered = store.observe_many(&asked).await.unwrap();
    assert_eq!(answered.len(), asked.len());
    for (lock, observed) in asked.iter().zip(&answered) {
        let i: usize = lock["many-bulk-".len()..].parse().unwrap();
        let expected = i.is_multiple_of(3).then(|| format!("holder-{i}"));
        assert_eq!(observed.live_holder(), expected.as_deref(), "{lock}: {observed:?}");
    }
    assert!(store.observe_many(&[]).await.unwrap().is_empty());
}

/// The operator reads every lock of a table in one `observe_many` whatever
/// their number (`operator/observer.rs`): 10,000 locks, every 1,000th held,
/// are one call the store accepts and answers lock by lock. Not in
/// [`conformance_tests!`]: the Kubernetes store without its namespace watch
/// reads lock by lock, and its watched read has its own test.
pub async fn observe_many_reads_ten_thousand_locks_in_one_call(target: &dyn Target) {
    let store = target.store();
    let locks: Vec<String> = (0..10_000).map(|i| format!("ten-thousand-{i}")).collect();
    for (i, lock) in locks.iter().enumerate().step_by(1000) {
        store.acquire(lock, &format!("holder-{i}"), LEASE).await.unwrap();
    }
    let answered = store.observe_many(&locks).await.unwrap();
    assert_eq!(answered.len(), locks.len());
    for (i, observed) in answered.iter().enumerate() {
        let expected = i.is_multiple_of(1000).then(|| format!("holder-{i}"));
        assert_eq!(
            observed.live_holder(),
            expected.as_deref(),
            "{}: {observed:?}",
            locks[i]
        );
    }
}

/// Generates one `#[tokio::test]` per conformance check for a backend.
/// `$make` is an async expression yielding a `Target`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        use $crate::conformance as suite;
        #[tokio::test]
        async fn racing_candidates_one_wins() {
            suite::racing_candidates_one_wins(&$make.await, 10).await;
        }
        #[tokio::test]
        async fn racing_for_a_released_lock_one_wins() {
            suite::racing_for_a_released_lock_one_wins(&$make.await, 10).await;
        }
        #[tokio::test]
        async fn superseded_token_cannot_renew() {
            suite::superseded_token_cannot_renew(&$make.await).await;
        }
        #[tokio::test]
        async fn release_needs_our_token() {
            suite::release_needs_our_token(&$make.await).await;
        }
        #[tokio::test]
        async fn a_reservation_admits_only_its_pod_until_it_ends() {
            suite::a_reservation_admits_only_its_pod_until_it_ends(&$make.await).await;
        }
        #[tokio::test]
        async fn the_reserved_pod_acquires_inside_the_window() {
            suite::the_reserved_pod_acquires_inside_the_window(&$make.await).await;
        }
        #[tokio::test]
        async fn a_release_records_why_its_term_ended() {
            suite::a_release_records_why_its_term_ended(&$make.await).await;
        }
        #[tokio::test]
        async fn an_acquire_records_an_expiry_and_a_takeover_a_restart() {
            suite::an_acquire_records_an_expiry_and_a_takeover_a_restart(&$make.await).await;
        }
        #[tokio::test]
        async fn tokens_strictly_increase_over_100_terms() {
            suite::tokens_strictly_increase(&$make.await, 100).await;
        }
        #[tokio::test]
        async fn expiry_is_judged_by_the_store_clock() {
            suite::expiry_is_judged_by_the_store_clock(&$make.await).await;
        }
        #[tokio::test]
        async fn the_holders_version_is_recorded_and_kept_on_release() {
            suite::the_holders_version_is_recorded_and_kept_on_release(&$make.await).await;
        }
        #[tokio::test]
        async fn the_version_fence_refuses_older_revisions_in_the_acquire() {
            suite::the_version_fence_refuses_older_revisions_in_the_acquire(&$make.await).await;
        }
        #[tokio::test]
        async fn unknown_outcome_is_not_success() {
            suite::unknown_outcome_is_not_success(&$make.await).await;
        }
        #[tokio::test]
        async fn an_unknown_takeover_is_not_success() {
            suite::an_unknown_takeover_is_not_success(&$make.await).await;
        }
        #[tokio::test]
        async fn a_takeover_replaces_only_the_holder_and_token_it_names() {
            suite::a_takeover_replaces_only_the_holder_and_token_it_names(&$make.await).await;
        }
        #[tokio::test]
        async fn observe_many_answers_each_lock_as_observe() {
            suite::observe_many_answers_each_lock_as_observe(&$make.await).await;
        }
        #[tokio::test]
        async fn a_takeover_honours_the_version_fence() {
            suite::a_takeover_honours_the_version_fence(&$make.await).await;
        }
    };
}
