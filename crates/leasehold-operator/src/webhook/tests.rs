use super::*;
use std::sync::Arc;

use super::admission::*;
use super::certs::*;
use super::patch::*;
use http::Request;
use json_patch::Patch;
use k8s_openapi::api::core::v1::Pod;
use leasehold_kubernetes::api::contract::*;
use leasehold_testkit::api::{self, mock_client};
use serde_json::Value;
use serde_json::json;

fn config() -> InjectionConfig {
    InjectionConfig {
        image: "ghcr.io/leasehold/leasehold:0.1.0".into(),
        mode: SidecarMode::Native,
        http_port: DEFAULT_HTTP_PORT,
        metrics_port: DEFAULT_METRICS_PORT,
        cpu_request: "10m".into(),
        memory_request: "32Mi".into(),
        memory_limit: "64Mi".into(),
        env: vec![],
        cluster: None,
    }
}

fn pod(extra_spec: Value, annotated: bool) -> Pod {
    let mut spec = json!({"containers": [{"name": "app", "image": "app:1"}]});
    spec.as_object_mut()
        .unwrap()
        .extend(extra_spec.as_object().unwrap().clone());
    let annotations = if annotated {
        json!({LEASE_ANNOTATION: "scheduler"})
    } else {
        json!({})
    };
    leasehold_kubernetes::api::client::object_from_value(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app-0", "namespace": "prod", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn apply(pod: &Pod, patch: &Patch) -> Value {
    let mut doc = serde_json::to_value(pod).unwrap();
    json_patch::patch(&mut doc, patch).expect("the patch applies to the pod it was made for");
    doc
}

fn paths(patch: &Patch) -> Vec<String> {
    patch.0.iter().map(|op| op.path().to_string()).collect()
}

const GATED: Option<LeaseInjection> = Some(LeaseInjection {
    readiness_gate: true,
    url_secret: None,
});

/// A lease on PostgreSQL whose URL is in Secret `pg`, key `dsn`.
fn on_postgres() -> Option<LeaseInjection> {
    let store = leasehold_kubernetes::api::client::object_from_value(
        &json!({"postgres": {"urlSecretRef": {"name": "pg", "key": "dsn"}}}),
    )
    .unwrap();
    Some(LeaseInjection::new(false, Some(&store)))
}

/// The URL Secret goes into the container that campaigns, as the file
/// LEASEHOLD_STORE_URL_FILE names, and into no other container.
#[test]
fn a_postgres_or_redis_lease_mounts_its_url_secret_into_the_sidecar_only() {
    let pod = pod(json!({}), true);
    let doc = apply(&pod, &injection_patch(&pod, on_postgres(), &config()).unwrap());
    assert_eq!(
        doc["spec"]["volumes"][1],
        json!({"name": "leasehold-store-url", "secret": {"secretName": "pg", "items": [{"key": "dsn", "path": "url"}]}})
    );
    let sidecar = &doc["spec"]["initContainers"][0];
    assert_eq!(env_value(sidecar, ENV_STORE_URL_FILE), "/var/run/leasehold-store/url");
    assert_eq!(
        sidecar["volumeMounts"][1],
        json!({"name": "leasehold-store-url", "mountPath": "/var/run/leasehold-store", "readOnly": true})
    );
    let app_mounts = doc["spec"]["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        app_mounts.iter().all(|m| m["name"] != "leasehold-store-url"),
        "the app does not see the store's credentials: {app_mounts:?}"
    );
    // A Spanner lease mounts nothing.
    let spanner = apply(&pod, &injection_patch(&pod, GATED, &config()).unwrap());
    assert_eq!(spanner["spec"]["volumes"].as_array().unwrap().len(), 1);

    // A wrapped container campaigns itself: it gets the file.
    let run = annotated(
        json!({LEASE_ANNOTATION: "scheduler", RUN_ANNOTATION: "app"}),
        json!({"containers": [{"name": "app", "image": "app:1", "command": ["/app"]}]}),
    );
    let doc = apply(&run, &injection_patch(&run, on_postgres(), &config()).unwrap());
    let wrapped = &doc["spec"]["containers"][0];
    assert_eq!(env_value(wrapped, ENV_STORE_URL_FILE), "/var/run/leasehold-store/url");
    assert!(
        wrapped["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "leasehold-store-url")
    );
    assert!(
        doc["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "pg")
    );
}

#[test]
fn pods_without_the_annotation_pass_unchanged() {
    assert_eq!(
        injection_patch(&pod(json!({}), false), GATED, &config()),
        Err(NotInjected::NotAnnotated)
    );
}

#[test]
fn a_bare_pod_gets_the_sidecar_the_volume_and_the_gate_as_new_lists() {
    let pod = pod(json!({}), true);
    let patch = injection_patch(&pod, GATED, &config()).unwrap();
    assert_eq!(
        paths(&patch),
        [
            "/spec/containers/0/volumeMounts",
            "/spec/initContainers",
            "/spec/volumes",
            "/spec/readinessGates"
        ]
    );
    let doc = apply(&pod, &patch);
    // A native sidecar: an init container the kubelet keeps running, started
    // before the app containers and stopped after them
    // (https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/).
    let sidecar = &doc["spec"]["initContainers"][0];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(doc["spec"]["containers"].as_array().unwrap().len(), 1);
    assert_eq!(sidecar["name"], "leasehold");
    assert_eq!(sidecar["image"], "ghcr.io/leasehold/leasehold:0.1.0");
    assert_eq!(sidecar["args"], json!(["sidecar"]));
    let env: Vec<_> = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        env.starts_with(&["POD_NAME", "POD_NAMESPACE", "POD_UID", "LEASEHOLD_LEASE"]),
        "{env:?}"
    );
    assert_eq!(sidecar["env"][2]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
    assert_eq!(sidecar["env"][3]["value"], "scheduler");
    assert_eq!(sidecar["securityContext"]["runAsNonRoot"], true);
    // Numeric, or the kubelet cannot verify runAsNonRoot and refuses to start it.
    assert_eq!(sidecar["securityContext"]["runAsUser"], 65532);
    assert_eq!(sidecar["securityContext"]["runAsGroup"], 65532);
    assert_eq!(env_value(sidecar, "LEASEHOLD_APP_CONTAINER"), "app");
    assert_eq!(env_value(sidecar, "LEASEHOLD_METRICS_ADDR"), "0.0.0.0:4041");
    assert_eq!(sidecar["ports"][0]["containerPort"], 4041);
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["port"], 4041);
    assert_eq!(sidecar["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(sidecar["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sidecar["resources"]["limits"]["memory"], "64Mi");
    assert_eq!(
        doc["spec"]["volumes"],
        json!([{"name": "leasehold-token", "emptyDir": {}}])
    );
    assert_eq!(
        doc["spec"]["readinessGates"],
        json!([{"conditionType": "leasehold.dev/leader"}])
    );
    assert_eq!(
        doc["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "leasehold-token", "mountPath": "/var/run/leasehold", "readOnly": true}])
    );
}

#[test]
fn existing_lists_probes_and_gates_are_kept_and_appended_to() {
    let pod = pod(
        json!({
            "containers": [{
                "name": "app", "image": "app:1",
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                "livenessProbe": {"tcpSocket": {"port": 8080}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "initContainers": [{"name": "migrate", "image": "app:1"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "readinessGates": [{"conditionType": "example.com/warm"}],
        }),
        true,
    );
    let patch = injection_patch(&pod, GATED, &config()).unwrap();
    assert_eq!(
        paths(&patch),
        [
            "/spec/containers/0/volumeMounts/-",
            "/spec/initContainers/-",
            "/spec/volumes/-",
            "/spec/readinessGates/-"
        ]
    );
    let doc = apply(&pod, &patch);
    let app = &doc["spec"]["containers"][0];
    assert_eq!(
        app["readinessProbe"]["httpGet"]["path"], "/ready",
        "the app's probes are untouched"
    );
    assert_eq!(app["livenessProbe"]["tcpSocket"]["port"], 8080);
    assert_eq!(app["volumeMounts"].as_array().unwrap().len(), 2);
    assert_eq!(doc["spec"]["volumes"][0]["name"], "data");
    assert_eq!(doc["spec"]["volumes"][1]["name"], "leasehold-token");
    assert_eq!(
        doc["spec"]["readinessGates"],
        json!([{"conditionType": "example.com/warm"}, {"conditionType": "leasehold.dev/leader"}])
    );
}

#[test]
fn the_gate_is_added_only_when_the_lease_asks_and_never_twice() {
    let bare = pod(json!({}), true);
    let ungated = injection_patch(&bare, LeaseInjection::new(false, None).into(), &config()).unwrap();
    assert!(!paths(&ungated).iter().any(|p| p.contains("readinessGates")));
    let missing_lease = injection_patch(&bare, None, &config()).unwrap();
    assert!(!paths(&missing_lease).iter().any(|p| p.contains("readinessGates")));
    let gated = pod(json!({"readinessGates": [{"conditionType": LEADER_CONDITION}]}), true);
    let patch = injection_patch(&gated, GATED, &config()).unwrap();
    assert_eq!(
        apply(&gated, &patch)["spec"]["readinessGates"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// The kubelet turns a gated pod unready through the sidecar's probe; an
/// ungated pod's followers must stay Ready, so they get none.
#[test]
fn only_a_gated_pods_sidecar_gets_the_gate_probe() {
    let probe = |pod: &Pod, lease: Option<LeaseInjection>| {
        let patch = injection_patch(pod, lease, &config()).unwrap();
        apply(pod, &patch)["spec"]["initContainers"][0]["readinessProbe"].clone()
    };
    let bare = pod(json!({}), true);
    let gated = probe(&bare, GATED);
    assert_eq!(gated["httpGet"]["path"], GATE_PROBE_PATH);
    assert_eq!(gated["httpGet"]["port"], 4041);
    assert_eq!(gated["periodSeconds"], 1);
    assert_eq!(gated["timeoutSeconds"], 1);
    assert_eq!(gated["failureThreshold"], 1);
    assert!(probe(&bare, LeaseInjection::new(false, None).into()).is_null());
    assert!(probe(&bare, None).is_null());
    let own_gate = pod(json!({"readinessGates": [{"conditionType": LEADER_CONDITION}]}), true);
    assert_eq!(probe(&own_gate, None)["httpGet"]["path"], GATE_PROBE_PATH);
}

#[test]
fn an_already_injected_pod_is_left_alone() {
    for spec in [
        json!({"containers": [{"name": "app"}, {"name": SIDECAR_CONTAINER}]}),
        json!({"initContainers": [{"name": SIDECAR_CONTAINER, "restartPolicy": "Always", "ports": [{"containerPort": 4041}]}]}),
    ] {
        let pod = pod(spec, true);
        assert_eq!(
            injection_patch(&pod, GATED, &config()),
            Err(NotInjected::AlreadyInjected(SIDECAR_CONTAINER))
        );
    }
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("no {name} in {container}"))
}

fn annotated(annotations: Value, spec: Value) -> Pod {
    let mut pod = pod(spec, true);
    let extra: std::collections::BTreeMap<String, String> =
        leasehold_kubernetes::api::client::object_from_value(&annotations).unwrap();
    pod.metadata.annotations.as_mut().unwrap().extend(extra);
    pod
}

#[test]
fn container_mode_puts_the_sidecar_among_the_containers() {
    let by_annotation = annotated(json!({SIDECAR_MODE_ANNOTATION: "container"}), json!({}));
    let by_flag = pod(json!({}), true);
    let flag_config = InjectionConfig {
        mode: SidecarMode::Container,
        ..config()
    };
    for (pod, config) in [(&by_annotation, config()), (&by_flag, flag_config)] {
        let doc = apply(pod, &injection_patch(pod, GATED, &config).unwrap());
        assert_eq!(doc["spec"]["containers"][1]["name"], SIDECAR_CONTAINER);
        assert!(doc["spec"]["containers"][1].get("restartPolicy").is_none());
        assert!(doc["spec"].get("initContainers").is_none());
    }
    // The annotation also picks native mode over a container-mode default.
    let native = annotated(json!({SIDECAR_MODE_ANNOTATION: "native"}), json!({}));
    let config = InjectionConfig {
        mode: SidecarMode::Container,
        ..config()
    };
    let doc = apply(&native, &injection_patch(&native, GATED, &config).unwrap());
    assert_eq!(doc["spec"]["initContainers"][0]["restartPolicy"], "Always");
}

#[test]
fn the_metrics_port_follows_the_annotation_and_never_collides() {
    let pod = annotated(json!({METRICS_PORT_ANNOTATION: "9555"}), json!({}));
    let doc = apply(&pod, &injection_patch(&pod, GATED, &config()).unwrap());
    let sidecar = &doc["spec"]["initContainers"][0];
    assert_eq!(env_value(sidecar, "LEASEHOLD_METRICS_ADDR"), "0.0.0.0:9555");
    assert_eq!(sidecar["ports"][0]["containerPort"], 9555);
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["port"], 9555);
    for bad in ["0", "70000", "metrics", "4040"] {
        let pod = annotated(json!({METRICS_PORT_ANNOTATION: bad}), json!({}));
        let err = injection_patch(&pod, GATED, &config()).unwrap_err();
        assert!(err.is_user_error(), "{bad}: {err}");
        assert!(err.to_string().contains(METRICS_PORT_ANNOTATION), "{err}");
    }
    // The app already listens on the default metrics port: say so, do not
    // inject a sidecar that cannot bind.
    let busy = pod_with_port(DEFAULT_METRICS_PORT);
    let err = injection_patch(&busy, GATED, &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "annotation leasehold.dev/metrics-port: port 4041 is declared by container app; choose another metrics port"
    );
}

/// A development cluster's emulator address, a proxy: the operator's
/// `--sidecar-env` for every pod, the annotation for one, which wins by name.
#[test]
fn extra_environment_comes_from_the_operator_and_the_pod_which_wins() {
    let with_env = InjectionConfig {
        env: vec![
            "SPANNER_EMULATOR_HOST=10.0.0.1:9010".parse().unwrap(),
            "HTTPS_PROXY=http://proxy:3128".parse().unwrap(),
        ],
        ..config()
    };
    let pod = annotated(
        json!({SIDECAR_ENV_ANNOTATION: "SPANNER_EMULATOR_HOST=10.88.0.1:9010\n\n  LEASEHOLD_DRAIN=2s\n"}),
        json!({}),
    );
    let doc = apply(&pod, &injection_patch(&pod, GATED, &with_env).unwrap());
    let sidecar = &doc["spec"]["initContainers"][0];
    assert_eq!(env_value(sidecar, "SPANNER_EMULATOR_HOST"), "10.88.0.1:9010");
    assert_eq!(env_value(sidecar, "HTTPS_PROXY"), "http://proxy:3128");
    assert_eq!(env_value(sidecar, "LEASEHOLD_DRAIN"), "2s");
    let names: Vec<&Value> = sidecar["env"].as_array().unwrap().iter().map(|e| &e["name"]).collect();
    assert_eq!(
        names.iter().filter(|n| **n == "SPANNER_EMULATOR_HOST").count(),
        1,
        "{names:?}"
    );
    // The app container gets none of it.
    assert!(
        doc["spec"]["containers"][0]["env"]
            .as_array()
            .is_none_or(|env| env.iter().all(|e| e["name"] != "HTTPS_PROXY"))
    );

    for (bad, problem) in [
        ("NOEQUALS", "\"NOEQUALS\" is not NAME=VALUE"),
        ("1X=y", "\"1X\" is not a variable name"),
        ("POD_NAME=x", "POD_NAME is set by the injection itself"),
    ] {
        let pod = annotated(json!({SIDECAR_ENV_ANNOTATION: bad}), json!({}));
        let err = injection_patch(&pod, GATED, &config()).unwrap_err();
        assert!(err.is_user_error(), "{bad}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("annotation {SIDECAR_ENV_ANNOTATION}: {problem}")),
            "{err}"
        );
        assert_eq!(
            bad.parse::<ExtraEnv>().unwrap_err().split(" (").next(),
            problem.split(" (").next()
        );
    }
}

fn pod_with_port(port: u16) -> Pod {
    pod(
        json!({"containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": port}]}]}),
        true,
    )
}

#[test]
fn the_app_container_is_the_first_the_default_or_the_annotated_one() {
    let two = json!({"containers": [{"name": "web", "image": "a"}, {"name": "worker", "image": "b"}]});
    let app = |pod: &Pod| {
        let doc = apply(pod, &injection_patch(pod, GATED, &config()).unwrap());
        env_value(&doc["spec"]["initContainers"][0], "LEASEHOLD_APP_CONTAINER").to_string()
    };
    assert_eq!(app(&annotated(json!({}), two.clone())), "web");
    assert_eq!(
        app(&annotated(
            json!({"kubectl.kubernetes.io/default-container": "worker"}),
            two.clone()
        )),
        "worker"
    );
    assert_eq!(
        app(&annotated(
            json!({"kubectl.kubernetes.io/default-container": "web", APP_CONTAINER_ANNOTATION: "worker"}),
            two.clone()
        )),
        "worker"
    );
    let missing = annotated(json!({APP_CONTAINER_ANNOTATION: "db"}), two);
    assert_eq!(
        injection_patch(&missing, GATED, &config()).unwrap_err().to_string(),
        "annotation leasehold.dev/app-container: the pod has no container \"db\""
    );
}

struct Leases(Result<Option<LeaseInjection>, String>);

impl LeaseLookup for Leases {
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<LeaseInjection>, String> {
        assert_eq!(
            (namespace, name),
            ("prod", "scheduler"),
            "looked up in the pod's namespace"
        );
        self.0.clone()
    }
}

fn review(pod: &Pod) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "prod", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod, "dryRun": false,
        }
    })
}

async fn post_raw(lookup: Leases, body: String) -> (http::StatusCode, Vec<u8>) {
    use tower::ServiceExt;
    let app = router(Arc::new(lookup), Arc::new(config()));
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let response = app.oneshot(request.map(axum::body::Body::from)).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, bytes.to_vec())
}

async fn post(lookup: Leases, body: Value) -> Value {
    let (status, bytes) = post_raw(lookup, body.to_string()).await;
    assert_eq!(status, 200);
    serde_json::from_slice(&bytes).unwrap()
}

/// The API server only ever sends well-formed reviews; anything else is a
/// 400 naming what is wrong (the API server then applies the webhook's
/// failure policy), never an admission.
#[tokio::test]
async fn a_body_that_is_not_an_admission_review_is_a_bad_request_naming_the_fault() {
    let mut wrong_type = review(&pod(json!({}), true));
    wrong_type["request"]["object"]["spec"]["containers"] = json!("app");
    for (body, names) in [
        ("{\"kind\": ".to_string(), "EOF while parsing"),
        (
            wrong_type.to_string(),
            "invalid type: string \"app\", expected a sequence",
        ),
    ] {
        let (status, answer) = post_raw(Leases(Ok(GATED)), body).await;
        let answer = String::from_utf8(answer).unwrap();
        assert_eq!(status, 400, "{answer}");
        assert!(answer.starts_with("not an AdmissionReview of a pod: "), "{answer}");
        assert!(answer.contains(names), "{answer}");
    }
}

fn decoded_patch(response: &Value) -> Patch {
    let encoded = response["response"]["patch"].as_str().expect("a patch");
    let bytes: k8s_openapi::ByteString = leasehold_kubernetes::api::client::object_from_value(&json!(encoded)).unwrap();
    serde_json::from_slice(&bytes.0).unwrap()
}

#[tokio::test]
async fn the_webhook_answers_with_a_json_patch_for_the_same_request() {
    let pod = pod(json!({}), true);
    let answer = post(Leases(Ok(GATED)), review(&pod)).await;
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    assert!(answer["response"].get("warnings").is_none());
    assert_eq!(decoded_patch(&answer), injection_patch(&pod, GATED, &config()).unwrap());
}

#[tokio::test]
async fn a_missing_lease_is_admitted_with_a_warning_not_rejected() {
    let pod = pod(json!({}), true);
    for lookup in [Leases(Ok(None)), Leases(Err("connection refused".into()))] {
        let answer = post(lookup, review(&pod)).await;
        assert_eq!(answer["response"]["allowed"], true);
        let warning = answer["response"]["warnings"][0].as_str().unwrap();
        assert!(warning.contains("DistributedLease prod/scheduler"), "{warning}");
        let patched = apply(&pod, &decoded_patch(&answer));
        assert_eq!(patched["spec"]["initContainers"][0]["name"], "leasehold");
        assert!(patched["spec"].get("readinessGates").is_none());
    }
}

/// The sidecar waits for a missing lease (it does not exit), and the warning
/// the user sees in kubectl says exactly that.
#[tokio::test]
async fn the_missing_lease_warning_says_the_sidecar_waits() {
    let answer = post(Leases(Ok(None)), review(&pod(json!({}), true))).await;
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "DistributedLease prod/scheduler not found: sidecar injected without a readiness gate; \
             the sidecar waits until the DistributedLease exists"
        ])
    );
}

