//! The lease record as every store keeps it, and the identity of a candidate.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::version::Version;

/// The longest lock name, in bytes. The default lock is
/// `<namespace>/<name>`: a namespace is a DNS label (at most 63 bytes) and an
/// object name a DNS subdomain (at most 253), so 317 bytes; 512 leaves room
/// for a prefix such as a cluster or region, and stays far below Spanner's
/// 8 KiB limit on a key.
pub const MAX_LOCK_NAME_BYTES: usize = 512;

/// FNV-1a 64 of `bytes`: stable across versions and platforms, so every
/// candidate and every store computes the same shard, label and ranking.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A lock name that no store should see, naming the field or flag it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockNameError {
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("{field} is {len} bytes long; at most {MAX_LOCK_NAME_BYTES} are allowed")]
    TooLong { field: &'static str, len: usize },
    #[error("{field} must not contain control characters")]
    Control { field: &'static str },
    #[error("{field} must not start or end with whitespace: {name:?}")]
    Whitespace { field: &'static str, name: String },
}

/// The one check of a lock name, wherever one enters: flags, the resource
/// spec, the stores. `field` is what the user typed it into.
pub fn validate_lock_name(field: &'static str, name: &str) -> Result<(), LockNameError> {
    if name.trim().is_empty() {
        return Err(LockNameError::Empty { field });
    }
    if name.len() > MAX_LOCK_NAME_BYTES {
        return Err(LockNameError::TooLong { field, len: name.len() });
    }
    if name.chars().any(char::is_control) {
        return Err(LockNameError::Control { field });
    }
    // Names are compared byte for byte; " web" and "web" would be two locks.
    if name.trim() != name {
        return Err(LockNameError::Whitespace {
            field,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// The longest cluster name, in characters: a DNS label's length, which
/// fits every cloud's cluster names and keeps holder identities short.
pub const MAX_CLUSTER_NAME_CHARS: usize = 63;

/// A cluster name that cannot be part of a holder identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cluster name {0:?} must be 1 to {MAX_CLUSTER_NAME_CHARS} characters without whitespace, control \
     characters, '/', '#' or '@' (they separate the parts of a holder identity cluster/namespace/pod#nonce@uid)"
)]
pub struct InvalidClusterName(pub String);

/// The one check of a cluster name, wherever one enters: the sidecar's, the
/// operator's and `leasehold inject`'s `--cluster-name` (the chart's
/// `clusterName` reaches all three through `LEASEHOLD_CLUSTER_NAME`). The
/// name becomes the first part of every holder identity, so it may not
/// contain the identity's separators: `a/b` would read back as cluster `a`,
/// namespace `b`.
pub fn parse_cluster_name(name: &str) -> Result<String, InvalidClusterName> {
    match identity_part(name) && name.chars().count() <= MAX_CLUSTER_NAME_CHARS {
        true => Ok(name.to_string()),
        false => Err(InvalidClusterName(name.to_string())),
    }
}

/// Whether `part` can stand in a holder identity: non-empty, without
/// whitespace, control characters or the separators `/`, `#` and `@`.
fn identity_part(part: &str) -> bool {
    !part.is_empty()
        && !part
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '#' | '@'))
}

/// An instant on the store's clock, in nanoseconds since the Unix epoch.
///
/// Only the store produces these; candidates never compare them with their
/// own wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StoreTime(pub i64);

impl StoreTime {
    pub fn saturating_add(self, d: Duration) -> StoreTime {
        StoreTime(self.0.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }

    /// Time from `earlier` to `self`, zero when `earlier` is later.
    pub fn since(self, earlier: StoreTime) -> Duration {
        Duration::from_nanos(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// RFC 3339 rendering with nanoseconds, for logs and JSON.
    pub fn to_rfc3339(self) -> String {
        let secs = self.0.div_euclid(1_000_000_000);
        let nanos = self.0.rem_euclid(1_000_000_000) as u32;
        let t = std::time::UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos);
        humantime::format_rfc3339_nanos(t).to_string()
    }
}

/// The fencing token, handed out by the store at each acquisition (Spanner:
/// the commit timestamp in nanoseconds since the epoch; PostgreSQL: a
/// sequence started at the server's clock in nanoseconds; Redis: a per-lock
/// counter following the server's clock in microseconds). Only its order
/// means anything: it strictly increases across terms, so a downstream
/// system that accepts only tokens >= the highest it has seen rejects a
/// deposed leader's late writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub i64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Who a candidate is: unique per process run, so a restarted container never
/// inherits a lease it cannot prove it holds (S12). Inside a pod it also
/// carries the pod's UID, the same for every process run of one pod and
/// different for every pod (even one of the same name): a later process of
/// the same pod can take its pod's lease over by check-and-set
/// ([`succeeds`](Self::succeeds)) instead of waiting for it to expire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    cluster: Option<String>,
    namespace: Option<String>,
    name: String,
    nonce: String,
    pod_uid: Option<String>,
}

/// A pod UID that cannot be part of a holder identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod UID {0:?} must be non-empty, without whitespace, control characters, '/', '#' or '@'")]
pub struct InvalidPodUid(pub String);

impl Identity {
    /// A new identity with a fresh random nonce.
    pub fn new(cluster: Option<String>, namespace: Option<String>, name: impl Into<String>) -> Self {
        let nonce = format!("{:08x}", rand::random::<u32>());
        Identity {
            cluster,
            namespace,
            name: name.into(),
            nonce,
            pod_uid: None,
        }
    }

    /// This identity as a process of the pod with UID `uid` (downward API,
    /// `metadata.uid`). The holder string carries it as `…#nonce@uid`;
    /// holders without it (written by earlier leasehold versions, or outside
    /// Kubernetes) are never taken over.
    pub fn in_pod(mut self, uid: &str) -> Result<Self, InvalidPodUid> {
        check_pod_uid(uid)?;
        self.pod_uid = Some(uid.to_string());
        Ok(self)
    }

    /// The pod UID a holder string carries (`…#nonce@uid`), if any: what a
    /// reservation is judged against.
    pub fn pod_uid_of(holder: &str) -> Option<String> {
        holder.parse::<Identity>().ok().and_then(|identity| identity.pod_uid)
    }

    /// An identity with a chosen nonce, for deterministic simulations.
    pub fn with_nonce(name: impl Into<String>, nonce: impl Into<String>) -> Self {
        Identity {
            cluster: None,
            namespace: None,
            name: name.into(),
            nonce: nonce.into(),
            pod_uid: None,
        }
    }

    /// The candidate's name without cluster, namespace or nonce (the pod name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pod UID this identity carries (`…#nonce@uid`), if any.
    pub fn pod_uid(&self) -> Option<&str> {
        self.pod_uid.as_deref()
    }

    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The cluster this identity names when it is certainly not `ours`:
    /// both sides name their cluster and the names differ (issue 37). Where
    /// either side has no name, nothing is certain.
    pub fn cluster_other_than(&self, ours: Option<&str>) -> Option<&str> {
        let theirs = self.cluster()?;
        ours.is_some_and(|ours| ours != theirs).then_some(theirs)
    }

    /// Whether `holder` is an earlier process run of this candidate's pod:
    /// the same cluster, namespace, pod name and pod UID, another nonce.
    /// Such a holder is gone: one pod runs one leasehold process per lease,
    /// and the kubelet starts a container again only after its previous run
    /// has exited (README, "Acting as leader safely"). A pod UID is never
    /// reused, so a new pod of the same name (a StatefulSet's) never
    /// matches, and neither does a holder without a UID.
    pub fn succeeds(&self, holder: &str) -> bool {
        let Some(uid) = &self.pod_uid else { return false };
        holder.parse::<Identity>().is_ok_and(|earlier| {
            earlier.pod_uid.as_ref() == Some(uid)
                && earlier.nonce != self.nonce
                && (&earlier.cluster, &earlier.namespace, &earlier.name) == (&self.cluster, &self.namespace, &self.name)
        })
    }
}

/// The one check of a pod UID, wherever one enters (an identity, a handoff).
fn check_pod_uid(uid: &str) -> Result<(), InvalidPodUid> {
    match identity_part(uid) {
        true => Ok(()),
        false => Err(InvalidPodUid(uid.to_string())),
    }
}

/// A holder string that is not `[[cluster/]namespace/]name#nonce[@uid]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("holder {0:?} is not an identity of the form [[cluster/]namespace/]name#nonce[@uid]")]
pub struct InvalidIdentity(pub String);

impl std::str::FromStr for Identity {
    type Err = InvalidIdentity;

    /// The inverse of `Display`. Two slash-separated parts are namespace and
    /// name, three are cluster, namespace and name; `@uid` after the nonce is
    /// the pod UID. (Readers that predate the UID take `nonce@uid` for the
    /// nonce, so they still find the pod name.)
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidIdentity(text.to_string());
        let (path, run) = text.rsplit_once('#').ok_or_else(invalid)?;
        let (nonce, pod_uid) = match run.split_once('@') {
            Some((nonce, uid)) if !uid.is_empty() && !uid.contains('@') => (nonce, Some(uid.to_string())),
            Some(_) => return Err(invalid()),
            None => (run, None),
        };
        let mut parts = path.rsplitn(3, '/');
        let name = parts.next().filter(|n| !n.is_empty()).ok_or_else(invalid)?;
        let namespace = parts.next().map(str::to_string);
        let cluster = parts.next().map(str::to_string);
        if nonce.is_empty()
            || [&namespace, &cluster]
                .into_iter()
                .flatten()
                .any(|p| p.is_empty() || p.contains('/'))
        {
            return Err(invalid());
        }
        Ok(Identity {
            cluster,
            namespace,
            name: name.to_string(),
            nonce: nonce.to_string(),
            pod_uid,
        })
    }
}

impl fmt::Display for Identity {
    /// `cluster/namespace/pod#nonce@uid`, leaving out absent parts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in [&self.cluster, &self.namespace].into_iter().flatten() {
            write!(f, "{part}/")?;
        }
        write!(f, "{}#{}", self.name, self.nonce)?;
        match &self.pod_uid {
            Some(uid) => write!(f, "@{uid}"),
            None => Ok(()),
        }
    }
}

/// The lease as one holder holds it: what a takeover names, so that the
/// store replaces exactly that holder's term and nobody else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    pub holder: &'a str,
    pub token: FencingToken,
}

