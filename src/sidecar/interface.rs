//! The sidecar's outside interface: the environment variables it reads and
//! its default ports. The flags in `config.rs` and the injection patch
//! (webhook and `leasehold inject`) both read these, so they cannot drift.

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
/// more than [`AT_RISK_SHARE`](crate::lease::budget::AT_RISK_SHARE) of
/// R − P; the operator gathers it into the lease's `TimingAtRisk`.
pub const TIMING_CONDITION: &str = "leasehold.dev/timing-at-risk";

/// The annotation a sidecar writes on its own pod once it has retired from
/// a `DistributedLease` (deleted, recreated, or changed in what it campaigns
/// on): its value is the `metadata.uid` of the lease it retired from. It has
/// stopped claiming and released before writing it; the operator keeps the
/// lease's finalizer until every running candidate carries it
/// (`operator::reconcile::delete`), and the sidecar's admission policy lets
/// it set this annotation on its own pod only.
pub const RETIRED_FROM_ANNOTATION: &str = "leasehold.dev/retired-from";

/// `--version`: this candidate's version, for people.
pub const ENV_VERSION: &str = "LEASEHOLD_VERSION";
/// `--revision`: the number versions are ordered by.
pub const ENV_REVISION: &str = "LEASEHOLD_REVISION";

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
