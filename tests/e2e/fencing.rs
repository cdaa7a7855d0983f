//! The chart's fencing ValidatingAdmissionPolicy (`fencing.enabled`),
//! evaluated by the real API server: on a fenced ConfigMap, a deposed
//! leader's old token is refused, so is its write that leaves the new
//! leader's token untouched; the holder's equal and higher tokens are
//! accepted; removing the token, a malformed token and another lock are
//! refused; another lock's object is judged on its own tokens. The writers
//! are two candidate pods' ServiceAccount tokens, impersonated with the pod
//! name the API server puts in a bound token's userInfo.extra. Writers that
//! are no leaders (`fencing.trustedWriters`) finish deletes: the garbage
//! collector a foreground one, a controller its own finalizer.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::e2e::cluster::{DeleteOnDrop, Env, apply, rendered_fencing_policy, repo, wait_for};

/// This test's namespace, made here and removed by [`Cleanup`].
const NAMESPACE: &str = "e2e-fencing";
/// The ServiceAccount both candidate pods run as.
const ACCOUNT: &str = "candidate";
/// A token of the size the SQL stores hand out (nanoseconds), above 2^53.
const TOKEN: i64 = 1_764_000_000_000_000_100;
/// The ServiceAccount of a controller that removes its own finalizer
/// ([`FINALIZER`]), trusted by this test's install.
const ARCHIVER: &str = "archiver";
const FINALIZER: &str = "leasehold.dev/e2e-archive";

/// `fencing.trustedWriters`: the chart's defaults (the garbage collector)
/// and [`ARCHIVER`].
fn trusted_writers() -> String {
    let values = std::fs::read_to_string(repo().join("charts/leasehold/values.yaml")).expect("values.yaml");
    let values: Value = serde_yaml::from_str(&values).expect("values.yaml parses");
    let mut writers: Vec<String> = serde_json::from_value(values["fencing"]["trustedWriters"].clone()).unwrap();
    writers.push(format!("system:serviceaccount:{NAMESPACE}:{ARCHIVER}"));
    format!("fencing.trustedWriters={{{}}}", writers.join(","))
}

/// A client acting as candidate pod `pod`: the username of its
/// ServiceAccount and the pod name a bound token carries.
async fn as_pod(env: &Env, pod: &str) -> Client {
    let user = format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}");
    let groups = ["system:serviceaccounts", "system:authenticated"];
    Client::try_from(env.impersonating(&user, &groups, Some(pod)).await).unwrap()
}

fn fenced_config_map(name: &str, lock: &str, token: i64, holder: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {
            "leasehold.dev/fencing-lock": lock,
            "leasehold.dev/fencing-token": token.to_string(),
            "leasehold.dev/fencing-holder": holder,
        }},
        "data": {"owner": holder},
    })
}

/// A write as a leader makes it: the annotations given (`null` removes one)
/// and the data. The API server's refusal message, or `None` when accepted.
async fn write(api: &Api<ConfigMap>, name: &str, annotations: Value, owner: &str) -> Option<String> {
    patch(api, name, annotations, owner, PatchParams::default()).await
}

async fn patch(
    api: &Api<ConfigMap>,
    name: &str,
    annotations: Value,
    owner: &str,
    params: PatchParams,
) -> Option<String> {
    let patch = json!({"metadata": {"annotations": annotations}, "data": {"owner": owner}});
    refusal(api.patch(name, &params, &Patch::Merge(&patch)).await)
}

fn token(token: i64, holder: &str) -> Value {
    json!({"leasehold.dev/fencing-token": token.to_string(), "leasehold.dev/fencing-holder": holder})
}

