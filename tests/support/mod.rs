//! Whole-process helpers: sidecar processes on the emulator, each behind a
//! TCP proxy the test controls, and a tiny HTTP client for their API.

#![allow(dead_code)] // the suite and the benchmark (which mounts this module too) each use their own share

pub mod cluster;
pub mod example;
pub mod fencing_history;
pub mod readme;
pub mod rollout;
pub mod rollout_process;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::lease::LeaseStore;
use leasehold::lease::timing::DEFAULT_JITTER;
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerConfig, SpannerStore};
use leasehold::testing::{Emulator, TcpProxy};
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

/// How long a sidecar may take from spawn to bound listeners and from
/// there to serving `/healthz`: process start and the store's first
/// connection attempt on a loaded two-core machine.
const START_BOUND: Duration = Duration::from_secs(20);

/// A plain HTTP/1.1 GET: (status, JSON body), or why nothing answered.
pub fn get(port: u16, path: &str) -> Result<(u16, Value), String> {
    get_text(port, path).map(|(status, body)| (status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// A plain HTTP/1.1 GET: (status, body text), or why nothing answered.
pub fn get_text(port: u16, path: &str) -> Result<(u16, String), String> {
    request(port, "GET", path)
}

/// A plain HTTP/1.1 POST without a body: (status, body text), or why
/// nothing answered.
pub fn post(port: u16, path: &str) -> Result<(u16, String), String> {
    request(port, "POST", path)
}

fn request(port: u16, method: &str, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| format!("read timeout: {e}"))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| format!("read: {e}"))?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok((status, body.to_string()))
}

/// Waits (bounded) for the sidecar's `--ready-file`, failing at once when
/// the process exits first (a failed bind, a refused flag).
pub fn wait_for_ready_file(name: &str, path: &std::path::Path, child: &mut Child) -> leasehold::sidecar::Listening {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let _ = std::fs::remove_file(path);
            return serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: ready file {}: {e}: {text}", path.display()));
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{name}: the sidecar exited ({status}) before binding its listeners");
        }
        if started.elapsed() > START_BOUND {
            // Not yet a Sidecar, whose drop would stop it.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name}: no ready file {} within {START_BOUND:?}: the listeners were not bound",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
pub fn binary() -> std::ffi::OsString {
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
        Sidecar::launch_binary(&binary(), name, proxy, lock, store, env, extra)
    }

    /// [`Sidecar::launch`] with another `leasehold` build (the candidate
    /// binary, tests/processes/candidate.rs).
    pub fn launch_binary(
        binary: &std::ffi::OsStr,
        name: &str,
        proxy: TcpProxy,
        lock: &str,
        store: &[String],
        env: &[(String, String)],
        extra: &[String],
    ) -> Sidecar {
        let mut command = Command::new(binary);
        command
            .args(["sidecar", "--lock", lock])
            .args(store)
            // Defaults as environment, so flags in `extra` and `env` override them.
            .env("LEASEHOLD_LEASE_DURATION", "2s")
            .env("LEASEHOLD_RENEW_DEADLINE", "1500ms")
            .env("LEASEHOLD_RETRY_PERIOD", "300ms")
            .env("LEASEHOLD_KUBERNETES", "false");
        Sidecar::spawn(command, name, proxy, env, extra)
    }

    /// A sidecar bound to the DistributedLease `lease` (`--lease`), which
    /// gives it the store and D/R/P; `env` names the API server (a
    /// kubeconfig), the pod and the store's address.
    pub fn launch_on_lease(
        name: &str,
        proxy: TcpProxy,
        lease: &str,
        env: &[(String, String)],
        extra: &[String],
    ) -> Sidecar {
        let mut command = Command::new(binary());
        command
            .args(["sidecar", "--lease", lease])
            .env("LEASEHOLD_KUBERNETES", "true");
        Sidecar::spawn(command, name, proxy, env, extra)
    }

    /// Starts `command` (`leasehold sidecar` and its election flags) as
    /// candidate `name` and waits until it serves.
    fn spawn(mut command: Command, name: &str, proxy: TcpProxy, env: &[(String, String)], extra: &[String]) -> Sidecar {
        // The sidecar binds port 0 itself and says which ports it got in
        // its ready file: no port is chosen here and freed for another
        // test to take before the sidecar binds it.
        let ready_file = std::env::temp_dir().join(format!("leasehold-ready-{:016x}.json", rand::random::<u64>()));
        let mut child = command
            .args(["--pod-name", name])
            .args(["--http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .arg("--ready-file")
            .arg(&ready_file)
            .args(extra)
            .env("LEASEHOLD_DRAIN", "200ms")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold sidecar starts");
        let listening = wait_for_ready_file(name, &ready_file, &mut child);
        let sidecar = Sidecar {
            name: name.to_string(),
            http: listening.http.port(),
            metrics: listening.metrics.port(),
            proxy,
            child,
        };
        sidecar.wait_for_healthz();
        sidecar
    }

    /// Waits until `/healthz` answers (any status: a store problem at
    /// start is a 503 with the reason), so no fault comes before the
    /// sidecar serves.
    fn wait_for_healthz(&self) {
        let started = Instant::now();
        while get_text(self.http, "/healthz").is_err() {
            assert!(
                started.elapsed() < START_BOUND,
                "{}: /healthz on port {} did not answer within {START_BOUND:?} of the listeners being bound",
                self.name,
                self.http
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `/leader`: (status, view). Panics when the sidecar does not answer:
    /// a dead or hung sidecar is never "not leading". A test that expects
    /// the process gone says so with [`Sidecar::expect_gone`].
    pub fn leader(&self) -> (u16, Value) {
        match get(self.http, "/leader") {
            Ok(answer) => answer,
            Err(e) => panic!(
                "{}: GET /leader on 127.0.0.1:{} got no answer: {e} (process: {})",
                self.name,
                self.http,
                self.process_state()
            ),
        }
    }

    /// Whether `/leader` answers 200; panics when it does not answer.
    pub fn leads(&self) -> bool {
        self.leader().0 == 200
    }

    /// For a test that ended the process: it has exited within `within`
    /// and its API no longer answers.
    pub fn expect_gone(&mut self, within: Duration) -> std::process::ExitStatus {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < within,
                "{}: still running {within:?} after it was expected to exit",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Ok(answer) = get_text(self.http, "/leader") {
            panic!(
                "{}: exited ({status}) but port {} still answers: {answer:?}",
                self.name, self.http
            );
        }
        status
    }

    /// Whether the process still runs, for failure messages.
    fn process_state(&self) -> String {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())) {
            // The state letter follows the command name in parentheses.
            Ok(stat) => match stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()) {
                Some('Z') => "exited (not yet reaped)".into(),
                Some('T') => "stopped (SIGSTOP)".into(),
                Some(state) => format!("running (state {state})"),
                None => format!("unreadable state: {stat}"),
            },
            Err(_) => "exited".into(),
        }
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

/// The runtime a test's proxies (and other helpers) run on: one worker
/// thread of its own, beside the test's thread.
pub fn proxy_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Three sidecars; `extra(i)` adds flags for sidecar i.
pub fn cluster_with(lock: &str, extra: impl Fn(usize) -> Vec<String>) -> Cluster {
    let runtime = proxy_runtime();
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
