//! The scripted API server a reconcile runs against, on the shared
//! [`ApiServerVerifier`] (the reconcile's unit tests and the emulator tests
//! use it): the script answers each request in the expected order after
//! asserting method, path, query, content type and body; a request that is
//! not expected fails the scenario.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::Reporter;

use crate::index::{PodWriter, pod_cache};
use crate::metrics::Metrics;
use crate::rbac;
use crate::reconcile::*;
use crate::stores::SingleStore;
use crate::stores::StoreProvider;
use leasehold_core::lease::{LeaseStore, SessionStore};
use leasehold_kubernetes::api::DistributedLease;
use leasehold_testkit::api::{ApiServerVerifier, Call, mock_client};

/// The scripted API server, and the pod watch that fills the reconcile's
/// pod cache: a reconcile that needs candidates waits until the script
/// lists the pods ([`expect_pod_list`]).
pub struct ApiServer {
    pub verifier: ApiServerVerifier,
    pub pods: PodWriter,
}

pub const LEASES: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases";
pub(crate) const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/prod/events";
pub(crate) const MERGE: &str = "application/merge-patch+json";
pub(crate) const APPLY: &str = "application/apply-patch+yaml";

/// A context whose Kubernetes client talks to a scripted mock API server and
/// whose store provider hands out `store` (its lease rows and sessions) for
/// every resource.
#[cfg(test)]
pub(crate) fn context_on<S: LeaseStore + SessionStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
) -> (Arc<Context>, ApiServer) {
    context_with(Arc::new(SingleStore::with_sessions(store)), metrics)
}

/// A context on a scripted mock API server, reaching stores through `stores`.
pub fn context_with(stores: Arc<dyn StoreProvider>, metrics: Arc<Metrics>) -> (Arc<Context>, ApiServer) {
    let (client, verifier) = mock_client("default");
    context_over(client, verifier, stores, metrics)
}

/// `context` as the operator of the cluster named `cluster` sees it
/// (`--cluster-name`).
pub(crate) fn in_cluster((ctx, server): (Arc<Context>, ApiServer), cluster: &str) -> (Arc<Context>, ApiServer) {
    let ctx = Arc::into_inner(ctx).expect("a fresh context");
    (Arc::new(ctx.with_cluster(Some(cluster.into()))), server)
}

/// A context whose store is the Kubernetes store on the same scripted API
/// server: its Lease reads are requests the script answers and the RBAC
/// check below judges, like the reconcile's own.
#[cfg(test)]
pub(crate) fn context_on_kubernetes_store(metrics: Arc<Metrics>) -> (Arc<Context>, ApiServer) {
    let (client, verifier) = mock_client("default");
    let store = leasehold_kubernetes::store::KubernetesStore::new(client.clone(), Some("prod"));
    context_over(client, verifier, Arc::new(SingleStore::new(Arc::new(store))), metrics)
}

fn context_over(
    client: kube::Client,
    verifier: ApiServerVerifier,
    stores: Arc<dyn StoreProvider>,
    metrics: Arc<Metrics>,
) -> (Arc<Context>, ApiServer) {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some("operator-0".into()),
    };
    let (cache, pods) = pod_cache();
    // No scripted reconcile reads Deployments: their watch has listed none.
    let (deployment_cache, mut deployments) = reflector::store();
    for event in [watcher::Event::Init, watcher::Event::InitDone] {
        deployments.apply_watcher_event(&event);
    }
    let ctx = Context::new(client, reporter, stores, metrics).with_caches(cache, deployment_cache);
    (Arc::new(ctx), ApiServer { verifier, pods })
}

/// The checks every request of a reconcile passes.
pub(crate) trait Expected {
    fn assert(&self, method: &str, path: &str, content_type: Option<&str>);
}

impl Expected for Call {
    fn assert(&self, method: &str, path: &str, content_type: Option<&str>) {
        assert_eq!((self.method.as_str(), self.path.as_str()), (method, path), "request");
        let request = rbac::request_attributes(method, path, self.is_watch()).expect("a resource path");
        assert!(
            rbac::allows(&request),
            "{method} {path} needs {request:?}, which operator::rbac::RULES does not grant"
        );
        assert_eq!(
            self.content_type.as_deref(),
            content_type,
            "content type of {method} {path}"
        );
    }
}