#[tokio::test]
async fn the_api_server_refuses_stale_fencing_tokens() {
    let env = Env::from_vars();
    let client = env.client().await;
    // ValidatingAdmissionPolicy is admissionregistration.k8s.io/v1 since
    // Kubernetes 1.30; the chart refuses to render it for older clusters.
    let served = client
        .list_api_group_resources("admissionregistration.k8s.io/v1")
        .await
        .unwrap();
    assert!(
        served.resources.iter().any(|r| r.name == "validatingadmissionpolicies"),
        "the cluster does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"
    );
    let (policy, policy_name) = rendered_fencing_policy(&env, &[trusted_writers()]);
    // The cluster-scoped policy and binding first.
    let _cleanup = DeleteOnDrop {
        env: env.clone(),
        namespace: None,
        objects: vec![
            ("validatingadmissionpolicybinding", policy_name.clone()),
            ("validatingadmissionpolicy", policy_name.clone()),
            ("namespace", NAMESPACE.to_string()),
        ],
    };
    apply(
        &client,
        &[
            // The chart's default namespaceSelector.
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": NAMESPACE, "labels": {"leasehold.dev/fencing": "enabled"}}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "writer", "namespace": NAMESPACE},
                   // No delete: docs/fencing.md leaves deletes to RBAC.
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch", "update"]},
                             {"apiGroups": ["apps"], "resources": ["deployments", "deployments/status", "deployments/scale"],
                              "verbs": ["get", "patch", "update"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "writer", "namespace": NAMESPACE},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "writer"},
                   "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE},
                                {"kind": "ServiceAccount", "name": ARCHIVER, "namespace": NAMESPACE}]}),
            // pod-b leads lock orders with TOKEN; pod-a led before it.
            fenced_config_map("orders", "postgres:orders", TOKEN, "pod-b"),
            // Another lock, whose tokens are far lower.
            fenced_config_map("billing", "redis:billing", 5, "pod-a"),
            fenced_deployment(),
        ],
    )
    .await;
    apply(&client, &policy).await;
    let (deposed_pod, leader_pod) = (as_pod(&env, "pod-a").await, as_pod(&env, "pod-b").await);
    let (deposed, leader) = (
        Api::namespaced(deposed_pod.clone(), NAMESPACE),
        Api::namespaced(leader_pod.clone(), NAMESPACE),
    );

    // A new policy takes effect once the API server's informers have it:
    // wait until the deposed leader's old token is refused (dry runs, which
    // pass admission, so an early acceptance changes nothing).
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the fencing policy in force", Duration::from_secs(60), || async {
        patch(&deposed, "orders", token(TOKEN - 1, "pod-a"), "pod-a", dry_run.clone()).await
    })
    .await;
    let stale = write(&deposed, "orders", token(TOKEN - 1, "pod-a"), "pod-a")
        .await
        .expect("refused");
    assert!(
        stale.contains(&format!(
            "fencing token {} is not newer than {TOKEN} already seen for lock postgres:orders from another holder",
            TOKEN - 1
        )),
        "{stale}"
    );
    // The type checker found nothing to warn about in the policy's CEL.
    let policies: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
        )),
    );
    let status = policies.get(&policy_name).await.unwrap().data["status"].clone();
    assert_eq!(status["typeChecking"]["expressionWarnings"], Value::Null, "{status}");

    // The deposed leader's write that leaves the annotations as they are.
    let untouched = write(&deposed, "orders", json!({}), "pod-a").await.expect("refused");
    assert!(
        untouched.contains("leasehold.dev/fencing-holder must name the writer, pod-a"),
        "{untouched}"
    );
    // ... or claims the current token as its own.
    let equal = write(&deposed, "orders", token(TOKEN, "pod-a"), "pod-a")
        .await
        .expect("refused");
    assert!(
        equal.contains(&format!("fencing token {TOKEN} is not newer than {TOKEN}")),
        "{equal}"
    );

    // The holder writes with its token again, then with a higher one.
    assert_eq!(write(&leader, "orders", token(TOKEN, "pod-b"), "pod-b").await, None);
    assert_eq!(write(&leader, "orders", token(TOKEN + 1, "pod-b"), "pod-b").await, None);
    let lower = write(&leader, "orders", token(TOKEN, "pod-b"), "pod-b")
        .await
        .expect("refused");
    assert!(
        lower.contains(&format!("fencing token {TOKEN} is older than {}", TOKEN + 1)),
        "{lower}"
    );
    let removed = write(&leader, "orders", json!({"leasehold.dev/fencing-token": null}), "pod-b")
        .await
        .expect("refused");
    assert!(
        removed.contains("the leasehold.dev/fencing-token annotation may not be removed"),
        "{removed}"
    );
    let malformed = write(
        &leader,
        "orders",
        json!({"leasehold.dev/fencing-token": "12a"}),
        "pod-b",
    )
    .await
    .expect("refused");
    assert!(
        malformed.contains("leasehold.dev/fencing-token 12a is malformed"),
        "{malformed}"
    );
    let relocked = write(
        &leader,
        "orders",
        json!({"leasehold.dev/fencing-lock": "postgres:billing", "leasehold.dev/fencing-token": (TOKEN + 2).to_string()}),
        "pod-b",
    )
    .await
    .expect("refused");
    assert!(
        relocked.contains("the leasehold.dev/fencing-lock annotation is immutable"),
        "{relocked}"
    );

    // Another lock's object: its own tokens, far below the orders' ones.
    assert_eq!(write(&deposed, "billing", token(6, "pod-a"), "pod-a").await, None);

    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let orders = configmaps.get("orders").await.unwrap();
    assert_eq!(orders.data.unwrap()["owner"], "pod-b", "the leader's write stays");
    assert_eq!(
        orders.metadata.annotations.unwrap()["leasehold.dev/fencing-token"],
        (TOKEN + 1).to_string()
    );

    subresources_and_recreation(&client, &deposed_pod, &leader_pod).await;

    trusted_writers_finish_deletes(&env, &client, &deposed).await;

    the_example_is_refused_by_the_api_server(&env);
}

