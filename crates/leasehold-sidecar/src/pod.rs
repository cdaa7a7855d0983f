//! The pod this sidecar runs in, and what every part that talks to the
//! Kubernetes API about it shares: the lock label of standalone candidates,
//! the Event recorder, the watches' backoff.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;

/// The condition a sidecar keeps on its own pod ([`set_own_condition`]).
pub(crate) struct OwnCondition<'a> {
    pub kind: &'a str,
    /// `"True"` or `"False"`.
    pub status: &'a str,
    pub reason: &'a str,
    pub message: String,
}

/// Sets `condition` on pod `name`, by strategic merge (conditions merge by
/// type), its transition time now: the caller writes only on a flip.
pub(crate) async fn set_own_condition(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    condition: OwnCondition<'_>,
) -> Result<k8s_openapi::api::core::v1::Pod, kube::Error> {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let patch = kube::api::Patch::Strategic(serde_json::json!({
        "status": {"conditions": [{
            "type": condition.kind,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": now,
        }]}
    }));
    pods.patch_status(name, &kube::api::PatchParams::default(), &patch)
        .await
}

/// The pod this sidecar runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
}

/// Standalone (no `--lease`): the label naming the lock a candidate pod
/// campaigns for, so a leader clears only its own lock's candidates.
pub const LOCK_LABEL: &str = "leasehold.dev/lock";
/// The reporting controller of the sidecar's Events.
const FIELD_MANAGER: &str = "leasehold-sidecar";

/// An Event recorder reporting as this pod's sidecar, and the reference to
/// the pod its Events are about.
pub(crate) fn pod_recorder(client: kube::Client, pod: &PodRef) -> (Recorder, ObjectReference) {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(pod.name.clone()),
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: pod.uid.clone(),
        ..Default::default()
    };
    (Recorder::new(client, reporter), reference)
}

/// The backoff of the sidecar's watches: capped at [`BACKOFF_CAP`](super::BACKOFF_CAP), so a
/// watch is back within that after the API server returns.
pub(crate) fn watch_backoff() -> watcher::ExponentialBackoff {
    super::capped_backoff().into()
}

/// A label value naming `lock` for [`LOCK_LABEL`]: the lock itself when it
/// is a valid label value (at most 63 characters of `[A-Za-z0-9._-]`,
/// alphanumeric at both ends), else its valid characters, shortened, and a
/// hash of the whole name (FNV-1a, stable across versions and platforms).
pub fn lock_label_value(lock: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let valid = !lock.is_empty()
        && lock.len() <= 63
        && lock.chars().all(allowed)
        && lock.starts_with(|c: char| c.is_ascii_alphanumeric())
        && lock.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        return lock.to_string();
    }
    let hash = leasehold_core::lease::fnv1a_64(lock.as_bytes());
    let readable: String = lock
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(46)
        .collect();
    match readable.is_empty() {
        true => format!("h{hash:016x}"),
        false => format!("{readable}-{hash:016x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_becomes_a_valid_label_value_naming_it() {
        assert_eq!(lock_label_value("scheduler"), "scheduler");
        let value = lock_label_value("prod/web");
        assert!(
            value.starts_with("prod-web-") && value.len() == "prod-web-".len() + 16,
            "{value}"
        );
        assert_ne!(value, lock_label_value("prod-web/"), "distinct locks, distinct values");
        assert_eq!(value, lock_label_value("prod/web"), "stable");
        for lock in ["/", "x".repeat(200).as_str(), "-a-", "a b"] {
            let value = lock_label_value(lock);
            assert!(value.len() <= 63, "{value}");
            assert!(
                value.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)),
                "{value}"
            );
            assert!(value.starts_with(|c: char| c.is_ascii_alphanumeric()), "{value}");
            assert!(value.ends_with(|c: char| c.is_ascii_alphanumeric()), "{value}");
        }
    }
}
