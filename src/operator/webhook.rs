//! Sidecar injection: a mutating admission webhook served by the operator.
//!
//! A pod annotated `leasehold.dev/lease: <name>` gets the sidecar container
//! (downward-API identity, resources, a locked-down security context), a
//! shared emptyDir for the token file mounted read-only into the app
//! containers, and the `leasehold.dev/leader` readiness gate when the lease
//! asks for one. Other pods pass unchanged. A pod naming a lease that cannot
//! be found is admitted with a warning (the sidecar waits for the lease), never
//! rejected: leader election must not block scheduling.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::{Json, Router, routing::post};
use json_patch::{AddOperation, Patch, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, PodReadinessGate, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch as KubePatch, PatchParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The annotation that asks for injection.
pub const LEASE_ANNOTATION: &str = "leasehold.dev/lease";
/// The readiness-gate condition type the sidecar sets.
pub const LEADER_CONDITION: &str = "leasehold.dev/leader";
pub const SIDECAR_NAME: &str = "leasehold";
const TOKEN_VOLUME: &str = "leasehold-token";
const TOKEN_DIR: &str = "/var/run/leasehold";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("certificate generation failed")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS setup failed: {0}")]
    Tls(String),
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("webhook listener on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("MutatingWebhookConfiguration {name}: {source}")]
    Configuration { name: String, source: kube::Error },
    #[error("Secret {name}: {source}")]
    Secret { name: String, source: kube::Error },
    #[error("MutatingWebhookConfiguration {0} has no webhooks to give the CA bundle to")]
    NoWebhooks(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The webhook's flags, part of `leasehold operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the sidecar-injection webhook (HTTPS) on this address; off when unset.
    #[arg(long = "webhook-listen", env = "LEASEHOLD_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// Folder holding tls.crt and tls.key issued by cert-manager (which also
    /// fills the caBundle); without it the operator makes a self-signed CA.
    #[arg(long = "webhook-cert-dir", env = "LEASEHOLD_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
    /// The Service in front of the webhook (names in the certificate).
    #[arg(
        long = "webhook-service",
        env = "LEASEHOLD_WEBHOOK_SERVICE",
        default_value = "leasehold-webhook"
    )]
    pub webhook_service: String,
    /// Secret, in the operator's namespace, holding the self-signed certificate.
    #[arg(
        long = "webhook-secret",
        env = "LEASEHOLD_WEBHOOK_SECRET",
        default_value = "leasehold-webhook-tls"
    )]
    pub webhook_secret: String,
    /// MutatingWebhookConfiguration whose caBundle gets the self-signed CA.
    #[arg(
        long = "webhook-configuration",
        env = "LEASEHOLD_WEBHOOK_CONFIGURATION",
        default_value = "leasehold-sidecar-injector"
    )]
    pub webhook_configuration: String,
    /// Image of the injected sidecar (required with --webhook-listen).
    #[arg(long = "sidecar-image", env = "LEASEHOLD_SIDECAR_IMAGE")]
    pub sidecar_image: Option<String>,
    #[arg(
        long = "sidecar-cpu-request",
        env = "LEASEHOLD_SIDECAR_CPU_REQUEST",
        default_value = "10m"
    )]
    pub sidecar_cpu_request: String,
    #[arg(
        long = "sidecar-memory-request",
        env = "LEASEHOLD_SIDECAR_MEMORY_REQUEST",
        default_value = "32Mi"
    )]
    pub sidecar_memory_request: String,
    #[arg(
        long = "sidecar-memory-limit",
        env = "LEASEHOLD_SIDECAR_MEMORY_LIMIT",
        default_value = "64Mi"
    )]
    pub sidecar_memory_limit: String,
}

impl WebhookArgs {
    /// The injected container's settings; checked before anything starts.
    pub fn injection(&self) -> Result<Option<InjectionConfig>> {
        if self.webhook_listen.is_none() {
            return Ok(None);
        }
        let image = self.sidecar_image.clone().ok_or_else(|| {
            Error::Config("--sidecar-image (LEASEHOLD_SIDECAR_IMAGE) is required with --webhook-listen".into())
        })?;
        Ok(Some(InjectionConfig {
            image,
            http_port: 4040,
            metrics_port: 9090,
            cpu_request: self.sidecar_cpu_request.clone(),
            memory_request: self.sidecar_memory_request.clone(),
            memory_limit: self.sidecar_memory_limit.clone(),
        }))
    }
}