/// A released row kept for one pod until a store time: written by a
/// transfer's release, judged by every acquire (docs/design.md, "Transfer").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The pod UID that alone may acquire while the reservation lasts.
    pub pod_uid: String,
    /// The store time from which anyone may acquire again.
    pub until: StoreTime,
}

impl Reservation {
    /// Why an acquire it keeps out is refused.
    pub fn refusal(&self) -> String {
        format!(
            "reserved for pod {} until {} (a transfer)",
            self.pod_uid,
            self.until.to_rfc3339()
        )
    }
}

/// Why a term ended, as the write that ended it records it in the store
/// (docs/design.md, "Leadership history"): the releasing check-and-set
/// writes its own reason, an acquire writes `Expired` for a term nobody
/// ended, and a takeover by a restarted sidecar of the same pod writes
/// `Restarted`. The text ([`EndReason::as_str`]) is what every store keeps
/// and the metric's `reason` label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Released on purpose with no more specific cause (the process shut
    /// down, or its host stopped the campaign).
    #[default]
    Released,
    /// Not renewed within the lease duration, by the store's clock: written
    /// by the acquire that took the row after it.
    Expired,
    /// Released with a reservation for a transfer's target.
    Transferred,
    /// Stood aside for another candidate: a preferred candidate (a
    /// transfer the operator asked for) or a rollout's version preference.
    Preempted,
    /// Taken over by a restarted sidecar of the same pod (written by its
    /// takeover, [`Identity::succeeds`]).
    Restarted,
    /// The pod was being deleted.
    PodTerminating,
    /// The app's health sources said it was unhealthy.
    AppUnhealthy,
}

