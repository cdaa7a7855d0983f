//! Publishing converges, through API server outages: three sidecars'
//! electors and publishers on one memory store and the stateful API server
//! model (`leasehold::testing::api::ApiServer`), on paused tokio time. The API server goes
//! away for 1 s, 30 s and 10 min while the leader changes; once it is back,
//! labels and readiness conditions must match the store's truth within a
//! bound, and at no instant while the API server is up may two pods carry
//! the leader label "true" or the leader condition True.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use leasehold::api::contract::LEADER_CONDITION;
use leasehold::lease::{Elector, ElectorHandle, LeaseStore};
use leasehold::sidecar::config::{Args, resolve};
use leasehold::sidecar::publish::{Publisher, holder_pod};
use leasehold::store::MemoryStore;
use leasehold::testing::api::{ApiServer, pods};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "prod";
const LABEL: &str = "leasehold.dev/leader";
/// The lease's timing (D/R/P), from the DistributedLease below.
const P: Duration = Duration::from_secs(2);
/// Convergence after the API server returns: the publisher's write backoff
/// and the pod watches' backoff are capped at 5 s and jittered up to twice
/// that; then a handful of requests (no latency in the model). 2 × 5 s + P
/// for a handover still in progress when the API returns, + 1 s margin.
const CONVERGES_WITHIN: Duration = Duration::from_secs(13);

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

struct Candidate {
    name: String,
    elector: ElectorHandle,
}

struct World {
    api: ApiServer,
    store: MemoryStore,
    candidates: Vec<Candidate>,
    violations: Arc<Mutex<Vec<String>>>,
}

fn lease() -> Value {
    json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
           "metadata": {"name": "web", "namespace": NAMESPACE},
           "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                    "leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s",
                    "selector": {"matchLabels": {"app": "web"}},
                    "publishing": {"readinessGate": true}}})
}

/// The flags of a sidecar in pod `name` following the DistributedLease "web".
fn lease_argv(name: &str) -> Vec<String> {
    [
        "--lease",
        "web",
        "--pod-name",
        name,
        "--pod-namespace",
        NAMESPACE,
        "--kubernetes",
        "true",
    ]
    .map(String::from)
    .to_vec()
}

/// One sidecar: settings from the DistributedLease, an elector on the
/// shared memory store, and the Kubernetes publisher.
async fn sidecar(api: &ApiServer, store: &MemoryStore, argv: &[&str]) -> ElectorHandle {
    let cli = Cli::parse_from(std::iter::once("sidecar").chain(argv.iter().copied()));
    let settings = resolve(&cli.args.election, Some(api.client(NAMESPACE)))
        .await
        .expect("settings");
    let elector = Elector::new(settings.lock.clone(), settings.identity.clone(), settings.timing);
    let transitions = elector.transitions();
    let shutdown = CancellationToken::new();
    let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let handle = elector.spawn(store, shutdown.clone());
    let (handle_state, control) = (handle.subscribe(), handle.control());
    let publisher = Publisher::new(api.client(NAMESPACE), settings.pod.expect("a pod"), settings.publishing);
    let (app_tx, app) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(async move {
        publisher.run(handle_state, transitions, app, control).await;
        drop(app_tx);
    });
    handle
}

