//! leasehold's benchmarks, one command: `cargo bench --bench leasehold`.
//! Starts its own Cloud Spanner emulator (see README) and sidecar processes,
//! prints every raw figure and a summary; BENCHMARKS.md records a run.
//!
//! LEASEHOLD_BENCH_REPS (default 20) and LEASEHOLD_BENCH_SECONDS (default 60)
//! scale it down for a quick look; LEASEHOLD_BENCH_ONLY (comma-separated part
//! names: crash, term, handover, nudge, store-cost, store-ops, footprint, many-locks,
//! postgres, redis, sessions, sessions-postgres, sessions-redis, rollout, rollout-process, partitions,
//! partitions-postgres, partitions-redis, clusters, clusters-postgres, clusters-redis, fencing, fencing-kubernetes,
//! kubernetes, operator-scale, fenced-workload) runs a share of it. `postgres` and `redis` start
//! private servers as the tests do and measure failover, handover, renew
//! latency and store operations per minute there; LEASEHOLD_BENCH_LOCKS
//! (default 1000,10000) says how many locks the sessions part holds;
//! LEASEHOLD_BENCH_ROLLOUTS (default 5) how many whole-process rollouts the
//! `rollout-process` part runs per leadership setting. LEASEHOLD_BENCH_BINARY
//! runs the process parts against another build of `leasehold` (a before
//! figure with the same harness and settings).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "leasehold/sessions.rs"]
mod sessions;

#[path = "leasehold/clusters.rs"]
mod clusters;
#[path = "leasehold/fencing.rs"]
mod fencing;
#[path = "leasehold/partitions.rs"]
mod partitions;
#[path = "leasehold/rollout_process.rs"]
mod rollout_process;

// The end-to-end suite's harness, for the kubernetes part; not every helper
// the scenarios use is used here.
#[allow(dead_code)]
#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[path = "leasehold/counting_proxy.rs"]
mod counting_proxy;
#[allow(dead_code)]
#[path = "../tests/e2e/fenced_workload.rs"]
mod fenced_workload;
#[path = "leasehold/fenced_workload.rs"]
mod fenced_workload_part;
#[allow(dead_code)]
#[path = "../tests/e2e/fixtures.rs"]
mod fixtures;
#[path = "leasehold/kubernetes.rs"]
mod kubernetes;
#[allow(dead_code)]
#[path = "../tests/e2e/node.rs"]
mod node;
#[path = "leasehold/operator_scale.rs"]
mod operator_scale;
#[allow(dead_code)]
#[path = "../tests/e2e/stores.rs"]
mod stores;
#[allow(dead_code)]
#[path = "../tests/e2e/watcher.rs"]
mod watcher;
/// Where the harness's files name each other: the suite's `e2e` module.
mod e2e {
    pub(crate) use super::{cluster, fixtures, node, stores, watcher};
}

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::lease::{Elector, Identity, LeaseStore, Timing};
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerStore};
use leasehold::testing::servers::{PostgresServer, RedisServer};
use leasehold::testing::{Emulator, ProxyMode, TcpProxy};
use support::*;
use tokio_util::sync::CancellationToken;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// min, median, p90, max in ms.
fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    format!(
        "n={} min {:.1} ms, median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        samples.len(),
        millis(samples[0]),
        millis(at(0.5)),
        millis(at(0.9)),
        millis(samples[samples.len() - 1])
    )
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn rand_suffix() -> String {
    format!(
        "{:06x}",
        std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64 ^ 0x5eed
    )
}

/// Signals the leader of the Spanner cluster `reps` times and measures until
/// another leads.
fn handovers(reps: u64, lock: &str, signal: &str, what: &str) -> Vec<Duration> {
    let mut cluster = cluster(lock);
    let (emulator, config) = (&cluster.emulator, &cluster.config);
    timed_handovers(&mut cluster.sidecars, reps, signal, what, |i, proxy| {
        let name = format!("pod-{i}-{}", rand_suffix());
        Sidecar::start(&name, emulator, config, proxy, lock, &[])
    })
}

