//! Process pauses (SIGSTOP/SIGCONT) and the paused-time runtime every
//! schedule runs on.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::lease::sim_hooks::TaskWrapper;

/// A current-thread runtime on paused time: schedules replay exactly.
pub(super) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// A process-pause switch: while on, none of the process's tasks run.
///
/// A flag and a [`Notify`], not a `watch` channel: tokio's `watch` spreads
/// its receivers over eight `Notify`s picked at random per runtime
/// (`BigNotify` in tokio/src/sync/watch.rs), so the tasks of one process
/// would wake in a different order on every run and a seed would not
/// replay. `Notify::notify_waiters` wakes in the order the waiters came.
#[derive(Clone, Default)]
pub(super) struct Pause(Arc<PauseState>);

#[derive(Default)]
struct PauseState {
    paused: AtomicBool,
    changed: Notify,
}

impl Pause {
    pub(super) fn new() -> Self {
        Pause::default()
    }

    /// Pauses (SIGSTOP) or resumes (SIGCONT) the process.
    pub(super) fn set(&self, paused: bool) {
        self.0.paused.store(paused, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// Returns once the switch is `paused`.
    async fn until(&self, paused: bool) {
        loop {
            let changed = self.0.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before the check, so a change in between still wakes us.
            changed.as_mut().enable();
            if self.0.paused.load(Ordering::SeqCst) == paused {
                return;
            }
            changed.await;
        }
    }

    /// `task`, polled only while the process is not paused: its timers fire
    /// late and it sees the time jump, as after SIGSTOP/SIGCONT.
    pub(super) async fn pausable(self, task: impl Future<Output = ()>) {
        let mut task = std::pin::pin!(task);
        loop {
            self.until(false).await;
            tokio::select! {
                biased;
                () = self.until(true) => {}
                () = &mut task => return,
            }
        }
    }

    /// Every task of the process, pausable.
    pub(super) fn wrapper(&self) -> TaskWrapper {
        let pause = self.clone();
        Arc::new(move |task: BoxFuture<'static, ()>| Box::pin(pause.clone().pausable(task)))
    }
}
