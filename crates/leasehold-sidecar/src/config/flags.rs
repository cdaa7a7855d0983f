//! The sidecar's flags, each also an environment variable: the lease and
//! store flags `leasehold sidecar` and `leasehold run` share, and the
//! sidecar's own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::lease::parse_cluster_name;
use leasehold_core::lease::timing::parse_duration_flag;
use leasehold_kubernetes::api::contract;
use leasehold_runtime::StoreKind;

/// `--store`'s values, each with its help, from the runtime's one list.
pub fn store_kind() -> impl clap::builder::TypedValueParser<Value = StoreKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(StoreKind::ALL.map(|kind| PossibleValue::new(kind.flag()).help(kind.about())))
        .map(|flag| StoreKind::from_flag(&flag).expect("one of the possible values"))
}

/// The lease and store flags, shared by `leasehold sidecar` and `leasehold run`.
#[derive(Debug, clap::Args)]
pub struct ElectionArgs {
    /// The DistributedLease (in the pod's namespace) to take every lease
    /// setting from; excludes --store, --database, --table, --store-url,
    /// --lock, --partitions and the timing flags.
    #[arg(
        long,
        env = contract::ENV_LEASE,
        conflicts_with_all = [
            "store", "database", "table", "store_url", "lock", "lease_duration", "renew_deadline", "retry_period",
            "prefer", "version_fence", "partitions",
        ],
    )]
    pub lease: Option<String>,
    /// Standalone: the store.
    #[arg(long, env = "LEASEHOLD_STORE", value_parser = store_kind())]
    pub store: Option<StoreKind>,
    /// Standalone: the Spanner database, projects/<p>/instances/<i>/databases/<d>.
    #[arg(long, env = "LEASEHOLD_DATABASE")]
    pub database: Option<String>,
    /// Standalone: the lease table (Spanner, PostgreSQL).
    #[arg(long, env = "LEASEHOLD_TABLE")]
    pub table: Option<String>,
    /// Standalone: the PostgreSQL or Redis URL, credentials included
    /// (postgres://user:password@host/db, redis://:password@host:6379/0).
    #[arg(long, env = "LEASEHOLD_STORE_URL", hide_env_values = true)]
    pub store_url: Option<String>,
    /// A file holding the store URL (a mounted Secret), instead of --store-url.
    #[arg(long, env = contract::ENV_STORE_URL_FILE, conflicts_with = "store_url")]
    pub store_url_file: Option<PathBuf>,
    /// Standalone: the lock name.
    #[arg(long, env = "LEASEHOLD_LOCK")]
    pub lock: Option<String>,
    /// Standalone: share the work as this many partitions of --lock, each
    /// with its own token, instead of electing one leader (docs/partitions.md;
    /// memory, Spanner, PostgreSQL and Redis stores).
    #[arg(long, env = "LEASEHOLD_PARTITIONS")]
    pub partitions: Option<u32>,
    /// Standalone: lease duration D [default: 15s].
    #[arg(long, env = "LEASEHOLD_LEASE_DURATION", value_parser = parse_duration_flag)]
    pub lease_duration: Option<Duration>,
    /// Standalone: renew deadline R (< D) [default: D·10/15, so 10s].
    #[arg(long, env = "LEASEHOLD_RENEW_DEADLINE", value_parser = parse_duration_flag)]
    pub renew_deadline: Option<Duration>,
    /// Standalone: retry period P (< R) [default: R·2/10, so 2s].
    #[arg(long, env = "LEASEHOLD_RETRY_PERIOD", value_parser = parse_duration_flag)]
    pub retry_period: Option<Duration>,
    /// Create the lease table when it is missing (the operator normally does).
    #[arg(long, env = "LEASEHOLD_CREATE_TABLE")]
    pub create_table: bool,
    /// This candidate's name; inside Kubernetes the pod name (downward API).
    #[arg(long, env = contract::ENV_POD_NAME)]
    pub pod_name: Option<String>,
    /// The pod's namespace (downward API).
    #[arg(long, env = contract::ENV_POD_NAMESPACE)]
    pub pod_namespace: Option<String>,
    /// The pod's UID (downward API): part of the holder identity
    /// (`…#nonce@uid`), and the pod Events are about.
    #[arg(long, env = contract::ENV_POD_UID)]
    pub pod_uid: Option<String>,
    /// The cluster's name, part of the identity for locks shared across
    /// clusters (`cluster/namespace/pod#nonce@uid`).
    #[arg(long, env = contract::ENV_CLUSTER_NAME, value_parser = parse_cluster_name)]
    pub cluster_name: Option<String>,
    /// Publish to the Kubernetes API (label, readiness condition, Events, peer
    /// watch); default: when running in a cluster with POD_NAME set.
    #[arg(long, env = "LEASEHOLD_KUBERNETES")]
    pub kubernetes: Option<bool>,
    /// Write holder, term and token as JSON here, replaced atomically.
    #[arg(long, env = contract::ENV_TOKEN_FILE)]
    pub token_file: Option<PathBuf>,
    /// This candidate's version, for people [inside Kubernetes, default: the
    /// pod's pod-template-hash and app image]. Not `--version`, which prints
    /// leasehold's own.
    #[arg(long, env = contract::ENV_VERSION)]
    pub version_name: Option<String>,
    /// The number versions are ordered by, higher is newer [inside
    /// Kubernetes, default: the ReplicaSet's deployment.kubernetes.io/revision].
    #[arg(long, env = contract::ENV_REVISION)]
    pub revision: Option<u64>,
    /// Standalone: which version leads: none, newest or oldest [default: none].
    #[arg(long, env = "LEASEHOLD_PREFER")]
    pub prefer: Option<leasehold_core::lease::Prefer>,
    /// Standalone: once a revision has led, never let a lower one lead.
    #[arg(long, env = "LEASEHOLD_VERSION_FENCE")]
    pub version_fence: bool,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// The local HTTP API.
    #[arg(long, env = contract::ENV_HTTP_ADDR, default_value_t = contract::default_http_addr())]
    pub http_addr: SocketAddr,
    /// The /metrics listener.
    #[arg(long, env = contract::ENV_METRICS_ADDR, default_value_t = contract::default_metrics_addr())]
    pub metrics_addr: SocketAddr,
    /// Once both listeners are bound, write their addresses here as JSON ({"http": ..., "metrics": ...}), replaced atomically; with port 0 the system picks the ports
    #[arg(long, env = "LEASEHOLD_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Campaign only while this container of our pod is ready (from the pod watch).
    #[arg(long, env = contract::ENV_APP_CONTAINER)]
    pub app_container: Option<String>,
    /// Campaign only while this URL (http://127.0.0.1:port/path) answers 2xx.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_URL", value_parser = crate::health::parse_health_url)]
    pub app_health_url: Option<http::Uri>,
    /// How often the app health URL is polled.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_INTERVAL", default_value = "2s", value_parser = parse_duration_flag)]
    pub app_health_interval: Duration,
    /// How long one poll of the app health URL may take.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_TIMEOUT", default_value = "1s", value_parser = parse_duration_flag)]
    pub app_health_timeout: Duration,
    /// Failed polls in a row that make the app unhealthy.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_FAILURES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub app_health_failures: u32,
    /// On SIGTERM or when the app turns unhealthy: time between stopping to claim and releasing; never past the
    /// renew deadline after the last renewal (nothing renews while draining, and the release must land before the
    /// lease can expire).
    #[arg(long, env = "LEASEHOLD_DRAIN", default_value = "5s", value_parser = parse_duration_flag)]
    pub drain: Duration,
}

impl ElectionArgs {
    pub fn kubernetes(&self) -> bool {
        self.kubernetes
            .unwrap_or_else(|| self.pod_name.is_some() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some())
    }
}
