//! Would a rolling update of the candidates' Deployment stall?
//!
//! With the readiness gate on, only the leader is Ready: a Deployment counts
//! every standby as unavailable, so a rolling update can only proceed when
//! `maxUnavailable >= replicas - 1`. New pods come up as standbys and never
//! become Ready, so with a smaller budget the rollout waits forever.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Api, ResourceExt};

/// The Deployments owning `pods`, by the ReplicaSet naming convention
/// (`<deployment>-<pod-template-hash>`), so one GET per Deployment suffices.
pub fn owning_deployments(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|pod| {
            let hash = pod.labels().get("pod-template-hash")?;
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.kind == "ReplicaSet" && o.controller == Some(true))?;
            owner.name.strip_suffix(&format!("-{hash}")).map(str::to_string)
        })
        .collect()
}

/// Why a rolling update of `deployment` would stall under the readiness
/// gate, or `None` when it would not.
pub fn stall_reason(deployment: &Deployment) -> Option<String> {
    let spec = &deployment.spec;
    let replicas = spec.replicas.unwrap_or(1);
    let strategy = spec.strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return None;
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let surge = resolve(rolling.and_then(|r| r.max_surge.as_ref()), replicas, true);
    let mut unavailable = resolve(rolling.and_then(|r| r.max_unavailable.as_ref()), replicas, false);
    // The Deployment controller's own rule: both zero would never progress.
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    let needed = replicas - 1;
    (unavailable < needed).then(|| {
        format!(
            "deployment {}: maxUnavailable resolves to {unavailable} of {replicas} replicas; with the readiness gate only \
             the leader is Ready, so a rolling update stalls unless maxUnavailable is at least {needed}. Raise it, use \
             the Recreate strategy, or route with the leader label instead of the readiness gate",
            deployment.name_any()
        )
    })
}

/// An int-or-percent budget as the Deployment controller resolves it:
/// surge rounds up, unavailability rounds down; the default is 25%.
fn resolve(value: Option<&IntOrString>, replicas: i32, round_up: bool) -> i32 {
    let percent = |p: i32| {
        let scaled = i64::from(p) * i64::from(replicas);
        let value = if round_up { (scaled + 99) / 100 } else { scaled / 100 };
        i32::try_from(value).unwrap_or(i32::MAX)
    };
    match value {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => s.trim_end_matches('%').parse().map_or(0, percent),
        None => percent(25),
    }
}

/// Reads the Deployments owning `pods` and returns the stall reasons found.
pub async fn check(deployments: &Api<Deployment>, pods: &[Pod]) -> Result<Vec<String>, kube::Error> {
    let mut reasons = Vec::new();
    for name in owning_deployments(pods) {
        if let Some(deployment) = deployments.get_opt(&name).await?
            && let Some(reason) = stall_reason(&deployment)
        {
            reasons.push(reason);
        }
    }
    Ok(reasons)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(replicas: i32, strategy: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "strategy": strategy, "selector": {}, "template": {}},
        }))
        .unwrap()
    }

    #[test]
    fn a_rollout_stalls_when_fewer_than_replicas_minus_one_may_be_unavailable() {
        let cases = [
            (3, json!({}), true), // 25% of 3 rounds down to 0
            (3, json!({"rollingUpdate": {"maxUnavailable": 1}}), true),
            (3, json!({"rollingUpdate": {"maxUnavailable": 2}}), false),
            (3, json!({"rollingUpdate": {"maxUnavailable": "50%"}}), true),
            (3, json!({"rollingUpdate": {"maxUnavailable": "67%"}}), false),
            (2, json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}), false),
            (2, json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}), true),
            (1, json!({}), false),
            (5, json!({"type": "Recreate"}), false),
        ];
        for (replicas, strategy, stalls) in cases {
            let reason = stall_reason(&deployment(replicas, strategy.clone()));
            assert_eq!(reason.is_some(), stalls, "{replicas} replicas, {strategy}: {reason:?}");
        }
        let reason = stall_reason(&deployment(3, json!({"rollingUpdate": {"maxUnavailable": 1}}))).unwrap();
        assert!(
            reason.starts_with("deployment web: maxUnavailable resolves to 1 of 3 replicas"),
            "{reason}"
        );
    }

    #[test]
    fn deployments_are_found_from_the_replica_set_owner_and_template_hash() {
        let pod = |name: &str, owner: &str, hash: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {
                "name": name, "labels": {"pod-template-hash": hash},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "u",
                                     "controller": true}],
            }}))
            .unwrap()
        };
        let pods = [
            pod("a", "web-7d9f", "7d9f"),
            pod("b", "web-5c2a", "5c2a"),
            pod("c", "other-rs", "beef"),
        ];
        assert_eq!(owning_deployments(&pods), BTreeSet::from(["web".to_string()]));
    }
}
