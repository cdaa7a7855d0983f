//! The simulation's seams into the core: a deliberate flaw (a mutant the
//! safety checker must catch) and a wrapper around every task the elector
//! spawns, set at construction (`Elector::with_sim_hooks`, and likewise the
//! partitioner's, the version watch's and the locality judgements' flaws;
//! the memory store has its own, `store::memory::SessionFlaw`), absent otherwise.
//!
//! Hidden from the documentation and not part of the API anyone may rely
//! on: **each flaw plants a safety bug** (two leaders, a lost write), which
//! is what the simulation needs and what no product may set. They are
//! plain items, compiled in every build, rather than `cfg` hooks, so the
//! core keeps no knowledge of which layer above uses them. Kept apart from
//! the elector so that its file holds the product's logic only.

use std::sync::Arc;

use tokio::task::JoinHandle;

/// A deliberate safety bug, for the simulation's mutants only: the checker
/// must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
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
/// simulation pauses a whole process this way.
pub type TaskWrapper =
    Arc<dyn Fn(futures::future::BoxFuture<'static, ()>) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// The simulation's hooks; both absent outside it.
#[derive(Clone, Default)]
pub struct SimHooks {
    pub flaw: Option<Flaw>,
    pub wrap: Option<TaskWrapper>,
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
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        match &self.wrap {
            Some(wrap) => tokio::spawn(wrap(Box::pin(task))),
            None => tokio::spawn(task),
        }
    }
}

/// A deliberate locality bug, for the simulation's mutants only: the
/// checker must catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalityFlaw {
    /// Two holders without cluster names count as one cluster's (the
    /// `is_local` before issue 37): a same-named pod in another cluster is
    /// "ours".
    UnnamedClustersMatch,
    /// A label repair judges the holder by its pod name alone, whatever
    /// cluster it names: a same-named pod of the cluster that does not lead
    /// keeps a stale leader label.
    LabelByNameAlone,
    /// A label repair keeps a label only for a holder proven local (both
    /// sides named, as a release needs): without cluster names it takes the
    /// live leader's own label.
    LabelNeedsProof,
}

/// A planted bug for the simulation to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionFlaw {
    /// Never hands extras over: a member that rejoins, or joins late, waits
    /// for ever while others keep more than their quota.
    ExtrasKept,
}
