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
//! Until the operator has recorded one, the sidecar waits (a lease is new,
//! or the operator is down); on a mismatch it never campaigns. Both are the
//! sidecar's start-up problem: retried with capped backoff, `/healthz`
//! answers 503 naming it, and a kubelet restart (the liveness probe)
//! re-reads the mounted Secret, so a Secret set back heals on its own.

use tokio::sync::watch;

use crate::lease::StoreError;
use crate::store::select::StoreConfig;

/// `status.storeIdentity` of the bound lease, as its watch last saw it.
pub(crate) type Recorded = watch::Receiver<Option<String>>;

/// Ok when the store `choice` reaches is the one `recorded` names.
pub(crate) async fn admit(choice: &StoreConfig, recorded: &Recorded) -> Result<(), StoreError> {
    let reached = choice.identity().await?;
    let recorded = recorded.borrow().clone();
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

    fn recorded(identity: Option<&str>) -> Recorded {
        watch::channel(identity.map(str::to_string)).1
    }

    #[tokio::test]
    async fn only_the_recorded_store_is_admitted() {
        let spanner = |database: &str| {
            StoreConfig::Spanner(crate::store::spanner_names::SpannerConfig {
                database: database.into(),
                table: "leasehold_leases".into(),
            })
        };
        let ours = "projects/p/instances/i/databases/ours";
        let recorded_ours = recorded(Some(&format!("spanner:{ours}")));
        admit(&spanner(ours), &recorded_ours).await.unwrap();

        let other = admit(&spanner("projects/p/instances/i/databases/other"), &recorded_ours)
            .await
            .unwrap_err();
        assert!(matches!(other, StoreError::Invalid { .. }), "{other:?}");
        assert!(other.to_string().contains("will not campaign"), "{other}");

        let waiting = admit(&spanner(ours), &recorded(None)).await.unwrap_err();
        assert!(matches!(waiting, StoreError::Unavailable { .. }), "{waiting:?}");
        assert!(waiting.to_string().contains("status.storeIdentity"), "{waiting}");
    }
}
