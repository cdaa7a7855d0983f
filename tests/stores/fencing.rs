//! Fenced writes (`leasehold::fence`) on real servers: a leader elected
//! through the lease store writes; it pauses past its lease duration; a new
//! leader is elected with a higher token and writes; the deposed leader
//! resumes and writes with its old token. The resource refuses it with an
//! error naming both tokens, and keeps the new leader's write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::fence::{Fence, FenceError};
use leasehold::lease::{Grant, LeaseStore, StoreError};
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::store::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerStore};
use leasehold::testing::Emulator;
use leasehold::testing::servers::{PostgresServer, RedisServer};

const LOCK: &str = "orders";
/// The lease duration D of both leaders.
const LEASE: Duration = Duration::from_secs(1);

/// Something a leader writes to through a fence: one value it overwrites.
trait Resource {
    async fn write(&mut self, fence: &Fence, value: &str) -> Result<(), FenceError>;
    async fn read(&mut self) -> String;
}

/// The scenario of the module docs, on `store` (which issued the tokens) and
/// `resource`.
async fn a_deposed_leader_is_refused(store: Arc<dyn LeaseStore>, resource: &mut impl Resource) {
    let fence = |grant: &Grant| Fence::new(store.kind(), LOCK, grant.token).unwrap();
    let old = store.acquire(LOCK, "leader-a", LEASE).await.unwrap();
    resource.write(&fence(&old), "leader-a").await.unwrap();

    // leader-a pauses (renews nothing); leader-b campaigns until the store
    // finds leader-a's lease expired, by the store's clock.
    let give_up = Instant::now() + 10 * LEASE;
    let new = loop {
        match store.acquire(LOCK, "leader-b", LEASE).await {
            Ok(grant) => break grant,
            Err(StoreError::Lost { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(LEASE / 10).await;
            }
            Err(e) => panic!(
                "leader-b was not elected within {:?} of leader-a's lease: {e}",
                10 * LEASE
            ),
        }
    };
    assert!(new.token > old.token, "{} then {}", old.token, new.token);
    resource.write(&fence(&new), "leader-b").await.unwrap();
    resource
        .write(&fence(&new), "leader-b")
        .await
        .expect("the same leader writes again with the same token");

    let refused = resource.write(&fence(&old), "leader-a").await.unwrap_err();
    match &refused {
        FenceError::Stale {
            offered, seen, lock, ..
        } => {
            assert_eq!((*offered, *seen, lock.as_str()), (old.token, new.token, LOCK));
        }
        other => panic!("expected a stale-token refusal, got {other}"),
    }
    let message = refused.to_string();
    assert!(
        message.contains(&format!("fencing token {} is older than {}", old.token, new.token)),
        "{message}"
    );
    assert_eq!(resource.read().await, "leader-b", "the new leader's write stays");
}

// --- PostgreSQL ---------------------------------------------------------------

struct PostgresOrders(tokio_postgres::Client);

impl Resource for PostgresOrders {
    async fn write(&mut self, fence: &Fence, value: &str) -> Result<(), FenceError> {
        leasehold::fence::postgres::fenced(
            &mut self.0,
            leasehold::fence::postgres::DEFAULT_TABLE,
            fence,
            async |tx| {
                tx.execute(
                    "INSERT INTO orders (id, owner) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner",
                    &[&value],
                )
                .await
                .map(drop)
            },
        )
        .await
    }

    async fn read(&mut self) -> String {
        self.0
            .query_one("SELECT owner FROM orders WHERE id = 1", &[])
            .await
            .unwrap()
            .get(0)
    }
}

#[tokio::test]
async fn postgres_refuses_a_deposed_leaders_write() {
    let server = PostgresServer::start();
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: leasehold::store::DEFAULT_TABLE.into(),
    })
    .unwrap();
    store.ensure_schema().await.unwrap();
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    leasehold::fence::postgres::ensure_table(&client, leasehold::fence::postgres::DEFAULT_TABLE)
        .await
        .unwrap();
    client
        .batch_execute("CREATE TABLE orders (id INT PRIMARY KEY, owner TEXT NOT NULL)")
        .await
        .unwrap();
    a_deposed_leader_is_refused(Arc::new(store), &mut PostgresOrders(client)).await;
}

// --- Redis --------------------------------------------------------------------

struct RedisOrders(redis::aio::MultiplexedConnection);

/// The guarded key, in the fence key's hash slot.
const REDIS_KEY: &str = "orders:{orders}:owner";

