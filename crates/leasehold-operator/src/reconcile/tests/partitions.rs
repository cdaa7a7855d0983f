//! Partitioned leases: the assignment in status, Events on a change of
//! members or balance, and the collection of dead sessions, on sessions
//! written directly to a memory store.

use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::super::context::GcSchedule;
use super::super::*;
use crate::metrics::Metrics;
use crate::testing::*;
use leasehold_core::lease::session::new_session_id;
use leasehold_core::lease::{Identity, SessionStore};
use leasehold_core::store::memory::MemoryStore;

/// A session of pod `pod`, open for `lease`, holding `locks` of `prod/web`.
async fn member(store: &MemoryStore, pod: &str, lease: Duration, locks: &[String]) -> String {
    let id = new_session_id(&Identity::new(None, Some("prod".into()), pod), 7);
    store.open_session(&id, pod, lease).await.unwrap();
    take(store, &id, locks).await;
    id
}

/// `session` takes every lock of `locks`, none busy.
async fn take(store: &MemoryStore, session: &str, locks: &[String]) {
    let got = store.try_lock(session, locks).await.unwrap();
    assert!(got.busy.is_empty(), "{got:?}");
}

/// One reconcile that only applies the status; returns the status applied.
async fn status_after(store: &MemoryStore, old: Value, pods: Vec<Value>) -> Value {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (result, _) = reconcile_on(store, Some(old), pods, async move |server, echo| {
        tx.send(expect_status_apply(server, echo).await).unwrap();
    })
    .await;
    result.unwrap();
    rx.await.unwrap()
}

fn locks(slot: u32, partitions: std::ops::Range<u32>) -> Vec<String> {
    std::iter::once(format!("prod/web/m/{slot}"))
        .chain(partitions.map(|i| format!("prod/web/p/{i}")))
        .collect()
}

fn spec() -> Value {
    json!({"partitions": 8})
}

/// The assignment, as `(pod, count, ranges)` per entry.
fn assignment(status: &Value) -> Vec<(String, u64, String)> {
    status["partitions"]["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["holder"].as_str().unwrap().to_string(),
                h["count"].as_u64().unwrap(),
                h["partitions"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// One reconcile of the partitioned lease showing `old` on `store`, its
/// candidates `pods`; `script` answers after the pod list. Returns the
/// result and the metrics.
async fn reconcile_on<F>(
    store: &MemoryStore,
    old: Option<Value>,
    pods: Vec<Value>,
    script: F,
) -> (Result<Action>, Arc<Metrics>)
where
    F: AsyncFnOnce(&mut ApiServer, Value),
{
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let (ctx, server) = context_on(Arc::new(store.clone()), metrics.clone());
    let resource = lease(spec(), &[FINALIZER], old);
    let echo = resource.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, pods).await;
        script(server, echo).await;
    })
    .await;
    (result, metrics)
}

