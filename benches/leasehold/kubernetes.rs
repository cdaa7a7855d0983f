//! The `kubernetes` part: handover on a real cluster, and the Kubernetes
//! store's election beside client-go's on the same API server. The cluster,
//! the image and the stores come from the end-to-end suite's variables
//! (docs/e2e.md): run `eval "$(scripts/e2e-cluster.sh up)"` first, or point
//! them at your own disposable cluster.
//!
//! * **Events** (issue 25), each N times (LEASEHOLD_BENCH_K8S_REPS, default
//!   3) on the leader-only-service example (3 replicas) with its lease on
//!   LEASEHOLD_BENCH_K8S_STORE (`postgres`, the default, on the host, or
//!   `kubernetes`), D/R/P 15/10/2 s, the default 5 s drain, 30 s grace: how
//!   long the leader Service had no ready endpoint (its EndpointSlices
//!   watched through the API, from the event until one leader has held for
//!   [`SETTLED`]), how often the leader label moved, and the moments with
//!   two leader labels or two ready endpoints (must be 0).
//! * **Transfers** (issue 35), in the same way: `leasehold transfer
//!   scheduler --to <a follower> --wait` run on the host, with the example's
//!   app ignoring the request (the leader releases after the 5 s drain),
//!   and with an app that acknowledges its drain ([`ACKNOWLEDGING_SCRIPT`]:
//!   it polls the sidecar's `/leader` every 50 ms and, once it turns 503,
//!   POSTs `/drained` with the token it worked under); also how long the
//!   command took to return.
//! * **Elections** (issue 26): three `leasehold sidecar --store kubernetes`
//!   processes on the host against three `kube-scheduler --leader-elect`
//!   (client-go, LEASEHOLD_E2E_KUBE_SCHEDULER), each on a Lease of its own,
//!   D/R/P 15/10/2 s: crash failover (kill -9 of the leader) and graceful
//!   handover (SIGTERM) until the Lease names another holder (watched), and
//!   the Lease requests each candidate sends per minute while the lease is
//!   held, counted by a proxy per candidate ([`CountingProxy`]).
//!
//! LEASEHOLD_BENCH_K8S_PARTS (comma-separated event names of [`Event::name`]
//! and `elections`) runs a share of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use leasehold::store::kubernetes::RECORD_ANNOTATION;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::{Env, Scenario, scenario, wait_for};
use crate::counting_proxy::{CountingProxy, Counts};
use crate::fixtures::{APP, FIRST_LEADER, LEASE, a_follower, lease_on, rollout_restart, watch_example};
use crate::node::{kill_and_await_restart, signal_container};
use crate::watcher::LeadershipWatcher;
use crate::{env_or, median, millis, summary};

/// The leaderless time counts until one leader has held for this long.
const SETTLED: Duration = Duration::from_secs(3);
/// How long the gated leader's sidecar stays frozen: past D (15 s).
const FREEZE: Duration = Duration::from_secs(40);
/// D of every election here; D/R/P 15/10/2 s.
const D: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// `kubectl delete pod` of the leader, 30 s grace, the app ignoring SIGTERM.
    GracefulDelete,
    /// The same with an app that exits on SIGTERM.
    GracefulDeleteAppExits,
    /// `kubectl rollout restart` of the 3 replicas, default leadership.
    RolloutRestart,
    /// The same with `leadership.prefer: Newest`.
    RolloutRestartNewest,
    /// The leader's sidecar container killed (the kubelet restarts it).
    SidecarKilled,
    /// The leader's app container killed.
    AppKilled,
    /// Every process of the leader pod killed, no Kubernetes signal.
    PodKilled,
    /// The readiness-gated example, the leader's sidecar frozen (SIGSTOP) for [`FREEZE`].
    GatedFrozen,
    /// `leasehold transfer --wait` to a follower, the app ignoring it.
    Transfer,
    /// The same with an app that acknowledges its drain.
    TransferAcknowledged,
}

