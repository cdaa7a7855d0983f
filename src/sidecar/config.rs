//! The sidecar's settings: from flags and environment alone (standalone), or
//! from the `DistributedLease` named by `--lease` in the pod's namespace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kube::Api;

use super::{Error, Result};
use crate::api::{DEFAULT_LABEL_KEY, DEFAULT_TABLE, DistributedLease, validate};
use crate::lease::{Identity, Timing, validate_lock_name};
use crate::store::spanner::SpannerConfig;
use tracing::{debug, info, warn};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Memory,
    Spanner,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The DistributedLease (in the pod's namespace) to take every lease
    /// setting from; excludes --lock, --database, --table and the timing flags.
    #[arg(long, env = "LEASEHOLD_LEASE")]
    pub lease: Option<String>,
    /// Standalone: the store.
    #[arg(long, env = "LEASEHOLD_STORE", value_enum)]
    pub store: Option<StoreKind>,
    /// Standalone: the Spanner database, projects/<p>/instances/<i>/databases/<d>.
    #[arg(long, env = "LEASEHOLD_DATABASE")]
    pub database: Option<String>,
    /// Standalone: the lease table.
    #[arg(long, env = "LEASEHOLD_TABLE")]
    pub table: Option<String>,
    /// Standalone: the lock name.
    #[arg(long, env = "LEASEHOLD_LOCK")]
    pub lock: Option<String>,
    /// Standalone: lease duration D.
    #[arg(long, env = "LEASEHOLD_LEASE_DURATION")]
    pub lease_duration: Option<String>,
    /// Standalone: renew deadline R (< D).
    #[arg(long, env = "LEASEHOLD_RENEW_DEADLINE")]
    pub renew_deadline: Option<String>,
    /// Standalone: retry period P (< R).
    #[arg(long, env = "LEASEHOLD_RETRY_PERIOD")]
    pub retry_period: Option<String>,
    /// Create the lease table when it is missing (the operator normally does).
    #[arg(long, env = "LEASEHOLD_CREATE_TABLE")]
    pub create_table: bool,
    /// This candidate's name; inside Kubernetes the pod name (downward API).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The pod's UID (downward API), for Events about the pod.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// The cluster's name, part of the identity for locks shared across clusters.
    #[arg(long, env = "LEASEHOLD_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// Publish to the Kubernetes API (label, readiness condition, Events, peer
    /// watch); default: when running in a cluster with POD_NAME set.
    #[arg(long, env = "LEASEHOLD_KUBERNETES")]
    pub kubernetes: Option<bool>,
    /// The local HTTP API.
    #[arg(long, env = "LEASEHOLD_HTTP_ADDR", default_value = "127.0.0.1:4040")]
    pub http_addr: SocketAddr,
    /// The /metrics listener.
    #[arg(long, env = "LEASEHOLD_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Write holder, term and token as JSON here, replaced atomically.
    #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Campaign only while this container of our pod is ready (from the pod watch).
    #[arg(long, env = "LEASEHOLD_APP_CONTAINER")]
    pub app_container: Option<String>,
    /// Campaign only while this URL (http://127.0.0.1:port/path) answers 2xx.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_URL")]
    pub app_health_url: Option<String>,
    /// How often the app health URL is polled.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_INTERVAL", default_value = "2s", value_parser = super::parse_duration_flag)]
    pub app_health_interval: Duration,
    /// How long one poll of the app health URL may take.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_TIMEOUT", default_value = "1s", value_parser = super::parse_duration_flag)]
    pub app_health_timeout: Duration,
    /// Failed polls in a row that make the app unhealthy.
    #[arg(long, env = "LEASEHOLD_APP_HEALTH_FAILURES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub app_health_failures: u32,
    /// On SIGTERM or when the app turns unhealthy: time between stopping to claim and releasing.
    #[arg(long, env = "LEASEHOLD_DRAIN", default_value = "5s", value_parser = super::parse_duration_flag)]
    pub drain: Duration,
}

