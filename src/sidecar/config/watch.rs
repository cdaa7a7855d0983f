//! Following the `DistributedLease` while the sidecar runs.

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use super::Settings;
use crate::api::{DistributedLease, validate};
use crate::lease::Timing;
use crate::sidecar::pod::{PodRef, watch_backoff};

/// Follows the `DistributedLease` after start. New timing applies from the
/// next term; a new lock, store, label key or partition count needs a
/// restart (a running elector cannot move its lease, and members counting
/// different partitions would plan apart), which is logged.
pub async fn watch_lease(
    client: kube::Client,
    pod: PodRef,
    lease: String,
    started: Settings,
    set_timing: impl Fn(Timing),
) {
    let api: Api<DistributedLease> = Api::namespaced(client, &pod.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let events = watcher(api, config).backoff(watch_backoff());
    let mut events = std::pin::pin!(events);
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
                    || !valid.store.names(&started.store)
                    || valid.label_key != started.publishing.label_key
                    || valid.partitions != started.partitions;
                if moved {
                    warn!(%lease, "the lease's lock, store, label key or partitions changed; restart the pod to apply");
                }
            }
            Err(e) => warn!(%lease, error = %e, "the DistributedLease is invalid now; keeping the current settings"),
        }
    }
}
