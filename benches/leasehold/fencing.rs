//! The `fencing` part: what a fenced write (`leasehold::fence`) costs beside
//! the plain write it guards, on a private PostgreSQL, a private Redis and
//! the Spanner emulator. Latency p50/p99 directly; round trips counted as
//! latency / [`REPLY_DELAY`] through a proxy that holds every reply back by
//! it (as the `store-ops` part does).

use std::time::{Duration, Instant};

use google_cloud_spanner::client::DatabaseClient;
use google_cloud_spanner::mutation::Mutation;
use leasehold::fence::{Fence, FenceError};
use leasehold::lease::FencingToken;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use leasehold::testing::{Emulator, ProxyMode, TcpProxy};

use super::{REPLY_DELAY, millis, one_worker_runtime, quantile};

/// One guarded value written plainly or through a fence.
trait Resource {
    async fn plain(&mut self);
    async fn fenced(&mut self, fence: &Fence) -> Result<(), FenceError>;
}

struct Postgres(tokio_postgres::Client);

const UPSERT: &str =
    "INSERT INTO orders (id, owner) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner";

impl Postgres {
    async fn connect(url: &str) -> Postgres {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        Postgres(client)
    }
}

impl Resource for Postgres {
    async fn plain(&mut self) {
        self.0.execute(UPSERT, &[&"bench"]).await.unwrap();
    }

    async fn fenced(&mut self, fence: &Fence) -> Result<(), FenceError> {
        leasehold::fence::postgres::fenced(
            &mut self.0,
            leasehold::fence::postgres::DEFAULT_TABLE,
            fence,
            async |tx| tx.execute(UPSERT, &[&"bench"]).await.map(drop),
        )
        .await
    }
}

struct Redis(redis::aio::MultiplexedConnection);

const REDIS_KEY: &str = "orders:{orders}:owner";

impl Redis {
    async fn connect(url: String) -> Redis {
        Redis(
            redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        )
    }
}

impl Resource for Redis {
    async fn plain(&mut self) {
        let () = redis::cmd("SET")
            .arg(REDIS_KEY)
            .arg("bench")
            .query_async(&mut self.0)
            .await
            .unwrap();
    }

    async fn fenced(&mut self, fence: &Fence) -> Result<(), FenceError> {
        leasehold::fence::redis::fenced(&mut self.0, fence, &[(REDIS_KEY, b"bench")]).await
    }
}

struct Spanner(DatabaseClient);

fn order() -> Mutation {
    Mutation::new_insert_or_update_builder("orders")
        .set("id")
        .to(1_i64)
        .set("owner")
        .to("bench")
        .build()
}

impl Resource for Spanner {
    /// The same mutation committed by a read-write transaction of its own.
    async fn plain(&mut self) {
        self.0
            .read_write_transaction()
            .build()
            .run(async |tx: google_cloud_spanner::transaction::ReadWriteTransaction| {
                tx.buffer(std::iter::once(order()))
            })
            .await
            .unwrap();
    }

    async fn fenced(&mut self, fence: &Fence) -> Result<(), FenceError> {
        leasehold::fence::spanner::fenced(&self.0, leasehold::fence::spanner::DEFAULT_TABLE, fence, vec![order()]).await
    }
}

/// Times `n` plain and `n` fenced writes (alternating) on `resource`.
async fn timed(resource: &mut impl Resource, fence: &Fence, n: u64) -> [Vec<Duration>; 2] {
    let (mut plain, mut fenced) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let started = Instant::now();
        resource.plain().await;
        plain.push(started.elapsed());
        let started = Instant::now();
        resource.fenced(fence).await.unwrap();
        fenced.push(started.elapsed());
    }
    plain.sort();
    fenced.sort();
    [plain, fenced]
}

