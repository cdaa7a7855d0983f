//! Release notices that a store pushes to its followers (PostgreSQL
//! `NOTIFY`, Redis `PUBLISH`, both sent by the releasing statement or
//! script itself), so that a follower learns of a release at once instead of
//! at its next poll ([`LeaseStore::changed`](crate::lease::LeaseStore::changed)).
//!
//! A notice is only a reason to look again: the follower still observes and
//! acquires by check-and-set, so a notice can never make anyone lead. A
//! notice that is lost (the listening connection down or not yet listening,
//! the server failing over) costs at most the poll it would have saved: the
//! elector's poll timer runs beside the wait for a notice.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;
use tracing::debug;

use crate::lease::StoreError;

/// Notices buffered per follower; a follower that falls further behind
/// wakes once (its lock's notice may be among those dropped).
const BUFFERED: usize = 64;

/// The locks whose release a store's listening connection reported, shared
/// by every follower of the store. The connection is opened by the first
/// follower that waits, and opened again (with backoff) whenever it ends.
pub(crate) struct Releases {
    notices: broadcast::Sender<String>,
    listening: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl Releases {
    pub(crate) fn new() -> Self {
        Releases {
            notices: broadcast::channel(BUFFERED).0,
            listening: Mutex::new(None),
        }
    }

    /// Resolves once a release of `lock` is reported. `listen` is the
    /// store's listener: it connects, subscribes, sends every released lock
    /// it is told of into the sender, and returns when its connection ends.
    pub(crate) async fn released<L, F>(&self, lock: &str, listen: L)
    where
        L: Fn(broadcast::Sender<String>) -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send,
    {
        self.reported(|released| released == lock, listen).await
    }

    /// Resolves once a release of any lock is reported (`listen` as in
    /// [`released`](Self::released)): what an observer of every lock waits for.
    pub(crate) async fn any<L, F>(&self, listen: L)
    where
        L: Fn(broadcast::Sender<String>) -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send,
    {
        self.reported(|_| true, listen).await
    }

    /// Resolves once a reported release is `wanted`, or notices were lost.
    async fn reported<L, F>(&self, wanted: impl Fn(&str) -> bool, listen: L)
    where
        L: Fn(broadcast::Sender<String>) -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send,
    {
        let mut notices = self.notices.subscribe();
        self.start(listen);
        loop {
            match notices.recv().await {
                Ok(released) if wanted(&released) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                // The store is gone; its followers only poll.
                Err(broadcast::error::RecvError::Closed) => return futures::future::pending().await,
            }
        }
    }

    fn start<L, F>(&self, listen: L)
    where
        L: Fn(broadcast::Sender<String>) -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send,
    {
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if listening.is_some() {
            return;
        }
        let notices = self.notices.clone();
        let task = async move {
            let backoff = || {
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(10))
                    .with_jitter()
                    .without_max_times()
                    .build()
            };
            let mut delays = backoff();
            loop {
                match listen(notices.clone()).await {
                    Ok(()) => {
                        debug!("the release listener's connection ended; listening again");
                        delays = backoff();
                    }
                    Err(e) => debug!(error = %e.chain(), "no release listener; followers poll until it is back"),
                }
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(10))).await;
            }
        };
        *listening = Some(AbortOnDropHandle::new(tokio::spawn(task)));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A listener that fails once, then reports "other" and "mine" and stays
    /// connected: the waiter for "mine" wakes after the retry; one for a lock
    /// nobody released keeps waiting (its follower polls).
    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_for_its_own_lock_once_the_listener_is_back() {
        let releases = Releases::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let listen = move |notices: broadcast::Sender<String>| {
            let attempt = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if attempt == 0 {
                    return Err(StoreError::unavailable("connection refused"));
                }
                for lock in ["other", "mine"] {
                    notices.send(lock.to_string()).expect("a waiter");
                }
                futures::future::pending().await
            }
        };
        let unreleased = releases.released("unreleased", |_| futures::future::pending::<Result<(), StoreError>>());
        tokio::select! {
            biased;
            () = releases.released("mine", listen) => {}
            () = unreleased => panic!("woken for a lock nobody released"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "failed once, then listened");
        let waiting = releases.released("unreleased", |_| futures::future::pending::<Result<(), StoreError>>());
        let still = tokio::time::timeout(Duration::from_secs(3600), waiting).await;
        assert!(still.is_err(), "no notice, no wake-up");
    }
}