/// A Deployment `ledger` that pod-b leads with [`TOKEN`]; its pods, if
/// scaled up, stay Pending behind a scheduling gate.
fn fenced_deployment() -> Value {
    let mut deployment = fenced_config_map("ledger", "postgres:orders", TOKEN, "pod-b");
    deployment["apiVersion"] = json!("apps/v1");
    deployment["kind"] = json!("Deployment");
    deployment.as_object_mut().unwrap().remove("data");
    deployment["spec"] = json!({
        "replicas": 0,
        "selector": {"matchLabels": {"app": "ledger"}},
        "template": {
            "metadata": {"labels": {"app": "ledger"}},
            "spec": {"schedulingGates": [{"name": "leasehold.dev/e2e-hold"}],
                     "containers": [{"name": "app", "image": "ledger:1"}]},
        },
    });
    deployment
}

/// The refusal message of a write, or `None` when it was accepted.
fn refusal<T>(result: kube::Result<T>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(e) => panic!("writing to the API server: {e}"),
    }
}

/// What the policy fences beyond an object's own updates, and the limits
/// docs/fencing.md states, each as the real API server decides it:
/// * a Deployment's `/status` write keeps the annotations it sends (the
///   status strategy resets only spec and labels,
///   pkg/registry/apps/deployment/strategy.go), so the policy refuses a
///   change of the fencing annotations there; the Deployment controller's
///   own revision annotation, written the same way, still passes;
/// * the status itself and a `/scale` write are not fenced;
/// * DELETE is left to RBAC, and a recreated object starts with whatever
///   token its creator writes (CREATE is not matched).
async fn subresources_and_recreation(admin: &Client, deposed: &Client, leader: &Client) {
    let as_deposed: Api<Deployment> = Api::namespaced(deposed.clone(), NAMESPACE);
    let as_leader: Api<Deployment> = Api::namespaced(leader.clone(), NAMESPACE);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let params = PatchParams::default();

    let lowered = refusal(
        as_deposed
            .patch_status(
                "ledger",
                &params,
                &Patch::Merge(json!({"metadata": {"annotations": token(TOKEN - 1, "pod-a")}})),
            )
            .await,
    )
    .expect("refused");
    assert!(
        lowered.contains("annotations of a fenced object may not change through its status subresource"),
        "{lowered}"
    );

    // The leader changes the pod template with its token; the controller
    // then records the new revision through /status, as a writer that is
    // not the holder and keeps the fencing annotations.
    let revision = |d: Deployment| {
        d.metadata
            .annotations
            .and_then(|a| a.get("deployment.kubernetes.io/revision").cloned())
    };
    let before = wait_for(
        "the Deployment controller's first revision",
        Duration::from_secs(60),
        || async { revision(deployments.get("ledger").await.unwrap()) },
    )
    .await;
    let template = json!({"metadata": {"annotations": token(TOKEN + 1, "pod-b")},
                          "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "ledger:2"}]}}}});
    assert_eq!(
        refusal(as_leader.patch("ledger", &params, &Patch::Strategic(template)).await),
        None
    );
    wait_for(
        "the controller's next revision recorded",
        Duration::from_secs(60),
        || async { revision(deployments.get("ledger").await.unwrap()).filter(|r| *r != before) },
    )
    .await;

    // Limits: the deposed leader's status and scale writes are not fenced.
    assert_eq!(
        refusal(
            as_deposed
                .patch_status(
                    "ledger",
                    &params,
                    &Patch::Merge(json!({"status": {"collisionCount": 7}}))
                )
                .await
        ),
        None,
        "a /status write that leaves the annotations alone is not fenced"
    );
    assert_eq!(
        refusal(
            as_deposed
                .patch_scale("ledger", &params, &Patch::Merge(json!({"spec": {"replicas": 2}})))
                .await
        ),
        None,
        "a /scale write carries no annotations and is not fenced"
    );
    assert_eq!(deployments.get("ledger").await.unwrap().spec.replicas, Some(2));

    // Delete is RBAC's: the writers' Role has no delete.
    let as_deposed: Api<ConfigMap> = Api::namespaced(deposed.clone(), NAMESPACE);
    match as_deposed.delete("orders", &Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("the deposed leader deleted the fenced object: {other:?}"),
    }
    // ... and a recreated object starts with its creator's token.
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    configmaps.delete("billing", &Default::default()).await.unwrap();
    wait_for("billing deleted", Duration::from_secs(30), || async {
        configmaps.get_opt("billing").await.unwrap().is_none().then_some(())
    })
    .await;
    let recreated: ConfigMap =
        serde_json::from_value(fenced_config_map("billing", "redis:billing", 1, "pod-a")).unwrap();
    assert_eq!(refusal(as_deposed.create(&Default::default(), &recreated).await), None);
}

/// Deletes that end with a write by a trusted writer (docs/fencing.md):
/// * a custom finalizer on a deleted fenced object: a writer not trusted may
///   not remove it (the holder rule), the trusted [`ARCHIVER`] may, and the
///   object is gone;
/// * a trusted writer still may not move the token, up or down;
/// * a foreground delete: the API server adds `foregroundDeletion`, the
///   garbage collector removes it as its own identity (a JSON merge patch of
///   metadata.finalizers, removeFinalizer in Kubernetes
///   pkg/controller/garbagecollector/operations.go), and the object is gone
///   instead of terminating forever.
async fn trusted_writers_finish_deletes(env: &Env, admin: &Client, deposed: &Api<ConfigMap>) {
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let user = format!("system:serviceaccount:{NAMESPACE}:{ARCHIVER}");
    let groups = ["system:serviceaccounts", "system:authenticated"];
    let archiver: Api<ConfigMap> = Api::namespaced(
        Client::try_from(env.impersonating(&user, &groups, None).await).unwrap(),
        NAMESPACE,
    );
    let gone = |name: &'static str| {
        let configmaps = configmaps.clone();
        move || {
            let configmaps = configmaps.clone();
            async move { configmaps.get_opt(name).await.unwrap().is_none().then_some(()) }
        }
    };
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": []}}));
    let params = PatchParams::default();

    let mut invoices = fenced_config_map("invoices", "postgres:orders", TOKEN, "pod-b");
    invoices["metadata"]["finalizers"] = json!([FINALIZER]);
    apply(admin, &[invoices]).await;
    configmaps.delete("invoices", &DeleteParams::default()).await.unwrap();
    let terminating = configmaps.get("invoices").await.unwrap().metadata;
    assert!(terminating.deletion_timestamp.is_some(), "{terminating:?}");
    let untrusted = refusal(deposed.patch("invoices", &params, &unfinalize).await).expect("refused");
    assert!(
        untrusted.contains("leasehold.dev/fencing-holder must name the writer, pod-a"),
        "{untrusted}"
    );
    assert_eq!(refusal(archiver.patch("invoices", &params, &unfinalize).await), None);
    wait_for(
        "invoices gone after its finalizer",
        Duration::from_secs(30),
        gone("invoices"),
    )
    .await;

    // A controller, not a leader: the token stays the leaders'.
    for (what, annotations) in [
        ("a higher token", token(TOKEN + 5, &user)),
        ("a lower token", token(TOKEN - 1, "pod-b")),
    ] {
        let moved = write(&archiver, "orders", annotations, ARCHIVER).await.expect(what);
        assert!(
            moved.contains(&format!(
                "may not change by {user}, a trusted writer (fencing.trustedWriters)"
            )),
            "{what}: {moved}"
        );
    }

    apply(
        admin,
        &[fenced_config_map("receipts", "postgres:orders", TOKEN, "pod-b")],
    )
    .await;
    let started = Instant::now();
    let deleting = configmaps
        .delete("receipts", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .expect("a foreground delete leaves the object until its finalizer is gone");
    assert_eq!(
        deleting.metadata.finalizers,
        Some(vec!["foregroundDeletion".to_string()]),
        "the API server adds the garbage collector's finalizer"
    );
    wait_for(
        "a foreground delete of a fenced object done",
        Duration::from_secs(30),
        gone("receipts"),
    )
    .await;
    eprintln!("foreground delete of a fenced ConfigMap: {:?}", started.elapsed());
}

/// `crates/leasehold-kubernetes/examples/fenced-write.rs kubernetes` under the policy in force: leaders
/// elected through a Lease write ConfigMap order-1 as candidate pods `a` and
/// `b`, and the API server refuses `a`'s stale write naming both tokens.
/// The example checks that outcome itself (and `b`'s write staying); this
/// test checks it ran and said so.
fn the_example_is_refused_by_the_api_server(env: &Env) {
    let output = std::process::Command::new(crate::support::example::built_example("fenced-write"))
        .arg("kubernetes")
        .env("KUBECONFIG", &env.kubeconfig)
        .env("FENCING_NAMESPACE", NAMESPACE)
        .env("FENCING_SERVICE_ACCOUNT", ACCOUNT)
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "fenced-write kubernetes: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // The API server's refusal names the policy, then its message
    // (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating).
    assert!(
        stdout.contains("the API server refuses it: configmaps \"order-1\" is forbidden: ValidatingAdmissionPolicy")
            && stdout.contains("is not newer than"),
        "{stdout}"
    );
    assert!(stdout.contains("order 1 is still b's"), "{stdout}");
}
