//! How the operator gets a [`LeaseStore`] for a resource's store: Spanner by
//! database and table, PostgreSQL and Redis by the URL in the Secret the
//! resource names, read through the Kubernetes API. Stores that keep
//! sessions (Spanner) are also reached as a [`SessionStore`], on the same
//! connection, for partitioned leases and the collection of dead sessions.
//!
//! Behind a trait so that tests (and the wire-level fixtures) hand the
//! reconciler a `MemoryStore`, while production connects once per store and
//! reuses the connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use tokio::time::Instant;

use crate::observer::still_asked;
use leasehold_core::lease::{LeaseStore, SessionStore, StoreError, StoreIdentity};
use leasehold_kubernetes::api::{SecretKeyRef, ValidLease};
use leasehold_kubernetes::store::KubernetesStore;
use leasehold_runtime::{StoreConfig, no_sessions};
use leasehold_stores::StoreUrl;

/// The store of `valid` in `namespace`; `url` is the one its Secret holds
/// (PostgreSQL, Redis), read by [`read_url`].
pub(crate) fn target_of(valid: &ValidLease, namespace: &str, url: Option<StoreUrl>) -> Result<StoreConfig, StoreError> {
    StoreConfig::of_lease(&valid.store, namespace, || {
        url.ok_or_else(|| StoreError::invalid("the store's URL was not read"))
    })
}

/// The store URL in `secret` of `namespace`, read through the API (RBAC:
/// `get secrets` in that namespace, see `operator::rbac::STORE_RULES`).
pub(crate) async fn read_url(client: &Client, namespace: &str, secret: &SecretKeyRef) -> Result<StoreUrl, StoreError> {
    let name = &secret.name;
    let place = format!("Secret {namespace}/{name}");
    let found = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(status) if status.code == 404 => StoreError::invalid(format!(
                "{place} does not exist: create it with the store's URL under key {key:?} \
                 (kubectl create secret generic {name} -n {namespace} --from-literal={key}=<url>)",
                key = secret.key
            )),
            kube::Error::Api(status) if status.code == 403 => StoreError::invalid(format!(
                "the operator may not read {place}: grant it get on secrets in {namespace} \
                 (Role leasehold-operator-stores, docs/rbac-operator.md)"
            ))
            .caused_by(leasehold_kubernetes::api::errors::KubeCause::of(&e)),
            _ => StoreError::unavailable(format!("reading {place}"))
                .caused_by(leasehold_kubernetes::api::errors::KubeCause::of(&e)),
        })?;
    let bytes = found
        .data
        .as_ref()
        .and_then(|data| data.get(&secret.key))
        .ok_or_else(|| {
            StoreError::invalid(format!(
                "{place} has no key {:?}: put the store's URL under that key",
                secret.key
            ))
        })?;
    let url = std::str::from_utf8(&bytes.0)
        .map_err(|e| StoreError::invalid(format!("{place} key {:?} is not UTF-8", secret.key)).caused_by(e))?;
    Ok(StoreUrl::new(url))
}

#[async_trait]
pub trait StoreProvider: Send + Sync + 'static {
    /// A store for `target`; may be shared with other resources naming the same table.
    async fn store(&self, target: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError>;

    /// The sessions of `target`, on the same connection; `Invalid` for a
    /// store that keeps none.
    async fn sessions(&self, target: &StoreConfig) -> Result<Arc<dyn SessionStore>, StoreError>;

    /// Which store `target` reaches ([`StoreConfig::identity`]).
    async fn identity(&self, target: &StoreConfig) -> Result<StoreIdentity, StoreError>;
}

/// One store for every resource, whatever it names: for tests and for
/// running the operator against a single store.
pub struct SingleStore {
    leases: Arc<dyn LeaseStore>,
    sessions: Option<Arc<dyn SessionStore>>,
    /// What every target is said to reach: one store, so one identity,
    /// until a test points "the Secret" elsewhere ([`SingleStore::reach`]).
    identity: Mutex<StoreIdentity>,
}

impl SingleStore {
    /// A store of lease rows only.
    pub fn new(leases: Arc<dyn LeaseStore>) -> Self {
        SingleStore {
            leases,
            sessions: None,
            identity: Mutex::new(StoreIdentity::new(SINGLE_STORE)),
        }
    }

    /// A store of lease rows and sessions.
    pub fn with_sessions<S: LeaseStore + SessionStore>(store: Arc<S>) -> Self {
        SingleStore {
            leases: store.clone(),
            sessions: Some(store),
            identity: Mutex::new(StoreIdentity::new(SINGLE_STORE)),
        }
    }

    /// From now on every target reaches the store named `identity`, as a
    /// Secret edited to another store would (the rows stay this store's:
    /// what is read through the other identity is a test's business).
    pub fn reach(&self, identity: &str) {
        *self.identity.lock().unwrap_or_else(|e| e.into_inner()) = StoreIdentity::new(identity);
    }
}

