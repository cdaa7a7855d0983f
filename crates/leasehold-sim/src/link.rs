//! The faulty store as each process reaches it: a link with its own
//! latency each way, duplicated requests and requests that still commit
//! after the client gave up or crashed; the mutant stores live here too,
//! since they are wrong ways to talk to the store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rand::{RngExt, rngs::StdRng};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::mutants::Mutant;
use leasehold_core::lease::{Claim, FencingToken, Grant, LeaseStore, Observation, Release, StoreError, StoreTime};
use leasehold_core::store::memory::MemoryStore;
use leasehold_core::store::memory::grant;

/// One candidate's network link: latency each way, duplicated requests.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LinkFaults {
    pub(super) to_store: Duration,
    pub(super) from_store: Duration,
    pub(super) duplicate: f64,
}

/// Counters the links share with the schedule.
#[derive(Default)]
pub(super) struct LinkStats {
    pub(super) late_commits: u64,
    pub(super) duplicates: u64,
}

/// The candidate's connection to the store `S`. A request, once sent, is on
/// its own: it reaches the store and commits even if the client gave up or
/// crashed meanwhile; the client sees the reply `from_store` later. The
/// mutant stores live here too, since they are wrong ways to talk to it.
pub(super) struct Link<S = MemoryStore> {
    pub(super) store: S,
    pub(super) faults: Arc<Mutex<LinkFaults>>,
    pub(super) rng: Arc<Mutex<StdRng>>,
    pub(super) stats: Arc<Mutex<LinkStats>>,
    /// Whether requests may be delivered twice.
    pub(super) duplicates: bool,
    pub(super) mutant: Option<Mutant>,
    /// The candidate's wall clock, for the token-from-local-clock mutant.
    pub(super) local_clock: StoreTime,
    pub(super) started: Instant,
}

impl<S: Clone + Send + Sync + 'static> Link<S> {
    pub(super) async fn send<T: Send + 'static>(
        &self,
        write: bool,
        request: impl Fn(S) -> BoxFuture<'static, Result<T, StoreError>> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        self.send_judged(write, |_| true, request).await
    }

    /// [`send`](Self::send), where `committed` tells which replies are of
    /// writes that took effect (for counting late commits).
    pub(super) async fn send_judged<T: Send + 'static>(
        &self,
        write: bool,
        committed: fn(&T) -> bool,
        request: impl Fn(S) -> BoxFuture<'static, Result<T, StoreError>> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        let faults = *self.faults.lock().unwrap();
        let (reply_tx, reply_rx) = oneshot::channel();
        let request = Arc::new(request);
        let (store, stats, first) = (self.store.clone(), self.stats.clone(), request.clone());
        tokio::spawn(async move {
            tokio::time::sleep(faults.to_store).await;
            let outcome = first(store).await;
            let committed = outcome.as_ref().is_ok_and(committed);
            if reply_tx.send(outcome).is_err() && write && committed {
                stats.lock().unwrap().late_commits += 1;
            }
        });
        if self.duplicates && faults.duplicate > 0.0 && self.rng.lock().unwrap().random_bool(faults.duplicate) {
            self.stats.lock().unwrap().duplicates += 1;
            let again = faults.to_store * 2 + Duration::from_millis(self.rng.lock().unwrap().random_range(0..200));
            let store = self.store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(again).await;
                let _ = request(store).await;
            });
        }
        let reply = reply_rx
            .await
            .unwrap_or_else(|_| Err(StoreError::outcome_unknown("request lost")));
        tokio::time::sleep(faults.from_store).await;
        reply
    }

    /// The store the link leads to.
    pub(super) fn store(&self) -> &S {
        &self.store
    }

    /// The link's faults, which the schedule changes.
    pub(super) fn faults(&self) -> Arc<Mutex<LinkFaults>> {
        self.faults.clone()
    }

    pub(super) fn local_now(&self) -> FencingToken {
        FencingToken(self.local_clock.saturating_add(self.started.elapsed()).0)
    }
}

#[async_trait]
impl LeaseStore for Link {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    async fn ensure_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        let lock = lock.to_string();
        self.send(false, move |store| {
            let lock = lock.clone();
            Box::pin(async move { store.observe(&lock).await })
        })
        .await
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        let (lock, holder) = (lock.to_string(), claim.holder.to_string());
        // The mutant leaves the fence to the elector's own earlier read.
        let fence = claim.fence && self.mutant != Some(Mutant::FenceOnlyInTheElector);
        let version = claim.version.cloned();
        match self.mutant {
            Some(Mutant::FollowerAcquiresOnOwnObservation) => {
                // Judges expiry on its own read, then writes blindly.
                let seen = self.observe(&lock).await?;
                if let Some(current) = seen.live_holder() {
                    return Err(StoreError::Lost {
                        lock,
                        reason: format!("held by {current}"),
                    });
                }
                self.send(true, move |store| {
                    let (lock, holder, seen, version) = (lock.clone(), holder.clone(), seen.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store
                            .transact_unchecked(&lock, |_row, commit| {
                                grant(
                                    &lock,
                                    &claim,
                                    lease,
                                    seen.record.as_ref(),
                                    seen.now,
                                    FencingToken(commit.0),
                                )
                            })
                            .await
                    })
                })
                .await
            }
            Some(Mutant::TokenFromLocalClock) => {
                let token = self.local_now();
                self.send(true, move |store| {
                    let (lock, holder, version) = (lock.clone(), holder.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store
                            .transact_unchecked(&lock, |row, commit| grant(&lock, &claim, lease, row, commit, token))
                            .await
                    })
                })
                .await
            }
            _ => {
                self.send(true, move |store| {
                    let (lock, holder, version) = (lock.clone(), holder.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store.acquire_as(&lock, &claim, lease).await
                    })
                })
                .await
            }
        }
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        let (lock, holder) = (lock.to_string(), holder.to_string());
        if self.mutant == Some(Mutant::RenewWithoutCas) {
            return self
                .send(true, move |store| {
                    let lock = lock.clone();
                    Box::pin(async move {
                        store
                            .transact_unchecked(&lock, |row, commit| {
                                let row = row.cloned().ok_or_else(|| StoreError::Lost {
                                    lock: lock.clone(),
                                    reason: "no such lease".into(),
                                })?;
                                let term = row.term;
                                let renewed = leasehold_core::lease::LeaseRecord {
                                    renewed_at: Some(commit),
                                    lease_duration: lease,
                                    ..row
                                };
                                Ok((
                                    Some(renewed),
                                    Grant {
                                        term,
                                        token,
                                        committed_at: commit,
                                    },
                                ))
                            })
                            .await
                    })
                })
                .await;
        }
        self.send(true, move |store| {
            let (lock, holder) = (lock.clone(), holder.clone());
            Box::pin(async move { store.renew(&lock, &holder, token, lease).await })
        })
        .await
    }

    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        let (lock, holder, release) = (lock.to_string(), holder.to_string(), release.clone());
        self.send(true, move |store| {
            let (lock, holder, release) = (lock.clone(), holder.clone(), release.clone());
            Box::pin(async move { store.release_for(&lock, &holder, token, &release).await })
        })
        .await
    }
}
