//! What schedules report: counts per seed and in total, and a violation
//! with the seed that replays it.

use std::fmt;

use super::mutants::Mutant;

/// What one schedule did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub counts: Counts,
    pub events: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        write!(f, "seed {}: {}", self.seed, self.counts)
    }
}

/// Totals over many seeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub seeds: u64,
    pub counts: Counts,
}

impl Summary {
    pub fn add(&mut self, r: &Report) {
        self.seeds += 1;
        self.counts.add(&r.counts);
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.counts.fmt(f)
    }
}

/// What happened in one schedule, or in many added up.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub terms: u64,
    pub accepted: u64,
    pub fenced: u64,
    pub crashes: u64,
    pub long_pauses: u64,
    /// Stale writes accepted from a writer paused past the margin.
    pub excused: u64,
    /// Requests that committed after their client had given up on them.
    pub late_commits: u64,
    pub duplicates: u64,
    pub clock_jumps: u64,
    pub deleted_live: u64,
    /// Schedules run on Redis's TTL expiry (1 or 0 for one schedule).
    pub ttl_seeds: u64,
    /// Leases that vanished at their TTL.
    pub ttl_expiries: u64,
    /// Sessions that expired and were replaced by a new one (sessions schedule).
    pub sessions_replaced: u64,
    /// Schedules run with the version fence (1 or 0 for one schedule).
    pub fenced_schedules: u64,
    /// Acquisitions that moved leadership to a newer revision.
    pub version_moves: u64,
    /// Session schedules whose processes share partitions (1 or 0 for one schedule).
    pub partition_schedules: u64,
    /// Leaders told to stand aside for a preferred version (rollout schedule).
    pub stand_asides: u64,
    /// Rollout schedules whose lease prefers `Newest` (the rest `Oldest`).
    pub newest_schedules: u64,
    /// Elector schedules on the Kubernetes store's semantics (1 or 0 for one schedule).
    pub kubernetes_schedules: u64,
    /// Kubernetes writes refused (409) because judged on a version no longer current.
    pub stale_conflicts: u64,
    /// Kubernetes Leases created again after a deletion.
    pub recreated: u64,
    /// Session schedules on PostgreSQL's semantics (1 or 0 for one schedule).
    pub postgres_schedules: u64,
    /// Session schedules on Redis's semantics (1 or 0 for one schedule).
    pub redis_schedules: u64,
    /// PostgreSQL transactions aborted with a serialization failure and retried.
    pub serialization_failures: u64,
    /// Elector schedules in two clusters sharing the store (1 or 0 for one schedule).
    pub two_cluster_schedules: u64,
    /// Rows an operator released on a pod's deletion: its own cluster's dead holder.
    pub operator_releases: u64,
    /// Live holders of the other cluster an operator left alone after
    /// deleting its own pod of the same name.
    pub left_to_other_cluster: u64,
    /// Leader labels an operator took off a pod of its own cluster.
    pub label_repairs: u64,
    /// Leader labels set by hand on a pod (two clusters).
    pub labels_set_by_hand: u64,
    /// Terms in the operator's folded history (elector schedules).
    pub history_terms: u64,
    /// Gap entries in it: terms no read of the operator saw.
    pub history_gaps: u64,
    /// Runs of terms in it after the first: the store counted terms again
    /// (a Lease created again).
    pub history_runs: u64,
}

impl Counts {
    pub(super) fn add(&mut self, r: &Counts) {
        self.terms += r.terms;
        self.accepted += r.accepted;
        self.fenced += r.fenced;
        self.crashes += r.crashes;
        self.long_pauses += r.long_pauses;
        self.excused += r.excused;
        self.late_commits += r.late_commits;
        self.duplicates += r.duplicates;
        self.clock_jumps += r.clock_jumps;
        self.deleted_live += r.deleted_live;
        self.ttl_seeds += r.ttl_seeds;
        self.ttl_expiries += r.ttl_expiries;
        self.sessions_replaced += r.sessions_replaced;
        self.fenced_schedules += r.fenced_schedules;
        self.version_moves += r.version_moves;
        self.partition_schedules += r.partition_schedules;
        self.stand_asides += r.stand_asides;
        self.newest_schedules += r.newest_schedules;
        self.kubernetes_schedules += r.kubernetes_schedules;
        self.stale_conflicts += r.stale_conflicts;
        self.recreated += r.recreated;
        self.postgres_schedules += r.postgres_schedules;
        self.redis_schedules += r.redis_schedules;
        self.serialization_failures += r.serialization_failures;
        self.two_cluster_schedules += r.two_cluster_schedules;
        self.operator_releases += r.operator_releases;
        self.left_to_other_cluster += r.left_to_other_cluster;
        self.label_repairs += r.label_repairs;
        self.labels_set_by_hand += r.labels_set_by_hand;
        self.history_terms += r.history_terms;
        self.history_gaps += r.history_gaps;
        self.history_runs += r.history_runs;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} terms, {} writes accepted, {} stale writes fenced off, {} accepted from writers paused past the margin, \
             {} crashes, {} pauses past the gap, {} late commits, {} duplicated requests, {} store clock jumps, \
             {} rows deleted under a live lease, {} seeds on TTL expiry with {} leases vanished at their TTL, \
             {} sessions replaced after expiry, \
             {} schedules with the version fence, {} moves to a newer version, {} leaders stood aside, \
             {} rollout schedules preferring Newest, {} session schedules sharing partitions, \
             {} schedules on the Kubernetes store's semantics ({} writes refused as judged on a stale version, \
             {} Leases recreated), {} session schedules on PostgreSQL's semantics ({} serialization failures \
             retried) and {} on Redis's, {} schedules in two clusters ({} rows released by an operator, \
             {} other clusters' holders left alone, {} leader labels set by hand, {} taken off by an operator), {} terms in the operator's history with {} gaps and {} restarts of the term count",
            self.terms,
            self.accepted,
            self.fenced,
            self.excused,
            self.crashes,
            self.long_pauses,
            self.late_commits,
            self.duplicates,
            self.clock_jumps,
            self.deleted_live,
            self.ttl_seeds,
            self.ttl_expiries,
            self.sessions_replaced,
            self.fenced_schedules,
            self.version_moves,
            self.stand_asides,
            self.newest_schedules,
            self.partition_schedules,
            self.kubernetes_schedules,
            self.stale_conflicts,
            self.recreated,
            self.postgres_schedules,
            self.serialization_failures,
            self.redis_schedules,
            self.two_cluster_schedules,
            self.operator_releases,
            self.left_to_other_cluster,
            self.labels_set_by_hand,
            self.label_repairs,
            self.history_terms,
            self.history_gaps,
            self.history_runs
        )
    }
}

/// A broken safety property, with the seed that replays it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub mutant: Option<Mutant>,
    pub what: String,
    pub events: Vec<String>,
}

impl Violation {
    /// How many of the last events the violation's text shows.
    const SHOWN: usize = 40;

    /// The events before those the violation's text shows (`--verbose`
    /// prints them too).
    pub fn earlier_events(&self) -> &[String] {
        &self.events[..self.events.len().saturating_sub(Self::SHOWN)]
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events[self.earlier_events().len()..] {
            writeln!(f, "  {e}")?;
        }
        let mutant = self
            .mutant
            .map(|m| format!(" --mutant {}", m.name()))
            .unwrap_or_default();
        write!(
            f,
            "seed {}: {} (replay: leasehold simulate --first-seed {} --seeds 1 --verbose{mutant})",
            self.seed, self.what, self.seed
        )
    }
}

impl std::error::Error for Violation {}
