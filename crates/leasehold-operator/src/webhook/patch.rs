//! The JSON patch that injects the sidecar: pure, callable without a server
//! (the webhook and `leasehold inject` both use it).

use std::collections::BTreeMap;

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, jsonptr::PointerBuf};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath,
    ObjectFieldSelector, Pod, PodReadinessGate, PodSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use leasehold_kubernetes::api::{DistributedLease, LeaseStoreSpec, SecretKeyRef};

use leasehold_kubernetes::api::contract::{
    APP_CONTAINER_ANNOTATION, BIN_DIR, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT, ENV_APP_CONTAINER, ENV_CLUSTER_NAME,
    ENV_HTTP_ADDR, ENV_LEASE, ENV_METRICS_ADDR, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID, ENV_STORE_URL_FILE,
    ENV_TOKEN_FILE, GATE_PROBE_FAILURE_THRESHOLD, GATE_PROBE_PATH, GATE_PROBE_PERIOD_SECONDS,
    GATE_PROBE_TIMEOUT_SECONDS, INSTALL_SELF_COMMAND, INSTALLER_NAME, LEADER_CONDITION, LEASE_ANNOTATION,
    METRICS_PORT_ANNOTATION, METRICS_PORT_NAME, RUN_ANNOTATION, RUNNER_PATH, SIDECAR_CONTAINER, SIDECAR_ENV_ANNOTATION,
    SIDECAR_MODE_ANNOTATION, SIDECAR_USER, injected_container,
};

/// kubectl's choice of a pod's main container, honoured as the default app container.
const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
const TOKEN_VOLUME: &str = "leasehold-token";
const TOKEN_DIR: &str = "/var/run/leasehold";
const BIN_VOLUME: &str = "leasehold-bin";
/// The lease's store-URL Secret key, mounted into the container that
/// campaigns (the sidecar, or the wrapped container) and nowhere else.
const STORE_URL_VOLUME: &str = "leasehold-store-url";
const STORE_URL_DIR: &str = "/var/run/leasehold-store";
const STORE_URL_ITEM: &str = "url";

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
    /// A regular container, for clusters without native sidecars (older
    /// than 1.29, or 1.29–1.32 with the SidecarContainers feature gate
    /// off): it starts and stops together with the app, so the drain window
    /// must cover the app's exit.
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
    /// Extra environment for every injected sidecar.
    pub env: Vec<ExtraEnv>,
    /// The cluster's name ([`ENV_CLUSTER_NAME`]), the first part of every
    /// injected sidecar's holder identity; already checked by
    /// [`parse_cluster_name`](leasehold_core::lease::parse_cluster_name).
    pub cluster: Option<String>,
}

/// The variables the injection sets itself, which extra environment may not
/// replace.
const INJECTED_ENV: [&str; 10] = [
    ENV_CLUSTER_NAME,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_LEASE,
    ENV_APP_CONTAINER,
    ENV_TOKEN_FILE,
    ENV_HTTP_ADDR,
    ENV_METRICS_ADDR,
    ENV_STORE_URL_FILE,
];

/// One `NAME=VALUE` of extra sidecar environment: what a development
/// cluster's Spanner emulator (`SPANNER_EMULATOR_HOST`), a proxy or a
/// credentials path needs, or a sidecar flag's variable (`LEASEHOLD_DRAIN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraEnv {
    pub name: String,
    pub value: String,
}

impl std::str::FromStr for ExtraEnv {
    type Err = String;

    fn from_str(text: &str) -> Result<ExtraEnv, String> {
        let (name, value) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))?;
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "{name:?} is not a variable name (letters, digits and _, not first a digit)"
            ));
        }
        if INJECTED_ENV.contains(&name) {
            return Err(format!("{name} is set by the injection itself"));
        }
        Ok(ExtraEnv {
            name: name.into(),
            value: value.into(),
        })
    }
}

