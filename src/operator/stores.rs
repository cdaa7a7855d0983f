//! How the operator gets a [`LeaseStore`] for a resource's database and table.
//!
//! Behind a trait so that tests (and the wire-level fixtures) hand the
//! reconciler a `MemoryStore`, while production connects to Spanner once per
//! database and table and reuses the connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::lease::{LeaseStore, StoreError};
use crate::store::spanner::SpannerConfig;

#[async_trait]
pub trait StoreProvider: Send + Sync + 'static {
    /// A store for `config`; may be shared with other resources naming the same table.
    async fn store(&self, config: &SpannerConfig) -> Result<Arc<dyn LeaseStore>, StoreError>;
}

/// One store for every resource, whatever database it names: for tests and
/// for running the operator against a single store.
pub struct SingleStore(pub Arc<dyn LeaseStore>);

#[async_trait]
impl StoreProvider for SingleStore {
    async fn store(&self, _config: &SpannerConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
        Ok(self.0.clone())
    }
}

/// Spanner connections, opened on first use and kept per (database, table).
/// A failed connect is not cached, so the next reconcile tries again.
#[derive(Default)]
pub struct SpannerStores {
    open: Mutex<HashMap<(String, String), Arc<dyn LeaseStore>>>,
}

#[async_trait]
impl StoreProvider for SpannerStores {
    async fn store(&self, config: &SpannerConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
        let key = (config.database.clone(), config.table.clone());
        if let Some(store) = self.open.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(store.clone());
        }
        let store = connect_spanner(config.clone()).await?;
        Ok(self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert(store)
            .clone())
    }
}

/// Opens the Spanner store for one database and table.
pub async fn connect_spanner(config: SpannerConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    Ok(Arc::new(crate::store::spanner::SpannerStore::connect(config).await?))
}
