//! A Deployment rollout of leasehold candidates (issue 16), in one process
//! on paused time: every candidate is a real elector with the sidecar's
//! Kubernetes publisher and peer watch (`sidecar::versions`), on one memory
//! store and the API server model. `replicas` old pods (revision 1) are
//! replaced one at a time in the order a Deployment with maxSurge 1 /
//! maxUnavailable 0 uses: a new pod (revision 2) starts, campaigns once its
//! app is ready (the app-health source), and only then is one old pod
//! terminated (SIGTERM: stop claiming, release, label false), then the next.
//! Among its equally ready old pods the Deployment controller does not
//! know which leads, so the old pod terminated is the leader when an old
//! pod leads: the order that costs `None` the most.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::lease::{Elector, ElectorHandle, Identity, LeaseStore, Prefer, Timing, Version};
use leasehold::sidecar::config::Publishing;
use leasehold::sidecar::pod::PodRef;
use leasehold::sidecar::publish::Publisher;
use leasehold::sidecar::versions::{Candidate, REVISION_ANNOTATION, Revisions, follow_peers};
use leasehold::store::{Faults, MemoryStore};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use leasehold::testing::api::{ApiServer, pods};

pub const NAMESPACE: &str = "prod";
const LOCK: &str = "prod/web";
/// D/R/P of the whole-process tests.
pub const TIMING: (Duration, Duration, Duration) = (
    Duration::from_millis(2000),
    Duration::from_millis(1500),
    Duration::from_millis(300),
);
/// Added before a store call takes effect and again before its reply.
pub const STORE_LATENCY: Duration = Duration::from_millis(5);
/// From a new pod's start to its app turning ready.
pub const APP_STARTS: Duration = Duration::from_secs(1);

/// What one rollout did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Acquisitions after the first leader's: leadership changes.
    pub handovers: usize,
    /// Time with no candidate claiming leadership, from the first leader to
    /// the end of the rollout (sampled every 10 ms of simulated time).
    pub leaderless: Duration,
    /// Acquisitions that moved leadership to a lower revision.
    pub backwards: usize,
    /// The revision of every acquisition, in commit order.
    pub revisions: Vec<Option<u64>>,
    /// How many of those committed before the last old pod was told to
    /// stop: while an old pod still ran.
    pub while_old_ran: usize,
}

struct Pod {
    name: String,
    handle: ElectorHandle,
    shutdown: CancellationToken,
}

/// A pod of ReplicaSet `replica_set` (its pod-template-hash), with its
/// `app` container ready or not.
pub fn pod_json(name: &str, replica_set: &str, ready: bool) -> Value {
    let mut pod = pods::pod(
        name,
        NAMESPACE,
        json!({"app": "web", "pod-template-hash": replica_set}),
        None,
    );
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": replica_set, "uid": replica_set, "controller": true}]);
    pod["status"]["containerStatuses"] =
        json!([{"name": "app", "ready": ready, "restartCount": 0, "image": "i", "imageID": "i"}]);
    pod
}

async fn start(api: &ApiServer, store: &MemoryStore, name: &str, revision: u64, prefer: Prefer, fence: bool) -> Pod {
    let (d, r, p) = TIMING;
    let timing = Timing::new(d, r, p, 0.2).expect("valid timing");
    let version = Version {
        revision,
        name: format!("web-r{revision}"),
    };
    let shutdown = CancellationToken::new();
    let elector = Elector::new(LOCK, Identity::new(None, Some(NAMESPACE.into()), name), timing)
        .with_version(Some(version.clone()), fence);
    let transitions = elector.transitions();
    let store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let handle = elector.spawn(store, shutdown.clone());
    // The app-health source: campaign once the app is ready.
    handle.set_campaigning(false);
    let reference = PodRef {
        name: name.into(),
        namespace: NAMESPACE.into(),
        uid: None,
    };
    let publishing = Publishing {
        label_key: "leasehold.dev/leader".into(),
        selector: "app=web".into(),
        candidate_labels: Default::default(),
    };
    let publisher = Publisher::new(api.client(NAMESPACE), reference, publishing);
    let (state, control) = (handle.subscribe(), handle.control());
    let (app_tx, app) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(async move {
        publisher.run(state, transitions, app, control).await;
        drop(app_tx);
    });
    if prefer != Prefer::None {
        tokio::spawn(follow_peers(
            kube::Api::namespaced(api.client(NAMESPACE), NAMESPACE),
            Revisions::new(kube::Api::namespaced(api.client(NAMESPACE), NAMESPACE)),
            Candidate {
                me: name.into(),
                selector: "app=web".into(),
                app_container: Some("app".into()),
                mine: Some(version),
                prefer,
                fence,
            },
            handle.control(),
            handle.subscribe(),
        ));
    }
    Pod {
        name: name.into(),
        handle,
        shutdown,
    }
}

