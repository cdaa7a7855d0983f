//! The sidecar's settings: from flags and environment alone (standalone), or
//! from the `DistributedLease` named by `--lease` in the pod's namespace.
//! The flags ([`flags`]), their resolution into [`Settings`] ([`settings`])
//! and the watch that follows the resource after start ([`watch`]).

mod flags;
mod settings;
mod watch;

pub use flags::Args;
pub use flags::ElectionArgs;
pub use flags::store_kind;
pub use settings::{LeaseBinding, Settings};
pub use settings::{Publishing, resolve};
pub(crate) use watch::{Retirement, watch_lease};

use leasehold_core::lease::{LockNameError, PartitionsError, StoreError, TimingError};
use leasehold_kubernetes::api::ValidationError;
use leasehold_runtime::SelectError;

/// Settings that cannot work, each naming the flag or resource at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("publishing to Kubernetes needs POD_NAME and POD_NAMESPACE (downward API)")]
    PodUnknown,
    #[error("--lease {lease} needs the Kubernetes API and POD_NAMESPACE")]
    LeaseNeedsKubernetes { lease: String },
    #[error("DistributedLease {namespace}/{lease} not found")]
    LeaseNotFound { namespace: String, lease: String },
    #[error("DistributedLease {namespace}/{lease} is invalid")]
    LeaseInvalid {
        namespace: String,
        lease: String,
        source: ValidationError,
    },
    #[error("reading DistributedLease {namespace}/{lease}")]
    LeaseUnread {
        namespace: String,
        lease: String,
        source: kube::Error,
    },
    #[error(
        "the lease's store is {store}: mount that Secret key and pass its path as --store-url-file \
         (LEASEHOLD_STORE_URL_FILE)"
    )]
    StoreUrlFileMissing { store: String },
    #[error("--lock (or --lease) is required")]
    LockMissing,
    #[error("--pod-uid (POD_UID) cannot be part of the holder identity")]
    PodUid(#[source] leasehold_core::lease::InvalidPodUid),
    #[error(transparent)]
    Lock(#[from] LockNameError),
    #[error(transparent)]
    Partitions(#[from] PartitionsError),
    #[error(
        "--partitions needs --store memory, spanner, postgres or redis: the {store} store keeps no sessions, through which \
         partitions are held"
    )]
    PartitionsStore { store: &'static str },
    #[error("--version-name {name:?} needs --revision (LEASEHOLD_REVISION): the number versions are ordered by")]
    VersionWithoutRevision { name: String },
    #[error("invalid timing ({flags})")]
    Timing {
        flags: &'static str,
        #[source]
        source: TimingError,
    },
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error("store")]
    Store(#[from] StoreError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
