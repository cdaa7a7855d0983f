//! The conformance suite on a private Redis server (one per test), plus the
//! Redis store's own behaviour: expiry by key TTL, the never-expiring token
//! counter, bad input, an unreachable server, a cut connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold::lease::{Grant, LeaseStore, StoreError};
use leasehold::store::StoreUrl;
use leasehold::store::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
use leasehold::testing::TcpProxy;
use leasehold::testing::conformance::{StoreCall, Target, with_replies_held_back};
use leasehold::testing::servers::{RedisServer, TestCertificates, scratch_dir};

struct Redis {
    server: RedisServer,
    store: RedisStore,
}

fn config(url: String) -> RedisConfig {
    RedisConfig {
        url: StoreUrl::new(url),
        prefix: DEFAULT_PREFIX.into(),
    }
}

async fn redis() -> Redis {
    let server = RedisServer::start();
    let store = RedisStore::connect(config(server.url())).unwrap();
    store.ensure_schema().await.unwrap();
    Redis { server, store }
}

/// A plain connection, as an operator with redis-cli would use.
async fn cli(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[async_trait]
impl Target for Redis {
    fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.store.clone())
    }

    /// Deletes both keys of the lock, the counter too: the token must still
    /// increase (it follows the server clock).
    async fn delete_row(&self, lock: &str) {
        let deleted: i64 = redis::cmd("DEL")
            .arg(&self.store.keys(lock))
            .query_async(&mut cli(&self.server).await)
            .await
            .unwrap();
        assert!(deleted >= 1, "deleted {deleted} keys");
    }

    /// The script reaches the server through a proxy that holds replies back
    /// past the call timeout: it runs, its reply is lost.
    async fn with_lost_reply(
        &self,
        lock: &str,
        _holder: &str,
        _round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError> {
        let proxy = TcpProxy::start(self.server.addr()).await;
        let timeout = Duration::from_millis(500);
        let store: Arc<dyn LeaseStore> =
            Arc::new(RedisStore::connect_with(config(self.server.url_at(proxy.addr)), timeout).unwrap());
        with_replies_held_back(&proxy, timeout, store, lock, call).await
    }
}

leasehold::conformance_tests!(redis());

#[tokio::test]
async fn observe_many_reads_ten_thousand_locks_in_one_call() {
    leasehold::testing::conformance::observe_many_reads_ten_thousand_locks_in_one_call(&redis().await).await;
}

/// Redis judges expiry: the lease key carries a TTL of the lease in ms, and
/// the fence key, holding the counter, has none.
#[tokio::test]
async fn the_lease_is_a_key_ttl_and_the_counter_never_expires() {
    let fixture = redis().await;
    let lease = Duration::from_millis(1500);
    let [lease_key, fence_key] = fixture.store.keys("ttl");
    let mut cli = cli(&fixture.server).await;
    let acquired = Instant::now();
    fixture.store.acquire("ttl", "a", lease).await.unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&lease_key).query_async(&mut cli).await.unwrap();
    // The key lives the lease from the acquire, ending within the
    // millisecond before the lease's end (the_lease_key_is_gone_by_the_end_
    // the_record_reports): at most the lease, and no less than what is left
    // of it after the time spent since, less that millisecond. PTTL
    // truncates to whole milliseconds: round the time spent up.
    let since = acquired.elapsed().as_millis() as i64 + 1;
    assert!(
        (1500 - since - 1..=1500).contains(&ttl),
        "lease key TTL {ttl} ms, {since} ms after the acquire"
    );
    let fence_ttl: i64 = redis::cmd("PTTL").arg(&fence_key).query_async(&mut cli).await.unwrap();
    assert_eq!(fence_ttl, -1, "the counter has no TTL");
    // Redis removes the expired lease key.
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&lease_key)
            .query_async(&mut cli)
            .await
            .unwrap();
        if exists == 0 {
            break;
        }
        assert!(acquired.elapsed() < lease * 10, "the lease key outlived its TTL");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = fixture.store.observe("ttl").await.unwrap().record.unwrap();
    assert_eq!(row.holder, None, "expired means free");
    assert_eq!(row.term, 1, "the counter keeps the term");
}