/// The annotation's lines, each `NAME=VALUE` (blank lines skipped).
fn annotation_env(text: &str) -> Result<Vec<ExtraEnv>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::parse)
        .collect()
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
    /// Extra environment for every injected sidecar, NAME=VALUE; repeat the
    /// flag, or one per line in the variable. A pod's
    /// leasehold.dev/sidecar-env annotation adds to it and wins.
    #[arg(long = "sidecar-env", env = "LEASEHOLD_SIDECAR_ENV", value_delimiter = '\n')]
    pub sidecar_env: Vec<ExtraEnv>,
}

impl SidecarArgs {
    /// The settings, with `image` standing in when `--sidecar-image` is unset.
    pub fn injection(&self, image: String, cluster: Option<String>) -> InjectionConfig {
        InjectionConfig {
            image: self.sidecar_image.clone().unwrap_or(image),
            mode: self.sidecar_mode,
            http_port: DEFAULT_HTTP_PORT,
            metrics_port: self.sidecar_metrics_port,
            cpu_request: self.sidecar_cpu_request.clone(),
            memory_request: self.sidecar_memory_request.clone(),
            memory_limit: self.sidecar_memory_limit.clone(),
            env: self.sidecar_env.clone(),
            cluster,
        }
    }
}

/// What the lease says about injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInjection {
    pub readiness_gate: bool,
    /// PostgreSQL and Redis: the Secret key holding the store URL.
    pub url_secret: Option<SecretKeyRef>,
}

impl LeaseInjection {
    /// What a lease asks of the pods that name it: its readiness gate, and
    /// the URL Secret of its store (when it has read as one).
    pub fn new(readiness_gate: bool, store: Option<&LeaseStoreSpec>) -> LeaseInjection {
        let url_secret = store.and_then(|store| {
            (store.postgres.as_ref().map(|p| &p.url_secret_ref))
                .or(store.redis.as_ref().map(|r| &r.url_secret_ref))
                .cloned()
        });
        LeaseInjection {
            readiness_gate,
            url_secret,
        }
    }

    pub(crate) fn of(lease: &DistributedLease) -> LeaseInjection {
        LeaseInjection::new(lease.spec.publishing.readiness_gate, Some(&lease.spec.store))
    }
}

/// Why a pod was not injected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotInjected {
    #[error("no {LEASE_ANNOTATION} annotation")]
    NotAnnotated,
    #[error("it already has a container named {0}")]
    AlreadyInjected(&'static str),
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
    /// With `leasehold.dev/run`: the index of the container to wrap.
    run: Option<usize>,
    app_container: &'a str,
    metrics_port: u16,
    mode: SidecarMode,
    /// From [`SIDECAR_ENV_ANNOTATION`].
    env: Vec<ExtraEnv>,
}