/// The Deployment's ReplicaSets `web-r1` and `web-r2`, of revisions 1 and 2.
pub fn insert_replica_sets(api: &ApiServer) {
    for (rs, revision) in [("web-r1", 1), ("web-r2", 2)] {
        api.insert(
            &format!("/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": rs, "namespace": NAMESPACE,
                                "annotations": {REVISION_ANNOTATION: revision.to_string()}}}),
        );
    }
}

/// Changes the stored pod as the kubelet or the API server would, keeping
/// what the sidecars wrote.
pub fn update(api: &ApiServer, name: &str, change: impl FnOnce(&mut Value)) {
    let collection = pods::collection(NAMESPACE);
    let mut pod = api.get(&collection, name).expect("the pod exists");
    change(&mut pod);
    api.insert(&collection, pod);
}

/// Waits `delay` of simulated time, sampling every 10 ms whether anyone leads.
async fn watch_for(delay: Duration, pods: &[Pod], leaderless: &Mutex<(bool, Duration)>) {
    let end = Instant::now() + delay;
    while Instant::now() < end {
        let step = Duration::from_millis(10);
        tokio::time::sleep(step).await;
        let now = Instant::now();
        let led = pods.iter().any(|p| p.handle.state().is_leader_at(now));
        let mut seen = leaderless.lock().unwrap();
        if led {
            seen.0 = true;
        } else if seen.0 {
            seen.1 += step;
        }
    }
}

/// One rollout of `replicas` candidates from revision 1 to 2. Call on a
/// paused current-thread runtime.
pub async fn rollout(replicas: usize, prefer: Prefer, fence: bool) -> Outcome {
    let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
    insert_replica_sets(&api);
    let store = MemoryStore::new(11);
    // A store round trip of 10 ms, about a regional Spanner commit.
    store.set_faults(Faults {
        latency: STORE_LATENCY,
        ..Faults::default()
    });
    let leaderless = Mutex::new((false, Duration::ZERO));
    let mut live: Vec<Pod> = Vec::new();
    for i in 0..replicas {
        let name = format!("web-r1-{i}");
        api.insert(&pods::collection(NAMESPACE), pod_json(&name, "web-r1", true));
        let pod = start(&api, &store, &name, 1, prefer, fence).await;
        pod.handle.set_campaigning(true);
        live.push(pod);
    }
    // Settled: one old leader.
    watch_for(TIMING.0 * 2, &live, &leaderless).await;
    let before = store.acquisitions().len();
    let mut while_old_ran = 0;
    for i in 0..replicas {
        let name = format!("web-r2-{i}");
        api.insert(&pods::collection(NAMESPACE), pod_json(&name, "web-r2", false));
        live.push(start(&api, &store, &name, 2, prefer, fence).await);
        watch_for(APP_STARTS, &live, &leaderless).await;
        update(&api, &name, |pod| {
            pod["status"]["containerStatuses"][0]["ready"] = json!(true)
        });
        live.last().expect("just started").handle.set_campaigning(true);
        // The new pod is available: one old pod goes, the leader if an old one leads.
        let now = Instant::now();
        let old = |p: &Pod| p.name.starts_with("web-r1-");
        let victim = live
            .iter()
            .position(|p| old(p) && p.handle.state().is_leader_at(now))
            .or_else(|| live.iter().position(old))
            .expect("an old pod is left");
        let pod = live.remove(victim);
        if !live.iter().any(old) {
            while_old_ran = store.acquisitions().len();
        }
        pod.shutdown.cancel();
        update(&api, &pod.name, |pod| {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z")
        });
        let joined = tokio::spawn(pod.handle.join());
        watch_for(TIMING.2, &live, &leaderless).await;
        joined.await.expect("the elector ends");
        api.delete(&pods::collection(NAMESPACE), &pod.name);
        watch_for(TIMING.2 * 2, &live, &leaderless).await;
    }
    watch_for(TIMING.0 * 2, &live, &leaderless).await;
    let acquisitions = store.acquisitions();
    let revisions: Vec<Option<u64>> = acquisitions.iter().map(|a| a.revision).collect();
    let backwards = revisions.windows(2).filter(|w| w[1] < w[0]).count();
    for pod in &live {
        pod.shutdown.cancel();
    }
    let leaderless = leaderless.lock().unwrap().1;
    Outcome {
        handovers: acquisitions.len() - before,
        leaderless,
        backwards,
        revisions,
        while_old_ran,
    }
}
