//! The conformance suite on the real Cloud Spanner emulator, each test on a
//! database of its own, plus the Spanner store's own behaviour: table
//! creation, bad names, missing databases, an unreachable emulator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold::lease::{Elector, FencingToken, Grant, Identity, LeaseStore, StoreError, Timing};
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, Endpoints, SpannerConfig, SpannerStore};
use leasehold::testing::conformance::{StoreCall, Target};
use leasehold::testing::{Emulator, ProxyMode, TcpProxy};

const TABLE: &str = "leasehold_leases";

struct Spanner {
    emulator: Emulator,
    config: SpannerConfig,
    store: SpannerStore,
}

async fn spanner() -> Spanner {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(TABLE).await;
    let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap();
    store.ensure_schema().await.unwrap();
    Spanner {
        emulator,
        config,
        store,
    }
}

#[async_trait]
impl Target for Spanner {
    fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store.clone())
    }

    async fn delete_row(&self, lock: &str) {
        // Through a second client, as an operator with SQL access would.
        let sql = format!("DELETE FROM {TABLE} WHERE name = @name");
        leasehold_test_sql(&self.emulator, &self.config, &sql, lock).await;
    }

    /// Replies come back late through a proxy: with each round trip taking
    /// `delay`, a call timeout between the second and the last round trip
    /// abandons the call while its commit is with Spanner.
    async fn with_lost_reply(
        &self,
        lock: &str,
        holder: &str,
        round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError> {
        let target: SocketAddr = self.emulator.host.parse().unwrap();
        let proxy = TcpProxy::start(target).await;
        let endpoints = Endpoints {
            data: Some(format!("http://{}", proxy.addr)),
            admin: Some(self.emulator.rest.clone()),
        };
        let delay = Duration::from_millis(500);
        // First between the commit's send and its reply; then shorter ones
        // (nothing committed), in case the emulator was slower than `delay`.
        let aim = f64::from(round_trips);
        for round_trips in [aim - 0.5, aim - 1.5, aim - 2.5, aim - 0.5, aim + 0.5]
            .into_iter()
            .filter(|r| *r > 1.0)
        {
            let store = SpannerStore::connect_to(self.config.clone(), endpoints.clone(), delay.mul_f64(round_trips))
                .await
                .unwrap();
            // The schema check of the first call, before replies slow down.
            store.observe(lock).await.unwrap();
            proxy.set(ProxyMode::DelayReplies(delay));
            let result = call(Arc::new(store), lock.to_string()).await;
            proxy.set(ProxyMode::Forward);
            if self.store.observe(lock).await.unwrap().live_holder() == Some(holder) {
                return result;
            }
        }
        panic!("no call timeout made the commit land with its reply lost; the S9 path went untested")
    }
}

/// Runs one DML statement in its own transaction.
async fn leasehold_test_sql(emulator: &Emulator, config: &SpannerConfig, sql: &str, lock: &str) {
    use google_cloud_spanner::client::Spanner as Client;
    use google_cloud_spanner::statement::Statement;
    let client = Client::builder()
        .with_endpoint(format!("http://{}", emulator.host))
        .build()
        .await
        .unwrap();
    let db = client.database_client(config.database.clone()).build().await.unwrap();
    let (sql, lock) = (sql.to_string(), lock.to_string());
    db.read_write_transaction()
        .build()
        .run(move |tx: google_cloud_spanner::transaction::ReadWriteTransaction| {
            let statement = Statement::builder(sql.as_str())
                .add_param("name", lock.as_str())
                .build();
            async move { tx.execute_update(statement).await }
        })
        .await
        .unwrap();
}

leasehold::conformance_tests!(spanner());

#[tokio::test]
async fn observe_many_reads_ten_thousand_locks_in_one_call() {
    leasehold::testing::conformance::observe_many_reads_ten_thousand_locks_in_one_call(&spanner().await).await;
}

impl leasehold::testing::conformance::sessions::SessionTarget for Spanner {
    fn sessions(&self) -> Arc<dyn leasehold::lease::SessionStore> {
        Arc::new(self.store.clone())
    }
}

leasehold::session_conformance_tests!(spanner());

