//! Injection: the webhook's opt-in and its native sidecar, and
//! `leasehold inject` output applied without the webhook.

use std::io::Write;
use std::process::Stdio;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::e2e::cluster::{RELEASE_NAMESPACE, Scenario, scenario, yaml_objects};
use crate::e2e::fixtures::{FIRST_LEADER, LEASE, watch_example};
use crate::e2e::stores::postgres_lease;

/// The sidecar's container name.
const SIDECAR: &str = "leasehold";
const SIDECAR_USER: i64 = 65532;

fn probe_pod(s: &Scenario, name: &str, pod_label: bool) -> Pod {
    let mut labels = json!({"app": "probe"});
    if pod_label {
        labels["leasehold.dev/inject"] = json!("enabled");
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {"leasehold.dev/lease": "probe"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": SIDECAR_USER},
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "app", "image": s.env.app_image,
                            "command": ["/bin/busybox", "httpd", "-f", "-p", "8080"]}]},
    }))
    .expect("a pod")
}

fn native_sidecar(pod: &Pod) -> Option<Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .find(|c| c.name == SIDECAR && c.restart_policy.as_deref() == Some("Always"))
        .cloned()
}

async fn create(s: &Scenario, ns: &str, pod: &Pod) -> Pod {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), ns);
    pods.create(&PostParams::default(), pod)
        .await
        .unwrap_or_else(|e| panic!("creating a pod in {ns}: {e}"))
}

#[tokio::test]
async fn an_opted_in_namespace_gets_native_sidecars_others_and_the_release_namespace_do_not() {
    scenario("e2e-inject", |s| async move {
        // Not opted in: untouched.
        let plain = create(&s, &s.ns, &probe_pod(&s, "plain", false)).await;
        assert!(
            native_sidecar(&plain).is_none(),
            "a namespace not opted in is untouched"
        );

        // Opted in by the namespace label: the pod needs no label of its own
        // (once the API server's copy of the namespace has the label).
        s.kubectl_ns(&[
            "label",
            "namespace",
            &s.ns,
            "leasehold.dev/inject=enabled",
            "--overwrite",
        ]);
        crate::e2e::cluster::injection_reaches(&s.env, &s.client, &s.ns).await;
        // The lease the probe's sidecar joins: without it the sidecar exits
        // (DistributedLease not found) and restarts, and a restart's start
        // time is later than the app's (CI saw exactly that).
        s.apply(vec![json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
            "metadata": {"name": "probe"},
            "spec": {"store": {"kubernetes": {}}, "selector": {"matchLabels": {"app": "probe"}}},
        })])
        .await;
        let injected = create(&s, &s.ns, &probe_pod(&s, "probe", false)).await;
        let sidecar = native_sidecar(&injected).expect("a native sidecar in an opted-in namespace");
        let user = sidecar.security_context.as_ref().and_then(|c| c.run_as_user);
        assert_eq!(user, Some(SIDECAR_USER), "the sidecar runs as 65532");

        // The release namespace, even with the pod label: untouched.
        let release = create(&s, RELEASE_NAMESPACE, &probe_pod(&s, "e2e-probe", true)).await;
        let release_pods: Api<Pod> = Api::namespaced(s.client.clone(), RELEASE_NAMESPACE);
        release_pods
            .delete("e2e-probe", &DeleteParams::default().grace_period(0))
            .await
            .expect("cleanup");
        assert!(
            native_sidecar(&release).is_none(),
            "the release namespace is never injected"
        );

        // The sidecar starts before the app (the kubelet runs init containers first).
        let pods: Api<Pod> = s.api();
        let started = crate::e2e::cluster::wait_for("the injected pod running", FIRST_LEADER, || async {
            let status = pods.get("probe").await.ok()?.status?;
            // A restart's start time says nothing of the order: the sidecar
            // must still be on its first run.
            let at = |list: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>, name: &str| {
                let status = list?.into_iter().find(|c| c.name == name)?;
                assert_eq!(status.restart_count, 0, "{name} restarted: {status:?}");
                status.state?.running?.started_at
            };
            Some((
                at(status.init_container_statuses.clone(), SIDECAR)?,
                at(status.container_statuses, "app")?,
            ))
        })
        .await;
        assert!(
            started.0.0 <= started.1.0,
            "the sidecar started at {:?}, the app at {:?}",
            started.0,
            started.1
        );
    })
    .await;
}

