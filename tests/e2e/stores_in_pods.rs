//! Stores from inside pods: the candidates reach Spanner (the emulator, as a
//! development cluster runs it, through the sidecar environment the chart
//! and a pod annotation pass) and Redis on this machine's address, elect one
//! leader and hand over when it goes.

use leasehold::testing::servers::RedisServer;
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, scenario};
use crate::e2e::fixtures::{FIRST_LEADER, LEASE, SUCCESSOR, delete_now, example_with_pod_annotations, watch_example};
use crate::e2e::stores::{SpannerForPods, lease, secret};

/// Runs the leader-only-service example with `annotations` on its pods,
/// then deletes the leader: one leader before and after.
async fn elects_and_hands_over(s: &Scenario, store_lease: Value, annotations: Value) {
    let watcher = watch_example(s, true);
    s.apply(vec![store_lease]).await;
    s.apply(example_with_pod_annotations(s, annotations)).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    delete_now(s, &leader).await;
    watcher.one_leader(Some(&leader), SUCCESSOR).await;
    watcher.finish();
}

/// A scenario that changes the operator's environment (a chart upgrade, which rolls the operator out): nextest runs them alone, where no other test uses the cluster.
mod disruptive {
    use super::*;

    #[tokio::test]
    async fn spanner_emulator_through_the_sidecar_and_operator_environment() {
        scenario("e2e-store-spanner", |s| async move {
            let spanner = SpannerForPods::start(&s).await;
            elects_and_hands_over(
                &s,
                lease(&s, LEASE, spanner.store.clone(), json!({})),
                spanner.pod_annotations(),
            )
            .await;
            spanner.stop(&s).await;
        })
        .await;
    }
}

#[tokio::test]
async fn redis_on_the_host() {
    scenario("e2e-store-redis", |s| async move {
        let server = RedisServer::start_on(s.env.host_ip);
        let url = server.url_at((s.env.host_ip, server.port).into());
        s.apply(vec![secret(&s, &url)]).await;
        let store = json!({"redis": {"urlSecretRef": {"name": crate::e2e::stores::URL_SECRET, "key": "url"}}});
        elects_and_hands_over(&s, lease(&s, LEASE, store, json!({})), json!({})).await;
    })
    .await;
}