impl EndReason {
    pub const ALL: [EndReason; 7] = [
        EndReason::Released,
        EndReason::Expired,
        EndReason::Transferred,
        EndReason::Preempted,
        EndReason::Restarted,
        EndReason::PodTerminating,
        EndReason::AppUnhealthy,
    ];

    /// The text stores keep and metrics label with.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Released => "released",
            EndReason::Expired => "expired",
            EndReason::Transferred => "transferred",
            EndReason::Preempted => "preempted",
            EndReason::Restarted => "restarted",
            EndReason::PodTerminating => "pod_terminating",
            EndReason::AppUnhealthy => "app_unhealthy",
        }
    }

    /// The reason a store's text names; `None` for text this version does
    /// not know (a newer sidecar's reason), which folds as a record without
    /// a reason does.
    pub fn parse(text: &str) -> Option<EndReason> {
        EndReason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// The end a write recorded for one term. It stays in the row after the
/// next acquire (which records the end of the term it replaces only when
/// nobody did), so a reader that missed the term still learns why it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub term: u64,
    pub reason: EndReason,
}

impl Ended {
    /// The store's columns (`ended_term`, `ended`) as read: a term without
    /// a reason this version knows is no end.
    pub fn from_columns(term: Option<u64>, reason: Option<&str>) -> Option<Ended> {
        Some(Ended {
            term: term?,
            reason: EndReason::parse(reason?)?,
        })
    }
}

