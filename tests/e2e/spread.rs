//! Partitions and versions on the real cluster: a partitioned lease spreads
//! over the pods and rebalances when one goes; a rollout under
//! `leadership.prefer: Newest` moves leadership once, to the new version.

use std::time::Duration;

use leasehold::api::{DistributedLease, PartitionsStatus};
use serde_json::json;

use crate::e2e::cluster::{Scenario, scenario, wait_for};
use crate::e2e::fixtures::{APP, FIRST_LEADER, LEASE, delete_now, example_with_pod_annotations, leader_only_service};
use crate::e2e::stores::{SpannerForPods, lease};

const PARTITIONS: u32 = 12;

async fn partitions(s: &Scenario) -> Option<PartitionsStatus> {
    s.api::<DistributedLease>().get(LEASE).await.ok()?.status?.partitions
}

/// Every partition owned, by `members` pods, evenly (balance ≤ 1).
async fn spread_over(s: &Scenario, members: u32, excluding: Option<&str>, within: Duration) -> PartitionsStatus {
    wait_for(
        &format!("{PARTITIONS} partitions spread over {members} pods"),
        within,
        || async {
            let status = partitions(s).await?;
            let excluded =
                excluding.is_some_and(|gone| status.assignment.iter().any(|a| a.holder.as_deref() == Some(gone)));
            (status.count == PARTITIONS
                && status.members == members
                && status.unowned == 0
                && status.balance <= 1
                && !excluded)
                .then_some(status)
        },
    )
    .await
}

/// The partitioned scenario points the chart's operator at an emulator
/// (`SpannerForPods`, a chart change every pod injected meanwhile would see
/// and every other scenario's install would undo): nextest runs it where no
/// other test uses the cluster (`.config/nextest.toml`, scripts/test.sh).
mod disruptive {
    use super::*;

    /// No leader watcher here: in a partitioned lease every member works and
    /// may carry the label while it holds partitions. The promise is one owner
    /// per partition, which the status shows from one consistent store read.
    #[tokio::test]
    async fn a_partitioned_lease_spreads_over_the_pods_and_rebalances_when_one_goes() {
        scenario("e2e-partitions", |s| async move {
            // Partitions are held through sessions, which the Spanner store keeps.
            let spanner = SpannerForPods::start(&s).await;
            s.apply(vec![lease(
                &s,
                LEASE,
                spanner.store.clone(),
                json!({"partitions": PARTITIONS}),
            )])
            .await;
            s.apply(example_with_pod_annotations(&s, spanner.pod_annotations()))
                .await;
            let before = spread_over(&s, 3, None, FIRST_LEADER).await;
            let gone = before.assignment[0].holder.clone().expect("the member's pod");
            delete_now(&s, &gone).await;
            // Its replacement joins; the partitions it held move, none stays unowned.
            spread_over(&s, 3, Some(&gone), Duration::from_secs(120)).await;
            spanner.stop(&s).await;
        })
        .await;
    }
}

#[tokio::test]
async fn a_rollout_under_prefer_newest_moves_leadership_once_to_the_new_version() {
    scenario("e2e-versions", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({"leadership": {"prefer": "Newest"}})).await;
        let old_leader = watcher.one_leader(None, FIRST_LEADER).await;
        let moves_before = watcher.moves();
        let old: Vec<String> = s.pods(APP).await.into_iter().filter_map(|p| p.metadata.name).collect();
        s.kubectl_ns(&["rollout", "restart", "deployment/scheduler"]);
        let new_leader = wait_for(
            "a new-version pod leading, the old pods gone",
            Duration::from_secs(240),
            || async {
                let pods = s.pods(APP).await;
                let names: Vec<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
                let leaders = watcher.leaders();
                let [leader] = leaders.as_slice() else { return None };
                (names.len() == 3 && names.iter().all(|n| !old.contains(n)) && !old.contains(leader))
                    .then(|| leader.clone())
            },
        )
        .await;
        assert_ne!(new_leader, old_leader);
        assert_eq!(
            watcher.moves() - moves_before,
            1,
            "leadership moved once, to the new version"
        );
        watcher.finish();
    })
    .await;
}