fn choices<'a>(pod: &'a Pod, spec: &'a PodSpec, config: &InjectionConfig) -> Result<PodChoices<'a>, NotInjected> {
    let annotations = pod.metadata.annotations.as_ref().ok_or(NotInjected::NotAnnotated)?;
    let lease = annotations.get(LEASE_ANNOTATION).ok_or(NotInjected::NotAnnotated)?;
    let bad = |annotation, problem: String| NotInjected::BadAnnotation { annotation, problem };
    let run = annotations
        .get(RUN_ANNOTATION)
        .map(|name| runnable(spec, name))
        .transpose()?;
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
    // container declares would make the sidecar fail to bind. The runner
    // serves metrics only (no HTTP API).
    let sidecar_ports = if run.is_some() {
        &[metrics_port][..]
    } else {
        &[metrics_port, config.http_port][..]
    };
    for container in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        for port in container.ports.iter().flatten() {
            if sidecar_ports.contains(&(port.container_port as u16)) {
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
    let env = annotations
        .get(SIDECAR_ENV_ANNOTATION)
        .map(|text| annotation_env(text).map_err(|problem| bad(SIDECAR_ENV_ANNOTATION, problem)))
        .transpose()?
        .unwrap_or_default();
    Ok(PodChoices {
        lease,
        run,
        app_container,
        metrics_port,
        mode,
        env,
    })
}

pub(super) fn has_annotation(pod: &Pod, key: &str) -> bool {
    pod.metadata.annotations.iter().flatten().any(|(k, _)| k == key)
}

/// The container `leasehold.dev/run` names, if it can be wrapped.
fn runnable(spec: &PodSpec, name: &str) -> Result<usize, NotInjected> {
    let bad = |problem| NotInjected::BadAnnotation {
        annotation: RUN_ANNOTATION,
        problem,
    };
    let (index, container) = spec
        .containers
        .iter()
        .enumerate()
        .find(|(_, c)| c.name == name)
        .ok_or_else(|| bad(format!("the pod has no container {name:?}")))?;
    // Without `command` the kubelet runs the image's ENTRYPOINT, which the
    // webhook cannot see (core/v1 Container.command: "The container image's
    // ENTRYPOINT is used if this is not provided"); wrapping a guess would
    // run something else.
    if container.command.as_ref().is_none_or(Vec::is_empty) {
        return Err(bad(format!(
            "container {name:?} has no command, so its image's ENTRYPOINT would be run, which the webhook \
             cannot see: set command: (and args:) on the container to what it should run"
        )));
    }
    if container.env.iter().flatten().any(|e| e.name == ENV_METRICS_ADDR) {
        return Err(bad(format!(
            "container {name:?} sets {ENV_METRICS_ADDR} itself, which leasehold run reads: remove it (the \
             metrics port is {METRICS_PORT_ANNOTATION}'s)"
        )));
    }
    for wanted in runner_env() {
        if let Some(own) = container.env.iter().flatten().find(|e| e.name == wanted.name)
            && *own != wanted
        {
            return Err(bad(format!(
                "container {name:?} sets {} itself, which leasehold run reads: remove it",
                wanted.name
            )));
        }
    }
    Ok(index)
}

/// The JSON patch that injects the sidecar into `pod` (or, with
/// `leasehold.dev/run`, wraps the named container's command with `leasehold
/// run`), or why not (webhooks can be called again, so an injected pod is
/// left alone).
pub fn injection_patch(
    pod: &Pod,
    lease: Option<LeaseInjection>,
    config: &InjectionConfig,
) -> Result<Patch, NotInjected> {
    let spec = pod.spec.as_ref().ok_or(NotInjected::NoSpec)?;
    if !has_annotation(pod, LEASE_ANNOTATION) {
        return Err(NotInjected::NotAnnotated);
    }
    // Before the pod's choices: an injected pod's own sidecar holds the
    // metrics port, and a wrapped container has a command it did not ask for.
    if let Some(injected) = injected_container(spec) {
        return Err(NotInjected::AlreadyInjected(injected));
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
    let url_secret = lease.as_ref().and_then(|l| l.url_secret.as_ref());
    for (i, container) in spec.containers.iter().enumerate() {
        let path = format!("/spec/containers/{i}");
        if choices.run == Some(i) {
            wrap(&mut ops, &path, container, &choices, url_secret.is_some(), config);
        } else {
            append(
                &mut ops,
                &format!("{path}/volumeMounts"),
                container.volume_mounts.is_some(),
                json!(app_mount),
            );
        }
    }
    let already_gated = spec
        .readiness_gates
        .iter()
        .flatten()
        .any(|g| g.condition_type == LEADER_CONDITION);
    let gate = lease.as_ref().is_some_and(|l| l.readiness_gate) && !already_gated;
    let mut volumes = vec![json!(empty_dir(TOKEN_VOLUME))];
    volumes.extend(url_secret.map(|secret| json!(store_url_volume(secret))));
    if choices.run.is_some() {
        // The runner campaigns and publishes itself: no sidecar.
        append(
            &mut ops,
            "/spec/initContainers",
            spec.init_containers.is_some(),
            json!(installer(config)),
        );
        volumes.push(json!(empty_dir(BIN_VOLUME)));
    } else {
        let sidecar = sidecar(&choices, config, url_secret.is_some(), already_gated || gate);
        match choices.mode {
            SidecarMode::Native => append(
                &mut ops,
                "/spec/initContainers",
                spec.init_containers.is_some(),
                json!(sidecar),
            ),
            SidecarMode::Container => ops.push(add("/spec/containers/-", json!(sidecar))),
        }
    }
    append_all(&mut ops, "/spec/volumes", spec.volumes.is_some(), volumes);
    if gate {
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

/// Makes the container at `path` run its command under `leasehold run`, with
/// the binary from the installer's volume and the environment the runner reads.
fn wrap(
    ops: &mut Vec<PatchOperation>,
    path: &str,
    container: &Container,
    choices: &PodChoices<'_>,
    store_url: bool,
    config: &InjectionConfig,
) {
    let lease = choices.lease;
    let original = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten());
    let command: Vec<&str> = [RUNNER_PATH, "run", "--lease", lease, "--"]
        .into_iter()
        .chain(original.map(String::as_str))
        .collect();
    // "add" on an existing member replaces it (RFC 6902, section 4.1).
    ops.push(add(&format!("{path}/command"), json!(command)));
    if container.args.is_some() {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::parse(format!("{path}/args")).expect("static JSON pointer"),
        }));
    }
    // `runnable` refused a pod whose own value differs; an equal one stays.
    let env = runner_env()
        .into_iter()
        .chain([metrics_env(choices.metrics_port)])
        .chain(store_url.then(store_url_env))
        .chain(cluster_env(config))
        .filter(|wanted| !container.env.iter().flatten().any(|own| own.name == wanted.name))
        .map(|e| json!(e))
        .collect();
    append_all(ops, &format!("{path}/env"), container.env.is_some(), env);
    // The runner's metrics, on the port the chart's PodMonitor scrapes.
    append(
        ops,
        &format!("{path}/ports"),
        container.ports.is_some(),
        json!(metrics_port(choices.metrics_port)),
    );
    let mut mounts = vec![
        // Read-write: the runner writes the token file before each start.
        json!(VolumeMount {
            name: TOKEN_VOLUME.into(),
            mount_path: TOKEN_DIR.into(),
            ..Default::default()
        }),
        json!(VolumeMount {
            name: BIN_VOLUME.into(),
            mount_path: BIN_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }),
    ];
    mounts.extend(store_url.then(|| json!(store_url_mount())));
    append_all(
        ops,
        &format!("{path}/volumeMounts"),
        container.volume_mounts.is_some(),
        mounts,
    );
}

fn add(path: &str, value: serde_json::Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).expect("static JSON pointer"),
        value,
    })
}

