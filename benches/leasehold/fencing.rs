//! The `fencing` part: what a fenced write (`leasehold::fence`) costs beside
//! the plain write it guards, on a private PostgreSQL, a private Redis and
//! the Spanner emulator; the `fencing-kubernetes` part does the same for a
//! ConfigMap under the chart's fencing admission policy on a real cluster. Latency p50/p99 directly; round trips counted as
//! latency / [`REPLY_DELAY`] through a proxy that holds every reply back by
//! it (as the `store-ops` part does).

use std::time::{Duration, Instant};

use google_cloud_spanner::client::DatabaseClient;
use google_cloud_spanner::mutation::Mutation;
use leasehold::fence::{Fence, FenceError};
use leasehold::lease::FencingToken;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use leasehold::testing::{Emulator, ProxyMode, TcpProxy};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{REPLY_DELAY, millis, one_worker_runtime, quantile};
use crate::cluster::{DeleteOnDrop, Env, apply, rendered_fencing_policy, wait_for};

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

/// The ConfigMap the Kubernetes part writes, in a namespace the chart's
/// fencing policy selects (fenced) and in one it does not (plain).
struct ConfigMapWriter {
    fenced: Api<ConfigMap>,
    plain: Api<ConfigMap>,
    written: u64,
}

/// Who the Kubernetes part writes as: the holder its fenced writes name (an
/// impersonated user, so the policy's writer is known).
const KUBERNETES_WRITER: &str = "leasehold-bench-writer";
const FENCED_NAMESPACE: &str = "bench-fencing";
const PLAIN_NAMESPACE: &str = "bench-fencing-plain";

impl ConfigMapWriter {
    /// `client` acting as [`KUBERNETES_WRITER`].
    fn new(client: Client) -> ConfigMapWriter {
        ConfigMapWriter {
            fenced: Api::namespaced(client.clone(), FENCED_NAMESPACE),
            plain: Api::namespaced(client, PLAIN_NAMESPACE),
            written: 0,
        }
    }

    /// A real change each time: the owner counts the writes.
    fn owner(&mut self) -> String {
        self.written += 1;
        format!("bench-{}", self.written)
    }
}

impl Resource for ConfigMapWriter {
    async fn plain(&mut self) {
        let patch = json!({"data": {"owner": self.owner()}});
        self.plain
            .patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// The write docs/fencing.md shows: the token and the writer beside the
    /// change, judged by the API server's admission policy.
    async fn fenced(&mut self, fence: &Fence) -> Result<(), FenceError> {
        let patch = json!({
            "metadata": {"annotations": {
                "leasehold.dev/fencing-token": fence.token().0.to_string(),
                "leasehold.dev/fencing-holder": KUBERNETES_WRITER,
            }},
            "data": {"owner": self.owner()},
        });
        self.fenced
            .patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        Ok(())
    }
}

/// A client of the cluster acting as [`KUBERNETES_WRITER`] (with the rights
/// of system:masters), at `server` when given (the delaying proxy).
async fn writer_client(env: &Env, server: Option<std::net::SocketAddr>) -> Client {
    let mut config = env
        .impersonating(KUBERNETES_WRITER, &["system:masters", "system:authenticated"], None)
        .await;
    if let Some(server) = server {
        // The API server's certificate names 127.0.0.1, where the proxy listens.
        config.cluster_url = format!("https://{server}").parse().unwrap();
    }
    Client::try_from(config).unwrap()
}

/// The `fencing-kubernetes` part: a ConfigMap patch under the chart's
/// fencing ValidatingAdmissionPolicy (the API server evaluates it on every
/// write) beside the same change in a namespace the policy does not select,
/// on the end-to-end suite's cluster (docs/e2e.md).
pub fn kubernetes_writes(reps: u64) -> Vec<String> {
    let n = reps.max(2) * 10;
    one_worker_runtime().block_on(async {
        let env = Env::from_vars();
        let admin = env.client().await;
        let (policy, policy_name) = rendered_fencing_policy(&env, &[]);
        let _cleanup = DeleteOnDrop {
            env: env.clone(),
            namespace: None,
            objects: vec![
                ("validatingadmissionpolicybinding", policy_name.clone()),
                ("validatingadmissionpolicy", policy_name),
                ("namespace", FENCED_NAMESPACE.to_string()),
                ("namespace", PLAIN_NAMESPACE.to_string()),
            ],
        };
        let token = "1764000000000000100";
        let config_map = |namespace: &str, annotations: Value| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "orders", "namespace": namespace, "annotations": annotations},
                   "data": {"owner": "bench-0"}})
        };
        apply(
            &admin,
            &[
                json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": FENCED_NAMESPACE, "labels": {"leasehold.dev/fencing": "enabled"}}}),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLAIN_NAMESPACE}}),
                config_map(
                    FENCED_NAMESPACE,
                    json!({"leasehold.dev/fencing-lock": "kubernetes:orders",
                           "leasehold.dev/fencing-token": token,
                           "leasehold.dev/fencing-holder": KUBERNETES_WRITER}),
                ),
                config_map(PLAIN_NAMESPACE, json!({})),
            ],
        )
        .await;
        apply(&admin, &policy).await;
        // In force once a lower token is refused (a dry run, which passes
        // admission and changes nothing).
        let direct = writer_client(&env, None).await;
        let fenced: Api<ConfigMap> = Api::namespaced(direct.clone(), FENCED_NAMESPACE);
        let lower = json!({"metadata": {"annotations": {"leasehold.dev/fencing-token": "1"}}});
        let dry_run = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        wait_for("the fencing policy in force", Duration::from_secs(60), || async {
            fenced.patch("orders", &dry_run, &Patch::Merge(&lower)).await.err()
        })
        .await;

        let proxy = TcpProxy::start(api_server_addr(&env).await).await;
        let mut direct = ConfigMapWriter::new(direct);
        let mut delayed = ConfigMapWriter::new(writer_client(&env, Some(proxy.addr)).await);
        // Once before timing: the delayed client's connection and TLS handshake.
        delayed.plain().await;
        compare("kubernetes", &mut direct, &mut delayed, &proxy, n).await
    })
}

/// The API server's address, from the kubeconfig.
async fn api_server_addr(env: &Env) -> std::net::SocketAddr {
    let url = env.config().await.cluster_url;
    format!("{}:{}", url.host().unwrap(), url.port_u16().unwrap_or(443))
        .parse()
        .unwrap_or_else(|e| panic!("the API server {url} is not at an IP address: {e}"))
}
