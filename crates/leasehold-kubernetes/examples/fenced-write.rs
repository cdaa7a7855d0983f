//! A fenced write per store: the resource refuses a deposed leader's write.
//! Leader `a` is elected through the store's lease and writes the owner of
//! order 1; it stalls past its lease; `b` is elected with a higher token and
//! writes; `a` wakes up and writes with its old token, and the store refuses
//! it (`leasehold_stores::fence`), keeping `b`'s write. The example checks that
//! outcome itself and fails when either half does not hold.
//!
//! ```sh
//! DATABASE_URL=postgres://user:password@localhost/db cargo run -p leasehold-kubernetes --example fenced-write -- postgres
//! REDIS_URL=redis://localhost:6379 cargo run -p leasehold-kubernetes --example fenced-write -- redis
//! SPANNER_DATABASE=projects/p/instances/i/databases/d cargo run -p leasehold-kubernetes --example fenced-write -- spanner
//! FENCING_NAMESPACE=my-app FENCING_SERVICE_ACCOUNT=default cargo run -p leasehold-kubernetes --example fenced-write -- kubernetes
//! ```
//!
//! (For the Spanner emulator also set `SPANNER_EMULATOR_HOST` and
//! `SPANNER_EMULATOR_REST`, its admin gateway.) The lease store and the
//! written-to resource are the same server here; they need not be.
//!
//! `kubernetes` writes ConfigMap `order-1` in `FENCING_NAMESPACE`, a
//! namespace the chart's fencing admission policy covers (`helm install …
//! --set fencing.enabled=true`, the namespace labelled
//! `leasehold.dev/fencing=enabled`; docs/fencing.md), and the API server
//! refuses the stale write. The policy binds a write to its writer: in a
//! cluster each leader is a pod whose ServiceAccount token carries its pod
//! name; here leaders `a` and `b` are played by impersonating
//! `FENCING_SERVICE_ACCOUNT` with pod names `a` and `b`, so the kubeconfig
//! (`KUBECONFIG`) must be allowed to impersonate, and that account to get
//! and patch ConfigMaps there. The lease is a Lease in the same namespace.

use std::collections::HashMap;
use std::error::Error;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

use leasehold_core::lease::{FencingToken, Grant, LeaseStore, StoreError};
use leasehold_stores::fence::{Fence, FenceError};
use leasehold_stores::{DEFAULT_TABLE, StoreUrl};

const LOCK: &str = "orders";
const LEASE: Duration = Duration::from_secs(1);

type Failure = Box<dyn Error>;

/// Order 1's owner, written through a fence on one resource.
trait Orders {
    /// The guarded write, in one atomic step with the fence's advance.
    async fn write_owner(&mut self, fence: &Fence, owner: &str) -> Result<(), FenceError>;
    async fn owner(&mut self) -> Result<String, Failure>;
}

// --- PostgreSQL: the guarded statements run in the fence's transaction ------

struct PostgresOrders(tokio_postgres::Client);

impl PostgresOrders {
    async fn connect(url: &str) -> Result<Self, Failure> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        leasehold_stores::fence::postgres::ensure_table(&client, leasehold_stores::fence::postgres::DEFAULT_TABLE)
            .await?;
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY, owner TEXT NOT NULL)")
            .await?;
        Ok(PostgresOrders(client))
    }
}

impl Orders for PostgresOrders {
    async fn write_owner(&mut self, fence: &Fence, owner: &str) -> Result<(), FenceError> {
        leasehold_stores::fence::postgres::fenced(
            &mut self.0,
            leasehold_stores::fence::postgres::DEFAULT_TABLE,
            fence,
            async |tx| {
                tx.execute(
                "INSERT INTO orders (id, owner) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner",
                &[&owner],
            )
            .await
            .map(drop)
            },
        )
        .await
    }

    async fn owner(&mut self) -> Result<String, Failure> {
        Ok(self
            .0
            .query_one("SELECT owner FROM orders WHERE id = 1", &[])
            .await?
            .get(0))
    }
}

// --- Redis: one script compares the fence key and sets the guarded keys -----

/// The guarded key carries the lock as its hash tag, `{orders}`, so Redis
/// Cluster keeps it in the fence key's slot.
const REDIS_KEY: &str = "orders:{orders}:owner";

struct RedisOrders(redis::aio::MultiplexedConnection);

impl Orders for RedisOrders {
    async fn write_owner(&mut self, fence: &Fence, owner: &str) -> Result<(), FenceError> {
        leasehold_stores::fence::redis::fenced(&mut self.0, fence, &[(REDIS_KEY, owner.as_bytes())]).await
    }

    async fn owner(&mut self) -> Result<String, Failure> {
        Ok(redis::cmd("GET").arg(REDIS_KEY).query_async(&mut self.0).await?)
    }
}

// --- Spanner: the fence row is read, compared and written in the mutations' transaction