impl Resource for RedisOrders {
    async fn write(&mut self, fence: &Fence, value: &str) -> Result<(), FenceError> {
        leasehold::fence::redis::fenced(&mut self.0, fence, &[(REDIS_KEY, value.as_bytes())]).await
    }

    async fn read(&mut self) -> String {
        redis::cmd("GET").arg(REDIS_KEY).query_async(&mut self.0).await.unwrap()
    }
}

#[tokio::test]
async fn redis_refuses_a_deposed_leaders_write() {
    let server = RedisServer::start();
    let store = RedisStore::connect(RedisConfig {
        url: StoreUrl::new(server.url()),
        prefix: DEFAULT_PREFIX.into(),
    })
    .unwrap();
    store.ensure_schema().await.unwrap();
    let connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut orders = RedisOrders(connection);
    a_deposed_leader_is_refused(Arc::new(store), &mut orders).await;

    let fence = Fence::new("redis", LOCK, leasehold::lease::FencingToken(i64::MAX)).unwrap();
    let outside = leasehold::fence::redis::fenced(&mut orders.0, &fence, &[("orders:owner", b"x")])
        .await
        .unwrap_err();
    assert_eq!(
        outside.to_string(),
        "key \"orders:owner\" does not share the hash tag {orders} of the fence; put {orders} in it"
    );
    assert_eq!(orders.read().await, "leader-b", "a refused key list writes nothing");
}

// --- Spanner ------------------------------------------------------------------

struct SpannerOrders(google_cloud_spanner::client::DatabaseClient);

impl Resource for SpannerOrders {
    async fn write(&mut self, fence: &Fence, value: &str) -> Result<(), FenceError> {
        let write = google_cloud_spanner::mutation::Mutation::new_insert_or_update_builder("orders")
            .set("id")
            .to(1_i64)
            .set("owner")
            .to(value)
            .build();
        leasehold::fence::spanner::fenced(&self.0, leasehold::fence::spanner::DEFAULT_TABLE, fence, vec![write]).await
    }

    async fn read(&mut self) -> String {
        let statement =
            google_cloud_spanner::statement::Statement::builder("SELECT owner FROM orders WHERE id = 1").build();
        let mut rows = self.0.single_use().build().execute_query(statement).await.unwrap();
        let row = rows.next().await.expect("the order row").unwrap();
        row.get("owner").unwrap()
    }
}

#[tokio::test]
async fn spanner_refuses_a_deposed_leaders_write() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(leasehold::store::DEFAULT_TABLE).await;
    let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap();
    store.ensure_schema().await.unwrap();
    let fence_table =
        leasehold::fence::spanner::create_table_statement(leasehold::fence::spanner::DEFAULT_TABLE).unwrap();
    emulator.ddl(&config.database, &fence_table).await;
    emulator
        .ddl(
            &config.database,
            "CREATE TABLE orders (id INT64 NOT NULL, owner STRING(MAX) NOT NULL) PRIMARY KEY (id)",
        )
        .await;
    let spanner = emulator.client().await;
    let database = spanner.database_client(config.database.clone()).build().await.unwrap();
    a_deposed_leader_is_refused(Arc::new(store), &mut SpannerOrders(database)).await;
}

// --- The example, on each store ---------------------------------------------

/// Runs `crates/leasehold-kubernetes/examples/fenced-write.rs` on `store` with `env` naming the server.
/// The example checks its own outcome: it fails unless the deposed leader's
/// write is refused and the new one stays.
fn the_example_runs(store: &str, env: &[(&str, &str)]) {
    let example = crate::support::example::built_example("fenced-write");
    let output = std::process::Command::new(&example)
        .arg(store)
        .envs(env.iter().copied())
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} {store}: {}\n{stdout}\n{}",
        example.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("a wakes up and writes: fencing token") && stdout.contains("order 1 is still b's"),
        "{stdout}"
    );
}

#[test]
fn the_example_refuses_a_deposed_leaders_write_to_postgres() {
    let server = PostgresServer::start();
    the_example_runs("postgres", &[("DATABASE_URL", &server.url())]);
}

#[test]
fn the_example_refuses_a_deposed_leaders_write_to_redis() {
    let server = RedisServer::start();
    the_example_runs("redis", &[("REDIS_URL", &server.url())]);
}

#[tokio::test]
async fn the_example_refuses_a_deposed_leaders_write_to_spanner() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(leasehold::store::DEFAULT_TABLE).await;
    the_example_runs(
        "spanner",
        &[
            ("SPANNER_EMULATOR_HOST", &emulator.host),
            ("SPANNER_EMULATOR_REST", &emulator.rest),
            ("SPANNER_DATABASE", &config.database),
        ],
    );
}
