//! The conformance suite on the memory store.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::lease::{Grant, LeaseStore, StoreError};
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

impl leasehold::testing::conformance::sessions::SessionTarget for Memory {
    fn sessions(&self) -> Arc<dyn leasehold::lease::SessionStore> {
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