struct SpannerOrders(google_cloud_spanner::client::DatabaseClient);

impl SpannerOrders {
    /// Creates the fence table and the orders table when missing, with the
    /// database's DDL (the REST admin endpoint: `SPANNER_EMULATOR_REST` on
    /// the emulator, Google's otherwise).
    async fn connect(database: &str) -> Result<Self, Failure> {
        use google_cloud_lro::Poller;
        let spanner = google_cloud_spanner::client::Spanner::builder().build().await?;
        let mut admin = spanner.database_admin_builder();
        if let Some(endpoint) = leasehold_stores::spanner::Endpoints::from_env().admin {
            admin = admin.with_endpoint(endpoint);
        }
        let fences =
            leasehold_stores::fence::spanner::create_table_statement(leasehold_stores::fence::spanner::DEFAULT_TABLE)?
                .replacen("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1);
        admin
            .build()
            .await?
            .update_database_ddl()
            .set_database(database)
            .set_statements([
                fences,
                "CREATE TABLE IF NOT EXISTS orders (id INT64 NOT NULL, owner STRING(MAX) NOT NULL) PRIMARY KEY (id)"
                    .to_string(),
            ])
            .poller()
            .until_done()
            .await?;
        Ok(SpannerOrders(spanner.database_client(database).build().await?))
    }
}

impl Orders for SpannerOrders {
    async fn write_owner(&mut self, fence: &Fence, owner: &str) -> Result<(), FenceError> {
        let write = google_cloud_spanner::mutation::Mutation::new_insert_or_update_builder("orders")
            .set("id")
            .to(1_i64)
            .set("owner")
            .to(owner)
            .build();
        leasehold_stores::fence::spanner::fenced(
            &self.0,
            leasehold_stores::fence::spanner::DEFAULT_TABLE,
            fence,
            vec![write],
        )
        .await
    }

    async fn owner(&mut self) -> Result<String, Failure> {
        let statement =
            google_cloud_spanner::statement::Statement::builder("SELECT owner FROM orders WHERE id = 1").build();
        let mut rows = self.0.single_use().build().execute_query(statement).await?;
        let row = rows.next().await.ok_or("order 1 is missing")??;
        Ok(row.get("owner")?)
    }
}

// --- Kubernetes: the API server refuses, by the chart's admission policy --

/// The fenced object: order 1, a ConfigMap.
const CONFIG_MAP: &str = "order-1";

/// ConfigMaps as the leader pod `pod` writes them: its ServiceAccount with
/// the pod name a bound ServiceAccount token carries
/// (`authentication.kubernetes.io/pod-name` in userInfo.extra, Kubernetes
/// pkg/serviceaccount/claims.go), which the policy takes as the writer.
async fn as_pod(namespace: &str, account: &str, pod: &str) -> Result<Api<ConfigMap>, Failure> {
    let mut config = kube::Config::infer().await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{account}"));
    config.auth_info.impersonate_groups = Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]);
    config.auth_info.impersonate_user_extra = Some(HashMap::from([(
        "authentication.kubernetes.io/pod-name".to_string(),
        vec![pod.to_string()],
    )]));
    Ok(Api::namespaced(kube::Client::try_from(config)?, namespace))
}

/// The leader's write: its data with the fence's lock, its token and itself
/// as holder, in one merge patch (docs/fencing.md shows the same patch).
async fn write_config_map(orders: &Api<ConfigMap>, token: FencingToken, pod: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {
            "leasehold.dev/fencing-lock": format!("kubernetes:{LOCK}"),
            "leasehold.dev/fencing-token": token.to_string(),
            "leasehold.dev/fencing-holder": pod,
        }},
        "data": {"owner": pod},
    });
    orders
        .patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// The scenario below with the API server as the resource: `a`'s stale
/// write is refused by the fencing policy, with both tokens in its message.
async fn api_server_refuses_deposed_leader(namespace: &str, account: &str) -> Result<(), Failure> {
    let client = kube::Client::try_default().await?;
    let store = leasehold_kubernetes::store::KubernetesStore::new(client.clone(), Some(namespace));
    store.ensure_schema().await?;
    // The object exists before any leader writes; its first fenced write
    // adds the token (the policy judges UPDATEs of objects carrying one).
    let empty: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": CONFIG_MAP}}))?;
    match Api::<ConfigMap>::namespaced(client, namespace)
        .create(&PostParams::default(), &empty)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let (as_a, as_b) = (
        as_pod(namespace, account, "a").await?,
        as_pod(namespace, account, "b").await?,
    );

    let a = store.acquire(LOCK, "a", LEASE).await?;
    write_config_map(&as_a, a.token, "a").await?;
    println!("a leads with token {} and writes", a.token);
    let b = elected_after_a_stalls(&store).await?;
    write_config_map(&as_b, b.token, "b").await?;
    println!("b leads with token {} and writes", b.token);

    match write_config_map(&as_a, a.token, "a").await {
        Err(kube::Error::Api(refused))
            if refused.message.contains(&a.token.to_string()) && refused.message.contains(&b.token.to_string()) =>
        {
            println!("a wakes up and writes: the API server refuses it: {}", refused.message)
        }
        other => return Err(format!("a's stale write was not refused naming both tokens: {other:?}").into()),
    }
    let stored = as_b.get(CONFIG_MAP).await?;
    let owner = stored.data.unwrap_or_default().remove("owner").unwrap_or_default();
    let token = stored
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("leasehold.dev/fencing-token");
    if owner != "b" || token != Some(b.token.to_string()) {
        return Err(format!(
            "order 1 should still be b's with token {}, but it is {owner:?} with {token:?}",
            b.token
        )
        .into());
    }
    println!("order 1 is still b's: owner = {owner}");
    store.release(LOCK, "b", b.token).await?;
    Ok(())
}