/// `leasehold inject` on the example, applied in a namespace without the
/// webhook's opt-in: the same leadership as with the webhook.
#[tokio::test]
async fn leasehold_inject_output_applied_without_the_webhook_elects_one_leader() {
    scenario("e2e-inject-gitops", |s| async move {
        // The lease goes through `leasehold inject` with the workload, as in
        // a GitOps repository: its store Secret is mounted from it.
        let (_store, mut example) = postgres_lease(&s, LEASE, json!({}));
        example.extend(s.example("leader-only-service.yaml"));
        for object in &mut example {
            // No opt-in label: only `leasehold inject` adds the sidecar.
            if let Some(labels) = object
                .pointer_mut("/spec/template/metadata/labels")
                .and_then(Value::as_object_mut)
            {
                labels.remove("leasehold.dev/inject");
            }
        }
        let text = example
            .iter()
            .map(|o| serde_yaml::to_string(o).expect("yaml"))
            .collect::<Vec<_>>()
            .join("---\n");
        let mut inject = s
            .env
            .leasehold()
            .args(["inject", "--sidecar-image", &s.env.image])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running leasehold inject");
        inject
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("writing to inject");
        let out = inject.wait_with_output().expect("leasehold inject");
        assert!(out.status.success(), "leasehold inject failed");
        let watcher = watch_example(&s, true);
        s.apply(yaml_objects(&String::from_utf8_lossy(&out.stdout))).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;
        let pod: Pod = s.api().get(&leader).await.expect("the leader pod");
        assert!(native_sidecar(&pod).is_some(), "the injected sidecar is native");
        watcher.finish();
    })
    .await;
}

/// Scenarios that disturb the whole cluster (the operator scaled to 0):
/// nextest runs them alone, where no other test uses the cluster.
mod disruptive {
    use super::*;
    use crate::e2e::cluster::OperatorScaledDown;

    /// The webhook's failurePolicy lets pods through while it is down: they are
    /// created without a sidecar, and both `leasehold check` and the
    /// DistributedLease status name them, and only them (a candidate
    /// injected before is not named).
    #[tokio::test]
    async fn a_pod_created_while_the_webhook_is_down_is_named_as_a_candidate_without_a_sidecar() {
        scenario("e2e-webhook-down", |s| async move {
            let (_store, lease) = postgres_lease(&s, "probe", json!({"selector": {"matchLabels": {"app": "probe"}}}));
            s.apply(lease).await;
            // A candidate created while the webhook is up has the sidecar: the
            // status must not name it with the one created without.
            let injected = create(&s, &s.ns, &probe_pod(&s, "injected", true)).await;
            assert!(native_sidecar(&injected).is_some(), "created through the webhook");
            let scaled_down = OperatorScaledDown::start(&s).await;
            // The API server reaches the webhook through its own view of the
            // endpoints, a moment behind the slices (CI saw a pod injected after
            // the slice showed none): require several dry runs in a row to go
            // uninjected, so a last call through a stale view cannot pass for
            // the webhook's absence.
            let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let in_a_row = std::cell::Cell::new(0);
            crate::e2e::cluster::wait_for(
                "the API server no longer calling the webhook (5 uninjected dry runs in a row)",
                std::time::Duration::from_secs(60),
                || async {
                    let pod = pods.create(&dry_run, &probe_pod(&s, "orphan", true)).await.ok()?;
                    let uninjected = native_sidecar(&pod).is_none();
                    in_a_row.set(if uninjected { in_a_row.get() + 1 } else { 0 });
                    (in_a_row.get() >= 5).then_some(())
                },
            )
            .await;
            let created = create(&s, &s.ns, &probe_pod(&s, "orphan", true)).await;
            scaled_down.restore().await;
            assert!(
                native_sidecar(&created).is_none(),
                "created without the webhook, so without a sidecar"
            );

            let (_, text) = s.check();
            assert!(
                text.contains("without a leasehold sidecar never campaign: orphan"),
                "leasehold check: {text}"
            );
            let leases: Api<leasehold::api::DistributedLease> = s.api();
            crate::e2e::cluster::wait_for(
                "the status counting both candidates and naming only the one without a sidecar",
                std::time::Duration::from_secs(60),
                || async {
                    let status = leases.get("probe").await.ok()?.status?;
                    (status.candidates == 2 && status.candidates_without_sidecar == ["orphan"]).then_some(())
                },
            )
            .await;
        })
        .await;
    }
}
