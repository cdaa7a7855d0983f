//! Process pauses (SIGSTOP/SIGCONT) and the paused-time runtime every
//! schedule runs on.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::signal::Signal;
use leasehold_core::lease::seams::TaskWrapper;

/// A current-thread runtime on paused time: schedules replay exactly.
pub(super) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// A process-pause switch: while on, none of the process's tasks run.
/// A [`Signal`], not a `watch`, so the tasks wake in a replayable order.
#[derive(Clone, Default)]
pub(super) struct Pause(Arc<Signal<bool>>);

impl Pause {
    pub(super) fn new() -> Self {
        Pause::default()
    }

    /// Pauses (SIGSTOP) or resumes (SIGCONT) the process.
    pub(super) fn set(&self, paused: bool) {
        self.0.set(paused);
    }

    /// Returns once the switch is `paused`.
    async fn until(&self, paused: bool) {
        self.0.wait_for(|p| *p == paused).await;
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