#[tokio::test]
async fn a_bad_annotation_is_admitted_uninjected_with_a_warning() {
    let pod = annotated(json!({SIDECAR_MODE_ANNOTATION: "sometimes"}), json!({}));
    let answer = post(Leases(Ok(GATED)), review(&pod)).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "leasehold sidecar not injected: annotation leasehold.dev/sidecar-mode: \"sometimes\" is neither \"native\" nor \"container\""
        ])
    );
}

#[tokio::test]
async fn unannotated_pods_get_no_patch() {
    let answer = post(Leases(Ok(GATED)), review(&pod(json!({}), false))).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
}

#[tokio::test]
async fn the_ca_bundle_is_patched_into_every_webhook_on_the_wire() {
    let (client, mut handle) = mock_client("default");
    let path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/leasehold";
    let server = tokio::spawn(async move {
        let request = handle.expect("GET").await;
        assert_eq!(request.method, "GET");
        assert_eq!(request.path, path);
        let current = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "leasehold"},
            "webhooks": [
                {"name": "inject.leasehold.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"service": {"name": "leasehold-webhook", "namespace": "leasehold-system"}}},
                {"name": "inject-v2.leasehold.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"service": {"name": "leasehold-webhook", "namespace": "leasehold-system"}}},
            ]
        });
        request.respond(200, &current);

        let request = handle.expect("PATCH").await;
        assert_eq!(request.method, "PATCH");
        assert_eq!(request.path, path);
        assert_eq!(request.content_type.as_deref(), Some("application/json-patch+json"));
        let ops: Value = request.body.clone();
        let bundle = base64_encode(b"CA PEM");
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/webhooks/0/name", "value": "inject.leasehold.dev"},
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle},
                {"op": "test", "path": "/webhooks/1/name", "value": "inject-v2.leasehold.dev"},
                {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": bundle},
            ])
        );
        request.respond(200, &current);
    });
    patch_ca_bundle(client, "leasehold", "CA PEM").await.unwrap();
    server.await.unwrap();
    assert_eq!(base64_encode(b"CA PEM"), "Q0EgUEVN");
}