impl Args {
    pub fn kubernetes(&self) -> bool {
        self.kubernetes
            .unwrap_or_else(|| self.pod_name.is_some() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    Memory,
    Spanner(SpannerConfig),
}

/// Where and how leadership is published on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publishing {
    pub label_key: String,
    /// Candidate pods, as a label selector string.
    pub selector: Option<String>,
}

/// The pod this sidecar runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub lock: String,
    pub identity: Identity,
    pub timing: Timing,
    pub store: StoreChoice,
    pub publishing: Publishing,
    pub pod: Option<PodRef>,
}

/// Checks the flags and, with --lease, reads the resource.
pub async fn resolve(args: &Args, client: Option<kube::Client>) -> Result<Settings> {
    let pod = match (&args.pod_name, &args.pod_namespace) {
        (Some(name), Some(namespace)) => Some(PodRef {
            name: name.clone(),
            namespace: namespace.clone(),
            uid: args.pod_uid.clone(),
        }),
        _ => None,
    };
    if args.kubernetes() && pod.is_none() {
        return Err(Error::Config(
            "publishing to Kubernetes needs POD_NAME and POD_NAMESPACE (downward API)".into(),
        ));
    }
    let name = args
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "leasehold".into());
    let identity = Identity::new(args.cluster_name.clone(), args.pod_namespace.clone(), name);
    match &args.lease {
        Some(lease) => {
            let standalone = [
                ("--store", args.store.is_some()),
                ("--database", args.database.is_some()),
                ("--table", args.table.is_some()),
                ("--lock", args.lock.is_some()),
                ("--lease-duration", args.lease_duration.is_some()),
                ("--renew-deadline", args.renew_deadline.is_some()),
                ("--retry-period", args.retry_period.is_some()),
            ];
            if let Some((flag, _)) = standalone.iter().find(|(_, set)| *set) {
                return Err(Error::Config(format!(
                    "{flag} contradicts --lease {lease}: the DistributedLease sets it"
                )));
            }
            let (Some(client), Some(pod)) = (client, &pod) else {
                return Err(Error::Config(format!(
                    "--lease {lease} needs the Kubernetes API and POD_NAMESPACE"
                )));
            };
            let api: Api<DistributedLease> = Api::namespaced(client, &pod.namespace);
            let resource = api
                .get_opt(lease)
                .await?
                .ok_or_else(|| Error::Config(format!("DistributedLease {}/{lease} not found", pod.namespace)))?;
            let valid = validate(&resource)
                .map_err(|e| Error::Config(format!("DistributedLease {}/{lease}: {e}", pod.namespace)))?;
            Ok(Settings {
                lock: valid.lock,
                identity,
                timing: valid.timing,
                store: StoreChoice::Spanner(valid.spanner),
                publishing: Publishing {
                    label_key: valid.label_key,
                    selector: Some(valid.selector),
                },
                pod: Some(pod.clone()),
            })
        }
        None => {
            let lock = args
                .lock
                .clone()
                .ok_or_else(|| Error::Config("--lock (or --lease) is required".into()))?;
            validate_lock_name("--lock", &lock).map_err(|e| Error::Config(e.to_string()))?;
            let timing = Timing::parse(
                args.lease_duration.as_deref().unwrap_or("15s"),
                args.renew_deadline.as_deref().unwrap_or("10s"),
                args.retry_period.as_deref().unwrap_or("2s"),
                0.1,
            )?;
            let store = match (args.store, &args.database) {
                (None, None) => {
                    return Err(Error::Config("--store memory|spanner (or --lease) is required".into()));
                }
                (Some(StoreKind::Memory), Some(_)) => {
                    return Err(Error::Config("--database contradicts --store memory".into()));
                }
                (Some(StoreKind::Memory), None) => StoreChoice::Memory,
                (_, Some(database)) => StoreChoice::Spanner(SpannerConfig {
                    database: database.clone(),
                    table: args.table.clone().unwrap_or_else(|| DEFAULT_TABLE.into()),
                }),
                (Some(StoreKind::Spanner), None) => {
                    return Err(Error::Config("--store spanner needs --database".into()));
                }
            };
            if let StoreChoice::Spanner(config) = &store {
                crate::store::spanner::validate_database(&config.database)?;
                crate::store::spanner::validate_table(&config.table)?;
            }
            Ok(Settings {
                lock,
                identity,
                timing,
                store,
                publishing: Publishing {
                    label_key: DEFAULT_LABEL_KEY.into(),
                    selector: None,
                },
                pod,
            })
        }
    }
}

