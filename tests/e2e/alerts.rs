//! Each shipped alert fired by its real fault on the real cluster, and
//! resolved once the fault is healed, in a real Prometheus scraping the
//! sidecars and the operator through the chart's monitors
//! (tests/e2e/prometheus.rs; the rules at a tenfold time scale). Each
//! scenario prints the time from the fault to firing and from the heal to
//! resolving: the figures of docs/runbooks.md. The alerts of
//! tests/e2e/monitoring.rs (two leaders on a planted target, no leader,
//! often leaderless, timing at risk) are fired there.
//!
//! The operator's alerts are the install's, not a lease's: its reconcile
//! counters carry no lease label, so another scenario's broken store or
//! refused write counts the same as this one's. Their scenarios are
//! `disruptive`, run where no other scenario uses the cluster, so what
//! fires and resolves is the fault made here.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::FutureExt;
use leasehold::testing::servers::PostgresServer;
use leasehold::testing::{ProxyMode, TcpProxy};
use serde_json::{Value, json};

use crate::e2e::cluster::Scenario;
use crate::e2e::cluster::scenario;
use crate::e2e::fixtures::{FIRST_LEADER, LEASE, SUCCESSOR, a_follower, exec_app, lease_condition, watch_example};
use crate::e2e::prometheus::{
    PROMETHEUS_WAIT, Plant, PlantedChange, Prometheus, TIME_SCALE, dashboard, empty_panels, every_panel_answers,
};
use crate::e2e::stores::{URL_SECRET, lease, secret};

const STORE_FAILURES: &str = "LeaseholdStoreFailures";
const RENEWALS_STALLED: &str = "LeaseholdRenewalsStalled";
const TWO_LEADERS: &str = "LeaseholdTwoLeaders";
/// LeaseholdRenewalsStalled's range, as shipped.
const STALLED_WINDOW: &str = "2m";

/// The lease's store spec: PostgreSQL at the URL of the Secret [`URL_SECRET`].
fn postgres_store() -> Value {
    json!({"postgres": {"urlSecretRef": {"name": URL_SECRET, "key": "url"}}})
}

/// A PostgreSQL the pods reach through a proxy the test switches, the
/// example's lease on it and its candidates, watched; the first leader.
async fn example_behind_proxy(
    s: &Scenario,
    example: Vec<Value>,
) -> (PostgresServer, TcpProxy, crate::e2e::watcher::LeadershipWatcher, String) {
    let server = PostgresServer::start_on(s.env.host_ip);
    let proxy = TcpProxy::start_on(s.env.host_ip, server.addr()).await;
    let url = server.url_at((s.env.host_ip, proxy.addr.port()).into());
    let watcher = watch_example(s, true);
    s.apply(vec![secret(s, &url), lease(s, LEASE, postgres_store(), json!({}))])
        .await;
    s.apply(example).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    (server, proxy, watcher, leader)
}

/// The planted defect of [`the_store_cut_off_fires_store_failures`]: the
/// rule's threshold raised where no count of failures reaches.
const IMPOSSIBLE_STORE_FAILURES: Plant = Plant {
    alert: STORE_FAILURES,
    change: PlantedChange::Expr {
        from: "> 0",
        to: "> 1e9",
    },
};