/// The store's lines: p50/p99 of `direct`, round trips through `delayed`
/// (reached through `proxy`).
async fn compare(
    store: &str,
    direct: &mut impl Resource,
    delayed: &mut impl Resource,
    proxy: &TcpProxy,
    n: u64,
) -> Vec<String> {
    let fence = Fence::new(store, "orders", FencingToken(1_764_000_000_000_000_100)).unwrap();
    // Once each before timing: the fence row, a cached script, a warm session.
    direct.plain().await;
    direct.fenced(&fence).await.unwrap();
    let latency = timed(direct, &fence, n).await;
    proxy.set(ProxyMode::DelayReplies(REPLY_DELAY));
    let delayed = timed(delayed, &fence, 5).await;
    proxy.set(ProxyMode::Forward);
    ["plain", "fenced"]
        .into_iter()
        .zip(latency.iter().zip(&delayed))
        .map(|(kind, (latency, delayed))| {
            let median = quantile(delayed, 0.5);
            let line = format!(
                "{store} {kind} write: n={} p50 {:.2} ms, p99 {:.2} ms; {:.0} round trips (median {median:.0} ms with every reply {} ms late, n={})",
                latency.len(),
                quantile(latency, 0.5),
                quantile(latency, 0.99),
                (median / millis(REPLY_DELAY)).floor(),
                millis(REPLY_DELAY),
                delayed.len()
            );
            println!("{line}");
            line
        })
        .collect()
}

pub fn fenced_writes(reps: u64) -> Vec<String> {
    let n = reps.max(2) * 10;
    let runtime = one_worker_runtime();
    let mut lines = Vec::new();

    let postgres = PostgresServer::start();
    lines.extend(runtime.block_on(async {
        let mut direct = Postgres::connect(&postgres.url()).await;
        leasehold::fence::postgres::ensure_table(&direct.0, leasehold::fence::postgres::DEFAULT_TABLE)
            .await
            .unwrap();
        direct
            .0
            .batch_execute("CREATE TABLE orders (id INT PRIMARY KEY, owner TEXT NOT NULL)")
            .await
            .unwrap();
        let proxy = TcpProxy::start(postgres.addr()).await;
        let mut delayed = Postgres::connect(&postgres.url_at(proxy.addr)).await;
        compare("postgres", &mut direct, &mut delayed, &proxy, n).await
    }));

    let redis = RedisServer::start();
    lines.extend(runtime.block_on(async {
        let mut direct = Redis::connect(redis.url()).await;
        let proxy = TcpProxy::start(redis.addr()).await;
        let mut delayed = Redis::connect(redis.url_at(proxy.addr)).await;
        compare("redis", &mut direct, &mut delayed, &proxy, n).await
    }));

    let emulator = Emulator::start_or_connect();
    lines.extend(runtime.block_on(async {
        use google_cloud_lro::Poller;
        let config = emulator.create_database(leasehold::store::DEFAULT_TABLE).await;
        let spanner = |host: String| async move {
            google_cloud_spanner::client::Spanner::builder()
                .with_endpoint(format!("http://{host}"))
                .build()
                .await
                .unwrap()
        };
        let admin = spanner(emulator.host.clone()).await;
        admin
            .database_admin_builder()
            .with_endpoint(emulator.rest.clone())
            .build()
            .await
            .unwrap()
            .update_database_ddl()
            .set_database(config.database.clone())
            .set_statements([
                leasehold::fence::spanner::create_table_statement(leasehold::fence::spanner::DEFAULT_TABLE).unwrap(),
                "CREATE TABLE orders (id INT64 NOT NULL, owner STRING(MAX) NOT NULL) PRIMARY KEY (id)".to_string(),
            ])
            .poller()
            .until_done()
            .await
            .unwrap();
        let mut direct = Spanner(admin.database_client(config.database.clone()).build().await.unwrap());
        let proxy = TcpProxy::start(emulator.host.parse().unwrap()).await;
        let mut delayed = Spanner(
            spanner(proxy.addr.to_string())
                .await
                .database_client(config.database.clone())
                .build()
                .await
                .unwrap(),
        );
        compare("spanner", &mut direct, &mut delayed, &proxy, n).await
    }));
    lines
}
