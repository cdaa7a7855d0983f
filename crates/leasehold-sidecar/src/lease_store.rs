//! A sidecar campaigns only on the store its lease recorded (issue 54).
//!
//! The URL of a PostgreSQL or Redis lease lives in a Secret, which users may
//! edit (a rotated password, a moved host). A pod created after an edit that
//! reaches another store (another database, another server) would find no
//! row there and acquire, beside the leader on the lease's own store: two
//! leaders. So before it campaigns, the sidecar reads the identity of the
//! store its URL reaches ([`StoreConfig::identity`]) and compares it with
//! `status.storeIdentity`, which the operator records once at its first
//! read of the store and the CRD keeps unchanged. The same store reached by
//! another URL (a new password, another host name) has the same identity
//! and campaigns as before.
//!
//! Only a store reached by a URL is checked: Spanner's database and the
//! Kubernetes namespace come from the immutable spec. Until the operator
//! has recorded one, the sidecar waits (a lease is new, or the operator is
//! down); on a mismatch it never campaigns. Both are the
//! sidecar's start-up problem: retried with capped backoff, `/healthz`
//! answers 503 naming it, and a kubelet restart (the liveness probe)
//! re-reads the mounted Secret, so a Secret set back heals on its own.

use tokio::sync::watch;

use leasehold_core::lease::{StoreError, StoreIdentity};
use leasehold_runtime::StoreConfig;

/// `status.storeIdentity` of the bound lease, as its watch last saw it.
pub(crate) type Recorded = watch::Receiver<Option<String>>;

/// Ok when the store `choice` reaches is the one `recorded` names. A store
/// the immutable spec names (Spanner's database, the Kubernetes namespace)
/// is the lease's by construction: no URL could lead elsewhere, so it
/// campaigns without waiting for the operator.
pub async fn admit(choice: &StoreConfig, recorded: &Recorded) -> Result<(), StoreError> {
    if !choice.reached_by_url() {
        return Ok(());
    }
    let reached = choice.identity().await?;
    let recorded = recorded.borrow().clone();
    judge(&reached, recorded.as_deref())
}

/// Whether a candidate whose URL reaches `reached` may campaign on a lease
/// that `recorded` the store it campaigns on.
fn judge(reached: &StoreIdentity, recorded: Option<&str>) -> Result<(), StoreError> {
    match recorded {
        None => Err(StoreError::unavailable(format!(
            "waiting for the operator to record the lease's store (status.storeIdentity) before campaigning on \
             {reached}: is the operator running?"
        ))),
        Some(recorded) if recorded == reached.as_str() => Ok(()),
        Some(recorded) => Err(StoreError::invalid(format!(
            "this pod's store URL reaches store {reached}, but the lease's candidates campaign on {recorded} \
             (status.storeIdentity): its Secret was edited to reach another store, where this sidecar will not \
             campaign; set the Secret back (the restarted container reads it again) or move the lease \
             (docs/migrating-stores.md)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_store_is_admitted() {
        let ours = StoreIdentity::new("postgres:1/app/public");
        judge(&ours, Some("postgres:1/app/public")).unwrap();

        let other = judge(&StoreIdentity::new("postgres:1/other/public"), Some(ours.as_str())).unwrap_err();
        assert!(matches!(other, StoreError::Invalid { .. }), "{other:?}");
        let says = other.to_string();
        assert!(
            says.contains("will not campaign")
                && says.contains("postgres:1/other/public")
                && says.contains(ours.as_str()),
            "{says}"
        );

        let waiting = judge(&ours, None).unwrap_err();
        assert!(matches!(waiting, StoreError::Unavailable { .. }), "{waiting:?}");
        assert!(waiting.to_string().contains("status.storeIdentity"), "{waiting}");
    }

    /// The spec names a Spanner database: nothing to wait for, nothing a
    /// Secret could move.
    #[tokio::test]
    async fn a_store_the_spec_names_campaigns_without_a_recorded_identity() {
        let spanner = StoreConfig::Spanner(leasehold_stores::spanner::SpannerConfig {
            database: "projects/p/instances/i/databases/ours".into(),
            table: "leasehold_leases".into(),
        });
        admit(&spanner, &watch::channel(None).1).await.unwrap();
    }
}