/// How a holder's release ends its term: the reason it records, and for a
/// transfer the reservation it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub reason: EndReason,
    pub handoff: Option<Handoff>,
}

impl Release {
    /// A release without a reservation.
    pub fn because(reason: EndReason) -> Self {
        Release { reason, handoff: None }
    }

    /// A transfer's release: [`EndReason::Transferred`], or
    /// [`EndReason::Preempted`] when a preferred candidate asked for it.
    pub fn handing_over(handoff: Handoff, preempted: bool) -> Self {
        let reason = match preempted {
            true => EndReason::Preempted,
            false => EndReason::Transferred,
        };
        Release {
            reason,
            handoff: Some(handoff),
        }
    }
}

/// What a release reserves the row for: one pod, for a window the store
/// caps at the row's lease duration, so a reservation never outlasts D.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pod_uid: String,
    window_ms: i64,
}

/// A handoff that cannot be written, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHandoff {
    #[error("the transfer target's pod UID is not usable")]
    PodUid(#[source] InvalidPodUid),
    #[error("the reservation window is not usable")]
    Window(#[source] super::timing::LeaseDurationError),
}

impl Handoff {
    /// A reservation for the pod with UID `pod_uid` for `window` (checked
    /// as a lease duration is: whole milliseconds, within the lease range).
    pub fn new(pod_uid: &str, window: Duration) -> Result<Self, InvalidHandoff> {
        check_pod_uid(pod_uid).map_err(InvalidHandoff::PodUid)?;
        let window_ms = super::timing::lease_to_millis("reservation window", window).map_err(InvalidHandoff::Window)?;
        Ok(Handoff {
            pod_uid: pod_uid.to_string(),
            window_ms,
        })
    }

    pub fn pod_uid(&self) -> &str {
        &self.pod_uid
    }

    /// The window asked for, in milliseconds; the store writes at most the
    /// row's lease duration of it.
    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// The reservation a release committed at `commit` writes on a row whose
    /// lease duration is `lease`: the window, capped at `lease`.
    pub fn reservation(&self, commit: StoreTime, lease: Duration) -> Reservation {
        Reservation {
            pod_uid: self.pod_uid.clone(),
            until: commit.saturating_add(self.window_within(lease)),
        }
    }

    /// The window a row whose lease duration is `lease` is reserved for:
    /// the one asked for, capped at `lease`.
    pub fn window_within(&self, lease: Duration) -> Duration {
        Duration::from_millis(self.window_ms.unsigned_abs()).min(lease)
    }
}

/// One lock's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub name: String,
    /// `None` when free.
    pub holder: Option<String>,
    /// +1 on every acquisition, never reset.
    pub term: u64,
    /// Commit timestamp of the acquisition of the current (or last) term.
    pub token: Option<FencingToken>,
    /// Commit timestamp of the last acquisition or renewal.
    pub renewed_at: Option<StoreTime>,
    /// The holder's lease duration; everyone judges expiry by it.
    pub lease_duration: Duration,
    /// The version the current (or last) holder recorded when it acquired;
    /// kept on release, like the term, so the version fence remembers it.
    pub version: Option<Version>,
    /// Set by a transfer's release; cleared by the next acquire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
    /// The last end a write recorded: the release of this term, or the end
    /// of the term before it as the acquire recorded it. Absent in rows only
    /// older sidecars wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
}

