//! The Kubernetes store: one `coordination.k8s.io/v1` Lease per lock in a
//! namespace, so that electing needs nothing but the cluster.
//!
//! * **Check-and-set.** Every write that grants is a replace carrying the
//!   `resourceVersion` it was judged on (an absent Lease is first created
//!   without a holder); of two racing writers
//!   the API server lets one through and answers 409 Conflict to the other
//!   ([`StoreError::Lost`]). A write whose reply never came (timeout, reset
//!   after sending, a 5xx) is [`StoreError::OutcomeUnknown`], never success.
//! * **Expiry by observed change**, as client-go's `tryAcquireOrRenew` does
//!   (`observedTime`: "a client observes timestamps captured locally to infer
//!   the state of the leader election", `tools/leaderelection/doc.go`): a
//!   Lease is expired when its `resourceVersion` has not changed for D on
//!   *this process's monotonic clock* since this process first saw that
//!   version. `renewTime` is written for people and never read, so no two
//!   clocks are ever compared. The store's "clock" in [`Observation::now`] is
//!   that monotonic clock, shown as wall time from the store's start.
//!   Safe when clock *rates* differ by less than (D − R)/(D + R): 20 % at the
//!   default 15 s/10 s (docs/design.md, "The Kubernetes store").
//! * **Fencing tokens from resource versions.** An acquisition's token is the
//!   `resourceVersion` its check-and-set was judged on (for an absent Lease:
//!   the version of the holderless Lease it created, not of an earlier read,
//!   which a slow create could land after a deletion and repeat).
//!   Resource versions of one resource strictly increase with every write,
//!   deletes and re-creates included (KEP-5504, comparable resource versions,
//!   GA in 1.35), and the write that grants a token gets a version above it,
//!   so every later acquisition is judged on a version above every token
//!   granted before: tokens strictly increase across deletion, re-creation
//!   and hand edits. The token annotation only says which token the holder
//!   has (for its check-and-set and for readers); it never feeds the next
//!   token, so a hand edit of it cannot move tokens back. Assumes the
//!   cluster's etcd revision never goes back (restoring a snapshot without
//!   `--bump-revision` would break it, as it breaks watches).
//! * **Followers watch.** [`LeaseStore::observe_followed`] answers from a
//!   watch of the Lease and [`LeaseStore::changed`] wakes the elector on the
//!   next event: no request per retry period while the lease is held, and a
//!   release is seen at once.
//! * **Takeover.** A restarted sidecar resumes its own pod's lease by a
//!   replace of the Lease it finds held by exactly the holder and token it
//!   names, carrying that Lease's `resourceVersion`: a new term whose token
//!   (that version) is above the replaced holder's.
//! * **Names.** A lock that is a DNS subdomain (at most 253 of `a-z0-9.-`) is
//!   the Lease's name as is; any other lock becomes its lowercased, sanitised
//!   text (at most 200 characters) plus `-` and 10 hex digits of its FNV-1a
//!   64 hash. The lock itself is kept in the Lease's record annotation and
//!   checked on every read, so two locks that map to one name are refused
//!   (`Invalid`), never shared. The Lease has no owner references: nothing
//!   garbage-collects it while it is held.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::debug;

use leasehold_core::lease::clock::{Instant, now};
use leasehold_core::lease::store::Result;
use leasehold_core::lease::{
    Claim, EndReason, Ended, FencingToken, Grant, Held, LeaseRecord, LeaseStore, Observation, Release, Reservation,
    StoreError, StoreTime, Version, lease_to_millis, validate_lock_name,
};

/// The annotation holding the leasehold record of the Lease (JSON).
pub const RECORD_ANNOTATION: &str = "leasehold.dev/record";
/// How long one API call may take before it is abandoned (a write's outcome
/// is then unknown).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sanitised prefix of a hashed Lease name (253 allowed).
const NAME_PREFIX_LEN: usize = 200;

/// Where the Leases are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// `None`: the client's default namespace (in a pod: its own).
    pub namespace: Option<String>,
}

impl KubernetesConfig {
    pub fn new(namespace: Option<String>) -> Self {
        KubernetesConfig { namespace }
    }
}

/// What leasehold keeps in the Lease beside the standard fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    lock: String,
    /// The holder this record speaks for; another `holderIdentity` (a
    /// client-go candidate, a hand edit) means the record is not its.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    term: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<i64>,
    lease_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<Version>,
    /// A transfer's reservation (issue 35): the pod UID that alone may
    /// acquire for `reserved_ms` after the release. No clock is shared, so
    /// like expiry it is judged by observed change: it lasts `reserved_ms`
    /// from when each process first saw this `resourceVersion`, never less
    /// than the writer meant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserved_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserved_ms: Option<u64>,
    /// The last end a write recorded (`LeaseRecord::ended`): its term and
    /// its reason's text, kept as text so a reason a newer sidecar wrote
    /// reads as none instead of failing the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_term: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended: Option<String>,
}

/// The Lease name of `lock` (module docs, "Names").
pub fn lease_name(lock: &str) -> String {
    if is_dns_subdomain(lock) {
        return lock.to_string();
    }
    let mut text = String::with_capacity(NAME_PREFIX_LEN);
    for c in lock.chars().flat_map(char::to_lowercase) {
        if text.len() >= NAME_PREFIX_LEN {
            break;
        }
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && (text.is_empty() || text.ends_with('-'))) {
            text.push(c);
        }
    }
    let hash = leasehold_core::lease::fnv1a_64(lock.as_bytes());
    let hash = format!("{:010x}", hash >> 24);
    match text.trim_end_matches('-') {
        "" => format!("lock-{hash}"),
        text => format!("{text}-{hash}"),
    }
}