/// The lease key is gone by the end the record reports (renewal + the
/// lease), on Redis's millisecond clock that expires a key only once past
/// its time: its last millisecond is before the end, for an acquire and a
/// renewal. Planted: `PEXPIRE lease_ms` leaves the key a millisecond past
/// the end (and the conformance suite's acquire-after-expiry fails at random).
#[tokio::test]
async fn the_lease_key_is_gone_by_the_end_the_record_reports() {
    let fixture = redis().await;
    let lease = Duration::from_millis(1500);
    let [lease_key, _] = fixture.store.keys("end");
    let mut cli = cli(&fixture.server).await;
    let granted = fixture.store.acquire("end", "a", lease).await.unwrap();
    let acquire_end = granted.committed_at.saturating_add(lease);
    let gone_after_acquire = key_gone_from(&mut cli, &lease_key).await;
    let renewed = fixture.store.renew("end", "a", granted.token, lease).await.unwrap();
    let renewal_end = renewed.committed_at.saturating_add(lease);
    let gone_after_renewal = key_gone_from(&mut cli, &lease_key).await;
    let row = fixture.store.observe("end").await.unwrap().record.unwrap();
    assert_eq!(
        row.expires_at(),
        Some(renewal_end),
        "the record's end is the renewal + the lease"
    );
    for (what, gone_from, end) in [
        ("acquire", gone_after_acquire, acquire_end),
        ("renewal", gone_after_renewal, renewal_end),
    ] {
        assert!(
            gone_from <= end.0 as i128,
            "after the {what}, the key lives until {gone_from} ns, past the lease's end {} ns",
            end.0
        );
    }
}

/// From when Redis treats `key` as expired (ns on its clock): the
/// millisecond after its expiry time.
async fn key_gone_from(cli: &mut redis::aio::MultiplexedConnection, key: &str) -> i128 {
    let expires_ms: i64 = redis::cmd("PEXPIRETIME").arg(key).query_async(cli).await.unwrap();
    (expires_ms as i128 + 1) * 1_000_000
}

/// An expired lease is taken by the next candidate; the old holder can
/// neither renew nor release.
#[tokio::test]
async fn after_expiry_the_old_holder_can_neither_renew_nor_release() {
    let fixture = redis().await;
    let short = Duration::from_millis(200);
    let a = fixture.store.acquire("expiry", "a", short).await.unwrap();
    tokio::time::sleep(short * 2).await;
    let renewed = fixture.store.renew("expiry", "a", a.token, short).await;
    assert!(
        matches!(renewed, Err(StoreError::Lost { .. })),
        "an expired key cannot be renewed: {renewed:?}"
    );
    let b = fixture.store.acquire("expiry", "b", short).await.unwrap();
    assert_eq!(b.term, a.term + 1);
    assert!(b.token > a.token);
    let released = fixture.store.release("expiry", "a", a.token).await;
    assert!(matches!(released, Err(StoreError::Lost { .. })), "{released:?}");
}

/// Losing the counter (deleted, or not yet replicated when a replica was
/// promoted) still yields larger tokens: they follow the server clock.
#[tokio::test]
async fn a_lost_counter_still_gives_larger_tokens() {
    let fixture = redis().await;
    let lease = Duration::from_secs(30);
    let first = fixture.store.acquire("lost", "a", lease).await.unwrap();
    let mut cli = cli(&fixture.server).await;
    let () = redis::cmd("FLUSHALL").arg("SYNC").query_async(&mut cli).await.unwrap();
    let second = fixture.store.acquire("lost", "b", lease).await.unwrap();
    assert_eq!(second.term, 1, "the term counter started again");
    assert!(second.token > first.token, "{} then {}", first.token, second.token);
}

