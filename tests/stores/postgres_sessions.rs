//! Sessions on a private PostgreSQL server (one per test): the session
//! conformance suite, partitions through the one partitioner, the tables
//! `ensure_session_schema` creates, and the serializable transactions'
//! retries and unknown outcomes, forced on the real server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::lease::{SessionStore, StoreError};
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore, Stage};
use leasehold::testing::conformance::sessions::{SessionTarget, partitions_are_shared_and_taken_over};
use leasehold::testing::servers::PostgresServer;
use leasehold::testing::{ProxyMode, TcpProxy};

const LEASE: Duration = Duration::from_secs(30);

struct Sessions {
    server: PostgresServer,
    store: PostgresStore,
}

fn config(url: String) -> PostgresConfig {
    PostgresConfig {
        url: StoreUrl::new(url),
        table: "leasehold_leases".into(),
    }
}

async fn sessions() -> Sessions {
    let server = PostgresServer::start();
    let store = PostgresStore::connect(config(server.url())).unwrap();
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

type Hook = Box<dyn Fn(Stage) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A hook that sets `proxy` to `mode` at `stage`.
fn switch_at(stage: Stage, proxy: &TcpProxy, mode: ProxyMode) -> Hook {
    let proxy = proxy.clone();
    Box::new(move |now| {
        if now == stage {
            proxy.set(mode);
        }
        Box::pin(async {})
    })
}

#[tokio::test]
async fn partitions_are_shared_and_taken_over_on_postgres() {
    let fixture = sessions().await;
    partitions_are_shared_and_taken_over(Arc::new(fixture.store.clone())).await;
}

/// A database without the session tables: one clear error naming the
/// table and what creates it; `ensure_session_schema` creates both (and the
/// lease table), idempotently.
#[tokio::test]
async fn a_missing_session_table_is_named_and_ensure_session_schema_creates_it() {
    let server = PostgresServer::start();
    let store = PostgresStore::connect(config(server.url())).unwrap();
    let err = store.open_session("s", "owner", LEASE).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "named, not retried: {err:?}");
    let chain = err.chain();
    assert!(
        chain.contains("leasehold_leases_sessions") && chain.contains("run ensure_schema"),
        "{chain}"
    );
    store.ensure_session_schema().await.unwrap();
    store.ensure_session_schema().await.unwrap();
    store.open_session("s", "owner", LEASE).await.unwrap();
    let batch = store.try_lock("s", &names(&["x"])).await.unwrap();
    assert_eq!(batch.taken.len(), 1);
    let observed = leasehold::lease::LeaseStore::observe(&store, "single").await.unwrap();
    assert!(observed.record.is_none(), "the lease table is there too");
}

/// Issue 28 item 3: a serialization failure (SQLSTATE 40001) runs the whole
/// transaction again, and the answer is the committed attempt's. Between the
/// first attempt's read and its writes another session takes one of the
/// wanted locks in a SERIALIZABLE transaction of its own and commits: the
/// first attempt's write of that lock fails with 40001, the retry reads
/// again, reports it busy and takes the other, and nothing of the failed
/// attempt remains.
#[tokio::test]
async fn a_serialization_failure_is_retried_and_the_answer_is_the_committed_attempts() {
    let fixture = sessions().await;
    let store = &fixture.store;
    for session in ["s-a", "s-b"] {
        store.open_session(session, "test", LEASE).await.unwrap();
    }
    let attempts = Arc::new(AtomicUsize::new(0));
    let hook: Hook = {
        let (rival, attempts) = (store.clone(), attempts.clone());
        Box::new(move |stage| {
            let (rival, attempts) = (rival.clone(), attempts.clone());
            Box::pin(async move {
                if stage == Stage::AfterRead && attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    let taken = rival.try_lock("s-b", &names(&["x"])).await.expect("the rival commits");
                    assert_eq!(taken.busy, Vec::<String>::new());
                }
            })
        })
    };
    let batch = store
        .try_lock_interleaved("s-a", &names(&["x", "y"]), &*hook)
        .await
        .expect("retried, then committed");
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "the first attempt failed to serialize and ran again"
    );
    assert_eq!(batch.busy, names(&["x"]), "{batch:?}");
    assert_eq!(batch.taken.len(), 1, "{batch:?}");
    let (taken, token) = &batch.taken[0];
    assert_eq!(taken, "y");
    let observed = store.observe_locks(&names(&["x", "y"])).await.unwrap();
    let holders: Vec<_> = observed.locks.iter().map(|l| l.holder.as_deref()).collect();
    assert_eq!(holders, [Some("s-b"), Some("s-a")]);
    assert_eq!(observed.locks[1].token, Some(*token));
    let renewed = store.observe_session("s-a").await.unwrap().record.unwrap().renewed_at;
    assert_eq!(renewed.0, token.0, "renewed once, by the committed attempt");
}

/// S9 on a batch: `COMMIT` reaches the server and its reply is lost. That
/// is an unknown outcome, never success; the server did commit, and asking
/// again confirms the lock with the same token (how the library settles it).
#[tokio::test]
async fn a_batch_whose_commit_reply_is_lost_is_an_unknown_outcome() {
    let fixture = sessions().await;
    fixture.store.open_session("s-a", "test", LEASE).await.unwrap();
    let proxy = TcpProxy::start(fixture.server.addr()).await;
    let timeout = Duration::from_millis(500);
    let through = PostgresStore::connect_with(config(fixture.server.url_at(proxy.addr)), timeout).unwrap();
    through.observe_session("s-a").await.unwrap();
    let hook = switch_at(Stage::BeforeCommit, &proxy, ProxyMode::DelayReplies(timeout * 3));
    let result = through.try_lock_interleaved("s-a", &names(&["x"]), &*hook).await;
    proxy.set(ProxyMode::Forward);
    assert!(matches!(result, Err(StoreError::OutcomeUnknown { .. })), "{result:?}");
    let observed = fixture.store.observe_locks(&names(&["x"])).await.unwrap();
    assert_eq!(observed.locks[0].holder.as_deref(), Some("s-a"), "it committed");
    let again = fixture.store.try_lock("s-a", &names(&["x"])).await.unwrap();
    assert_eq!(again.taken, vec![("x".to_string(), observed.locks[0].token.unwrap())]);
}

/// A batch whose connection is cut before `COMMIT` was sent changed
/// nothing: `Unavailable` (the server rolls the transaction back), and the
/// store, read directly, has neither the lock nor the session's renewal.
#[tokio::test]
async fn a_batch_cut_before_its_commit_writes_nothing() {
    let fixture = sessions().await;
    let opened = fixture.store.open_session("s-a", "test", LEASE).await.unwrap();
    let proxy = TcpProxy::start(fixture.server.addr()).await;
    let through = PostgresStore::connect(config(fixture.server.url_at(proxy.addr))).unwrap();
    through.observe_session("s-a").await.unwrap();
    let hook = switch_at(Stage::AfterRead, &proxy, ProxyMode::Cut);
    let result = through.try_lock_interleaved("s-a", &names(&["x"]), &*hook).await;
    assert!(matches!(result, Err(StoreError::Unavailable { .. })), "{result:?}");
    let observed = fixture.store.observe_locks(&names(&["x"])).await.unwrap();
    assert_eq!(observed.locks[0].token, None, "no row");
    let session = fixture.store.observe_session("s-a").await.unwrap().record.unwrap();
    assert_eq!(session.renewed_at, opened, "not renewed");
}