/// RFC 1123 subdomain, as the API server checks object names.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A resource version as the number KEP-5504 makes it.
fn resource_version(meta: &ObjectMeta) -> Result<u64> {
    let text = meta.resource_version.as_deref().unwrap_or_default();
    parse_resource_version(text)
}

fn parse_resource_version(text: &str) -> Result<u64> {
    text.parse::<u64>().ok().filter(|v| *v > 0).ok_or_else(|| {
        StoreError::invalid(format!(
            "resourceVersion {text:?} is not a positive integer: this API server predates comparable \
             resource versions (Kubernetes 1.35), which the Kubernetes store's tokens rest on"
        ))
    })
}

/// What this process has seen of one Lease.
#[derive(Debug, Clone)]
enum Seen {
    Unknown,
    /// Absent as of a read at least as new as `after` (0: any).
    Absent {
        after: u64,
    },
    /// `at`: when this process first saw `version` (client-go's observedTime).
    Present {
        lease: Box<Lease>,
        version: u64,
        at: Instant,
    },
}

impl Seen {
    fn version(&self) -> Option<u64> {
        match self {
            Seen::Unknown => None,
            Seen::Absent { after } => Some(*after),
            Seen::Present { version, .. } => Some(*version),
        }
    }
}

/// One lock's view, shared by every caller of this store.
struct LockView {
    name: String,
    seen: Mutex<Seen>,
    /// Bumped on every change of `seen`; [`LeaseStore::changed`] waits on it.
    changes: watch::Sender<u64>,
    /// The watch of the Lease, started by the first follower.
    watching: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl LockView {
    /// Takes a newer view; an older one (a watch event behind a read or our
    /// own write) is dropped, and a version seen before keeps its time.
    fn learn(&self, lease: Option<Lease>, at: Instant) -> Result<Seen> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let known = seen.version();
        let next = match lease {
            Some(lease) => {
                let version = resource_version(&lease.metadata)?;
                match &*seen {
                    Seen::Present { version: v, .. } if *v == version => return Ok(seen.clone()),
                    _ if known.is_some_and(|k| k >= version) => return Ok(seen.clone()),
                    _ => Seen::Present {
                        lease: Box::new(lease),
                        version,
                        at,
                    },
                }
            }
            None => Seen::Absent {
                after: known.unwrap_or(0),
            },
        };
        *seen = next.clone();
        drop(seen);
        self.changes.send_modify(|n| *n += 1);
        Ok(next)
    }