pub async fn next(server: &mut ApiServer) -> Call {
    server
        .verifier
        .expect("reconcile ended without making the expected request")
        .await
}

pub async fn run_on<F>(ctx: Arc<Context>, mut server: ApiServer, lease: Value, script: F) -> Result<Action>
where
    F: AsyncFnOnce(&mut ApiServer),
{
    let lease: Arc<DistributedLease> = Arc::new(leasehold_kubernetes::api::client::object_from_value(&lease).unwrap());
    // The reconcile owns the only client: when it finishes, the mock server
    // sees the connection close, so a missing request fails the script and
    // an extra one fails the check below.
    let (result, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(reconcile(lease, ctx), script(&mut server))
    })
    .await
    .expect("reconcile and script finished (an unanswered request would hang them)");
    if let Some(request) = server.verifier.next().await {
        panic!("unexpected request: {} {}", request.method, request.uri);
    }
    result
}

pub fn lease(spec_patch: Value, finalizers: &[&str], status: Option<Value>) -> Value {
    let mut spec = json!({
        "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
        "selector": {"matchLabels": {"app": "web"}},
    });
    for (k, v) in spec_patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let mut lease = json!({
        "apiVersion": "leasehold.dev/v1alpha1",
        "kind": "DistributedLease",
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1", "resourceVersion": "41", "generation": 3,
                     "finalizers": finalizers},
        "spec": spec,
    });
    if let Some(status) = status {
        lease["status"] = status;
    }
    lease
}

pub fn pod(name: &str, leader: Option<&str>, ready: bool) -> Value {
    let mut labels = json!({"app": "web"});
    if let Some(leader) = leader {
        labels["leasehold.dev/leader"] = json!(leader);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "resourceVersion": format!("rv-{name}"), "labels": labels},
        // Injected: the webhook's native sidecar.
        "spec": {"containers": [{"name": "app"}],
                 "initContainers": [{"name": "leasehold", "restartPolicy": "Always"}]},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }},
                                  {"type": "ContainersReady", "status": if ready { "True" } else { "False" }},
                                  // A ready candidate's sidecar reaches its store.
                                  {"type": leasehold_kubernetes::api::contract::STORE_CONDITION,
                                   "status": if ready { "True" } else { "False" }}]},
    })
}

/// A candidate pod whose sidecar container (the native sidecar) is running;
/// `retired_from`: the uid its sidecar has retired from, if any.
#[cfg(test)]
pub(crate) fn running_candidate(name: &str, retired_from: Option<&str>) -> Value {
    let mut pod = pod(name, Some("false"), true);
    pod["status"]["initContainerStatuses"] = json!([{
        "name": "leasehold", "image": "leasehold:dev", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }]);
    if let Some(uid) = retired_from {
        pod["metadata"]["annotations"] = json!({leasehold_kubernetes::api::contract::RETIRED_FROM_ANNOTATION: uid});
    }
    pod
}

/// A delete lists the candidates from the API server, not from the cache.
pub(crate) async fn expect_fresh_pod_list(server: &mut ApiServer, pods: Vec<Value>) {
    let seen = next(server).await;
    seen.assert("GET", "/api/v1/namespaces/prod/pods", None);
    assert_eq!(seen.query.get("labelSelector").map(String::as_str), Some("app=web"));
    assert_eq!(
        seen.query.get("resourceVersion"),
        None,
        "a consistent read, not the watch cache"
    );
    seen.respond(
        200,
        &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "50"}, "items": pods}),
    );
}

pub fn conditions(status: &Value) -> BTreeMap<String, (String, String, String)> {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["observedGeneration"], json!(3));
            assert!(c["lastTransitionTime"].is_string());
            let field = |f: &str| c[f].as_str().unwrap().to_string();
            (field("type"), (field("status"), field("reason"), field("message")))
        })
        .collect()
}

