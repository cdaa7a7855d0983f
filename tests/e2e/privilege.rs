//! Least privilege, enforced by the API server: with a candidate pod's own
//! ServiceAccount token (bound to that pod, as the kubelet mounts it), the
//! sidecar's writes are allowed and nothing else is, by RBAC or by the
//! chart's ValidatingAdmissionPolicy.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, scenario};
use crate::e2e::fixtures::{APP, FIRST_LEADER, SIDECAR, leader_only_service};
use crate::e2e::node::signal_container;
use leasehold::api::contract::RETIRED_FROM_ANNOTATION;

/// A client that authenticates as `pod`'s ServiceAccount with a token bound
/// to the pod.
async fn client_as(s: &Scenario, pod: &Pod) -> Client {
    let account = pod
        .spec
        .as_ref()
        .and_then(|p| p.service_account_name.clone())
        .unwrap_or("default".into());
    let accounts: Api<ServiceAccount> = s.api();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .expect("a token for the pod's ServiceAccount")
        .status
        .expect("a token")
        .token
        .expect("the issued token");
    let mut config = s.env.config().await;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).expect("a client with the token")
}

/// Patches `pod` (or its status) and returns the API server's refusal, if any.
async fn patch(pods: &Api<Pod>, pod: &str, status: bool, body: Value) -> Result<(), String> {
    let params = PatchParams::default();
    let result = if status {
        pods.patch_status(pod, &params, &Patch::Strategic(body)).await
    } else {
        pods.patch(pod, &params, &Patch::Strategic(body)).await
    };
    result.map(|_| ()).map_err(|e| e.to_string())
}

fn leader_condition(status: &str) -> Value {
    json!({"status": {"conditions": [{"type": "leasehold.dev/leader", "status": status}]}})
}

#[tokio::test]
async fn the_sidecars_token_may_publish_leadership_on_its_own_pod_and_nothing_else() {
    scenario("e2e-privilege", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;
        let pods = s.pods(APP).await;
        let follower = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() != Some(&leader))
            .expect("a follower");
        let follower_name = follower.metadata.name.clone().unwrap();
        let as_follower: Api<Pod> = Api::namespaced(client_as(&s, follower).await, &s.ns);

        // What the sidecar does: the leader label on a candidate and the
        // leader condition on its own pod, each a real change. The admin
        // first takes the label off and sets the condition Unknown, with the
        // follower's sidecar frozen so it cannot put them back first (the
        // operator only repairs a "true" label).
        signal_container(&s, &follower_name, SIDECAR, "STOP").await;
        let admin: Api<Pod> = s.api();
        let take_label_off = |pod: String| {
            let admin = admin.clone();
            async move {
                let unlabelled = json!({"metadata": {"labels": {"leasehold.dev/leader": null}}});
                admin
                    .patch(&pod, &PatchParams::default(), &Patch::Merge(unlabelled))
                    .await
                    .unwrap_or_else(|e| panic!("the admin taking {pod}'s label off: {e}"))
            }
        };
        let unlabelled = take_label_off(follower_name.clone()).await;
        admin
            .patch_status(
                &follower_name,
                &PatchParams::default(),
                &Patch::Strategic(leader_condition("Unknown")),
            )
            .await
            .expect("the admin setting the condition Unknown");
        let label = |v: &str| json!({"metadata": {"labels": {"leasehold.dev/leader": v}}});
        patch(&as_follower, &follower_name, false, label("false"))
            .await
            .expect("its own leader label");
        patch(&as_follower, &follower_name, true, leader_condition("False"))
            .await
            .expect("its own leader condition");
        let now = admin.get(&follower_name).await.expect("the follower");
        assert_ne!(now.metadata.resource_version, unlabelled.metadata.resource_version);
        assert_eq!(
            now.metadata
                .labels
                .unwrap_or_default()
                .get("leasehold.dev/leader")
                .map(String::as_str),
            Some("false"),
            "the follower's token set its label"
        );
        let condition = now
            .status
            .and_then(|st| st.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "leasehold.dev/leader")
            .map(|c| c.status);
        assert_eq!(
            condition.as_deref(),
            Some("False"),
            "the follower's token set its condition"
        );
        // ... and the leader label on a peer (how a new leader clears a
        // stale one): the admin first takes it off the third pod.
        let peer = pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .find(|name| *name != leader && *name != follower_name)
            .expect("a third candidate");
        take_label_off(peer.clone()).await;
        patch(&as_follower, &peer, false, label("false"))
            .await
            .expect("a peer's leader label");
        // Issue 40: a retiring sidecar marks its own pod (a uid no lease has,
        // so no delete gate counts it).
        let retired = json!({"metadata": {"annotations": {RETIRED_FROM_ANNOTATION: "e2e-not-a-lease"}}});
        patch(&as_follower, &follower_name, false, retired.clone())
            .await
            .expect("its own retired-from annotation");
        signal_container(&s, &follower_name, SIDECAR, "CONT").await;

        // Anything else is refused.
        let refused = [
            (
                "another label",
                patch(
                    &as_follower,
                    &follower_name,
                    false,
                    json!({"metadata": {"labels": {"app": "x"}}}),
                )
                .await,
            ),
            (
                "an annotation",
                patch(
                    &as_follower,
                    &follower_name,
                    false,
                    json!({"metadata": {"annotations": {"a": "b"}}}),
                )
                .await,
            ),
            (
                "another pod's retired-from annotation",
                patch(&as_follower, &leader, false, retired).await,
            ),
            (
                "another pod's condition",
                patch(&as_follower, &leader, true, leader_condition("False")).await,
            ),
        ];
        for (what, result) in refused {
            let error = result.expect_err(what);
            assert!(
                error.contains("leasehold sidecar may"),
                "{what}: refused by the admission policy: {error}"
            );
        }
        let other: Api<Pod> = Api::namespaced(client_as(&s, follower).await, "e2e-privilege-other");
        let error = patch(&other, "any", false, label("true"))
            .await
            .expect_err("a pod of another namespace");
        assert!(
            error.contains("forbidden"),
            "another namespace: refused by RBAC: {error}"
        );
        watcher.finish();
    })
    .await;
}
