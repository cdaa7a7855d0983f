//! The JSON patch that injects the sidecar: pure, callable without a server
//! (the webhook and `leasehold inject` both use it).

use std::collections::BTreeMap;

use json_patch::{AddOperation, Patch, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, PodReadinessGate, PodSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use crate::sidecar::interface::{
    DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT, ENV_APP_CONTAINER, ENV_HTTP_ADDR, ENV_LEASE, ENV_METRICS_ADDR,
    ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID, ENV_TOKEN_FILE,
};

/// The annotation that asks for injection and names the DistributedLease.
pub const LEASE_ANNOTATION: &str = "leasehold.dev/lease";
/// Chooses the container whose readiness leadership follows (default: the
/// `kubectl.kubernetes.io/default-container`, else the first container).
pub const APP_CONTAINER_ANNOTATION: &str = "leasehold.dev/app-container";
/// The sidecar's metrics port for this pod.
pub const METRICS_PORT_ANNOTATION: &str = "leasehold.dev/metrics-port";
/// `native` (an init container with `restartPolicy: Always`) or `container`.
pub const SIDECAR_MODE_ANNOTATION: &str = "leasehold.dev/sidecar-mode";
/// The label that opts a namespace or a pod into the webhook (`enabled`), or a
/// pod out of its namespace's opt-in (`disabled`); read by the API server
/// through the webhook's selectors, see the chart's webhook.yaml.
pub const INJECT_LABEL: &str = "leasehold.dev/inject";
/// kubectl's choice of a pod's main container, honoured as the default app container.
const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// The readiness-gate condition type the sidecar sets.
pub const LEADER_CONDITION: &str = "leasehold.dev/leader";
pub const SIDECAR_NAME: &str = "leasehold";
/// The image's numeric user and group (Dockerfile `USER 65532:65532`): the
/// kubelet can check `runAsNonRoot` only against a numeric user.
pub const SIDECAR_USER: i64 = 65532;
/// The image `leasehold inject` uses unless told otherwise.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/leasehold/leasehold:", env!("CARGO_PKG_VERSION"));
const TOKEN_VOLUME: &str = "leasehold-token";
const TOKEN_DIR: &str = "/var/run/leasehold";

/// How the sidecar joins the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SidecarMode {
    /// An init container with `restartPolicy: Always` (Kubernetes ≥ 1.29): the
    /// kubelet starts it before the app containers and, on termination, stops
    /// it only once every regular container has exited ("Once all regular
    /// containers have completed, all init containers with restartPolicy
    /// Always will be shut down", core/v1 Container.restartPolicy;
    /// https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/),
    /// so the lease is released only after the app has exited.
    Native,
    /// A regular container, for clusters older than 1.29: it starts and stops
    /// together with the app, so the drain window must cover the app's exit.
    Container,
}

/// What the injected container looks like; from the operator's or `inject`'s flags.
#[derive(Debug, Clone)]
pub struct InjectionConfig {
    pub image: String,
    pub mode: SidecarMode,
    pub http_port: u16,
    pub metrics_port: u16,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
}

/// The sidecar's flags shared by `leasehold operator` (webhook) and `leasehold inject`.
#[derive(Debug, Clone, clap::Args)]
pub struct SidecarArgs {
    /// Image of the injected sidecar; required by the webhook, default for
    /// `leasehold inject`: ghcr.io/leasehold/leasehold:<this version>.
    #[arg(long = "sidecar-image", env = "LEASEHOLD_SIDECAR_IMAGE")]
    pub sidecar_image: Option<String>,
    /// How the sidecar is injected unless a pod's leasehold.dev/sidecar-mode says otherwise.
    #[arg(long = "sidecar-mode", env = "LEASEHOLD_SIDECAR_MODE", value_enum, default_value_t = SidecarMode::Native)]
    pub sidecar_mode: SidecarMode,
    /// The sidecar's metrics port unless a pod's leasehold.dev/metrics-port says otherwise.
    #[arg(long = "sidecar-metrics-port", env = "LEASEHOLD_SIDECAR_METRICS_PORT", default_value_t = DEFAULT_METRICS_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub sidecar_metrics_port: u16,
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

impl SidecarArgs {
    /// The settings, with `image` standing in when `--sidecar-image` is unset.
    pub fn injection(&self, image: String) -> InjectionConfig {
        InjectionConfig {
            image: self.sidecar_image.clone().unwrap_or(image),
            mode: self.sidecar_mode,
            http_port: DEFAULT_HTTP_PORT,
            metrics_port: self.sidecar_metrics_port,
            cpu_request: self.sidecar_cpu_request.clone(),
            memory_request: self.sidecar_memory_request.clone(),
            memory_limit: self.sidecar_memory_limit.clone(),
        }
    }
}

/// What the lease says about injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseInjection {
    pub readiness_gate: bool,
}

/// Why a pod was not injected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotInjected {
    #[error("no {LEASE_ANNOTATION} annotation")]
    NotAnnotated,
    #[error("it already has a container named {SIDECAR_NAME}")]
    AlreadyInjected,
    #[error("it has no pod spec")]
    NoSpec,
    #[error("annotation {annotation}: {problem}")]
    BadAnnotation { annotation: &'static str, problem: String },
}