#[tokio::test]
async fn the_first_replica_stores_the_certificate_and_later_ones_reuse_it() {
    let (client, mut handle) = mock_client("default");
    let path = "/api/v1/namespaces/leasehold-system/secrets";
    let server = tokio::spawn(async move {
        let request = handle.expect("GET").await;
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("GET", &*format!("{path}/leasehold-webhook-tls"))
        );
        request.respond(404, &api::status(404, "NotFound", "not found"));
        let request = handle.expect("POST").await;
        assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", path));
        assert_eq!(request.raw_query(), "&fieldManager=leasehold-operator");
        let body: Value = request.body.clone();
        assert_eq!(body["type"], "kubernetes.io/tls");
        assert_eq!(body["metadata"]["name"], "leasehold-webhook-tls");
        assert!(body["stringData"]["tls.key"].as_str().unwrap().contains("PRIVATE KEY"));
        // The API server stores stringData as base64 data: hand it back that way.
        let mut stored = body.clone();
        let data: serde_json::Map<String, Value> = body["stringData"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), json!(base64_encode(v.as_str().unwrap().as_bytes()))))
            .collect();
        stored["data"] = json!(data);
        stored.as_object_mut().unwrap().remove("stringData");
        request.respond(200, &stored);
        stored
    });
    let first = shared_self_signed(client, "leasehold-system", "leasehold-webhook-tls", "leasehold-webhook")
        .await
        .unwrap();
    let stored = server.await.unwrap();

    // A second replica finds the Secret and serves the same certificate.
    let (client, mut handle) = mock_client("default");
    tokio::spawn(async move {
        let request = handle.expect("GET").await;
        assert_eq!(request.method, "GET");
        request.respond(200, &stored);
    });
    let second = shared_self_signed(client, "leasehold-system", "leasehold-webhook-tls", "leasehold-webhook")
        .await
        .unwrap();
    assert_eq!(
        (second.ca_pem, second.cert_pem, second.key_pem),
        (first.ca_pem, first.cert_pem, first.key_pem)
    );
}