/// The candidates' store cut off (a proxy between the pods and PostgreSQL
/// closes every connection and refuses new ones): every candidate's calls
/// fail as `unavailable` and LeaseholdStoreFailures fires; the proxy
/// forwarding again, it resolves. Beside it, a second Prometheus evaluates
/// the same rules with [`IMPOSSIBLE_STORE_FAILURES`] planted: its firing
/// check, with the same bound, fails. Then every panel of the chart's
/// Grafana dashboard returns a series, and a planted misspelled one is
/// named.
#[tokio::test]
async fn the_store_cut_off_fires_store_failures() {
    scenario("e2e-alert-store", |s| async move {
        let prometheus = Prometheus::start(&s, "store");
        let planted = Prometheus::start_with(&s, "store-planted", TIME_SCALE, Some(&IMPOSSIBLE_STORE_FAILURES));
        let (_server, proxy, watcher, _) = example_behind_proxy(&s, s.example("leader-only-service.yaml")).await;
        prometheus.sees(&s, 1, 3).await;
        planted.sees(&s, 1, 3).await;
        // Prometheus prints the expression it parsed (1e9 as 1e+09).
        assert_ne!(
            planted.loaded_expr(STORE_FAILURES),
            prometheus.loaded_expr(STORE_FAILURES),
            "the planted rule is the one evaluated"
        );
        prometheus.quiet(&s.ns, STORE_FAILURES).await;

        proxy.set(ProxyMode::Cut);
        let cut = Instant::now();
        let (alert, with_plant) = tokio::join!(
            prometheus.fires_after(&s.ns, STORE_FAILURES, (cut, "the store cut off"), PROMETHEUS_WAIT),
            AssertUnwindSafe(planted.fires(&s.ns, STORE_FAILURES, PROMETHEUS_WAIT)).catch_unwind(),
        );
        let kind = alert["labels"]["kind"].as_str().unwrap_or_default();
        assert!(["unavailable", "outcome_unknown"].contains(&kind), "{alert}");
        let failed = with_plant.expect_err("the firing check passed on a rule that cannot fire");
        let message = (failed.downcast_ref::<String>().cloned())
            .or_else(|| failed.downcast_ref::<&str>().map(|m| m.to_string()))
            .unwrap_or_default();
        assert!(
            message.contains(&format!("{STORE_FAILURES} firing for {}: not within", s.ns)),
            "the planted rule failed the firing check for another reason: {message}"
        );
        eprintln!("with the plant, the firing check failed: {message}");

        proxy.set(ProxyMode::Forward);
        let healed = Instant::now();
        prometheus
            .resolves_after(
                &s.ns,
                STORE_FAILURES,
                (healed, "the proxy forwarding again"),
                2 * PROMETHEUS_WAIT,
            )
            .await;
        watcher.one_leader(None, SUCCESSOR).await;

        // The chart's dashboard as Grafana queries it for this lease: every
        // panel returns a series. Here, because only a store that failed
        // has a failures counter (the sidecar makes one per op and kind at
        // its first failure), and the operator is scraped too.
        let chosen = [("namespace", s.ns.as_str()), ("lease", LEASE)];
        let shipped = dashboard();
        every_panel_answers(&prometheus, &shipped, &chosen).await;
        // Planted: one panel's metric misspelled; the check names that panel.
        let misspelled = shipped
            .to_string()
            .replacen("leasehold_store_calls_total", "leasehold_store_call_total", 1);
        let empty = empty_panels(&prometheus, &serde_json::from_str(&misspelled).unwrap(), &chosen);
        let titles: Vec<&str> = empty.iter().map(|(title, _)| title.as_str()).collect();
        assert_eq!(
            titles,
            ["Store calls"],
            "the planted panel, and only it, is empty: {empty:?}"
        );
        eprintln!("with a misspelled metric, the dashboard check names: {empty:?}");
        watcher.finish();
    })
    .await;
}

/// Where the candidates' app container keeps the file its readiness probe
/// looks for (an emptyDir, writable by the pod's non-root user).
const READY_DIR: &str = "/ready";
const READY_FILE: &str = "/ready/ok";