#[tokio::test]
async fn ensure_schema_creates_the_table_once_and_is_idempotent() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database("custom_leases").await;
    let store = SpannerStore::connect_to(config, emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap();
    let before = store.observe("x").await.unwrap_err();
    assert!(
        matches!(before, StoreError::Invalid { .. }),
        "a missing table is named, not retried: {before:?}"
    );
    assert!(before.to_string().contains("custom_leases"), "{before}");
    assert!(
        before.to_string().contains("--create-table"),
        "the fix is named: {before}"
    );
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap();
    let observed = store.observe("x").await.unwrap();
    assert!(observed.record.is_none());
    assert!(
        observed.now.0 > 1_600_000_000_000_000_000,
        "the store's clock, in nanoseconds since the epoch"
    );
}

#[tokio::test]
async fn a_bad_table_name_is_refused_before_connecting() {
    let config = SpannerConfig {
        database: "projects/p/instances/i/databases/d".into(),
        table: "leases; DROP".into(),
    };
    let err = SpannerStore::connect_to(config, Endpoints::default(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert_eq!(
        err.chain(),
        "invalid: table: must be a letter followed by up to 127 letters, digits or underscores, got \"leases; DROP\""
    );
}

#[tokio::test]
async fn a_missing_database_is_named() {
    let emulator = Emulator::start_or_connect();
    let config = SpannerConfig {
        database: "projects/leasehold-test/instances/leasehold/databases/nosuchdb".into(),
        table: TABLE.into(),
    };
    // The instance exists once any database was made on this emulator.
    emulator.create_database(TABLE).await;
    let result = match SpannerStore::connect_to(config, emulator.endpoints(), DEFAULT_CALL_TIMEOUT).await {
        Ok(store) => store.ensure_schema().await,
        Err(e) => Err(e),
    };
    let err = result.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("nosuchdb does not exist"), "{err}");
    assert!(
        err.chain().contains("Database not found"),
        "the cause is kept: {}",
        err.chain()
    );
}

#[tokio::test]
async fn an_unreachable_emulator_is_unavailable_promptly() {
    // Reserved, so no other test's server listens there meanwhile.
    let reserved = leasehold::testing::reserve_port([127, 0, 0, 1].into());
    let port = reserved.port;
    let config = SpannerConfig {
        database: "projects/p/instances/i/databases/d".into(),
        table: TABLE.into(),
    };
    let endpoints = Endpoints {
        data: Some(format!("http://127.0.0.1:{port}")),
        admin: None,
    };
    let started = Instant::now();
    let result = match SpannerStore::connect_to(config, endpoints, Duration::from_secs(2)).await {
        Ok(store) => store.observe("x").await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = result.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cut_connection_is_unavailable_and_the_lease_survives_it() {
    let fixture = spanner().await;
    let proxy = TcpProxy::start(fixture.emulator.host.parse().unwrap()).await;
    let endpoints = Endpoints {
        data: Some(format!("http://{}", proxy.addr)),
        admin: Some(fixture.emulator.rest.clone()),
    };
    let store = SpannerStore::connect_to(fixture.config.clone(), endpoints, Duration::from_secs(1))
        .await
        .unwrap();
    suite::a_cut_connection_is_not_success(&store, &proxy, &fixture.store).await;
}

async fn connect(emulator: &Emulator, config: &SpannerConfig) -> SpannerStore {
    SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap()
}

/// Issue 11 item 5: replicas started together on a fresh database all
/// create the table and go on electing at once; the ones whose DDL comes
/// while another's schema change or read-write transactions run wait and
/// find the table, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ensure_schema_on_a_fresh_database_all_succeed() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(TABLE).await;
    let mut replicas = Vec::new();
    for i in 0..5 {
        let store = connect(&emulator, &config).await;
        replicas.push(tokio::spawn(async move {
            store.ensure_schema().await?;
            // What a sidecar does next: elect, in read-write transactions.
            // Each round either wins the lock (then renews it) or finds it
            // held: nothing else.
            // The lease is long enough that a loaded machine cannot let it
            // lapse between the win and the renewal.
            let holder = format!("r{i}");
            let lease = Duration::from_secs(10);
            let mut grants = Vec::new();
            for _ in 0..10 {
                match store.acquire("fresh", &holder, lease).await {
                    Ok(grant) => {
                        let renewed = store.renew("fresh", &holder, grant.token, lease).await?;
                        assert_eq!(renewed.token, grant.token, "{holder}: a renewal keeps the token");
                        grants.push(grant);
                    }
                    Err(StoreError::Lost { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok::<_, StoreError>(grants)
        }));
    }
    let mut grants = Vec::new();
    for replica in replicas {
        let result = replica.await.unwrap();
        match result {
            Ok(won) => grants.extend(won),
            Err(e) => panic!("every replica creates the table and elects: {}", e.chain()),
        }
    }
    // They went on electing: the lock was won, and every win had a token
    // above the one before.
    assert!(!grants.is_empty(), "no replica ever won the lock");
    grants.sort_by_key(|g| g.term);
    assert!(
        grants
            .windows(2)
            .all(|w| w[0].term < w[1].term && w[0].token < w[1].token),
        "terms and tokens increase across wins: {grants:?}"
    );
}

/// The emulator rejects DDL while read-write transactions run ("Schema change
/// operation rejected because a concurrent schema change operation or
/// read-write transaction is already in progress"), as Spanner does while
/// another schema change runs: ensure_schema waits and tries again. (The
/// store before this change failed 4 of 5 such calls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_schema_waits_out_a_concurrent_schema_change() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let fixture = spanner().await;
    let busy = fixture.store.clone();
    let grant = busy.acquire("busy", "a", Duration::from_secs(30)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Renewals that have returned so far.
    let renewed = Arc::new(AtomicUsize::new(0));
    let renewing = {
        let (stop, renewed) = (stop.clone(), renewed.clone());
        tokio::spawn(async move {
            let mut results = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                results.push(busy.renew("busy", "a", grant.token, Duration::from_secs(30)).await);
                renewed.fetch_add(1, Ordering::SeqCst);
            }
            results
        })
    };
    let started = Instant::now();
    while renewed.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "no renewal returned");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for i in 0..3 {
        let config = SpannerConfig {
            database: fixture.config.database.clone(),
            table: format!("second_{i}"),
        };
        let before = renewed.load(Ordering::SeqCst);
        let result = connect(&fixture.emulator, &config).await.ensure_schema().await;
        assert!(result.is_ok(), "table {i}: {:?}", result.map_err(|e| e.chain()));
        // The overlap this is about: renewals (read-write transactions)
        // committed while this schema change was being made.
        assert!(
            renewed.load(Ordering::SeqCst) > before,
            "table {i}: no renewal ran during the schema change"
        );
    }
    stop.store(true, Ordering::SeqCst);
    let results = renewing.await.unwrap();
    for (n, result) in results.iter().enumerate() {
        let renewal = result.as_ref().map_err(StoreError::chain);
        assert_eq!(
            renewal.map(|g| g.token),
            Ok(grant.token),
            "renewal {n} of {}: the holder keeps its lease through the schema changes",
            results.len()
        );
    }
}

/// A table without the store's columns is invalid, with the fix, before
/// any commit is tried (never unavailable, so never retried forever).
#[tokio::test]
async fn a_schema_that_cannot_work_is_invalid_with_the_fix() {
    let emulator = Emulator::start_or_connect();
    let cases = [
        (
            "CREATE TABLE no_commit_ts (shard INT64 NOT NULL, name STRING(MAX) NOT NULL, holder STRING(MAX), \
             term INT64 NOT NULL, token TIMESTAMP, renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true), \
             lease_ms INT64 NOT NULL) PRIMARY KEY (shard, name)",
            "no_commit_ts",
            "ALTER TABLE no_commit_ts ALTER COLUMN token SET OPTIONS (allow_commit_timestamp = true)",
        ),
        (
            "CREATE TABLE bad_types (shard INT64 NOT NULL, name STRING(MAX) NOT NULL, holder STRING(MAX), \
             term STRING(MAX) NOT NULL, token TIMESTAMP OPTIONS (allow_commit_timestamp=true), \
             renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true), lease_ms INT64 NOT NULL) PRIMARY KEY (shard, name)",
            "bad_types",
            "column bad_types.term is STRING(MAX), leasehold needs INT64",
        ),
        (
            "CREATE TABLE no_lease (shard INT64 NOT NULL, name STRING(MAX) NOT NULL, holder STRING(MAX), \
             term INT64 NOT NULL, token TIMESTAMP OPTIONS (allow_commit_timestamp=true), \
             renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true)) PRIMARY KEY (shard, name)",
            "no_lease",
            "ALTER TABLE no_lease ADD COLUMN lease_ms INT64",
        ),
    ];
    for (create, table, fix) in cases {
        let config = emulator.create_database(table).await;
        emulator.ddl(&config.database, create).await;
        let store = connect(&emulator, &config).await;
        for (what, err) in [
            (
                "acquire",
                store
                    .acquire("x", "a", Duration::from_secs(30))
                    .await
                    .map(|_| ())
                    .unwrap_err(),
            ),
            ("ensure_schema", store.ensure_schema().await.unwrap_err()),
        ] {
            assert!(matches!(err, StoreError::Invalid { .. }), "{table} {what}: {err:?}");
            assert!(err.chain().contains(fix), "{table} {what}: {}", err.chain());
        }
    }
}

/// `term` never goes backwards, also when the row is deleted (under a live
/// lease) and recreated: the term-floor row keeps it.
#[tokio::test]
async fn term_never_goes_backwards_across_a_deleted_row() {
    let fixture = spanner().await;
    let store = &fixture.store;
    let lease = Duration::from_secs(30);
    let first = store.acquire("floor", "a", lease).await.unwrap();
    store.release("floor", "a", first.token).await.unwrap();
    let second = store.acquire("floor", "a", lease).await.unwrap();
    assert_eq!(second.term, first.term + 1);
    fixture.delete_row("floor").await;
    assert!(
        store.observe("floor").await.unwrap().record.is_none(),
        "the row is gone"
    );
    let third = store.acquire("floor", "b", lease).await.unwrap();
    assert_eq!(third.term, second.term + 1, "the recreated row continues the term");
    assert!(third.token > second.token);
    assert!(
        matches!(
            store.renew("floor", "a", second.token, lease).await,
            Err(StoreError::Lost { .. })
        ),
        "the deposed holder cannot renew"
    );
    let row = store.observe("floor").await.unwrap().record.unwrap();
    assert_eq!((row.holder.as_deref(), row.term), (Some("b"), third.term));
}

/// A row whose stored lease duration is out of range is refused, never
/// read as an expired (0 ms) lease that anyone may take.
#[tokio::test]
async fn a_row_with_an_out_of_range_duration_is_refused() {
    let fixture = spanner().await;
    let store = &fixture.store;
    store.acquire("bad-ms", "a", Duration::from_secs(30)).await.unwrap();
    for stored in ["0", "-1"] {
        let sql = format!("UPDATE {TABLE} SET lease_ms = {stored} WHERE shard >= 0 AND name = @name");
        leasehold_test_sql(&fixture.emulator, &fixture.config, &sql, "bad-ms").await;
        let observed = store.observe("bad-ms").await.unwrap_err();
        assert!(matches!(observed, StoreError::Invalid { .. }), "{observed:?}");
        assert!(
            observed.to_string().contains(&format!("lease_ms = {stored}")),
            "{observed}"
        );
        let taken = store.acquire("bad-ms", "b", Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(taken, StoreError::Invalid { .. }), "{taken:?}");
    }
    let refused = store
        .acquire("other", "a", Duration::from_micros(1500))
        .await
        .unwrap_err();
    let refused = refused.chain();
    assert!(
        refused.contains("lease duration cannot be stored") && refused.contains("(1.5ms) must be"),
        "{refused}"
    );
}

/// Issue 13 item 7: a renewal that finds the token changed is lost as soon
/// as its UPDATE matched nothing; it rolls back instead of committing, so a
/// slow reply to the commit cannot make it "unknown" (or "unavailable").
#[tokio::test]
async fn a_lost_renewal_is_lost_even_when_replies_are_slow() {
    let fixture = spanner().await;
    let grant = fixture
        .store
        .acquire("slow", "a", Duration::from_secs(30))
        .await
        .unwrap();
    let proxy = TcpProxy::start(fixture.emulator.host.parse().unwrap()).await;
    let endpoints = Endpoints {
        data: Some(format!("http://{}", proxy.addr)),
        admin: Some(fixture.emulator.rest.clone()),
    };
    let delay = Duration::from_millis(400);
    // The UPDATE's reply comes after one delay, the rollback's after two:
    // the call gives up in between.
    let store = SpannerStore::connect_to(fixture.config.clone(), endpoints, delay.mul_f64(1.6))
        .await
        .unwrap();
    store.observe("slow").await.unwrap(); // the schema check, before the delay
    proxy.set(ProxyMode::DelayReplies(delay));
    let stale = FencingToken(grant.token.0 - 1);
    let result = store.renew("slow", "a", stale, Duration::from_secs(30)).await;
    proxy.set(ProxyMode::Forward);
    assert!(matches!(result, Err(StoreError::Lost { .. })), "{result:?}");
    let row = fixture.store.observe("slow").await.unwrap().record.unwrap();
    assert_eq!(row.token, Some(grant.token), "nothing changed");
}

/// With create-table, a store on a database without the table creates it
/// at its first operation.
#[tokio::test]
async fn a_store_allowed_to_create_the_table_does_so_at_first_use() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(TABLE).await;
    let store = connect(&emulator, &config).await.with_create_table(true);
    let grant = store.acquire("first", "a", Duration::from_secs(30)).await.unwrap();
    assert_eq!(grant.term, 1);
}

/// Issue 13 item 8: the emulator restarts under three running electors
/// (every session, database and row is gone). Once the database is back,
/// stores with create-table open new sessions, create the table, and one
/// elector leads again; never two at once.
///
/// Bound, from the moment the database is back: the next attempt of each
/// follower comes within its error backoff (at most P), and that attempt
/// costs a new session, the table's DDL and an acquire (a few round trips
/// plus the emulator's DDL, which takes about a second). We allow
/// D + P + 5 s. The database comes back no sooner than R after the restart:
/// the restart lost the rows, so nothing but the old leader's own deadline
/// (t_send + R) can stop it claiming, as with any store that loses data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_lead_again_after_the_emulator_restarts() {
    let (d, r, p) = (
        Duration::from_secs(2),
        Duration::from_millis(1500),
        Duration::from_millis(300),
    );
    let bound = d + p + Duration::from_secs(5);
    let mut emulator = Emulator::start_own().unwrap_or_else(|e| panic!("{e}"));
    let config = emulator.create_named_database("restarted", TABLE).await;
    let timing = Timing::new(d, r, p, 0.1).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut electors = Vec::new();
    for i in 0..3 {
        let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), Duration::from_secs(1))
            .await
            .unwrap()
            .with_create_table(true);
        let elector = Elector::new("restart", Identity::new(None, None, format!("c{i}")), timing);
        electors.push(elector.spawn(Arc::new(store), shutdown.clone()));
    }
    let states: Vec<_> = electors.iter().map(|e| e.subscribe()).collect();
    let most_leaders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let (most, shutdown) = (most_leaders.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                let leaders = states.iter().filter(|s| s.borrow().leader).count();
                most.fetch_max(leaders, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let leader = async |within: Duration| {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(l) = electors.iter().find(|e| e.state().leader) {
                return Some((started.elapsed(), l.state()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    };
    let (_, before) = leader(Duration::from_secs(30)).await.expect("a first leader");
    tokio::time::sleep(d).await;
    let restarted_at = Instant::now();
    emulator = tokio::task::spawn_blocking(move || {
        emulator.restart().unwrap_or_else(|e| panic!("{e}"));
        emulator
    })
    .await
    .unwrap();
    tokio::time::sleep_until((restarted_at + r + Duration::from_millis(200)).into()).await;
    emulator.create_named_database("restarted", TABLE).await;
    let back = leader(bound).await;
    shutdown.cancel();
    watcher.await.unwrap();
    for elector in electors {
        elector.join().await;
    }
    let (took, after) = back.unwrap_or_else(|| panic!("no leader within {bound:?} after the database came back"));
    println!("a leader again {took:?} after the database came back");
    assert_eq!(
        most_leaders.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "never two leaders, always one at some point"
    );
    assert!(after.token > before.token, "tokens still increase");
}

/// The operator's reconcile against a Spanner store: the same store-side
/// scenario the unit tests run on the memory store.
#[tokio::test]
async fn the_operator_reconciles_a_lease_on_spanner() {
    let emulator = Emulator::start_or_connect();
    // A fresh database without the table: the reconcile must create it.
    let config = emulator.create_database("operator_leases").await;
    let store = SpannerStore::connect_to(config, emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap();
    assert!(store.observe("probe").await.is_err(), "no table before the reconcile");
    use leasehold::operator::testing::{StoreSide, store_side_scenario};
    store_side_scenario(StoreSide::single(Arc::new(store))).await;
}

/// A partitioned lease on Spanner: the reconcile creates the session tables,
/// shows the assignment from them, and collects a dead session's rows, never
/// a live one's.
#[tokio::test]
async fn the_operator_shows_partitions_and_collects_dead_sessions_on_spanner() {
    use leasehold::lease::SessionStore;
    use leasehold::lease::session::new_session_id;
    use leasehold::operator::metrics::Metrics;
    use leasehold::operator::reconcile::FINALIZER;
    use leasehold::operator::stores::SingleStore;
    use leasehold::operator::testing::{context_with, expect_pod_list, expect_status_apply, lease, pod, run_on};
    use serde_json::json;

    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database("operator_partitions").await;
    let store = Arc::new(
        SpannerStore::connect_to(config, emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
            .await
            .unwrap(),
    );
    let metrics = Arc::new(Metrics::new(&mut prometheus_client::registry::Registry::default()));
    let stores = Arc::new(SingleStore::with_sessions(store.clone()));
    let resource = lease(json!({"partitions": 4}), &[FINALIZER], None);

    // A fresh database: the reconcile creates the session tables and finds no members.
    let (ctx, server) = context_with(stores.clone(), metrics.clone());
    let echo = resource.clone();
    let result = run_on(ctx, server, resource.clone(), async move |server| {
        expect_pod_list(server, vec![pod("web-0", None, true)]).await;
        let status = expect_status_apply(server, echo).await;
        assert_eq!(
            (&status["partitions"]["members"], &status["partitions"]["unowned"]),
            (&json!(0), &json!(4))
        );
    })
    .await;
    result.unwrap();

    let names = |slot: u32, partitions: std::ops::Range<u32>| -> Vec<String> {
        std::iter::once(format!("prod/web/m/{slot}"))
            .chain(partitions.map(|i| format!("prod/web/p/{i}")))
            .collect()
    };
    let session = |pod: &str| new_session_id(&Identity::new(None, Some("prod".into()), pod), 1);
    let (live, dead) = (session("web-0"), session("web-1"));
    for (id, lease, held) in [
        (&live, Duration::from_secs(60), names(0, 0..2)),
        (&dead, Duration::from_secs(2), names(1, 2..4)),
    ] {
        store.open_session(id, "test", lease).await.unwrap();
        assert!(store.try_lock(id, &held).await.unwrap().busy.is_empty());
    }
    // The short session expires by the store's clock (D after its last take).
    leasehold::testing::conformance::sessions::wait_until_expired(&*store, &dead).await;

    let (ctx, server) = context_with(stores, metrics.clone());
    let echo = resource.clone();
    let shown = live.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, vec![pod("web-0", None, true), pod("web-1", None, true)]).await;
        let status = expect_status_apply(server, echo).await;
        assert_eq!(
            status["partitions"],
            json!({"count": 4, "members": 1, "unowned": 2, "balance": 0, "assignment": [
                {"holder": "web-0", "session": shown, "count": 2, "partitions": "0-1"},
            ]})
        );
    })
    .await;
    result.unwrap();
    assert_eq!(
        (metrics.collected_rows("sessions"), metrics.collected_rows("locks")),
        (1, 3),
        "the dead session, its slot and its two partitions"
    );
    assert_eq!(store.observe_session(&dead).await.unwrap().record, None);
    assert!(store.observe_session(&live).await.unwrap().is_live());
    let held = store.observe_locks(&names(0, 0..2)).await.unwrap();
    assert!(
        held.locks.iter().all(|l| l.holder.as_deref() == Some(live.as_str())),
        "{held:?}"
    );
}

/// Issue 16: a table created by a leasehold from before versions (no
/// `revision`, `version`) is refused with the fix by a store that may not
/// change it, never read as "no version"; `ensure_schema` adds the columns,
/// keeps the rows (read as no version recorded), and is idempotent.
#[tokio::test]
async fn a_table_from_before_versions_is_refused_then_upgraded_once() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database("before_versions").await;
    emulator.ddl(
        &config.database,
        "CREATE TABLE before_versions (shard INT64 NOT NULL, name STRING(MAX) NOT NULL, holder STRING(MAX), \
         term INT64 NOT NULL, token TIMESTAMP OPTIONS (allow_commit_timestamp=true), \
         renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true), lease_ms INT64 NOT NULL) PRIMARY KEY (shard, name)",
    )
    .await;
    leasehold_test_sql(
        &emulator,
        &config,
        &format!(
            "INSERT INTO before_versions (shard, name, holder, term, token, renewed_at, lease_ms) \
             VALUES ({}, @name, NULL, 4, PENDING_COMMIT_TIMESTAMP(), PENDING_COMMIT_TIMESTAMP(), 1000)",
            leasehold::store::shard_of("old")
        ),
        "old",
    )
    .await;
    let store = connect(&emulator, &config).await;
    let refused = store.observe("old").await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid { .. }), "{refused:?}");
    assert!(
        refused
            .chain()
            .contains("has no column revision INT64: add it (ALTER TABLE before_versions ADD COLUMN revision INT64)"),
        "{}",
        refused.chain()
    );
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap();
    let upgraded = connect(&emulator, &config).await;
    leasehold::testing::conformance::an_upgraded_table_keeps_its_row_and_records_versions(&upgraded).await;
}