/// The chart passes the sidecar's extra environment in one variable, one
/// NAME=VALUE per line; a bad line is refused at start-up, naming it.
#[test]
fn sidecar_env_lines_parse_as_the_chart_writes_them() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sidecar: SidecarArgs,
    }
    let cli = Cli::parse_from([
        "x",
        "--sidecar-env",
        "HTTPS_PROXY=http://p:3128\nSPANNER_EMULATOR_HOST=10.88.0.1:9010",
    ]);
    let env = cli.sidecar.injection("img:1".into(), None).env;
    let pairs: Vec<(&str, &str)> = env.iter().map(|e| (e.name.as_str(), e.value.as_str())).collect();
    assert_eq!(
        pairs,
        [
            ("HTTPS_PROXY", "http://p:3128"),
            ("SPANNER_EMULATOR_HOST", "10.88.0.1:9010")
        ]
    );
    let err = Cli::try_parse_from(["x", "--sidecar-env", "A=1\nPOD_UID=x"])
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("POD_UID is set by the injection itself"),
        "{err}"
    );
}

#[test]
fn the_webhook_needs_a_sidecar_image_only_when_it_is_on() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }
    assert!(Cli::parse_from(["x"]).webhook.injection(None).unwrap().is_none());
    let err = Cli::parse_from(["x", "--webhook-listen", "0.0.0.0:8443"])
        .webhook
        .injection(None)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "--sidecar-image (LEASEHOLD_SIDECAR_IMAGE) is required with --webhook-listen"
    );
    let on = Cli::parse_from(["x", "--webhook-listen", "0.0.0.0:8443", "--sidecar-image", "img:1"]);
    let injection = on.webhook.injection(None).unwrap().unwrap();
    assert_eq!(injection.image, "img:1");
    assert_eq!(injection.mode, SidecarMode::Native, "native sidecars by default");
    let container = Cli::parse_from([
        "x",
        "--webhook-listen",
        "0.0.0.0:8443",
        "--sidecar-image",
        "img:1",
        "--sidecar-mode",
        "container",
        "--sidecar-metrics-port",
        "9555",
    ]);
    let injection = container.webhook.injection(None).unwrap().unwrap();
    assert_eq!((injection.mode, injection.metrics_port), (SidecarMode::Container, 9555));
}

