//! The watcher catches what it is there for: a planted second leader label
//! (what a sidecar that publishes before it holds the lease would write), and
//! the second ready endpoint it brings, and a token that goes backwards.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use leasehold::api::DistributedLease;
use serde_json::json;

use crate::cluster::{scenario, wait_for};
use crate::fixtures::{FIRST_LEADER, LEASE, SIDECAR, a_follower, leader_only_service};
use crate::node::signal_container;

#[tokio::test]
async fn the_watcher_catches_a_planted_second_leader_and_a_token_going_back() {
    scenario("e2e-watcher", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;
        assert!(watcher.violations().is_empty(), "{:?}", watcher.violations());

        // The planted bug: a follower labelled leader while another holds the lease.
        // Its sidecar is frozen meanwhile: awake, it repairs its own label at
        // once, sometimes before the EndpointSlice controller adds the pod
        // (seen in CI), and the second endpoint is never there to catch.
        let follower = a_follower(&s, &leader).await;
        signal_container(&s, &follower, SIDECAR, "STOP").await;
        let label = json!({"metadata": {"labels": {"leasehold.dev/leader": "true"}}});
        s.api::<Pod>()
            .patch(&follower, &PatchParams::default(), &Patch::Merge(label))
            .await
            .expect("planting");
        let seen = wait_for("the watcher to report two leaders", Duration::from_secs(30), || async {
            let v = watcher.violations();
            (v.iter().any(|v| v.contains("pods labelled leader"))
                && v.iter().any(|v| v.contains("ready leader endpoints")))
            .then_some(v)
        })
        .await;
        assert!(
            seen.iter().any(|v| v.contains(&follower)),
            "names the planted pod: {seen:?}"
        );
        signal_container(&s, &follower, SIDECAR, "CONT").await;

        // A status token lower than one already shown.
        let leases = s.api::<DistributedLease>();
        let status = json!({"status": {"token": "1", "holder": "planted/holder#0"}});
        leases
            .patch_status(LEASE, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("planting a token");
        wait_for(
            "the watcher to report the token going back",
            Duration::from_secs(30),
            || async {
                watcher
                    .violations()
                    .iter()
                    .any(|v| v.contains("token went backwards"))
                    .then_some(())
            },
        )
        .await;
        // Repaired: the sidecars and the operator converge back to one leader.
        watcher.one_leader(None, FIRST_LEADER).await;
    })
    .await;
}