/// Signals the leader among `sidecars` `reps` times and measures until
/// another leads, replacing the signalled process each time by
/// `restart(i, its proxy)` (a new identity on the same proxy).
fn timed_handovers(
    sidecars: &mut [Sidecar],
    reps: u64,
    signal: &str,
    what: &str,
    restart: impl Fn(usize, TcpProxy) -> Sidecar,
) -> Vec<Duration> {
    let mut samples = Vec::new();
    for rep in 0..reps {
        let all: Vec<&Sidecar> = sidecars.iter().collect();
        let Some(leader) = wait_for_one_leader(&all, Duration::from_secs(30)) else {
            eprintln!("{what} rep {rep}: no leader; skipped");
            continue;
        };
        // Let the followers settle into polling.
        std::thread::sleep(P * 2);
        sidecars[leader].signal(signal);
        let signalled = Instant::now();
        let rest = others(sidecars, leader);
        match wait_for_one_leader(&rest, D * 3) {
            Some(_) => {
                let took = signalled.elapsed();
                println!("{what} rep {rep}: {:.0} ms", millis(took));
                samples.push(took);
            }
            None => eprintln!("{what} rep {rep}: no new leader within 3 D"),
        }
        let _ = sidecars[leader].child.wait();
        let fresh = restart(leader, sidecars[leader].proxy.clone());
        let _ = std::mem::replace(&mut sidecars[leader], fresh);
    }
    samples
}

/// The elector alone on the memory store: release, then the followers are
/// nudged (what the pod watch does in a cluster).
fn nudged_handover_in_process(reps: u64) -> Vec<Duration> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Arc::new(leasehold::store::MemoryStore::default());
        let timing = Timing::new(D, R, P, 0.1).unwrap();
        let mut samples = Vec::new();
        for rep in 0..reps {
            let shutdown = CancellationToken::new();
            let lock = format!("nudge-{rep}");
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    Elector::new(&lock, Identity::new(None, None, format!("c{i}")), timing)
                        .spawn(store.clone(), shutdown.clone())
                })
                .collect();
            let leader = loop {
                if let Some(i) = handles.iter().position(|h| h.state().leader) {
                    break i;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            tokio::time::sleep(P).await;
            let started = Instant::now();
            handles[leader].set_campaigning(false);
            let mut released = handles[leader].subscribe();
            let _ = released.wait_for(|s| s.holder.is_none()).await;
            for (i, h) in handles.iter().enumerate() {
                if i != leader {
                    h.nudge();
                }
            }
            loop {
                if handles.iter().enumerate().any(|(i, h)| i != leader && h.state().leader) {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            samples.push(started.elapsed());
            shutdown.cancel();
            for h in handles {
                h.join().await;
            }
        }
        samples
    })
}