/// Follows the `DistributedLease` after start. New timing applies from the
/// next term; a new lock, store or label key needs a restart (a running
/// elector cannot move its lease), which is logged.
pub async fn watch_lease(
    client: kube::Client,
    pod: PodRef,
    lease: String,
    started: Settings,
    set_timing: impl Fn(Timing),
) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api: Api<DistributedLease> = Api::namespaced(client, &pod.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let mut events = std::pin::pin!(watcher::watcher(api, config));
    let mut timing = started.timing;
    while let Some(event) = events.next().await {
        let resource = match event {
            Ok(watcher::Event::Apply(r)) | Ok(watcher::Event::InitApply(r)) => r,
            Ok(watcher::Event::Delete(_)) => {
                warn!(%lease, "the DistributedLease was deleted; keeping the settings this sidecar started with");
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                debug!(error = %e, "lease watch error; the watcher retries");
                continue;
            }
        };
        match validate(&resource) {
            Ok(valid) => {
                if valid.timing != timing {
                    info!(%lease, timing = ?valid.timing, "the lease's timing changed; applies from the next term");
                    set_timing(valid.timing);
                    timing = valid.timing;
                }
                let moved = valid.lock != started.lock
                    || StoreChoice::Spanner(valid.spanner) != started.store
                    || valid.label_key != started.publishing.label_key;
                if moved {
                    warn!(%lease, "the lease's lock, store or label key changed; restart the pod to apply");
                }
            }
            Err(e) => warn!(%lease, error = %e, "the DistributedLease is invalid now; keeping the current settings"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    async fn settings(argv: &[&str]) -> Result<Settings> {
        let cli = Cli::parse_from(std::iter::once("sidecar").chain(argv.iter().copied()));
        resolve(&cli.args, None).await
    }

    #[tokio::test]
    async fn standalone_settings_need_a_lock_and_a_store_and_agree_with_each_other() {
        let cases: &[(&[&str], &str)] = &[
            (&["--store", "memory"], "--lock (or --lease) is required"),
            (&["--lock", "l"], "--store memory|spanner (or --lease) is required"),
            (&["--lock", "", "--store", "memory"], "--lock must not be empty"),
            (
                &["--lock", "l", "--store", "memory", "--lease-duration", "1000000000y"],
                "leaseDuration (31557600000000000s) must be between 10ms and 3600s",
            ),
            (
                &["--lock", "l", "--store", "spanner"],
                "--store spanner needs --database",
            ),
            (
                &[
                    "--lock",
                    "l",
                    "--store",
                    "memory",
                    "--database",
                    "projects/p/instances/i/databases/d",
                ],
                "--database contradicts --store memory",
            ),
            (
                &["--lock", "l", "--store", "memory", "--lease-duration", "2s"],
                "renewDeadline (10s) must be shorter than leaseDuration (2s)",
            ),
            (
                &["--lock", "l", "--database", "nonsense"],
                "is not of the form projects/<project>",
            ),
            (
                &[
                    "--lock",
                    "l",
                    "--database",
                    "projects/p/instances/i/databases/d",
                    "--table",
                    "bad-name",
                ],
                "is not a valid Spanner identifier",
            ),
            (&["--lease", "web", "--lock", "l"], "--lock contradicts --lease web"),
            (
                &["--lease", "web"],
                "--lease web needs the Kubernetes API and POD_NAMESPACE",
            ),
        ];
        for (argv, expected) in cases {
            // As the binary prints it: the error and its causes.
            let err = format!("{:#}", anyhow::Error::from(settings(argv).await.unwrap_err()));
            assert!(err.contains(expected), "{argv:?}: got {err:?}, want {expected:?}");
        }
    }

    #[tokio::test]
    async fn standalone_spanner_settings() {
        let s = settings(&[
            "--lock",
            "l",
            "--database",
            "projects/p/instances/i/databases/d",
            "--retry-period",
            "1s",
        ])
        .await
        .unwrap();
        assert_eq!(s.lock, "l");
        assert_eq!(s.timing.retry_period, Duration::from_secs(1));
        assert_eq!(
            s.store,
            StoreChoice::Spanner(SpannerConfig {
                database: "projects/p/instances/i/databases/d".into(),
                table: DEFAULT_TABLE.into()
            })
        );
    }

    #[tokio::test]
    async fn with_lease_every_setting_comes_from_the_resource() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "prod");
        let api_server = tokio::spawn(async move {
            let (request, send) = server.next_request().await.expect("GET the lease");
            assert_eq!(request.method(), "GET");
            assert_eq!(
                request.uri().path(),
                "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web"
            );
            let lease = serde_json::json!({
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "web", "namespace": "prod"},
                "spec": {
                    "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                    "leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s",
                    "selector": {"matchLabels": {"app": "web"}},
                    "publishing": {"readinessGate": true},
                }
            });
            send.send_response(Response::new(Body::from(serde_json::to_vec(&lease).unwrap())));
        });
        let cli = Cli::parse_from([
            "sidecar",
            "--lease",
            "web",
            "--pod-name",
            "web-0",
            "--pod-namespace",
            "prod",
            "--kubernetes",
            "true",
        ]);
        let s = resolve(&cli.args, Some(client)).await.unwrap();
        api_server.await.unwrap();
        assert_eq!(s.lock, "prod/web", "the lock defaults to namespace/name");
        assert_eq!(s.timing.lease_duration, Duration::from_secs(6));
        assert_eq!(
            s.publishing,
            Publishing {
                label_key: "leasehold.dev/leader".into(),
                selector: Some("app=web".into())
            }
        );
        assert_eq!(s.pod.unwrap().name, "web-0");
        assert!(s.identity.to_string().starts_with("prod/web-0#"));
    }

    #[tokio::test]
    async fn a_timing_change_of_the_lease_reaches_the_elector() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "prod");
        let started = settings(&["--lock", "prod/web", "--database", "projects/p/instances/i/databases/d"])
            .await
            .unwrap();
        let pod = PodRef {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: None,
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(watch_lease(client, pod, "web".into(), started, move |t| {
            tx.send(t).unwrap()
        }));
        let (request, send) = server.next_request().await.expect("the lease watch");
        assert_eq!(request.method(), "GET");
        assert_eq!(
            request.uri().path(),
            "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases"
        );
        assert!(
            request
                .uri()
                .query()
                .unwrap()
                .contains("fieldSelector=metadata.name%3Dweb"),
            "{}",
            request.uri()
        );
        assert!(super::super::rbac::allows_request("GET", request.uri().path(), true));
        let list = serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLeaseList", "metadata": {"resourceVersion": "7"},
            "items": [{
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "web", "namespace": "prod"},
                "spec": {
                    "lockName": "prod/web",
                    "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                    "leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "3s",
                    "selector": {"matchLabels": {"app": "web"}},
                }
            }]
        });
        send.send_response(Response::new(Body::from(serde_json::to_vec(&list).unwrap())));
        let timing = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(timing.renew_deadline, Duration::from_secs(20));
    }
}