#[tokio::test]
async fn the_status_shows_the_assignment_a_dead_members_partitions_unowned_until_taken() {
    let store = MemoryStore::new(3);
    let long = Duration::from_secs(60);
    let a = member(&store, "web-0", long, &locks(0, 0..3)).await;
    let b = member(&store, "web-1", long, &locks(1, 3..6)).await;
    let c = member(&store, "web-2", Duration::from_secs(1), &locks(2, 6..8)).await;
    // The candidates, the leader label true on `labelled`.
    let pods = |labelled: &[&str]| -> Vec<Value> {
        ["web-0", "web-1", "web-2", "web-3"]
            .into_iter()
            .map(|name| {
                pod(
                    name,
                    Some(if labelled.contains(&name) { "true" } else { "false" }),
                    true,
                )
            })
            .collect()
    };

    // Three members share the eight partitions: every one owned, Ready.
    // web-3 is no member: its true label is stale. No Event on the first sighting.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (result, _) = reconcile_on(
        &store,
        None,
        pods(&["web-0", "web-1", "web-2", "web-3"]),
        async move |server, echo| {
            let seen = next(server).await;
            seen.assert("PATCH", "/api/v1/namespaces/prod/pods/web-3", Some(MERGE));
            seen.respond(200, &pod("web-3", Some("false"), true));
            expect_event(server, "Normal", "StaleLabelCleared", "pod web-3").await;
            let status = expect_status_apply(server, echo).await;
            tx.send(status).unwrap();
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
    let first = rx.await.unwrap();
    assert_eq!(
        first["partitions"],
        json!({"count": 8, "members": 3, "unowned": 0, "balance": 1, "assignment": [
            {"holder": "web-0", "session": a, "count": 3, "partitions": "0-2"},
            {"holder": "web-1", "session": b, "count": 3, "partitions": "3-5"},
            {"holder": "web-2", "session": c, "count": 2, "partitions": "6-7"},
        ]})
    );
    for single in ["holder", "term", "token", "renewedAt", "leaderVersion"] {
        assert_eq!(first.get(single), None, "{single} stays empty for a partitioned lease");
    }
    assert_eq!(
        conditions(&first)["Ready"],
        (
            "True".into(),
            "PartitionsOwned".into(),
            "all 8 partitions are owned; 3 members, balance 1".into()
        )
    );

    // web-2's session expires by the store's clock: its slot and partitions
    // are free in the same read. Two members, partitions 6-7 unowned, one
    // Event. The collection then deletes its rows, and only its.
    store.jump_clock(2_000_000_000);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (result, metrics) = reconcile_on(
        &store,
        Some(first),
        pods(&["web-0", "web-1", "web-2"]),
        async move |server, echo| {
            let seen = next(server).await;
            seen.assert("PATCH", "/api/v1/namespaces/prod/pods/web-2", Some(MERGE));
            seen.respond(200, &pod("web-2", Some("false"), true));
            expect_event(server, "Normal", "StaleLabelCleared", "pod web-2").await;
            expect_event(
                server,
                "Normal",
                "PartitionsChanged",
                "partitions of lock prod/web: 2 members (was 3), balance 0 (was 1), 2 of 8 unowned",
            )
            .await;
            tx.send(expect_status_apply(server, echo).await).unwrap();
        },
    )
    .await;
    result.unwrap();
    let second = rx.await.unwrap();
    assert_eq!(
        (&second["partitions"]["members"], &second["partitions"]["unowned"]),
        (&json!(2), &json!(2))
    );
    assert_eq!(
        assignment(&second),
        [("web-0".into(), 3, "0-2".into()), ("web-1".into(), 3, "3-5".into())]
    );
    assert_eq!(
        conditions(&second)["Ready"],
        (
            "False".into(),
            "PartitionsUnowned".into(),
            "2 of 8 partitions have no live owner; 2 members".into()
        )
    );
    assert_eq!(
        (metrics.collected_rows("sessions"), metrics.collected_rows("locks")),
        (1, 3),
        "web-2's session, its slot and its two partitions"
    );
    assert!(!store.observe_session(&c).await.unwrap().is_live());
    for (session, held) in [(&a, locks(0, 0..3)), (&b, locks(1, 3..6))] {
        assert!(
            store.observe_session(session).await.unwrap().is_live(),
            "a live session stays"
        );
        let observed = store.observe_locks(&held).await.unwrap();
        assert!(
            observed
                .locks
                .iter()
                .all(|l| l.holder.as_deref() == Some(session.as_str()) && l.token.is_some()),
            "a live session's locks stay: {observed:?}"
        );
    }

    // The members take the orphans: owned again, Ready; the balance and the
    // members did not change, so the status changes without an Event.
    take(&store, &a, &["prod/web/p/6".into()]).await;
    take(&store, &b, &["prod/web/p/7".into()]).await;
    let third = status_after(&store, second, pods(&["web-0", "web-1"])).await;
    assert_eq!(
        assignment(&third),
        [("web-0".into(), 4, "0-2,6".into()), ("web-1".into(), 4, "3-5,7".into())]
    );
    assert_eq!(conditions(&third)["Ready"].1, "PartitionsOwned");

    // The two swap partitions 6 and 7: the counts stay, the assignment alone
    // moved, and it is written.
    for (session, from) in [(&a, 6), (&b, 7)] {
        let name = format!("prod/web/p/{from}");
        let token = store.observe_locks(std::slice::from_ref(&name)).await.unwrap().locks[0]
            .token
            .unwrap();
        assert_eq!(store.unlock(session, &[(name.clone(), token)]).await.unwrap(), [name]);
    }
    for (session, to) in [(&a, 7), (&b, 6)] {
        take(&store, session, &[format!("prod/web/p/{to}")]).await;
    }
    let fourth = status_after(&store, third, pods(&["web-0", "web-1"])).await;
    assert_eq!(
        assignment(&fourth),
        [("web-0".into(), 4, "0-2,7".into()), ("web-1".into(), 4, "3-6".into())]
    );

    // Nothing changed since: no write at all.
    let (result, _) = reconcile_on(&store, Some(fourth), pods(&["web-0", "web-1"]), async move |_, _| {}).await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
}

/// Issue 40 on a partitioned lease: a live session of the namespace holding
/// partitions keeps the finalizer (the operator leaves it alone; its
/// candidate closes it when it retires); once it is closed, the finalizer goes.
#[tokio::test]
async fn deleting_a_partitioned_lease_waits_for_its_sessions_and_leaves_them_alone() {
    let store = MemoryStore::new(5);
    let a = member(&store, "web-0", Duration::from_secs(60), &locks(0, 0..8)).await;
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let mut resource = lease(spec(), &[FINALIZER], None);
    resource["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let retired = vec![running_candidate("web-0", Some("u-1"))];
    let (ctx, server) = context_on(Arc::new(store.clone()), metrics.clone());
    let (echo, listed, session) = (resource.clone(), retired.clone(), a.clone());
    let result = run_on(ctx, server, resource.clone(), async move |server| {
        expect_fresh_pod_list(server, listed).await;
        expect_event(
            server,
            "Warning",
            "DeleteWaiting",
            &format!("the sessions {session} to close"),
        )
        .await;
        expect_status_apply(server, echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(2)));
    let held = store.observe_locks(&locks(0, 0..8)).await.unwrap();
    assert!(held.locks.iter().all(|l| l.holder.as_deref() == Some(a.as_str())));

    store.close_session(&a).await.unwrap();
    let (ctx, server) = context_on(Arc::new(store.clone()), metrics);
    let echo = resource.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_fresh_pod_list(server, retired).await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[test]
fn each_store_is_collected_at_most_once_per_interval() {
    let schedule = GcSchedule::default();
    let start = Instant::now();
    assert!(schedule.due("a".into(), start));
    assert!(!schedule.due("a".into(), start + GC_INTERVAL - Duration::from_millis(1)));
    assert!(schedule.due("b".into(), start), "another store has its own turn");
    assert!(schedule.due("a".into(), start + GC_INTERVAL));
    assert!(!schedule.due("a".into(), start + GC_INTERVAL));
}
