//! The contract both roles follow, below both: the environment the
//! sidecar reads, its ports and container name, the annotations, labels and
//! conditions on candidate pods, and what the injection adds to a pod. The
//! sidecar's flags, the operator, its webhook and `leasehold inject` all
//! read these, so they cannot drift.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;

/// The label the chart puts on everything it installs (its
/// `leasehold.selectorLabels`, charts/leasehold/templates/_helpers.tpl) and
/// the operator on what it creates (the webhook's certificate Secret):
/// `check` and `version` find an install by it.
pub const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "leasehold");

/// The injected sidecar container's name. The sidecar finds itself by it
/// in its pod's spec: as a native sidecar (an init container with
/// `restartPolicy: Always`) it gets SIGTERM only once every app container
/// has exited.
pub const SIDECAR_CONTAINER: &str = "leasehold";

/// The DistributedLease to follow (`--lease`).
pub const ENV_LEASE: &str = "LEASEHOLD_LEASE";
/// The pod's name, namespace and UID, from the downward API.
pub const ENV_POD_NAME: &str = "POD_NAME";
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
pub const ENV_POD_UID: &str = "POD_UID";
/// `--cluster-name`: this cluster's name, the first part of every holder
/// identity. The operator, every sidecar it injects and `leasehold inject`
/// read it; the chart sets it from its `clusterName` value.
pub const ENV_CLUSTER_NAME: &str = "LEASEHOLD_CLUSTER_NAME";
/// `--http-addr`: the local HTTP API.
pub const ENV_HTTP_ADDR: &str = "LEASEHOLD_HTTP_ADDR";
/// `--metrics-addr`: the Prometheus listener.
pub const ENV_METRICS_ADDR: &str = "LEASEHOLD_METRICS_ADDR";
/// `--token-file`.
pub const ENV_TOKEN_FILE: &str = "LEASEHOLD_TOKEN_FILE";
/// `--store-url-file`: the file holding the PostgreSQL or Redis URL (the
/// lease's Secret, mounted by the injection).
pub const ENV_STORE_URL_FILE: &str = "LEASEHOLD_STORE_URL_FILE";
/// `--app-container`: the container whose readiness leadership follows.
pub const ENV_APP_CONTAINER: &str = "LEASEHOLD_APP_CONTAINER";

/// The pod condition the sidecar sets on its own pod while its renewals use
/// more than [`AT_RISK_SHARE`](leasehold_core::lease::budget::AT_RISK_SHARE) of
/// R − P; the operator gathers it into the lease's `TimingAtRisk`.
pub const TIMING_CONDITION: &str = "leasehold.dev/timing-at-risk";

/// The pod condition the sidecar sets on its own pod: True while its last
/// store call answered, False while its store cannot be reached (or before
/// it first was). Only a candidate that shows it True is offered
/// leadership by a transfer or a preference (issue 54): readiness says the
/// app is up, not that the sidecar could acquire.
pub const STORE_CONDITION: &str = "leasehold.dev/store-reachable";

/// Whether the pod's sidecar reports reaching its store ([`STORE_CONDITION`] True).
pub fn store_reachable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == STORE_CONDITION && c.status == "True")
        })
}

/// The annotation a sidecar writes on its own pod once it has retired from
/// a `DistributedLease` (deleted, recreated, or changed in what it campaigns
/// on): its value is the `metadata.uid` of the lease it retired from. It has
/// stopped claiming and released before writing it; the operator keeps the
/// lease's finalizer until every running candidate carries it
/// (`operator::reconcile::delete`), and the sidecar's admission policy lets
/// it set this annotation on its own pod only.
pub const RETIRED_FROM_ANNOTATION: &str = "leasehold.dev/retired-from";

/// The annotation a sidecar started with `--lease` writes on its own pod
/// before it reads the lease: the name of the `DistributedLease` it is
/// about to campaign for. A deleted lease's finalizer waits for every
/// candidate carrying it (or whose sidecar the kubelet reports running)
/// to retire: a sidecar that read the lease before the delete wrote it
/// before that read, so the operator's list after the delete sees it, even
/// before the kubelet reports the container running (issue 54). One that
/// writes it after that list reads the lease after the delete, and never
/// campaigns.
pub const CAMPAIGNS_FOR_ANNOTATION: &str = "leasehold.dev/campaigns-for";

/// `--version`: this candidate's version, for people.
pub const ENV_VERSION: &str = "LEASEHOLD_VERSION";
/// `--revision`: the number versions are ordered by.
pub const ENV_REVISION: &str = "LEASEHOLD_REVISION";

/// A literal env value any container of the pod sets (`ENV_REVISION` and
/// `ENV_VERSION` are read so, for the pod itself and by its peers; a value
/// from a reference is not known outside the container).
pub fn literal_env<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.containers.iter().chain(spec.init_containers.iter().flatten()))
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == key)
        .and_then(|e| e.value.as_deref())
}

/// The local HTTP API's port (on 127.0.0.1).
pub const DEFAULT_HTTP_PORT: u16 = 4040;
/// The metrics port (on 0.0.0.0, so Prometheus can scrape it). Every
/// container of a pod shares one network namespace, so this port must not be
/// one the app is likely to use: 9090 is Prometheus' own, 9091-9999 are the
/// exporters' registered range and 9464 is the OpenTelemetry Prometheus
/// exporter's default. leasehold keeps its pair together: 4040 API, 4041 metrics.
pub const DEFAULT_METRICS_PORT: u16 = 4041;

