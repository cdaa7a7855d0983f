//! The `operator-scale` part (issue 39): the operator at N DistributedLeases
//! on one store and table, each with 3 candidate pods held Pending by a
//! scheduling gate, D/R/P 15/10/2 s. The operator runs as a host process
//! (`leasehold operator --watch-namespace`, no leader election) against a
//! disposable control-plane-only cluster named by LEASEHOLD_BENCH_KUBECONFIG
//! (no node is needed: the pods never run). Per store (PostgreSQL on a
//! private server, the Kubernetes store), per N (LEASEHOLD_BENCH_SCALE_LEASES,
//! default 1000,10000) and per build (this one, or the one LEASEHOLD_BENCH_BINARY
//! names, and LEASEHOLD_BENCH_BEFORE_BINARY when set), it reports:
//! * the time from the first object created until every lease has a status;
//! * at rest, over LEASEHOLD_BENCH_SECONDS: the operator's RSS and CPU (from
//!   /proc), its reconciles per second (its own metrics), the store's reads
//!   (PostgreSQL: committed transactions per second from `pg_stat_database`;
//!   the Kubernetes store: Lease requests a minute) and the API requests a
//!   minute beyond a baseline without any operator (the API server's own
//!   `apiserver_request_total` of clients other than its components, WATCH
//!   excluded);
//! * the status latency after a holder change, p50/p99: the bench itself
//!   acquires, then releases, a sample of locks through the library's store
//!   port, which the operator cannot tell from sidecars doing it.
//!
//! Each configuration gets a namespace of its own, left in place (its
//! finalizers need an operator): the cluster is meant to be thrown away.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use leasehold::api::DistributedLease;
use leasehold::lease::{FencingToken, Identity, LeaseStore};
use leasehold::store::kubernetes::KubernetesStore;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::store::{DEFAULT_TABLE, StoreUrl};
use leasehold::testing::servers::PostgresServer;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

use crate::millis;

/// P of every lease here; D/R/P 15/10/2 s.
const P: Duration = Duration::from_secs(2);
/// Objects created at once.
const IN_FLIGHT: usize = 16;
/// Locks whose holder the bench changes, per pattern (back to back, spaced).
const SAMPLE: usize = 200;
/// Between two holder changes of the spaced pattern: 10 a second.
const SPACING: Duration = Duration::from_millis(100);

struct Build {
    name: &'static str,
    binary: PathBuf,
}

pub fn operator_scale(seconds: u64) -> Vec<String> {
    let kubeconfig = std::env::var_os("LEASEHOLD_BENCH_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "operator-scale needs a disposable cluster: set LEASEHOLD_BENCH_KUBECONFIG to its kubeconfig \
             (a control plane alone will do, e.g. /work/shared/tools/kubernetes/start.sh DIR --no-node \
             --api-port 6445 prints DIR/kubeconfig)"
            )
        });
    let mut builds = vec![Build {
        name: "this build",
        binary: crate::support::binary().into(),
    }];
    if let Some(before) = std::env::var_os("LEASEHOLD_BENCH_BEFORE_BINARY") {
        builds.push(Build {
            name: "before",
            binary: before.into(),
        });
    }
    let counts = std::env::var("LEASEHOLD_BENCH_SCALE_LEASES").unwrap_or_else(|_| "1000,10000".into());
    let stores = std::env::var("LEASEHOLD_BENCH_SCALE_STORES").unwrap_or_else(|_| "postgres,kubernetes".into());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let config = Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("LEASEHOLD_BENCH_KUBECONFIG"),
            &Default::default(),
        )
        .await
        .expect("a client configuration from LEASEHOLD_BENCH_KUBECONFIG");
        let client = Client::try_from(config).expect("a Kubernetes client");
        crate::cluster::apply(&client, &crate::cluster::crds()).await;
        let baseline = api_baseline(&client, seconds).await;
        println!("baseline without an operator: {baseline:.0} API requests a minute");
        let mut lines = Vec::new();
        for n in counts.split(',').filter_map(|n| n.trim().parse::<usize>().ok()) {
            for store in stores.split(',').map(str::trim) {
                for build in &builds {
                    let figures = one(&client, &kubeconfig, build, store, n, seconds, baseline).await;
                    println!("{figures}");
                    lines.push(figures);
                }
            }
        }
        lines
    })
}

/// API requests a minute (all but WATCH) over `seconds` with no operator.
async fn api_baseline(client: &Client, seconds: u64) -> f64 {
    let before = api_requests(client).await;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = api_requests(client).await;
    per_minute(after.total - before.total, seconds)
}

