//! The operator's memory of created tables against a store that changed
//! under it.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use serde_json::json;

use super::*;
use crate::stores::SingleStore;
use crate::testing::{context_with, lease};
use leasehold_core::store::memory::MemoryStore;
use leasehold_kubernetes::api::client::object_from_value;
use leasehold_stores::postgres::{PostgresConfig, PostgresStore};
use leasehold_testkit::servers::PostgresServer;

fn context() -> Arc<Context> {
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let stores = Arc::new(SingleStore::new(Arc::new(MemoryStore::default())));
    context_with(stores, metrics).0
}

fn valid_lease() -> ValidLease {
    let resource: DistributedLease = object_from_value(&lease(json!({}), &[], None)).unwrap();
    validate(&resource).unwrap()
}

/// A database re-created empty at the same URL (seen on the test cluster:
/// a new PostgreSQL server on a port an earlier one had used): the operator
/// created the table there once, finds it missing, and creates it again
/// instead of reporting the store misconfigured for ever.
#[tokio::test]
async fn a_table_that_vanished_after_the_operator_created_it_is_created_again() {
    let ctx = context();
    let valid = valid_lease();
    let server = PostgresServer::start();
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: "leasehold_leases".into(),
    })
    .unwrap();
    let key = "postgres at the test server".to_string();
    let read = || store.observe("prod/web");

    let first = ctx.with_schema(key.clone(), &valid, store.ensure_schema(), read).await;
    assert!(first.is_ok(), "the table is created the first time: {first:?}");

    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client.batch_execute("DROP TABLE leasehold_leases").await.unwrap();
    assert!(
        matches!(store.observe("prod/web").await, Err(StoreError::Invalid { .. })),
        "the table is gone"
    );

    let again = ctx.with_schema(key, &valid, store.ensure_schema(), read).await;
    assert!(again.is_ok(), "the table is created again: {again:?}");
}

/// A known table is not created again on every read: `ensure` runs only
/// the first time and after a read finds the table invalid.
#[tokio::test]
async fn a_known_table_is_ensured_only_after_a_read_finds_it_invalid() {
    let ctx = context();
    let valid = valid_lease();
    let ensured = std::sync::atomic::AtomicUsize::new(0);
    let ensure = || async {
        ensured.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    };
    let ensures = || ensured.load(std::sync::atomic::Ordering::Relaxed);
    let fine = || async { Ok::<_, StoreError>(()) };
    let key = "k".to_string();

    ctx.with_schema(key.clone(), &valid, ensure(), fine).await.unwrap();
    ctx.with_schema(key.clone(), &valid, ensure(), fine).await.unwrap();
    assert_eq!(ensures(), 1, "created once, then known");

    let reads = std::sync::atomic::AtomicUsize::new(0);
    let missing_once = || async {
        match reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
            0 => Err(StoreError::invalid("relation \"leasehold_leases\" does not exist")),
            _ => Ok(()),
        }
    };
    ctx.with_schema(key.clone(), &valid, ensure(), missing_once)
        .await
        .unwrap();
    assert_eq!(ensures(), 2, "a read that finds the table invalid has it ensured again");
    ctx.with_schema(key, &valid, ensure(), fine).await.unwrap();
    assert_eq!(ensures(), 2, "and then it is known again");
}

/// The lease "web" on Spanner with `status.storeIdentity` = `recorded`.
fn resource_recording(recorded: Option<&str>) -> DistributedLease {
    let status = recorded.map(|identity| json!({"storeIdentity": identity}));
    object_from_value(&lease(json!({}), &[], status)).unwrap()
}

/// Issue 54: the operator reads the store the lease recorded, never the one
/// an edited Secret reaches. Nothing recorded: the store reached is the one
/// to record. Recorded and reached: that store. Reached elsewhere: the
/// recorded store again, through the configuration that last reached it,
/// saying so; and an operator that never reached it (restarted since)
/// reads nothing rather than the other store.
#[tokio::test(start_paused = true)]
async fn the_operator_reads_the_recorded_store_whatever_the_secret_reaches() {
    let metrics = Arc::new(Metrics::new(&mut Registry::default()));
    let stores = Arc::new(SingleStore::new(Arc::new(MemoryStore::default())));
    let ctx = context_with(stores.clone(), metrics.clone()).0;
    let valid = valid_lease();
    let ours = crate::stores::SINGLE_STORE;

    let first = ctx.target(&resource_recording(None), &valid, "prod").await.unwrap();
    assert_eq!((first.identity.as_str(), first.elsewhere), (ours, None));
    let recorded = resource_recording(Some(ours));
    let again = ctx.target(&recorded, &valid, "prod").await.unwrap();
    assert_eq!((again.identity.as_str(), again.elsewhere), (ours, None));

    // The Secret now reaches another store; the operator learns it when it
    // reads the store's identity again.
    stores.reach("memory:other");
    tokio::time::advance(SECRET_REFRESH).await;
    let moved = ctx.target(&recorded, &valid, "prod").await.unwrap();
    assert_eq!(moved.identity.as_str(), ours, "the recorded store is read");
    assert_eq!(moved.config, first.config);
    let says = moved
        .elsewhere
        .expect("StoreReady says the Secret reaches another store");
    assert!(
        says.contains("memory:other") && says.contains(ours) && says.contains("set the Secret back"),
        "{says}"
    );

    let restarted = context_with(stores.clone(), metrics).0;
    let refused = restarted.target(&recorded, &valid, "prod").await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid { .. }), "{refused:?}");
    assert!(
        refused.to_string().contains("no way to the recorded store"),
        "{refused}"
    );

    // Set back: the recorded store, nothing to say.
    stores.reach(ours);
    tokio::time::advance(SECRET_REFRESH).await;
    let back = restarted.target(&recorded, &valid, "prod").await.unwrap();
    assert_eq!((back.identity.as_str(), back.elsewhere), (ours, None));
}
