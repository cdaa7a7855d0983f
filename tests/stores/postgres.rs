//! The conformance suite on a private PostgreSQL server (one per test), plus
//! the PostgreSQL store's own behaviour: table creation, bad input, an
//! unreachable server, a cut connection.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::lease::{FencingToken, Grant, LeaseStore, StoreError};
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::testing::TcpProxy;
use leasehold::testing::conformance::{StoreCall, Target, with_replies_held_back};
use leasehold::testing::servers::{PostgresServer, TestCertificates, scratch_dir};

const TABLE: &str = "leasehold_leases";

struct Postgres {
    server: PostgresServer,
    store: PostgresStore,
}

fn config(url: String) -> PostgresConfig {
    PostgresConfig {
        url: StoreUrl::new(url),
        table: TABLE.into(),
    }
}

async fn postgres() -> Postgres {
    let server = PostgresServer::start();
    let store = PostgresStore::connect(config(server.url())).unwrap();
    store.ensure_schema().await.unwrap();
    Postgres { server, store }
}

/// Runs SQL on its own connection, as an operator with SQL access would.
async fn sql(server: &PostgresServer, statement: &str) -> u64 {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client.execute(statement, &[]).await.unwrap()
}

#[async_trait]
impl Target for Postgres {
    fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store.clone())
    }

    async fn delete_row(&self, lock: &str) {
        let deleted = sql(&self.server, &format!("DELETE FROM {TABLE} WHERE name = '{lock}'")).await;
        assert_eq!(deleted, 1);
    }

    /// The statement reaches the server through a proxy that holds
    /// replies back past the call timeout: it commits, its reply is lost.
    async fn with_lost_reply(
        &self,
        lock: &str,
        _holder: &str,
        _round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError> {
        let proxy = TcpProxy::start(self.server.addr()).await;
        let timeout = Duration::from_millis(500);
        let store: Arc<dyn LeaseStore> =
            Arc::new(PostgresStore::connect_with(config(self.server.url_at(proxy.addr)), timeout).unwrap());
        with_replies_held_back(&proxy, timeout, store, lock, call).await
    }
}

leasehold::conformance_tests!(postgres());

#[tokio::test]
async fn observe_many_reads_ten_thousand_locks_in_one_call() {
    leasehold::testing::conformance::observe_many_reads_ten_thousand_locks_in_one_call(&postgres().await).await;
}

#[tokio::test]
async fn ensure_schema_creates_the_table_once_and_is_idempotent() {
    let server = PostgresServer::start();
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: "custom_leases".into(),
    })
    .unwrap();
    let before = store.observe("x").await.unwrap_err();
    assert!(
        matches!(before, StoreError::Invalid { .. }),
        "a missing table is named, not retried: {before:?}"
    );
    assert!(before.chain().contains("custom_leases"), "{}", before.chain());
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap();
    let observed = store.observe("x").await.unwrap();
    assert!(observed.record.is_none());
    assert!(
        observed.now.0 > 1_600_000_000_000_000_000,
        "the server's clock, in nanoseconds since the epoch"
    );
    let grant = store.acquire("x", "a", Duration::from_secs(5)).await.unwrap();
    assert!(
        grant.token.0 >= observed.now.0 - 60_000_000_000,
        "the token sequence starts at the server's clock in nanoseconds: {} vs {}",
        grant.token,
        observed.now.0
    );
}

