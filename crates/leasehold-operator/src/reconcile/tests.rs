//! Wire-level checks of every request a reconcile makes, on the scripted
//! API server of [`crate::testing`]: the executor and the delete. What the
//! plan decides is checked as plain values in `plan::tests`.

use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::testing::*;
use leasehold_core::lease::LeaseStore;
use leasehold_core::store::memory::{Faults, MemoryStore};
use leasehold_stores::StoreUrl;

struct Fixture {
    ctx: Arc<Context>,
    server: ApiServer,
    store: MemoryStore,
    metrics: Arc<Metrics>,
}

fn fixture() -> Fixture {
    fixture_with(MemoryStore::new(7))
}

/// A fixture whose store keeps the rows of an earlier one.
fn fixture_with(store: MemoryStore) -> Fixture {
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let (ctx, server) = context_on(Arc::new(store.clone()), metrics.clone());
    Fixture {
        ctx,
        server,
        store,
        metrics,
    }
}

/// Runs `reconcile` against the scripted API server; after it returns, the
/// client is dropped and any request it made beyond the script fails the test.
async fn run<F>(fixture: Fixture, lease: Value, script: F) -> (Result<Action>, MemoryStore, Arc<Metrics>)
where
    F: AsyncFnOnce(&mut ApiServer),
{
    let Fixture {
        ctx,
        server,
        store,
        metrics,
    } = fixture;
    (run_on(ctx, server, lease, script).await, store, metrics)
}

/// A lease on `store: {kubernetes: {}}`: the operator reads the lock's
/// Lease with a `get` its RBAC grants in the candidates' namespace
/// (`STORE_RULES`; the request check of the fixture fails otherwise) and
/// shows its holder, term and token, with `StoreReady=True`.
#[tokio::test]
async fn a_kubernetes_store_lease_shows_the_holder_of_its_lease() {
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let (ctx, server) = context_on_kubernetes_store(metrics);
    let resource = lease(json!({"store": {"kubernetes": {}}}), &["leasehold.dev/release"], None);
    let echo = resource.clone();
    let name = leasehold_kubernetes::store::lease_name("prod/web");
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, vec![pod("web-0", Some("true"), true), pod("web-1", None, true)]).await;
        let seen = next(server).await;
        seen.assert(
            "GET",
            &format!("/apis/coordination.k8s.io/v1/namespaces/prod/leases/{name}"),
            None,
        );
        let record = json!({"lock": "prod/web", "holder": "prod/web-0#n1", "term": 3, "token": 1200, "leaseMs": 15000});
        seen.respond(
            200,
            &json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "prod", "resourceVersion": "1234",
                             "annotations": {"leasehold.dev/record": record.to_string()}},
                "spec": {"holderIdentity": "prod/web-0#n1", "leaseDurationSeconds": 15, "leaseTransitions": 2},
            }),
        );
        expect_event(
            server,
            "Normal",
            "HolderChanged",
            "lock prod/web is held by prod/web-0#n1 (term 3)",
        )
        .await;
        let status = expect_status_apply(server, echo).await;
        assert_eq!(status["holder"], json!("prod/web-0#n1"));
        assert_eq!(status["term"], json!(3));
        assert_eq!(status["token"], json!("1200"));
        let conditions = conditions(&status);
        assert_eq!(
            conditions["StoreReady"],
            (
                "True".into(),
                "TableReady".into(),
                "Kubernetes Leases in the resource's namespace is ready".into()
            )
        );
        assert_eq!(
            conditions["Ready"],
            ("True".into(), "LeaderElected".into(), "prod/web-0#n1 leads".into())
        );
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
}

