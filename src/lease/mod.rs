//! The store-agnostic lease core: the record, the timing rules, the store
//! port and the elector. Nothing here knows about Kubernetes or Spanner: the
//! [`LeaseStore`] trait is the port the backends in `crate::store` implement,
//! so the arrows point inward.

pub mod budget;
pub mod clock;
pub mod elector;
pub(crate) mod holder;
pub mod lock_set;
pub mod partitions;
pub mod record;
pub mod session;
pub(crate) mod sim_hooks;
pub mod store;
pub mod timing;
pub mod version;

pub use elector::{Change, Elector, ElectorControl, ElectorHandle, LeaderContext, LeaderState};
pub use lock_set::{HeldLock, HeldSet, Session, TryLocked};
pub use partitions::{Assigned, MAX_PARTITIONS, Partitioner, PartitionsError, validate_partitions};
pub use record::{
    EndReason, Ended, FencingToken, Grant, Handoff, Held, Identity, InvalidClusterName, InvalidHandoff,
    InvalidIdentity, InvalidPodUid, LeaseRecord, LockNameError, MAX_CLUSTER_NAME_CHARS, MAX_LOCK_NAME_BYTES,
    Observation, Release, Reservation, StoreTime, fnv1a_64, parse_cluster_name, validate_lock_name,
};
pub use session::SessionStore;
pub use store::{LeaseStore, StoreError};
pub use timing::{
    LeaseDurationError, MAX_LEASE_DURATION, MIN_RETRY_PERIOD, Timing, TimingError, lease_from_millis, lease_to_millis,
};
pub use version::{Claim, Prefer, Version, VersionPolicy};