/// Prepares the certificate and serves the webhook until `shutdown`.
pub async fn run(
    args: &WebhookArgs,
    injection: InjectionConfig,
    namespace: &str,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<()> {
    let Some(addr) = args.webhook_listen else { return Ok(()) };
    let bundle = match &args.webhook_cert_dir {
        Some(dir) => CertificateBundle::from_dir(dir)?,
        None => {
            let bundle =
                shared_self_signed(client.clone(), namespace, &args.webhook_secret, &args.webhook_service).await?;
            patch_ca_bundle(client.clone(), &args.webhook_configuration, &bundle.ca_pem).await?;
            bundle
        }
    };
    let app = router(Arc::new(KubeLeaseLookup(client)), Arc::new(injection));
    serve(addr, &bundle, app, shutdown).await
}

/// What the injected container looks like; from the operator's flags.
#[derive(Debug, Clone)]
pub struct InjectionConfig {
    pub image: String,
    pub http_port: u16,
    pub metrics_port: u16,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
}

/// What the lease says about injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseInjection {
    pub readiness_gate: bool,
}

/// Looks up the lease a pod names, in the pod's namespace.
pub trait LeaseLookup: Send + Sync + 'static {
    /// `Ok(None)`: no such lease.
    fn lookup(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<LeaseInjection>, String>> + Send;
}

/// Reads `DistributedLease`s from the API server.
#[derive(Clone)]
pub struct KubeLeaseLookup(pub kube::Client);

impl LeaseLookup for KubeLeaseLookup {
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<LeaseInjection>, String> {
        let api: Api<crate::api::DistributedLease> = Api::namespaced(self.0.clone(), namespace);
        let lease = api.get_opt(name).await.map_err(|e| e.to_string())?;
        Ok(lease.map(|l| LeaseInjection {
            readiness_gate: l.spec.publishing.readiness_gate,
        }))
    }
}

/// The JSON patch that injects the sidecar, or `None` when the pod is not
/// annotated or already has the sidecar (webhooks can be called again).
pub fn injection_patch(pod: &Pod, lease: Option<LeaseInjection>, config: &InjectionConfig) -> Option<Patch> {
    let lease_name = pod.metadata.annotations.as_ref()?.get(LEASE_ANNOTATION)?;
    let spec = pod.spec.as_ref()?;
    if spec.containers.iter().any(|c| c.name == SIDECAR_NAME) {
        return None;
    }
    let mut ops = Vec::new();
    // The app containers read the token file from the shared volume.
    let app_mount = VolumeMount {
        name: TOKEN_VOLUME.into(),
        mount_path: TOKEN_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    };
    for (i, container) in spec.containers.iter().enumerate() {
        append(
            &mut ops,
            &format!("/spec/containers/{i}/volumeMounts"),
            container.volume_mounts.is_some(),
            json!(app_mount),
        );
    }
    ops.push(add("/spec/containers/-", json!(sidecar(lease_name, config))));
    let volume = Volume {
        name: TOKEN_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    append(&mut ops, "/spec/volumes", spec.volumes.is_some(), json!(volume));
    let gated = spec
        .readiness_gates
        .iter()
        .flatten()
        .any(|g| g.condition_type == LEADER_CONDITION);
    if lease.is_some_and(|l| l.readiness_gate) && !gated {
        let gate = PodReadinessGate {
            condition_type: LEADER_CONDITION.into(),
        };
        append(
            &mut ops,
            "/spec/readinessGates",
            spec.readiness_gates.is_some(),
            json!(gate),
        );
    }
    Some(Patch(ops))
}

fn add(path: &str, value: serde_json::Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).expect("static JSON pointer"),
        value,
    })
}