impl Event {
    const ALL: [Event; 10] = [
        Event::GracefulDelete,
        Event::GracefulDeleteAppExits,
        Event::RolloutRestart,
        Event::RolloutRestartNewest,
        Event::SidecarKilled,
        Event::AppKilled,
        Event::PodKilled,
        Event::GatedFrozen,
        Event::Transfer,
        Event::TransferAcknowledged,
    ];

    /// The name LEASEHOLD_BENCH_K8S_PARTS takes.
    fn name(self) -> &'static str {
        match self {
            Event::GracefulDelete => "delete",
            Event::GracefulDeleteAppExits => "delete-app-exits",
            Event::RolloutRestart => "rollout",
            Event::RolloutRestartNewest => "rollout-newest",
            Event::SidecarKilled => "sidecar-killed",
            Event::AppKilled => "app-killed",
            Event::PodKilled => "pod-killed",
            Event::GatedFrozen => "gated-frozen",
            Event::Transfer => "transfer",
            Event::TransferAcknowledged => "transfer-acknowledged",
        }
    }
}

/// The app container's command for a script below.
const APP_SHELL: [&str; 3] = ["/bin/busybox", "sh", "-c"];
/// An app that exits on SIGTERM: a shell that traps it, as most servers do.
const EXITING_SCRIPT: &str = "trap 'exit 0' TERM; /bin/busybox httpd -f -p 8080 & wait";
/// An app that acknowledges its drain (docs/transfer.md): it keeps the
/// token while `/leader` answers 200 and, once it does not, POSTs
/// `/drained` naming it (refused, harmlessly, when the term was lost
/// rather than stood aside from).
const ACKNOWLEDGING_SCRIPT: &str = r#"/bin/busybox httpd -f -p 8080 &
token=
while :; do
  if view=$(/bin/busybox wget -q -O - http://127.0.0.1:4040/leader 2>/dev/null); then
    token=$(echo "$view" | /bin/busybox sed -n 's/.*"token":"\([0-9]*\)".*/\1/p')
  elif [ -n "$token" ]; then
    /bin/busybox wget -q -O /dev/null --post-data= "http://127.0.0.1:4040/drained?token=$token" 2>/dev/null
    token=
  fi
  /bin/busybox sleep 0.05
done"#;

pub fn kubernetes() -> Vec<String> {
    let reps = env_or("LEASEHOLD_BENCH_K8S_REPS", 3) as usize;
    let store = std::env::var("LEASEHOLD_BENCH_K8S_STORE").unwrap_or_else(|_| "postgres".into());
    let parts = std::env::var("LEASEHOLD_BENCH_K8S_PARTS").unwrap_or_default();
    let wanted = |name: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut lines = Vec::new();
    for event in Event::ALL.into_iter().filter(|e| wanted(e.name())) {
        let outcome = runtime.block_on(measure(event, reps, &store));
        println!("{outcome}");
        lines.push(outcome);
    }
    if wanted("elections") {
        match std::env::var("LEASEHOLD_E2E_KUBE_SCHEDULER") {
            Ok(command) => lines.extend(runtime.block_on(elections(&command, reps))),
            Err(_) => lines.push("elections: client-go not run (LEASEHOLD_E2E_KUBE_SCHEDULER unset)".into()),
        }
    }
    lines
}

async fn measure(event: Event, reps: usize, store: &str) -> String {
    let on = store.to_string();
    let (mut gaps, moves, doubles, unready, waits) = scenario("e2e-bench", |s| async move {
        let (mut gaps, mut moves, mut unready, mut waits) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let spec = match event {
            Event::RolloutRestartNewest => json!({"leadership": {"prefer": "Newest"}}),
            Event::GatedFrozen => json!({"publishing": {"readinessGate": true}}),
            _ => json!({}),
        };
        let _server = lease_on(&s, &on, spec).await;
        if event == Event::GatedFrozen {
            // The example's own lease would replace the one on `store`.
            let example = s.example("readiness-gated.yaml");
            s.apply(
                example
                    .into_iter()
                    .filter(|o| o["kind"] != "DistributedLease")
                    .collect(),
            )
            .await;
        } else {
            s.apply(s.example("leader-only-service.yaml")).await;
        }
        let watcher = watch_example(&s, true);
        let script = match event {
            Event::GracefulDeleteAppExits => Some(EXITING_SCRIPT),
            Event::TransferAcknowledged => Some(ACKNOWLEDGING_SCRIPT),
            _ => None,
        };
        if let Some(script) = script {
            let command: Vec<&str> = APP_SHELL.iter().copied().chain([script]).collect();
            let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "command": command}]}}}});
            s.api::<Deployment>()
                .patch("scheduler", &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .expect("the app's command");
        }
        for rep in 0..reps {
            let leader = settled_leader(&s, &watcher).await;
            let moves_before = watcher.moves();
            let started = Instant::now();
            let mut frozen_unready = None;
            let mut command_returned = None;
            match event {
                Event::Transfer | Event::TransferAcknowledged => {
                    let to = a_follower(&s, &leader).await;
                    let ns = s.ns.clone();
                    let output = tokio::task::block_in_place(|| {
                        s.env
                            .leasehold()
                            .args(["transfer", LEASE, "--to", &to, "-n", &ns, "--wait", "--timeout", "2m"])
                            .output()
                            .expect("leasehold transfer runs")
                    });
                    command_returned = Some(started.elapsed());
                    assert!(
                        output.status.success(),
                        "leasehold transfer --wait to {to}: {}{}",
                        String::from_utf8_lossy(&output.stdout),
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                Event::GracefulDelete | Event::GracefulDeleteAppExits => {
                    s.api::<Pod>()
                        .delete(&leader, &DeleteParams::default())
                        .await
                        .expect("graceful delete");
                }
                Event::SidecarKilled => kill_and_await_restart(&s, &leader, "leasehold").await,
                Event::AppKilled => kill_and_await_restart(&s, &leader, "app").await,
                Event::PodKilled => {
                    signal_container(&s, &leader, "app", "KILL").await;
                    signal_container(&s, &leader, "leasehold", "KILL").await;
                }
                // Until every old pod is gone: before it, the leader may
                // not have moved.
                Event::RolloutRestart | Event::RolloutRestartNewest => rollout_restart(&s, 3).await,
                Event::GatedFrozen => {
                    signal_container(&s, &leader, "leasehold", "STOP").await;
                    // When the kubelet's probe took the frozen leader's pod
                    // out of the endpoints (polled while it stays frozen).
                    while started.elapsed() < FREEZE {
                        if frozen_unready.is_none() && !watcher.ready_endpoints().contains(&leader) {
                            frozen_unready = Some(started.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    signal_container(&s, &leader, "leasehold", "CONT").await;
                }
            }
            settled_leader(&s, &watcher).await;
            let ended = Instant::now() - SETTLED;
            let gap = watcher.leaderless_between(started, ended);
            let moved = watcher.moves() - moves_before;
            let mut line = format!(
                "{} rep {rep}: no leader endpoint {:.2} s; leader moves {moved}",
                event.name(),
                gap.as_secs_f64()
            );
            if let Some(returned) = command_returned {
                line.push_str(&format!(
                    "; leasehold transfer --wait returned after {:.2} s",
                    returned.as_secs_f64()
                ));
                waits.push(returned);
            }
            if let Some(after) = frozen_unready {
                line.push_str(&format!(
                    "; the frozen leader unready after {:.2} s, the new leader Ready after {:.2} s",
                    after.as_secs_f64(),
                    (after + gap).as_secs_f64()
                ));
                unready.push(after);
            }
            println!("{line}");
            gaps.push(gap);
            moves.push(moved);
        }
        let doubles = watcher.violations();
        for violation in &doubles {
            println!("{}: {violation}", event.name());
        }
        watcher.stop();
        (gaps, moves, doubles.len(), unready, waits)
    })
    .await;
    let mut line = format!(
        "{} ({store}): no leader endpoint {}; leader moves per event {moves:?}; moments with two leaders or two \
         ready endpoints {doubles}",
        event.name(),
        summary(&mut gaps)
    );
    if !unready.is_empty() {
        let mut unready = unready;
        line.push_str(&format!("; the frozen leader unready after {}", summary(&mut unready)));
    }
    if !waits.is_empty() {
        let mut waits = waits;
        line.push_str(&format!(
            "; leasehold transfer --wait returned after {}",
            summary(&mut waits)
        ));
    }
    line
}

/// One leader, the Service's one endpoint, unchanged for [`SETTLED`], every
/// candidate running: the state an event starts from and a handover ends in.
async fn settled_leader(s: &Scenario, watcher: &LeadershipWatcher) -> String {
    loop {
        let leader = watcher.one_leader(None, Duration::from_secs(300)).await;
        let pods = s.pods(APP).await;
        let running = pods.len() == 3
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running")
            });
        let since = Instant::now();
        tokio::time::sleep(SETTLED).await;
        if running
            && watcher.leaders() == [leader.clone()]
            && watcher.leaderless_between(since, Instant::now()).is_zero()
        {
            return leader;
        }
    }
}

