//! The settings a sidecar runs with, resolved from the flags alone
//! (standalone) or from the `DistributedLease` named by `--lease`.

use kube::Api;

use super::{ElectionArgs, Error, Result};
use crate::pod::PodRef;
use leasehold_core::lease::{Identity, Timing, Version, VersionPolicy, validate_lock_name, validate_partitions};
use leasehold_kubernetes::api::{DEFAULT_LABEL_KEY, DistributedLease, LeaseStoreSpec, ValidStore, validate};
use leasehold_runtime::{StoreConfig, StoreFlags, store_url};
use leasehold_stores::StoreUrl;

/// The store a `DistributedLease` names. PostgreSQL and Redis URLs come
/// from the Secret it references, which the webhook mounts into the sidecar
/// and names with LEASEHOLD_STORE_URL_FILE.
fn lease_store(store: &ValidStore, namespace: &str, args: &ElectionArgs) -> Result<StoreConfig> {
    StoreConfig::of_lease(store, namespace, || -> Result<StoreUrl> {
        store_url(None, args.store_url_file.as_deref())?.ok_or_else(|| Error::StoreUrlFileMissing {
            store: store.to_string(),
        })
    })
}

/// Where and how leadership is published on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publishing {
    pub label_key: String,
    /// The candidate pods of this lock, as a label selector string.
    pub selector: String,
    /// Labels the sidecar keeps on its own pod so that the selector finds it
    /// (standalone; with --lease the pod template carries them).
    pub candidate_labels: std::collections::BTreeMap<String, String>,
}

impl Publishing {
    /// Standalone: candidates of `lock` are the pods labelled with it.
    fn standalone(lock: &str) -> Self {
        use crate::pod::{LOCK_LABEL, lock_label_value};
        let value = lock_label_value(lock);
        Publishing {
            label_key: DEFAULT_LABEL_KEY.into(),
            selector: format!("{LOCK_LABEL}={value}"),
            candidate_labels: [(LOCK_LABEL.to_string(), value)].into(),
        }
    }
}

/// The `DistributedLease` a sidecar started with `--lease` is bound to: the
/// one resource it read at start, by its `metadata.uid`. A resource of the
/// same name with another uid is another lease (deleted and recreated, maybe
/// on another store), which this process never campaigns on
/// ([`super::watch`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseBinding {
    pub name: String,
    /// `metadata.uid` (the API server sets it on every object).
    pub uid: String,
    /// The whole `spec.store` read at start, Secret references included: the
    /// URL behind a Secret is read once, so any change of the block is a move.
    pub store: LeaseStoreSpec,
    /// It carried a deletionTimestamp when read: the sidecar does not
    /// campaign on it, it retires at once.
    pub deleting: bool,
    /// `status.storeIdentity` when read: the store the candidates campaign
    /// on, if the operator has recorded it yet (`sidecar::lease_store`).
    pub store_identity: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub lock: String,
    pub identity: Identity,
    pub timing: Timing,
    pub store: StoreConfig,
    pub publishing: Publishing,
    pub pod: Option<PodRef>,
    /// The version from the flags; inside Kubernetes the sidecar completes
    /// it from the pod ([`super::versions`]).
    pub version: Option<Version>,
    pub versions: VersionPolicy,
    /// Work partitioning: the number of partitions; `None` elects one leader.
    pub partitions: Option<u32>,
    /// With `--lease`: the resource these settings were read from.
    pub lease: Option<LeaseBinding>,
}

/// The version the flags give: `--revision` orders it, `--version-name` names it.
/// A name without a revision cannot be ordered: outside Kubernetes, where
/// no ReplicaSet can supply one, that is an error naming the flags.
pub(crate) fn flag_version(args: &ElectionArgs) -> Result<Option<Version>> {
    match (args.revision, &args.version_name) {
        (Some(revision), name) => Ok(Some(Version {
            revision,
            name: name.clone().unwrap_or_default(),
        })),
        (None, Some(name)) if !args.kubernetes() => Err(Error::VersionWithoutRevision { name: name.clone() }),
        (None, _) => Ok(None),
    }
}

