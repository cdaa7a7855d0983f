//! Makes the renewal budget's verdict visible outside the pod: the condition
//! [`TIMING_CONDITION`] on the sidecar's own pod (True while renewals use
//! more than their share of R − P), which the operator gathers into the
//! lease's `TimingAtRisk` condition, and an Event on the pod at each
//! crossing, at most one per [`EVENT_EVERY`] so a p99 hovering at the
//! threshold cannot flood the API server.
//!
//! Custom pod conditions are what readiness gates are built on: any client
//! with `pods/status` patch may set a condition type of its own, and the
//! kubelet keeps it ("Pod readiness",
//! <https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-readiness-gate>).
//! This one is not a readiness gate: it only informs.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use super::budget::BudgetVerdict;
use super::pod::{OwnCondition, PodRef, pod_recorder, set_own_condition};
use super::starting::Throttle;
use leasehold_kubernetes::api::contract::TIMING_CONDITION;

/// At most one timing Event per this, whatever the verdicts do.
pub(crate) const EVENT_EVERY: Duration = Duration::from_secs(600);
/// How long a failed condition write waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Publishes each verdict until the budget is gone.
pub async fn publish(client: kube::Client, pod: PodRef, mut verdicts: watch::Receiver<Option<BudgetVerdict>>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let (recorder, reference) = pod_recorder(client, &pod);
    let mut events = Throttle::new(EVENT_EVERY);
    // The first judgement sets the condition but is news only when at risk.
    let mut announced_risk = false;
    loop {
        let Some(verdict) = *verdicts.borrow_and_update() else {
            if verdicts.changed().await.is_err() {
                return;
            }
            continue;
        };
        if (verdict.at_risk || announced_risk) && events.due(Instant::now()).is_some() {
            announce(&recorder, &reference, &verdict).await;
            announced_risk = verdict.at_risk;
        }
        // Level-triggered: write until it sticks or a newer verdict arrives.
        while let Err(e) = set_condition(&pods, &pod.name, &verdict).await {
            warn!(error = %e, "cannot set the {TIMING_CONDITION} condition; trying again");
            tokio::select! {
                () = tokio::time::sleep(RETRY_AFTER) => {}
                changed = verdicts.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
        if verdicts.has_changed().unwrap_or(false) {
            continue;
        }
        if verdicts.changed().await.is_err() {
            return;
        }
    }
}

/// The condition on our own pod, by strategic merge (conditions merge by type).
async fn set_condition(pods: &Api<Pod>, name: &str, verdict: &BudgetVerdict) -> Result<Pod, kube::Error> {
    let (status, reason) = match verdict.at_risk {
        true => ("True", "RenewalsSlow"),
        false => ("False", "RenewalsWithinBudget"),
    };
    let condition = OwnCondition {
        kind: TIMING_CONDITION,
        status,
        reason,
        message: verdict.describe(),
    };
    set_own_condition(pods, name, condition).await
}

async fn announce(recorder: &Recorder, pod: &ObjectReference, verdict: &BudgetVerdict) {
    let (type_, reason) = match verdict.at_risk {
        true => (EventType::Warning, "TimingAtRisk"),
        false => (EventType::Normal, "TimingRecovered"),
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(verdict.describe()),
        action: "Renew".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, pod).await {
        warn!(error = %e, reason, "cannot publish an Event");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use leasehold_testkit::api::{ApiServer, pods};

    fn verdict(at_risk: bool, used: f64) -> Option<BudgetVerdict> {
        Some(BudgetVerdict {
            at_risk,
            used,
            budget: Duration::from_millis(400),
        })
    }

    fn events(api: &ApiServer) -> Vec<String> {
        api.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path().ends_with("/events"))
            .map(|r| r.body["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    async fn condition_becomes(api: &ApiServer, status: &str) -> serde_json::Value {
        for _ in 0..200 {
            let pod = api.get(&pods::collection("prod"), "web-0").unwrap();
            if pods::condition(&pod, TIMING_CONDITION) == Some(status) {
                return pod;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the {TIMING_CONDITION} condition never became {status}");
    }

    /// At risk: the condition goes True on our pod with the reasoning, and a
    /// Warning Event says so; flapping within EVENT_EVERY moves the
    /// condition every time but adds no Event.
    #[tokio::test]
    async fn the_verdict_becomes_a_pod_condition_and_a_bounded_event() {
        let api = ApiServer::new(Some(crate::rbac::allows_request));
        api.insert(
            &pods::collection("prod"),
            pods::pod("web-0", "prod", json!({"app": "web"}), None),
        );
        let pod = PodRef {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: Some("uid-0".into()),
        };
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(publish(api.client("prod"), pod, rx));

        tx.send_replace(verdict(false, 0.05));
        condition_becomes(&api, "False").await;
        assert!(events(&api).is_empty(), "a healthy first judgement is no news");

        tx.send_replace(verdict(true, 0.3));
        let pod = condition_becomes(&api, "True").await;
        let condition = pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == TIMING_CONDITION)
            .unwrap()
            .clone();
        assert_eq!(condition["reason"], "RenewalsSlow");
        assert!(
            condition["message"]
                .as_str()
                .unwrap()
                .contains("uses 30 % of R - P (400ms)"),
            "{condition}"
        );
        assert_eq!(events(&api), ["TimingAtRisk"]);

        tx.send_replace(verdict(false, 0.1));
        condition_becomes(&api, "False").await;
        tx.send_replace(verdict(true, 0.4));
        condition_becomes(&api, "True").await;
        assert_eq!(events(&api), ["TimingAtRisk"], "at most one Event per {EVENT_EVERY:?}");
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
        drop(tx);
        task.await.unwrap();
    }
}