// --- The scenario, the same on every store ---------------------------------

/// `a` stalls and renews nothing; `b` campaigns until `a`'s lease has
/// expired by the store's clock (a bounded wait: ten lease durations).
async fn elected_after_a_stalls(store: &dyn LeaseStore) -> Result<Grant, Failure> {
    let mut attempts = 0;
    loop {
        match store.acquire(LOCK, "b", LEASE).await {
            Ok(grant) => return Ok(grant),
            Err(StoreError::Lost { .. }) if attempts < 40 => {
                attempts += 1;
                tokio::time::sleep(LEASE / 4).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `a` writes, stalls past its lease, `b` is elected and writes, `a`'s write
/// with its old token is refused and `b`'s stays.
async fn deposed_leader_is_refused(store: &dyn LeaseStore, orders: &mut impl Orders) -> Result<(), Failure> {
    store.ensure_schema().await?;
    // The fence names the store that issued the token: tokens of different
    // stores are not comparable.
    let fence = |token: FencingToken| Fence::new(store.kind(), LOCK, token);

    let a = store.acquire(LOCK, "a", LEASE).await?;
    orders.write_owner(&fence(a.token)?, "a").await?;
    println!("a leads with token {} and writes", a.token);

    let b = elected_after_a_stalls(store).await?;
    orders.write_owner(&fence(b.token)?, "b").await?;
    println!("b leads with token {} and writes", b.token);

    match orders.write_owner(&fence(a.token)?, "a").await {
        Err(refused @ FenceError::Stale { .. }) => println!("a wakes up and writes: {refused}"),
        other => return Err(format!("a's stale write was not refused: {other:?}").into()),
    }
    let owner = orders.owner().await?;
    if owner != "b" {
        return Err(format!("order 1 should still be b's, but its owner is {owner:?}").into());
    }
    println!("order 1 is still b's: owner = {owner}");
    store.release(LOCK, "b", b.token).await?;
    Ok(())
}

fn env(name: &str, what: &str) -> Result<String, Failure> {
    std::env::var(name).map_err(|_| format!("set {name} to {what}").into())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let store = std::env::args().nth(1).unwrap_or_default();
    match store.as_str() {
        "postgres" => {
            use leasehold_stores::postgres::{PostgresConfig, PostgresStore};
            let url = env("DATABASE_URL", "a PostgreSQL URL")?;
            let store = PostgresStore::connect(PostgresConfig {
                url: StoreUrl::new(url.clone()),
                table: DEFAULT_TABLE.into(),
            })?;
            deposed_leader_is_refused(&store, &mut PostgresOrders::connect(&url).await?).await
        }
        "redis" => {
            use leasehold_stores::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
            let url = env("REDIS_URL", "a Redis URL")?;
            let store = RedisStore::connect(RedisConfig {
                url: StoreUrl::new(url.clone()),
                prefix: DEFAULT_PREFIX.into(),
            })?;
            let connection = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
            deposed_leader_is_refused(&store, &mut RedisOrders(connection)).await
        }
        "spanner" => {
            use leasehold_stores::spanner::{SpannerConfig, SpannerStore};
            let database = env("SPANNER_DATABASE", "projects/<p>/instances/<i>/databases/<d>")?;
            let store = SpannerStore::connect(SpannerConfig {
                database: database.clone(),
                table: DEFAULT_TABLE.into(),
            })
            .await?;
            deposed_leader_is_refused(&store, &mut SpannerOrders::connect(&database).await?).await
        }
        "kubernetes" => {
            let namespace = env("FENCING_NAMESPACE", "a namespace the chart's fencing policy covers")?;
            let account = env("FENCING_SERVICE_ACCOUNT", "the ServiceAccount the leaders write as")?;
            api_server_refuses_deposed_leader(&namespace, &account).await
        }
        other => Err(format!("which store? postgres, redis, spanner or kubernetes, not {other:?}").into()),
    }
}
