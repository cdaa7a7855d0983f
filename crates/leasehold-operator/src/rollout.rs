//! Would a rolling update of the candidates' Deployment stall?
//!
//! With the readiness gate on, only the leader is Ready, so a Deployment
//! counts every standby as unavailable. The Deployment controller
//! (kubernetes `pkg/controller/deployment/rolling.go`) removes old pods in
//! two ways only: `cleanupUnhealthyReplicas` deletes unready old pods, at most
//! `maxScaledDown = allPods − (replicas − maxUnavailable) − unavailableNewPods`
//! of them, and `scaleDownOldReplicaSetsForRollingUpdate` deletes ready ones
//! only while `availablePods > replicas − maxUnavailable`. While the leader
//! stays on an old pod, the one available pod is that leader, and new pods
//! (standbys) never become available: the old leader goes only when
//! `1 > replicas − maxUnavailable`, i.e. `maxUnavailable ≥ replicas`. When
//! leadership moves to the new ReplicaSet as soon as it has a pod (a lease
//! that prefers the newest version), the new leader is the available pod and
//! `maxScaledDown = oldPods + 1 − replicas + maxUnavailable`, so the old
//! standbys all go when `maxUnavailable ≥ replicas − 1`. `Recreate` always
//! completes. [`rollout_completes`] encodes this; the tests check it against
//! a step-by-step model of that controller code.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::candidate::CandidatePod;

/// The Deployments owning `pods`, by the ReplicaSet naming convention
/// (`<deployment>-<pod-template-hash>`), so no ReplicaSet need be read.
pub fn owning_deployments(pods: &[Arc<CandidatePod>]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|pod| {
            let hash = pod.labels.get("pod-template-hash")?;
            let replica_set = pod.replica_set.as_ref()?;
            replica_set.strip_suffix(&format!("-{hash}")).map(str::to_string)
        })
        .collect()
}

/// A Deployment's strategy with its budgets resolved for its replica count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    Recreate,
    RollingUpdate { max_surge: i32, max_unavailable: i32 },
}

impl Strategy {
    /// Resolves the budgets as the Deployment controller does
    /// (`deploymentutil.ResolveFenceposts` and `MaxUnavailable`): surge
    /// rounds up, unavailability rounds down, both default to 25%; both zero
    /// becomes one unavailable; unavailability is capped at the replicas.
    pub(crate) fn of(spec: &DeploymentSpec) -> Strategy {
        let replicas = spec.replicas.unwrap_or(1);
        let strategy = spec.strategy.as_ref();
        if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
            return Strategy::Recreate;
        }
        let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
        let max_surge = resolve(rolling.and_then(|r| r.max_surge.as_ref()), replicas, true);
        let mut max_unavailable = resolve(rolling.and_then(|r| r.max_unavailable.as_ref()), replicas, false);
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable: max_unavailable.min(replicas.max(0)),
        }
    }
}

/// Whether a rollout of `replicas` readiness-gated candidates (only the
/// leader Ready) completes under `strategy`.
///
/// `leader_moves_to_new`: leadership moves to a pod of the new ReplicaSet as
/// soon as one runs (a lease that prefers the newest version); otherwise it
/// stays on old pods while any is left. See the module docs for the rule.
pub(crate) fn rollout_completes(strategy: Strategy, replicas: i32, leader_moves_to_new: bool) -> bool {
    match strategy {
        Strategy::Recreate => true,
        _ if replicas <= 0 => true,
        Strategy::RollingUpdate { max_unavailable, .. } => {
            let needed = if leader_moves_to_new { replicas - 1 } else { replicas };
            max_unavailable >= needed
        }
    }
}

/// Why a rolling update of `deployment` would stall under the readiness
/// gate, or `None` when it would not. `leader_moves_to_new`: the lease
/// prefers the newest version, so leadership (and readiness) moves to the
/// new ReplicaSet's first pod.
pub(crate) fn stall_reason(deployment: &Deployment, leader_moves_to_new: bool) -> Option<String> {
    let spec = &deployment.spec;
    let replicas = spec.replicas.unwrap_or(1);
    let strategy = Strategy::of(spec);
    if rollout_completes(strategy, replicas, leader_moves_to_new) {
        return None;
    }
    let Strategy::RollingUpdate { max_unavailable, .. } = strategy else {
        return None;
    };
    let (needed, because) = if leader_moves_to_new {
        (
            replicas - 1,
            "leadership moves to the first new pod (the lease prefers Newest), and the old standbys can then go only \
             as unavailable pods",
        )
    } else {
        (replicas, "a rolling update stalls with the old leader left")
    };
    Some(format!(
        "deployment {}: maxUnavailable resolves to {max_unavailable} of {replicas} replicas; with the readiness gate \
         only the leader is Ready, and {because}, unless maxUnavailable is at least {needed}. Raise it, use the \
         Recreate strategy, prefer Newest, or route with the leader label instead of the readiness gate",
        deployment.name_any()
    ))
}

