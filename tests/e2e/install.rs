//! Install: the chart as the README installs it, the operator's own election,
//! its failover with the webhook still answering, and `leasehold check`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use crate::e2e::cluster::{
    CrdsRestored, OperatorScaledDown, RELEASE_NAMESPACE, Scenario, crds, scenario, wait_for, wait_operator_available,
};

const OPERATOR_LEASE: &str = "leasehold-operator";

async fn operator_holder(s: &Scenario) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
    leases.get_opt(OPERATOR_LEASE).await.ok()??.spec?.holder_identity
}

async fn operator_pods(s: &Scenario) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=leasehold"))
        .await;
    list.expect("listing operator pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// The chart's `helm test` objects (`helm.sh/hook: test`), as rendered,
/// applied as `helm test` would create them (its ServiceAccount and roles,
/// then the pod), with the `--flag value` pairs of `more` set in the pod's
/// `args`: whether the pod succeeded, and its log.
async fn run_helm_test_pod(s: &Scenario, name: &str, more: &[&str]) -> (bool, String) {
    let chart = crate::e2e::cluster::rendered_chart(&s.env);
    let (mut pods, rbac): (Vec<_>, Vec<_>) = (chart.into_iter())
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .partition(|o| o["kind"] == "Pod");
    assert_eq!(pods.len(), 1, "the chart has one `helm.sh/hook: test` pod: {pods:?}");
    crate::e2e::cluster::apply(&s.client, &rbac).await;
    let mut pod = pods.remove(0);
    pod["metadata"]["name"] = json!(name);
    let args = pod["spec"]["containers"][0]["args"]
        .as_array_mut()
        .expect("the check's args");
    for pair in more.chunks(2) {
        // A flag the chart sets gets the new value; others are added.
        match args.iter().position(|a| a == pair[0]) {
            Some(at) => args[at + 1] = json!(pair[1]),
            None => args.extend(pair.iter().map(|a| json!(a))),
        }
    }
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
    // helm.sh/hook-delete-policy: before-hook-creation.
    let _ = pods.delete(name, &DeleteParams::default()).await;
    wait_for("the previous test pod gone", Duration::from_secs(60), || async {
        pods.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    crate::e2e::cluster::apply(&s.client, &[pod]).await;
    let phase = wait_for("the helm test pod to finish", Duration::from_secs(120), || async {
        let phase = pods.get_opt(name).await.ok()??.status?.phase?;
        ["Succeeded", "Failed"].contains(&phase.as_str()).then_some(phase)
    })
    .await;
    let log = pods
        .logs(name, &Default::default())
        .await
        .unwrap_or_else(|e| format!("(no log: {e})"));
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("deleting the helm test pod");
    (phase == "Succeeded", log)
}

/// `helm test`: the chart's test pod runs `leasehold check` in the cluster
/// as the operator's ServiceAccount and succeeds on a working install; the
/// same pod pointed at a release that is not installed fails, so the
/// success is check's verdict, not the pod's. The check is narrowed to this
/// scenario's namespace: other scenarios plant broken leases at the same
/// time.
#[tokio::test]
async fn the_charts_helm_test_runs_check_in_the_cluster() {
    scenario("e2e-helm-test", |s| async move {
        let ns = s.ns.clone();
        let (ok, log) = run_helm_test_pod(&s, "leasehold-check-e2e", &["-n", &ns]).await;
        assert!(ok, "the helm test pod failed on a working install:\n{log}");
        let (ok, log) = run_helm_test_pod(
            &s,
            "leasehold-check-e2e-other",
            &["-n", &ns, "--instance", "not-installed"],
        )
        .await;
        assert!(
            !ok,
            "the helm test pod passed for a release that is not installed:\n{log}"
        );
        assert!(log.contains("not-installed"), "check names the missing release: {log}");
    })
    .await;
}

/// Scenarios that disturb the whole cluster (the operator killed or scaled
/// to 0, the CRD deleted): nextest runs them alone, where no other test uses the cluster
/// (`.config/nextest.toml`, scripts/test.sh).
mod disruptive {
    use super::*;

    #[tokio::test]
    async fn the_operator_elects_one_replica_and_fails_over_with_the_webhook_answering() {
        scenario("e2e-install", |s| async move {
            let holder = wait_for(
                "an operator replica holding the operator Lease",
                Duration::from_secs(60),
                || operator_holder(&s),
            )
            .await;
            // The chart's two replicas (a rollout may still be replacing one).
            let pods = wait_for(
                "the chart's two operator replicas",
                Duration::from_secs(120),
                || async {
                    let pods = operator_pods(&s).await;
                    (pods.len() == 2).then_some(pods)
                },
            )
            .await;
            let active = pods
                .iter()
                .find(|p| holder.contains(&format!("/{}#", p.metadata.name.clone().unwrap_or_default())))
                .unwrap_or_else(|| panic!("no operator pod is the holder {holder}"));
            let active_name = active.metadata.name.clone().unwrap();

            // Kill the active replica without grace: the standby takes over.
            let api: Api<Pod> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
            api.delete(&active_name, &DeleteParams::default().grace_period(0))
                .await
                .expect("deleting the active operator");
            let new_holder = wait_for(
                "the standby operator holding the Lease",
                Duration::from_secs(60),
                || async {
                    operator_holder(&s)
                        .await
                        .filter(|h| !h.contains(&format!("/{active_name}#")))
                },
            )
            .await;
            assert!(!new_holder.is_empty());

            // The webhook keeps answering: a pod created now is injected.
            s.apply(vec![json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "probe", "labels": {"app": "probe", "leasehold.dev/inject": "enabled"},
                             "annotations": {"leasehold.dev/lease": "probe"}},
                "spec": {"containers": [{"name": "app", "image": s.env.app_image,
                                         "command": ["/bin/busybox", "httpd", "-f", "-p", "8080"]}]},
            })])
            .await;
            let pod = s.api::<Pod>().get("probe").await.expect("the probe pod");
            let init = pod.spec.and_then(|s| s.init_containers).unwrap_or_default();
            assert!(
                init.iter()
                    .any(|c| c.name == "leasehold" && c.restart_policy.as_deref() == Some("Always")),
                "the pod created after the failover has the native sidecar: {init:?}"
            );
            wait_operator_available(&s.client).await;
        })
        .await;
    }

    #[tokio::test]
    async fn leasehold_check_is_clean_and_names_a_webhook_without_endpoints_and_a_missing_crd() {
        scenario("e2e-install-check", |s| async move {
            let (ok, text) = s.check();
            assert!(ok, "leasehold check on a fresh install: {text}");

            // No webhook endpoints: scale the operator to zero.
            let scaled_down = OperatorScaledDown::start(&s).await;
            let text = wait_for(
                "leasehold check to fail on the webhook",
                Duration::from_secs(90),
                || async {
                    let (ok, text) = s.check();
                    (!ok).then_some(text)
                },
            )
            .await;
            assert!(text.contains("webhook"), "check names the webhook: {text}");
            scaled_down.restore().await;

            // No CRD (every DistributedLease of the cluster goes with it).
            let _crds_back = CrdsRestored { env: s.env.clone() };
            let crd_api: Api<CustomResourceDefinition> = Api::all(s.client.clone());
            crd_api
                .delete("distributedleases.leasehold.dev", &DeleteParams::default())
                .await
                .expect("deleting the CRD");
            let text = wait_for(
                "leasehold check to fail on the CRD",
                Duration::from_secs(60),
                || async {
                    let (ok, text) = s.check();
                    let named = ["is being deleted", "is not installed"]
                        .iter()
                        .any(|state| text.contains(&format!("CRD distributedleases.leasehold.dev {state}")));
                    (!ok && named).then_some(text)
                },
            )
            .await;
            assert!(text.contains("distributedleases"), "{text}");
            // Other tests' leases may hold it for a while (a finalizer waits up to
            // the operator's RELEASE_PATIENCE for a store that is gone).
            wait_for("the CRD gone", Duration::from_secs(240), || async {
                crd_api
                    .get_opt("distributedleases.leasehold.dev")
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            })
            .await;
            crate::e2e::cluster::apply(&s.client, &crds()).await;
            let (ok, text) = wait_for("leasehold check clean again", Duration::from_secs(90), || async {
                let (ok, text) = s.check();
                ok.then_some((ok, text))
            })
            .await;
            assert!(ok, "{text}");
        })
        .await;
    }

    /// The CRD of d76844c (2026-11-25: before `spec.store` became immutable),
    /// the earliest this upgrade path is tested from.
    const EARLIER_CRD_COMMIT: &str = "d76844c";

    /// Helm never updates `crds/`: the README's upgrade step applies them
    /// server-side (`kubectl apply --server-side --force-conflicts -f
    /// crds/`). From the CRD of an earlier commit with a lease stored under
    /// it, that step keeps the lease, serves it under the new schema, and
    /// the new CEL rule then refuses a change of its store.
    #[tokio::test]
    async fn the_crd_upgrades_over_an_earlier_one_with_a_stored_lease() {
        scenario("e2e-crd-upgrade", |s| async move {
            let _crds_back = CrdsRestored { env: s.env.clone() };
            let earlier = std::process::Command::new("git")
                .args(["show", &format!("{EARLIER_CRD_COMMIT}:crds/distributedlease.yaml")])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .expect("running git (the upgrade test reads an earlier commit's CRD from the history)");
            assert!(
                earlier.status.success(),
                "git show {EARLIER_CRD_COMMIT}: {} (run the suite from a clone with its history)",
                String::from_utf8_lossy(&earlier.stderr)
            );
            let earlier = crate::e2e::cluster::yaml_objects(&String::from_utf8_lossy(&earlier.stdout));
            assert!(
                !serde_json::to_string(&earlier).unwrap().contains("store is immutable"),
                "the earlier CRD has no store rule yet"
            );
            crate::e2e::cluster::apply(&s.client, &earlier).await;
            s.apply(vec![json!({
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "upgraded"},
                "spec": {"store": {"kubernetes": {}}, "selector": {"matchLabels": {"app": "upgraded"}}},
            })])
            .await;

            let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/");
            s.env
                .kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", crds]);

            let leases: Api<leasehold::api::DistributedLease> = Api::namespaced(s.client.clone(), &s.ns);
            let lease = leases
                .get("upgraded")
                .await
                .expect("the lease stored under the earlier CRD");
            assert!(lease.spec.store.kubernetes.is_some(), "{:?}", lease.spec);
            let refused = s
                .env
                .kubectl()
                .args([
                    "-n",
                    &s.ns,
                    "patch",
                    "distributedlease",
                    "upgraded",
                    "--type",
                    "merge",
                    "-p",
                    r#"{"spec":{"store":{"kubernetes":null,"redis":{"urlSecretRef":{"name":"r","key":"url"}}}}}"#,
                ])
                .output()
                .expect("running kubectl patch");
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(
                !refused.status.success() && stderr.contains("store is immutable"),
                "{stderr}"
            );
        })
        .await;
    }
}