#[tokio::test]
async fn bad_urls_and_prefixes_are_refused_before_connecting() {
    let err = RedisStore::connect(config(
        "rediss://:hunter2@cache:6380?sslrootcert=/no/such/ca.pem".into(),
    ))
    .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }));
    assert!(
        err.chain().contains("sslrootcert /no/such/ca.pem: cannot read"),
        "{}",
        err.chain()
    );
    assert!(!err.chain().contains("hunter2"), "{}", err.chain());
    let err = RedisStore::connect(RedisConfig {
        url: StoreUrl::new("redis://cache"),
        prefix: "a{b".into(),
    })
    .unwrap_err();
    assert!(err.to_string().contains("key prefix \"a{b\""), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_promptly() {
    // Reserved, so no other test's server listens there meanwhile.
    let reserved = leasehold::testing::reserve_port([127, 0, 0, 1].into());
    let port = reserved.port;
    let store = RedisStore::connect_with(config(format!("redis://127.0.0.1:{port}")), Duration::from_secs(2)).unwrap();
    suite::an_unreachable_server_is_unavailable_promptly(&store).await;
}

#[tokio::test]
async fn a_cut_connection_is_not_success_and_the_lease_survives_it() {
    let fixture = redis().await;
    let proxy = TcpProxy::start(fixture.server.addr()).await;
    let store = RedisStore::connect_with(config(fixture.server.url_at(proxy.addr)), Duration::from_secs(1)).unwrap();
    let grant = suite::a_cut_connection_is_not_success(&store, &proxy, &fixture.store).await;
    // The connection manager reconnects.
    let started = Instant::now();
    while store
        .renew("cut", "a", grant.token, Duration::from_secs(30))
        .await
        .is_err()
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no reconnect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lease key whose stored duration or term is out of range, or missing, is
/// refused, never read as an expired (0 ms) lease or a wrapped term.
#[tokio::test]
async fn a_lease_key_with_an_out_of_range_duration_or_term_is_refused() {
    let fixture = redis().await;
    let lease = Duration::from_secs(30);
    fixture.store.acquire("bad-row", "a", lease).await.unwrap();
    let [lease_key, _] = fixture.store.keys("bad-row");
    let mut cli = cli(&fixture.server).await;
    for (field, stored, shown) in [
        ("lease_ms", "0", "holds lease_ms = 0"),
        ("lease_ms", "-1", "holds lease_ms = -1"),
        ("lease_ms", "999999999999", "holds lease_ms = 999999999999"),
        ("lease_ms", "soon", "holds lease_ms = "),
        ("term", "-3", "holds term = -3"),
    ] {
        let restore: String = redis::cmd("HGET")
            .arg(&lease_key)
            .arg(field)
            .query_async(&mut cli)
            .await
            .unwrap();
        let () = redis::cmd("HSET")
            .arg(&lease_key)
            .arg(field)
            .arg(stored)
            .query_async(&mut cli)
            .await
            .map(|_: i64| ())
            .unwrap();
        let observed = fixture.store.observe("bad-row").await.unwrap_err();
        assert!(matches!(observed, StoreError::Invalid { .. }), "{observed:?}");
        assert!(observed.to_string().contains(shown), "{observed}");
        let () = redis::cmd("HSET")
            .arg(&lease_key)
            .arg(field)
            .arg(restore)
            .query_async(&mut cli)
            .await
            .map(|_: i64| ())
            .unwrap();
        fixture
            .store
            .observe("bad-row")
            .await
            .expect("a corrected key reads again");
    }
}

/// Over TLS with the certificate checked against the server's CA, the
/// basics hold; a CA that did not sign the certificate is refused.
#[tokio::test]
async fn tls_connects_and_checks_the_certificate() {
    let server = RedisServer::start_tls();
    let store = RedisStore::connect(config(server.tls_url())).unwrap();
    let other_ca = TestCertificates::write(&scratch_dir("redis-other-ca"));
    let wrong = server.tls_url().replace(
        &server.certificates.as_ref().unwrap().ca_file.display().to_string(),
        &other_ca.ca_file.display().to_string(),
    );
    let distrusting = RedisStore::connect_with(config(wrong), Duration::from_secs(2)).unwrap();
    suite::tls_checks_the_certificate(&store, &distrusting).await;
}

/// TLS checks the server's host name: a certificate for 127.0.0.1 only
/// (signed by the CA the client trusts) is refused when the URL says
/// `localhost`.
#[tokio::test]
async fn tls_checks_the_servers_host_name() {
    let server = RedisServer::start_tls_for(&["127.0.0.1"]);
    let covered = RedisStore::connect(config(server.tls_url())).unwrap();
    let by_name = server
        .tls_url()
        .replace(&server.addr().to_string(), &format!("localhost:{}", server.port));
    let uncovered = RedisStore::connect_with(config(by_name), Duration::from_secs(2)).unwrap();
    suite::tls_checks_the_host_name(&covered, &uncovered).await;
}

/// A rediss:// URL against a server that does not speak TLS fails, saying
/// so; nothing falls back to plain text.
#[tokio::test]
async fn tls_to_a_server_without_tls_fails_clearly() {
    let fixture = redis().await;
    let ca = TestCertificates::write(&scratch_dir("redis-no-tls"));
    let url = format!(
        "rediss://{}/0?sslrootcert={}",
        fixture.server.addr(),
        ca.ca_file.display()
    );
    let store = RedisStore::connect_with(config(url), Duration::from_secs(2)).unwrap();
    let err = store.observe("x").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(
        err.chain()
            .contains("the URL asks for TLS, rediss://: does the server speak TLS"),
        "{}",
        err.chain()
    );
}

/// Issue 25: a follower learns of a release from the release script's
/// PUBLISH, not from its poll.
#[tokio::test]
async fn a_release_wakes_a_waiting_follower_by_publish() {
    let fixture = redis().await;
    let follower = RedisStore::connect(config(fixture.server.url())).unwrap();
    suite::a_release_wakes_a_waiting_follower(Arc::new(fixture.store.clone()), Arc::new(follower)).await;
}

/// Issue 54: a store is known by what it is, not by its URL: the marker
/// the first reader sets stays, so every later reader through any address
/// reads the same identity; another database of the server reads another.
#[tokio::test]
async fn the_identity_is_the_marker_of_the_servers_database() {
    let redis = redis().await;
    let identity = |url: String| async move { RedisStore::connect(config(url)).unwrap().identity().await.unwrap() };
    let ours = identity(redis.server.url()).await;
    assert!(ours.as_str().starts_with("redis:"), "{ours}");
    assert_eq!(redis.store.identity().await.unwrap(), ours, "read again, the same");
    let by_name = redis.server.url().replace("127.0.0.1", "localhost");
    assert_eq!(identity(by_name).await, ours, "another address, same store");
    let other = identity(redis.server.url().replace("/0", "/1")).await;
    assert_ne!(other, ours, "another database is another store");
}
