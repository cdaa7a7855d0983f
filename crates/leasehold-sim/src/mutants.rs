//! The mutants: deliberately broken electors and stores, each breaking
//! one safety rule, that the checker must catch.

use leasehold_core::lease::seams::{Flaw, LocalityFlaw};

/// A deliberately broken elector or store: each breaks one safety rule,
/// and the checker must catch every one (tests/lease/simulation.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutant {
    DeadlineFromReply,
    DeadlineDInsteadOfR,
    RenewWithoutCas,
    UnknownOutcomeAsSuccess,
    FollowerAcquiresOnOwnObservation,
    ReleaseBeforeWorkStopped,
    TokenFromLocalClock,
    SessionRenewWithoutCas,
    SessionRenewedAfterExpiry,
    LockTakenFromLiveSession,
    FenceOnlyInTheElector,
    PartitionExtrasKept,
    LeaderIgnoresStandAside,
    StandAsideForFencedPeers,
    ExpiryFromRenewTime,
    WriteWithoutResourceVersion,
    TokenFromLeaseTransitions,
    CreateTokenFromList,
    ReleaseAcrossClusters,
    HistoryRecordsATermTwice,
    HistoryMergesRecountedTerms,
    LabelRepairByNameAlone,
    LabelRepairNeedsProof,
}