/// Two candidates creating the table at once: the later `CREATE TABLE IF NOT
/// EXISTS` cannot see the earlier one's uncommitted table, waits on the
/// catalog's unique index, and fails with SQLSTATE 23505 once it commits.
/// Played deterministically: another connection creates the table in an
/// open transaction, the store's statement is seen waiting on it, then the
/// transaction commits. `ensure_schema` must still succeed.
#[tokio::test]
async fn ensure_schema_succeeds_when_another_candidate_creates_the_table_at_the_same_time() {
    let server = PostgresServer::start();
    let (other, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    other
        .batch_execute(
            "BEGIN; CREATE TABLE racing_leases (shard BIGINT NOT NULL, name TEXT NOT NULL, holder TEXT, \
             term BIGINT NOT NULL, token BIGINT NOT NULL, renewed_at TIMESTAMPTZ NOT NULL, lease_ms BIGINT NOT NULL, \
             PRIMARY KEY (shard, name))",
        )
        .await
        .unwrap();
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: "racing_leases".into(),
    })
    .unwrap();
    let creating = tokio::spawn(async move { store.ensure_schema().await.map(|()| store) });
    // Until the store's CREATE TABLE waits on the open transaction's row
    // (seen from a third connection: inside a transaction pg_stat_activity
    // keeps the snapshot of its first read).
    let (watcher, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    loop {
        let waiting = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'CREATE TABLE IF NOT EXISTS racing_leases%'",
                &[],
            )
            .await
            .unwrap();
        if waiting.get::<_, i64>(0) == 1 {
            break;
        }
        if creating.is_finished() {
            panic!(
                "the store's CREATE TABLE never waited: {:?}",
                creating.await.unwrap().map(drop)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other.batch_execute("COMMIT").await.unwrap();
    let store = creating
        .await
        .unwrap()
        .expect("ensure_schema succeeds beside a concurrent creation");
    let grant = store.acquire("x", "a", Duration::from_secs(5)).await.unwrap();
    assert_eq!(grant.term, 1);
}

/// The sequence is the token source: dropping and recreating the table and
/// the sequence still hands out tokens above the earlier ones.
#[tokio::test]
async fn tokens_increase_across_a_dropped_and_recreated_table() {
    let fixture = postgres().await;
    let lease = Duration::from_secs(30);
    let first = fixture.store.acquire("drop", "a", lease).await.unwrap();
    sql(&fixture.server, &format!("DROP TABLE {TABLE}")).await;
    sql(&fixture.server, &format!("DROP SEQUENCE {TABLE}_token_seq")).await;
    fixture.store.ensure_schema().await.unwrap();
    let second = fixture.store.acquire("drop", "b", lease).await.unwrap();
    assert_eq!(second.term, 1, "a new table starts the terms again");
    assert!(second.token > first.token, "{} then {}", first.token, second.token);
}

#[tokio::test]
async fn the_row_carries_the_fnv_shard_in_its_key() {
    let fixture = postgres().await;
    fixture
        .store
        .acquire("prod/scheduler", "a", Duration::from_secs(30))
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(&fixture.server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(&format!("SELECT shard FROM {TABLE} WHERE name = 'prod/scheduler'"), &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), leasehold::store::shard_of("prod/scheduler"));
}

/// An expired lease is judged by the server's clock in the acquiring statement.
#[tokio::test]
async fn an_expired_lease_is_taken_and_a_renewal_after_it_is_lost() {
    let fixture = postgres().await;
    let short = Duration::from_millis(200);
    let a = fixture.store.acquire("expiry", "a", short).await.unwrap();
    tokio::time::sleep(short * 2).await;
    let b = fixture.store.acquire("expiry", "b", short).await.unwrap();
    assert_eq!(b.term, a.term + 1);
    assert!(b.token > a.token);
    let renewed = fixture.store.renew("expiry", "a", a.token, short).await;
    assert!(matches!(renewed, Err(StoreError::Lost { .. })), "{renewed:?}");
    let released = fixture.store.release("expiry", "b", FencingToken(b.token.0 + 1)).await;
    assert!(matches!(released, Err(StoreError::Lost { .. })), "{released:?}");
}

#[tokio::test]
async fn bad_urls_and_table_names_are_refused_before_connecting() {
    let err = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new("postgres://app:hunter2@db/x"),
        table: "leases; DROP".into(),
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid: table \"leases; DROP\" is not a valid PostgreSQL identifier (a letter, then letters, digits or '_', at most 48)"
    );
    let err = PostgresStore::connect(config(
        "postgres://app:hunter2@db/x?sslmode=verify-full&sslrootcert=/no/such/ca.pem".into(),
    ))
    .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }));
    assert!(
        err.chain()
            .contains("sslrootcert /no/such/ca.pem: cannot read CA certificates"),
        "{}",
        err.chain()
    );
    assert!(!err.chain().contains("hunter2"), "{}", err.chain());
}

