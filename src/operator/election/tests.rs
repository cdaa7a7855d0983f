//! The Lease election against a fake API server that keeps one Lease with
//! the API server's optimistic concurrency (an update whose resourceVersion
//! is not the current one is a 409), on tokio's paused clock so the bounds
//! below are exact. Every request is checked against the operator's RBAC.

use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::operator::metrics::Metrics;
use crate::operator::rbac;
use crate::operator::stores::SingleStore;
use crate::store::MemoryStore;
use crate::testing::api::{ApiServerVerifier, mock_client, status};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/leasehold-system/leases";

/// One Lease as the API server keeps it, and what it was asked.
#[derive(Default)]
struct FakeApi {
    lease: Option<Value>,
    version: u64,
    /// Every Lease request answers 503 while set.
    down: bool,
    /// (when, method, body) of every Lease write that succeeded.
    writes: Vec<(Instant, String, Value)>,
    /// Requests the operator's RBAC would refuse.
    forbidden: Vec<String>,
}

type Shared = Arc<Mutex<FakeApi>>;

impl FakeApi {
    fn holder(&self) -> Option<String> {
        self.lease.as_ref()?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_string)
    }

    /// Another replica writes the Lease (a renewal or a takeover).
    fn write_as(&mut self, holder: &str, transitions: i64) {
        self.version += 1;
        self.lease = Some(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": "leasehold-system",
                         "resourceVersion": self.version.to_string()},
            // A renewTime far in the past: takeover must not judge by it.
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1, "leaseTransitions": transitions,
                     "renewTime": format!("2000-01-01T00:00:{:02}.000000Z", self.version % 60)},
        }));
    }

    fn answer(&mut self, method: &str, path: &str, body: Value) -> (u16, Value) {
        if self.down {
            return (503, status(503, "ServiceUnavailable", "down"));
        }
        let named = path.strip_prefix(LEASES).and_then(|p| p.strip_prefix('/'));
        match (method, named) {
            ("GET", Some(_)) => match &self.lease {
                Some(lease) => (200, lease.clone()),
                None => (404, status(404, "NotFound", "no Lease")),
            },
            ("POST", None) if self.lease.is_some() => (409, status(409, "AlreadyExists", "the Lease exists")),
            ("PUT", Some(_)) if body["metadata"]["resourceVersion"] != json!(self.version.to_string()) => {
                (409, status(409, "Conflict", "the object has been modified"))
            }
            ("POST", None) | ("PUT", Some(_)) => {
                self.version += 1;
                let mut lease = body.clone();
                lease["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.writes.push((Instant::now(), method.to_string(), body));
                self.lease = Some(lease.clone());
                (if method == "POST" { 201 } else { 200 }, lease)
            }
            _ => panic!("unexpected Lease request {method} {path}"),
        }
    }
}

/// Serves Lease requests from `api`; other requests (the controller's
/// watch of DistributedLeases) are held unanswered.
fn serve(server: ApiServerVerifier, api: Shared) {
    server.serve(move |request| {
        let (method, path) = (request.method.as_str(), request.path.as_str());
        if !rbac::allows_request(method, path, request.is_watch()) {
            api.lock().unwrap().forbidden.push(format!("{method} {path}"));
        }
        if !path.starts_with(LEASES) {
            return None;
        }
        Some(api.lock().unwrap().answer(method, path, request.body.clone()))
    });
}

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
    let (client, server) = mock_client("default");
    serve(server, api.clone());
    let stores = Arc::new(SingleStore::new(Arc::new(MemoryStore::new(1))));
    let (controller, metrics) = crate::operator::tests::controller_on(client.clone(), stores);
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
    api.lock().unwrap().write_as("other-0#x", 4);
    let mut replica = replica(&api, "operator-1");
    wait_for(&mut replica.role, Role::Standby).await;

    // The other replica renews every 400 ms for 3 s: no takeover meanwhile.
    let mut last_renewal = Instant::now();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        api.lock().unwrap().write_as("other-0#x", 4);
        last_renewal = Instant::now();
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
    let api = api.lock().unwrap();
    let (_, method, body) = api.writes.first().expect("the takeover wrote the Lease");
    assert_eq!(method, "PUT");
    assert_eq!(body["spec"]["holderIdentity"], json!("operator-1#n"));
    assert_eq!(body["spec"]["leaseDurationSeconds"], json!(1));
    assert_eq!(
        body["spec"]["leaseTransitions"],
        json!(5),
        "a new holder is a transition"
    );
    assert_eq!(
        body["metadata"]["resourceVersion"],
        json!("9"),
        "guarded by the version read"
    );
    assert_eq!(api.forbidden, Vec::<String>::new());
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
        let mut api = api.lock().unwrap();
        api.down = true;
        let renewals: Vec<_> = api.writes.iter().filter(|(_, m, _)| m == "PUT").collect();
        assert!(renewals.len() >= 15, "renews every 100 ms: {} in 2 s", renewals.len());
        assert_eq!(api.writes[0].1, "POST", "the first replica creates the Lease");
        Instant::now()
    };
    let last_success = api.lock().unwrap().writes.last().unwrap().0;
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
    assert_eq!(api.lock().unwrap().forbidden, Vec::<String>::new());
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
        let api = api.lock().unwrap();
        let (_, method, body) = api.writes.last().unwrap();
        assert_eq!(method, "PUT");
        assert_eq!(body["spec"].get("holderIdentity"), None, "released: no holder");
        assert_eq!(
            body["metadata"]["resourceVersion"],
            json!((api.version - 1).to_string()),
            "the release is guarded by the version last written"
        );
    }
    let active = wait_for(&mut second.role, Role::Active).await;
    assert!(active - released_at <= timing().retry_period + Duration::from_millis(60));
    assert_eq!(api.lock().unwrap().holder().as_deref(), Some("operator-1#n"));
    assert_eq!(api.lock().unwrap().forbidden, Vec::<String>::new());
    second.shutdown.cancel();
    second.running.await.unwrap();
}