async fn world() -> World {
    let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
    api.insert(
        "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases",
        lease(),
    );
    for i in 0..3 {
        let pod = pods::pod(
            &format!("web-{i}"),
            NAMESPACE,
            json!({"app": "web"}),
            Some(LEADER_CONDITION),
        );
        api.insert(&pods::collection(NAMESPACE), pod);
    }
    let violations = Arc::new(Mutex::new(Vec::new()));
    let seen = violations.clone();
    api.observe(move |snapshot| {
        if snapshot.down {
            return;
        }
        let claiming = |what: &str, claims: &dyn Fn(&Value) -> bool| {
            let names: Vec<&str> = snapshot
                .collection("/api/v1/namespaces/prod/pods")
                .filter(|p| claims(p))
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            (names.len() > 1).then(|| format!("{what} on {names:?} at {:?}", Instant::now()))
        };
        let labelled = claiming("label true", &|p| pods::label(p, LABEL) == Some("true"));
        let ready = claiming("condition True", &|p| {
            pods::condition(p, LEADER_CONDITION) == Some("True")
        });
        seen.lock().unwrap().extend(labelled.into_iter().chain(ready));
    });
    let store = MemoryStore::new(7);
    let mut candidates = Vec::new();
    for i in 0..3 {
        let name = format!("web-{i}");
        let argv = lease_argv(&name);
        let elector = sidecar(&api, &store, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
        candidates.push(Candidate { name, elector });
    }
    World {
        api,
        store,
        candidates,
        violations,
    }
}

impl World {
    /// The pod the store says leads, if any.
    async fn truth(&self) -> Option<String> {
        let observed = self.store.observe("prod/web").await.unwrap();
        observed.live_holder().and_then(holder_pod)
    }

    /// Whether every pod's label and condition say what the store says.
    fn matches(&self, truth: Option<&str>) -> bool {
        self.candidates.iter().all(|c| {
            let pod = self.api.get(&pods::collection(NAMESPACE), &c.name).unwrap();
            let leads = truth == Some(c.name.as_str());
            pods::label(&pod, LABEL) == Some(if leads { "true" } else { "false" })
                && pods::condition(&pod, LEADER_CONDITION) == Some(if leads { "True" } else { "False" })
        })
    }

    /// Polls every 100 ms until the pods match the store's truth; how long it took.
    async fn converge(&self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let truth = self.truth().await;
            if truth.is_some() && self.matches(truth.as_deref()) {
                return started.elapsed();
            }
            let pods: Vec<Value> = self
                .candidates
                .iter()
                .map(|c| {
                    let pod = self.api.get(&pods::collection(NAMESPACE), &c.name).unwrap();
                    json!([
                        c.name,
                        pods::label(&pod, LABEL),
                        pods::condition(&pod, LEADER_CONDITION)
                    ])
                })
                .collect();
            assert!(
                started.elapsed() <= within,
                "not converged {within:?} after the API server returned: store says {truth:?}, pods {pods:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn leader(&self) -> usize {
        self.candidates
            .iter()
            .position(|c| c.elector.state().is_leader_at(Instant::now()))
            .expect("a leader")
    }

    fn assert_no_violations(&self) {
        let violations = self.violations.lock().unwrap();
        assert!(
            violations.is_empty(),
            "two claims at once with the API up: {violations:?}"
        );
        assert!(
            self.api.forbidden().is_empty(),
            "outside the Role: {:?}",
            self.api.forbidden()
        );
    }
}

/// The leader steps down while the API server is away for `outage`;
/// another candidate takes over; the API server returns.
async fn outage_while_the_leader_changes(outage: Duration) -> Duration {
    let world = world().await;
    world.converge(Duration::from_secs(30)).await;
    world.assert_no_violations();
    let old = world.leader();

    world.api.set_down(true);
    let down = Instant::now();
    world.candidates[old].elector.set_campaigning(false);
    let mut state = world.candidates[old].elector.subscribe();
    state.wait_for(|s| !s.leader).await.unwrap();
    // Back in the race once another has taken over (else it might win again).
    while world.truth().await.is_none_or(|t| t == world.candidates[old].name) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let handed_over = down.elapsed();
    world.candidates[old].elector.set_campaigning(true);
    tokio::time::sleep_until(down + outage).await;
    world.api.set_down(false);

    let took = world.converge(CONVERGES_WITHIN).await;
    let truth = world.truth().await.unwrap();
    assert_ne!(truth, world.candidates[old].name, "another candidate leads");
    // And it stays converged.
    tokio::time::sleep(P * 5).await;
    assert!(world.matches(Some(&truth)), "diverged again");
    world.assert_no_violations();
    println!("outage {outage:?}: new leader after {handed_over:?}; converged {took:?} after the API server returned");
    took
}

#[tokio::test(start_paused = true)]
async fn labels_and_conditions_converge_after_a_1s_api_outage() {
    outage_while_the_leader_changes(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn labels_and_conditions_converge_after_a_30s_api_outage() {
    outage_while_the_leader_changes(Duration::from_secs(30)).await;
}

#[tokio::test(start_paused = true)]
async fn labels_and_conditions_converge_after_a_10min_api_outage() {
    outage_while_the_leader_changes(Duration::from_secs(600)).await;
}

/// The API server is down when the sidecars start: whether a pod is
/// readiness-gated is read from the watched pod once it can be read.
#[tokio::test(start_paused = true)]
async fn the_readiness_gate_is_read_from_the_watched_pod_not_once_at_start() {
    let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
    api.insert(
        "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases",
        lease(),
    );
    api.insert(
        &pods::collection(NAMESPACE),
        pods::pod("web-0", NAMESPACE, json!({"app": "web"}), Some(LEADER_CONDITION)),
    );
    let store = MemoryStore::new(1);
    let cli = Cli::parse_from(std::iter::once("sidecar").chain(lease_argv("web-0").iter().map(String::as_str)));
    let settings = resolve(&cli.args.election, Some(api.client(NAMESPACE))).await.unwrap();
    api.set_down(true);
    let elector = Elector::new(settings.lock.clone(), settings.identity.clone(), settings.timing);
    let transitions = elector.transitions();
    let handle = elector.spawn(Arc::new(store), CancellationToken::new());
    let publisher = Publisher::new(api.client(NAMESPACE), settings.pod.unwrap(), settings.publishing);
    let (_app_tx, app) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(publisher.run(handle.subscribe(), transitions, app, handle.control()));
    tokio::time::sleep(Duration::from_secs(60)).await;
    api.set_down(false);
    let up = Instant::now();
    loop {
        let pod = api.get(&pods::collection(NAMESPACE), "web-0").unwrap();
        if pods::condition(&pod, LEADER_CONDITION) == Some("True") && pods::label(&pod, LABEL) == Some("true") {
            break;
        }
        assert!(
            up.elapsed() < CONVERGES_WITHIN,
            "the gated leader never became Ready: {pod}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Standalone (no --lease): a new leader clears only candidates of its own
/// lock, not another application's leader in the same namespace.
#[tokio::test(start_paused = true)]
async fn standalone_clears_only_candidates_of_its_own_lock() {
    let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
    let collection = pods::collection(NAMESPACE);
    api.insert(&collection, pods::pod("web-0", NAMESPACE, json!({"app": "web"}), None));
    api.insert(
        &collection,
        pods::pod("other-0", NAMESPACE, json!({"app": "other", LABEL: "true"}), None),
    );
    let store = MemoryStore::new(1);
    let argv = [
        "--lock",
        "web",
        "--store",
        "memory",
        "--pod-name",
        "web-0",
        "--pod-namespace",
        NAMESPACE,
        "--kubernetes",
        "true",
    ];
    let handle = sidecar(&api, &store, &argv).await;
    let mut state = handle.subscribe();
    state.wait_for(|s| s.leader).await.unwrap();
    let started = Instant::now();
    while pods::label(&api.get(&collection, "web-0").unwrap(), LABEL) != Some("true") {
        assert!(started.elapsed() < CONVERGES_WITHIN, "web-0 never labelled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(P * 3).await;
    let other = api.get(&collection, "other-0").unwrap();
    assert_eq!(
        pods::label(&other, LABEL),
        Some("true"),
        "another app's leader was unlabelled: {other}"
    );
    assert!(api.forbidden().is_empty());
}
