//! Install: the chart as the README installs it, the operator's own election,
//! its failover with the webhook still answering, and `leasehold check`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use crate::cluster::{
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

/// Scenarios that disturb the whole cluster (the operator killed or scaled
/// to 0, the CRD deleted): nextest runs them alone, after the others
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
            crate::cluster::apply(&s.client, &crds()).await;
            let (ok, text) = wait_for("leasehold check clean again", Duration::from_secs(90), || async {
                let (ok, text) = s.check();
                ok.then_some((ok, text))
            })
            .await;
            assert!(ok, "{text}");
        })
        .await;
    }
}