/// Counter values from a sidecar's /metrics.
fn store_calls(sidecar: &Sidecar) -> BTreeMap<String, f64> {
    let (_, text) = get_text(sidecar.metrics, "/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("leasehold_store_calls_total{"))
        .filter_map(|l| {
            let op = l.split('"').nth(1)?.to_string();
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some((op, value))
        })
        .collect()
}

/// The sidecar's default timing (15s/10s/2s), overriding the tests' short one.
fn default_timing_flags() -> [String; 6] {
    [
        "--lease-duration",
        "15s",
        "--renew-deadline",
        "10s",
        "--retry-period",
        "2s",
    ]
    .map(String::from)
}

fn store_cost(seconds: u64) -> Vec<String> {
    let lock = "bench-cost";
    let defaults = |_| default_timing_flags().to_vec();
    let cluster = cluster_with(lock, defaults);
    calls_per_minute(&cluster.sidecars, seconds)
}

/// Store calls per minute of each of `sidecars` over `seconds`, once a
/// leader is settled; asserts followers write nothing while the lease is valid.
fn calls_per_minute(sidecars: &[Sidecar], seconds: u64) -> Vec<String> {
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let leader = wait_for_one_leader(&all, Duration::from_secs(60)).expect("a leader");
    // The first race is over once every follower has observed the holder.
    std::thread::sleep(Duration::from_secs(5));
    let before: Vec<_> = sidecars.iter().map(store_calls).collect();
    std::thread::sleep(Duration::from_secs(seconds));
    let after: Vec<_> = sidecars.iter().map(store_calls).collect();
    let per_minute = 60.0 / seconds as f64;
    let mut lines = Vec::new();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let delta = |op: &str| (a.get(op).copied().unwrap_or(0.0) - b.get(op).copied().unwrap_or(0.0)) * per_minute;
        let rw = delta("acquire") + delta("renew") + delta("release");
        let role = if i == leader { "leader" } else { "follower" };
        let line = format!(
            "{role} {}: {:.1} read-write transactions/min (acquire {:.1}, renew {:.1}), {:.1} reads/min",
            sidecars[i].name,
            rw,
            delta("acquire"),
            delta("renew"),
            delta("observe")
        );
        println!("{line}");
        lines.push(line);
        if i != leader {
            assert_eq!(
                rw, 0.0,
                "a follower opened a read-write transaction while the lease was valid"
            );
        }
    }
    lines
}

/// A private PostgreSQL or Redis server, as the tests start them.
enum PrivateStore {
    Postgres(PostgresServer),
    Redis(RedisServer),
}

impl PrivateStore {
    fn start(kind: &str) -> PrivateStore {
        match kind {
            "postgres" => PrivateStore::Postgres(PostgresServer::start()),
            _ => PrivateStore::Redis(RedisServer::start()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            PrivateStore::Postgres(_) => "postgres",
            PrivateStore::Redis(_) => "redis",
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        match self {
            PrivateStore::Postgres(server) => server.addr(),
            PrivateStore::Redis(server) => server.addr(),
        }
    }

    /// The store URL at `at` (the server, or a proxy in front of it).
    fn url_at(&self, at: std::net::SocketAddr) -> String {
        match self {
            PrivateStore::Postgres(server) => server.url_at(at),
            PrivateStore::Redis(server) => server.url_at(at),
        }
    }

    /// A sidecar on this store through `proxy`; every PostgreSQL sidecar may
    /// create the table (idempotent).
    fn sidecar(&self, i: usize, proxy: TcpProxy, lock: &str, extra: &[String]) -> Sidecar {
        let mut store = vec![
            "--store".to_string(),
            self.kind().to_string(),
            "--store-url".to_string(),
            self.url_at(proxy.addr),
        ];
        if self.kind() == "postgres" {
            store.push("--create-table".into());
        }
        let name = format!("pod-{i}-{}", rand_suffix());
        Sidecar::launch(&name, proxy, lock, &store, &[], extra)
    }

    /// Three sidecars, each through a proxy of its own.
    fn sidecars(&self, runtime: &tokio::runtime::Runtime, lock: &str, extra: &[String]) -> Vec<Sidecar> {
        (0..3)
            .map(|i| {
                let proxy = runtime.block_on(TcpProxy::start(self.addr()));
                self.sidecar(i, proxy, lock, extra)
            })
            .collect()
    }

    async fn direct(&self) -> Arc<dyn LeaseStore> {
        use leasehold::store::StoreUrl;
        let url = StoreUrl::new(self.url_at(self.addr()));
        let store: Arc<dyn LeaseStore> = match self.kind() {
            "postgres" => Arc::new(
                leasehold::store::postgres::PostgresStore::connect(leasehold::store::postgres::PostgresConfig {
                    url,
                    table: "leasehold_leases".into(),
                })
                .unwrap(),
            ),
            _ => Arc::new(
                leasehold::store::redis::RedisStore::connect(leasehold::store::redis::RedisConfig {
                    url,
                    prefix: leasehold::store::redis::DEFAULT_PREFIX.into(),
                })
                .unwrap(),
            ),
        };
        store.ensure_schema().await.unwrap();
        store
    }
}

/// Graceful handovers without a drain on a private `kind` server: SIGTERM
/// to the leader of three sidecars started with `--drain 0s`, until another
/// serves 200 on /leader. What leasehold itself adds to a handover: the
/// release, the followers learning of it (by the store's push, or at their
/// next poll), their acquisition, and the bench's 20 ms look at /leader.
fn undrained_handovers(kind: &'static str, reps: u64) -> Vec<Duration> {
    let store = PrivateStore::start(kind);
    let runtime = one_worker_runtime();
    let lock = format!("bench-{kind}-handover");
    let extra = ["--drain".to_string(), "0s".to_string()];
    let mut sidecars = store.sidecars(&runtime, &lock, &extra);
    timed_handovers(
        &mut sidecars,
        reps,
        "TERM",
        "graceful handover, no drain",
        |i, proxy| store.sidecar(i, proxy, &lock, &extra),
    )
}

/// Renew and observe latency, called back to back `n` times each.
fn private_latency(store: &PrivateStore, runtime: &tokio::runtime::Runtime, n: u64) -> Vec<String> {
    runtime.block_on(async {
        let direct = store.direct().await;
        let lease = Duration::from_secs(15);
        let grant = direct.acquire("bench-latency", "bench", lease).await.unwrap();
        let mut samples: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
        for _ in 0..n {
            let timed = Instant::now();
            direct
                .renew("bench-latency", "bench", grant.token, lease)
                .await
                .unwrap();
            samples.entry("renew").or_default().push(timed.elapsed());
            let timed = Instant::now();
            direct.observe("bench-latency").await.unwrap();
            samples.entry("observe").or_default().push(timed.elapsed());
        }
        samples
            .iter_mut()
            .map(|(op, samples)| {
                samples.sort();
                let line = format!(
                    "{op}: n={} p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                    samples.len(),
                    quantile(samples, 0.5),
                    quantile(samples, 0.99),
                    quantile(samples, 1.0)
                );
                println!("{} {line}", store.kind());
                line
            })
            .collect()
    })
}

/// Everything measured on Spanner, on a private PostgreSQL or Redis server:
/// crash failover and graceful handover at the tests' D/R/P, renew latency,
/// and store operations per minute at the default timings.
fn private_store(kind: &'static str, reps: u64, seconds: u64) -> Vec<String> {
    let store = PrivateStore::start(kind);
    let runtime = one_worker_runtime();
    let mut lines = Vec::new();
    for (signal, what) in [("KILL", "crash failover"), ("TERM", "graceful handover")] {
        let lock = format!("bench-{kind}-{signal}");
        let mut sidecars = store.sidecars(&runtime, &lock, &[]);
        let mut samples = timed_handovers(&mut sidecars, reps, signal, what, |i, proxy| {
            store.sidecar(i, proxy, &lock, &[])
        });
        drop(sidecars);
        let median_over_d = millis(median(&mut samples)) / millis(D);
        lines.push(format!(
            "{what}: {}; median/D = {median_over_d:.2}",
            summary(&mut samples)
        ));
    }
    lines.extend(private_latency(&store, &runtime, reps.max(2) * 10));
    let sidecars = store.sidecars(&runtime, &format!("bench-{kind}-cost"), &default_timing_flags());
    lines.extend(
        calls_per_minute(&sidecars, seconds)
            .into_iter()
            .map(|l| format!("store cost (15s/10s/2s, {seconds} s): {l}")),
    );
    lines
}

/// RSS (KiB) and CPU seconds of a process, from /proc.
fn usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (rss, ticks / 100.0)
}

/// (RSS, anonymous) in KiB from `/proc/PID/smaps_rollup`: the rest of the
/// resident memory is file-backed (the executable's and libraries' pages).
fn rss_split(pid: u32) -> (u64, u64) {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        rollup
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Anonymous:"))
}

/// A runtime with one worker thread, so the harness takes little of the machine.
fn one_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn footprint(seconds: u64) -> String {
    let lock = "bench-idle";
    let emulator = Emulator::start_or_connect();
    let runtime = one_worker_runtime();
    let (config, proxy) = runtime.block_on(async {
        let config = emulator.create_database("leasehold_leases").await;
        let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
            .await
            .unwrap();
        store.ensure_schema().await.unwrap();
        (config, TcpProxy::start(emulator.host.parse().unwrap()).await)
    });
    let defaults = default_timing_flags();
    let sidecar = Sidecar::start("idle", &emulator, &config, proxy, lock, &defaults);
    let only = [&sidecar];
    wait_for_one_leader(&only, Duration::from_secs(30)).expect("it leads");
    std::thread::sleep(Duration::from_secs(2));
    let (_, cpu_before) = usage(sidecar.child.id());
    let mut rss_samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        rss_samples.push(usage(sidecar.child.id()).0);
        std::thread::sleep(Duration::from_secs(1));
    }
    let (_, cpu_after) = usage(sidecar.child.id());
    let (rss, anonymous) = rss_split(sidecar.child.id());
    rss_samples.sort();
    let binary = std::fs::metadata(env!("CARGO_BIN_EXE_leasehold"))
        .map(|m| m.len())
        .unwrap_or(0);
    let line = format!(
        "idle leader sidecar over {seconds} s: RSS median {} KiB (max {} KiB; at the end {anonymous} KiB anonymous, {} KiB file-backed), CPU {:.2} s = {:.3}% of one core; binary {:.1} MiB",
        rss_samples[rss_samples.len() / 2],
        rss_samples[rss_samples.len() - 1],
        rss.saturating_sub(anonymous),
        cpu_after - cpu_before,
        (cpu_after - cpu_before) / seconds as f64 * 100.0,
        binary as f64 / 1048576.0
    );
    println!("{line}");
    line
}

fn many_locks(electors: usize, seconds: u64) -> String {
    let emulator = Emulator::start_or_connect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let config = emulator.create_database("leasehold_leases").await;
        let spanner = SpannerStore::connect_to(config, emulator.endpoints(), DEFAULT_CALL_TIMEOUT).await.unwrap();
        spanner.ensure_schema().await.unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = leasehold::sidecar::metrics::Metrics::new(&mut registry);
        let store: Arc<dyn LeaseStore> = Arc::new(leasehold::sidecar::metrics::MeteredStore::new(Arc::new(spanner), metrics));
        let timing = Timing::default();
        let shutdown = CancellationToken::new();
        let handles: Vec<_> = (0..electors)
            .map(|i| Elector::new(format!("many/{i}"), Identity::new(None, None, format!("m{i}")), timing).spawn(store.clone(), shutdown.clone()))
            .collect();
        // Warm up: everyone acquires.
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_secs(120) && handles.iter().filter(|h| h.state().leader).count() < electors {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let held_after_warmup = handles.iter().filter(|h| h.state().leader).count();
        let renewals_before = renewals(&registry);
        let mut transitions: Vec<_> = handles.iter().map(|h| h.transitions()).collect();
        let started = Instant::now();
        let mut min_held = electors;
        while started.elapsed() < Duration::from_secs(seconds) {
            min_held = min_held.min(handles.iter().filter(|h| h.state().leader).count());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let renewals_after = renewals(&registry);
        let losses: usize = transitions.iter_mut().map(|t| std::iter::from_fn(|| t.try_recv().ok()).filter(|s| !s.leader).count()).sum();
        let (p50, p99) = renew_quantiles(&registry);
        shutdown.cancel();
        for h in handles {
            h.join().await;
        }
        let line = format!(
            "{electors} electors (D/R/P 15s/10s/2s) on one emulator database for {seconds} s: {:.0} renewals/s, renew latency p50 <= {p50} ms, p99 <= {p99} ms (histogram buckets); {held_after_warmup} held after warm-up ({:.0} s), at least {min_held} held throughout, {losses} step-downs",
            (renewals_after - renewals_before) / seconds as f64,
            warm.elapsed().as_secs_f64() - seconds as f64,
        );
        println!("{line}");
        line
    })
}

fn scrape(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn renewals(registry: &prometheus_client::registry::Registry) -> f64 {
    scrape(registry)
        .lines()
        .find(|l| l.starts_with("leasehold_store_calls_total{op=\"renew\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// `q`-quantile of sorted samples, in ms (NaN when there are none: a run
/// that measured nothing says so in its line).
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => millis(sorted[((n - 1) as f64 * q).round() as usize]),
    }
}

/// The reply delay the round-trip count is measured with: an operation of n
/// sequential round trips takes n delays plus the emulator's own time.
const REPLY_DELAY: Duration = Duration::from_millis(100);

/// Each store operation in one process on the emulator: latency p50/p99
/// directly, and round trips counted as latency / [`REPLY_DELAY`] through a
/// proxy that shifts every reply by it.
fn store_ops(reps: u64) -> Vec<String> {
    let emulator = Emulator::start_or_connect();
    let runtime = one_worker_runtime();
    runtime.block_on(async {
        let config = emulator.create_database("leasehold_leases").await;
        let direct = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
            .await
            .unwrap();
        direct.ensure_schema().await.unwrap();
        let proxy = TcpProxy::start(emulator.host.parse().unwrap()).await;
        let mut endpoints = emulator.endpoints();
        endpoints.data = Some(format!("http://{}", proxy.addr));
        let delayed = SpannerStore::connect_to(config, endpoints, Duration::from_secs(30))
            .await
            .unwrap();
        let lease = Duration::from_secs(15);
        let mut lines = Vec::new();
        for (label, store, n) in [("direct", &direct, reps.max(2) * 10), ("delayed", &delayed, 5)] {
            if label == "delayed" {
                proxy.set(ProxyMode::DelayReplies(REPLY_DELAY));
            }
            let lock = format!("ops-{label}");
            let mut samples: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
            for _ in 0..n {
                let timed = Instant::now();
                store.observe(&lock).await.unwrap();
                samples.entry("observe").or_default().push(timed.elapsed());
                let timed = Instant::now();
                let grant = store.acquire(&lock, "bench", lease).await.unwrap();
                samples.entry("acquire").or_default().push(timed.elapsed());
                for _ in 0..3 {
                    let timed = Instant::now();
                    store.renew(&lock, "bench", grant.token, lease).await.unwrap();
                    samples.entry("renew").or_default().push(timed.elapsed());
                }
                let timed = Instant::now();
                store.release(&lock, "bench", grant.token).await.unwrap();
                samples.entry("release").or_default().push(timed.elapsed());
            }
            proxy.set(ProxyMode::Forward);
            for (op, samples) in &mut samples {
                samples.sort();
                let line = if label == "direct" {
                    format!(
                        "{op}: n={} p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        samples.len(),
                        quantile(samples, 0.5),
                        quantile(samples, 0.99),
                        quantile(samples, 1.0)
                    )
                } else {
                    let median = quantile(samples, 0.5);
                    format!(
                        "{op}: {:.0} round trips (median {median:.0} ms with every reply {} ms late, n={})",
                        (median / millis(REPLY_DELAY)).floor(),
                        millis(REPLY_DELAY),
                        samples.len()
                    )
                };
                println!("{label} {line}");
                lines.push(line);
            }
        }
        lines
    })
}

/// Upper bucket bounds (ms) holding the 50th and 99th percentile renewals.
fn renew_quantiles(registry: &prometheus_client::registry::Registry) -> (String, String) {
    let text = scrape(registry);
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with("leasehold_store_latency_seconds_bucket{") && l.contains("op=\"renew\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((bound, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    let at = |q: f64| {
        buckets
            .iter()
            .find(|(_, count)| *count >= total * q)
            .map_or("?".to_string(), |(bound, _)| {
                if bound.is_infinite() {
                    "inf".into()
                } else {
                    format!("{:.0}", bound * 1000.0)
                }
            })
    };
    (at(0.5), at(0.99))
}

/// Issue 16: `reps` Deployment rollouts of 3 candidates (maxSurge 1 /
/// maxUnavailable 0, app-health source on) per leadership setting, in one
/// process on paused time (`support::rollout`): handovers per rollout,
/// total time without a leader, and moves to an older version.
fn rollouts(reps: u64) -> Vec<String> {
    use leasehold::lease::Prefer;
    let settings = [
        ("None", Prefer::None, false),
        ("Newest", Prefer::Newest, false),
        ("Newest + fence", Prefer::Newest, true),
        ("Oldest", Prefer::Oldest, false),
    ];
    let mut lines = Vec::new();
    for (label, prefer, fence) in settings {
        let (mut handovers, mut leaderless, mut backwards) = (Vec::new(), Vec::new(), 0);
        for _ in 0..reps {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let outcome = runtime.block_on(rollout::rollout(3, prefer, fence));
            handovers.push(outcome.handovers);
            leaderless.push(outcome.leaderless);
            backwards += outcome.backwards;
        }
        handovers.sort();
        let line = format!(
            "{label}: handovers per rollout min {} median {} max {}; without a leader per rollout {}; moves to an \
             older version {backwards}",
            handovers[0],
            handovers[handovers.len() / 2],
            handovers[handovers.len() - 1],
            summary(&mut leaderless)
        );
        println!("{line}");
        lines.push(line);
    }
    lines
}

fn main() {
    // `cargo bench` passes --bench; parts are chosen by LEASEHOLD_BENCH_ONLY.
    let reps = env_or("LEASEHOLD_BENCH_REPS", 20);
    let seconds = env_or("LEASEHOLD_BENCH_SECONDS", 60);
    let electors = env_or("LEASEHOLD_BENCH_ELECTORS", 1000) as usize;
    let only = std::env::var("LEASEHOLD_BENCH_ONLY").unwrap_or_default();
    let run = |part: &str| only.is_empty() || only.split(',').any(|p| p.trim() == part);
    let mut summary_lines = Vec::new();
    if run("crash") {
        println!("== crash failover (kill -9), D={D:?} R={R:?} P={P:?}");
        let mut crash = handovers(reps, "bench-crash", "KILL", "crash failover");
        summary_lines.push(format!(
            "crash failover: {}; median/D = {:.2}",
            summary(&mut crash),
            millis(median(&mut crash)) / millis(D)
        ));
    }
    if run("term") {
        println!(
            "== graceful handover (SIGTERM), drain={DRAIN:?}, standalone processes (no pod watch outside a cluster)"
        );
        let mut term = handovers(reps, "bench-term", "TERM", "graceful handover");
        summary_lines.push(format!(
            "graceful handover (processes, no watch): {}",
            summary(&mut term)
        ));
    }
    if run("nudge") {
        println!("== release + nudge in one process (what the pod watch triggers), memory store");
        let mut nudged = nudged_handover_in_process(reps);
        summary_lines.push(format!(
            "graceful handover (in process, nudged): {}",
            summary(&mut nudged)
        ));
    }
    if run("store-cost") {
        println!("== store cost at default timings (15s/10s/2s), {seconds} s");
        summary_lines.extend(store_cost(seconds).into_iter().map(|l| format!("store cost: {l}")));
    }
    if run("store-ops") {
        println!(
            "== store operations in one process, {} samples each directly",
            reps.max(2) * 10
        );
        summary_lines.extend(store_ops(reps).into_iter().map(|l| format!("store ops: {l}")));
    }
    for kind in ["postgres", "redis"] {
        if run(kind) {
            println!(
                "== {kind} (private server): failover and handover at D={D:?} R={R:?} P={P:?}, latency, store cost"
            );
            summary_lines.extend(
                private_store(kind, reps, seconds)
                    .into_iter()
                    .map(|l| format!("{kind}: {l}")),
            );
        }
    }
    if run("handover") {
        println!(
            "== graceful handover with --drain 0s (SIGTERM to the leader -> another's /leader 200), processes on \
             private PostgreSQL and Redis servers, D={D:?} R={R:?} P={P:?}"
        );
        for kind in ["postgres", "redis"] {
            let mut samples = undrained_handovers(kind, reps);
            summary_lines.push(format!(
                "graceful handover, no drain, {kind}: {}",
                summary(&mut samples)
            ));
        }
    }
    if run("rollout") {
        println!("== rollouts of 3 candidates, maxSurge 1 / maxUnavailable 0, D={D:?} R={R:?} P={P:?}, paused time");
        summary_lines.extend(rollouts(reps).into_iter().map(|l| format!("rollout: {l}")));
    }
    if run("rollout-process") {
        let rollouts = env_or("LEASEHOLD_BENCH_ROLLOUTS", 5);
        println!(
            "== whole-process rollouts of 3 sidecars on the emulator, maxSurge 1 / maxUnavailable 0, D={D:?} R={R:?} \
             P={P:?} drain={DRAIN:?}, {rollouts} per setting"
        );
        summary_lines.extend(
            rollout_process::rollouts_across_processes(rollouts)
                .into_iter()
                .map(|l| format!("rollout (processes): {l}")),
        );
    }
    if run("fencing") {
        println!("== fenced writes beside plain ones: private PostgreSQL and Redis, the Spanner emulator");
        summary_lines.extend(
            fencing::fenced_writes(reps)
                .into_iter()
                .map(|l| format!("fencing: {l}")),
        );
    }
    // Needs a disposable cluster, as the kubernetes part below.
    let named = only.split(',').any(|p| p.trim() == "fencing-kubernetes");
    if named || (only.is_empty() && std::env::var_os("LEASEHOLD_E2E_KUBECONFIG").is_some()) {
        println!("== fenced writes beside plain ones: a ConfigMap under the chart's fencing admission policy");
        summary_lines.extend(
            fencing::kubernetes_writes(reps)
                .into_iter()
                .map(|l| format!("fencing: {l}")),
        );
    }
    if run("footprint") {
        println!("== footprint");
        summary_lines.push(format!("footprint: {}", footprint(seconds)));
    }
    if run("many-locks") {
        println!("== many locks");
        summary_lines.push(format!("many locks: {}", many_locks(electors, seconds)));
    }
    for (part, backend) in [
        ("sessions", sessions::Backend::Spanner),
        ("sessions-postgres", sessions::Backend::Postgres),
        ("sessions-redis", sessions::Backend::Redis),
    ] {
        if !run(part) {
            continue;
        }
        let counts = std::env::var("LEASEHOLD_BENCH_LOCKS").unwrap_or_else(|_| "1000,10000".into());
        for locks in counts.split(',').filter_map(|n| n.trim().parse().ok()) {
            println!("== {backend:?}: {locks} locks in 3 sessions, {seconds} s");
            summary_lines.push(format!(
                "sessions: {}",
                sessions::many_locks_in_sessions(backend, locks, seconds)
            ));
        }
    }
    for (part, backend) in [
        ("partitions", sessions::Backend::Spanner),
        ("partitions-postgres", sessions::Backend::Postgres),
        ("partitions-redis", sessions::Backend::Redis),
    ] {
        if !run(part) {
            continue;
        }
        println!(
            "== partitions on {backend:?}: {} over 3 sidecar processes, D={D:?} R={R:?} P={P:?}",
            64
        );
        summary_lines.extend(
            partitions::partitions(backend, reps)
                .into_iter()
                .map(|l| format!("partitions ({backend:?}): {l}")),
        );
    }
    for (part, backend) in [
        ("clusters", sessions::Backend::Spanner),
        ("clusters-postgres", sessions::Backend::Postgres),
        ("clusters-redis", sessions::Backend::Redis),
    ] {
        if !run(part) {
            continue;
        }
        println!(
            "== failover across clusters on {backend:?}: 2 + 2 sidecar processes named west and east, one lock, \
             D/R/P 15/10/2 s, {reps} repetitions per scenario"
        );
        summary_lines.extend(
            clusters::failover_across_clusters(backend, reps)
                .into_iter()
                .map(|l| format!("clusters ({backend:?}): {l}")),
        );
    }
    // Needs a disposable cluster (docs/e2e.md): named, or with the suite's variables set.
    let named = only.split(',').any(|p| p.trim() == "kubernetes");
    if named || (only.is_empty() && std::env::var_os("LEASEHOLD_E2E_KUBECONFIG").is_some()) {
        println!(
            "== kubernetes: handover on a real cluster (the leader-only-service example) and the Kubernetes store's election beside client-go's, D/R/P 15/10/2 s"
        );
        summary_lines.extend(kubernetes::kubernetes().into_iter().map(|l| format!("kubernetes: {l}")));
    }
    // Needs a disposable cluster (it pauses the API server): named only.
    if only.split(',').any(|p| p.trim() == "fenced-workload") {
        println!(
            "== fenced workload (issue 56, the long run): 3 candidate pods on PostgreSQL, D/R/P 4/3/1 s, faults until \
             the terms and writes asked for"
        );
        summary_lines.extend(
            fenced_workload_part::fenced_workload()
                .into_iter()
                .map(|l| format!("fenced workload: {l}")),
        );
    }
    // Needs a disposable cluster of its own (LEASEHOLD_BENCH_KUBECONFIG): named only.
    if only.split(',').any(|p| p.trim() == "operator-scale") {
        println!(
            "== operator at many leases (issue 39): 3 gated candidates each, D/R/P 15/10/2 s, {seconds} s at rest"
        );
        summary_lines.extend(
            operator_scale::operator_scale(seconds)
                .into_iter()
                .map(|l| format!("operator scale: {l}")),
        );
    }
    println!("\n== summary");
    for line in summary_lines {
        println!("{line}");
    }
}