#[async_trait]
impl StoreProvider for SingleStore {
    async fn store(&self, _target: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
        Ok(self.leases.clone())
    }

    async fn sessions(&self, target: &StoreConfig) -> Result<Arc<dyn SessionStore>, StoreError> {
        self.sessions.clone().ok_or_else(|| no_sessions(target.kind()))
    }

    async fn identity(&self, _target: &StoreConfig) -> Result<StoreIdentity, StoreError> {
        Ok(self.identity.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The identity a [`SingleStore`] reports until told otherwise.
pub const SINGLE_STORE: &str = "memory:single";

/// One open store: its lease rows, and its sessions where it keeps them.
#[derive(Clone)]
struct Opened {
    leases: Arc<dyn LeaseStore>,
    sessions: Option<Arc<dyn SessionStore>>,
}

/// Store connections, opened on first use and kept per [`StoreConfig::key`]
/// while some reconcile asks for them: one no reconcile asked for in
/// [`FORGET_AFTER`](crate::observer::FORGET_AFTER) (its leases deleted or pointed elsewhere) is closed,
/// so a deleted namespace's Lease watch and a dropped database's pool do
/// not live on. A failed connect is not cached, so the next reconcile
/// tries again.
#[derive(Default)]
pub(crate) struct OpenStores {
    open: Mutex<HashMap<String, (Opened, Instant)>>,
}

impl OpenStores {
    async fn open(&self, target: &StoreConfig) -> Result<Opened, StoreError> {
        self.open_at(target, Instant::now()).await
    }

    async fn open_at(&self, target: &StoreConfig, now: Instant) -> Result<Opened, StoreError> {
        let key = target.key();
        {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|_, (_, asked)| still_asked(*asked, now));
            if let Some((opened, asked)) = open.get_mut(&key) {
                *asked = now;
                return Ok(opened.clone());
            }
        }
        let (leases, sessions) = match target {
            // Every Lease of the namespace through one watch, not a read per
            // lock and retry period (issue 39).
            StoreConfig::Kubernetes(config) => {
                let store = KubernetesStore::connect(config.clone()).await?.watching_namespace();
                (Arc::new(store) as Arc<dyn LeaseStore>, None)
            }
            _ => target.connect_both().await?,
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (opened, _) = open.entry(key).or_insert((Opened { leases, sessions }, now));
        Ok(opened.clone())
    }

    /// How many stores are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[async_trait]
impl StoreProvider for OpenStores {
    async fn store(&self, target: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
        Ok(self.open(target).await?.leases)
    }

    async fn sessions(&self, target: &StoreConfig) -> Result<Arc<dyn SessionStore>, StoreError> {
        self.open(target)
            .await?
            .sessions
            .ok_or_else(|| no_sessions(target.kind()))
    }

    async fn identity(&self, target: &StoreConfig) -> Result<StoreIdentity, StoreError> {
        target.identity().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::observer::FORGET_AFTER;
    use crate::reconcile::OBSERVED_REQUEUE;
    use leasehold_stores::postgres::PostgresConfig;

    /// A PostgreSQL store at `port` (its pool connects lazily: nothing is
    /// dialled here).
    fn postgres(port: u16) -> StoreConfig {
        StoreConfig::Postgres(PostgresConfig {
            url: StoreUrl::new(format!("postgres://leasehold@127.0.0.1:{port}/postgres")),
            table: "leasehold_leases".into(),
        })
    }

    /// A store some reconcile keeps asking for stays one connection; one
    /// no reconcile asked for in FORGET_AFTER is closed, and asking again
    /// opens it afresh.
    #[tokio::test]
    async fn a_store_no_reconcile_asks_for_is_closed_and_one_in_use_is_kept() {
        let stores = OpenStores::default();
        let (kept, dropped) = (postgres(1), postgres(2));
        let start = Instant::now();
        let first = stores.open_at(&kept, start).await.unwrap().leases;
        let gone = stores.open_at(&dropped, start).await.unwrap().leases;
        assert_eq!(stores.len(), 2);

        let mut at = start;
        while at < start + FORGET_AFTER * 2 {
            at += OBSERVED_REQUEUE;
            let again = stores.open_at(&kept, at).await.unwrap().leases;
            assert!(
                Arc::ptr_eq(&first, &again),
                "asked for every requeue: the same connection"
            );
        }
        assert_eq!(stores.len(), 1, "the store nobody asked for is closed");
        let reopened = stores
            .open_at(&dropped, at + Duration::from_secs(1))
            .await
            .unwrap()
            .leases;
        assert!(!Arc::ptr_eq(&gone, &reopened), "asked for again: opened afresh");
        assert_eq!(stores.len(), 2);
    }
}
