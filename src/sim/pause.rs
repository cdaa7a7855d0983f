//! Process pauses (SIGSTOP/SIGCONT) and the paused-time runtime every
//! schedule runs on.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use tokio::sync::watch;

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
#[derive(Clone)]
pub(super) struct Pause(pub(super) watch::Sender<bool>);

impl Pause {
    pub(super) fn new() -> Self {
        Pause(watch::channel(false).0)
    }

    /// `task`, polled only while the process is not paused: its timers fire
    /// late and it sees the time jump, as after SIGSTOP/SIGCONT.
    pub(super) async fn pausable(self, task: impl Future<Output = ()>) {
        let mut task = std::pin::pin!(task);
        let mut paused = self.0.subscribe();
        loop {
            let _ = paused.wait_for(|p| !p).await;
            tokio::select! {
                biased;
                _ = paused.wait_for(|p| *p) => {}
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
