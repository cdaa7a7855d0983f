//! The operator's Prometheus metrics.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use leasehold_core::lease::session::Collected;

/// How one reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Status written or already current.
    Ok,
    /// The spec is invalid; `Valid=False` was published.
    Invalid,
    /// The store could not be used; `StoreReady=False` was published.
    StoreError,
    /// A Kubernetes call failed; retried with backoff.
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::StoreError => "store_error",
            Outcome::Error => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RowLabels {
    rows: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    reconciles: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    label_repairs: Counter,
    events_failed: Family<ReasonLabels, Counter>,
    leader: Gauge,
    collected: Family<RowLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them under `leasehold_operator_`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            reconciles: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            label_repairs: Counter::default(),
            events_failed: Family::default(),
            leader: Gauge::default(),
            collected: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix("leasehold_operator");
        registry.register("reconciles", "Reconciles by outcome", metrics.reconciles.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconcile took",
            metrics.duration.clone(),
        );
        registry.register(
            "label_repairs",
            "Stale leader labels set back to false on pods that do not hold the lease",
            metrics.label_repairs.clone(),
        );
        registry.register(
            "events_failed",
            "Kubernetes Events that could not be published, by reason",
            metrics.events_failed.clone(),
        );
        registry.register(
            "is_leader",
            "1 while this operator replica is the active one",
            metrics.leader.clone(),
        );
        registry.register(
            "collected_rows",
            "Rows of dead sessions deleted by the operator's garbage collection: rows=sessions|locks",
            metrics.collected.clone(),
        );
        metrics
    }

    pub fn reconciled(&self, outcome: Outcome, took: Duration) {
        self.reconciles
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn reconciles(&self, outcome: Outcome) -> u64 {
        self.reconciles
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .get()
    }

    pub(crate) fn label_repaired(&self) {
        self.label_repairs.inc();
    }

    pub fn event_failed(&self, reason: &'static str) {
        self.events_failed.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts what one garbage collection deleted.
    pub fn collected(&self, collected: Collected) {
        self.collected
            .get_or_create(&RowLabels { rows: "sessions" })
            .inc_by(collected.sessions);
        self.collected
            .get_or_create(&RowLabels { rows: "locks" })
            .inc_by(collected.locks);
    }

    /// Rows deleted so far: `sessions` or `locks`.
    pub fn collected_rows(&self, rows: &'static str) -> u64 {
        self.collected.get_or_create(&RowLabels { rows }).get()
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    #[cfg(test)]
    pub(crate) fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collected_rows_are_exposed_by_kind() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.collected(Collected { sessions: 2, locks: 5 });
        metrics.collected(Collected { sessions: 1, locks: 0 });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "leasehold_operator_collected_rows_total{rows=\"sessions\"} 3",
            "leasehold_operator_collected_rows_total{rows=\"locks\"} 5",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