    /// A deletion the watch reported, at the version the API server stamped on it.
    fn deleted(&self, version: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.version().is_none_or(|k| k < version) {
            *seen = Seen::Absent { after: version };
            drop(seen);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    fn current(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What replaces the check-and-set write of a Lease when set: the one seam
/// for test support (the conformance suite's planted bug, the integration
/// tests' `support::cluster::with_unconditional_writes`), a deliberate
/// hidden API like `lease::seams`. The product never sets it.
#[doc(hidden)]
pub type ReplaceHook =
    Arc<dyn Fn(Api<Lease>, String, Lease) -> BoxFuture<'static, std::result::Result<Lease, kube::Error>> + Send + Sync>;

/// The view of the Lease called `name`, if some lock asked about it.
fn lookup(views: &Mutex<HashMap<String, Arc<LockView>>>, name: &str) -> Option<Arc<LockView>> {
    views.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
}

/// Who a [`Seen`] says holds the Lease.
fn holder_of(seen: &Seen) -> Option<String> {
    match seen {
        Seen::Present { lease, .. } => lease.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        _ => None,
    }
}

/// The store; cheap to share (`Arc`), one watch per followed lock.
pub struct KubernetesStore {
    api: Api<Lease>,
    namespace: String,
    call_timeout: Duration,
    /// Maps the monotonic clock to [`StoreTime`] for display: wall time at start.
    start: (Instant, i64),
    locks: Mutex<HashMap<String, Arc<LockView>>>,
    /// The same views by Lease name, for the namespace watch's events.
    by_name: Arc<Mutex<HashMap<String, Arc<LockView>>>>,
    /// API calls sent (reads and writes; the watches' streams aside).
    requests: AtomicU64,
    /// The operator's watch of every Lease in the namespace, when on.
    namespace_watch: Option<NamespaceWatch>,
    /// Test support's seam, see [`ReplaceHook`].
    replace_hook: Option<ReplaceHook>,
}

/// One watch of every Lease in the namespace (the operator's, issue 39):
/// [`LeaseStore::observe_many`] answers from it, so observing N locks costs
/// no request at rest, and a holder change is announced at once
/// ([`LeaseStore::changed_any`]). The API server sends each Lease's changes
/// in resourceVersion order on one watch (Kubernetes docs, "Efficient
/// detection of changes"), and kube's watcher relists after an expired
/// version ("410 Gone"), so the cache converges on what etcd holds.
struct NamespaceWatch {
    leases: reflector::Store<Lease>,
    /// False from a watch error until the next event: a store the operator
    /// cannot watch is unavailable, not frozen at its last state.
    healthy: Arc<AtomicBool>,
    /// Why the watch last failed, for the error that says it is unavailable
    /// (e.g. the API server's 403 when the operator's Role is missing).
    failure: Arc<Mutex<Option<String>>>,
    /// Bumped when a watched Lease's holder changes or it is deleted.
    holders: watch::Sender<u64>,
    _task: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for KubernetesStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// How a failed API call is reported: a read that failed changed nothing; a
/// write whose answer is not a refusal may have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Read,
    Write,
}

impl KubernetesStore {
    /// The in-cluster (or `KUBECONFIG`) client, Leases in `config.namespace`.
    pub async fn connect(config: KubernetesConfig) -> Result<Self> {
        let client = Client::try_default().await.map_err(|e| {
            StoreError::unavailable("no Kubernetes client (in-cluster or KUBECONFIG)")
                .caused_by(crate::api::errors::KubeCause::of(&e))
        })?;
        Ok(Self::new(client, config.namespace.as_deref()))
    }

    /// Leases in `namespace` (`None`: the client's default namespace).
    pub fn new(client: Client, namespace: Option<&str>) -> Self {
        let namespace = namespace.map_or_else(|| client.default_namespace().to_string(), str::to_string);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        KubernetesStore {
            api: Api::namespaced(client, &namespace),
            namespace,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            start: (now(), wall),
            locks: Mutex::default(),
            by_name: Arc::default(),
            requests: AtomicU64::new(0),
            namespace_watch: None,
            replace_hook: None,
        }
    }

    /// Test support's seam: every Lease write goes through `hook` instead of
    /// the check-and-set replace (see [`ReplaceHook`]).
    #[doc(hidden)]
    pub fn replacing_writes_with(mut self, hook: ReplaceHook) -> Self {
        self.replace_hook = Some(hook);
        self
    }

    /// Watches every Lease of the namespace and answers
    /// [`observe_many`](LeaseStore::observe_many) from that watch: what the
    /// operator observes with (RBAC: `list` and `watch` on Leases). Expiry
    /// keeps its meaning: a version unchanged for D since this process
    /// first saw it.
    pub fn watching_namespace(mut self) -> Self {
        let (leases, writer) = reflector::store();
        let healthy = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let holders = watch::channel(0).0;
        let (api, views, up, announce) = (self.api.clone(), self.by_name.clone(), healthy.clone(), holders.clone());
        let failed = failure.clone();
        let (listed, namespace) = (leases.clone(), self.namespace.clone());
        let task = async move {
            let events = watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer);
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                up.store(event.is_ok(), Ordering::Relaxed);
                let learned = match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                        let view = lease.metadata.name.as_ref().and_then(|name| lookup(&views, name));
                        match view {
                            Some(view) => {
                                let before = holder_of(&view.current());
                                view.learn(Some(lease), now()).map(|seen| {
                                    if holder_of(&seen) != before {
                                        announce.send_modify(|n| *n += 1);
                                    }
                                })
                            }
                            None => Ok(()),
                        }
                    }
                    Ok(watcher::Event::Delete(lease)) => {
                        match lease.metadata.name.as_ref().and_then(|name| lookup(&views, name)) {
                            Some(view) => resource_version(&lease.metadata).map(|version| {
                                view.deleted(version);
                                announce.send_modify(|n| *n += 1);
                            }),
                            None => Ok(()),
                        }
                    }
                    // A relist is complete: a Lease deleted while the watch
                    // was down is gone from the cache without a Delete event.
                    Ok(watcher::Event::InitDone) => {
                        let views: Vec<Arc<LockView>> = views
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .values()
                            .cloned()
                            .collect();
                        for view in views {
                            let gone = matches!(view.current(), Seen::Present { .. })
                                && listed
                                    .get(&reflector::ObjectRef::new(&view.name).within(&namespace))
                                    .is_none();
                            if gone && view.learn(None, now()).is_ok() {
                                announce.send_modify(|n| *n += 1);
                            }
                        }
                        Ok(())
                    }
                    Ok(watcher::Event::Init) => Ok(()),
                    Err(e) => {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(crate::api::errors::message(&e));
                        Err(StoreError::unavailable("watching the namespace's Leases")
                            .caused_by(crate::api::errors::KubeCause::of(&e)))
                    }
                };
                if let Err(e) = learned {
                    debug!(error = %e.chain(), "Lease watch; the watcher retries");
                }
            }
        };
        self.namespace_watch = Some(NamespaceWatch {
            leases,
            healthy,
            failure,
            holders,
            _task: AbortOnDropHandle::new(tokio::spawn(task)),
        });
        self
    }