fn per_minute(count: f64, seconds: u64) -> f64 {
    count * 60.0 / seconds as f64
}

/// The API server's `apiserver_request_total`, summed over the requests of
/// clients it does not name (its `system_client` label names only its own
/// components and kubectl: this leaves the operator and the bench) for a
/// resource (not /metrics or /healthz), all verbs but WATCH (counted when a
/// watch ends); and of those the requests for Leases.
struct ApiRequests {
    total: f64,
    leases: f64,
}

async fn api_requests(client: &Client) -> ApiRequests {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.expect("the API server's /metrics");
    let mut counted = ApiRequests {
        total: 0.0,
        leases: 0.0,
    };
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let others = line.contains("system_client=\"\"") && !line.contains("resource=\"\"");
        if !others || line.contains("verb=\"WATCH\"") {
            continue;
        }
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        counted.total += value;
        if line.contains("resource=\"leases\"") {
            counted.leases += value;
        }
    }
    counted
}

/// The operator: a host process watching one namespace, ended when dropped.
struct Operator {
    child: Child,
    /// Where it serves /metrics.
    port: u16,
}

impl Operator {
    fn start(binary: &Path, kubeconfig: &Path, namespace: &str, log: &Path) -> Operator {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = std::fs::File::create(log).expect("the operator's log");
        let child = Command::new(binary)
            .args(["operator", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--leader-election", "false", "--watch-namespace", namespace])
            .env("KUBECONFIG", kubeconfig)
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        Operator { child, port }
    }

    /// Reconciles so far, every outcome.
    fn reconciles(&self) -> f64 {
        let (status, text) =
            crate::support::get_text(self.port, "/metrics").unwrap_or_else(|e| panic!("the operator's /metrics: {e}"));
        assert_eq!(status, 200, "the operator's /metrics: {text}");
        text.lines()
            .filter(|l| l.starts_with("leasehold_operator_reconciles_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One store, N and build: creates the namespace's objects, runs the
/// operator, measures.
async fn one(
    client: &Client,
    kubeconfig: &Path,
    build: &Build,
    store: &str,
    n: usize,
    seconds: u64,
    baseline: f64,
) -> String {
    let tag = if build.name == "before" { "before" } else { "this" };
    let ns = format!("scale-{store}-{tag}-{n}-{}", crate::rand_suffix());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
    // The ServiceAccount admission refuses pods until the namespace's
    // default ServiceAccount exists, which kube-controller-manager creates.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    crate::cluster::wait_for("the default ServiceAccount", Duration::from_secs(60), || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok().flatten() }
    })
    .await;
    let server = (store == "postgres").then(PostgresServer::start);
    let spec_store = match &server {
        Some(server) => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
            let secret = json!({"metadata": {"name": "db"}, "stringData": {"url": server.url()}});
            secrets
                .create(&PostParams::default(), &serde_json::from_value(secret).unwrap())
                .await
                .expect("the store URL's Secret");
            json!({"postgres": {"urlSecretRef": {"name": "db", "key": "url"}}})
        }
        None => json!({"kubernetes": {}}),
    };
    let log = std::env::temp_dir().join(format!("leasehold-bench-{ns}-operator.log"));
    let operator = Operator::start(&build.binary, kubeconfig, &ns, &log);
    let leases: Api<DistributedLease> = Api::namespaced(client.clone(), &ns);
    let statuses = Statuses::watch(leases.clone());

    // Creation: the pods of a lease, then the lease.
    let created = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let (pods, leases, spec_store) = (pods.clone(), leases.clone(), spec_store.clone());
            async move {
                for k in 0..3 {
                    pods.create(&PostParams::default(), &serde_json::from_value(pod(i, k)).unwrap())
                        .await
                        .unwrap_or_else(|e| panic!("creating pod c-{i}-{k}: {e}"));
                }
                leases
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(lease(i, &spec_store)).unwrap(),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("creating lease l-{i}: {e}"));
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
    let creation = created.elapsed();
    let everyone = Duration::from_secs(600) + Duration::from_millis(n as u64 * 100);
    crate::cluster::wait_for(&format!("{n} statuses"), everyone, || async {
        (statuses.len() == n).then_some(())
    })
    .await;
    let all_status = created.elapsed();

    // At rest: after the operator settled, `seconds` of nothing changing.
    tokio::time::sleep(P * 5).await;
    let pid = operator.child.id();
    let database = match &server {
        Some(server) => Some(Database::connect(server).await),
        None => None,
    };
    let (reconciles0, api0, (_, cpu0)) = (operator.reconciles(), api_requests(client).await, crate::usage(pid));
    let commits0 = match &database {
        Some(db) => db.commits().await,
        None => 0.0,
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (reconciles1, api1, (rss, cpu1)) = (operator.reconciles(), api_requests(client).await, crate::usage(pid));
    let commits1 = match &database {
        Some(db) => db.commits().await,
        None => 0.0,
    };
    let secs = seconds as f64;
    let rest = format!(
        "at rest over {seconds} s: RSS {:.1} MiB, CPU {:.1} % of a core, {:.2} reconciles/s, {}, API requests {:.0}/min \
         beyond the baseline ({:.0}/min of them for Leases)",
        rss as f64 / 1024.0,
        (cpu1 - cpu0) / secs * 100.0,
        (reconciles1 - reconciles0) / secs,
        match &database {
            // The bench's own two reads of the statistics are 2 of them.
            Some(_) => format!(
                "PostgreSQL {:.1} transactions/s",
                (commits1 - commits0 - 2.0).max(0.0) / secs
            ),
            None => "store reads: the Lease requests below".to_string(),
        },
        per_minute(api1.total - api0.total, seconds) - baseline,
        per_minute(api1.leases - api0.leases, seconds),
    );

    println!(
        "{store}, {n} leases, {}: every status {:.1} s after the first object; {rest}",
        build.name,
        all_status.as_secs_f64()
    );

    // Holder changes on a sample, through the store port.
    let port: Arc<dyn LeaseStore> = match &server {
        Some(server) => Arc::new(
            PostgresStore::connect(PostgresConfig {
                url: StoreUrl::new(server.url()),
                table: DEFAULT_TABLE.to_string(),
            })
            .expect("the bench's PostgreSQL store"),
        ),
        None => Arc::new(KubernetesStore::new(client.clone(), Some(&ns))),
    };
    // The columns this build writes, added to a table an older operator made.
    port.ensure_schema()
        .await
        .unwrap_or_else(|e| panic!("the bench's table: {}", e.chain()));
    // Two samples of the leases, interleaved: one changed back to back (a
    // burst: every status write queues behind the others), one with
    // [`SPACING`] between changes (how holders change in a fleet).
    let step = (n / (2 * SAMPLE)).max(1);
    let every = |offset: usize| -> Vec<usize> { (offset..n).step_by(2 * step).take(SAMPLE).collect() };
    let burst = holder_changes(&*port, &ns, &statuses, &every(0), Duration::ZERO).await;
    let spaced = holder_changes(&*port, &ns, &statuses, &every(step), SPACING).await;
    drop(operator);
    format!(
        "{store}, {n} leases, {} ({}): every status {:.1} s after the first object (creating them took {:.1} s); {rest}; \
         status after a holder change: {burst} back to back; {spaced} {} ms apart",
        build.name,
        build.binary.display(),
        all_status.as_secs_f64(),
        creation.as_secs_f64(),
        SPACING.as_millis(),
    )
}

/// Acquires, then releases, each lock of `sample` through the store port,
/// `spacing` apart, and measures how long each change takes to show in the
/// lease's status: "after an acquire p50 … p99 …, after a release …".
async fn holder_changes(
    port: &dyn LeaseStore,
    ns: &str,
    statuses: &Statuses,
    sample: &[usize],
    spacing: Duration,
) -> String {
    // Each identity once: a new one carries a new nonce.
    let holders: HashMap<usize, String> = sample
        .iter()
        .map(|&i| {
            (
                i,
                Identity::new(None, Some(ns.to_string()), format!("c-{i}-0")).to_string(),
            )
        })
        .collect();
    let holder = |i: usize| holders[&i].clone();
    let shown = |i: usize, want: Option<String>| {
        let statuses = statuses.shown.clone();
        move || {
            statuses
                .lock()
                .unwrap()
                .get(&format!("l-{i}"))
                .is_some_and(|s| s.0 == want)
        }
    };
    let mut acquired = HashMap::new();
    for &i in sample {
        let grant = port
            // Long enough not to expire before the release below.
            .acquire(&format!("{ns}/l-{i}"), &holder(i), Duration::from_secs(600))
            .await
            .unwrap_or_else(|e| panic!("acquiring l-{i}: {}", e.chain()));
        acquired.insert(i, (Instant::now(), grant.token));
        tokio::time::sleep(spacing).await;
    }
    let mut taken = latencies(statuses, sample, &acquired, |i| shown(i, Some(holder(i)))).await;
    let mut released = HashMap::new();
    for &i in sample {
        let token: FencingToken = acquired[&i].1;
        port.release(&format!("{ns}/l-{i}"), &holder(i), token)
            .await
            .unwrap_or_else(|e| panic!("releasing l-{i}: {}", e.chain()));
        released.insert(i, (Instant::now(), token));
        tokio::time::sleep(spacing).await;
    }
    let mut freed = latencies(statuses, sample, &released, |i| shown(i, None)).await;
    format!(
        "after an acquire p50 {:.0} ms p99 {:.0} ms, after a release p50 {:.0} ms p99 {:.0} ms ({} locks)",
        millis(quantile(&mut taken, 0.5)),
        millis(quantile(&mut taken, 0.99)),
        millis(quantile(&mut freed, 0.5)),
        millis(quantile(&mut freed, 0.99)),
        sample.len(),
    )
}

/// For each sampled lease, from its change to the first status event that
/// `shown(i)` accepts, polled every 20 ms from the watch's cache.
async fn latencies<F: Fn() -> bool>(
    statuses: &Statuses,
    sample: &[usize],
    changed: &HashMap<usize, (Instant, FencingToken)>,
    shown: impl Fn(usize) -> F,
) -> Vec<Duration> {
    let mut waiting: Vec<(usize, F)> = sample.iter().map(|&i| (i, shown(i))).collect();
    let mut samples = Vec::new();
    let deadline = Instant::now() + P * 5 + Duration::from_secs(60);
    while !waiting.is_empty() {
        if Instant::now() >= deadline {
            // Counted as the whole wait, so the quantiles show it.
            println!(
                "{} statuses had not followed the change within {:?}",
                waiting.len(),
                P * 5 + Duration::from_secs(60)
            );
            samples.extend(waiting.iter().map(|_| P * 5 + Duration::from_secs(60)));
            break;
        }
        waiting.retain(|(i, done)| {
            if done() {
                let seen = statuses.seen(*i);
                samples.push(seen.saturating_duration_since(changed[i].0));
                false
            } else {
                true
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    samples
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// Each lease's shown holder, and when the watch last saw its status change.
type Shown = HashMap<String, (Option<String>, Instant)>;

/// The statuses of a namespace's leases, from a watch.
struct Statuses {
    shown: Arc<Mutex<Shown>>,
    _watch: AbortOnDropHandle<()>,
}

impl Statuses {
    fn watch(leases: Api<DistributedLease>) -> Statuses {
        let shown: Arc<Mutex<Shown>> = Arc::default();
        let into = shown.clone();
        let task = tokio::spawn(async move {
            let events = watcher(leases, watcher::Config::default()).applied_objects();
            let mut events = std::pin::pin!(events);
            while let Ok(Some(lease)) = events.try_next().await {
                let Some(status) = lease.status.as_ref().filter(|s| s.observed_generation.is_some()) else {
                    continue;
                };
                let name = lease.metadata.name.clone().unwrap_or_default();
                let mut shown = into.lock().unwrap();
                let now = Instant::now();
                let entry = shown.entry(name).or_insert((status.holder.clone(), now));
                if entry.0 != status.holder {
                    *entry = (status.holder.clone(), now);
                }
            }
        });
        Statuses {
            shown,
            _watch: AbortOnDropHandle::new(task),
        }
    }

    fn len(&self) -> usize {
        self.shown.lock().unwrap().len()
    }

    fn seen(&self, i: usize) -> Instant {
        self.shown.lock().unwrap()[&format!("l-{i}")].1
    }
}

/// The statistics of the PostgreSQL server the leases are on.
struct Database {
    client: tokio_postgres::Client,
    _connection: AbortOnDropHandle<()>,
}

impl Database {
    async fn connect(server: &PostgresServer) -> Database {
        let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .expect("the bench's connection to PostgreSQL");
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Database {
            client,
            _connection: AbortOnDropHandle::new(task),
        }
    }

    /// Transactions committed in the database so far.
    async fn commits(&self) -> f64 {
        // Statistics reach pg_stat_database when a backend reports them
        // (at most about once a second): read them fresh.
        self.client
            .query_one("SELECT pg_stat_clear_snapshot()", &[])
            .await
            .expect("pg_stat_clear_snapshot");
        let row = self
            .client
            .query_one(
                "SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .expect("pg_stat_database");
        row.get(0)
    }
}

fn pod(i: usize, k: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("c-{i}-{k}"), "labels": {"app": format!("l-{i}")}},
        "spec": {
            "schedulingGates": [{"name": "leasehold.dev/bench-hold"}],
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    })
}

fn lease(i: usize, store: &Value) -> Value {
    json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": format!("l-{i}")},
        "spec": {
            "store": store,
            "leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s",
            "selector": {"matchLabels": {"app": format!("l-{i}")}},
        },
    })
}