impl Mutant {
    pub const ALL: [Mutant; 23] = [
        Mutant::DeadlineFromReply,
        Mutant::DeadlineDInsteadOfR,
        Mutant::RenewWithoutCas,
        Mutant::UnknownOutcomeAsSuccess,
        Mutant::FollowerAcquiresOnOwnObservation,
        Mutant::ReleaseBeforeWorkStopped,
        Mutant::TokenFromLocalClock,
        Mutant::SessionRenewWithoutCas,
        Mutant::SessionRenewedAfterExpiry,
        Mutant::LockTakenFromLiveSession,
        Mutant::FenceOnlyInTheElector,
        Mutant::PartitionExtrasKept,
        Mutant::LeaderIgnoresStandAside,
        Mutant::StandAsideForFencedPeers,
        Mutant::ExpiryFromRenewTime,
        Mutant::WriteWithoutResourceVersion,
        Mutant::TokenFromLeaseTransitions,
        Mutant::CreateTokenFromList,
        Mutant::ReleaseAcrossClusters,
        Mutant::HistoryRecordsATermTwice,
        Mutant::HistoryMergesRecountedTerms,
        Mutant::LabelRepairByNameAlone,
        Mutant::LabelRepairNeedsProof,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutant::DeadlineFromReply => "deadline-from-reply",
            Mutant::DeadlineDInsteadOfR => "deadline-D-instead-of-R",
            Mutant::RenewWithoutCas => "renew-without-CAS",
            Mutant::UnknownOutcomeAsSuccess => "unknown-outcome-as-success",
            Mutant::FollowerAcquiresOnOwnObservation => "follower-acquires-on-own-observation",
            Mutant::ReleaseBeforeWorkStopped => "release-before-work-stopped",
            Mutant::TokenFromLocalClock => "token-from-local-clock",
            Mutant::SessionRenewWithoutCas => "session-renew-without-CAS",
            Mutant::SessionRenewedAfterExpiry => "session-renewed-after-expiry",
            Mutant::LockTakenFromLiveSession => "lock-taken-from-live-session",
            Mutant::FenceOnlyInTheElector => "fence-only-in-the-elector",
            Mutant::PartitionExtrasKept => "partition-extras-kept",
            Mutant::LeaderIgnoresStandAside => "leader-ignores-stand-aside",
            Mutant::StandAsideForFencedPeers => "stand-aside-for-fenced-peers",
            Mutant::ExpiryFromRenewTime => "expiry-from-renewTime",
            Mutant::WriteWithoutResourceVersion => "write-without-resourceVersion",
            Mutant::TokenFromLeaseTransitions => "token-from-leaseTransitions",
            Mutant::CreateTokenFromList => "create-token-from-list",
            Mutant::ReleaseAcrossClusters => "release-across-clusters",
            Mutant::HistoryRecordsATermTwice => "history-records-a-term-twice",
            Mutant::HistoryMergesRecountedTerms => "history-merges-recounted-terms",
            Mutant::LabelRepairByNameAlone => "label-repair-by-name-alone",
            Mutant::LabelRepairNeedsProof => "label-repair-needs-proof",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Mutant::DeadlineFromReply => "the leader's deadline is reply + R, not send + R",
            Mutant::DeadlineDInsteadOfR => "the leader's deadline is send + D, not send + R",
            Mutant::RenewWithoutCas => "renew updates the row without checking holder and token",
            Mutant::UnknownOutcomeAsSuccess => "an unknown acquire or renew outcome counts as success",
            Mutant::FollowerAcquiresOnOwnObservation => {
                "acquire writes when the follower's own earlier read looked expired"
            }
            Mutant::ReleaseBeforeWorkStopped => "release before the leader work has stopped",
            Mutant::TokenFromLocalClock => "the fencing token comes from the candidate's clock",
            Mutant::SessionRenewWithoutCas => {
                "session renewal writes the row whatever is there (closed, collected or expired)"
            }
            Mutant::SessionRenewedAfterExpiry => {
                "session renewal does not check expiry: an expired session lives again"
            }
            Mutant::LockTakenFromLiveSession => {
                "a lock is judged free by its own age, while its holder session is still live"
            }
            Mutant::FenceOnlyInTheElector => {
                "the version fence is judged on the follower's own read, not in the acquiring transaction"
            }
            Mutant::PartitionExtrasKept => "a partition member never hands extra partitions over to a new member",
            Mutant::LeaderIgnoresStandAside => {
                "a leader told to stand aside for a preferred version keeps leading; only followers stop"
            }
            Mutant::StandAsideForFencedPeers => {
                "candidates stand aside for a peer of the preferred version that the version fence refuses"
            }
            Mutant::ExpiryFromRenewTime => {
                "Kubernetes: a Lease is judged expired by its renewTime against the candidate's own (skewed) wall clock"
            }
            Mutant::WriteWithoutResourceVersion => {
                "Kubernetes: writes replace the Lease without the resourceVersion precondition"
            }
            Mutant::TokenFromLeaseTransitions => {
                "Kubernetes: the token is the Lease's leaseTransitions, which starts again when the Lease is recreated"
            }
            Mutant::CreateTokenFromList => {
                "Kubernetes: a create's token is the resourceVersion of the list before it, which a create and a \
                 delete landing in between outdate"
            }
            Mutant::ReleaseAcrossClusters => {
                "two clusters: the operator takes a holder without a cluster name for its own (is_local before \
                 issue 37) and releases another cluster's live leader when it deletes its own pod of that name"
            }
            Mutant::HistoryRecordsATermTwice => {
                "the operator folds status.history by whole entry instead of by term, so a term read again after \
                 a renewal is recorded again"
            }
            Mutant::HistoryMergesRecountedTerms => {
                "Kubernetes: the operator folds status.history by term alone, so the terms of a Lease created \
                 again, counted from 1, land on the old entries of those numbers"
            }
            Mutant::LabelRepairByNameAlone => {
                "two clusters: the operator's label repair judges the holder by its pod name alone, so a pod of \
                 that name in the cluster that does not lead keeps a stale leader label"
            }
            Mutant::LabelRepairNeedsProof => {
                "two clusters: the operator's label repair keeps a label only for a holder proven local, as a \
                 release does, so without cluster names it takes the leader's own label"
            }
        }
    }

    /// The elector-side bug, when the mutant is one.
    pub(super) fn flaw(self) -> Option<Flaw> {
        match self {
            Mutant::DeadlineFromReply => Some(Flaw::DeadlineFromReply),
            Mutant::DeadlineDInsteadOfR => Some(Flaw::DeadlineFromLeaseDuration),
            Mutant::UnknownOutcomeAsSuccess => Some(Flaw::UnknownOutcomeAsSuccess),
            Mutant::ReleaseBeforeWorkStopped => Some(Flaw::ReleaseBeforeWorkStopped),
            Mutant::LeaderIgnoresStandAside => Some(Flaw::LeaderIgnoresStandAside),
            Mutant::RenewWithoutCas
            | Mutant::FollowerAcquiresOnOwnObservation
            | Mutant::TokenFromLocalClock
            | Mutant::SessionRenewWithoutCas
            | Mutant::SessionRenewedAfterExpiry
            | Mutant::LockTakenFromLiveSession
            | Mutant::FenceOnlyInTheElector
            | Mutant::PartitionExtrasKept
            | Mutant::StandAsideForFencedPeers
            | Mutant::ExpiryFromRenewTime
            | Mutant::WriteWithoutResourceVersion
            | Mutant::TokenFromLeaseTransitions
            | Mutant::CreateTokenFromList
            | Mutant::ReleaseAcrossClusters
            | Mutant::HistoryRecordsATermTwice
            | Mutant::HistoryMergesRecountedTerms
            | Mutant::LabelRepairByNameAlone
            | Mutant::LabelRepairNeedsProof => None,
        }
    }

    /// The operator's locality bug, when the mutant is one: caught in
    /// schedules with two clusters sharing the store.
    pub(super) fn locality_flaw(self) -> Option<LocalityFlaw> {
        match self {
            Mutant::ReleaseAcrossClusters => Some(LocalityFlaw::UnnamedClustersMatch),
            Mutant::LabelRepairByNameAlone => Some(LocalityFlaw::LabelByNameAlone),
            Mutant::LabelRepairNeedsProof => Some(LocalityFlaw::LabelNeedsProof),
            _ => None,
        }
    }

    /// Whether the mutant is of the Kubernetes store (caught on its semantics).
    pub fn is_kubernetes(self) -> bool {
        matches!(
            self,
            Mutant::ExpiryFromRenewTime
                | Mutant::WriteWithoutResourceVersion
                | Mutant::TokenFromLeaseTransitions
                | Mutant::CreateTokenFromList
                | Mutant::HistoryMergesRecountedTerms
        )
    }
}

impl std::str::FromStr for Mutant {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Mutant::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| anyhow::anyhow!("--mutant {name:?} is not one of: list, {}", names()))
    }
}

fn names() -> String {
    Mutant::ALL.map(Mutant::name).join(", ")
}