/// Over TLS with the certificate checked against the server's CA, the
/// conformance basics hold; a CA that did not sign the certificate is refused.
#[tokio::test]
async fn tls_connects_and_checks_the_certificate() {
    let server = PostgresServer::start_tls();
    let store = PostgresStore::connect(config(server.tls_url())).unwrap();
    store.ensure_schema().await.unwrap();
    let other_ca = TestCertificates::write(&scratch_dir("pg-other-ca"));
    let wrong = server.tls_url().replace(
        &server.certificates.as_ref().unwrap().ca_file.display().to_string(),
        &other_ca.ca_file.display().to_string(),
    );
    let distrusting = PostgresStore::connect_with(config(wrong), Duration::from_secs(2)).unwrap();
    suite::tls_checks_the_certificate(&store, &distrusting).await;
}

/// TLS checks the server's host name: a certificate for 127.0.0.1 only
/// (signed by the CA the client trusts) is refused when the URL says
/// `localhost`.
#[tokio::test]
async fn tls_checks_the_servers_host_name() {
    let server = PostgresServer::start_tls_for(&["127.0.0.1"]);
    let covered = PostgresStore::connect(config(server.tls_url())).unwrap();
    covered.ensure_schema().await.unwrap();
    let by_name = server
        .tls_url()
        .replace(&server.addr().to_string(), &format!("localhost:{}", server.port));
    let uncovered = PostgresStore::connect_with(config(by_name), Duration::from_secs(2)).unwrap();
    suite::tls_checks_the_host_name(&covered, &uncovered).await;
}

/// A TLS URL against a server that does not speak TLS fails, saying so;
/// nothing falls back to plain text.
#[tokio::test]
async fn tls_to_a_server_without_tls_fails_clearly() {
    let fixture = postgres().await;
    let ca = TestCertificates::write(&scratch_dir("pg-no-tls"));
    let url = format!(
        "postgres://leasehold@{}/postgres?sslmode=verify-full&sslrootcert={}",
        fixture.server.addr(),
        ca.ca_file.display()
    );
    let store = PostgresStore::connect_with(config(url), Duration::from_secs(2)).unwrap();
    let err = store.observe("x").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.chain().contains("server does not support TLS"), "{}", err.chain());
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_promptly() {
    // Reserved, so no other test's server listens there meanwhile.
    let reserved = leasehold::testing::reserve_port([127, 0, 0, 1].into());
    let port = reserved.port;
    let store = PostgresStore::connect_with(
        config(format!("postgres://leasehold@127.0.0.1:{port}/postgres")),
        Duration::from_secs(2),
    )
    .unwrap();
    suite::an_unreachable_server_is_unavailable_promptly(&store).await;
}

#[tokio::test]
async fn a_cut_connection_is_not_success_and_the_lease_survives_it() {
    let fixture = postgres().await;
    let proxy = TcpProxy::start(fixture.server.addr()).await;
    let store = PostgresStore::connect_with(config(fixture.server.url_at(proxy.addr)), Duration::from_secs(1)).unwrap();
    let grant = suite::a_cut_connection_is_not_success(&store, &proxy, &fixture.store).await;
    // The pool replaces the broken connection.
    store
        .renew("cut", "a", grant.token, Duration::from_secs(30))
        .await
        .expect("renews again once the connection is back");
}

/// A row whose stored lease duration or term is out of range is refused,
/// never read as an expired (0 ms) lease or a wrapped term.
#[tokio::test]
async fn a_row_with_an_out_of_range_duration_or_term_is_refused() {
    let fixture = postgres().await;
    fixture
        .store
        .acquire("bad-row", "a", Duration::from_secs(30))
        .await
        .unwrap();
    for (column, stored) in [
        ("lease_ms", "0"),
        ("lease_ms", "-1"),
        ("lease_ms", "999999999999"),
        ("term", "-3"),
    ] {
        let restore = fixture.store.observe("bad-row").await.unwrap().record.unwrap();
        sql(
            &fixture.server,
            &format!("UPDATE {TABLE} SET {column} = {stored} WHERE name = 'bad-row'"),
        )
        .await;
        let observed = fixture.store.observe("bad-row").await.unwrap_err();
        assert!(matches!(observed, StoreError::Invalid { .. }), "{observed:?}");
        assert!(
            observed
                .to_string()
                .contains(&format!("row \"bad-row\" holds {column} = {stored}")),
            "{observed}"
        );
        sql(
            &fixture.server,
            &format!(
                "UPDATE {TABLE} SET lease_ms = {}, term = {} WHERE name = 'bad-row'",
                restore.lease_duration.as_millis(),
                restore.term
            ),
        )
        .await;
        fixture
            .store
            .observe("bad-row")
            .await
            .expect("a corrected row reads again");
    }
}