#[tokio::test]
async fn a_new_resource_gets_the_finalizer_a_label_repair_events_and_status() {
    let (fixture, grant) = held_by_web_0().await;
    let resource = lease(json!({}), &[], None);
    let echo = resource.clone();
    let (result, _, metrics) = run(fixture, resource, async move |server| {
        let seen = next(server).await;
        seen.assert("PATCH", &format!("{LEASES}/web"), Some(MERGE));
        assert_eq!(
            seen.body,
            json!({"metadata": {"resourceVersion": "41", "finalizers": ["leasehold.dev/release"]}})
        );
        seen.respond(200, &echo);

        // web-2 was created while the webhook was down: no sidecar.
        let mut uninjected = pod("web-2", None, false);
        uninjected["spec"]["initContainers"] = json!([]);
        expect_pod_list(
            server,
            vec![
                pod("web-0", Some("true"), true),
                pod("web-1", Some("true"), true),
                uninjected,
            ],
        )
        .await;

        let seen = next(server).await;
        seen.assert("PATCH", "/api/v1/namespaces/prod/pods/web-1", Some(MERGE));
        assert_eq!(
            seen.body,
            json!({"metadata": {"resourceVersion": "rv-web-1", "labels": {"leasehold.dev/leader": "false"}}})
        );
        seen.respond(200, &pod("web-1", Some("false"), true));
        expect_event(
            server,
            "Normal",
            "StaleLabelCleared",
            "pod web-1 had leasehold.dev/leader=true",
        )
        .await;
        expect_event(
            server,
            "Normal",
            "HolderChanged",
            "lock prod/web is held by prod/web-0#n1 (term 1)",
        )
        .await;

        let status = expect_status_apply(server, echo).await;
        assert_eq!(status["holder"], json!("prod/web-0#n1"));
        assert_eq!(status["term"], json!(1));
        assert_eq!(status["token"], json!(grant.token.to_string()));
        assert_eq!(status["renewedAt"], json!(grant.committed_at.to_rfc3339()));
        assert_eq!(status["transitions"], json!(0));
        assert_eq!(status["candidates"], json!(3));
        assert_eq!(status["readyCandidates"], json!(2));
        assert_eq!(status["candidatesWithoutSidecar"], json!(["web-2"]));
        assert_eq!(status["observedGeneration"], json!(3));
        let conditions = conditions(&status);
        assert_eq!(conditions["Valid"].0, "True");
        assert_eq!(
            conditions["StoreReady"],
            (
                "True".into(),
                "TableReady".into(),
                "table leasehold_leases in projects/p/instances/i/databases/d is ready".into()
            )
        );
        assert_eq!(
            conditions["Ready"],
            ("True".into(), "LeaderElected".into(), "prod/web-0#n1 leads".into())
        );
        assert_eq!(conditions["TimingAtRisk"].1, "RenewalsWithinBudget");
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
    assert_eq!(metrics.reconciles(Outcome::Ok), 1);
}

#[tokio::test]
async fn an_invalid_resource_gets_valid_false_naming_the_field_and_a_slow_requeue() {
    let resource = lease(json!({"retryPeriod": "10s"}), &[FINALIZER], None);
    let echo = resource.clone();
    let (result, store, metrics) = run(fixture(), resource, async move |server| {
        expect_event(
            server,
            "Warning",
            "InvalidSpec",
            "spec.retryPeriod (10s) must be shorter",
        )
        .await;
        // What the status says: `plan::tests`.
        let status = expect_status_apply(server, echo).await;
        assert_eq!(conditions(&status)["Valid"].1, "InvalidSpec");
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(INVALID_REQUEUE));
    assert_eq!(metrics.reconciles(Outcome::Invalid), 1);
    assert_eq!(store.calls().reads, 0, "an invalid spec never reaches the store");
}

/// A fixture whose lock prod/web is held by prod/web-0#n1 for 15 s.
async fn held_by_web_0() -> (Fixture, leasehold_core::lease::Grant) {
    held_by(fixture(), "prod/web-0#n1").await
}

/// `fixture`, its lock prod/web held by `holder` for 15 s.
async fn held_by(fixture: Fixture, holder: &str) -> (Fixture, leasehold_core::lease::Grant) {
    let grant = fixture
        .store
        .acquire("prod/web", holder, Duration::from_secs(15))
        .await
        .unwrap();
    (fixture, grant)
}

/// A fixture as the operator of cluster `cluster` sees it.
fn fixture_in(cluster: &str) -> Fixture {
    let Fixture {
        ctx,
        server,
        store,
        metrics,
    } = fixture();
    let (ctx, server) = in_cluster((ctx, server), cluster);
    Fixture {
        ctx,
        server,
        store,
        metrics,
    }
}

/// A deleted resource (uid u-1) with our finalizer and `others`.
fn deleted(others: &[&str]) -> Value {
    let mut finalizers = others.to_vec();
    finalizers.push(FINALIZER);
    let mut resource = lease(json!({}), &finalizers, None);
    resource["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    resource
}

/// Every running candidate has retired (web-1's sidecar does not run, the
/// finalizer does not wait for it); web-0, which held the lock, is gone
/// (killed without releasing) and was of this cluster, as both names say:
/// the row is released by check-and-set, then only our finalizer goes.
#[tokio::test]
async fn deleting_releases_the_row_by_check_and_set_then_drops_only_our_finalizer() {
    let (fixture, grant) = held_by(fixture_in("eu"), "eu/prod/web-0#n1").await;
    let resource = deleted(&["example.com/other"]);
    let echo = resource.clone();
    let (result, store, _) = run(fixture, resource, async move |server| {
        let pods = vec![
            pod("web-1", Some("false"), false),
            running_candidate("web-2", Some("u-1")),
        ];
        expect_pod_list(server, pods.clone()).await;
        expect_fresh_pod_list(server, pods).await;
        expect_event(
            server,
            "Normal",
            "Released",
            "released lock prod/web held by eu/prod/web-0#n1, whose pod is gone",
        )
        .await;
        let seen = next(server).await;
        seen.assert("PATCH", &format!("{LEASES}/web"), Some(MERGE));
        assert_eq!(
            seen.body,
            json!({"metadata": {"resourceVersion": "41", "finalizers": ["example.com/other"]}})
        );
        seen.respond(200, &echo);
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    let row = store.observe("prod/web").await.unwrap().record.unwrap();
    assert_eq!(row.holder, None, "the row is free for a new resource");
    assert_eq!(
        (row.term, row.token),
        (1, Some(grant.token)),
        "release keeps term and token"
    );
}

/// Asserts a waiting delete's Event and `Released=False` condition, both
/// saying `waits_for` and how to override; returns the status written.
async fn expect_delete_waits(server: &mut ApiServer, echo: Value, waits_for: &str) -> Value {
    expect_event(server, "Warning", "DeleteWaiting", waits_for).await;
    let status = expect_status_apply(server, echo).await;
    let (state, reason, message) = conditions(&status)["Released"].clone();
    assert_eq!((state.as_str(), reason.as_str()), ("False", "Waiting"));
    assert!(
        message.contains(waits_for) && message.contains(delete::OVERRIDE),
        "{message}"
    );
    status
}

/// Issue 40: a candidate whose sidecar runs and has not retired from this
/// resource may still claim under it: the finalizer stays (a resource of
/// this name on another store could elect a second leader), the store is
/// not even read, and the condition names the pod. Retired web-1 is not named.
#[tokio::test]
async fn deleting_keeps_the_finalizer_while_a_running_candidate_has_not_retired() {
    let (fixture, _) = held_by_web_0().await;
    let resource = deleted(&[]);
    let echo = resource.clone();
    let (result, store, _) = run(fixture, resource, async move |server| {
        let pods = vec![
            running_candidate("web-0", None),
            running_candidate("web-1", Some("u-1")),
            running_candidate("web-2", Some("an-older-lease")),
        ];
        expect_fresh_pod_list(server, pods).await;
        let status = expect_delete_waits(server, echo, "the sidecars of web-0, web-2 to retire").await;
        assert!(!conditions(&status)["Released"].2.contains("web-1"));
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(DELETE_REQUEUE));
    assert_eq!(
        store.calls().reads,
        0,
        "the store is read once every candidate has retired"
    );
    let row = store.observe("prod/web").await.unwrap().record.unwrap();
    assert_eq!(row.holder.as_deref(), Some("prod/web-0#n1"));
}

/// Issue 54: a sidecar that read the lease before the delete may not be
/// reported running yet (the kubelet's status lags its containers), but it
/// said it campaigns for the lease before that read: the finalizer waits
/// for it too. A pod whose sidecar said so for another lease does not
/// hold this one up.
#[tokio::test]
async fn deleting_waits_for_a_sidecar_that_campaigns_before_the_kubelet_reports_it() {
    let (fixture, _) = held_by_web_0().await;
    let resource = deleted(&[]);
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        let starting = |name: &str, lease: &str| {
            let mut pod = pod(name, Some("false"), false);
            pod["metadata"]["annotations"] =
                json!({leasehold_kubernetes::api::contract::CAMPAIGNS_FOR_ANNOTATION: lease});
            pod
        };
        let pods = vec![
            starting("web-0", "web"),
            starting("web-1", "another-lease"),
            running_candidate("web-2", Some("u-1")),
        ];
        expect_fresh_pod_list(server, pods).await;
        let status = expect_delete_waits(server, echo, "the sidecars of web-0 to retire").await;
        assert!(!conditions(&status)["Released"].2.contains("web-1"));
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(DELETE_REQUEUE));
}

/// Every candidate retired, but the store shows a live holder whose pod
/// runs (a sidecar restarted in place, or a `leasehold run` pod): the
/// finalizer stays and names the holder; nothing is released under it.
/// The next reconcile, the condition already written, writes nothing.
#[tokio::test]
async fn deleting_keeps_the_finalizer_while_the_store_shows_a_live_holder() {
    let (fixture, _) = held_by_web_0().await;
    let store = fixture.store.clone();
    let resource = deleted(&[]);
    let echo = resource.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let pods = vec![running_candidate("web-0", Some("u-1"))];
    let listed = pods.clone();
    let (result, _, _) = run(fixture, resource.clone(), async move |server| {
        expect_fresh_pod_list(server, listed).await;
        let status = expect_delete_waits(
            server,
            echo,
            "waiting for prod/web-0#n1 (pod web-0) to release lock prod/web",
        )
        .await;
        tx.send(status).unwrap();
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(DELETE_REQUEUE));
    let row = store.observe("prod/web").await.unwrap().record.unwrap();
    assert_eq!(
        row.holder.as_deref(),
        Some("prod/web-0#n1"),
        "a live holder is never released under it"
    );

    let mut again = resource;
    again["status"] = rx.await.unwrap();
    let (result, _, _) = run(fixture_with(store), again, async move |server| {
        expect_fresh_pod_list(server, pods).await;
    })
    .await;
    assert_eq!(
        result.unwrap(),
        Action::requeue(DELETE_REQUEUE),
        "still waiting, nothing written"
    );
}

/// Issue 54: holders are judged by pod UID where their identity carries
/// one. Two clusters without names run the same manifest on one store:
/// the live holder is the other cluster's web-0 (its UID), and this
/// cluster's web-0 (another UID) has retired. The local namesake is not
/// the holder, so the delete neither waits for it (as it did, for as long
/// as the other cluster led) nor releases the row.
#[tokio::test]
async fn a_namesake_with_another_uid_is_not_the_holder_a_delete_waits_for() {
    let holder = "prod/web-0#n1@uid-elsewhere";
    let (fixture, _) = held_by(fixture(), holder).await;
    let resource = deleted(&[]);
    let echo = resource.clone();
    let mut namesake = running_candidate("web-0", Some("u-1"));
    namesake["metadata"]["uid"] = json!("uid-here");
    let (result, store, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, vec![namesake.clone()]).await;
        expect_fresh_pod_list(server, vec![namesake]).await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    let row = store.observe("prod/web").await.unwrap().record.unwrap();
    assert_eq!(
        row.holder.as_deref(),
        Some(holder),
        "the other cluster's leader keeps its lease"
    );
}

/// Both halves of the gate hold: every running candidate retired from u-1,
/// the holder released: the finalizer goes.
#[tokio::test]
async fn deleting_drops_the_finalizer_once_every_candidate_retired_and_the_lock_is_free() {
    let (fixture, grant) = held_by_web_0().await;
    fixture
        .store
        .release("prod/web", "prod/web-0#n1", grant.token)
        .await
        .unwrap();
    let resource = deleted(&[]);
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        let pods = vec![
            running_candidate("web-0", Some("u-1")),
            running_candidate("web-1", Some("u-1")),
        ];
        expect_fresh_pod_list(server, pods).await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

/// Another cluster's live holder of a shared lock is not bound to this
/// resource: it is neither waited for nor released.
#[tokio::test]
async fn deleting_leaves_a_live_holder_from_another_cluster_alone() {
    let fixture = fixture();
    fixture
        .store
        .acquire("global/payments", "eu/payments/api-0#n2", Duration::from_secs(15))
        .await
        .unwrap();
    let mut resource = lease(json!({"lockName": "global/payments"}), &[FINALIZER], None);
    resource["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let echo = resource.clone();
    let (result, store, _) = run(fixture, resource, async move |server| {
        expect_fresh_pod_list(server, vec![]).await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    let row = store.observe("global/payments").await.unwrap().record.unwrap();
    assert_eq!(
        row.holder.as_deref(),
        Some("eu/payments/api-0#n2"),
        "the live holder keeps its lease"
    );
}

/// Issue 37: two clusters without names share the default lock
/// `prod/web` on one database (the same manifest applied in both). Deleting
/// the resource in one of them, where no pod web-0 runs, must not release
/// the other cluster's live leader `prod/web-0#…`: nothing proves the holder
/// local, so the finalizer goes and the row is left to its holder (or to
/// expire by the store's clock). With names on both sides, a holder of
/// another cluster is left alone the same way.
#[tokio::test]
async fn deleting_never_releases_a_live_holder_not_provably_of_this_cluster() {
    for (fixture, holder) in [
        (fixture(), "prod/web-0#n1@uid-in-us"),
        (fixture_in("eu"), "us/prod/web-0#n1"),
        (fixture_in("eu"), "prod/web-0#n1"),
    ] {
        let (fixture, grant) = held_by(fixture, holder).await;
        let resource = deleted(&[]);
        let echo = resource.clone();
        let (result, store, _) = run(fixture, resource, async move |server| {
            let pods = vec![running_candidate("web-1", Some("u-1"))];
            expect_pod_list(server, pods.clone()).await;
            expect_fresh_pod_list(server, pods).await;
            expect_finalizer_dropped(server, &echo).await;
        })
        .await;
        assert_eq!(result.unwrap(), Action::await_change());
        let row = store.observe("prod/web").await.unwrap().record.unwrap();
        assert_eq!(
            (row.holder.as_deref(), row.token),
            (Some(holder), Some(grant.token)),
            "{holder}: the other cluster's leader keeps its lease"
        );
    }
}

/// A resource deleted `ago` whose store is down.
fn deleted_with_the_store_down(ago: Duration) -> (Fixture, Value) {
    let fixture = fixture();
    fixture.store.set_faults(Faults {
        down: true,
        ..Faults::default()
    });
    let mut resource = lease(json!({}), &[FINALIZER], None);
    let deleted = k8s_openapi::jiff::Timestamp::now() - ago;
    resource["metadata"]["deletionTimestamp"] =
        json!(deleted.round(k8s_openapi::jiff::Unit::Second).unwrap().to_string());
    (fixture, resource)
}

#[tokio::test]
async fn deleting_while_the_store_is_down_keeps_the_finalizer_and_says_why() {
    let (fixture, resource) = deleted_with_the_store_down(Duration::from_secs(5));
    let (result, _, metrics) = run(fixture, resource, async move |server| {
        expect_fresh_pod_list(server, vec![running_candidate("web-0", Some("u-1"))]).await;
        expect_event(
            server,
            "Warning",
            "ReconcileFailed",
            "releasing lock prod/web on delete failed",
        )
        .await;
    })
    .await;
    assert!(matches!(result, Err(Error::Release { .. })), "{result:?}");
    assert_eq!(metrics.reconciles(Outcome::Error), 1);
}

/// Deleting a namespace takes the store's Secret (and often the store) with
/// it: past RELEASE_PATIENCE, every candidate retired, the finalizer goes
/// and the row expires by itself.
#[tokio::test]
async fn a_delete_stops_waiting_for_a_down_store_after_the_patience() {
    let (fixture, resource) = deleted_with_the_store_down(RELEASE_PATIENCE + Duration::from_secs(5));
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_fresh_pod_list(server, vec![running_candidate("web-0", Some("u-1"))]).await;
        expect_event(server, "Warning", "ReleaseSkipped", "could not release lock prod/web").await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

/// The patience applies only once every candidate has retired: a candidate
/// that may still claim keeps the finalizer however long the store is down.
#[tokio::test]
async fn a_down_store_past_the_patience_still_waits_for_unretired_candidates() {
    let (fixture, resource) = deleted_with_the_store_down(RELEASE_PATIENCE + Duration::from_secs(5));
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_fresh_pod_list(server, vec![running_candidate("web-0", None)]).await;
        expect_delete_waits(server, echo, "the sidecars of web-0 to retire").await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(DELETE_REQUEUE));
}

#[tokio::test]
async fn a_finalizer_race_retries_soon_without_a_warning_event() {
    let resource = lease(json!({}), &[], None);
    let (result, _, metrics) = run(fixture(), resource, async move |server| {
        let seen = next(server).await;
        seen.assert("PATCH", &format!("{LEASES}/web"), Some(MERGE));
        seen.respond(
            409,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                    "message": "the object has been modified"}),
        );
    })
    .await;
    let error = result.unwrap_err();
    assert!(error.is_conflict(), "{error:?}");
    assert_eq!(metrics.reconciles(Outcome::Error), 1);
    let (ctx, _server) = context_on(Arc::new(MemoryStore::new(1)), metrics);
    let lease = Arc::new(leasehold_kubernetes::api::client::object_from_value(&lease(json!({}), &[], None)).unwrap());
    assert_eq!(error_policy(lease, &error, ctx), Action::requeue(CONFLICT_REQUEUE));
}

#[tokio::test]
async fn store_side_on_the_memory_store() {
    store_side_scenario(StoreSide::single(Arc::new(MemoryStore::new(11)))).await;
}

#[tokio::test]
async fn store_side_on_a_private_postgres_server_through_the_secret() {
    use leasehold_stores::postgres::{PostgresConfig, PostgresStore};
    let server = leasehold_testkit::servers::PostgresServer::start();
    let url = server.url();
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(url.clone()),
        table: "leasehold_leases".into(),
    })
    .unwrap();
    assert!(store.observe("probe").await.is_err(), "no table before the reconcile");
    store_side_scenario(StoreSide::by_secret("postgres", Arc::new(store), url)).await;
}

#[tokio::test]
async fn store_side_on_a_private_redis_server_through_the_secret() {
    use leasehold_stores::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
    let server = leasehold_testkit::servers::RedisServer::start();
    let url = server.url();
    let store = RedisStore::connect(RedisConfig {
        url: StoreUrl::new(url.clone()),
        prefix: DEFAULT_PREFIX.into(),
    })
    .unwrap();
    store_side_scenario(StoreSide::by_secret("redis", Arc::new(store), url)).await;
}

/// A PostgreSQL role that may read and write the rows but not create tables
/// (PostgreSQL 15 revokes CREATE on `public` from everyone): the operator
/// cannot create the table, finds it there, and reads it.
#[tokio::test]
async fn without_create_rights_the_operator_reads_an_existing_table() {
    use leasehold_stores::postgres::{PostgresConfig, PostgresStore};
    let server = leasehold_testkit::servers::PostgresServer::start();
    let admin = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: "leasehold_leases".into(),
    })
    .unwrap();
    admin.ensure_schema().await.unwrap();
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE ROLE app LOGIN; \
             GRANT SELECT, INSERT, UPDATE ON leasehold_leases TO app; \
             GRANT USAGE ON SEQUENCE leasehold_leases_token_seq TO app;",
        )
        .await
        .unwrap();
    let url = server.url().replace("leasehold@", "app@");
    let app = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(url.clone()),
        table: "leasehold_leases".into(),
    })
    .unwrap();
    let refused = app.ensure_schema().await.unwrap_err();
    assert!(
        matches!(refused, StoreError::Invalid { .. }),
        "app may not create: {refused:?}"
    );
    store_side_scenario(StoreSide::by_secret("postgres", Arc::new(app), url)).await;
}

/// A Secret that is missing, or that the operator may not read, is a
/// StoreReady=False condition naming it and what to do, with one Event.
#[tokio::test]
async fn an_unreadable_store_secret_shows_in_store_ready() {
    let forbidden = "secrets \"lease-store\" is forbidden: User \"system:serviceaccount:leasehold-system:operator\" \
                     cannot get resource \"secrets\" in API group \"\" in the namespace \"prod\"";
    for (code, says, message) in [
        (
            404,
            "Secret prod/lease-store does not exist: create it with the store's URL under key \"url\"",
            "secrets \"lease-store\" not found",
        ),
        (
            403,
            "grant it get on secrets in prod (Role leasehold-operator-stores",
            forbidden,
        ),
    ] {
        let fixture = fixture();
        let spec = json!({"store": {"redis": {"urlSecretRef": {"name": "lease-store"}}}});
        let resource = lease(spec, &[FINALIZER], None);
        let echo = resource.clone();
        let (result, _, _) = run(fixture, resource, async move |server| {
            expect_pod_list(server, vec![]).await;
            let seen = next(server).await;
            seen.assert("GET", "/api/v1/namespaces/prod/secrets/lease-store", None);
            seen.respond(
                code,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                        "reason": if code == 404 { "NotFound" } else { "Forbidden" }, "message": message}),
            );
            expect_event(server, "Warning", "StoreMisconfigured", says).await;
            let status = expect_status_apply(server, echo).await;
            let store_ready = &conditions(&status)["StoreReady"];
            assert_eq!(
                (store_ready.0.as_str(), store_ready.1.as_str()),
                ("False", "StoreMisconfigured")
            );
            // Each cause once, in words: the API server's message and code,
            // never kube's Rust Debug dump of its Status.
            let text = &store_ready.2;
            assert!(text.contains(says), "{text}");
            assert!(!text.contains("Status {") && !text.contains("ApiError"), "{text}");
            if code == 403 {
                assert!(text.ends_with(&format!("{forbidden} (HTTP 403)")), "{text}");
                assert_eq!(text.matches("forbidden").count(), 1, "{text}");
            }
            assert!(
                text.chars().count() <= leasehold_kubernetes::api::errors::MESSAGE_MAX_CHARS,
                "{text}"
            );
        })
        .await;
        assert_eq!(result.unwrap(), Action::requeue(STORE_ERROR_REQUEUE));
    }
}

