//! Versions inside Kubernetes (issue 16): what version a candidate pod runs,
//! read from the pod itself, and the peer watch that makes a candidate
//! stand aside while a healthy candidate of the version the lease prefers
//! is live.
//!
//! A pod's version is ordered by its ReplicaSet's
//! `deployment.kubernetes.io/revision` annotation (see `lease::version` for
//! why), and named by its `pod-template-hash` label and the app container's
//! image. `LEASEHOLD_REVISION` and `LEASEHOLD_VERSION` set as literal env
//! values on a container of the pod spec override both, for the pod itself
//! and for every peer reading it. Peers are read, never written: the
//! sidecar's admission policy lets it change only the leader label.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, warn};

use leasehold_core::lease::version::PeerWatch;
use leasehold_core::lease::{ElectorControl, LeaderState, Prefer, Version};
use leasehold_kubernetes::api::contract::{ENV_REVISION, ENV_VERSION, literal_env};

/// Set by the Deployment controller on each ReplicaSet it makes current
/// (kubernetes `pkg/controller/deployment/util/deployment_util.go`,
/// `RevisionAnnotation = "deployment.kubernetes.io/revision"`).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// The label the Deployment controller puts on its ReplicaSets' pods
/// (`apps/v1` `DefaultDeploymentUniqueLabelKey`).
pub(crate) const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// The ReplicaSet that controls the pod, if one does.
pub(crate) fn owning_replica_set(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ReplicaSet" && o.controller == Some(true))
        .map(|o| o.name.as_str())
}

/// `<pod-template-hash>/<image of the app container>`, leaving out what is
/// absent; the first container stands for the app when none is named.
fn default_name(pod: &Pod, app_container: Option<&str>) -> String {
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(TEMPLATE_HASH_LABEL))
        .cloned();
    let app = pod.spec.as_ref().and_then(|spec| match app_container {
        Some(name) => spec.containers.iter().find(|c| c.name == name),
        None => spec.containers.first(),
    });
    let image = app.and_then(|c| c.image.clone());
    [hash, image].into_iter().flatten().collect::<Vec<_>>().join("/")
}

/// The version `pod` runs: the explicit env values when set, else its
/// ReplicaSet's revision (`revision_of` looks it up) and its default name.
/// `None` when no revision can be found: such a candidate is unversioned.
pub(crate) fn pod_version(
    pod: &Pod,
    app_container: Option<&str>,
    revision_of: impl FnOnce(&str) -> Option<u64>,
) -> Option<Version> {
    let explicit = literal_env(pod, ENV_REVISION).and_then(|r| r.trim().parse().ok());
    let revision = explicit.or_else(|| owning_replica_set(pod).and_then(revision_of))?;
    let name = literal_env(pod, ENV_VERSION)
        .map(str::to_string)
        .unwrap_or_else(|| default_name(pod, app_container));
    Some(Version { revision, name })
}

/// A peer that can lead: not being deleted, and its app healthy (the app
/// container ready, or all containers ready when none is named). Readiness
/// of the whole pod is not used: with the readiness gate only the leader is Ready.
fn healthy(pod: &Pod, app_container: Option<&str>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(status) = &pod.status else { return false };
    match app_container {
        Some(name) => status
            .container_statuses
            .iter()
            .flatten()
            .any(|c| c.name == name && c.ready),
        None => status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "ContainersReady" && c.status == "True"),
    }
}

/// ReplicaSet revisions, read once per ReplicaSet and again at the first
/// sight of each of its pods. A rollback makes an old ReplicaSet current
/// with a new revision (kubernetes `pkg/controller/deployment/sync.go`,
/// `getNewReplicaSet`) and scales it up: its new pods bring the new revision
/// to every peer, for all of that ReplicaSet's pods. Read once for good, a
/// peer that had seen the ReplicaSet before would take the rollback's pods
/// for old ones: with `Oldest`, the pods rolled back from would stand aside
/// for them while they stood aside for the pods rolled back from, and
/// nobody would lead.
pub struct Revisions {
    api: Api<ReplicaSet>,
    known: HashMap<String, Option<u64>>,
    /// Pods seen so far, by name.
    pods: HashSet<String>,
}

