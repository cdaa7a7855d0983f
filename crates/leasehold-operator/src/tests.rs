use std::time::Duration;

use clap::{CommandFactory, Parser};

use super::*;
use crate::stores::SingleStore;
use kube::Client;
use leasehold_core::lease::LeaseStore;
use leasehold_core::store::memory::MemoryStore;
use leasehold_testkit::api::mock_client;

/// `leasehold operator` as the binary's command line parses it (the
/// `leasehold` package's `cmd` nests these same [`Args`] under the same name).
#[derive(Debug, Parser)]
#[command(name = "leasehold")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    Operator(Args),
}

/// Every flag has a LEASEHOLD_ variable, except the pod's identity, which
/// comes from the downward API under the sidecar's names.
#[test]
fn every_operator_flag_can_come_from_the_environment() {
    use leasehold_kubernetes::api::contract::{ENV_POD_NAME, ENV_POD_NAMESPACE};
    let cli = Cli::command();
    let operator = cli.find_subcommand("operator").expect("operator subcommand");
    for arg in operator.get_arguments() {
        if arg.is_positional() || ["help", "version"].contains(&arg.get_id().as_str()) {
            continue;
        }
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        let expected = match arg.get_id().as_str() {
            "pod_name" => env.as_deref() == Some(ENV_POD_NAME),
            "pod_namespace" => env.as_deref() == Some(ENV_POD_NAMESPACE),
            _ => env.as_deref().is_some_and(|e| e.starts_with("LEASEHOLD_")),
        };
        assert!(expected, "--{} has no LEASEHOLD_ env: {env:?}", arg.get_id());
    }
}

/// Issue 37: the operator's one `--cluster-name` names its own identity and
/// reaches every sidecar its webhook injects; a name that cannot be part of
/// an identity is refused at start with the one message that says why.
#[test]
fn the_operators_cluster_name_reaches_its_identity_and_the_injection() {
    let operator = |extra: &[&str]| {
        let mut argv = vec![
            "leasehold",
            "operator",
            "--webhook-listen",
            "0.0.0.0:8443",
            "--sidecar-image",
            "i:1",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| {
            let Command::Operator(args) = cli.command;
            args
        })
    };
    let args = operator(&["--cluster-name", "eu", "--pod-namespace", "prod", "--pod-name", "op-0"]).unwrap();
    assert_eq!(args.injection().unwrap().unwrap().cluster.as_deref(), Some("eu"));
    assert!(
        args.identity().to_string().starts_with("eu/prod/op-0#"),
        "{}",
        args.identity()
    );
    assert_eq!(operator(&[]).unwrap().injection().unwrap().unwrap().cluster, None);
    for bad in ["eu/west", "eu#1", "eu@x", "", "eu west", &"x".repeat(64)] {
        let err = operator(&["--cluster-name", bad]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("cluster name {bad:?} must be 1 to 63 characters")),
            "{bad:?}: {err}"
        );
    }
}

/// A controller for namespace `prod` on `client` and `stores`, with a short
/// grace period, and its metrics.
pub(crate) fn controller_on(client: Client, stores: Arc<dyn StoreProvider>) -> (ControllerRun, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let ctx = Arc::new(Context::new(
        client,
        Reporter::from(FIELD_MANAGER),
        stores,
        metrics.clone(),
    ));
    let controller = ControllerRun {
        ctx,
        namespace: Some("prod".into()),
        concurrency: 1,
        grace: Duration::from_millis(50),
    };
    (controller, metrics)
}

fn operator_args(args: &[&str]) -> Args {
    let argv = ["leasehold", "operator"].iter().chain(args);
    let Command::Operator(args) = Cli::try_parse_from(argv).unwrap().command;
    args
}