mod partitions;

/// Preferred candidates: web-0 leads at priority 0, web-1 (priority 5) has
/// its containers ready but is not Ready, as every follower of a
/// readiness-gated lease. `pending_since`: how long ago an earlier look first saw web-1
/// outrank web-0 (`None`: this is the first look).
async fn preferred_fixture(pending_since: Option<Duration>) -> (Fixture, Value, Vec<Value>) {
    let (fixture, grant) = held_by_web_0().await;
    let lease = lease(json!({"preferenceStabilization": "30s"}), &[FINALIZER], None);
    let mut web_0 = pod("web-0", Some("true"), true);
    web_0["metadata"]["uid"] = json!("uid-0");
    let mut web_1 = pod("web-1", Some("false"), true);
    web_1["metadata"]["uid"] = json!("uid-1");
    web_1["metadata"]["labels"][leasehold_kubernetes::api::preference::PRIORITY_KEY] = json!("5");
    web_1["status"]["conditions"] = json!([
        {"type": "Ready", "status": "False"},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": leasehold_kubernetes::api::contract::STORE_CONDITION, "status": "True"},
    ]);
    if let Some(ago) = pending_since {
        fixture.ctx.remember_preference(
            "prod/web",
            Some(crate::preferred::Pending {
                leader: "prod/web-0#n1".into(),
                term: grant.term,
                target_uid: "uid-1".into(),
                since: k8s_openapi::jiff::Timestamp::now() - ago,
            }),
        );
    }
    (fixture, lease, vec![web_0, web_1])
}

