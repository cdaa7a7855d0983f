//! The publisher against the in-memory API model: the order of its writes,
//! its preconditions, the peer watch's nudges and the Events.

use super::*;
use leasehold_testkit::api::{ApiServer, Recorded, pods};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const KEY: &str = "leasehold.dev/leader";

fn api() -> ApiServer {
    ApiServer::new(Some(crate::rbac::allows_request))
}

fn publisher(api: &ApiServer) -> Publisher {
    let pod = PodRef {
        name: "web-0".into(),
        namespace: "prod".into(),
        uid: Some("uid-0".into()),
    };
    let publishing = Publishing {
        label_key: KEY.into(),
        selector: "app=web".into(),
        candidate_labels: Default::default(),
    };
    Publisher::new(api.client("prod"), pod, publishing)
}

fn add_pod(api: &ApiServer, name: &str, leader: &str, condition: Option<&str>, gated: bool) {
    let mut pod = pods::pod(
        name,
        "prod",
        json!({"app": "web", KEY: leader}),
        gated.then_some(LEADER_CONDITION),
    );
    if let Some(status) = condition {
        pod["status"]["conditions"] = json!([{"type": LEADER_CONDITION, "status": status}]);
    }
    api.insert(&pods::collection("prod"), pod);
}

fn pod(api: &ApiServer, name: &str) -> Value {
    api.get(&pods::collection("prod"), name).unwrap()
}

fn leading() -> LeaderState {
    let now = Instant::now();
    LeaderState {
        leader: true,
        holder: Some("prod/web-0#abc".into()),
        deadline: Some(now + Duration::from_secs(3600)),
        renewed: Some(now),
        ..Default::default()
    }
}

/// Runs the publisher with `state`; the elector's controls come from a
/// real elector that never acquires (its store is down).
fn start(publisher: Publisher, state: watch::Receiver<LeaderState>) -> tokio::task::JoinHandle<()> {
    let store = leasehold_core::store::memory::MemoryStore::new(1);
    store.set_faults(leasehold_core::store::memory::Faults {
        down: true,
        ..Default::default()
    });
    let timing = leasehold_core::lease::Timing::default();
    let elector =
        leasehold_core::lease::Elector::new("idle", leasehold_core::lease::Identity::new(None, None, "x"), timing);
    let transitions = elector.transitions();
    let handle = elector.spawn(std::sync::Arc::new(store), CancellationToken::new());
    let app = watch::channel(AppHealth::default());
    tokio::spawn(async move {
        publisher.run(state, transitions, app.1, handle.control()).await;
        drop((app.0, handle));
    })
}

/// Waits (paused time) until `done` holds for the model, at most a minute.
async fn until(api: &ApiServer, what: &str, done: impl Fn(&ApiServer) -> bool) {
    let started = Instant::now();
    while !done(api) {
        assert!(started.elapsed() < Duration::from_secs(60), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn patches(api: &ApiServer) -> Vec<Recorded> {
    api.requests().into_iter().filter(|r| r.method == "PATCH").collect()
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_clears_other_leaders_then_labels_itself_then_becomes_ready() {
    let api = api();
    add_pod(&api, "web-0", "false", None, true);
    add_pod(&api, "web-1", "true", Some("True"), true);
    let stale = pod(&api, "web-1")["metadata"]["resourceVersion"].clone();
    let (_state, rx) = watch::channel(leading());
    start(publisher(&api), rx);
    until(&api, "ready", |api| {
        pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("True")
    })
    .await;

    let patches = patches(&api);
    let order: Vec<(&str, &str)> = patches
        .iter()
        .map(|r| (r.uri.as_str(), r.content_type.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            (
                "/api/v1/namespaces/prod/pods/web-1/status?",
                "application/strategic-merge-patch+json"
            ),
            ("/api/v1/namespaces/prod/pods/web-1?", "application/merge-patch+json"),
            ("/api/v1/namespaces/prod/pods/web-0?", "application/merge-patch+json"),
            (
                "/api/v1/namespaces/prod/pods/web-0/status?",
                "application/strategic-merge-patch+json"
            ),
        ],
        "the stale leader's readiness, then its label, then ours, then our readiness"
    );
    let cleared = &patches[0].body;
    assert_eq!(cleared["metadata"]["resourceVersion"], stale, "guarded by what we saw");
    assert_eq!(cleared["status"]["conditions"][0]["type"], LEADER_CONDITION);
    assert_eq!(cleared["status"]["conditions"][0]["status"], "False");
    let unlabelled = &patches[1].body;
    assert_eq!(unlabelled["metadata"]["labels"], json!({KEY: "false"}));
    assert!(unlabelled["metadata"]["resourceVersion"].is_string());
    assert_eq!(patches[2].body["metadata"]["labels"], json!({KEY: "true"}));
    let condition = &patches[3].body["status"]["conditions"][0];
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "Leader");
    assert!(condition["lastTransitionTime"].is_string());
    // The watches: our pod by name, the candidates by the lease's selector.
    let watches: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.uri.contains("watch=true"))
        .map(|r| r.uri)
        .collect();
    assert!(
        watches
            .iter()
            .any(|u| u.contains("fieldSelector=metadata.name%3Dweb-0")),
        "{watches:?}"
    );
    assert!(
        watches.iter().any(|u| u.contains("labelSelector=app%3Dweb")),
        "{watches:?}"
    );
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    assert_eq!(pods::label(&pod(&api, "web-1"), KEY), Some("false"));
}

/// A stalled old leader's pod: condition still True, but its sidecar
/// has the gate probe and the kubelet has the pod unready (`ready`).
fn add_stalled_peer(api: &ApiServer, ready: &str) {
    add_pod(api, "web-1", "true", Some("True"), true);
    let mut peer = pod(api, "web-1");
    peer["spec"]["initContainers"] = json!([{
        "name": SIDECAR_CONTAINER, "restartPolicy": "Always",
        "readinessProbe": {"httpGet": {"path": GATE_PROBE_PATH, "port": 4041}},
    }]);
    peer["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Ready", "status": ready}));
    api.insert(&pods::collection("prod"), peer);
}