pub fn default_http_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT))
}

pub fn default_metrics_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([0, 0, 0, 0], DEFAULT_METRICS_PORT))
}

/// The readiness probe of gated pods' sidecars; the resource's validation
/// reads it too, so it lives with the resource.
pub use crate::api::gate::{
    GATE_PROBE_FAILURE_THRESHOLD, GATE_PROBE_HOLD, GATE_PROBE_PATH, GATE_PROBE_PERIOD_SECONDS,
    GATE_PROBE_TIMEOUT_SECONDS,
};

/// The annotation that asks for injection and names the DistributedLease.
pub const LEASE_ANNOTATION: &str = "leasehold.dev/lease";
/// Chooses the container whose readiness leadership follows (default: the
/// `kubectl.kubernetes.io/default-container`, else the first container).
pub const APP_CONTAINER_ANNOTATION: &str = "leasehold.dev/app-container";
/// The sidecar's (or the wrapped `leasehold run`'s) metrics port for this pod.
pub const METRICS_PORT_ANNOTATION: &str = "leasehold.dev/metrics-port";
/// The metrics port's name on the sidecar or the wrapped container: the
/// chart's PodMonitor scrapes the port by this name.
pub const METRICS_PORT_NAME: &str = "lh-metrics";
/// `native` (an init container with `restartPolicy: Always`) or `container`.
pub const SIDECAR_MODE_ANNOTATION: &str = "leasehold.dev/sidecar-mode";
/// Names the container whose command `leasehold run` wraps: that container
/// runs only while the pod leads, and no sidecar is added (the runner
/// campaigns and publishes itself). Needs `leasehold.dev/lease` too.
pub const RUN_ANNOTATION: &str = "leasehold.dev/run";
/// The readiness-gate condition type the sidecar sets.
pub const LEADER_CONDITION: &str = "leasehold.dev/leader";
/// The image's numeric user and group (Dockerfile `USER 65532:65532`): the
/// kubelet can check `runAsNonRoot` only against a numeric user.
pub const SIDECAR_USER: i64 = 65532;
/// The image `leasehold inject` uses unless told otherwise.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/leasehold/leasehold:", env!("CARGO_PKG_VERSION"));
/// The init container that copies the binary for a wrapped container (the
/// app's image does not have it): `leasehold __install-self BIN_DIR`.
pub const INSTALLER_NAME: &str = "leasehold-install";
/// Where the installer's emptyDir is mounted, in the installer (leasehold's
/// image) and in the wrapped container (the app's image).
pub const BIN_DIR: &str = "/leasehold/bin";
/// The hidden subcommand the installer runs (`leasehold __install-self DIR`).
pub const INSTALL_SELF_COMMAND: &str = "__install-self";
/// The runner's file name in BIN_DIR.
pub const RUNNER_FILE_NAME: &str = "leasehold";
/// The binary in leasehold's image (the Dockerfile's COPY and ENTRYPOINT;
/// tests/install/dockerfile.rs holds the Dockerfile to it). Injected containers run
/// the image's entrypoint, so the code never starts it by path; it must only
/// stay clear of BIN_DIR, which the installer mounts over that image (a file
/// on BIN_DIR's path makes runc fail with "not a directory", one under it
/// would be hidden by the mount).
pub const IMAGE_BINARY: &str = "/usr/local/bin/leasehold";
/// The binary as the wrapped container sees it.
pub const RUNNER_PATH: &str = "/leasehold/bin/leasehold";
/// Extra environment of one pod's sidecar, one `NAME=VALUE` per line; a name
/// also in the operator's `--sidecar-env` takes the pod's value.
pub const SIDECAR_ENV_ANNOTATION: &str = "leasehold.dev/sidecar-env";

/// The container through which a pod campaigns, if it has one: the
/// injected sidecar, or the installer of a container wrapped with
/// `leasehold run`. A candidate without either never campaigns (created while
/// the webhook was down, or before its namespace opted in).
pub fn injected_container(spec: &PodSpec) -> Option<&'static str> {
    let containers = || spec.containers.iter().chain(spec.init_containers.iter().flatten());
    [SIDECAR_CONTAINER, INSTALLER_NAME]
        .into_iter()
        .find(|injected| containers().any(|c| c.name == *injected))
}

/// Since when every container of a candidate pod is ready (its
/// `ContainersReady` condition's last transition time), or `None` when they
/// are not: what a transfer's target and a preferred candidate must be.
/// `ContainersReady`, not `Ready`: `Ready` also waits for readiness gates,
/// and a lease's `leasehold.dev/leader` gate keeps every follower unready
/// (Kubernetes docs, "Pod Lifecycle", pod conditions). The kubelet moves
/// the transition time whenever the condition flips, so a flap between two
/// looks still restarts a clock started from it; a condition without a time
/// is ready since "now" at best.
pub fn containers_ready_since(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == "ContainersReady" && c.status == "True")
        })
        .map(|c| c.last_transition_time.as_ref().map_or(Timestamp::MAX, |t| t.0))
}