const TRANSFERS: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/leasetransfers";

/// The first look at a candidate that outranks the leader asks for
/// nothing: no transfer is listed or created, and the lease is looked at
/// again within P (2 s) to follow the stabilisation period.
#[tokio::test]
async fn a_candidate_that_just_began_to_outrank_the_leader_waits() {
    let (fixture, resource, pods) = preferred_fixture(None).await;
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, pods).await;
        expect_event(server, "Normal", "HolderChanged", "held by prod/web-0#n1").await;
        expect_status_apply(server, echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(2)));
}

/// After the stabilisation period the operator lists the namespace's
/// transfers (none open) and creates a LeaseTransfer to web-1 with origin
/// Preference, owned by the lease, with a Normal Event saying why.
#[tokio::test]
async fn after_the_period_the_operator_asks_the_leader_to_hand_over() {
    let (fixture, resource, pods) = preferred_fixture(Some(Duration::from_secs(31))).await;
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, pods).await;
        let seen = next(server).await;
        seen.assert("GET", TRANSFERS, None);
        let finished = json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
            "metadata": {"name": "web-to-web-1-a", "namespace": "prod"},
            "spec": {"lease": "web", "to": "web-1"}, "status": {"phase": "TransferFailed"}});
        seen.respond(
            200,
            &json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransferList",
                    "metadata": {"resourceVersion": "60"}, "items": [finished]}),
        );
        let seen = next(server).await;
        seen.assert("POST", TRANSFERS, Some("application/json"));
        assert_eq!(
            seen.body["spec"],
            json!({"lease": "web", "to": "web-1", "origin": "Preference"})
        );
        assert_eq!(seen.body["metadata"]["generateName"], json!("web-preferred-"));
        assert_eq!(seen.body["metadata"]["ownerReferences"][0]["uid"], json!("u-1"));
        let created = seen.body.clone();
        seen.respond(201, &created);
        expect_event(server, "Normal", "PreferredCandidate", "web-1 has outranked the leader").await;
        expect_event(server, "Normal", "HolderChanged", "held by prod/web-0#n1").await;
        expect_status_apply(server, echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(MIN_REQUEUE));
}