/// The fencing token leasehold's record annotation holds, if any.
fn token_of(lease: &Lease) -> Option<i64> {
    let record = lease.metadata.annotations.as_ref()?.get(RECORD_ANNOTATION)?;
    serde_json::from_str::<Value>(record).ok()?["token"].as_i64()
}

/// Who campaigns in an election of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elector {
    /// `leasehold sidecar --store kubernetes`, no pod (the Kubernetes
    /// publisher off), drain 0 s: no app to wait for, as client-go releases
    /// at once on cancel.
    Leasehold,
    /// `kube-scheduler --leader-elect`: client-go's `leaderelection`, on a
    /// profile no pod uses (it schedules nothing).
    ClientGo,
}

impl Elector {
    fn lease(self) -> &'static str {
        match self {
            Elector::Leasehold => "bench-leasehold",
            Elector::ClientGo => "bench-client-go",
        }
    }
}

/// The namespace of the comparison's Leases.
const ELECTION_NAMESPACE: &str = "default";

/// Each holder the Lease named, and when the watch saw it ("" when free);
/// and when the watch saw each write of it (renewals included).
struct Holders {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    writes: Arc<Mutex<Vec<Instant>>>,
    /// leasehold's fencing tokens (the record annotation), in the order
    /// the watch saw them change; client-go writes none.
    tokens: Arc<Mutex<Vec<i64>>>,
    _watching: AbortOnDropHandle<()>,
}

