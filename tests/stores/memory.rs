//! The conformance suite on the memory store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation};
use leasehold::lease::{FencingToken, Grant, LeaseStore, SessionStore, StoreError, StoreTime};
use leasehold::store::{Faults, MemoryStore};
use leasehold::testing::conformance::{StoreCall, Target};

struct Memory(MemoryStore);

#[async_trait]
impl Target for Memory {
    fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.0.clone())
    }

    async fn delete_row(&self, lock: &str) {
        self.0.delete_row(lock);
    }

    async fn with_lost_reply(
        &self,
        lock: &str,
        _holder: &str,
        _round_trips: u32,
        call: &StoreCall,
    ) -> Result<Grant, StoreError> {
        self.0.set_faults(Faults {
            drop_reply_after_commit: 1.0,
            ..Default::default()
        });
        let result = call(Arc::new(self.0.clone()), lock.to_string()).await;
        self.0.set_faults(Faults::default());
        result
    }
}

async fn memory() -> Memory {
    Memory(MemoryStore::new(7))
}

leasehold::conformance_tests!(memory());

#[tokio::test]
async fn observe_many_reads_ten_thousand_locks_in_one_call() {
    leasehold::testing::conformance::observe_many_reads_ten_thousand_locks_in_one_call(&memory().await).await;
}

impl leasehold::testing::conformance::sessions::SessionTarget for Memory {
    fn sessions(&self) -> Arc<dyn SessionStore> {
        Arc::new(self.0.clone())
    }
}

leasehold::session_conformance_tests!(memory());

/// The partitions check of the session suite on the memory store, on real
/// time, as on the stores with servers.
#[tokio::test]
async fn partitions_are_shared_and_taken_over_on_memory() {
    leasehold::testing::conformance::sessions::partitions_are_shared_and_taken_over(Arc::new(MemoryStore::new(7)))
        .await;
}

/// A memory store whose `try_lock` for sessions s-1 and s-3 commits and
/// then loses its reply, as a contended commit on the Spanner emulator can
/// (NOT_FOUND "Transaction not found", seen in ci12).
struct RepliesLostFor(MemoryStore);

#[async_trait]
impl SessionStore for RepliesLostFor {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        self.0.ensure_session_schema().await
    }
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        self.0.open_session(session, owner, lease).await
    }
    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        self.0.renew_session(session).await
    }
    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        self.0.close_session(session).await
    }
    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        self.0.observe_session(session).await
    }
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        let batch = self.0.try_lock(session, names).await?;
        match session {
            "s-1" | "s-3" => Err(StoreError::outcome_unknown("reply lost after the commit (test)")),
            _ => Ok(batch),
        }
    }
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        self.0.unlock(session, locks).await
    }
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        self.0.observe_locks(names).await
    }
    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.0.collect_garbage().await
    }
}

/// The racing check accepts a holder whose batch's outcome was unknown,
/// and still requires one holder per lock, each told or left unknown.
#[tokio::test]
async fn racing_sessions_share_disjointly_when_some_commits_are_unknown() {
    let store = Arc::new(RepliesLostFor(MemoryStore::new(7)));
    leasehold::testing::conformance::sessions::racing_sessions_share_disjointly(store, 5).await;
}