pub(crate) async fn expect_event(server: &mut ApiServer, kind: &str, reason: &str, note_contains: &str) {
    let seen = next(server).await;
    seen.assert("POST", EVENTS, Some("application/json"));
    let body = &seen.body;
    assert_eq!(body["reason"], json!(reason));
    assert_eq!(body["type"], json!(kind));
    assert_eq!(body["reportingController"], json!(FIELD_MANAGER));
    assert_eq!(body["reportingInstance"], json!("operator-0"));
    assert_eq!(body["regarding"]["kind"], json!("DistributedLease"));
    assert_eq!(body["regarding"]["name"], json!("web"));
    assert_eq!(body["regarding"]["namespace"], json!("prod"));
    let note = body["note"].as_str().unwrap();
    assert!(
        note.contains(note_contains),
        "event note {note:?} should contain {note_contains:?}"
    );
    let echo = seen.body.clone();
    seen.respond(201, &echo);
}

/// The pod watch lists the pods (an initial list: Init, one InitApply per
/// pod, InitDone); until then a reconcile that needs candidates waits.
pub async fn expect_pod_list(server: &mut ApiServer, pods: Vec<Value>) {
    server.pods.apply_watcher_event(&watcher::Event::Init);
    for pod in pods {
        let pod: Pod = leasehold_kubernetes::api::client::object_from_value(&pod).unwrap();
        server.pods.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    server.pods.apply_watcher_event(&watcher::Event::InitDone);
}

/// Asserts a server-side apply of the status and returns the applied status.
pub async fn expect_status_apply(server: &mut ApiServer, lease_echo: Value) -> Value {
    let seen = next(server).await;
    seen.assert("PATCH", &format!("{LEASES}/web/status"), Some(APPLY));
    assert_eq!(seen.query.get("fieldManager").map(String::as_str), Some(FIELD_MANAGER));
    assert_eq!(seen.query.get("force").map(String::as_str), Some("true"));
    assert_eq!(seen.body["apiVersion"], json!("leasehold.dev/v1alpha1"));
    assert_eq!(seen.body["kind"], json!("DistributedLease"));
    assert_eq!(
        seen.body.as_object().unwrap().len(),
        3,
        "only apiVersion, kind and status are applied"
    );
    let status = seen.body["status"].clone();
    seen.respond(200, &lease_echo);
    status
}

/// Asserts the merge patch that drops our finalizer (a delete's last request).
pub(crate) async fn expect_finalizer_dropped(server: &mut ApiServer, lease_echo: &Value) {
    let seen = next(server).await;
    seen.assert("PATCH", &format!("{LEASES}/web"), Some(MERGE));
    assert_eq!(seen.body["metadata"]["finalizers"], json!([]));
    seen.respond(200, lease_echo);
}

/// How the store-side scenario reaches its store.
pub struct StoreSide {
    /// The store itself, for the scenario's own acquires and checks.
    store: Arc<dyn LeaseStore>,
    /// What the reconciles connect through.
    provider: Arc<dyn StoreProvider>,
    /// `spec.store` of the resource.
    spec_store: Value,
    /// The Secret name and the URL it holds (key `url`), for PostgreSQL and
    /// Redis: each reconcile's fresh operator reads it through the API.
    secret: Option<(&'static str, String)>,
}

impl StoreSide {
    /// A store every reconcile gets whatever the resource names (Spanner spec).
    pub fn single<S: LeaseStore + SessionStore>(store: Arc<S>) -> StoreSide {
        StoreSide {
            provider: Arc::new(SingleStore::with_sessions(store.clone())),
            store,
            spec_store: json!({"spanner": {"database": "projects/p/instances/i/databases/d"}}),
            secret: None,
        }
    }

    /// A PostgreSQL or Redis store (`kind`) whose URL the resource names by a
    /// Secret; the reconciles connect to it themselves.
    #[cfg(test)]
    pub(crate) fn by_secret(kind: &str, store: Arc<dyn LeaseStore>, url: String) -> StoreSide {
        StoreSide {
            provider: Arc::new(crate::stores::OpenStores::default()),
            store,
            spec_store: json!({kind: {"urlSecretRef": {"name": "lease-store", "key": "url"}}}),
            secret: Some(("lease-store", url)),
        }
    }
}

/// The operator reads a Secret holding `url` under key `url`.
pub(crate) async fn expect_secret_get(server: &mut ApiServer, name: &str, url: &str) {
    let seen = next(server).await;
    seen.assert("GET", &format!("/api/v1/namespaces/prod/secrets/{name}"), None);
    let encoded = k8s_openapi::ByteString(url.as_bytes().to_vec());
    seen.respond(
        200,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "prod"},
                "data": {"url": encoded}}),
    );
}