#[test]
fn election_defaults_to_a_kubernetes_lease_and_spanner_needs_a_database() {
    let identity = Identity::with_nonce("operator-0", "n");
    let election = |args: &[&str]| operator_args(args).election(&identity);
    // As the binary prints it: the error and its causes.
    let chain = |e: Error| format!("{:#}", anyhow::Error::from(e));

    // The default needs no infrastructure: a Lease in the pod's namespace.
    let Some(Election::Lease(lease)) = election(&["--pod-namespace=leasehold-system"]).unwrap() else {
        panic!("the default election is a Kubernetes Lease")
    };
    assert_eq!(
        (lease.name.as_str(), lease.namespace.as_str()),
        (DEFAULT_LEASE_NAME, "leasehold-system")
    );
    assert_eq!(lease.timing.lease_duration, Duration::from_secs(15));
    let err = election(&[]).err().unwrap().to_string();
    assert!(
        err.contains("--election-lease-namespace (LEASEHOLD_ELECTION_LEASE_NAMESPACE) or --pod-namespace"),
        "{err}"
    );
    let err = chain(
        election(&[
            "--pod-namespace=x",
            "--election-lease-duration=1500ms",
            "--election-renew-deadline=1s",
            "--election-retry-period=200ms",
        ])
        .err()
        .unwrap(),
    );
    assert!(
        err.contains("--election-lease-duration (1.5s) must be a whole number of seconds"),
        "{err}"
    );

    let err = election(&["--election-backend=spanner"]).err().unwrap().to_string();
    assert!(
        err.contains("--election-database (LEASEHOLD_ELECTION_DATABASE) is required for --election-backend=spanner"),
        "{err}"
    );
    assert!(election(&["--leader-election=false"]).unwrap().is_none());

    let db = "--election-database=projects/p/instances/i/databases/d";
    let Some(Election::Spanner(spanner)) = election(&["--election-backend=spanner", db]).unwrap() else {
        panic!("spanner election")
    };
    assert_eq!(spanner.config.table, DEFAULT_TABLE);

    let err = chain(
        election(&["--election-backend=spanner", db, "--election-renew-deadline=20s"])
            .err()
            .unwrap(),
    );
    assert!(
        err.contains("renewDeadline (20s) must be shorter than leaseDuration (15s)"),
        "{err}"
    );
}

#[test]
fn election_timing_flags_are_durations_and_a_lease_duration_alone_scales_r_and_p() {
    let identity = Identity::with_nonce("operator-0", "n");
    let Some(Election::Lease(lease)) = operator_args(&["--pod-namespace=x", "--election-lease-duration=30s"])
        .election(&identity)
        .unwrap()
    else {
        panic!("a Lease election")
    };
    assert_eq!(
        (lease.timing.renew_deadline, lease.timing.retry_period),
        (Duration::from_secs(20), Duration::from_secs(4))
    );
    let err = Cli::try_parse_from(["leasehold", "operator", "--election-lease-duration", "ten"])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("invalid value 'ten' for '--election-lease-duration"),
        "{err}"
    );
}

/// Spanner backend: the controller watches resources only while this replica holds the
/// operator lock; on shutdown it stops and the lock is released at once.
#[tokio::test]
async fn the_controller_runs_only_while_this_replica_holds_the_operator_lock() {
    let (client, mut server) = mock_client("default");
    let store = MemoryStore::new(3);
    let lock = "leasehold-system/leasehold-operator";
    // Another replica holds the lock for 400 ms and then dies without releasing.
    store
        .acquire(lock, "other-0#x", Duration::from_millis(400))
        .await
        .unwrap();

    let stores: Arc<dyn StoreProvider> = Arc::new(SingleStore::new(Arc::new(store.clone())));
    let (controller, metrics) = controller_on(client.clone(), stores.clone());
    let election = Election::Spanner(SpannerElection {
        config: SpannerConfig {
            database: "projects/p/instances/i/databases/d".into(),
            table: DEFAULT_TABLE.into(),
        },
        timing: Timing::parse("300ms", "200ms", "50ms", 0.1).unwrap(),
        lock: lock.into(),
        identity: Identity::with_nonce("operator-1", "n"),
    });
    let (role, mut role_rx) = watch::channel(Role::Starting);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { election.run(client, stores, controller, &role, &shutdown).await }
    });

    role_rx.wait_for(|r| *r == Role::Standby).await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(200), server.next()).await;
    assert!(early.is_err(), "a standby must not watch resources");
    assert_eq!(*role_rx.borrow(), Role::Standby);

    // Within D + P of the other replica's last renewal, this one takes over
    // and lists the resources and the pods (one watch each, in any order).
    let mut paths = Vec::new();
    let mut replies = Vec::new();
    for _ in 0..2 {
        let request = tokio::time::timeout(Duration::from_secs(5), server.next())
            .await
            .expect("the controller started after the takeover")
            .expect("a request");
        assert_eq!(request.method, "GET");
        assert!(rbac::allows_request("GET", &request.path, request.is_watch()));
        paths.push(request.path.clone());
        assert!(request.body.is_null());
        replies.push(request);
    }
    paths.sort();
    assert_eq!(
        paths,
        [
            "/api/v1/namespaces/prod/pods",
            "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases"
        ]
    );
    assert_eq!(*role_rx.borrow(), Role::Active);
    assert!(metrics.is_leader());

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("shutdown finished")
        .unwrap()
        .unwrap();
    let row = store.observe(lock).await.unwrap().record.unwrap();
    assert_eq!(row.holder, None, "the operator lock is released on shutdown");
    assert_eq!(row.term, 2);
    assert!(!metrics.is_leader());
}