impl Holders {
    fn follow(leases: Api<Lease>, name: &str) -> Holders {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let tokens = Arc::new(Mutex::new(Vec::new()));
        let (record, written, granted) = (seen.clone(), writes.clone(), tokens.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let watching = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(leases, config).default_backoff());
            while let Some(event) = events.next().await {
                let holder = match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                        written.lock().unwrap().push(Instant::now());
                        if let Some(token) = token_of(&lease) {
                            let mut granted = granted.lock().unwrap();
                            if granted.last() != Some(&token) {
                                granted.push(token);
                            }
                        }
                        lease.spec.and_then(|s| s.holder_identity).unwrap_or_default()
                    }
                    Ok(watcher::Event::Delete(_)) => String::new(),
                    _ => continue,
                };
                let mut seen = record.lock().unwrap();
                if seen.last().is_none_or(|(_, last)| *last != holder) {
                    seen.push((Instant::now(), holder));
                }
            }
        });
        Holders {
            seen,
            writes,
            tokens,
            _watching: AbortOnDropHandle::new(watching),
        }
    }

    /// The last write of the Lease seen before `at` (the leader's last renewal).
    fn last_write_before(&self, at: Instant) -> Option<Instant> {
        self.writes.lock().unwrap().iter().rev().find(|w| **w < at).copied()
    }

    /// The tokens seen, and how many times one was not above the one before.
    fn token_regressions(&self) -> (usize, usize) {
        let tokens = self.tokens.lock().unwrap();
        (tokens.len(), tokens.windows(2).filter(|w| w[1] <= w[0]).count())
    }

    fn names(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|(_, h)| h.clone()).collect()
    }

    fn current(&self) -> Option<String> {
        self.seen
            .lock()
            .unwrap()
            .last()
            .map(|(_, h)| h.clone())
            .filter(|h| !h.is_empty())
    }

    /// When, after `since`, the Lease first named a holder other than `old`.
    fn other_after(&self, since: Instant, old: &str) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .find(|(at, holder)| *at >= since && !holder.is_empty() && holder != old)
            .map(|(at, _)| *at)
    }
}