/// After the period, the operator lists the namespace's transfers and
/// finds `listed(term)` (`term`: the one its read shows): nothing is created.
async fn a_listed_transfer_holds_the_preference_off(listed: impl FnOnce(u64) -> Value) {
    let (fixture, resource, pods) = preferred_fixture(Some(Duration::from_secs(31))).await;
    let term = fixture.store.observe("prod/web").await.unwrap().record.unwrap().term;
    let listed = listed(term);
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, pods).await;
        let seen = next(server).await;
        seen.assert("GET", TRANSFERS, None);
        seen.respond(
            200,
            &json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransferList",
                    "metadata": {"resourceVersion": "60"}, "items": [listed]}),
        );
        expect_event(server, "Normal", "HolderChanged", "held by prod/web-0#n1").await;
        expect_status_apply(server, echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
}

/// An open transfer of the lease (a manual one here) wins: nothing is
/// created (that the pending step is forgotten: `preferred::tests`).
#[tokio::test]
async fn an_open_transfer_holds_the_preference_off() {
    a_listed_transfer_holds_the_preference_off(|_| {
        json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
            "metadata": {"name": "web-to-web-2-a", "namespace": "prod"},
            "spec": {"lease": "web", "to": "web-2", "origin": "Manual"}, "status": {"phase": "Transferring"}})
    })
    .await;
}