/// The running controller: the pod watch's first list fills the cache the
/// reconcile reads its candidates from (no pod list per lease), and the
/// status it writes counts them.
#[tokio::test]
async fn the_controller_counts_candidates_from_its_pod_watch() {
    use serde_json::{Value, json};
    use std::sync::Mutex;

    let (client, server) = mock_client("default");
    let store = MemoryStore::new(9);
    store
        .acquire("prod/web", "prod/web-0#n", Duration::from_secs(15))
        .await
        .unwrap();
    let stores: Arc<dyn StoreProvider> = Arc::new(SingleStore::new(Arc::new(store)));
    let (controller, metrics) = controller_on(client, stores);
    let lease = json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": "web", "namespace": "prod", "uid": "u", "resourceVersion": "5", "generation": 1,
                     "finalizers": [reconcile::FINALIZER]},
        "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                 "selector": {"matchLabels": {"app": "web"}}},
    });
    let pod = |name: &str, app: &str, ready: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "prod", "resourceVersion": "3",
                            "labels": {"app": app, "leasehold.dev/leader": "false"}},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}})
    };
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                      "items": [pod("web-0", "web", "True"), pod("web-1", "web", "False"), pod("db-0", "db", "True")]});
    let statuses: Arc<Mutex<Vec<Value>>> = Arc::default();
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();
    let serving = {
        let (statuses, unexpected, lease) = (statuses.clone(), unexpected.clone(), lease.clone());
        server.serve(move |request| {
            let (method, path) = (request.method.as_str(), request.path.as_str());
            if !rbac::allows_request(method, path, request.is_watch()) {
                unexpected.lock().unwrap().push(format!("not granted: {method} {path}"));
            }
            let answer = match (method, path) {
                (_, _) if request.is_watch() => return None,
                ("GET", "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases") => json!({
                    "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLeaseList",
                    "metadata": {"resourceVersion": "6"}, "items": [lease]}),
                ("GET", "/api/v1/namespaces/prod/pods") => pods.clone(),
                ("GET", "/apis/apps/v1/namespaces/prod/deployments") => {
                    json!({"kind": "DeploymentList", "metadata": {"resourceVersion": "10"}, "items": []})
                }
                ("PATCH", "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web/status") => {
                    statuses.lock().unwrap().push(request.body["status"].clone());
                    lease.clone()
                }
                ("POST", "/apis/events.k8s.io/v1/namespaces/prod/events") => request.body.clone(),
                _ => {
                    unexpected.lock().unwrap().push(format!("{method} {path}"));
                    json!({})
                }
            };
            Some((if method == "POST" { 201 } else { 200 }, answer))
        })
    };
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { controller.run(stop).await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while statuses.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the controller reconciled the lease");
    stop.cancel();
    running.await.unwrap();
    serving.abort();
    let status = statuses.lock().unwrap()[0].clone();
    assert_eq!(
        (status["candidates"].clone(), status["readyCandidates"].clone()),
        (json!(2), json!(1))
    );
    assert_eq!(status["holder"], json!("prod/web-0#n"));
    assert_eq!(unexpected.lock().unwrap().clone(), Vec::<String>::new());
    assert!(metrics.reconciles(metrics::Outcome::Ok) >= 1);
}