/// Adds `item` to the array at `path`, creating the array when absent.
fn append(ops: &mut Vec<PatchOperation>, path: &str, exists: bool, item: serde_json::Value) {
    if exists {
        ops.push(add(&format!("{path}/-"), item));
    } else {
        ops.push(add(path, json!([item])));
    }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sidecar(lease_name: &str, config: &InjectionConfig) -> Container {
    let plain = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let quantities = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(config.image.clone()),
        args: Some(vec!["sidecar".into()]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_UID", "metadata.uid"),
            plain("LEASEHOLD_LEASE", lease_name.to_string()),
            plain("LEASEHOLD_TOKEN_FILE", format!("{TOKEN_DIR}/token.json")),
            plain("LEASEHOLD_HTTP_ADDR", format!("127.0.0.1:{}", config.http_port)),
            plain("LEASEHOLD_METRICS_ADDR", format!("0.0.0.0:{}", config.metrics_port)),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("lh-metrics".into()),
            container_port: config.metrics_port.into(),
            ..Default::default()
        }]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(config.metrics_port.into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", &config.cpu_request), ("memory", &config.memory_request)]),
            limits: quantities(&[("memory", &config.memory_limit)]),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// Answers one admission request. Never denies: on any doubt it admits,
/// with a warning the user sees in `kubectl`.
pub async fn admit<L: LeaseLookup>(
    lookup: &L,
    config: &InjectionConfig,
    request: AdmissionRequest<Pod>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(&request);
    let Some(pod) = request.object.as_ref() else {
        return response;
    };
    let Some(lease_name) = pod.metadata.annotations.as_ref().and_then(|a| a.get(LEASE_ANNOTATION)) else {
        return response;
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    let mut warnings = Vec::new();
    let lease = match lookup.lookup(&namespace, lease_name).await {
        Ok(Some(lease)) => Some(lease),
        Ok(None) => {
            warnings.push(format!(
                "DistributedLease {namespace}/{lease_name} not found: sidecar injected without a readiness gate; it waits for the lease"
            ));
            None
        }
        Err(e) => {
            warnings.push(format!(
                "DistributedLease {namespace}/{lease_name} could not be read ({e}): injected without a readiness gate"
            ));
            None
        }
    };
    let Some(patch) = injection_patch(pod, lease, config) else {
        return response;
    };
    let response = match response.with_patch(patch) {
        Ok(patched) => patched,
        Err(e) => {
            warn!(error = %e, "could not serialize the injection patch; admitting unchanged");
            AdmissionResponse::from(&request)
        }
    };
    info!(namespace, lease = %lease_name, pod = ?pod.metadata.name.as_ref().or(pod.metadata.generate_name.as_ref()), "injected the leasehold sidecar");
    let mut response = response;
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

/// The webhook's HTTP routes (served over TLS by [`serve`]).
pub fn router<L: LeaseLookup>(lookup: Arc<L>, config: Arc<InjectionConfig>) -> Router {
    Router::new().route(
        "/mutate",
        post(move |Json(review): Json<AdmissionReview<Pod>>| {
            let (lookup, config) = (lookup.clone(), config.clone());
            async move {
                let request: Result<AdmissionRequest<Pod>, _> = review.try_into();
                let response = match request {
                    Ok(request) => admit(lookup.as_ref(), &config, request).await,
                    Err(e) => AdmissionResponse::invalid(format!("not an AdmissionReview request: {e}")),
                };
                Json(review_json(response))
            }
        }),
    )
}

/// The review as the API server reads it. kube-core serializes the patch
/// bytes as a JSON array of numbers (kube-rs issue #1781); the admission API
/// documents a base64 string, which is what Go's `[]byte` encoding produces.
fn review_json(response: AdmissionResponse) -> serde_json::Value {
    let mut review = serde_json::to_value(response.into_review()).unwrap_or_default();
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(patch.take()).unwrap_or_default();
        *patch = json!(base64_encode(&bytes));
    }
    review
}

/// A CA and a serving certificate for the webhook Service.
#[derive(Debug, Clone)]
pub struct CertificateBundle {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertificateBundle {
    /// A fresh self-signed CA and a certificate it signs for `service.namespace.svc`.
    pub fn self_signed(service: &str, namespace: &str) -> Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leasehold webhook CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params.self_signed(&ca_key)?;
        let names = vec![
            service.to_string(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(CertificateBundle {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A certificate issued elsewhere (cert-manager), read from a mounted Secret.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read_to_string(&path).map_err(|source| Error::Read {
                path: path.display().to_string(),
                source,
            })
        };
        Ok(CertificateBundle {
            ca_pem: read("ca.crt").unwrap_or_default(),
            cert_pem: read("tls.crt")?,
            key_pem: read("tls.key")?,
        })
    }

    fn from_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| data.get(key).and_then(|b| String::from_utf8(b.0.clone()).ok());
        Some(CertificateBundle {
            ca_pem: text("ca.crt")?,
            cert_pem: text("tls.crt")?,
            key_pem: text("tls.key")?,
        })
    }

    fn server_config(&self) -> Result<rustls::ServerConfig> {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Tls(format!("certificate: {e}")))?;
        let key =
            PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| Error::Tls(format!("key: {e}")))?;
        // Both ring and aws-lc-rs are linked (kube and the Spanner client
        // pick differently), so name the provider rather than rely on a default.
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| Error::Tls(e.to_string()))?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(|e| Error::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The self-signed bundle every operator replica serves: the first replica
/// to start creates it in a Secret, the others read it (a replica that loses
/// the creation race reads the winner's), so all present one CA.
pub async fn shared_self_signed(
    client: kube::Client,
    namespace: &str,
    secret: &str,
    service: &str,
) -> Result<CertificateBundle> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let wrap = |source| Error::Secret {
        name: format!("{namespace}/{secret}"),
        source,
    };
    if let Some(existing) = api.get_opt(secret).await.map_err(wrap)? {
        return CertificateBundle::from_secret(&existing)
            .ok_or_else(|| Error::Tls(format!("Secret {namespace}/{secret} lacks ca.crt, tls.crt or tls.key")));
    }
    let bundle = CertificateBundle::self_signed(service, namespace)?;
    let created: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": secret, "namespace": namespace, "labels": {"app.kubernetes.io/name": "leasehold"}},
        "stringData": {"ca.crt": bundle.ca_pem, "tls.crt": bundle.cert_pem, "tls.key": bundle.key_pem},
    }))
    .expect("a well-formed Secret");
    match api
        .create(
            &PostParams {
                field_manager: Some(crate::operator::reconcile::FIELD_MANAGER.into()),
                ..Default::default()
            },
            &created,
        )
        .await
    {
        Ok(_) => {
            info!(secret = %format!("{namespace}/{secret}"), "created the webhook certificate");
            Ok(bundle)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let winner = api.get(secret).await.map_err(wrap)?;
            CertificateBundle::from_secret(&winner)
                .ok_or_else(|| Error::Tls(format!("Secret {namespace}/{secret} lacks ca.crt, tls.crt or tls.key")))
        }
        Err(e) => Err(wrap(e)),
    }
}

/// Gives every webhook of the configuration our CA bundle: a GET, then a
/// JSON patch whose `test` ops make it fail if the list changed in between.
pub async fn patch_ca_bundle(client: kube::Client, name: &str, ca_pem: &str) -> Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let wrap = |source| Error::Configuration {
        name: name.to_string(),
        source,
    };
    let current = api.get(name).await.map_err(wrap)?;
    let webhooks = current.webhooks.unwrap_or_default();
    if webhooks.is_empty() {
        return Err(Error::NoWebhooks(name.to_string()));
    }
    let bundle = base64_encode(ca_pem.as_bytes());
    let ops: Vec<serde_json::Value> = webhooks
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            [
                json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": w.name}),
                json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}),
            ]
        })
        .collect();
    let patch: Patch = serde_json::from_value(json!(ops)).expect("well-formed JSON patch");
    api.patch(name, &PatchParams::default(), &KubePatch::<DynamicObject>::Json(patch))
        .await
        .map_err(wrap)?;
    info!(
        configuration = name,
        webhooks = webhooks.len(),
        "patched the webhook CA bundle"
    );
    Ok(())
}

fn base64_encode(bytes: &[u8]) -> String {
    use k8s_openapi::ByteString;
    // ByteString serializes as standard base64, the form caBundle takes.
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Serves the webhook over TLS until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    bundle: &CertificateBundle,
    app: Router,
    shutdown: CancellationToken,
) -> Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(bundle.server_config()?));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    info!(%addr, "webhook listening");
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => { warn!(error = %e, "webhook accept failed"); continue }
            },
        };
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        connections.spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(e) => return warn!(%peer, error = %e, "webhook TLS handshake failed"),
            };
            let builder = Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;

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
}