/// The store side of a reconcile against any store: the table is created when
/// missing, the row is read into status, and delete releases the row of a
/// holder of this cluster (named, as only a name proves it local). Run here
/// on the memory store, and against the Spanner emulator and private
/// PostgreSQL and Redis servers (those two through the URL in a Secret).
pub async fn store_side_scenario(side: StoreSide) {
    let StoreSide {
        store,
        provider,
        spec_store,
        secret,
    } = side;
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let lock = format!("prod/web-{:08x}", rand::random::<u32>());
    let spec = json!({"lockName": lock.clone(), "store": spec_store});
    let context = || in_cluster(context_with(provider.clone(), metrics.clone()), "eu");

    // No table yet, no row: the table is created and the lock shows as free.
    let (ctx, server) = context();
    let resource = lease(spec.clone(), &[FINALIZER], None);
    let echo = resource.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let first_secret = secret.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, vec![pod("web-0", None, true)]).await;
        if let Some((name, url)) = &first_secret {
            expect_secret_get(server, name, url).await;
        }
        let status = expect_status_apply(server, echo).await;
        assert_eq!(status["term"], json!(0));
        assert_eq!(status.get("holder"), None);
        assert_eq!(conditions(&status)["StoreReady"].0, "True", "{status}");
        assert_eq!(conditions(&status)["Ready"].1, "NoLeader");
        tx.send(status).unwrap();
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(OBSERVED_REQUEUE));
    let free = rx.await.unwrap();

    // A candidate takes the lock: status shows it with its token.
    let grant = store
        .acquire(&lock, "eu/prod/web-0#n1", Duration::from_secs(15))
        .await
        .unwrap();
    let (ctx, server) = context();
    let resource = lease(spec.clone(), &[FINALIZER], Some(free));
    let echo = resource.clone();
    let second_secret = secret.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, vec![pod("web-0", Some("true"), true)]).await;
        if let Some((name, url)) = &second_secret {
            expect_secret_get(server, name, url).await;
        }
        expect_event(server, "Normal", "HolderChanged", "eu/prod/web-0#n1 (term 1)").await;
        let status = expect_status_apply(server, echo).await;
        assert_eq!(status["holder"], json!("eu/prod/web-0#n1"));
        assert_eq!(status["holderCluster"], json!("eu"));
        assert_eq!(
            conditions(&status)["Ready"].1,
            "LeaderElected",
            "a leader of this cluster"
        );
        assert_eq!(status["term"], json!(1));
        assert_eq!(status["token"], json!(grant.token.to_string()));
        assert_eq!(status["transitions"], json!(1));
    })
    .await;
    result.unwrap();

    // Delete after the holder's pod is gone: the row is released by
    // check-and-set, term and token kept.
    let (ctx, server) = context();
    let mut resource = lease(spec, &[FINALIZER], None);
    resource["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let echo = resource.clone();
    let result = run_on(ctx, server, resource, async move |server| {
        expect_pod_list(server, vec![]).await;
        expect_fresh_pod_list(server, vec![]).await;
        if let Some((name, url)) = &secret {
            expect_secret_get(server, name, url).await;
        }
        expect_event(server, "Normal", "Released", "held by eu/prod/web-0#n1").await;
        expect_finalizer_dropped(server, &echo).await;
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    let row = store.observe(&lock).await.unwrap().record.unwrap();
    assert_eq!((row.holder, row.term, row.token), (None, 1, Some(grant.token)));
}