/// Issue 39: a readiness-gated lease's rollout check reads its Deployment
/// from the operator's Deployment watch (one list, then the watch), never by
/// a GET per reconcile; the status shows the cached Deployment was read (its
/// strategy would stall). A Deployment's change maps to the gated leases
/// selecting its pods only.
#[tokio::test]
async fn gated_leases_read_their_deployments_from_the_watch_not_per_reconcile() {
    use serde_json::{Value, json};
    use std::sync::Mutex;

    let (client, server) = mock_client("default");
    let stores: Arc<dyn StoreProvider> = Arc::new(SingleStore::new(Arc::new(MemoryStore::new(9))));
    let (controller, metrics) = controller_on(client, stores);
    let lease = |name: &str, gated: bool| {
        json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
            "metadata": {"name": name, "namespace": "prod", "uid": name, "resourceVersion": "5", "generation": 1,
                         "finalizers": [reconcile::FINALIZER]},
            "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                     "selector": {"matchLabels": {"app": "web"}}, "publishing": {"readinessGate": gated}},
        })
    };
    let gated = lease("web", true);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-abc-1", "namespace": "prod", "resourceVersion": "3",
                     "labels": {"app": "web", "pod-template-hash": "abc", "leasehold.dev/leader": "false"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                                          "uid": "rs", "controller": true}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}});
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "prod", "resourceVersion": "4", "generation": 1},
        "spec": {"replicas": 3, "strategy": {"rollingUpdate": {"maxUnavailable": 1}},
                 "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app"}]}}},
        "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3}});
    let list =
        |kind: &str, items: Vec<Value>| json!({"kind": kind, "metadata": {"resourceVersion": "10"}, "items": items});
    let statuses: Arc<Mutex<Vec<Value>>> = Arc::default();
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let serving = {
        let (statuses, requests, gated, deployment) =
            (statuses.clone(), requests.clone(), gated.clone(), deployment.clone());
        server.serve(move |request| {
            let (method, path) = (request.method.as_str(), request.path.as_str());
            let watch = if request.is_watch() { " (watch)" } else { "" };
            requests.lock().unwrap().push(format!("{method} {path}{watch}"));
            if !rbac::allows_request(method, path, request.is_watch()) {
                requests.lock().unwrap().push(format!("not granted: {method} {path}"));
            }
            let answer = match (method, path) {
                (_, _) if request.is_watch() => return None,
                ("GET", "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases") => {
                    list("DistributedLeaseList", vec![gated.clone()])
                }
                ("GET", "/api/v1/namespaces/prod/pods") => list("PodList", vec![pod.clone()]),
                ("GET", "/apis/apps/v1/namespaces/prod/deployments") => {
                    list("DeploymentList", vec![deployment.clone()])
                }
                ("PATCH", "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web/status") => {
                    statuses.lock().unwrap().push(request.body["status"].clone());
                    gated.clone()
                }
                ("POST", "/apis/events.k8s.io/v1/namespaces/prod/events") => request.body.clone(),
                _ => return Some((404, leasehold_testkit::api::status(404, "NotFound", "not served"))),
            };
            Some((if method == "POST" { 201 } else { 200 }, answer))
        })
    };
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { controller.run(stop).await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while statuses.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the controller reconciled the lease");
    stop.cancel();
    running.await.unwrap();
    serving.abort();
    let status = statuses.lock().unwrap()[0].clone();
    let rollout_safe = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == json!("RolloutSafe"))
        .cloned();
    assert_eq!(
        rollout_safe
            .as_ref()
            .map(|c| (c["status"].clone(), c["reason"].clone())),
        Some((json!("False"), json!("RolloutWouldStall"))),
        "the cached Deployment's strategy was checked: {status}"
    );
    let requests = requests.lock().unwrap().clone();
    let deployment_requests: Vec<&String> = requests.iter().filter(|r| r.contains("deployments")).collect();
    assert_eq!(
        deployment_requests,
        [
            "GET /apis/apps/v1/namespaces/prod/deployments",
            "GET /apis/apps/v1/namespaces/prod/deployments (watch)"
        ],
        "one list and one watch of the Deployments, nothing per reconcile: {requests:?}"
    );
    assert!(!requests.iter().any(|r| r.starts_with("not granted")), "{requests:?}");
    assert!(metrics.reconciles(metrics::Outcome::Ok) >= 1);

    // A Deployment's change reconciles the gated leases selecting its pods.
    let known = [lease("web", true), lease("plain", false), lease("other", true)].map(|mut l| {
        if l["metadata"]["name"] == json!("other") {
            l["spec"]["selector"]["matchLabels"]["app"] = json!("db");
        }
        leasehold_kubernetes::api::client::object_from_value::<DistributedLease>(&l).unwrap()
    });
    let mut cached: Deployment = leasehold_kubernetes::api::client::object_from_value(&deployment).unwrap();
    rollout::keep_what_rollout_checks_read(&mut cached);
    assert_eq!(cached.spec.template.spec, None, "the pod template's spec is not cached");
    let selectors = Selectors::default();
    selectors.follow(&watcher::Event::Init);
    for lease in known {
        selectors.follow(&watcher::Event::InitApply(lease));
    }
    selectors.follow(&watcher::Event::InitDone);
    let names: Vec<String> = selectors.gated_leases_of(&cached).into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["web"]);
}
