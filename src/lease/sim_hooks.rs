//! The simulation's one way into the elector: a deliberate flaw (a mutant
//! the safety checker must catch) and a wrapper around every task the
//! elector spawns, both set at construction
//! (`Elector::with_sim_hooks`, feature `simulate`) and absent otherwise. Kept
//! apart from the elector so that its file holds the product's logic only.

use std::sync::Arc;

use tokio::task::JoinHandle;

/// A deliberate safety bug, for the simulation's mutants only: the checker
/// must catch each. Crate-private, so no user of the library can set one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "simulate"), allow(dead_code))]
pub(crate) enum Flaw {
    /// deadline = reply + R instead of send + R.
    DeadlineFromReply,
    /// deadline = send + D instead of send + R.
    DeadlineFromLeaseDuration,
    /// An unknown acquire or renew outcome is taken as success.
    UnknownOutcomeAsSuccess,
    /// Releases first, then stops claiming and waits for the leader work.
    ReleaseBeforeWorkStopped,
    /// A leader told to stand aside for another version keeps its term;
    /// only followers stop campaigning.
    LeaderIgnoresStandAside,
}

/// Wraps every task the elector spawns (its own and the leader work's): the
/// simulation pauses a whole process this way. Crate-private like [`Flaw`].
pub(crate) type TaskWrapper =
    Arc<dyn Fn(futures::future::BoxFuture<'static, ()>) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// The simulation's hooks; both absent outside it.
#[derive(Clone, Default)]
pub(crate) struct SimHooks {
    pub(crate) flaw: Option<Flaw>,
    pub(crate) wrap: Option<TaskWrapper>,
}

impl std::fmt::Debug for SimHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHooks")
            .field("flaw", &self.flaw)
            .field("wrap", &self.wrap.is_some())
            .finish()
    }
}

impl SimHooks {
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        match &self.wrap {
            Some(wrap) => tokio::spawn(wrap(Box::pin(task))),
            None => tokio::spawn(task),
        }
    }
}
