//! The `kubernetes` part: handover on a real cluster, as a client of the
//! leader-only Service sees it. The cluster, the image and the stores come
//! from the end-to-end suite's variables (docs/e2e.md): run
//! `eval "$(scripts/e2e-cluster.sh up)"` first, or point them at your own
//! disposable cluster. For each event, N times (LEASEHOLD_BENCH_K8S_REPS,
//! default 3): how long the leader Service had no ready endpoint (watched
//! through the API), how often the leader label moved, and the moments with
//! two leaders (must be 0). Beside them, client-go's leader election
//! (kube-scheduler's `--leader-elect`, three processes on their own Lease,
//! same D/R/P) when LEASEHOLD_E2E_KUBE_SCHEDULER names its command.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::cluster::{Env, Scenario, scenario, wait_for};
use crate::fixtures::{APP, FIRST_LEADER, leader_only_service};
use crate::node::{kill_and_await_restart, signal_container};
use crate::{env_or, median, millis, summary};

/// The leaderless time counts until one leader has held for this long.
const SETTLED: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug)]
enum Event {
    /// `kubectl delete pod` of the leader, 30 s grace, the app ignoring SIGTERM.
    GracefulDelete,
    /// The same with an app that exits on SIGTERM.
    GracefulDeleteAppExits,
    /// The leader's sidecar container killed (the kubelet restarts it).
    SidecarKilled,
    /// The leader's app container killed.
    AppKilled,
    /// Every process of the leader pod killed, no Kubernetes signal.
    PodKilled,
    /// `kubectl rollout restart` of the 3 replicas, `prefer: Newest`.
    RolloutRestart,
}

/// An app that exits on SIGTERM: a shell that traps it, as most servers do.
const EXITING_APP: [&str; 3] = ["/bin/busybox", "sh", "-c"];
const EXITING_SCRIPT: &str = "trap 'exit 0' TERM; /bin/busybox httpd -f -p 8080 & wait";

pub fn kubernetes() -> Vec<String> {
    let reps = env_or("LEASEHOLD_BENCH_K8S_REPS", 3) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut lines = Vec::new();
    for event in [
        Event::GracefulDelete,
        Event::GracefulDeleteAppExits,
        Event::SidecarKilled,
        Event::AppKilled,
        Event::PodKilled,
        Event::RolloutRestart,
    ] {
        let outcome = runtime.block_on(measure(event, reps));
        println!("{outcome}");
        lines.push(outcome);
    }
    if let Ok(command) = std::env::var("LEASEHOLD_E2E_KUBE_SCHEDULER") {
        lines.extend(runtime.block_on(client_go(&command, reps)));
    } else {
        lines.push("client-go: not run (LEASEHOLD_E2E_KUBE_SCHEDULER unset)".into());
    }
    lines
}

async fn measure(event: Event, reps: usize) -> String {
    let (mut gaps, moves, doubles) = scenario("e2e-bench", |s| async move {
        let (mut gaps, mut moves) = (Vec::new(), Vec::new());
        let spec = match event {
            Event::RolloutRestart => json!({"leadership": {"prefer": "Newest"}}),
            _ => json!({}),
        };
        let (_store, watcher) = leader_only_service(&s, spec).await;
        if matches!(event, Event::GracefulDeleteAppExits) {
            let patch = json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "command": EXITING_APP.iter().copied().chain([EXITING_SCRIPT]).collect::<Vec<_>>()}]}}}});
            let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = s.api();
            deployments
                .patch("scheduler", &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(patch))
                .await
                .expect("an app that exits on SIGTERM");
        }
        for _ in 0..reps {
            let leader = settled_leader(&s, &watcher).await;
            let moves_before = watcher.moves();
            let started = Instant::now();
            match event {
                Event::GracefulDelete | Event::GracefulDeleteAppExits => {
                    s.api::<Pod>().delete(&leader, &DeleteParams::default()).await.expect("graceful delete");
                }
                Event::SidecarKilled => kill_and_await_restart(&s, &leader, "leasehold").await,
                Event::AppKilled => kill_and_await_restart(&s, &leader, "app").await,
                Event::PodKilled => {
                    signal_container(&s, &leader, "app", "KILL").await;
                    signal_container(&s, &leader, "leasehold", "KILL").await;
                }
                Event::RolloutRestart => {
                    s.kubectl_ns(&["rollout", "restart", "deployment/scheduler"]);
                    s.kubectl_ns(&["rollout", "status", "deployment/scheduler", "--timeout=300s"]);
                }
            }
            settled_leader(&s, &watcher).await;
            let ended = Instant::now() - SETTLED;
            gaps.push(watcher.leaderless_between(started, ended));
            moves.push(watcher.moves() - moves_before);
        }
        let doubles = watcher.violations().len();
        watcher.finish();
        (gaps, moves, doubles)
    })
    .await;
    format!(
        "{event:?}: no leader endpoint {}; leader moves per event {:?}; moments with two leaders {doubles}",
        summary(&mut gaps),
        moves
    )
}