/// A transfer that already handed over the term the read shows holds the
/// preference off too: the read (the observer's cache) predates the
/// handover, and asking again would only be refused (`AlreadyLeads`).
#[tokio::test]
async fn a_transfer_of_the_term_read_holds_the_preference_off() {
    a_listed_transfer_holds_the_preference_off(|term| {
        json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
            "metadata": {"name": "web-preferred-a", "namespace": "prod"},
            "spec": {"lease": "web", "to": "web-1", "origin": "Preference"},
            "status": {"phase": "Transferred", "fromTerm": term, "term": term + 1}})
    })
    .await;
}

/// Issue 54: a preference transfer to web-1 that failed a moment ago
/// (its target did not acquire) backs web-1 off: nothing is created, the
/// status says why and until when (`PreferenceHeldOff`), and the lease is
/// looked at again within P.
#[tokio::test]
async fn a_target_whose_preference_transfer_failed_is_backed_off() {
    let (fixture, resource, pods) = preferred_fixture(Some(Duration::from_secs(31))).await;
    let echo = resource.clone();
    let ended = k8s_openapi::jiff::Timestamp::now() - std::time::Duration::from_secs(1);
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, pods).await;
        let seen = next(server).await;
        seen.assert("GET", TRANSFERS, None);
        let failed = json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
            "metadata": {"name": "web-preferred-a", "namespace": "prod"},
            "spec": {"lease": "web", "to": "web-1", "origin": "Preference"},
            "status": {"phase": "TransferFailed", "reason": "TargetDidNotAcquire", "targetUid": "uid-1",
                       "completedAt": ended.to_string()}});
        seen.respond(
            200,
            &json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransferList",
                    "metadata": {"resourceVersion": "60"}, "items": [failed]}),
        );
        expect_event(server, "Normal", "HolderChanged", "held by prod/web-0#n1").await;
        let status = expect_status_apply(server, echo).await;
        let (state, reason, message) = conditions(&status)["PreferenceHeldOff"].clone();
        assert_eq!((state.as_str(), reason.as_str()), ("True", "TransfersFailed"));
        assert!(
            message.contains("1 preference transfer(s) to it failed") && message.contains("TargetDidNotAcquire"),
            "{message}"
        );
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::from_secs(2)));
}

/// A priority that is not an integer is a Warning Event naming the pod and
/// value (the context keeps it, so it is published once while it lasts).
#[tokio::test]
async fn an_unparsable_priority_is_a_warning() {
    let (fixture, resource, mut pods) = preferred_fixture(None).await;
    pods[1]["metadata"]["labels"][leasehold_kubernetes::api::preference::PRIORITY_KEY] = json!("high");
    let echo = resource.clone();
    let (result, _, _) = run(fixture, resource, async move |server| {
        expect_pod_list(server, pods).await;
        expect_event(
            server,
            "Warning",
            "InvalidPriority",
            "pod web-1: leasehold.dev/priority label \"high\" is not an integer",
        )
        .await;
        expect_event(server, "Normal", "HolderChanged", "held by prod/web-0#n1").await;
        expect_status_apply(server, echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
}
