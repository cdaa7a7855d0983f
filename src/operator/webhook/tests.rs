use super::*;
use std::sync::Arc;

use super::admission::*;
use super::certs::*;
use super::patch::*;
use http::{Request, Response};
use json_patch::Patch;
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use serde_json::Value;
use serde_json::json;

fn config() -> InjectionConfig {
    InjectionConfig {
        image: "ghcr.io/leasehold/leasehold:0.1.0".into(),
        http_port: 4040,
        metrics_port: 9090,
        cpu_request: "10m".into(),
        memory_request: "32Mi".into(),
        memory_limit: "64Mi".into(),
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
    serde_json::from_value(json!({
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

const GATED: Option<LeaseInjection> = Some(LeaseInjection { readiness_gate: true });

#[test]
fn pods_without_the_annotation_pass_unchanged() {
    assert!(injection_patch(&pod(json!({}), false), GATED, &config()).is_none());
}

#[test]
fn a_bare_pod_gets_the_sidecar_the_volume_and_the_gate_as_new_lists() {
    let pod = pod(json!({}), true);
    let patch = injection_patch(&pod, GATED, &config()).unwrap();
    assert_eq!(
        paths(&patch),
        [
            "/spec/containers/0/volumeMounts",
            "/spec/containers/-",
            "/spec/volumes",
            "/spec/readinessGates"
        ]
    );
    let doc = apply(&pod, &patch);
    let sidecar = &doc["spec"]["containers"][1];
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
            "/spec/containers/-",
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
    let ungated = injection_patch(&bare, Some(LeaseInjection { readiness_gate: false }), &config()).unwrap();
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

#[test]
fn an_already_injected_pod_is_left_alone() {
    let pod = pod(json!({"containers": [{"name": "app"}, {"name": SIDECAR_NAME}]}), true);
    assert!(injection_patch(&pod, GATED, &config()).is_none());
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

async fn post(lookup: Leases, body: Value) -> Value {
    use tower::ServiceExt;
    let app = router(Arc::new(lookup), Arc::new(config()));
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(body.to_string())
        .unwrap();
    let response = app.oneshot(request.map(axum::body::Body::from)).await.unwrap();
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn decoded_patch(response: &Value) -> Patch {
    let encoded = response["response"]["patch"].as_str().expect("a patch");
    let bytes: k8s_openapi::ByteString = serde_json::from_value(json!(encoded)).unwrap();
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
        assert_eq!(patched["spec"]["containers"][1]["name"], "leasehold");
        assert!(patched["spec"].get("readinessGates").is_none());
    }
}

#[tokio::test]
async fn unannotated_pods_get_no_patch() {
    let answer = post(Leases(Ok(GATED)), review(&pod(json!({}), false))).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
}

#[tokio::test]
async fn the_ca_bundle_is_patched_into_every_webhook_on_the_wire() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/leasehold";
    let server = tokio::spawn(async move {
        let (request, send) = handle.next_request().await.expect("GET");
        assert_eq!(request.method(), "GET");
        assert_eq!(request.uri().path(), path);
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
        send.send_response(Response::new(Body::from(serde_json::to_vec(&current).unwrap())));

        let (request, send) = handle.next_request().await.expect("PATCH");
        assert_eq!(request.method(), "PATCH");
        assert_eq!(request.uri().path(), path);
        assert_eq!(request.headers()["content-type"], "application/json-patch+json");
        let body = request.into_body().collect_bytes().await.unwrap();
        let ops: Value = serde_json::from_slice(&body).unwrap();
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
        send.send_response(Response::new(Body::from(serde_json::to_vec(&current).unwrap())));
    });
    patch_ca_bundle(client, "leasehold", "CA PEM").await.unwrap();
    server.await.unwrap();
    assert_eq!(base64_encode(b"CA PEM"), "Q0EgUEVN");
}

#[tokio::test]
async fn the_first_replica_stores_the_certificate_and_later_ones_reuse_it() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let path = "/api/v1/namespaces/leasehold-system/secrets";
    let server = tokio::spawn(async move {
        let (request, send) = handle.next_request().await.expect("GET");
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("GET", &*format!("{path}/leasehold-webhook-tls"))
        );
        let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
        send.send_response(
            Response::builder()
                .status(404)
                .body(Body::from(not_found.to_string().into_bytes()))
                .unwrap(),
        );
        let (request, send) = handle.next_request().await.expect("POST");
        assert_eq!((request.method().as_str(), request.uri().path()), ("POST", path));
        assert_eq!(request.uri().query(), Some("&fieldManager=leasehold-operator"));
        let body: Value = serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
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
        send.send_response(Response::new(Body::from(stored.to_string().into_bytes())));
        stored
    });
    let first = shared_self_signed(client, "leasehold-system", "leasehold-webhook-tls", "leasehold-webhook")
        .await
        .unwrap();
    let stored = server.await.unwrap();

    // A second replica finds the Secret and serves the same certificate.
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    tokio::spawn(async move {
        let (request, send) = handle.next_request().await.expect("GET");
        assert_eq!(request.method(), "GET");
        send.send_response(Response::new(Body::from(stored.to_string().into_bytes())));
    });
    let second = shared_self_signed(client, "leasehold-system", "leasehold-webhook-tls", "leasehold-webhook")
        .await
        .unwrap();
    assert_eq!(
        (second.ca_pem, second.cert_pem, second.key_pem),
        (first.ca_pem, first.cert_pem, first.key_pem)
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
    assert!(Cli::parse_from(["x"]).webhook.injection().unwrap().is_none());
    let err = Cli::parse_from(["x", "--webhook-listen", "0.0.0.0:8443"])
        .webhook
        .injection()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "--sidecar-image (LEASEHOLD_SIDECAR_IMAGE) is required with --webhook-listen"
    );
    let on = Cli::parse_from(["x", "--webhook-listen", "0.0.0.0:8443", "--sidecar-image", "img:1"]);
    assert_eq!(on.webhook.injection().unwrap().unwrap().image, "img:1");
}

#[tokio::test]
async fn the_self_signed_certificate_serves_tls_that_its_ca_verifies() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bundle = CertificateBundle::self_signed("leasehold-webhook", "leasehold-system").unwrap();
    assert!(bundle.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(bundle.server_config().unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(stream).await.unwrap();
        tls.write_all(b"hello").await.unwrap();
        tls.shutdown().await.unwrap();
    });
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    roots
        .add(CertificateDer::from_pem_slice(bundle.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("leasehold-webhook.leasehold-system.svc").unwrap();
    let mut tls = connector
        .connect(name, stream)
        .await
        .expect("the CA verifies the serving certificate");
    let mut greeting = String::new();
    tls.read_to_string(&mut greeting).await.unwrap();
    assert_eq!(greeting, "hello");
}