impl NotInjected {
    /// Whether the user asked for injection and did not get it (worth a warning).
    pub fn is_user_error(&self) -> bool {
        matches!(self, NotInjected::BadAnnotation { .. })
    }
}

/// The pod's own choices, read from its annotations and checked against its spec.
struct PodChoices<'a> {
    lease: &'a str,
    app_container: &'a str,
    metrics_port: u16,
    mode: SidecarMode,
}

fn choices<'a>(pod: &'a Pod, spec: &'a PodSpec, config: &InjectionConfig) -> Result<PodChoices<'a>, NotInjected> {
    let annotations = pod.metadata.annotations.as_ref().ok_or(NotInjected::NotAnnotated)?;
    let lease = annotations.get(LEASE_ANNOTATION).ok_or(NotInjected::NotAnnotated)?;
    let bad = |annotation, problem: String| NotInjected::BadAnnotation { annotation, problem };
    let metrics_port = match annotations.get(METRICS_PORT_ANNOTATION) {
        None => config.metrics_port,
        Some(value) => value
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad(METRICS_PORT_ANNOTATION, format!("{value:?} is not a port (1-65535)")))?,
    };
    if metrics_port == config.http_port {
        return Err(bad(
            METRICS_PORT_ANNOTATION,
            format!("{metrics_port} is the sidecar's HTTP API port"),
        ));
    }
    // All containers share the pod's network namespace: a port another
    // container declares would make the sidecar fail to bind.
    for container in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        for port in container.ports.iter().flatten() {
            if [metrics_port, config.http_port].contains(&(port.container_port as u16)) {
                return Err(bad(
                    METRICS_PORT_ANNOTATION,
                    format!(
                        "port {} is declared by container {}; choose another metrics port",
                        port.container_port, container.name
                    ),
                ));
            }
        }
    }
    let mode = match annotations.get(SIDECAR_MODE_ANNOTATION).map(String::as_str) {
        None => config.mode,
        Some("native") => SidecarMode::Native,
        Some("container") => SidecarMode::Container,
        Some(other) => {
            return Err(bad(
                SIDECAR_MODE_ANNOTATION,
                format!("{other:?} is neither \"native\" nor \"container\""),
            ));
        }
    };
    let app_container = match annotations.get(APP_CONTAINER_ANNOTATION) {
        Some(name) => {
            if !spec.containers.iter().any(|c| &c.name == name) {
                return Err(bad(
                    APP_CONTAINER_ANNOTATION,
                    format!("the pod has no container {name:?}"),
                ));
            }
            name.as_str()
        }
        None => annotations
            .get(DEFAULT_CONTAINER_ANNOTATION)
            .filter(|name| spec.containers.iter().any(|c| &c.name == *name))
            .map(String::as_str)
            .or_else(|| spec.containers.first().map(|c| c.name.as_str()))
            .ok_or(NotInjected::NoSpec)?,
    };
    Ok(PodChoices {
        lease,
        app_container,
        metrics_port,
        mode,
    })
}

/// The JSON patch that injects the sidecar into `pod`, or why not (webhooks
/// can be called again, so an injected pod is left alone).
pub fn injection_patch(
    pod: &Pod,
    lease: Option<LeaseInjection>,
    config: &InjectionConfig,
) -> Result<Patch, NotInjected> {
    let spec = pod.spec.as_ref().ok_or(NotInjected::NoSpec)?;
    let annotated = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, _)| k == LEASE_ANNOTATION);
    if !annotated {
        return Err(NotInjected::NotAnnotated);
    }
    // Before the pod's choices: an injected pod's own sidecar holds the metrics port.
    let has_sidecar = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.name == SIDECAR_NAME);
    if has_sidecar {
        return Err(NotInjected::AlreadyInjected);
    }
    let choices = choices(pod, spec, config)?;
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
    let sidecar = sidecar(&choices, config);
    match choices.mode {
        SidecarMode::Native => append(
            &mut ops,
            "/spec/initContainers",
            spec.init_containers.is_some(),
            json!(sidecar),
        ),
        SidecarMode::Container => ops.push(add("/spec/containers/-", json!(sidecar))),
    }
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
    Ok(Patch(ops))
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

fn sidecar(choices: &PodChoices, config: &InjectionConfig) -> Container {
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
        restart_policy: (choices.mode == SidecarMode::Native).then(|| "Always".into()),
        env: Some(vec![
            field_env(ENV_POD_NAME, "metadata.name"),
            field_env(ENV_POD_NAMESPACE, "metadata.namespace"),
            field_env(ENV_POD_UID, "metadata.uid"),
            plain(ENV_LEASE, choices.lease.to_string()),
            plain(ENV_APP_CONTAINER, choices.app_container.to_string()),
            plain(ENV_TOKEN_FILE, format!("{TOKEN_DIR}/token.json")),
            plain(ENV_HTTP_ADDR, format!("127.0.0.1:{}", config.http_port)),
            plain(ENV_METRICS_ADDR, format!("0.0.0.0:{}", choices.metrics_port)),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("lh-metrics".into()),
            container_port: choices.metrics_port.into(),
            ..Default::default()
        }]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(choices.metrics_port.into()),
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
            run_as_user: Some(SIDECAR_USER),
            run_as_group: Some(SIDECAR_USER),
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