impl Revisions {
    pub fn new(api: Api<ReplicaSet>) -> Self {
        Revisions {
            api,
            known: HashMap::new(),
            pods: HashSet::new(),
        }
    }

    /// The revision of ReplicaSet `name`; `None` when it has none or cannot
    /// be read (retried at the next call).
    pub async fn of(&mut self, name: &str) -> Option<u64> {
        if let Some(known) = self.known.get(name) {
            return *known;
        }
        match self.api.get_opt(name).await {
            Ok(found) => {
                let revision = found
                    .as_ref()
                    .and_then(|rs| rs.metadata.annotations.as_ref())
                    .and_then(|a| a.get(REVISION_ANNOTATION))
                    .and_then(|r| r.parse().ok());
                self.known.insert(name.to_string(), revision);
                revision
            }
            Err(e) => {
                warn!(replicaset = %name, error = %e, "cannot read the ReplicaSet's revision");
                None
            }
        }
    }

    /// [`pod_version`], looking the revision up.
    pub(crate) async fn version_of(&mut self, pod: &Pod, app_container: Option<&str>) -> Option<Version> {
        let revision = match owning_replica_set(pod) {
            Some(rs) if literal_env(pod, ENV_REVISION).is_none() => {
                if self.pods.insert(pod.metadata.name.clone().unwrap_or_default()) {
                    self.known.remove(rs);
                }
                self.of(rs).await
            }
            _ => None,
        };
        pod_version(pod, app_container, |_| revision)
    }
}

/// This candidate's version inside Kubernetes: what the flags give,
/// completed from its own pod (the revision from its ReplicaSet, the name
/// from its hash and image). Unversioned, with a warning, when no revision
/// can be found after a few tries.
pub(crate) async fn own_version(
    pods: &Api<Pod>,
    revisions: &mut Revisions,
    me: &str,
    app_container: Option<&str>,
    flags: Option<Version>,
) -> Option<Version> {
    if let Some(flags) = flags.as_ref().filter(|v| !v.name.is_empty()) {
        return Some(flags.clone());
    }
    use backon::BackoffBuilder;
    let mut backoff = super::capped_backoff().build();
    for _attempt in 0..5 {
        match pods.get(me).await {
            Ok(pod) => {
                let found = revisions.version_of(&pod, app_container).await;
                let version = match (flags, found) {
                    (Some(flags), _) => Some(Version {
                        revision: flags.revision,
                        name: default_name(&pod, app_container),
                    }),
                    (None, found) => found,
                };
                if version.is_none() {
                    warn!(
                        pod = %me,
                        "no version: the pod has no ReplicaSet with a {REVISION_ANNOTATION} annotation and no \
                         --revision; campaigning unversioned"
                    );
                }
                return version;
            }
            Err(e) => {
                let delay = backoff.next().unwrap_or(super::BACKOFF_CAP);
                warn!(pod = %me, error = %e, retry_in = ?delay, "cannot read our pod for its version");
                tokio::time::sleep(delay).await;
            }
        }
    }
    warn!(pod = %me, "could not read our pod for its version; campaigning unversioned");
    None
}

/// Who follows its peers, and by which rule.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Our pod's name.
    pub me: String,
    /// The candidate pods, as a label selector.
    pub selector: String,
    pub app_container: Option<String>,
    pub mine: Option<Version>,
    pub prefer: Prefer,
    /// The lease's version fence: no standing aside for a peer it refuses.
    pub fence: bool,
}

