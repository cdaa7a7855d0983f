//! Following the `DistributedLease` while the sidecar runs.

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use super::{LeaseBinding, Settings};
use crate::pod::watch_backoff;
use leasehold_core::lease::Timing;
use leasehold_kubernetes::api::{DistributedLease, ValidLease, validate};

/// Why a sidecar stops campaigning on the lease it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retirement {
    /// The `metadata.uid` of the lease it retires from.
    pub uid: String,
    pub why: String,
}

/// Follows the `DistributedLease` this sidecar is bound to after start, and
/// returns once the sidecar must retire from it: the resource was deleted
/// (or is being deleted), came back with another uid, or names another
/// lock, store or partition count than the sidecar started with. A running
/// elector cannot move its lease, and candidates of one resource must not
/// campaign on two stores at once (issue 40), so the caller stops claiming,
/// releases and re-executes onto the new resource (`sidecar::retire`).
/// New timing applies from the next term; a new label key is logged; the
/// recorded store (`status.storeIdentity`) goes to `store_identity`.
pub(crate) async fn watch_lease(
    client: kube::Client,
    namespace: &str,
    bound: LeaseBinding,
    started: Settings,
    set_timing: impl Fn(Timing),
    store_identity: tokio::sync::watch::Sender<Option<String>>,
) -> Retirement {
    let api: Api<DistributedLease> = Api::namespaced(client, namespace);
    let lease = bound.name.clone();
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let events = watcher(api, config).backoff(watch_backoff());
    let mut events = std::pin::pin!(events);
    let mut timing = started.timing;
    // Whether the current (re)list showed the resource: one that is absent
    // from a list was deleted while the watch was down.
    let mut listed = false;
    let retire = |why: String| Retirement {
        uid: bound.uid.clone(),
        why,
    };
    while let Some(event) = events.next().await {
        let resource = match event {
            Ok(watcher::Event::Init) => {
                listed = false;
                continue;
            }
            Ok(watcher::Event::InitDone) if !listed => return retire("the DistributedLease is gone".into()),
            Ok(watcher::Event::Delete(_)) => return retire("the DistributedLease was deleted".into()),
            Ok(watcher::Event::Apply(r)) | Ok(watcher::Event::InitApply(r)) => r,
            Ok(_) => continue,
            Err(e) => {
                debug!(error = %e, "lease watch error; the watcher retries");
                continue;
            }
        };
        listed = true;
        let recorded = resource.status.as_ref().and_then(|s| s.store_identity.clone());
        store_identity.send_if_modified(|known| {
            let changed = *known != recorded;
            *known = recorded;
            changed
        });
        let valid = validate(&resource);
        if let Some(why) = moved(&bound, &started, &resource, valid.as_ref().ok()) {
            return retire(why);
        }
        match valid {
            Ok(valid) => {
                if valid.timing != timing {
                    info!(%lease, timing = ?valid.timing, "the lease's timing changed; applies from the next term");
                    set_timing(valid.timing);
                    timing = valid.timing;
                }
                if valid.label_key != started.publishing.label_key {
                    warn!(%lease, "the lease's label key changed; restart the pod to apply");
                }
            }
            Err(e) => warn!(%lease, error = %e, "the DistributedLease is invalid now; keeping the current settings"),
        }
    }
    // The watcher retries for ever; its stream does not end.
    std::future::pending().await
}

/// Why `resource` is no longer the lease `bound` campaigns on, if it is not;
/// `valid` is its validation (`None` when invalid), done once by the caller.
/// The store block and `partitions` are immutable by the CRD's rules; a CRD
/// installed without them (an older chart) could still change them in place.
pub(super) fn moved(
    bound: &LeaseBinding,
    started: &Settings,
    resource: &DistributedLease,
    valid: Option<&ValidLease>,
) -> Option<String> {
    let uid = resource.metadata.uid.as_deref().unwrap_or_default();
    if uid != bound.uid {
        return Some(format!(
            "the DistributedLease was recreated (uid {uid}, started with {})",
            bound.uid
        ));
    }
    if resource.metadata.deletion_timestamp.is_some() {
        return Some("the DistributedLease is being deleted".into());
    }
    if resource.spec.store != bound.store {
        return Some("the DistributedLease names another store".into());
    }
    match valid {
        Some(valid) if valid.lock != started.lock => Some(format!("the lock changed to {}", valid.lock)),
        Some(valid) if valid.partitions != started.partitions => Some(format!(
            "the partitions changed from {:?} to {:?}",
            started.partitions, valid.partitions
        )),
        _ => None,
    }
}