/// An int-or-percent budget as the Deployment controller resolves it
/// (`intstr.GetScaledValueFromIntOrPercent`); the default is 25%.
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

/// Whether a lease moves leadership to the new ReplicaSet's first pod during
/// a rollout: a lease that prefers the newest version does, once that pod's
/// app is ready (the old leader stands aside for it).
pub fn leader_moves_to_new(valid: &leasehold_kubernetes::api::ValidLease) -> bool {
    valid.versions.prefer == leasehold_core::lease::Prefer::Newest
}

/// The Deployments owning `pods` in `namespace`, from the operator's
/// Deployment watch (no request per reconcile).
pub(crate) fn cached_owners(
    deployments: &Store<Deployment>,
    namespace: &str,
    pods: &[Arc<CandidatePod>],
) -> Vec<Deployment> {
    owning_deployments(pods)
        .into_iter()
        .filter_map(|name| deployments.get(&ObjectRef::new(&name).within(namespace)))
        .map(Arc::unwrap_or_clone)
        .collect()
}

/// Drops what no rollout check reads, so the operator's cache of every
/// Deployment in the watched namespaces stays small: the checks read the
/// name, generation, replicas, strategy, progress deadline and status; the
/// pod template's labels stay so that a Deployment's change can be mapped to
/// the leases selecting its pods.
pub(crate) fn keep_what_rollout_checks_read(deployment: &mut Deployment) {
    deployment.metadata.managed_fields = None;
    deployment.metadata.annotations = None;
    let labels = deployment.spec.template.metadata.as_mut().and_then(|m| m.labels.take());
    deployment.spec.template = PodTemplateSpec {
        metadata: labels.map(|labels| ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        }),
        spec: None,
    };
    deployment.spec.selector = LabelSelector::default();
}

/// The stall reasons of `owners`' rolling updates.
pub fn stall_reasons(owners: &[Deployment], leader_moves_to_new: bool) -> Vec<String> {
    owners
        .iter()
        .filter_map(|d| stall_reason(d, leader_moves_to_new))
        .collect()
}

/// Why a readiness-gated `deployment` of more than one replica will be
/// reported as a failed rollout, or `None`: only the leader is ever Ready,
/// so `availableReplicas` stays below `replicas`, the controller never
/// counts a rollout complete and turns `Progressing` False
/// (`ProgressDeadlineExceeded`) after `progressDeadlineSeconds` (default
/// 600; the controller's `HasProgressDeadline` treats 2147483647 as none),
/// which `kubectl rollout status`, `helm --wait` and Argo CD report as failed.
pub fn deadline_warning(deployment: &Deployment, lease: &str) -> Option<String> {
    let replicas = deployment.spec.replicas.unwrap_or(1);
    let deadline = deployment.spec.progress_deadline_seconds.unwrap_or(600);
    (replicas > 1 && deadline != i32::MAX).then(|| {
        format!(
            "deployment {}: only the leader of its {replicas} replicas is ever Ready, so each rollout turns \
             Progressing=False (ProgressDeadlineExceeded) after progressDeadlineSeconds ({deadline}s), which \
             `kubectl rollout status`, `helm --wait` and Argo CD report as failed; wait with `kubectl wait \
             dlease/{lease} --for=condition=RolledOut` instead (docs/readiness-gate.md)",
            deployment.name_any()
        )
    })
}