/// Adds `item` to the array at `path`, creating the array when absent.
fn append(ops: &mut Vec<PatchOperation>, path: &str, exists: bool, item: serde_json::Value) {
    append_all(ops, path, exists, vec![item]);
}

/// Adds `items` to the array at `path`, creating the array when absent.
fn append_all(ops: &mut Vec<PatchOperation>, path: &str, exists: bool, items: Vec<serde_json::Value>) {
    if exists {
        ops.extend(items.into_iter().map(|item| add(&format!("{path}/-"), item)));
    } else if !items.is_empty() {
        ops.push(add(path, json!(items)));
    }
}

/// The lease's URL Secret key as the file `STORE_URL_DIR/url`. The default
/// mode (0644) lets the image's non-root user read it; only the campaigning
/// container mounts it.
fn store_url_volume(secret: &SecretKeyRef) -> Volume {
    Volume {
        name: STORE_URL_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.name.clone()),
            items: Some(vec![KeyToPath {
                key: secret.key.clone(),
                path: STORE_URL_ITEM.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn store_url_mount() -> VolumeMount {
    VolumeMount {
        name: STORE_URL_VOLUME.into(),
        mount_path: STORE_URL_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

fn store_url_env() -> EnvVar {
    plain_env(ENV_STORE_URL_FILE, format!("{STORE_URL_DIR}/{STORE_URL_ITEM}"))
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
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

fn plain_env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    }
}

/// The pod's identity (downward API) and the token file: what both the
/// sidecar and a wrapped `leasehold run` read.
fn runner_env() -> [EnvVar; 4] {
    [
        field_env(ENV_POD_NAME, "metadata.name"),
        field_env(ENV_POD_NAMESPACE, "metadata.namespace"),
        field_env(ENV_POD_UID, "metadata.uid"),
        plain_env(ENV_TOKEN_FILE, format!("{TOKEN_DIR}/token.json")),
    ]
}

/// Where the sidecar or the wrapped runner serves its metrics: on every
/// address, so Prometheus can scrape it.
fn metrics_env(port: u16) -> EnvVar {
    plain_env(ENV_METRICS_ADDR, format!("0.0.0.0:{port}"))
}

/// The metrics port, by the name the chart's PodMonitor scrapes.
fn metrics_port(port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(METRICS_PORT_NAME.into()),
        container_port: port.into(),
        ..Default::default()
    }
}

/// The cluster's name for the sidecar or the wrapped runner, when the
/// operator (or `inject`) has one.
fn cluster_env(config: &InjectionConfig) -> Option<EnvVar> {
    config
        .cluster
        .as_ref()
        .map(|name| plain_env(ENV_CLUSTER_NAME, name.clone()))
}

fn resources(config: &InjectionConfig) -> ResourceRequirements {
    let quantities = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    ResourceRequirements {
        requests: quantities(&[("cpu", &config.cpu_request), ("memory", &config.memory_request)]),
        limits: quantities(&[("memory", &config.memory_limit)]),
        ..Default::default()
    }
}

/// Every container of the leasehold image: its numeric non-root user, nothing more.
fn locked_down() -> SecurityContext {
    SecurityContext {
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
    }
}

/// Copies the binary into the volume the wrapped container runs it from;
/// the image is distroless (no shell, no `cp`), so the binary copies itself.
fn installer(config: &InjectionConfig) -> Container {
    Container {
        name: INSTALLER_NAME.into(),
        image: Some(config.image.clone()),
        args: Some(vec![INSTALL_SELF_COMMAND.into(), BIN_DIR.into()]),
        resources: Some(resources(config)),
        security_context: Some(locked_down()),
        volume_mounts: Some(vec![VolumeMount {
            name: BIN_VOLUME.into(),
            mount_path: BIN_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The sidecar container; on a readiness-gated pod with the probe that
/// makes the kubelet turn the pod unready once the claim lapses or the
/// sidecar stops answering ([`GATE_PROBE_PATH`]).
fn sidecar(choices: &PodChoices<'_>, config: &InjectionConfig, store_url: bool, gated: bool) -> Container {
    let [pod_name, pod_namespace, pod_uid, token_file] = runner_env();
    let mut env = vec![
        pod_name,
        pod_namespace,
        pod_uid,
        plain_env(ENV_LEASE, choices.lease.to_string()),
        plain_env(ENV_APP_CONTAINER, choices.app_container.to_string()),
        token_file,
        plain_env(ENV_HTTP_ADDR, format!("127.0.0.1:{}", config.http_port)),
        metrics_env(choices.metrics_port),
    ];
    env.extend(store_url.then(store_url_env));
    env.extend(cluster_env(config));
    // The operator's extra environment, then the pod's, which wins by name.
    for extra in config.env.iter().chain(&choices.env) {
        env.retain(|e| e.name != extra.name);
        env.push(plain_env(&extra.name, extra.value.clone()));
    }
    let mut mounts = vec![VolumeMount {
        name: TOKEN_VOLUME.into(),
        mount_path: TOKEN_DIR.into(),
        ..Default::default()
    }];
    mounts.extend(store_url.then(store_url_mount));
    Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(config.image.clone()),
        args: Some(vec!["sidecar".into()]),
        restart_policy: (choices.mode == SidecarMode::Native).then(|| "Always".into()),
        env: Some(env),
        ports: Some(vec![metrics_port(choices.metrics_port)]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(choices.metrics_port.into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            ..Default::default()
        }),
        readiness_probe: gated.then(|| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(GATE_PROBE_PATH.into()),
                port: IntOrString::Int(choices.metrics_port.into()),
                ..Default::default()
            }),
            period_seconds: Some(GATE_PROBE_PERIOD_SECONDS),
            timeout_seconds: Some(GATE_PROBE_TIMEOUT_SECONDS),
            failure_threshold: Some(GATE_PROBE_FAILURE_THRESHOLD),
            success_threshold: Some(1),
            ..Default::default()
        }),
        resources: Some(resources(config)),
        security_context: Some(locked_down()),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}
