//! Sessions on a private Redis server (one per test): the session
//! conformance suite, partitions through the one partitioner, the key
//! layout, and a batch whose reply is lost.

use std::sync::Arc;
use std::time::Duration;

use leasehold::lease::{SessionStore, StoreError};
use leasehold::store::StoreUrl;
use leasehold::store::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
use leasehold::testing::conformance::sessions::{SessionTarget, partitions_are_shared_and_taken_over};
use leasehold::testing::servers::RedisServer;
use leasehold::testing::{ProxyMode, TcpProxy};

const LEASE: Duration = Duration::from_secs(30);

struct Sessions {
    server: RedisServer,
    store: RedisStore,
}

fn config(url: String) -> RedisConfig {
    RedisConfig {
        url: StoreUrl::new(url),
        prefix: DEFAULT_PREFIX.into(),
    }
}

async fn sessions() -> Sessions {
    let server = RedisServer::start();
    let store = RedisStore::connect(config(server.url())).unwrap();
    store.ensure_session_schema().await.unwrap();
    Sessions { server, store }
}

impl SessionTarget for Sessions {
    fn sessions(&self) -> Arc<dyn SessionStore> {
        Arc::new(self.store.clone())
    }
}

leasehold::session_conformance_tests!(sessions());

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn partitions_are_shared_and_taken_over_on_redis() {
    let fixture = sessions().await;
    partitions_are_shared_and_taken_over(Arc::new(fixture.store.clone())).await;
}

/// The three session keys share one hash tag (one Cluster slot, so one
/// script may touch any locks) and none has a TTL: a lock's entry, and so
/// its token, outlives its holder.
#[tokio::test]
async fn the_session_keys_share_one_slot_and_never_expire() {
    let fixture = sessions().await;
    let store = &fixture.store;
    store.open_session("s-a", "test", LEASE).await.unwrap();
    let taken = store.try_lock("s-a", &names(&["x"])).await.unwrap().taken;
    let mut cli = redis::Client::open(fixture.server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = store.session_keys();
    assert_eq!(
        keys,
        [
            "leasehold:{sessions}:sessions",
            "leasehold:{sessions}:expiry",
            "leasehold:{sessions}:locks"
        ]
    );
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut cli).await.unwrap();
        assert_eq!(ttl, -1, "{key} exists without a TTL");
    }
    let entry: String = redis::cmd("HGET")
        .arg(&keys[2])
        .arg("x")
        .query_async(&mut cli)
        .await
        .unwrap();
    assert_eq!(
        entry,
        format!("{} s-a", taken[0].1.0 / 1000),
        "token in µs, then the session"
    );
}

/// S9 on a batch: the script runs and its reply is lost. That is an
/// unknown outcome, never success; the server did take the lock, and asking
/// again confirms it with the same token.
#[tokio::test]
async fn a_batch_whose_reply_is_lost_is_an_unknown_outcome() {
    let fixture = sessions().await;
    fixture.store.open_session("s-a", "test", LEASE).await.unwrap();
    let proxy = TcpProxy::start(fixture.server.addr()).await;
    let timeout = Duration::from_millis(500);
    let through = RedisStore::connect_with(config(fixture.server.url_at(proxy.addr)), timeout).unwrap();
    // Connect and load the script while replies flow.
    through.try_lock("s-a", &names(&["warm-up"])).await.unwrap();
    proxy.set(ProxyMode::DelayReplies(timeout * 3));
    let result = through.try_lock("s-a", &names(&["x"])).await;
    proxy.set(ProxyMode::Forward);
    assert!(matches!(result, Err(StoreError::OutcomeUnknown { .. })), "{result:?}");
    let observed = fixture.store.observe_locks(&names(&["x"])).await.unwrap();
    assert_eq!(observed.locks[0].holder.as_deref(), Some("s-a"), "it ran");
    let again = fixture.store.try_lock("s-a", &names(&["x"])).await.unwrap();
    assert_eq!(again.taken, vec![("x".to_string(), observed.locks[0].token.unwrap())]);
}