/// Why `deployment`'s pods do not all run its current revision yet, or
/// `None` when they do: the controller has seen its latest spec
/// (`observedGeneration`), as many pods as wanted run the current template
/// (`updatedReplicas`) and no pod of an older one is left (`replicas` counts
/// every non-terminated pod). This is what `kubectl rollout status` waits
/// for, without its `availableReplicas`, which a readiness gate keeps at one.
pub(crate) fn pending_rollout(deployment: &Deployment) -> Option<String> {
    let name = deployment.name_any();
    let wanted = deployment.spec.replicas.unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let generation = deployment.metadata.generation.unwrap_or(0);
    if status.observed_generation.unwrap_or(0) < generation {
        return Some(format!(
            "deployment {name}: the Deployment controller has not yet seen generation {generation}"
        ));
    }
    let updated = status.updated_replicas.unwrap_or(0);
    if updated < wanted {
        return Some(format!(
            "deployment {name}: {updated} of {wanted} pods run the current revision"
        ));
    }
    let old = status.replicas.unwrap_or(0) - updated;
    (old > 0).then(|| format!("deployment {name}: {old} pods of an older revision remain"))
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use serde::Deserialize as _;
    use serde_json::json;

    use super::model::Rollout;
    use super::*;

    fn deployment(replicas: i32, strategy: serde_json::Value) -> Deployment {
        leasehold_kubernetes::api::client::object_from_value(&json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "strategy": strategy, "selector": {}, "template": {}},
        }))
        .unwrap()
    }

    #[test]
    fn a_rollout_stalls_unless_max_unavailable_covers_every_replica() {
        let cases = [
            (3, json!({}), true), // 25% of 3 rounds down to 0
            (3, json!({"rollingUpdate": {"maxUnavailable": 1}}), true),
            (3, json!({"rollingUpdate": {"maxUnavailable": 2, "maxSurge": 1}}), true),
            (3, json!({"rollingUpdate": {"maxUnavailable": 3}}), false),
            (3, json!({"rollingUpdate": {"maxUnavailable": 5}}), false),
            (3, json!({"rollingUpdate": {"maxUnavailable": "67%"}}), true),
            (3, json!({"rollingUpdate": {"maxUnavailable": "100%"}}), false),
            (2, json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}), true),
            (1, json!({}), true),
            (1, json!({"rollingUpdate": {"maxUnavailable": 1}}), false),
            (5, json!({"type": "Recreate"}), false),
        ];
        for (replicas, strategy, stalls) in cases {
            let reason = stall_reason(&deployment(replicas, strategy.clone()), false);
            assert_eq!(reason.is_some(), stalls, "{replicas} replicas, {strategy}: {reason:?}");
        }
        let reason = stall_reason(&deployment(3, json!({"rollingUpdate": {"maxUnavailable": 2}})), false).unwrap();
        assert!(
            reason.starts_with("deployment web: maxUnavailable resolves to 2 of 3 replicas")
                && reason.contains("unless maxUnavailable is at least 3."),
            "{reason}"
        );
    }

    /// Every strategy on a grid: the rule and the step-by-step model of the
    /// Deployment controller agree, with leadership staying on old pods and
    /// with leadership moving to the new ReplicaSet.
    #[test]
    fn the_rule_agrees_with_the_deployment_controller_model() {
        let budgets = [
            json!(0),
            json!(1),
            json!(2),
            json!(3),
            json!(6),
            json!("25%"),
            json!("50%"),
            json!("100%"),
        ];
        let mut strategies = vec![json!({"type": "Recreate"}), json!({})];
        for surge in &budgets {
            for unavailable in &budgets {
                strategies.push(json!({"rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}));
            }
        }
        let (mut completes, mut stalls) = (0, 0);
        for replicas in 1..=6 {
            for strategy in &strategies {
                let deployment = deployment(replicas, strategy.clone());
                let resolved = Strategy::of(&deployment.spec);
                for moves in [false, true] {
                    let modelled = Rollout::new(replicas, resolved, moves).run();
                    assert_eq!(
                        rollout_completes(resolved, replicas, moves),
                        modelled.completed(),
                        "{replicas} replicas, {strategy}, leader moves to new: {moves}; model ended at {modelled:?}"
                    );
                    if modelled.completed() {
                        completes += 1
                    } else {
                        stalls += 1
                    }
                }
            }
        }
        assert!(completes > 100 && stalls > 100, "{completes} complete, {stalls} stall");
    }

    /// The rule this replaced (`maxUnavailable >= replicas - 1` with the
    /// leader on old pods) is caught by the model.
    #[test]
    fn the_model_catches_the_off_by_one_rule() {
        let strategy = Strategy::RollingUpdate {
            max_surge: 1,
            max_unavailable: 2,
        };
        let old_rule = 2 >= 3 - 1;
        let modelled = Rollout::new(3, strategy, false).run();
        assert!(old_rule && !modelled.completed(), "{modelled:?}");
        assert_eq!(modelled.old_pods(), 1, "the old leader is left: {modelled:?}");
    }

    /// The shipped readiness-gated example completes a rollout in the model.
    #[test]
    fn a_gated_deployment_of_several_replicas_is_warned_about_its_progress_deadline() {
        let with_deadline = |replicas: i32, deadline: Option<i32>| {
            let mut d = deployment(replicas, json!({"type": "Recreate"}));
            d.spec.progress_deadline_seconds = deadline;
            deadline_warning(&d, "scheduler")
        };
        let warning = with_deadline(3, None).expect("the default deadline fires");
        assert!(warning.contains("progressDeadlineSeconds (600s)"), "{warning}");
        assert!(
            warning.contains("kubectl wait dlease/scheduler --for=condition=RolledOut"),
            "{warning}"
        );
        assert!(with_deadline(3, Some(120)).is_some_and(|w| w.contains("(120s)")));
        assert_eq!(with_deadline(1, None), None, "one replica: the leader is every replica");
        assert_eq!(with_deadline(3, Some(i32::MAX)), None, "the controller's 'no deadline'");
    }

    #[test]
    fn the_readiness_gated_example_rolls_out() {
        let text = include_str!("../../../manifests/examples/readiness-gated.yaml");
        let mut found = 0;
        for document in serde_yaml::Deserializer::from_str(text) {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            if value["kind"] != "Deployment" {
                continue;
            }
            let deployment: Deployment = serde_yaml::from_value(value).unwrap();
            let replicas = deployment.spec.replicas.unwrap_or(1);
            let strategy = Strategy::of(&deployment.spec);
            assert_eq!(stall_reason(&deployment, false), None);
            let modelled = Rollout::new(replicas, strategy, false).run();
            assert!(modelled.completed(), "{modelled:?}");
            found += 1;
        }
        assert_eq!(found, 1);
    }

    /// With leadership moving to the new ReplicaSet one unavailable pod less
    /// suffices: the shipped example's old strategy then completes.
    #[test]
    fn moving_leadership_to_the_new_replica_set_needs_one_unavailable_pod_less() {
        let strategy = Strategy::RollingUpdate {
            max_surge: 1,
            max_unavailable: 2,
        };
        assert!(!rollout_completes(strategy, 3, false));
        assert!(rollout_completes(strategy, 3, true));
        assert!(Rollout::new(3, strategy, true).run().completed());
        let zero = Strategy::RollingUpdate {
            max_surge: 1,
            max_unavailable: 0,
        };
        assert!(!rollout_completes(zero, 3, true));
        assert!(
            rollout_completes(zero, 1, true),
            "one replica: the new pod leads, the old one goes"
        );
    }

    /// Issue 16: the operator's check applies the rule for leases that
    /// prefer Newest: maxUnavailable 2 of 3 passes, and maxSurge 1 /
    /// maxUnavailable 0 still stalls, saying what would do.
    #[test]
    fn a_lease_preferring_newest_is_checked_by_the_moving_rule() {
        let two = deployment(3, json!({"rollingUpdate": {"maxUnavailable": 2, "maxSurge": 1}}));
        assert!(stall_reason(&two, false).is_some());
        assert_eq!(stall_reason(&two, true), None);
        assert!(Rollout::new(3, Strategy::of(&two.spec), true).run().completed());
        let surge_only = deployment(3, json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}));
        let reason = stall_reason(&surge_only, true).unwrap();
        assert!(
            reason.contains("prefers Newest") && reason.contains("unless maxUnavailable is at least 2."),
            "{reason}"
        );
        assert!(!Rollout::new(3, Strategy::of(&surge_only.spec), true).run().completed());
        let lease = |prefer: &str| -> leasehold_kubernetes::api::DistributedLease {
            leasehold_kubernetes::api::client::object_from_value(&json!({
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "web", "namespace": "prod"},
                "spec": {"store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                         "selector": {"matchLabels": {"app": "web"}}, "leadership": {"prefer": prefer}}
            }))
            .unwrap()
        };
        assert!(leader_moves_to_new(
            &leasehold_kubernetes::api::validate(&lease("Newest")).unwrap()
        ));
        for other in ["None", "Oldest"] {
            assert!(!leader_moves_to_new(
                &leasehold_kubernetes::api::validate(&lease(other)).unwrap()
            ));
        }
    }

    #[test]
    fn deployments_are_found_from_the_replica_set_owner_and_template_hash() {
        let pod = |name: &str, owner: &str, hash: &str| {
            let pod: k8s_openapi::api::core::v1::Pod =
                leasehold_kubernetes::api::client::object_from_value(&json!({"metadata": {
                    "name": name, "labels": {"pod-template-hash": hash},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "u",
                                         "controller": true}],
                }}))
                .unwrap();
            Arc::new(CandidatePod::from(&pod))
        };
        let pods = [
            pod("a", "web-7d9f", "7d9f"),
            pod("b", "web-5c2a", "5c2a"),
            pod("c", "other-rs", "beef"),
        ];
        assert_eq!(owning_deployments(&pods), BTreeSet::from(["web".to_string()]));
    }
}
