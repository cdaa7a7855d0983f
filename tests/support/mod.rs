//! Whole-process helpers: sidecar processes on the emulator, each behind a
//! TCP proxy the test controls, and a tiny HTTP client for their API.

#![allow(dead_code)] // each test file uses its own share of these

pub mod rollout;
pub mod rollout_process;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::lease::LeaseStore;
use leasehold::lease::timing::DEFAULT_JITTER;
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerConfig, SpannerStore};
use leasehold::testing::{Emulator, TcpProxy, free_port};
use serde_json::Value;

pub const D: Duration = Duration::from_millis(2000);
pub const R: Duration = Duration::from_millis(1500);
pub const P: Duration = Duration::from_millis(300);
pub const DRAIN: Duration = Duration::from_millis(200);

/// For store round trips and scheduling on a loaded two-core machine: a
/// follower's observe and acquire, and on the Spanner emulator, which aborts
/// concurrent read-write transactions, one lost acquisition race.
pub const MARGIN: Duration = Duration::from_millis(250);

/// After kill -9 of the leader, a new leader within this. The lease ends at
/// most D after the killed leader's last renewal, which precedes the kill; a
/// follower notices at its next poll, at most P·(1 + J) later (J =
/// [`DEFAULT_JITTER`]); then [`MARGIN`]. Without it, D + P left no room for
/// the round trips: crash failovers on the emulator measured up to 2.25 s
/// of its 2.3 s (BENCHMARKS.md).
pub fn failover_bound() -> Duration {
    D + P.mul_f64(1.0 + DEFAULT_JITTER) + MARGIN
}

/// A plain HTTP/1.1 GET: (status, JSON body); None when nothing answers.
pub fn get(port: u16, path: &str) -> Option<(u16, Value)> {
    get_text(port, path).map(|(status, body)| (status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// A plain HTTP/1.1 GET: (status, body text).
pub fn get_text(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Some((status, body.to_string()))
}

/// A kubeconfig file reaching the API server model at `addr` (plain HTTP,
/// no credentials; `ApiServer::serve_http`), defaulting to `namespace`.
pub fn model_kubeconfig(addr: std::net::SocketAddr, namespace: &str, name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("leasehold-{name}-{:08x}.yaml", rand::random::<u32>()));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: model\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: model\n  context:\n    cluster: model\n    \
             user: anonymous\n    namespace: {namespace}\ncurrent-context: model\n"
        ),
    )
    .unwrap();
    path
}

/// The `leasehold` the processes run: this build's, unless
/// LEASEHOLD_BENCH_BINARY names another build (the benchmarks' before and
/// after figures run one harness against two builds).
fn binary() -> std::ffi::OsString {
    std::env::var_os("LEASEHOLD_BENCH_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_leasehold").into())
}

pub struct Sidecar {
    pub name: String,
    pub http: u16,
    pub metrics: u16,
    pub proxy: TcpProxy,
    pub child: Child,
}

impl Sidecar {
    pub fn start(
        name: &str,
        emulator: &Emulator,
        config: &SpannerConfig,
        proxy: TcpProxy,
        lock: &str,
        extra: &[String],
    ) -> Sidecar {
        let (store, env) = spanner_store(emulator, config, &proxy);
        Sidecar::launch(name, proxy, lock, &store, &env, extra)
    }

