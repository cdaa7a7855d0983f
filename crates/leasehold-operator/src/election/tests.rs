//! The Lease election against the stateful API model (an update whose
//! resourceVersion is not the current one is a 409; watches stream every
//! change), on tokio's paused clock so the bounds below are exact. Every
//! request is checked against the operator's RBAC.

use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::metrics::Metrics;
use crate::rbac;
use crate::stores::SingleStore;
use leasehold_core::store::memory::MemoryStore;
use leasehold_testkit::api::ApiServer;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/leasehold-system/leases";

/// The API model, and when the Lease changed.
#[derive(Clone)]
struct FakeApi {
    server: ApiServer,
    /// (when, resourceVersion) of every change of the Lease.
    changes: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Default for FakeApi {
    fn default() -> Self {
        let server = ApiServer::new(Some(rbac::allows_request));
        // The namespace exists, so the cluster's resourceVersion is past 0
        // (an etcd revision never is 0; the store refuses it).
        server.insert(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "leasehold-system"}}),
        );
        let changes: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let seen = changes.clone();
        server.observe(move |snapshot| {
            let Some(lease) = snapshot.collection(LEASES).next() else {
                return;
            };
            let version = lease["metadata"]["resourceVersion"].as_str().unwrap().to_string();
            let mut changes = seen.lock().unwrap();
            if changes.last().is_none_or(|(_, v)| *v != version) {
                changes.push((Instant::now(), version));
            }
        });
        FakeApi { server, changes }
    }
}

impl FakeApi {
    fn lease(&self) -> Option<Value> {
        self.server.get(LEASES, DEFAULT_LEASE_NAME)
    }

    fn holder(&self) -> Option<String> {
        self.lease()?["spec"]["holderIdentity"].as_str().map(str::to_string)
    }

    fn version(&self) -> String {
        self.lease()
            .map(|l| l["metadata"]["resourceVersion"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    /// Another replica writes the Lease (a renewal or a takeover).
    fn write_as(&self, holder: &str, transitions: i64) {
        let second = self.server.requests().len() % 60;
        self.server.insert(
            LEASES,
            json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": "leasehold-system"},
                // A renewTime far in the past: takeover must not judge by it.
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1, "leaseTransitions": transitions,
                         "renewTime": format!("2000-01-01T00:00:{second:02}.000000Z")},
            }),
        );
    }

    /// (method, body) of every Lease write the operator made that succeeded.
    fn writes(&self) -> Vec<(String, Value)> {
        let requests = self.server.requests().into_iter();
        requests
            .filter(|r| r.uri.starts_with(LEASES) && matches!(r.method.as_str(), "POST" | "PUT") && r.status / 100 == 2)
            .map(|r| (r.method, r.body))
            .collect()
    }

    fn changes(&self) -> Vec<(Instant, String)> {
        self.changes.lock().unwrap().clone()
    }

    fn forbidden(&self) -> Vec<String> {
        self.server.forbidden()
    }
}

type Shared = FakeApi;

struct Replica {
    role: watch::Receiver<Role>,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    running: tokio::task::JoinHandle<()>,
}

fn timing() -> Timing {
    Timing::parse("1s", "600ms", "100ms", 0.0).unwrap()
}

/// Starts one operator replica electing on the fake API server's Lease.
fn replica(api: &Shared, name: &str) -> Replica {
    let client = api.server.client("default");
    let stores = Arc::new(SingleStore::new(Arc::new(MemoryStore::new(1))));
    let (controller, metrics) = crate::tests::controller_on(client.clone(), stores);
    let election = LeaseElection::new(
        DEFAULT_LEASE_NAME.into(),
        "leasehold-system".into(),
        Identity::with_nonce(name, "n"),
        timing(),
    )
    .unwrap();
    let (role_tx, role) = watch::channel(Role::Starting);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { election.run(client, controller, &role_tx, &shutdown).await }
    });
    Replica {
        role,
        shutdown,
        metrics,
        running,
    }
}

async fn wait_for(role: &mut watch::Receiver<Role>, wanted: Role) -> Instant {
    tokio::time::timeout(Duration::from_secs(30), role.wait_for(|r| *r == wanted))
        .await
        .unwrap_or_else(|_| panic!("never became {wanted:?}"))
        .unwrap();
    Instant::now()
}