/// One leader, the Service's one endpoint, unchanged for [`SETTLED`], every
/// candidate running: the state an event starts from and a handover ends in.
async fn settled_leader(s: &Scenario, watcher: &crate::watcher::LeadershipWatcher) -> String {
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

/// kube-scheduler's leader election on the same API server: three processes
/// on a Lease of their own, a profile no pod uses (they schedule nothing),
/// D/R/P 15/10/2 s. Failover is the time from the signal until the Lease
/// names another process that then renews.
async fn client_go(command: &str, reps: usize) -> Vec<String> {
    let env = Env::from_vars();
    let client = env.client().await;
    let dir = std::env::temp_dir().join(format!("leasehold-bench-client-go-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("scheduler.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
             clientConnection: {{kubeconfig: {}}}\n\
             leaderElection: {{leaderElect: true, resourceLock: leases, resourceName: bench-client-go, \
             resourceNamespace: default, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}}\n\
             profiles: [{{schedulerName: leasehold-bench-nobody}}]\n",
            env.kubeconfig.display()
        ),
    )
    .expect("scheduler config");
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let holder = || async { leases.get_opt("bench-client-go").await.ok()??.spec?.holder_identity };
    let start = |n: usize| -> Child {
        let log = std::fs::File::create(dir.join(format!("scheduler-{n}.log"))).expect("log");
        let mut parts = command.split_whitespace();
        Command::new(parts.next().expect("a command"))
            .args(parts)
            .arg(format!("--config={}", config.display()))
            .args(["--bind-address=127.0.0.1", "--secure-port=0"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting kube-scheduler")
    };
    let mut lines = Vec::new();
    for (signal, label) in [
        ("KILL", "client-go crash failover (kill -9)"),
        ("TERM", "client-go graceful handover (SIGTERM)"),
    ] {
        let mut samples = Vec::new();
        for _ in 0..reps {
            // The first process leads alone; the other two follow.
            let mut first = start(0);
            let leader = wait_for("kube-scheduler leading", FIRST_LEADER, || async {
                holder().await.filter(|h| !h.is_empty())
            })
            .await;
            let mut others = [start(1), start(2)];
            tokio::time::sleep(Duration::from_secs(5)).await;
            let started = Instant::now();
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(first.id().to_string())
                .status();
            let _ = first.wait();
            wait_for("another kube-scheduler leading", Duration::from_secs(120), || async {
                holder().await.filter(|h| !h.is_empty() && *h != leader)
            })
            .await;
            samples.push(started.elapsed());
            for other in &mut others {
                let _ = other.kill();
                let _ = other.wait();
            }
            // The next round starts from a free Lease.
            let _ = leases.delete("bench-client-go", &DeleteParams::default()).await;
        }
        lines.push(format!(
            "{label}: {}; median/D = {:.2}",
            summary(&mut samples),
            millis(median(&mut samples)) / 15_000.0
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    lines
}