    /// A sidecar on any store: `store` are its store flags, `env` its store
    /// environment; `proxy` is the test's handle on its store connection.
    pub fn launch(
        name: &str,
        proxy: TcpProxy,
        lock: &str,
        store: &[String],
        env: &[(String, String)],
        extra: &[String],
    ) -> Sidecar {
        let (http, metrics) = (free_port(), free_port());
        let child = Command::new(binary())
            .args(["sidecar", "--lock", lock])
            .args(store)
            .args(["--pod-name", name])
            .args([
                "--http-addr",
                &format!("127.0.0.1:{http}"),
                "--metrics-addr",
                &format!("127.0.0.1:{metrics}"),
            ])
            .args(extra)
            // Defaults as environment, so flags in `extra` and `env` override them.
            .env("LEASEHOLD_LEASE_DURATION", "2s")
            .env("LEASEHOLD_RENEW_DEADLINE", "1500ms")
            .env("LEASEHOLD_RETRY_PERIOD", "300ms")
            .env("LEASEHOLD_DRAIN", "200ms")
            .env("LEASEHOLD_KUBERNETES", "false")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold sidecar starts");
        Sidecar {
            name: name.to_string(),
            http,
            metrics,
            proxy,
            child,
        }
    }

    pub fn leader(&self) -> Option<(u16, Value)> {
        get(self.http, "/leader")
    }

    pub fn leads(&self) -> bool {
        self.leader().is_some_and(|(status, _)| status == 200)
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sidecar's store flags and environment for the lease table `config` on
/// `emulator`, reached through `proxy`.
pub fn spanner_store(
    emulator: &Emulator,
    config: &SpannerConfig,
    proxy: &TcpProxy,
) -> (Vec<String>, Vec<(String, String)>) {
    let store = vec![
        "--database".to_string(),
        config.database.clone(),
        "--table".to_string(),
        config.table.clone(),
    ];
    let env = vec![
        ("SPANNER_EMULATOR_HOST".to_string(), proxy.addr.to_string()),
        ("SPANNER_EMULATOR_REST".to_string(), emulator.rest.clone()),
    ];
    (store, env)
}

/// Polls until exactly one of `sidecars` serves 200 on /leader; returns its index.
pub fn wait_for_one_leader(sidecars: &[&Sidecar], within: Duration) -> Option<usize> {
    let started = Instant::now();
    while started.elapsed() < within {
        let leaders: Vec<usize> = (0..sidecars.len()).filter(|&i| sidecars[i].leads()).collect();
        assert!(
            leaders.len() <= 1,
            "two sidecars serve 200 on /leader at once: {leaders:?}"
        );
        if let [one] = leaders.as_slice() {
            return Some(*one);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub struct Cluster {
    pub emulator: Emulator,
    pub config: SpannerConfig,
    pub sidecars: Vec<Sidecar>,
    pub runtime: tokio::runtime::Runtime,
}

pub fn cluster(lock: &str) -> Cluster {
    cluster_with(lock, |_| Vec::new())
}

/// Three sidecars; `extra(i)` adds flags for sidecar i.
pub fn cluster_with(lock: &str, extra: impl Fn(usize) -> Vec<String>) -> Cluster {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let emulator = Emulator::start_or_connect();
    let (config, proxies) = runtime.block_on(async {
        let (config, _) = lease_database(&emulator).await;
        let mut proxies = Vec::new();
        for _ in 0..3 {
            proxies.push(TcpProxy::start(emulator.host.parse().unwrap()).await);
        }
        (config, proxies)
    });
    let sidecars = proxies
        .into_iter()
        .enumerate()
        .map(|(i, proxy)| Sidecar::start(&format!("pod-{i}"), &emulator, &config, proxy, lock, &extra(i)))
        .collect();
    Cluster {
        emulator,
        config,
        sidecars,
        runtime,
    }
}

/// A fresh database on `emulator` with the lease table, and a store on it.
pub async fn lease_database(emulator: &Emulator) -> (SpannerConfig, SpannerStore) {
    let config = emulator.create_database("leasehold_leases").await;
    let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
        .await
        .unwrap();
    store.ensure_schema().await.unwrap();
    (config, store)
}

pub fn others(sidecars: &[Sidecar], except: usize) -> Vec<&Sidecar> {
    sidecars
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != except)
        .map(|(_, s)| s)
        .collect()
}

pub fn token_of(view: &Value) -> String {
    view["token"].as_str().unwrap_or_default().to_string()
}