/// client-go's rule: a candidate takes over only when the record has not
/// changed for leaseDurationSeconds on its own clock, whatever renewTime says.
#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_only_after_the_record_stops_changing_for_the_lease_duration() {
    let api = Shared::default();
    api.write_as("other-0#x", 4);
    let mut replica = replica(&api, "operator-1");
    wait_for(&mut replica.role, Role::Standby).await;

    // The other replica renews every 400 ms for 3 s: no takeover meanwhile.
    let mut last_renewal = Instant::now();
    let mut last_version = api.version();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        api.write_as("other-0#x", 4);
        last_renewal = Instant::now();
        last_version = api.version();
        assert_eq!(*replica.role.borrow(), Role::Standby, "took over a live Lease");
    }
    // Then it dies: the takeover comes after D, within D + P (+ one read).
    let active = wait_for(&mut replica.role, Role::Active).await;
    let waited = active - last_renewal;
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1200),
        "took over {waited:?} after the last renewal"
    );
    assert!(replica.metrics.is_leader());
    let taken_from = api.writes().len();
    let (method, body) = api.writes().first().cloned().expect("the takeover wrote the Lease");
    assert_eq!(method, "PUT");
    assert_eq!(body["spec"]["holderIdentity"], json!("operator-1#n"));
    assert_eq!(body["spec"]["leaseDurationSeconds"], json!(1));
    assert_eq!(
        body["spec"]["leaseTransitions"],
        json!(5),
        "a new holder is a transition"
    );
    assert_eq!(taken_from, 1, "only the takeover: {:?}", api.writes());
    assert_eq!(
        body["metadata"]["resourceVersion"],
        json!(last_version),
        "guarded by the version read"
    );
    assert_eq!(api.forbidden(), Vec::<String>::new());
}

/// The leader renews every P and, when the API server stops answering,
/// stops claiming at the send time of its last successful renewal plus R,
/// before any standby may take over (D after it last saw the record change).
#[tokio::test(start_paused = true)]
async fn the_leader_stops_claiming_within_the_renew_deadline_of_its_last_renewal() {
    let api = Shared::default();
    let mut replica = replica(&api, "operator-0");
    wait_for(&mut replica.role, Role::Active).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down_at = {
        api.server.set_down(true);
        let writes = api.writes();
        let renewals: Vec<_> = writes.iter().filter(|(m, _)| m == "PUT").collect();
        assert!(renewals.len() >= 15, "renews every 100 ms: {} in 2 s", renewals.len());
        assert_eq!(writes[0].0, "POST", "the first replica creates the Lease");
        Instant::now()
    };
    let last_success = api.changes().last().unwrap().0;
    let standby = wait_for(&mut replica.role, Role::Standby).await;
    assert_eq!(
        standby - last_success,
        timing().renew_deadline,
        "steps down at t_send + R"
    );
    assert!(standby - last_success < timing().lease_duration);
    assert!(standby >= down_at);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!replica.metrics.is_leader(), "the controller stopped");
    assert_eq!(api.forbidden(), Vec::<String>::new());
}

/// Two replicas: one leads; on shutdown it frees the Lease by a guarded
/// update and the other takes over within one retry period, never both.
#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lease_and_the_standby_takes_over_at_once() {
    let api = Shared::default();
    let mut first = replica(&api, "operator-0");
    wait_for(&mut first.role, Role::Active).await;
    let mut second = replica(&api, "operator-1");
    wait_for(&mut second.role, Role::Standby).await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*second.role.borrow(), Role::Standby, "two replicas active at once");
    }

    let released_at = Instant::now();
    first.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), &mut first.running)
        .await
        .expect("shutdown finished")
        .unwrap();
    assert_ne!(*first.role.borrow(), Role::Active);
    {
        // Only the operator writes the Lease here: its k-th write made the k-th change.
        let (writes, changes) = (api.writes(), api.changes());
        // The create that starts the Lease has no holder either: the
        // release is the first replace without one.
        let release = writes
            .iter()
            .position(|(m, b)| m == "PUT" && b["spec"].get("holderIdentity").is_none())
            .unwrap();
        let (method, body) = &writes[release];
        assert_eq!(method, "PUT");
        assert_eq!(body["spec"].get("holderIdentity"), None, "released: no holder");
        assert_eq!(
            body["metadata"]["resourceVersion"].as_str(),
            Some(changes[release - 1].1.as_str()),
            "the release is guarded by the version last written"
        );
    }
    let active = wait_for(&mut second.role, Role::Active).await;
    assert!(active - released_at <= timing().retry_period + Duration::from_millis(60));
    assert_eq!(api.holder().as_deref(), Some("operator-1#n"));
    assert_eq!(api.forbidden(), Vec::<String>::new());
    second.shutdown.cancel();
    second.running.await.unwrap();
}