impl LeaseRecord {
    /// What an acquire of this row records as ended: the end already
    /// written for its term, or else `Expired` (an acquire succeeds only on
    /// a released or an expired term, and a release writes its end). Rows
    /// of older sidecars write no ends, so a term one of them released
    /// reads `Expired` once a newer sidecar acquires after it.
    pub fn ended_by_acquire(&self) -> Option<Ended> {
        match self.ended {
            Some(ended) if ended.term == self.term => Some(ended),
            _ if self.term == 0 => self.ended,
            _ => Some(Ended {
                term: self.term,
                reason: EndReason::Expired,
            }),
        }
    }

    /// The reservation that keeps `claimant` from acquiring at store time
    /// `now`: one still in force for a pod UID other than the claimant's.
    /// A claimant without a pod UID never matches one.
    pub fn reserved_against(&self, claimant: &str, now: StoreTime) -> Option<&Reservation> {
        self.reservation
            .as_ref()
            .filter(|r| now < r.until && Identity::pod_uid_of(claimant).as_deref() != Some(r.pod_uid.as_str()))
    }

    /// Why `claimant` may not acquire because of the reservation, if so.
    pub fn reservation_refuses(&self, claimant: &str, now: StoreTime) -> Option<String> {
        self.reserved_against(claimant, now).map(Reservation::refusal)
    }

    /// The store time at which the lease ends, if it is held.
    pub fn expires_at(&self) -> Option<StoreTime> {
        match (&self.holder, self.renewed_at) {
            (Some(_), Some(renewed)) => Some(renewed.saturating_add(self.lease_duration)),
            _ => None,
        }
    }

    /// The holder whose lease is still valid at store time `now`, if any.
    pub fn live_holder(&self, now: StoreTime) -> Option<&str> {
        match self.expires_at() {
            Some(end) if now <= end => self.holder.as_deref(),
            _ => None,
        }
    }
}

/// What `observe` returns: the row (absent when the lock was never taken) and
/// the store's clock at the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub record: Option<LeaseRecord>,
    pub now: StoreTime,
}

impl Observation {
    /// The holder of a still-valid lease, judged by the store's clock.
    pub fn live_holder(&self) -> Option<&str> {
        self.record.as_ref().and_then(|r| r.live_holder(self.now))
    }

    /// How long the current lease has left by the store's clock.
    pub fn remaining(&self) -> Option<Duration> {
        let end = self.record.as_ref()?.expires_at()?;
        (self.now <= end).then(|| end.since(self.now))
    }
}