/// Watches the lock's candidate pods and tells the elector to stand aside
/// while a healthy candidate of the preferred version is live (and, with the
/// fence, could lead: `state` brings the row's recorded version from the
/// elector's reads), and to campaign again when none is. Runs until the
/// watch stream ends or the elector is gone.
pub async fn follow_peers(
    pods: Api<Pod>,
    mut revisions: Revisions,
    candidate: Candidate,
    control: ElectorControl,
    mut state: watch::Receiver<LeaderState>,
) {
    let Candidate {
        me,
        selector,
        app_container,
        mine,
        prefer,
        fence,
    } = candidate;
    let config = watcher::Config::default().labels(&selector);
    let events = watcher(pods, config).backoff(super::pod::watch_backoff());
    let mut events = std::pin::pin!(events);
    let mut peers: BTreeMap<String, Pod> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Pod>> = None;
    let mut watch = PeerWatch::new(prefer, mine, fence, control);
    watch.recorded(state.borrow_and_update().holder_version.as_ref());
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                watch.recorded(state.borrow_and_update().holder_version.as_ref());
                continue;
            }
        };
        let Some(event) = event else { return };
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                listing.get_or_insert_default().insert(name(&pod), pod);
                continue;
            }
            Ok(watcher::Event::InitDone) => peers = listing.take().unwrap_or_default(),
            Ok(watcher::Event::Apply(pod)) => {
                peers.insert(name(&pod), pod);
            }
            Ok(watcher::Event::Delete(pod)) => {
                peers.remove(&name(&pod));
            }
            Err(e) => {
                debug!(error = %e, "the candidates' watch failed; it retries with backoff");
                continue;
            }
        }
        let mut live = Vec::new();
        for (peer, pod) in peers.iter().filter(|(n, _)| **n != me) {
            if healthy(pod, app_container.as_deref()) {
                live.push((peer.clone(), revisions.version_of(pod, app_container.as_deref()).await));
            }
        }
        watch.peers(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(env: serde_json::Value, ready: bool) -> Pod {
        leasehold_kubernetes::api::client::object_from_value(&json!({
            "metadata": {
                "name": "web-7d9f-abcde",
                "labels": {"pod-template-hash": "7d9f"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                    "uid": "u", "controller": true
                }]
            },
            "spec": {"containers": [
                {"name": "app", "image": "registry/web:2.1"},
                {"name": "leasehold", "image": "leasehold:1", "env": env}
            ]},
            "status": {
                "conditions": [{"type": "ContainersReady", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{
                    "name": "app", "ready": ready, "restartCount": 0, "image": "i", "imageID": "i"
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_pods_version_is_its_replica_sets_revision_and_its_hash_and_image() {
        let p = pod(json!([]), true);
        let version = pod_version(&p, Some("app"), |rs| (rs == "web-7d9f").then_some(4)).unwrap();
        assert_eq!(
            version,
            Version {
                revision: 4,
                name: "7d9f/registry/web:2.1".into()
            }
        );
        assert_eq!(pod_version(&p, None, |_| None), None, "no revision, no version");
        let explicit = pod(
            json!([{"name": "LEASEHOLD_REVISION", "value": "12"}, {"name": "LEASEHOLD_VERSION", "value": "v1.12.0"}]),
            true,
        );
        let version = pod_version(&explicit, Some("app"), |_| panic!("explicit wins")).unwrap();
        assert_eq!((version.revision, version.name.as_str()), (12, "v1.12.0"));
    }

    /// A rollout seen through the (model) API server: the old leader stands
    /// aside, naming the newer pod, only once that pod's app is ready, and
    /// campaigns again when the newer pod goes; every request is one the
    /// sidecar's Role grants.
    #[tokio::test(start_paused = true)]
    async fn an_old_leader_stands_aside_while_a_ready_newer_candidate_is_live() {
        use leasehold_testkit::api::{ApiServer, pods};
        use std::sync::Arc;
        use std::time::Duration;
        let api = ApiServer::new(Some(crate::rbac::allows_request));
        let replicasets = "/apis/apps/v1/namespaces/prod/replicasets";
        for (rs, revision) in [("web-old", "1"), ("web-new", "2")] {
            api.insert(
                replicasets,
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": rs, "namespace": "prod", "annotations": {REVISION_ANNOTATION: revision}}}),
            );
        }
        let candidate = |name: &str, rs: &str, ready: bool| {
            let mut pod = pods::pod(name, "prod", json!({"app": "web", "pod-template-hash": rs}), None);
            pod["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": rs, "controller": true}]);
            pod["status"]["containerStatuses"] =
                json!([{"name": "app", "ready": ready, "restartCount": 0, "image": "i", "imageID": "i"}]);
            pod
        };
        api.insert(&pods::collection("prod"), candidate("web-old-a", "web-old", true));
        api.insert(&pods::collection("prod"), candidate("web-old-b", "web-old", true));
        let store = leasehold_core::store::memory::MemoryStore::new(1);
        let mine = Version {
            revision: 1,
            name: "web-old".into(),
        };
        let elector = leasehold_core::lease::Elector::new(
            "web",
            leasehold_core::lease::Identity::with_nonce("web-old-a", "1"),
            leasehold_core::lease::Timing::default(),
        )
        .with_version(Some(mine.clone()), true);
        let handle = elector.spawn(Arc::new(store), tokio_util::sync::CancellationToken::new());
        let mut state = handle.subscribe();
        state.wait_for(|s| s.leader).await.unwrap();
        let pods_api: Api<Pod> = Api::namespaced(api.client("prod"), "prod");
        tokio::spawn(follow_peers(
            pods_api,
            Revisions::new(Api::namespaced(api.client("prod"), "prod")),
            Candidate {
                me: "web-old-a".into(),
                selector: "app=web".into(),
                app_container: Some("app".into()),
                mine: Some(mine),
                prefer: Prefer::Newest,
                fence: true,
            },
            handle.control(),
            handle.subscribe(),
        ));
        api.insert(&pods::collection("prod"), candidate("web-new-a", "web-new", false));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            handle.state().leader,
            "a newer pod whose app is not ready changes nothing"
        );
        api.insert(&pods::collection("prod"), candidate("web-new-a", "web-new", true));
        let stood = state.wait_for(|s| !s.leader && !s.campaigning).await.unwrap().clone();
        let why = stood.standing_aside.unwrap();
        assert_eq!(
            why,
            "the lease prefers Newest and web-new-a runs newer web-new (revision 2), and is healthy"
        );
        api.insert(&pods::collection("prod"), candidate("web-new-a", "web-new", false));
        state.wait_for(|s| s.campaigning).await.unwrap();
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }

    /// A rollback makes an old ReplicaSet current with a higher revision:
    /// once a new pod of it shows, its pods count as that revision, those
    /// seen before included.
    #[tokio::test]
    async fn a_rollbacks_new_pod_brings_its_replica_sets_new_revision() {
        use leasehold_testkit::api::ApiServer;
        let api = ApiServer::new(Some(crate::rbac::allows_request));
        let replica_set = |revision: u64| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": "web-7d9f", "namespace": "prod",
                             "annotations": {REVISION_ANNOTATION: revision.to_string()}}})
        };
        let replicasets = "/apis/apps/v1/namespaces/prod/replicasets";
        api.insert(replicasets, replica_set(1));
        let mut revisions = Revisions::new(Api::namespaced(api.client("prod"), "prod"));
        let old = pod(json!([]), true);
        let mut new = pod(json!([]), true);
        new.metadata.name = Some("web-7d9f-fghij".into());
        let revision = |v: Option<Version>| v.map(|v| v.revision);
        assert_eq!(revision(revisions.version_of(&old, Some("app")).await), Some(1));
        api.insert(replicasets, replica_set(3));
        assert_eq!(
            revision(revisions.version_of(&old, Some("app")).await),
            Some(1),
            "a pod seen before does not re-read its ReplicaSet"
        );
        assert_eq!(revision(revisions.version_of(&new, Some("app")).await), Some(3));
        assert_eq!(revision(revisions.version_of(&old, Some("app")).await), Some(3));
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }

    #[test]
    fn a_peer_counts_while_its_app_is_ready_and_it_is_not_being_deleted() {
        assert!(healthy(&pod(json!([]), true), Some("app")));
        assert!(healthy(&pod(json!([]), true), None));
        assert!(!healthy(&pod(json!([]), false), Some("app")));
        let mut going = pod(json!([]), true);
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!healthy(&going, Some("app")));
    }
}
