//! The CRD's CEL rules, evaluated by the real API server: each bad
//! `DistributedLease` is refused with its rule's message, and the good one
//! the bad ones are made from is accepted (so a refusal is the rule's, not
//! some other mistake of the test). The unit tests (`crates/leasehold-kubernetes/src/api/tests.rs`)
//! check that the rules are in the schema; only the API server says what
//! they do. Only the CRDs are needed: no chart, no pods.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use leasehold::api::{DistributedLease, PARTITIONS_IMMUTABLE, STORE_IMMUTABLE};
use serde_json::{Value, json};

use crate::e2e::cluster::{Env, apply, crds, namespace_object, wait_for};

/// This test's namespace, made and removed here.
const NAMESPACE: &str = "e2e-cel";

/// A valid resource named `name`, `spec` over the spec (`null` removes a field).
fn lease(name: &str, spec: Value) -> Value {
    let mut lease = json!({
        "apiVersion": "leasehold.dev/v1alpha1",
        "kind": "DistributedLease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "store": {"kubernetes": {}},
            "selector": {"matchLabels": {"app": "web"}},
        },
    });
    for (key, value) in spec.as_object().expect("an object") {
        match value {
            Value::Null => lease["spec"].as_object_mut().unwrap().remove(key),
            _ => lease["spec"]
                .as_object_mut()
                .unwrap()
                .insert(key.clone(), value.clone()),
        };
    }
    lease
}

/// The API server's message refusing a create (dry run) of `lease`, or
/// `None` when it accepts it.
async fn refusal(api: &Api<DynamicObject>, lease: Value) -> Option<String> {
    let object: DynamicObject = serde_json::from_value(lease).unwrap();
    match api
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &object,
        )
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(e) => panic!("creating a DistributedLease: {e}"),
    }
}

/// The API server's message refusing the merge patch `spec` of `name`'s
/// spec (dry run), or `None` when it accepts it.
async fn refused_change(api: &Api<DynamicObject>, name: &str, spec: Value) -> Option<String> {
    let patch = json!({"spec": spec});
    let params = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(e) => panic!("patching DistributedLease {name}: {e}"),
    }
}

#[tokio::test]
async fn the_api_server_refuses_what_the_cel_rules_forbid() {
    let env = Env::from_vars();
    let client = env.client().await;
    apply(&client, &crds()).await;
    apply(&client, &[namespace_object(NAMESPACE)]).await;
    let resource = ApiResource::erase::<DistributedLease>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);

    // A CRD just created is in discovery a moment before its resource is
    // served: creates answer 404 until then (seen on a fresh cluster).
    let base = wait_for("the API serving DistributedLeases", Duration::from_secs(30), || async {
        match refusal(&api, lease("good", json!({}))).await {
            Some(message) if message.contains("404") => None,
            answer => Some(answer),
        }
    })
    .await;
    assert_eq!(base, None, "the base lease is valid");
    let cases = [
        (
            json!({"leaseDuration": "10s", "renewDeadline": "10s", "retryPeriod": "2s"}),
            "spec.renewDeadline: Invalid value",
            "renewDeadline must be shorter than leaseDuration: the difference is the safety gap",
        ),
        (
            json!({"retryPeriod": "10s"}),
            "spec.retryPeriod: Invalid value",
            "retryPeriod must be shorter than renewDeadline, or the leader cannot renew in time",
        ),
        (
            json!({"retryPeriod": "0s"}),
            "spec.retryPeriod: Invalid value",
            "retryPeriod must be greater than zero",
        ),
        (
            json!({"store": {"kubernetes": {}, "redis": {"urlSecretRef": {"name": "db"}}}}),
            "spec.store: Invalid value",
            "set exactly one of spanner, postgres, redis and kubernetes",
        ),
        (
            json!({"store": {}}),
            "spec.store: Invalid value",
            "set exactly one of spanner, postgres, redis and kubernetes",
        ),
    ];
    for (spec, field, message) in cases {
        let refused = refusal(&api, lease("bad", spec.clone()))
            .await
            .unwrap_or_else(|| panic!("{spec} was accepted"));
        assert!(
            refused.contains(field) && refused.contains(message),
            "{spec}: {refused:?} should name {field:?} and say {message:?}"
        );
    }

    // The transition rules need an object to change: one with a lock name
    // and one without (applied, so a rerun finds them as they are).
    apply(
        &client,
        &[
            lease("named", json!({"lockName": "team/web"})),
            lease("unnamed", json!({})),
            lease(
                "partitioned",
                json!({"store": {"postgres": {"urlSecretRef": {"name": "db"}}}, "partitions": 4}),
            ),
        ],
    )
    .await;
    let changes = [
        (
            "named",
            json!({"lockName": "team/other"}),
            "spec.lockName: Invalid value",
            "lockName is immutable: create a new resource for another lock",
        ),
        (
            "named",
            json!({"lockName": null}),
            "spec.lockName: Invalid value",
            "lockName cannot be added or removed: create a new resource for another lock",
        ),
        (
            "unnamed",
            json!({"lockName": "team/web"}),
            "spec.lockName: Invalid value",
            "lockName cannot be added or removed: create a new resource for another lock",
        ),
        // Issue 40: what the candidates campaign on is immutable; the
        // message names the way to move (delete, wait, create).
        (
            "unnamed",
            json!({"store": {"kubernetes": null, "postgres": {"urlSecretRef": {"name": "db"}}}}),
            "spec.store: Invalid value",
            STORE_IMMUTABLE,
        ),
        (
            "partitioned",
            json!({"store": {"postgres": {"table": "other_leases"}}}),
            "spec.store: Invalid value",
            STORE_IMMUTABLE,
        ),
        (
            "partitioned",
            json!({"store": {"postgres": {"urlSecretRef": {"name": "other-db"}}}}),
            "spec.store: Invalid value",
            STORE_IMMUTABLE,
        ),
        (
            "partitioned",
            json!({"partitions": 8}),
            "spec.partitions: Invalid value",
            PARTITIONS_IMMUTABLE,
        ),
        (
            "partitioned",
            json!({"partitions": null}),
            "spec.partitions: Invalid value",
            PARTITIONS_IMMUTABLE,
        ),
        (
            "unnamed",
            json!({"partitions": 4}),
            "spec.partitions: Invalid value",
            PARTITIONS_IMMUTABLE,
        ),
    ];
    for (name, spec, field, message) in changes {
        let refused = refused_change(&api, name, spec.clone())
            .await
            .unwrap_or_else(|| panic!("{name}: {spec} was accepted"));
        assert!(
            refused.contains(field) && refused.contains(message),
            "{name}: {spec}: {refused:?} should name {field:?} and say {message:?}"
        );
    }
    // Other changes pass the transition rules.
    let retimed = json!({"leaseDuration": "20s"});
    assert_eq!(refused_change(&api, "named", retimed).await, None);

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
}