/// Issue 16: a table created by a leasehold from before versions (no
/// `revision`, `version`) makes acquire fail as invalid with the fix, never
/// answer without the column; `ensure_schema` adds the columns, keeps the
/// rows (read as no version recorded), and is idempotent.
#[tokio::test]
async fn a_table_from_before_versions_is_refused_then_upgraded_once() {
    let fixture = postgres().await;
    sql(
        &fixture.server,
        &format!("ALTER TABLE {TABLE} DROP COLUMN revision, DROP COLUMN version"),
    )
    .await;
    let grant = fixture.store.acquire("old", "a", Duration::from_secs(30)).await;
    let refused = grant.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid { .. }), "{refused:?}");
    assert!(
        refused
            .chain()
            .contains("SQLSTATE 42703 (the table predates a column this leasehold needs"),
        "{}",
        refused.chain()
    );
    let observed = fixture.store.observe("old").await.unwrap_err();
    assert!(matches!(observed, StoreError::Invalid { .. }), "{observed:?}");
    sql(
        &fixture.server,
        &format!(
            "INSERT INTO {TABLE} (shard, name, holder, term, token, renewed_at, lease_ms) \
             VALUES ({}, 'old', NULL, 4, 1, clock_timestamp(), 1000)",
            leasehold::store::shard_of("old")
        ),
    )
    .await;
    fixture.store.ensure_schema().await.unwrap();
    fixture.store.ensure_schema().await.unwrap();
    leasehold::testing::conformance::an_upgraded_table_keeps_its_row_and_records_versions(&fixture.store).await;
}

/// Issue 25: a follower learns of a release from the release statement's
/// NOTIFY, not from its poll.
#[tokio::test]
async fn a_release_wakes_a_waiting_follower_by_notify() {
    let fixture = postgres().await;
    let follower = PostgresStore::connect(config(fixture.server.url())).unwrap();
    suite::a_release_wakes_a_waiting_follower(Arc::new(fixture.store.clone()), Arc::new(follower)).await;
}

/// Issue 54: a store is known by what it is, not by its URL. Another role
/// with its own password on the same database, and the same server through
/// another address (localhost for 127.0.0.1), read the same identity;
/// another database of the same server reads another. The documented limit
/// (docs/migrating-stores.md): a server started from a physical copy of
/// another's data directory (as these test servers are, from one template)
/// shares its system identifier, so the same database there reads the same
/// identity.
#[tokio::test]
async fn the_identity_names_the_server_and_database_not_the_url() {
    let pg = postgres().await;
    let identity = |url: String| async move { PostgresStore::connect(config(url)).unwrap().identity().await.unwrap() };
    let ours = identity(pg.server.url()).await;
    assert!(
        ours.as_str().starts_with("postgres:") && ours.as_str().ends_with("/postgres/public"),
        "{ours}"
    );

    sql(&pg.server, "CREATE ROLE rotated LOGIN PASSWORD 'new-secret'").await;
    let rotated = pg.server.url().replace("leasehold@", "rotated:new-secret@");
    assert_eq!(identity(rotated).await, ours, "another credential, same store");
    let by_name = pg.server.url().replace("127.0.0.1", "localhost");
    assert_eq!(identity(by_name).await, ours, "another address, same store");

    sql(&pg.server, "CREATE DATABASE other").await;
    let other = identity(pg.server.url().replace("/postgres?", "/other?")).await;
    assert_ne!(other, ours, "another database is another store");
    let copy = PostgresServer::start();
    assert_eq!(
        identity(copy.url()).await,
        ours,
        "a copy of the data directory shares the identifier"
    );
}