mod server {
    //! The HTTPS server over real sockets on 127.0.0.1. Timeouts here are
    //! short so the tests end soon; `GUARD` only keeps a broken server from
    //! hanging the suite (it is a failure, never a measurement).
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    const GUARD: Duration = Duration::from_secs(20);

    fn connector(ca_pem: &str) -> tokio_rustls::TlsConnector {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(client))
    }

    async fn tls(
        addr: SocketAddr,
        ca_pem: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("leasehold-webhook.leasehold-system.svc").unwrap();
        connector(ca_pem).connect(name, stream).await
    }

    /// Reads until the peer closes; `None` if it never does within GUARD.
    async fn read_to_close(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
        let mut bytes = Vec::new();
        match tokio::time::timeout(GUARD, stream.read_to_end(&mut bytes)).await {
            Ok(_) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Err(_) => None,
        }
    }

    struct Running {
        addr: SocketAddr,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<Result<()>>,
    }

    async fn start(
        certificates: Arc<dyn rustls::server::ResolvesServerCert>,
        app: axum::Router,
        timeouts: Timeouts,
    ) -> Running {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(listener, certificates, app, timeouts, shutdown.clone()));
        Running { addr, shutdown, task }
    }

    impl Running {
        /// Shuts the server down; it must end within GUARD.
        async fn stop(self, why: &str) {
            self.shutdown.cancel();
            tokio::time::timeout(GUARD, self.task)
                .await
                .unwrap_or_else(|_| panic!("{why}"))
                .unwrap()
                .unwrap();
        }
    }

    /// The body of `GET /` over TLS, trusting the bundle's CA.
    async fn get(server: &Running, bundle: &CertificateBundle) -> String {
        let mut client = tls(server.addr, &bundle.ca_pem).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let response = read_to_close(&mut client).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response.rsplit("\r\n\r\n").next().unwrap().to_string()
    }

    fn bundle() -> CertificateBundle {
        CertificateBundle::self_signed("leasehold-webhook", "leasehold-system").unwrap()
    }

    fn timeouts(handshake_ms: u64, header_read_ms: u64) -> Timeouts {
        Timeouts {
            handshake: Duration::from_millis(handshake_ms),
            header_read: Duration::from_millis(header_read_ms),
        }
    }

    fn hello() -> axum::Router {
        axum::Router::new().route("/", axum::routing::get(|| async { "hello" }))
    }

    #[tokio::test]
    async fn the_self_signed_certificate_serves_tls_that_its_ca_verifies() {
        let bundle = bundle();
        assert!(bundle.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let server = start(fixed(&bundle).unwrap(), hello(), Timeouts::default()).await;
        assert_eq!(
            get(&server, &bundle).await,
            "hello",
            "the CA verifies the serving certificate"
        );
        server.stop("the server shuts down").await;
    }

    #[tokio::test]
    async fn a_request_in_flight_completes_on_shutdown() {
        let bundle = bundle();
        let entered = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        let (e, r) = (entered.clone(), release.clone());
        let app = axum::Router::new().route(
            "/mutate",
            axum::routing::post(move || {
                let (e, r) = (e.clone(), r.clone());
                async move {
                    e.notify_one();
                    r.notified().await;
                    "admitted"
                }
            }),
        );
        let server = start(fixed(&bundle).unwrap(), app, Timeouts::default()).await;
        let mut client = tls(server.addr, &bundle.ca_pem).await.unwrap();
        client
            .write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        entered.notified().await;
        server.shutdown.cancel();
        // The server waits for the request it is serving...
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !server.task.is_finished(),
            "the server stopped with a request in flight"
        );
        // ...and new connections are no longer accepted.
        assert!(
            tls(server.addr, &bundle.ca_pem).await.is_err(),
            "accepted a connection after shutdown"
        );
        release.notify_one();
        let response = read_to_close(&mut client).await.expect("the response arrives");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("admitted"), "{response}");
        server.stop("the server ends once the request is done").await;
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
        let bundle = bundle();
        let server = start(fixed(&bundle).unwrap(), hello(), timeouts(200, 60_000)).await;
        // TCP only: never a ClientHello.
        let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        assert_eq!(
            read_to_close(&mut silent).await,
            Some(String::new()),
            "the server must close a connection that never starts TLS"
        );
        assert_eq!(get(&server, &bundle).await, "hello", "the server still serves others");
        server.stop("the server shuts down").await;
    }

    #[tokio::test]
    async fn shutdown_does_not_wait_for_a_client_that_never_starts_tls() {
        let bundle = bundle();
        let server = start(fixed(&bundle).unwrap(), hello(), timeouts(3_600_000, 3_600_000)).await;
        let _silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        // An idle, fully set-up connection does not hold shutdown either.
        let _idle = tls(server.addr, &bundle.ca_pem).await.unwrap();
        server
            .stop("shutdown ends without waiting for silent or idle clients")
            .await;
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_dropped() {
        let bundle = bundle();
        let server = start(fixed(&bundle).unwrap(), hello(), timeouts(60_000, 200)).await;
        let mut client = tls(server.addr, &bundle.ca_pem).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let answer = read_to_close(&mut client)
            .await
            .expect("the server must close a connection whose headers never end");
        assert!(!answer.contains("hello"), "{answer}");
        server.stop("the server shuts down").await;
    }

    /// Writes the bundle as cert-manager's Secret mount has it: new files
    /// swapped in by rename (the kubelet swaps a symlink to a new folder).
    fn write_cert(dir: &std::path::Path, bundle: &CertificateBundle) {
        for (file, text) in [("tls.crt", &bundle.cert_pem), ("tls.key", &bundle.key_pem)] {
            let staged = dir.join(format!(".{file}.new"));
            std::fs::write(&staged, text).unwrap();
            std::fs::rename(&staged, dir.join(file)).unwrap();
        }
    }

    #[tokio::test]
    async fn a_certificate_rotated_on_disk_is_served_without_a_restart() {
        let dir = std::env::temp_dir().join(format!("leasehold-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = bundle();
        write_cert(&dir, &first);
        let server = start(Arc::new(CertDir::open(&dir).unwrap()), hello(), Timeouts::default()).await;
        tls(server.addr, &first.ca_pem).await.expect("the first certificate");

        let second = bundle();
        write_cert(&dir, &second);
        tls(server.addr, &second.ca_pem)
            .await
            .expect("the rotated certificate, without a restart");
        assert!(
            tls(server.addr, &first.ca_pem).await.is_err(),
            "the old certificate is no longer served"
        );

        // A rotation caught half-way (an unreadable key) keeps the last good one.
        std::fs::write(dir.join("tls.key"), "not a key").unwrap();
        tls(server.addr, &second.ca_pem)
            .await
            .expect("the last good certificate stays");
        server.stop("the server shuts down").await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_without_a_certificate_is_an_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("leasehold-nocert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = CertDir::open(&dir).unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_key_that_does_not_match_the_certificate_is_refused() {
    let a = CertificateBundle::self_signed("leasehold-webhook", "leasehold-system").unwrap();
    let b = CertificateBundle::self_signed("leasehold-webhook", "leasehold-system").unwrap();
    let mixed = CertificateBundle {
        key_pem: b.key_pem,
        ..a.clone()
    };
    assert!(a.certified_key().is_ok());
    assert!(mixed.certified_key().is_err());
}

fn run_pod(container: Value) -> Pod {
    annotated(
        json!({RUN_ANNOTATION: "report"}),
        json!({"containers": [{"name": "app", "image": "app:1"}, container]}),
    )
}

#[test]
fn a_run_pod_gets_its_command_wrapped_the_binary_installed_and_no_sidecar() {
    let pod = run_pod(json!({
        "name": "report", "image": "report:1",
        "command": ["/app/report"], "args": ["--since", "yesterday"],
        "env": [{"name": "MODE", "value": "full"}],
    }));
    let doc = apply(&pod, &injection_patch(&pod, GATED, &config()).unwrap());
    let spec = &doc["spec"];
    let report = &spec["containers"][1];
    assert_eq!(
        report["command"],
        json!([
            RUNNER_PATH,
            "run",
            "--lease",
            "scheduler",
            "--",
            "/app/report",
            "--since",
            "yesterday"
        ])
    );
    assert!(
        report.get("args").is_none(),
        "the args are in the command now: {report}"
    );
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    assert_eq!(
        report["env"],
        json!([
            {"name": "MODE", "value": "full"},
            field("POD_NAME", "metadata.name"),
            field("POD_NAMESPACE", "metadata.namespace"),
            field("POD_UID", "metadata.uid"),
            {"name": "LEASEHOLD_TOKEN_FILE", "value": "/var/run/leasehold/token.json"},
            {"name": "LEASEHOLD_METRICS_ADDR", "value": "0.0.0.0:4041"},
        ])
    );
    // The runner's metrics, on the port the chart's PodMonitor scrapes by name.
    assert_eq!(report["ports"], json!([{"name": "lh-metrics", "containerPort": 4041}]));
    assert_eq!(
        report["volumeMounts"],
        json!([
            {"name": "leasehold-token", "mountPath": "/var/run/leasehold"},
            {"name": "leasehold-bin", "mountPath": BIN_DIR, "readOnly": true},
        ])
    );
    // The other containers read the token file, as with the sidecar.
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        json!([{"name": "leasehold-token", "mountPath": "/var/run/leasehold", "readOnly": true}])
    );
    assert_eq!(spec["containers"].as_array().unwrap().len(), 2, "no sidecar container");
    let init = spec["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1, "the installer and no sidecar: {init:?}");
    let installer = &init[0];
    assert_eq!(installer["name"], INSTALLER_NAME);
    assert_eq!(installer["image"], config().image);
    assert_eq!(installer["args"], json!(["__install-self", BIN_DIR]));
    assert!(
        installer.get("restartPolicy").is_none(),
        "it must exit before the app starts"
    );
    assert_eq!(installer["securityContext"]["runAsUser"], SIDECAR_USER);
    assert_eq!(installer["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        installer["volumeMounts"],
        json!([{"name": "leasehold-bin", "mountPath": BIN_DIR}])
    );
    assert_eq!(
        spec["volumes"],
        json!([{"name": "leasehold-token", "emptyDir": {}}, {"name": "leasehold-bin", "emptyDir": {}}])
    );
    // The runner publishes the condition the gate waits for.
    assert_eq!(spec["readinessGates"], json!([{"conditionType": LEADER_CONDITION}]));
    // The installer's file is the runner's binary.
    assert_eq!(format!("{BIN_DIR}/{}", RUNNER_FILE_NAME), RUNNER_PATH);
}

#[test]
fn a_run_container_without_args_keeps_its_command_whole() {
    let pod = run_pod(json!({"name": "report", "image": "report:1", "command": ["/app/report", "-v"]}));
    let patch = injection_patch(&pod, None, &config()).unwrap();
    assert!(!paths(&patch).iter().any(|p| p.ends_with("/args")), "{patch:?}");
    let doc = apply(&pod, &patch);
    assert_eq!(
        doc["spec"]["containers"][1]["command"],
        json!([RUNNER_PATH, "run", "--lease", "scheduler", "--", "/app/report", "-v"])
    );
}

#[test]
fn a_run_container_without_a_command_is_refused_naming_it_and_the_fix() {
    for container in [
        json!({"name": "report", "image": "report:1"}),
        json!({"name": "report", "image": "report:1", "args": ["--since", "yesterday"]}),
        json!({"name": "report", "image": "report:1", "command": []}),
    ] {
        let err = injection_patch(&run_pod(container), GATED, &config()).unwrap_err();
        assert!(err.is_user_error());
        assert_eq!(
            err.to_string(),
            "annotation leasehold.dev/run: container \"report\" has no command, so its image's ENTRYPOINT would be \
             run, which the webhook cannot see: set command: (and args:) on the container to what it should run"
        );
    }
    let err = injection_patch(&annotated(json!({RUN_ANNOTATION: "nope"}), json!({})), GATED, &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "annotation leasehold.dev/run: the pod has no container \"nope\""
    );
}

#[test]
fn a_run_container_keeps_its_own_identical_env_and_is_refused_a_different_one() {
    let own = json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}});
    let pod = run_pod(json!({"name": "report", "command": ["/r"], "env": [own]}));
    let doc = apply(&pod, &injection_patch(&pod, None, &config()).unwrap());
    let env = doc["spec"]["containers"][1]["env"].as_array().unwrap();
    assert_eq!(env.iter().filter(|e| e["name"] == "POD_NAME").count(), 1, "{env:?}");
    assert_eq!(env.len(), 5);
    let pod = run_pod(json!({"name": "report", "command": ["/r"], "env": [{"name": "POD_NAME", "value": "x"}]}));
    assert_eq!(
        injection_patch(&pod, None, &config()).unwrap_err().to_string(),
        "annotation leasehold.dev/run: container \"report\" sets POD_NAME itself, which leasehold run reads: remove it"
    );
}

#[test]
fn a_wrapped_pod_is_left_alone() {
    let pod = run_pod(json!({"name": "report", "command": ["/app/report"], "args": ["-v"]}));
    let wrapped: Pod = leasehold_kubernetes::api::client::object_from_value(&apply(
        &pod,
        &injection_patch(&pod, GATED, &config()).unwrap(),
    ))
    .unwrap();
    assert_eq!(
        injection_patch(&wrapped, GATED, &config()),
        Err(NotInjected::AlreadyInjected(INSTALLER_NAME))
    );
}

#[test]
fn a_run_pod_may_use_the_api_port_but_not_the_metrics_port() {
    // The runner serves metrics and no HTTP API, so the app may declare 4040.
    let pod = run_pod(json!({"name": "report", "command": ["/r"], "ports": [{"containerPort": 4040}]}));
    let doc = apply(&pod, &injection_patch(&pod, None, &config()).unwrap());
    assert_eq!(
        doc["spec"]["containers"][1]["ports"],
        json!([{"containerPort": 4040}, {"name": "lh-metrics", "containerPort": 4041}])
    );
    let pod = run_pod(json!({"name": "report", "command": ["/r"], "ports": [{"containerPort": 4041}]}));
    assert_eq!(
        injection_patch(&pod, None, &config()).unwrap_err().to_string(),
        "annotation leasehold.dev/metrics-port: port 4041 is declared by container report; choose another metrics port"
    );
    // The annotation moves the runner's port, as the sidecar's.
    let mut moved = pod.clone();
    moved
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(METRICS_PORT_ANNOTATION.into(), "9400".into());
    let doc = apply(&moved, &injection_patch(&moved, None, &config()).unwrap());
    let report = &doc["spec"]["containers"][1];
    assert_eq!(env_value(report, "LEASEHOLD_METRICS_ADDR"), "0.0.0.0:9400");
    assert_eq!(report["ports"][1], json!({"name": "lh-metrics", "containerPort": 9400}));
    // Its own metrics address would move the port away from the one declared.
    let own = run_pod(
        json!({"name": "report", "command": ["/r"], "env": [{"name": "LEASEHOLD_METRICS_ADDR", "value": "0.0.0.0:1"}]}),
    );
    assert_eq!(
        injection_patch(&own, None, &config()).unwrap_err().to_string(),
        "annotation leasehold.dev/run: container \"report\" sets LEASEHOLD_METRICS_ADDR itself, which leasehold run \
         reads: remove it (the metrics port is leasehold.dev/metrics-port's)"
    );
}

#[tokio::test]
async fn a_run_pod_that_cannot_be_wrapped_is_denied_not_run_everywhere() {
    let pod = run_pod(json!({"name": "report", "image": "report:1"}));
    let answer = post(Leases(Ok(GATED)), review(&pod)).await;
    assert_eq!(answer["response"]["allowed"], false);
    assert!(answer["response"].get("patch").is_none());
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("leasehold cannot wrap the command with `leasehold run`: annotation leasehold.dev/run: container \"report\" has no command"),
        "{message}"
    );
    let wrappable = run_pod(json!({"name": "report", "image": "report:1", "command": ["/r"]}));
    let answer = post(Leases(Ok(GATED)), review(&wrappable)).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(
        decoded_patch(&answer),
        injection_patch(&wrappable, GATED, &config()).unwrap()
    );
}

/// Issue 37: every candidate knows its cluster. The operator's cluster name
/// reaches the injected sidecar and a wrapped `leasehold run`, and a pod's
/// own environment cannot name another one.
#[test]
fn the_cluster_name_reaches_every_injected_sidecar_and_runner() {
    let in_eu = InjectionConfig {
        cluster: Some("eu".into()),
        ..config()
    };
    let pod = pod(json!({}), true);
    let doc = apply(&pod, &injection_patch(&pod, GATED, &in_eu).unwrap());
    assert_eq!(env_value(&doc["spec"]["initContainers"][0], ENV_CLUSTER_NAME), "eu");
    let run = run_pod(json!({"name": "report", "image": "report:1", "command": ["/app/report"]}));
    let doc = apply(&run, &injection_patch(&run, GATED, &in_eu).unwrap());
    assert_eq!(env_value(&doc["spec"]["containers"][1], ENV_CLUSTER_NAME), "eu");
    // Without a name, none is set (the sidecar's identity has no cluster part).
    let doc = apply(&pod, &injection_patch(&pod, GATED, &config()).unwrap());
    assert!(
        doc["spec"]["initContainers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != ENV_CLUSTER_NAME)
    );
    let renamed = annotated(json!({SIDECAR_ENV_ANNOTATION: "LEASEHOLD_CLUSTER_NAME=us"}), json!({}));
    let err = injection_patch(&renamed, GATED, &in_eu).unwrap_err();
    assert!(
        err.to_string()
            .contains("LEASEHOLD_CLUSTER_NAME is set by the injection itself"),
        "{err}"
    );
}

/// Issue 57: the webhook's log names the pod as a value a log pipeline can
/// match, not the Debug form of an Option.
#[tokio::test]
async fn the_injection_is_logged_with_plain_fields() {
    use leasehold_testkit::logs::{debug_forms, event, json_events};
    let pod = pod(json!({}), true);
    let (_, events) = json_events(post(Leases(Ok(GATED)), review(&pod))).await;
    assert_eq!(event(&events, "injected the leasehold sidecar")["pod"], "app-0");
    assert_eq!(debug_forms(&events), Vec::<String>::new());
}