/// The leader-only-service example whose app container is ready while
/// [`READY_FILE`] exists (probed every second), which it makes at start.
fn example_with_app_readiness(s: &Scenario) -> Vec<Value> {
    let mut example = s.example("leader-only-service.yaml");
    let deployment = example
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("the example's Deployment");
    let spec = &mut deployment["spec"]["template"]["spec"];
    spec["volumes"] = json!([{"name": "ready", "emptyDir": {}}]);
    let app = spec["containers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "app")
        .expect("the app container");
    let command = format!("/bin/busybox touch {READY_FILE} && exec /bin/busybox httpd -f -p 8080");
    app["command"] = json!(["/bin/busybox", "sh", "-c", command]);
    app["volumeMounts"] = json!([{"name": "ready", "mountPath": READY_DIR}]);
    app["readinessProbe"] = json!({
        "exec": {"command": ["/bin/busybox", "test", "-e", READY_FILE]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    });
    example
}

/// What LeaseholdRenewalsStalled needs: a sidecar still scraped whose store
/// calls (completed, failed or timed out: the sidecar counts each when it
/// returns) stop. A hung store does not do it: every call is bounded (the
/// PostgreSQL store's call timeout, the elector's renew deadline R), so a
/// hung store shows as failures, every few seconds. What stops the calls
/// is the lease loop waiting without a bound: a candidate whose campaign
/// is switched off (`Elector::run` waits for the campaign to change and
/// calls nothing), which is what the sidecar does while its app container
/// is not ready (it follows the container's readiness in its pod's status).
/// Here a follower's app is made unready (its readiness probe's file
/// removed): the alert fires for that pod; the file back, it resolves.
#[tokio::test]
async fn a_candidate_that_stops_calling_its_store_fires_renewals_stalled() {
    scenario("e2e-alert-stalled", |s| async move {
        let prometheus = Prometheus::start(&s, "stalled");
        let (_server, _proxy, watcher, leader) = example_behind_proxy(&s, example_with_app_readiness(&s)).await;
        prometheus.sees(&s, 1, 3).await;
        // Every candidate seen calling its store over a whole window of the
        // rule: a sidecar's first samples (a call at start, then none while
        // its app is not ready yet) would otherwise count as silence.
        let window = prometheus.scaled(STALLED_WINDOW);
        assert!(
            prometheus.loaded_expr(RENEWALS_STALLED).contains(&format!("[{window}]")),
            "{RENEWALS_STALLED}'s window is {STALLED_WINDOW}"
        );
        let calling = format!(
            "count(sum by (pod) (increase(leasehold_store_calls_total{{namespace=\"{}\", lease=\"{LEASE}\"}}[{window}])) > 0)",
            s.ns
        );
        prometheus.sees_value("every candidate calling its store", &calling, 3.0).await;
        prometheus.quiet(&s.ns, RENEWALS_STALLED).await;

        let follower = a_follower(&s, &leader).await;
        exec_app(&s, &follower, &["/bin/busybox", "rm", READY_FILE]);
        let unready = Instant::now();
        let alert = prometheus
            .fires_after(
                &s.ns,
                RENEWALS_STALLED,
                (unready, "a follower's app unready"),
                PROMETHEUS_WAIT,
            )
            .await;
        assert_eq!(alert["labels"]["pod"], json!(follower), "{alert}");
        // The sidecar says why: its app is unhealthy.
        let healthy = format!("leasehold_app_healthy{{namespace=\"{}\", pod=\"{follower}\"}}", s.ns);
        prometheus
            .sees_value("the follower's app unhealthy", &healthy, 0.0)
            .await;
        assert_eq!(watcher.leaders(), std::slice::from_ref(&leader));

        exec_app(&s, &follower, &["/bin/busybox", "touch", READY_FILE]);
        let ready = Instant::now();
        prometheus
            .resolves_after(&s.ns, RENEWALS_STALLED, (ready, "the app ready again"), PROMETHEUS_WAIT)
            .await;
        watcher.finish();
    })
    .await;
}

/// The second claimant of [`a_second_claimant_on_another_store_fires_two_leaders`].
const ELSEWHERE: &str = "scheduler-elsewhere";
/// The sidecar's metrics port (the chart's sidecar.metricsPort) and the
/// port name the chart's PodMonitor scrapes.
const METRICS_PORT: u16 = 4041;
const METRICS_PORT_NAME: &str = "lh-metrics";

/// A real double claim. Candidates of one DistributedLease cannot claim
/// twice on two stores any more (a sidecar campaigns only on the store
/// whose identity the lease recorded, tests/e2e/store_identity.rs), so the
/// second claimant here is what remains possible: a copy of the app
/// deployed by its own manifest, not injected (`leasehold.dev/inject:
/// disabled`) but running the sidecar standalone on its own PostgreSQL
/// with the lease's lock name, and annotated with the same lease (so the
/// chart's PodMonitor labels its metrics as that lease's, as a copied
/// manifest keeps the annotation). It takes the lock on its store at once:
/// two pods report `leasehold_is_leader 1` for one lease, and
/// LeaseholdTwoLeaders fires; the copy deleted, it resolves. The lease's
/// own candidates keep one leader throughout (the watcher sees only them).
#[tokio::test]
async fn a_second_claimant_on_another_store_fires_two_leaders() {
    scenario("e2e-alert-two-claimants", |s| async move {
        let prometheus = Prometheus::start(&s, "two-claimants");
        let (_server, _proxy, watcher, leader) = example_behind_proxy(&s, s.example("leader-only-service.yaml")).await;
        prometheus.sees(&s, 1, 3).await;
        prometheus.quiet(&s.ns, TWO_LEADERS).await;

        let elsewhere = PostgresServer::start_on(s.env.host_ip);
        let url = elsewhere.url_at((s.env.host_ip, elsewhere.port).into());
        let lock = format!("{}/{LEASE}", s.ns);
        let claimant = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": ELSEWHERE,
                "labels": {"app": ELSEWHERE, "leasehold.dev/inject": "disabled"},
                "annotations": {"leasehold.dev/lease": LEASE},
            },
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "leasehold",
                    "image": s.env.image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["sidecar", "--store", "postgres", "--store-url", url, "--lock", lock,
                             "--create-table", "--metrics-addr", format!("0.0.0.0:{METRICS_PORT}")],
                    "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                }],
            },
        });
        let claimed = Instant::now();
        s.apply(vec![claimant]).await;
        prometheus.sees(&s, 2, 4).await;
        eprintln!("the second claimant led {:?} after it was created", claimed.elapsed());
        let alert = prometheus
            .fires_after(
                &s.ns,
                TWO_LEADERS,
                (claimed, "a second claimant created"),
                PROMETHEUS_WAIT,
            )
            .await;
        assert_eq!(
            alert["value"].as_str().and_then(|v| v.parse::<f64>().ok()),
            Some(2.0),
            "{alert}"
        );
        assert_eq!(watcher.leaders(), std::slice::from_ref(&leader));

        crate::e2e::fixtures::delete_now(&s, ELSEWHERE).await;
        let deleted = Instant::now();
        prometheus
            .resolves_after(
                &s.ns,
                TWO_LEADERS,
                (deleted, "the second claimant deleted"),
                PROMETHEUS_WAIT,
            )
            .await;
        watcher.finish();
    })
    .await;
}

