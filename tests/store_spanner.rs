//! The conformance suite on the real Cloud Spanner emulator, each test on a
//! database of its own, plus the Spanner store's own behaviour: table
//! creation, bad names, missing databases, an unreachable emulator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold::lease::{Grant, LeaseStore, StoreError};
use leasehold::store::conformance::Target;
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, Endpoints, SpannerConfig, SpannerStore};
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
    async fn acquire_with_lost_reply(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant, StoreError> {
        let target: SocketAddr = self.emulator.host.parse().unwrap();
        let proxy = TcpProxy::start(target).await;
        let endpoints = Endpoints {
            data: Some(format!("http://{}", proxy.addr)),
            admin: Some(self.emulator.rest.clone()),
        };
        let delay = Duration::from_millis(500);
        for round_trips in [2.5, 3.5, 2.5, 4.5] {
            let store = SpannerStore::connect_to(self.config.clone(), endpoints.clone(), delay.mul_f64(round_trips))
                .await
                .unwrap();
            proxy.set(ProxyMode::DelayReplies(delay));
            let result = store.acquire(lock, holder, lease).await;
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
    assert!(err.to_string().contains("nosuchdb"), "{err}");
}

#[tokio::test]
async fn an_unreachable_emulator_is_unavailable_promptly() {
    let port = leasehold::testing::free_port();
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
    let grant = store.acquire("cut", "a", Duration::from_secs(30)).await.unwrap();
    proxy.set(ProxyMode::Cut);
    let err = store
        .renew("cut", "a", grant.token, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable { .. } | StoreError::OutcomeUnknown { .. }),
        "{err:?}"
    );
    proxy.set(ProxyMode::Forward);
    let observed = fixture.store.observe("cut").await.unwrap();
    assert_eq!(observed.live_holder(), Some("a"), "the store still has the lease");
}