/// One candidate process of the comparison and its proxy.
struct Candidate {
    child: Child,
    proxy: CountingProxy,
}

impl Candidate {
    async fn start(elector: Elector, n: usize, scheduler: &str, dir: &Path, env: &Env) -> Candidate {
        let proxy = CountingProxy::start(env.client().await).await;
        let kubeconfig = dir.join(format!("kubeconfig-{n}"));
        proxy.write_kubeconfig(&kubeconfig, ELECTION_NAMESPACE);
        let log = std::fs::File::create(dir.join(format!("{elector:?}-{n}.log"))).expect("log file");
        let mut command = match elector {
            Elector::Leasehold => {
                let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
                // Nothing here reads its API: the ports are the system's choice.
                command
                    .args(["sidecar", "--lock", elector.lease(), "--store", "kubernetes"])
                    .args(["--pod-name", &format!("bench-{n}")])
                    .args(["--http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
                    .env("KUBECONFIG", &kubeconfig)
                    .env("LEASEHOLD_LEASE_DURATION", "15s")
                    .env("LEASEHOLD_RENEW_DEADLINE", "10s")
                    .env("LEASEHOLD_RETRY_PERIOD", "2s")
                    .env("LEASEHOLD_DRAIN", "0s")
                    .env("LEASEHOLD_KUBERNETES", "false")
                    .env("LEASEHOLD_LOG", "info");
                command
            }
            Elector::ClientGo => {
                let config = dir.join(format!("scheduler-{n}.yaml"));
                std::fs::write(
                    &config,
                    format!(
                        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                         clientConnection: {{kubeconfig: {}}}\n\
                         leaderElection: {{leaderElect: true, resourceLock: leases, resourceName: {}, \
                         resourceNamespace: {ELECTION_NAMESPACE}, leaseDuration: 15s, renewDeadline: 10s, \
                         retryPeriod: 2s}}\n\
                         profiles: [{{schedulerName: leasehold-bench-nobody}}]\n",
                        kubeconfig.display(),
                        elector.lease()
                    ),
                )
                .expect("scheduler config");
                let mut parts = scheduler.split_whitespace();
                let mut command = Command::new(parts.next().expect("a command"));
                command
                    .args(parts)
                    .arg(format!("--config={}", config.display()))
                    .args(["--bind-address=127.0.0.1", "--secure-port=0"]);
                command
            }
        };
        let child = command
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {elector:?}: {e}"));
        Candidate { child, proxy }
    }

    fn signal(&mut self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status();
    }
}

/// Also when the harness panics: no candidate outlives it.
impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lease requests per minute over `window`, by verb and in all.
fn per_minute(counts: &Counts, window: Duration) -> String {
    let minutes = window.as_secs_f64() / 60.0;
    let total: u64 = counts.values().sum();
    let verbs: Vec<String> = counts
        .iter()
        .map(|(verb, n)| format!("{verb} {:.1}", *n as f64 / minutes))
        .collect();
    format!("{:.1}/min ({})", total as f64 / minutes, verbs.join(", "))
}

/// Both elections, the same way: for each, `reps` crash failovers (kill -9)
/// and graceful handovers (SIGTERM) of the first of three candidates, each
/// from a fresh start on a free Lease; in the first round, the Lease
/// requests per minute of the leader and of each follower over
/// LEASEHOLD_BENCH_K8S_COST_SECONDS (default 60) while the lease is held.
async fn elections(scheduler: &str, reps: usize) -> Vec<String> {
    let env = Env::from_vars();
    let client = env.client().await;
    let dir: PathBuf = std::env::temp_dir().join(format!("leasehold-bench-elections-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let window = Duration::from_secs(env_or("LEASEHOLD_BENCH_K8S_COST_SECONDS", 60));
    let leases: Api<Lease> = Api::namespaced(client, ELECTION_NAMESPACE);
    let mut lines = Vec::new();
    for elector in [Elector::Leasehold, Elector::ClientGo] {
        let name = elector.lease();
        let holders = Holders::follow(leases.clone(), name);
        for (signal, what) in [
            ("KILL", "crash failover (kill -9)"),
            ("TERM", "graceful handover (SIGTERM)"),
        ] {
            let (mut samples, mut from_renewal) = (Vec::new(), Vec::new());
            for rep in 0..reps {
                // A free Lease: the first candidate leads alone, the other two follow.
                let _ = leases.delete(name, &DeleteParams::default()).await;
                wait_for("the Lease deleted", Duration::from_secs(30), || async {
                    (leases.get_opt(name).await.ok()?.is_none() && holders.current().is_none()).then_some(())
                })
                .await;
                let mut first = Candidate::start(elector, 0, scheduler, &dir, &env).await;
                let leader = wait_for(&format!("{elector:?} leading"), FIRST_LEADER, || async {
                    holders.current()
                })
                .await;
                let others = [
                    Candidate::start(elector, 1, scheduler, &dir, &env).await,
                    Candidate::start(elector, 2, scheduler, &dir, &env).await,
                ];
                // The followers have read (or are watching) the Lease.
                tokio::time::sleep(Duration::from_secs(5)).await;
                if signal == "KILL" && rep == 0 {
                    let all = [&first, &others[0], &others[1]];
                    for candidate in all {
                        candidate.proxy.take();
                    }
                    tokio::time::sleep(window).await;
                    let counts: Vec<Counts> = all.iter().map(|c| c.proxy.take()).collect();
                    let line = format!(
                        "{elector:?} Lease requests per candidate over {window:?}: leader {}; followers {}, {}",
                        per_minute(&counts[0], window),
                        per_minute(&counts[1], window),
                        per_minute(&counts[2], window)
                    );
                    println!("{line}");
                    lines.push(line);
                    assert_eq!(
                        holders.current().as_deref(),
                        Some(leader.as_str()),
                        "the leader held throughout"
                    );
                }
                let signalled = Instant::now();
                first.signal(signal);
                let successor = loop {
                    if let Some(at) = holders.other_after(signalled, &leader) {
                        break at;
                    }
                    let holders = holders.names();
                    assert!(
                        signalled.elapsed() < Duration::from_secs(120),
                        "{elector:?}: no holder other than {leader} within 120 s of SIG{signal}; holders: {holders:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let took = successor - signalled;
                let since_renewal = holders.last_write_before(signalled).map(|w| successor - w);
                println!(
                    "{elector:?} {what} rep {rep}: {:.0} ms; {:.0} ms after the last renewal seen",
                    millis(took),
                    since_renewal.map_or(f64::NAN, millis)
                );
                samples.push(took);
                if let Some(since) = since_renewal {
                    from_renewal.push(since);
                }
                // Dropping a candidate ends its process.
                drop((first, others));
            }
            lines.push(format!(
                "{elector:?} {what}: {}; median/D = {:.3}; from the leader's last renewal seen: {}",
                summary(&mut samples),
                millis(median(&mut samples)) / millis(D),
                summary(&mut from_renewal)
            ));
        }
        if elector == Elector::Leasehold {
            let (tokens, regressions) = holders.token_regressions();
            lines.push(format!(
                "{elector:?} fencing tokens: {tokens} granted over the runs (the Lease deleted before each), \
                 {regressions} not above the one before"
            ));
        }
        let _ = leases.delete(name, &DeleteParams::default()).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    lines
}
