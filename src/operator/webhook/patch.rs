//! The JSON patch that injects the sidecar: pure, callable without a server.

use std::collections::BTreeMap;

use json_patch::{AddOperation, Patch, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, PodReadinessGate, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

/// The annotation that asks for injection.
pub const LEASE_ANNOTATION: &str = "leasehold.dev/lease";
/// The readiness-gate condition type the sidecar sets.
pub const LEADER_CONDITION: &str = "leasehold.dev/leader";
pub const SIDECAR_NAME: &str = "leasehold";
const TOKEN_VOLUME: &str = "leasehold-token";
const TOKEN_DIR: &str = "/var/run/leasehold";

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