/// What a successful acquire or renew returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub term: u64,
    pub token: FencingToken,
    /// The commit timestamp of this acquire or renew.
    pub committed_at: StoreTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, renewed_at: i64, lease_ms: u64) -> LeaseRecord {
        LeaseRecord {
            name: "lock".into(),
            holder: holder.map(Into::into),
            term: 1,
            token: Some(FencingToken(renewed_at)),
            renewed_at: Some(StoreTime(renewed_at)),
            lease_duration: Duration::from_millis(lease_ms),
            version: None,
            reservation: None,
            ended: None,
        }
    }

    #[test]
    fn expiry_is_judged_by_the_store_time_given() {
        let r = record(Some("a"), 1_000_000_000, 10_000);
        assert_eq!(r.live_holder(StoreTime(1_000_000_000)), Some("a"));
        assert_eq!(r.live_holder(StoreTime(11_000_000_000)), Some("a"));
        assert_eq!(r.live_holder(StoreTime(11_000_000_001)), None);
    }

    #[test]
    fn a_free_row_has_no_holder_and_no_expiry() {
        let r = record(None, 5, 10_000);
        assert_eq!(r.expires_at(), None);
        assert_eq!(r.live_holder(StoreTime(5)), None);
    }

    #[test]
    fn remaining_counts_down_on_the_store_clock() {
        let obs = Observation {
            record: Some(record(Some("a"), 0, 10_000)),
            now: StoreTime(4_000_000_000),
        };
        assert_eq!(obs.remaining(), Some(Duration::from_secs(6)));
        assert_eq!(obs.live_holder(), Some("a"));
    }

    #[test]
    fn identity_renders_all_parts_and_nonces_differ() {
        let a = Identity::new(Some("eu".into()), Some("prod".into()), "pod-0");
        let b = Identity::new(Some("eu".into()), Some("prod".into()), "pod-0");
        assert!(a.to_string().starts_with("eu/prod/pod-0#"));
        assert_ne!(a, b, "two process runs of the same pod must not share an identity");
        assert_eq!(Identity::with_nonce("p", "n").to_string(), "p#n");
    }

    #[test]
    fn identity_parses_what_it_renders() {
        for identity in [
            Identity::new(Some("eu".into()), Some("prod".into()), "pod-0"),
            Identity::new(None, Some("prod".into()), "pod-0"),
            Identity::with_nonce("pod-0", "n1"),
        ] {
            let parsed: Identity = identity.to_string().parse().unwrap();
            assert_eq!(parsed, identity);
        }
        let parsed: Identity = "eu/prod/web-0#ab".parse().unwrap();
        assert_eq!(
            (parsed.cluster(), parsed.namespace(), parsed.name()),
            (Some("eu"), Some("prod"), "web-0")
        );
        for bad in [
            "",
            "web-0",
            "web-0#",
            "#n",
            "prod/#n",
            "/web-0#n",
            "a/b/c/d#n",
            "web-0#n@",
            "web-0#n@u@v",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn the_pod_uid_rides_after_the_nonce_and_round_trips() {
        let identity = Identity::new(None, Some("prod".into()), "web-0")
            .in_pod("6f1c0a52-3b7e-4d7a-9d51-1f0e2b9c4a10")
            .unwrap();
        let text = identity.to_string();
        assert!(
            text.starts_with("prod/web-0#") && text.ends_with("@6f1c0a52-3b7e-4d7a-9d51-1f0e2b9c4a10"),
            "{text}"
        );
        assert_eq!(text.parse::<Identity>().unwrap(), identity);
        // What a reader before the UID does with it: the pod name is still found.
        let (path, _) = text.rsplit_once('#').unwrap();
        assert_eq!(path.rsplit('/').next(), Some("web-0"));
        for bad in ["", "a b", "a/b", "a#b", "a@b", "a\nb"] {
            let err = Identity::new(None, None, "p").in_pod(bad).unwrap_err();
            assert_eq!(err, InvalidPodUid(bad.to_string()));
        }
    }

    #[test]
    fn only_an_earlier_run_of_the_same_pod_is_succeeded() {
        let pod = |name: &str, uid: &str| {
            Identity::new(Some("eu".into()), Some("prod".into()), name)
                .in_pod(uid)
                .unwrap()
        };
        let me = pod("web-0", "uid-1");
        let earlier = pod("web-0", "uid-1").to_string();
        assert!(me.succeeds(&earlier), "a restarted process of the same pod");
        assert!(!me.succeeds(&me.to_string()), "not itself: that is its own lease");
        let others = [
            pod("web-0", "uid-2").to_string(),
            pod("web-1", "uid-1").to_string(),
            Identity::new(Some("us".into()), Some("prod".into()), "web-0")
                .in_pod("uid-1")
                .unwrap()
                .to_string(),
            Identity::new(Some("eu".into()), Some("dev".into()), "web-0")
                .in_pod("uid-1")
                .unwrap()
                .to_string(),
            Identity::new(Some("eu".into()), Some("prod".into()), "web-0").to_string(),
            "client-go-holder".to_string(),
        ];
        for other in others {
            assert!(!me.succeeds(&other), "{other} is another holder");
        }
        let outside = Identity::new(Some("eu".into()), Some("prod".into()), "web-0");
        assert!(!outside.succeeds(&earlier), "without a UID nothing is taken over");
    }

    #[test]
    fn a_reservation_keeps_out_every_other_claimant_until_it_ends() {
        let handoff = Handoff::new("uid-1", Duration::from_secs(60)).unwrap();
        let mut row = record(None, 0, 10_000);
        row.reservation = Some(handoff.reservation(StoreTime(0), row.lease_duration));
        let until = StoreTime(10_000_000_000);
        assert_eq!(row.reservation.as_ref().unwrap().until, until, "capped at the lease");
        let inside = StoreTime(until.0 - 1);
        assert_eq!(row.reserved_against("prod/web-1#n@uid-1", inside), None, "its pod");
        for other in ["prod/web-2#n@uid-2", "prod/web-1#n", "client-go-holder"] {
            let refusal = row.reservation_refuses(other, inside).unwrap();
            assert!(
                refusal.starts_with("reserved for pod uid-1 until "),
                "{other}: {refusal}"
            );
        }
        assert_eq!(
            row.reserved_against("prod/web-2#n@uid-2", until),
            None,
            "over at its end"
        );
        assert_eq!(handoff.window_within(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(handoff.window_within(Duration::from_secs(90)), Duration::from_secs(60));
    }

    #[test]
    fn a_handoff_names_what_is_wrong_with_it() {
        let uid = Handoff::new("a/b", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(uid, InvalidHandoff::PodUid(_)), "{uid:?}");
        assert!(
            crate::errors::chain(&uid).contains("\"a/b\" must be non-empty"),
            "{uid}"
        );
        for window in [Duration::ZERO, Duration::from_micros(1500)] {
            let err = Handoff::new("uid", window).unwrap_err();
            assert!(crate::errors::chain(&err).contains("reservation window"), "{err}");
        }
    }

    #[test]
    fn store_time_renders_as_rfc3339() {
        assert_eq!(StoreTime(1_500_000_000).to_rfc3339(), "1970-01-01T00:00:01.500000000Z");
    }

    #[test]
    fn lock_names_are_checked_naming_the_field() {
        validate_lock_name("--lock", "prod/web").unwrap();
        validate_lock_name("--lock", &"x".repeat(MAX_LOCK_NAME_BYTES)).unwrap();
        let cases = [
            ("", "--lock must not be empty"),
            ("  ", "--lock must not be empty"),
            (
                &*"x".repeat(MAX_LOCK_NAME_BYTES + 1),
                "--lock is 513 bytes long; at most 512",
            ),
            ("a\nb", "--lock must not contain control characters"),
            (" web", "--lock must not start or end with whitespace"),
        ];
        for (name, expected) in cases {
            let err = validate_lock_name("--lock", name).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{name:?}: got {err:?}, want {expected:?}");
        }
    }
}