/// web-0 leads beside the stalled peer (Ready `ready`) until web-0's
/// own leader condition is True; the leader's state stays open with the
/// sender returned.
async fn lead_beside_a_stalled_peer(ready: &str) -> (ApiServer, watch::Sender<LeaderState>) {
    let api = api();
    add_pod(&api, "web-0", "false", None, true);
    add_stalled_peer(&api, ready);
    let (state, rx) = watch::channel(leading());
    start(publisher(&api), rx);
    until(&api, "ready", |api| {
        pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("True")
    })
    .await;
    (api, state)
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_does_not_wait_on_a_stalled_peers_condition_the_kubelet_keeps_unready() {
    let (api, _state) = lead_beside_a_stalled_peer("False").await;
    let uris: Vec<String> = patches(&api).into_iter().map(|r| r.uri).collect();
    assert_eq!(
        uris,
        [
            "/api/v1/namespaces/prod/pods/web-1?",
            "/api/v1/namespaces/prod/pods/web-0?",
            "/api/v1/namespaces/prod/pods/web-0/status?",
        ],
        "the peer's label is cleared, its condition (which only its own sidecar may change) is not"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probed_peer_that_is_still_ready_is_cleared_before_we_mark_ourselves() {
    let (api, _state) = lead_beside_a_stalled_peer("True").await;
    let first = &patches(&api)[0];
    assert_eq!(first.uri, "/api/v1/namespaces/prod/pods/web-1/status?");
    assert_eq!(first.body["status"]["conditions"][0]["status"], "False");
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_stops_claiming_turns_unready_before_relabelling() {
    let api = api();
    add_pod(&api, "web-0", "true", Some("True"), true);
    let (_state, rx) = watch::channel(LeaderState::default());
    start(publisher(&api), rx);
    until(&api, "labelled false", |api| {
        pods::label(&pod(api, "web-0"), KEY) == Some("false")
    })
    .await;
    let patches = patches(&api);
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[0].uri, "/api/v1/namespaces/prod/pods/web-0/status?");
    assert_eq!(patches[0].body["status"]["conditions"][0]["status"], "False");
    assert_eq!(patches[0].body["status"]["conditions"][0]["reason"], "Follower");
    assert_eq!(patches[1].uri, "/api/v1/namespaces/prod/pods/web-0?");
    assert_eq!(patches[1].body["metadata"]["labels"], json!({KEY: "false"}));
}

#[tokio::test(start_paused = true)]
async fn without_a_readiness_gate_only_the_label_is_written() {
    let api = api();
    add_pod(&api, "web-0", "true", None, false);
    let (_state, rx) = watch::channel(LeaderState::default());
    start(publisher(&api), rx);
    until(&api, "labelled false", |api| {
        pods::label(&pod(api, "web-0"), KEY) == Some("false")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let patches = patches(&api);
    assert_eq!(
        patches.len(),
        1,
        "no status patch for a pod without the gate: {patches:?}"
    );
}

/// A brief leader's late clear cannot undo the real leader's "true": the
/// pod changed since the clear was decided, and the API server answers 409.
#[tokio::test(start_paused = true)]
async fn a_late_clear_fails_on_the_resource_version_it_saw() {
    let api = api();
    add_pod(&api, "web-1", "true", None, false);
    let seen = pod(&api, "web-1")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // The real leader re-labels its pod meanwhile (a new resourceVersion).
    let mut relabelled = pod(&api, "web-1");
    relabelled["metadata"]["labels"]["touched"] = json!("yes");
    api.insert(&pods::collection("prod"), relabelled);
    let late = publisher(&api).perform(&Write::Label {
        pod: "web-1".into(),
        leader: false,
        version: seen,
    });
    match late.await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("a stale clear must conflict: {other:?}"),
    }
    assert_eq!(pods::label(&pod(&api, "web-1"), KEY), Some("true"));
}

/// Level-triggered: whatever else changes our label, the leader writes it back.
#[tokio::test(start_paused = true)]
async fn our_label_and_condition_are_reasserted_when_something_else_changes_them() {
    let api = api();
    add_pod(&api, "web-0", "false", None, true);
    let (_state, rx) = watch::channel(leading());
    start(publisher(&api), rx);
    let claims = |api: &ApiServer| {
        let p = pod(api, "web-0");
        pods::label(&p, KEY) == Some("true") && pods::condition(&p, LEADER_CONDITION) == Some("True")
    };
    until(&api, "claiming", claims).await;
    let mut changed = pod(&api, "web-0");
    changed["metadata"]["labels"][KEY] = json!("false");
    changed["status"]["conditions"][0]["status"] = json!("False");
    api.insert(&pods::collection("prod"), changed);
    assert!(!claims(&api));
    until(&api, "claiming again", claims).await;
}

/// Writes towards "leader" failing for a minute (backoff at its cap, the
/// API server otherwise up) do not delay stopping to claim once that is
/// what the elector says: no backoff and no write in flight stands between.
#[tokio::test(start_paused = true)]
async fn stopping_to_claim_never_waits_behind_retries_of_another_write() {
    let api = api();
    add_pod(&api, "web-0", "true", Some("True"), true);
    add_pod(&api, "web-1", "true", None, false);
    api.fail_when(Some(|method, path| method == "PATCH" && path.contains("/pods/web-1")));
    let (state, rx) = watch::channel(leading());
    start(publisher(&api), rx);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let failed = patches(&api).iter().filter(|r| r.status == 500).count();
    assert!(
        (6..60).contains(&failed),
        "retried with capped backoff: {failed} attempts in a minute"
    );
    let before = api.requests().len();
    state.send_replace(LeaderState::default());
    let stopped = Instant::now();
    until(&api, "not ready", |api| {
        pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("False")
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_millis(100),
        "{:?}",
        stopped.elapsed()
    );
    let after: Vec<Recorded> = api.requests()[before..]
        .iter()
        .filter(|r| r.method == "PATCH")
        .cloned()
        .collect();
    assert_eq!(after[0].uri, "/api/v1/namespaces/prod/pods/web-0/status?", "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn acquisitions_losses_and_releases_become_events_on_the_pod() {
    let api = api();
    let publisher = publisher(&api);
    let state = |change: Change| LeaderState {
        term: 4,
        token: Some(leasehold_core::lease::FencingToken(9)),
        change,
        ..Default::default()
    };
    for change in [
        Change::Acquired,
        Change::Renewed,
        Change::DeadlineMissed,
        Change::Released,
    ] {
        publisher.announcer.announce(&state(change)).await;
    }
    let posts: Vec<Recorded> = api.requests().into_iter().filter(|r| r.method == "POST").collect();
    let reasons: Vec<(&str, &str)> = posts
        .iter()
        .map(|r| (r.body["reason"].as_str().unwrap(), r.body["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        reasons,
        [("Acquired", "Normal"), ("Lost", "Warning"), ("Released", "Normal")],
        "renewals are not news"
    );
    for post in &posts {
        assert_eq!(post.path(), "/apis/events.k8s.io/v1/namespaces/prod/events");
        assert_eq!(post.body["regarding"]["kind"], "Pod");
        assert_eq!(post.body["regarding"]["name"], "web-0");
        assert_eq!(post.body["regarding"]["uid"], "uid-0");
        assert_eq!(post.body["reportingController"], "leasehold-sidecar");
    }
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
}

/// An Event on each change of the app's health (docs/operator.md): the
/// reason and type say which way it went, the note why. A change back
/// to a reason already recorded is the same Event again: kube-runtime's
/// `events::Recorder` records a repeat (same reason, type, action and
/// pod) as the events API's series, a PATCH counting it
/// (`series.count`), as client-go's `tools/events` does.
#[tokio::test(start_paused = true)]
async fn each_change_of_the_apps_health_becomes_an_event_on_the_pod() {
    let api = api();
    let publisher = publisher(&api);
    let (_transitions_tx, transitions) = broadcast::channel(4);
    let (app_tx, app) = watch::channel(AppHealth::default());
    let announcer = tokio::spawn(publisher.announcer.clone().run(transitions, app));
    let events = |api: &ApiServer| -> Vec<(String, String, String, u64)> {
        api.requests()
            .into_iter()
            .filter(|r| r.path().starts_with("/apis/events.k8s.io/v1/namespaces/prod/events"))
            .map(|r| {
                assert_eq!(r.body["regarding"]["name"], "web-0");
                let field = |name: &str| r.body[name].as_str().unwrap_or_default().to_string();
                let count = r.body["series"]["count"].as_u64().unwrap_or(1);
                (r.method.clone(), field("reason"), field("type"), count)
            })
            .collect()
    };
    let changes = [
        (Some(true), "url: answered 200"),
        (Some(false), "url: answered 500"),
        (None, "url: no answer yet"),
        (Some(true), "url: answered 204"),
    ];
    for (seen, (healthy, reason)) in changes.into_iter().enumerate() {
        app_tx.send_replace(AppHealth {
            healthy,
            reason: reason.into(),
        });
        until(&api, "an Event for the change", |api| events(api).len() > seen).await;
    }
    let expected = [
        ("POST", "AppHealthy", "Normal", 1),
        ("POST", "AppUnhealthy", "Warning", 1),
        ("POST", "AppHealthUnknown", "Warning", 1),
        ("PATCH", "AppHealthy", "Normal", 2),
    ]
    .map(|(method, reason, type_, count)| (method.to_string(), reason.to_string(), type_.to_string(), count));
    assert_eq!(events(&api), expected, "one Event per change");
    let notes: Vec<Value> = api.requests().iter().map(|r| r.body["note"].clone()).take(3).collect();
    assert_eq!(notes, ["url: answered 200", "url: answered 500", "url: no answer yet"]);
    announcer.abort();
}

/// web-0's elector and publisher, following a lease web-1 holds for an
/// hour (P = 30 s), campaigning or not, with web-1 labelled "true".
async fn follower_of_web1(
    api: &ApiServer,
    store: &leasehold_core::store::memory::MemoryStore,
    campaigning: bool,
) -> (leasehold_core::lease::ElectorHandle, leasehold_core::lease::Grant) {
    use leasehold_core::lease::LeaseStore;
    add_pod(api, "web-0", "false", None, false);
    add_pod(api, "web-1", "true", None, false);
    let lease = Duration::from_secs(3600);
    let grant = store.acquire("web", "prod/web-1#abc", lease).await.unwrap();
    let timing = leasehold_core::lease::Timing::new(
        Duration::from_secs(120),
        Duration::from_secs(60),
        Duration::from_secs(30),
        0.0,
    )
    .unwrap();
    let elector = leasehold_core::lease::Elector::new(
        "web",
        leasehold_core::lease::Identity::new(None, Some("prod".into()), "web-0"),
        timing,
    );
    let transitions = elector.transitions();
    let handle = elector.spawn(std::sync::Arc::new(store.clone()), CancellationToken::new());
    handle.set_campaigning(campaigning);
    let app = watch::channel(AppHealth::default());
    tokio::spawn(publisher(api).run(handle.subscribe(), transitions, app.1, handle.control()));
    (handle, grant)
}

fn label_web1_false(api: &ApiServer) {
    let mut released = pod(api, "web-1");
    released["metadata"]["labels"][KEY] = json!("false");
    api.insert(&pods::collection("prod"), released);
}

/// The holder's pod turning its label to "false" makes a follower look
/// at the store at once instead of at its next poll (P = 30 s here).
#[tokio::test(start_paused = true)]
async fn the_leaders_label_turning_false_makes_a_follower_acquire_at_once() {
    use leasehold_core::lease::LeaseStore;
    let api = api();
    let store = leasehold_core::store::memory::MemoryStore::new(1);
    let (handle, grant) = follower_of_web1(&api, &store, true).await;
    let mut state = handle.subscribe();
    state
        .wait_for(|s| s.holder.as_deref() == Some("prod/web-1#abc"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    store.release("web", "prod/web-1#abc", grant.token).await.unwrap();
    label_web1_false(&api);
    let at = Instant::now();
    state.wait_for(|s| s.leader).await.unwrap();
    assert!(
        at.elapsed() < Duration::from_secs(1),
        "acquired only after {:?}",
        at.elapsed()
    );
}

/// Issue 16: the old leader stands aside the moment the new pod's app
/// turns ready, which is when the new pod starts campaigning, so its
/// first observation is still in flight (it does not know the holder)
/// when the leader's label turns "false", and that observation finds
/// the lease still held (the release commits later). A pod labelled
/// "true" turning "false" nudges it anyway: it leads in store round
/// trips, not at its next poll (30 s).
#[tokio::test(start_paused = true)]
async fn a_leader_turning_false_nudges_a_follower_that_does_not_know_the_holder_yet() {
    use leasehold_core::lease::LeaseStore;
    let api = api();
    let store = leasehold_core::store::memory::MemoryStore::new(1);
    let (handle, grant) = follower_of_web1(&api, &store, false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(handle.state().holder, None, "not campaigning, never observed");
    store.set_faults(leasehold_core::store::memory::Faults {
        latency: Duration::from_millis(5),
        ..Default::default()
    });
    let at = Instant::now();
    handle.set_campaigning(true);
    label_web1_false(&api);
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::spawn(async move { store.release("web", "prod/web-1#abc", grant.token).await });
    let mut state = handle.subscribe();
    let first = state.wait_for(|s| s.holder.is_some()).await.unwrap().clone();
    assert_eq!(
        first.holder.as_deref(),
        Some("prod/web-1#abc"),
        "the first look missed the release"
    );
    state.wait_for(|s| s.leader).await.unwrap();
    assert!(
        at.elapsed() < Duration::from_secs(1),
        "acquired only after {:?}",
        at.elapsed()
    );
}

/// Issue 25: a leader's label turns "false" when it stops claiming, a
/// drain before it releases. Once released it says so on its own leader
/// condition (after the label), also on a pod without the readiness gate.
#[tokio::test(start_paused = true)]
async fn after_a_release_the_pod_says_so_on_its_leader_condition() {
    let api = api();
    add_pod(&api, "web-0", "true", None, false);
    let released = LeaderState {
        term: 4,
        change: Change::Released,
        ..Default::default()
    };
    let (_state, rx) = watch::channel(released);
    start(publisher(&api), rx);
    until(&api, "marked released", |api| {
        pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("False")
    })
    .await;
    let patches = patches(&api);
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(
        patches[0].body["metadata"]["labels"],
        json!({KEY: "false"}),
        "the label first"
    );
    assert_eq!(patches[1].uri, "/api/v1/namespaces/prod/pods/web-0/status?");
    let condition = &patches[1].body["status"]["conditions"][0];
    assert_eq!(condition["reason"], RELEASED_REASON);
    assert_eq!(condition["message"], "released term 4");
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
}

/// The holder's pod saying it released (its label turned "false" a
/// drain earlier, longer than the hurry after that nudge) makes a
/// follower acquire at once instead of at its next poll (P = 30 s):
/// any change of the holder's pod while labelled "false" nudges it.
#[tokio::test(start_paused = true)]
async fn a_leader_saying_it_released_makes_a_follower_acquire_at_once() {
    use leasehold_core::lease::LeaseStore;
    let api = api();
    let store = leasehold_core::store::memory::MemoryStore::new(1);
    let (handle, grant) = follower_of_web1(&api, &store, true).await;
    let mut state = handle.subscribe();
    state
        .wait_for(|s| s.holder.as_deref() == Some("prod/web-1#abc"))
        .await
        .unwrap();
    label_web1_false(&api);
    // Past the hurry that nudge started (one P), and just after a poll:
    // the next one is a whole P (30 s) away.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let reads = store.calls().reads;
    while store.calls().reads == reads {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!handle.state().leader, "web-1 drains, still holding the lease");

    store.release("web", "prod/web-1#abc", grant.token).await.unwrap();
    let mut released = pod(&api, "web-1");
    released["status"]["conditions"] = json!([{"type": LEADER_CONDITION, "status": "False",
        "reason": RELEASED_REASON, "message": released_message(grant.term)}]);
    api.insert(&pods::collection("prod"), released);
    let at = Instant::now();
    state.wait_for(|s| s.leader).await.unwrap();
    assert!(
        at.elapsed() < Duration::from_secs(1),
        "acquired only after {:?}",
        at.elapsed()
    );
}

#[test]
fn holder_identities_name_their_pod() {
    assert_eq!(holder_pod("eu/prod/web-1#abc").as_deref(), Some("web-1"));
    assert_eq!(holder_pod("prod/web-1#abc").as_deref(), Some("web-1"));
    assert_eq!(holder_pod("web-1#abc").as_deref(), Some("web-1"));
    assert_eq!(holder_pod("not an identity"), None);
}