/// Partitions are held through sessions, which every store but the
/// Kubernetes one keeps.
fn partitions_store(store: &StoreConfig) -> Result<()> {
    let kind = store.kind();
    if kind.keeps_sessions() {
        return Ok(());
    }
    Err(Error::PartitionsStore { store: kind.flag() })
}

/// Checks the flags and, with --lease, reads the resource.
pub async fn resolve(args: &ElectionArgs, client: Option<kube::Client>) -> Result<Settings> {
    let pod = match (&args.pod_name, &args.pod_namespace) {
        (Some(name), Some(namespace)) => Some(PodRef {
            name: name.clone(),
            namespace: namespace.clone(),
            uid: args.pod_uid.clone(),
        }),
        _ => None,
    };
    if args.kubernetes() && pod.is_none() {
        return Err(Error::PodUnknown);
    }
    let name = args
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "leasehold".into());
    let identity = Identity::new(args.cluster_name.clone(), args.pod_namespace.clone(), name);
    match &args.lease {
        // clap rejects the standalone flags next to --lease.
        Some(lease) => {
            let (Some(client), Some(pod)) = (client, &pod) else {
                return Err(Error::LeaseNeedsKubernetes { lease: lease.clone() });
            };
            let api: Api<DistributedLease> = Api::namespaced(client, &pod.namespace);
            let named = || (pod.namespace.clone(), lease.clone());
            let resource = api
                .get_opt(lease)
                .await
                .map_err(|source| {
                    let (namespace, lease) = named();
                    Error::LeaseUnread {
                        namespace,
                        lease,
                        source,
                    }
                })?
                .ok_or_else(|| {
                    let (namespace, lease) = named();
                    Error::LeaseNotFound { namespace, lease }
                })?;
            let valid = validate(&resource).map_err(|source| {
                let (namespace, lease) = named();
                Error::LeaseInvalid {
                    namespace,
                    lease,
                    source,
                }
            })?;
            Ok(Settings {
                lock: valid.lock,
                identity,
                timing: valid.timing,
                store: lease_store(&valid.store, &pod.namespace, args)?,
                publishing: Publishing {
                    label_key: valid.label_key,
                    selector: valid.selector.to_string(),
                    candidate_labels: Default::default(),
                },
                pod: Some(pod.clone()),
                version: flag_version(args)?,
                versions: valid.versions,
                // validate() allowed them only on Spanner.
                partitions: valid.partitions,
                lease: Some(LeaseBinding {
                    name: lease.clone(),
                    uid: resource.metadata.uid.clone().unwrap_or_default(),
                    store: resource.spec.store.clone(),
                    deleting: resource.metadata.deletion_timestamp.is_some(),
                    store_identity: resource.status.as_ref().and_then(|s| s.store_identity.clone()),
                }),
            })
        }
        None => {
            let lock = args.lock.clone().ok_or(Error::LockMissing)?;
            validate_lock_name("--lock", &lock)?;
            let timing = Timing::default()
                .with_given(args.lease_duration, args.renew_deadline, args.retry_period)
                .map_err(|source| Error::Timing {
                    flags: "--lease-duration/--renew-deadline/--retry-period",
                    source,
                })?;
            let url = store_url(args.store_url.as_deref(), args.store_url_file.as_deref())?;
            let store = StoreFlags {
                kind: args.store,
                database: args.database.as_deref(),
                table: args.table.as_deref(),
                url,
                namespace: args.pod_namespace.as_deref(),
            }
            .choose()?;
            if let Some(n) = args.partitions {
                validate_partitions(("--lock", "--partitions"), &lock, n)?;
                partitions_store(&store)?;
            }
            Ok(Settings {
                publishing: Publishing::standalone(&lock),
                lock,
                identity,
                timing,
                store,
                pod,
                version: flag_version(args)?,
                versions: VersionPolicy {
                    prefer: args.prefer.unwrap_or_default(),
                    fence: args.version_fence,
                },
                partitions: args.partitions,
                lease: None,
            })
        }
    }
}