/// The operator's alerts, each the install's: run alone (see the module's
/// comment).
mod disruptive {
    use std::time::Duration;

    use kube::api::{Api, Patch, PatchParams};
    use leasehold::api::DistributedLease;

    use super::*;
    use crate::e2e::cluster::{DeleteOnDrop, OperatorScaledDown, RELEASE_NAMESPACE, wait_for};

    const OPERATOR_STORE_ERRORS: &str = "LeaseholdOperatorStoreErrors";
    const OPERATOR_RECONCILE_ERRORS: &str = "LeaseholdOperatorReconcileErrors";
    const OPERATOR_DOWN: &str = "LeaseholdOperatorDown";

    /// A lease whose Secret names a port where nothing listens: each of the
    /// operator's reconciles ends `store_error` (every 15 s,
    /// STORE_ERROR_REQUEUE) and LeaseholdOperatorStoreErrors fires; the
    /// Secret fixed to reach a real PostgreSQL (the operator reads it
    /// again after a failed call), it resolves.
    #[tokio::test]
    async fn a_lease_secret_naming_no_store_fires_operator_store_errors() {
        scenario("e2e-alert-operator-store", |s| async move {
            let server = PostgresServer::start_on(s.env.host_ip);
            let nothing = std::net::TcpListener::bind((s.env.host_ip, 0))
                .unwrap()
                .local_addr()
                .unwrap();
            let prometheus = Prometheus::start(&s, "operator-store");
            prometheus.sees_operator(2).await;
            prometheus.quiet(RELEASE_NAMESPACE, OPERATOR_STORE_ERRORS).await;

            let wrong = server.url_at(nothing);
            s.apply(vec![secret(&s, &wrong), lease(&s, LEASE, postgres_store(), json!({}))])
                .await;
            let broken = Instant::now();
            lease_condition(&s, LEASE, "StoreReady", "False", PROMETHEUS_WAIT).await;
            let alert = prometheus
                .fires_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_STORE_ERRORS,
                    (broken, "a lease's Secret naming a closed port"),
                    2 * PROMETHEUS_WAIT,
                )
                .await;
            assert!(
                alert["labels"]["pod"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("leasehold-operator-")),
                "{alert}"
            );

            let right = server.url_at((s.env.host_ip, server.port).into());
            s.apply(vec![secret(&s, &right)]).await;
            let fixed = Instant::now();
            lease_condition(&s, LEASE, "StoreReady", "True", PROMETHEUS_WAIT).await;
            prometheus
                .resolves_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_STORE_ERRORS,
                    (fixed, "the Secret fixed"),
                    2 * PROMETHEUS_WAIT,
                )
                .await;
        })
        .await;
    }

    /// How many leases have their status writes refused, created this far
    /// apart: each failed reconcile is retried after 30 s (ERROR_REQUEUE),
    /// as long as the scaled rule's window, so one lease's errors alone
    /// would leave windows without one; three, a third of that apart, do not.
    const REFUSED_LEASES: usize = 3;
    const REFUSED_APART: Duration = Duration::from_secs(10);

    /// The API server refusing the operator's status writes of this
    /// namespace's leases (a ValidatingAdmissionPolicy that denies every
    /// update of `distributedleases/status` there: what a too-strict
    /// policy or a missing permission does): each reconcile fails, a
    /// Warning Event `ReconcileFailed` says so, and
    /// LeaseholdOperatorReconcileErrors fires; the policy removed, the
    /// status is written and the alert resolves. The leases are on the
    /// Kubernetes store, so no store error comes first.
    #[tokio::test]
    async fn status_writes_refused_fire_operator_reconcile_errors() {
        scenario("e2e-alert-reconcile", |s| async move {
            let prometheus = Prometheus::start(&s, "reconcile");
            prometheus.sees_operator(2).await;
            prometheus.quiet(RELEASE_NAMESPACE, OPERATOR_RECONCILE_ERRORS).await;

            // A lease whose status the operator writes before the policy:
            // the probe of when the policy is in effect.
            let probe = format!("{LEASE}-probe");
            s.apply(vec![lease(&s, &probe, json!({"kubernetes": {}}), json!({}))]).await;
            lease_condition(&s, &probe, "Valid", "True", PROMETHEUS_WAIT).await;

            let policy = format!("{}-refuse-lease-status", s.ns);
            let refusing = DeleteOnDrop {
                env: s.env.clone(),
                namespace: None,
                objects: vec![
                    ("validatingadmissionpolicybinding", policy.clone()),
                    ("validatingadmissionpolicy", policy.clone()),
                ],
            };
            crate::e2e::cluster::apply(
                &s.client,
                &[
                    json!({
                        "apiVersion": "admissionregistration.k8s.io/v1",
                        "kind": "ValidatingAdmissionPolicy",
                        "metadata": {"name": policy},
                        "spec": {
                            "failurePolicy": "Fail",
                            "matchConstraints": {
                                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": s.ns}},
                                "resourceRules": [{
                                    "apiGroups": ["leasehold.dev"],
                                    "apiVersions": ["*"],
                                    "operations": ["UPDATE"],
                                    "resources": ["distributedleases/status"],
                                }],
                            },
                            "validations": [{"expression": "false", "message": "status writes refused by the e2e scenario"}],
                        },
                    }),
                    json!({
                        "apiVersion": "admissionregistration.k8s.io/v1",
                        "kind": "ValidatingAdmissionPolicyBinding",
                        "metadata": {"name": policy},
                        "spec": {"policyName": policy, "validationActions": ["Deny"]},
                    }),
                ],
            )
            .await;
            // The API server applies a new policy once its informer has it
            // (a lease created right after the binding was seen written):
            // wait until a dry-run status write, which admission judges as
            // a real one (Kubernetes docs, "Dry-run": admission controllers
            // run), is refused.
            let leases: Api<DistributedLease> = s.api();
            let dry_run = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let refusal = json!({"status": {"conditions": []}});
            wait_for("the policy refusing status writes", PROMETHEUS_WAIT, || async {
                let written = leases.patch_status(&probe, &dry_run, &Patch::Merge(&refusal)).await;
                written.err().filter(|e| e.to_string().contains(&policy)).map(|_| ())
            })
            .await;
            let names: Vec<String> = (0..REFUSED_LEASES).map(|i| format!("{LEASE}-{i}")).collect();
            let refused = Instant::now();
            for (i, name) in names.iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(REFUSED_APART).await;
                }
                s.apply(vec![lease(&s, name, json!({"kubernetes": {}}), json!({}))]).await;
            }
            wait_for("a Warning Event ReconcileFailed", PROMETHEUS_WAIT, || async {
                let events = s.kubectl_ns(&[
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={},reason=ReconcileFailed,type=Warning", names[0]),
                    "-o",
                    "name",
                ]);
                (!events.trim().is_empty()).then_some(())
            })
            .await;
            prometheus
                .fires_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_RECONCILE_ERRORS,
                    (refused, "status writes refused"),
                    2 * PROMETHEUS_WAIT,
                )
                .await;

            drop(refusing);
            let allowed = Instant::now();
            for name in &names {
                lease_condition(&s, name, "Valid", "True", PROMETHEUS_WAIT).await;
            }
            prometheus
                .resolves_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_RECONCILE_ERRORS,
                    (allowed, "the policy removed"),
                    2 * PROMETHEUS_WAIT,
                )
                .await;
        })
        .await;
    }

    /// The operator scaled to 0: its replicas' series go stale and
    /// LeaseholdOperatorDown fires; scaled back, one replica leads again
    /// and it resolves.
    #[tokio::test]
    async fn the_operator_scaled_to_zero_fires_operator_down() {
        scenario("e2e-alert-operator-down", |s| async move {
            let prometheus = Prometheus::start(&s, "operator-down");
            prometheus.sees_operator(2).await;
            prometheus.quiet(RELEASE_NAMESPACE, OPERATOR_DOWN).await;

            let scaled = Instant::now();
            let down = OperatorScaledDown::start(&s).await;
            prometheus
                .fires_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_DOWN,
                    (scaled, "the operator scaled to 0"),
                    PROMETHEUS_WAIT,
                )
                .await;

            let back = Instant::now();
            down.restore().await;
            prometheus.sees_operator(2).await;
            prometheus
                .resolves_after(
                    RELEASE_NAMESPACE,
                    OPERATOR_DOWN,
                    (back, "the operator scaled back"),
                    PROMETHEUS_WAIT,
                )
                .await;
        })
        .await;
    }
}
