//! The store-agnostic lease core: the record, the timing rules, the store
//! port and the elector. Nothing here knows about Kubernetes or Spanner: the
//! [`LeaseStore`] trait is the port the backends in `crate::store` implement,
//! so the arrows point inward.

pub mod budget;
pub mod clock;
pub mod elector;
pub mod holder;
pub mod lock_set;
pub mod partitions;
pub mod record;
#[doc(hidden)]
pub mod seams;
pub mod session;
pub mod store;
pub mod timing;
pub mod version;

pub use elector::{Change, Elector, ElectorControl, ElectorHandle, LeaderContext, LeaderState};
pub use lock_set::{HeldLock, HeldSet, Session, TryLocked};
pub use partitions::{Assigned, Partitioner, PartitionsError, validate_partitions};
pub use record::{
    EndReason, Ended, FencingToken, Grant, Handoff, Held, Identity, InvalidClusterName, InvalidHandoff,
    InvalidIdentity, InvalidPodUid, LeaseRecord, LockNameError, MAX_CLUSTER_NAME_CHARS, Observation, Release,
    Reservation, StoreTime, parse_cluster_name,
};
pub use record::{fnv1a_64, validate_lock_name};
pub use session::SessionStore;
pub use store::{LeaseStore, StoreError, StoreIdentity};
pub use timing::{LeaseDurationError, Timing, TimingError};
pub use timing::{lease_from_millis, lease_to_millis};
pub use version::{Claim, InvalidPrefer, PeerWatch, Prefer, Version, VersionPolicy};