    /// Abandons each API call after `timeout` (default [`DEFAULT_CALL_TIMEOUT`]).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// API calls sent so far (reads and writes; the watches' streams aside).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn store_time(&self, at: Instant) -> StoreTime {
        let since = at.saturating_duration_since(self.start.0);
        StoreTime(
            self.start
                .1
                .saturating_add(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)),
        )
    }

    fn view(&self, lock: &str) -> Result<Arc<LockView>> {
        validate_lock_name("lock", lock).map_err(|e| StoreError::invalid(e.to_string()))?;
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        Ok(locks
            .entry(lock.to_string())
            .or_insert_with(|| {
                let view = Arc::new(LockView {
                    name: lease_name(lock),
                    seen: Mutex::new(Seen::Unknown),
                    changes: watch::channel(0).0,
                    watching: Mutex::new(None),
                });
                (self.by_name.lock().unwrap_or_else(|e| e.into_inner())).insert(view.name.clone(), view.clone());
                view
            })
            .clone())
    }

    /// `locks` from the namespace watch: a lock first asked about is seeded
    /// from the watch's cache, later ones follow its events.
    async fn observe_watched(&self, watching: &NamespaceWatch, locks: &[String]) -> Result<Vec<Observation>> {
        let unavailable = || {
            let failure = watching.failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let why = failure.map_or_else(|| "not listed yet".to_string(), |e| format!("it failed: {e}"));
            StoreError::unavailable(format!("watching the Leases of namespace {}: {why}", self.namespace))
        };
        tokio::time::timeout(self.call_timeout, watching.leases.wait_until_ready())
            .await
            .map_err(|_| unavailable())?
            .map_err(|_| unavailable())?;
        if !watching.healthy.load(Ordering::Relaxed) {
            return Err(unavailable());
        }
        locks
            .iter()
            .map(|lock| {
                let view = self.view(lock)?;
                if matches!(view.current(), Seen::Unknown) {
                    let cached = watching
                        .leases
                        .get(&reflector::ObjectRef::new(&view.name).within(&self.namespace));
                    view.learn(cached.map(|lease| Lease::clone(&lease)), now())?;
                }
                self.observation(lock, &view.current())
            })
            .collect()
    }

    /// One API call, bounded by the call timeout, its failure classified.
    async fn call<T>(
        &self,
        kind: Call,
        what: impl Fn() -> String,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiFailure> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => Err(ApiFailure::Conflict),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Err(ApiFailure::NotFound),
            Ok(Err(e)) => Err(ApiFailure::Failed(self.classify(kind, what(), e))),
            Err(_) => {
                let context = format!("{} got no answer within {:?}", what(), self.call_timeout);
                Err(ApiFailure::Failed(match kind {
                    Call::Read => StoreError::unavailable(context),
                    Call::Write => StoreError::outcome_unknown(context),
                }))
            }
        }
    }

    fn classify(&self, kind: Call, context: String, error: kube::Error) -> StoreError {
        let refused = match &error {
            kube::Error::Api(status) => match status.code {
                403 => {
                    return StoreError::invalid(format!(
                        "{context}: forbidden; candidates need get, list, watch, create and update on \
                         leases.coordination.k8s.io in namespace {} (docs/rbac-sidecar.md), the operator \
                         get (docs/rbac-operator.md)",
                        self.namespace
                    ))
                    .caused_by(crate::api::errors::KubeCause::of(&error));
                }
                400 | 422 => return StoreError::invalid(context).caused_by(crate::api::errors::KubeCause::of(&error)),
                // Throttled or refused before it ran.
                401 | 429 => true,
                // An internal error or timeout of the API server: a write may
                // have reached etcd.
                _ => false,
            },
            _ => false,
        };
        match (kind, refused) {
            (Call::Write, false) => {
                StoreError::outcome_unknown(context).caused_by(crate::api::errors::KubeCause::of(&error))
            }
            _ => StoreError::unavailable(context).caused_by(crate::api::errors::KubeCause::of(&error)),
        }
    }

    /// A consistent read of the Lease (served at least as new as etcd).
    async fn read(&self, view: &LockView) -> Result<Seen> {
        let what = || format!("reading Lease {}/{}", self.namespace, view.name);
        let found = match self.call(Call::Read, what, self.api.get_opt(&view.name)).await {
            Ok(found) => found,
            Err(ApiFailure::Failed(e)) => return Err(e),
            Err(_) => return Err(StoreError::unavailable(what())),
        };
        view.learn(found, now())
    }

    /// The record a [`Seen`] stands for, judged against `lock`.
    fn record(&self, lock: &str, seen: &Seen) -> Result<Option<LeaseRecord>> {
        let Seen::Present { lease, at, .. } = seen else {
            return Ok(None);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        let record = read_record(lease, lock)?;
        // The record speaks for the holder it names; a Lease taken by a
        // client-go candidate or edited by hand keeps stale annotations.
        let ours = record.as_ref().filter(|r| r.holder == holder);
        let lease_duration = match (ours, &holder) {
            (Some(r), _) => Duration::from_millis(r.lease_ms),
            (None, Some(_)) => {
                let seconds = spec.lease_duration_seconds.unwrap_or(0);
                let seconds = u64::try_from(seconds).ok().filter(|s| *s > 0).ok_or_else(|| {
                    StoreError::invalid(format!(
                        "Lease {}/{} is held by {holder:?} with leaseDurationSeconds {seconds}: correct or delete it",
                        self.namespace,
                        lease_name(lock)
                    ))
                })?;
                Duration::from_secs(seconds)
            }
            (None, None) => record
                .as_ref()
                .map_or(Duration::ZERO, |r| Duration::from_millis(r.lease_ms)),
        };
        let term = record.as_ref().map_or_else(
            || u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0),
            |r| r.term,
        );
        let reservation = ours
            .and_then(|r| r.reserved_for.clone().zip(r.reserved_ms))
            .map(|(pod_uid, ms)| Reservation {
                pod_uid,
                until: self.store_time(*at).saturating_add(Duration::from_millis(ms)),
            });
        let ended = record
            .as_ref()
            .and_then(|r| Ended::from_columns(r.ended_term, r.ended.as_deref()));
        Ok(Some(LeaseRecord {
            name: lock.to_string(),
            reservation,
            ended,
            renewed_at: holder.as_ref().map(|_| self.store_time(*at)),
            // A holder the record does not name has no token of ours.
            token: ours.and_then(|r| r.token).map(FencingToken),
            version: ours.and_then(|r| r.version.clone()),
            holder,
            term,
            lease_duration,
        }))
    }

    fn observation(&self, lock: &str, seen: &Seen) -> Result<Observation> {
        Ok(Observation {
            record: self.record(lock, seen)?,
            now: self.store_time(now()),
        })
    }

    /// Starts the watch of `view`'s Lease unless it runs.
    fn follow(&self, view: &Arc<LockView>) {
        let mut watching = view.watching.lock().unwrap_or_else(|e| e.into_inner());
        if watching.is_some() {
            return;
        }
        let (api, target) = (self.api.clone(), Arc::downgrade(view));
        let config = watcher::Config::default().fields(&format!("metadata.name={}", view.name));
        let task = async move {
            let events = watcher(api.clone(), config).default_backoff();
            let mut events = std::pin::pin!(events);
            let mut listed = false;
            while let Some(event) = events.next().await {
                let Some(view) = target.upgrade() else { return };
                let learned =
                    match event {
                        Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                            listed = true;
                            view.learn(Some(lease), now()).map(|_| ())
                        }
                        Ok(watcher::Event::Delete(lease)) => {
                            resource_version(&lease.metadata).map(|version| view.deleted(version))
                        }
                        Ok(watcher::Event::Init) => {
                            listed = false;
                            Ok(())
                        }
                        // Listed and not there: confirm by a read (the list may
                        // predate our own create).
                        Ok(watcher::Event::InitDone) if !listed => match api.get_opt(&view.name).await {
                            Ok(found) => view.learn(found, now()).map(|_| ()),
                            Err(e) => Err(StoreError::unavailable("reading the Lease after a relist")
                                .caused_by(crate::api::errors::KubeCause::of(&e))),
                        },
                        Ok(watcher::Event::InitDone) => Ok(()),
                        Err(e) => Err(StoreError::unavailable("watching the Lease")
                            .caused_by(crate::api::errors::KubeCause::of(&e))),
                    };
                if let Err(e) = learned {
                    debug!(lease = %view.name, error = %e.chain(), "Lease watch; the watcher retries");
                }
            }
        };
        *watching = Some(AbortOnDropHandle::new(tokio::spawn(task)));
    }

    /// The Lease to write: `base` with the spec and record given, carrying
    /// `base`'s resourceVersion (the check-and-set) unless a mutant drops it.
    fn write_body(&self, base: &Lease, spec: LeaseSpec, record: &Record) -> Result<Lease> {
        let mut lease = base.clone();
        let text =
            serde_json::to_string(record).map_err(|e| StoreError::invalid("encoding the lease record").caused_by(e))?;
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(RECORD_ANNOTATION.into(), text);
        lease.metadata.managed_fields = None;
        lease.spec = Some(spec);
        Ok(lease)
    }

    /// Replaces the Lease by check-and-set; the reply is learned.
    async fn replace(&self, view: &LockView, lock: &str, body: &Lease) -> Result<(Lease, Instant)> {
        let what = || format!("writing Lease {}/{}", self.namespace, view.name);
        if let Some(hook) = &self.replace_hook {
            let written = hook(self.api.clone(), view.name.clone(), body.clone())
                .await
                .map_err(|e| StoreError::unavailable(what()).caused_by(crate::api::errors::KubeCause::of(&e)))?;
            let at = now();
            view.learn(Some(written.clone()), at)?;
            return Ok((written, at));
        }
        match self
            .call(
                Call::Write,
                what,
                self.api.replace(&view.name, &PostParams::default(), body),
            )
            .await
        {
            Ok(written) => {
                let at = now();
                view.learn(Some(written.clone()), at)?;
                Ok((written, at))
            }
            Err(ApiFailure::Conflict | ApiFailure::NotFound) => {
                // Someone wrote (or deleted) it since we judged: look again
                // for the next attempt.
                let _ = self.read(view).await;
                Err(lost(lock, "another writer changed the Lease first (409 Conflict)"))
            }
            Err(ApiFailure::Failed(e)) => Err(e),
        }
    }

    /// Writes `claim`'s term `term` with `token` (the resourceVersion the
    /// decision was judged on) over `base`, recording `ended` for the term
    /// it replaces: a replace carrying its resourceVersion when it exists
    /// (`present`), else a create.
    async fn write_term(
        &self,
        (view, lock): (&LockView, &str),
        claim: &Claim<'_>,
        lease: Duration,
        base: Lease,
        (term, token): (u64, u64),
        ended: Option<Ended>,
    ) -> Result<Grant> {
        let lease_ms = lease_to_millis("lease duration", lease).map_err(|e| StoreError::invalid(e.to_string()))?;
        let token = i64::try_from(token).map_err(|_| StoreError::invalid("resourceVersion beyond INT64"))?;
        let record = Record {
            lock: lock.to_string(),
            holder: Some(claim.holder.to_string()),
            term,
            token: Some(token),
            lease_ms: lease_ms as u64,
            version: claim.version.cloned(),
            reserved_for: None,
            reserved_ms: None,
            ended_term: ended.map(|e| e.term),
            ended: ended.map(|e| e.reason.as_str().to_string()),
        };
        let stamp = micro_now();
        let transitions = base.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
        let spec = LeaseSpec {
            holder_identity: Some(claim.holder.to_string()),
            lease_duration_seconds: Some(whole_seconds(lease)),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            lease_transitions: Some(if base.spec.is_some() {
                transitions.saturating_add(1)
            } else {
                0
            }),
            ..base.spec.clone().unwrap_or_default()
        };
        let body = self.write_body(&base, spec, &record)?;
        let (_, at) = self.replace(view, lock, &body).await?;
        Ok(Grant {
            term,
            token: FencingToken(token),
            committed_at: self.store_time(at),
        })
    }

    /// Creates the lock's Lease without a holder, to be taken by a replace.
    /// The create grants nothing, so its unknown outcome is harmless.
    async fn create_unheld(&self, view: &LockView, lock: &str) -> Result<Lease> {
        let body = Lease {
            metadata: ObjectMeta {
                name: Some(view.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let what = || format!("creating Lease {}/{}", self.namespace, view.name);
        match self
            .call(Call::Write, what, self.api.create(&PostParams::default(), &body))
            .await
        {
            Ok(created) => {
                view.learn(Some(created.clone()), now())?;
                Ok(created)
            }
            Err(ApiFailure::Conflict) => {
                let _ = self.read(view).await;
                Err(lost(lock, "another candidate created the Lease first"))
            }
            Err(ApiFailure::NotFound) => Err(StoreError::invalid(format!(
                "namespace {} does not exist",
                self.namespace
            ))),
            Err(ApiFailure::Failed(e)) => Err(e),
        }
    }

    /// The current Lease when `holder` holds it with `token`; read afresh
    /// when our view says otherwise (it may be behind our own last write).
    async fn ours(&self, view: &LockView, lock: &str, holder: &str, token: FencingToken) -> Result<Box<Lease>> {
        let mut seen = view.current();
        for fresh in [false, true] {
            if fresh {
                seen = self.read(view).await?;
            }
            let record = self.record(lock, &seen)?;
            let reason = match (&seen, &record) {
                (Seen::Present { lease, .. }, Some(r))
                    if r.holder.as_deref() == Some(holder) && r.token == Some(token) =>
                {
                    return Ok(lease.clone());
                }
                (_, Some(r)) => match &r.holder {
                    Some(other) if other != holder => format!("held by {other}"),
                    Some(_) => format!("token {token} superseded by {:?}", r.token),
                    None => "released".to_string(),
                },
                (_, None) => "no such lease".to_string(),
            };
            if fresh {
                return Err(lost(lock, &reason));
            }
        }
        unreachable!("the second pass returns")
    }

    /// A check-and-set write of our own Lease (renew, release): on a
    /// conflict, once more from a fresh read if it is still ours (our own
    /// earlier write whose reply was lost, or an edit of other fields).
    async fn rewrite(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        change: impl Fn(&Lease) -> Result<Lease>,
    ) -> Result<(Lease, Instant)> {
        let view = self.view(lock)?;
        let mut attempt = 0;
        loop {
            let current = self.ours(&view, lock, holder, token).await?;
            match self.replace(&view, lock, &change(&current)?).await {
                Err(StoreError::Lost { .. }) if attempt == 0 => attempt += 1,
                other => return other,
            }
        }
    }
}

/// A refusal of the API that the caller turns into its own answer.
enum ApiFailure {
    Conflict,
    NotFound,
    Failed(StoreError),
}

fn lost(lock: &str, reason: &str) -> StoreError {
    StoreError::Lost {
        lock: lock.to_string(),
        reason: reason.to_string(),
    }
}

/// The record annotation of `lease`, refused when it names another lock.
fn read_record(lease: &Lease, lock: &str) -> Result<Option<Record>> {
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    let Some(text) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECORD_ANNOTATION))
    else {
        return Ok(None);
    };
    let record: Record = serde_json::from_str(text).map_err(|e| {
        StoreError::invalid(format!(
            "Lease {name}: annotation {RECORD_ANNOTATION} is not a leasehold record: correct or remove it"
        ))
        .caused_by(e)
    })?;
    if record.lock != lock {
        return Err(StoreError::invalid(format!(
            "Lease {name} holds lock {:?}, not {lock:?}: the two lock names map to one Lease name; rename one",
            record.lock
        )));
    }
    Ok(Some(record))
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `leaseDurationSeconds` for people and client-go readers: D rounded up.
fn whole_seconds(lease: Duration) -> i32 {
    i32::try_from(lease.as_millis().div_ceil(1000)).unwrap_or(i32::MAX)
}

#[async_trait]
impl LeaseStore for KubernetesStore {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    /// Leases need no schema (and no permission beyond the Lease's own).
    async fn ensure_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        let view = self.view(lock)?;
        let seen = self.read(&view).await?;
        self.observation(lock, &seen)
    }

    /// With [`watching_namespace`](KubernetesStore::watching_namespace):
    /// from the watch, no request; otherwise one consistent read per lock.
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        if let Some(watching) = &self.namespace_watch {
            return self.observe_watched(watching, locks).await;
        }
        let mut observed = Vec::with_capacity(locks.len());
        for lock in locks {
            observed.push(self.observe(lock).await?);
        }
        Ok(observed)
    }

    async fn changed_any(&self) {
        match &self.namespace_watch {
            Some(watching) => {
                let _ = watching.holders.subscribe().changed().await;
            }
            None => futures::future::pending().await,
        }
    }

    async fn observe_followed(&self, lock: &str) -> Result<Observation> {
        let view = self.view(lock)?;
        self.follow(&view);
        match view.current() {
            Seen::Unknown => self.observe(lock).await,
            seen => self.observation(lock, &seen),
        }
    }

    async fn changed(&self, lock: &str, seen: &Observation) {
        let Ok(view) = self.view(lock) else {
            return futures::future::pending().await;
        };
        self.follow(&view);
        let mut changes = view.changes.subscribe();
        loop {
            let differs = self
                .record(lock, &view.current())
                .map_or(true, |record| record != seen.record);
            if differs || changes.changed().await.is_err() {
                return;
            }
        }
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        lease_to_millis("lease duration", lease).map_err(|e| StoreError::invalid(e.to_string()))?;
        let view = self.view(lock)?;
        let seen = match view.current() {
            Seen::Unknown => self.read(&view).await?,
            seen => seen,
        };
        let current = self.record(lock, &seen)?;
        if let Some(row) = &current
            && let (Some(holder), Seen::Present { at, .. }) = (&row.holder, &seen)
            && now().saturating_duration_since(at.to_owned()) <= row.lease_duration
        {
            return Err(lost(lock, &format!("held by {holder}")));
        }
        if let Some(why) = claim.fenced_by(current.as_ref().and_then(|r| r.version.as_ref())) {
            return Err(lost(lock, &why));
        }
        let judged_at = self.store_time(now());
        if let Some(why) = current
            .as_ref()
            .and_then(|r| r.reservation_refuses(claim.holder, judged_at))
        {
            return Err(lost(lock, &why));
        }
        let term = current.as_ref().map_or(0, |r| r.term) + 1;
        let (base, token) = match &seen {
            Seen::Present { lease, version, .. } => (Lease::clone(lease), version.to_owned()),
            // Absent: create the Lease without a holder, then take it by a
            // replace carrying the created version, which is the token. A
            // token read before the create (a list's version) could repeat:
            // a slow create landing after the Lease was deleted would grant
            // the token its rival got (the simulation's
            // `create-token-from-list` mutant).
            _ => {
                let created = self.create_unheld(&view, lock).await?;
                let version = resource_version(&created.metadata)?;
                (created, version)
            }
        };
        let ended = current.as_ref().and_then(LeaseRecord::ended_by_acquire);
        self.write_term((&view, lock), claim, lease, base, (term, token), ended)
            .await
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        let view = self.view(lock)?;
        let current = self.ours(&view, lock, from.holder, from.token).await?;
        let record = read_record(&current, lock)?.ok_or_else(|| lost(lock, "no record"))?;
        if let Some(why) = claim.fenced_by(record.version.as_ref()) {
            return Err(lost(lock, &why));
        }
        // The check-and-set is the replace carrying this resourceVersion;
        // the holder's own acquisition wrote a later one than its token.
        let token = resource_version(&current.metadata)?;
        let ended = Ended {
            term: record.term,
            reason: EndReason::Restarted,
        };
        let next = (record.term + 1, token);
        self.write_term((&view, lock), claim, lease, *current, next, Some(ended))
            .await
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        let lease_ms = lease_to_millis("lease duration", lease).map_err(|e| StoreError::invalid(e.to_string()))?;
        let (written, at) = self
            .rewrite(lock, holder, token, |current| {
                let mut record = read_record(current, lock)?.ok_or_else(|| lost(lock, "no record"))?;
                record.lease_ms = lease_ms as u64;
                let spec = LeaseSpec {
                    lease_duration_seconds: Some(whole_seconds(lease)),
                    renew_time: Some(micro_now()),
                    ..current.spec.clone().unwrap_or_default()
                };
                self.write_body(current, spec, &record)
            })
            .await?;
        let term = read_record(&written, lock)?.map_or(0, |r| r.term);
        Ok(Grant {
            term,
            token,
            committed_at: self.store_time(at),
        })
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        let handoff = release.handoff.as_ref();
        self.rewrite(lock, holder, token, |current| {
            let mut record = read_record(current, lock)?.ok_or_else(|| lost(lock, "no record"))?;
            record.holder = None;
            record.ended_term = Some(record.term);
            record.ended = Some(release.reason.as_str().to_string());
            record.reserved_for = handoff.map(|h| h.pod_uid().to_string());
            let lease = Duration::from_millis(record.lease_ms);
            record.reserved_ms = handoff.map(|h| h.window_within(lease).as_millis() as u64);
            let spec = LeaseSpec {
                holder_identity: None,
                renew_time: Some(micro_now()),
                ..current.spec.clone().unwrap_or_default()
            };
            self.write_body(current, spec, &record)
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_are_kept_and_others_hashed_apart() {
        assert_eq!(lease_name("web-scheduler"), "web-scheduler");
        assert_eq!(lease_name("a.b-c"), "a.b-c");
        let mapped = lease_name("prod/Web_Scheduler");
        assert!(mapped.starts_with("prod-web-scheduler-"), "{mapped}");
        assert!(is_dns_subdomain(&mapped), "{mapped}");
        // Locks that sanitise alike still get different names.
        assert_ne!(lease_name("prod/web"), lease_name("prod_web"));
        assert_ne!(lease_name("prod/web"), lease_name("Prod/web"));
        for lock in ["/", "ü", &"x/".repeat(256), "-a-", "A", "a..b"] {
            let name = lease_name(lock);
            assert!(is_dns_subdomain(&name) && name.len() <= 253, "{lock:?} -> {name:?}");
        }
    }

    #[test]
    fn resource_versions_must_be_positive_integers() {
        assert_eq!(parse_resource_version("42").unwrap(), 42);
        for bad in ["", "0", "-1", "abc", "1.5"] {
            let err = parse_resource_version(bad).unwrap_err().to_string();
            assert!(err.contains("is not a positive integer"), "{bad}: {err}");
        }
    }

    /// Issue 39: the operator's namespace watch relists after the API server
    /// expires its resourceVersion ("410 Gone", Kubernetes docs "Efficient
    /// detection of changes"), and a Lease deleted while the watch was down
    /// (no Delete event ever comes) is absent after the relist, with the
    /// change announced. Planted: dropping the `InitDone` sweep in
    /// `watching_namespace` leaves the old holder shown.
    #[tokio::test]
    async fn the_namespace_watch_relists_after_410_gone_and_forgets_a_deleted_lease() {
        use leasehold_testkit::api::{mock_client, status};
        use serde_json::json;

        let (client, mut server) = mock_client("default");
        let store = KubernetesStore::new(client, Some("prod")).watching_namespace();
        let leases = "/apis/coordination.k8s.io/v1/namespaces/prod/leases";
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "web", "namespace": "prod", "resourceVersion": "5"},
            "spec": {"holderIdentity": "prod/web-0", "leaseDurationSeconds": 15}});
        let list = |rv: &str, items: Vec<serde_json::Value>| {
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                   "metadata": {"resourceVersion": rv}, "items": items})
        };
        let wait = Duration::from_secs(10);

        let first = server.expect("the watch lists first").await;
        assert_eq!(
            (first.method.as_str(), first.path.as_str(), first.is_watch()),
            ("GET", leases, false)
        );
        first.respond(200, &list("10", vec![lease]));
        let watch = server.expect("then watches").await;
        assert!(watch.is_watch() && watch.path == leases, "{}", watch.uri);
        let held = tokio::time::timeout(wait, store.observe_many(&["web".to_string()]))
            .await
            .expect("observed within 10 s")
            .unwrap();
        assert_eq!(held[0].live_holder(), Some("prod/web-0"));

        // The watch's version expired; meanwhile the Lease was deleted.
        let mut announced = std::pin::pin!(store.changed_any());
        assert!(
            futures::poll!(announced.as_mut()).is_pending(),
            "subscribed, nothing changed yet"
        );
        let expired = status(410, "Expired", "too old resource version: 10 (20)");
        watch.respond(200, &json!({"type": "ERROR", "object": expired}));
        let relist = tokio::time::timeout(wait, server.expect("a relist after 410 Gone"))
            .await
            .expect("relisted within 10 s");
        assert_eq!(
            (relist.path.as_str(), relist.is_watch()),
            (leases, false),
            "{}",
            relist.uri
        );
        relist.respond(200, &list("20", vec![]));
        tokio::time::timeout(wait, announced)
            .await
            .expect("announced within 10 s");
        let gone = tokio::time::timeout(wait, store.observe_many(&["web".to_string()]))
            .await
            .expect("observed within 10 s")
            .unwrap();
        assert_eq!(gone[0].record, None, "the deleted Lease is absent after the relist");
    }

    /// A namespace watch the API server refuses (the operator's Role there
    /// deleted with its namespace, or never granted) makes the store
    /// unavailable with the refusal named, not a bare "watching". Planted:
    /// dropping the recorded failure from the message fails it.
    #[tokio::test]
    async fn a_refused_namespace_watch_is_unavailable_naming_the_refusal() {
        use leasehold_testkit::api::{mock_client, status};

        let (client, mut server) = mock_client("default");
        let store = KubernetesStore::new(client, Some("prod"))
            .with_call_timeout(Duration::from_secs(2))
            .watching_namespace();
        let refused = server.expect("the watch lists first").await;
        refused.respond(
            403,
            &status(
                403,
                "Forbidden",
                "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:leasehold-system:leasehold\" \
                 cannot list resource \"leases\" in the namespace \"prod\"",
            ),
        );
        // Once the watch has taken the refusal in (no race with the read's timeout).
        let watching = store.namespace_watch.as_ref().unwrap();
        let recorded = async {
            while watching.failure.lock().unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), recorded)
            .await
            .expect("the refusal recorded within 30 s");
        let error = store.observe_many(&["web".to_string()]).await.unwrap_err();
        let text = error.chain();
        assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
        assert!(
            text.starts_with("store unavailable: watching the Leases of namespace prod: it failed: ")
                && text.ends_with("cannot list resource \"leases\" in the namespace \"prod\" (HTTP 403)")
                && !text.contains("Status {"),
            "{text}"
        );
    }

    /// A read the API server refuses is `Invalid`, with the RBAC the
    /// candidates need and the refusal as the API server said it, also
    /// through the core's chain, which knows no kube (the elector logs and
    /// reports it so). Planted: the refusal kept as the bare kube error
    /// prints its Status as Rust `Debug`.
    #[tokio::test]
    async fn a_refused_read_names_the_rbac_and_the_refusal_once() {
        use leasehold_testkit::api::{mock_client, status};

        let (client, mut server) = mock_client("default");
        let store = KubernetesStore::new(client, Some("prod")).with_call_timeout(Duration::from_secs(2));
        let observed = tokio::spawn(async move { store.observe("web").await });
        let read = server.expect("the Lease read").await;
        read.respond(
            403,
            &status(403, "Forbidden", "leases.coordination.k8s.io \"web\" is forbidden"),
        );
        let error = observed.await.unwrap().unwrap_err();
        assert!(matches!(error, StoreError::Invalid { .. }), "{error:?}");
        let text = leasehold_core::errors::chain(&error);
        assert!(
            text.contains("candidates need get, list, watch, create and update")
                && text.ends_with(": leases.coordination.k8s.io \"web\" is forbidden (HTTP 403)")
                && !text.contains("Status {"),
            "{text}"
        );
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_millis(300)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
        assert_eq!(whole_seconds(Duration::from_millis(15_001)), 16);
    }
}
