//! The conformance suite: one set of checks every [`LeaseStore`] must pass,
//! run by `tests/stores/memory.rs` and `tests/stores/spanner.rs` through
//! [`conformance_tests!`](crate::conformance_tests).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease::{Claim, FencingToken, Grant, LeaseStore, StoreError, Version};

pub mod sessions;

/// What a backend offers the suite beyond the trait: its store, and the
/// test-only powers the suite needs.
#[async_trait]
pub trait Target: Send + Sync {
    fn store(&self) -> Arc<dyn LeaseStore>;
    /// Deletes the row outright (an operator with SQL access could).
    async fn delete_row(&self, lock: &str);
    /// Runs an acquire that commits and whose reply the backend arranges to
    /// lose (memory: injected; the others: a proxy holds the replies back
    /// past the client's deadline after forwarding the request). The suite
    /// fails when the acquire did not commit: the unknown-outcome path went
    /// untested.
    async fn acquire_with_lost_reply(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant, StoreError>;
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
    let waited = std::time::Instant::now();
    loop {
        let now = store.observe("expiry").await.expect("observe").now;
        if now > end {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the store's clock never passed {end:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let result = target.acquire_with_lost_reply("unknown", "a", LEASE).await;
    let observed = store.observe("unknown").await.expect("observe");
    assert_eq!(
        observed.live_holder(),
        Some("a"),
        "the acquire must commit with its reply lost, or this tests nothing: {result:?}"
    );
    // It did commit: success would hide the loss of the reply, and
    // "unavailable" (nothing happened) would be a lie.
    assert!(
        matches!(result, Err(StoreError::OutcomeUnknown { .. })),
        "committed but reported {result:?}"
    );
    assert!(
        is_lost(&store.acquire("unknown", "b", LEASE).await),
        "and nobody else gets in"
    );
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
    proxy: &crate::testing::TcpProxy,
    direct: &dyn LeaseStore,
) -> Grant {
    use crate::testing::ProxyMode;
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

/// Generates one `#[tokio::test]` per conformance check for a backend.
/// `$make` is an async expression yielding a `Target`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        use $crate::store::conformance as suite;
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
    };
}
