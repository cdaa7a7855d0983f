//! Stores from inside pods: the candidates reach Spanner (the emulator, as a
//! development cluster runs it, through the sidecar environment the chart
//! and a pod annotation pass) and Redis on this machine's address, elect one
//! leader and hand over when it goes.

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use leasehold::testing::Emulator;
use leasehold::testing::servers::RedisServer;
use serde_json::{Value, json};

use crate::cluster::{Scenario, apply, install_part, rendered_chart_with, scenario, wait_operator_available};
use crate::publishing::{APP, FIRST_LEADER, LEASE, SERVICE, SUCCESSOR};
use crate::stores::{lease, secret};
use crate::watcher::{LeadershipWatcher, Watched};

/// Runs the leader-only-service example with `annotations` on its pods,
/// then deletes the leader: one leader before and after.
async fn elects_and_hands_over(s: &Scenario, store_lease: Value, annotations: Value) {
    s.apply(vec![store_lease]).await;
    let mut example = s.example("leader-only-service.yaml");
    for object in &mut example {
        if let Some(target) = object.pointer_mut("/spec/template/metadata/annotations").and_then(Value::as_object_mut) {
            target.extend(annotations.as_object().cloned().unwrap_or_default());
        }
    }
    s.apply(example).await;
    let watcher = LeadershipWatcher::start(&s.client, Watched { ns: &s.ns, pods: APP, service: Some(SERVICE), lease: Some(LEASE) });
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    s.api::<Pod>().delete(&leader, &DeleteParams::default().grace_period(0)).await.expect("deleting the leader");
    watcher.one_leader(Some(&leader), SUCCESSOR).await;
    watcher.finish();
}

#[tokio::test]
async fn spanner_emulator_through_the_sidecar_and_operator_environment() {
    scenario("e2e-store-spanner", |s| async move {
        let emulator = Emulator::start_on(s.env.host_ip).unwrap_or_else(|e| panic!("{e}"));
        let database = emulator.create_database("leasehold_leases").await.database;
        let emulator_env = [("SPANNER_EMULATOR_HOST", emulator.host.clone()), ("SPANNER_EMULATOR_REST", emulator.rest.clone())];
        // The operator reads and prepares the store too: `helm upgrade
        // --set operator.env.SPANNER_EMULATOR_HOST=...`, as a user of a
        // development cluster would.
        let sets: Vec<String> = emulator_env.iter().map(|(k, v)| format!("operator.env.{k}={v}")).collect();
        apply(&s.client, &install_part(rendered_chart_with(&s.env, &sets))).await;
        wait_operator_available(&s.client).await;
        let lines: Vec<String> = emulator_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let store = json!({"spanner": {"database": database}});
        elects_and_hands_over(&s, lease(&s, LEASE, store, json!({})), json!({"leasehold.dev/sidecar-env": lines.join("\n")}))
            .await;
        // Back to the suite's install.
        apply(&s.client, &install_part(rendered_chart_with(&s.env, &[]))).await;
        wait_operator_available(&s.client).await;
    })
    .await;
}

#[tokio::test]
async fn redis_on_the_host() {
    scenario("e2e-store-redis", |s| async move {
        let server = RedisServer::start_on(s.env.host_ip);
        let url = server.url_at((s.env.host_ip, server.port).into());
        s.apply(vec![secret(&s, &url)]).await;
        let store = json!({"redis": {"urlSecretRef": {"name": crate::stores::URL_SECRET, "key": "url"}}});
        elects_and_hands_over(&s, lease(&s, LEASE, store, json!({})), json!({})).await;
    })
    .await;
}
