//! Says on the sidecar's own pod whether it reaches its store: the pod
//! condition [`STORE_CONDITION`], True while the elector's last store call
//! answered, False while it fails (or before the store first answered, or
//! while the store the URL reaches is not the lease's). A transfer or a
//! preference hands leadership only to a candidate showing it True
//! (issue 54): a target that cannot reach the store would not acquire the
//! lease reserved for it, and the lease would stay leaderless for D.
//!
//! Written when the verdict flips, not per call, so a steady pod costs no
//! writes; a flapping store costs one write per flip, and each flip
//! restarts the operator's preference period for this pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::sync::watch;
use tracing::warn;

use super::pod::{OwnCondition, PodRef, set_own_condition};
use leasehold_core::lease::{Change, LeaderState};
use leasehold_kubernetes::api::contract::STORE_CONDITION;

/// How long a failed condition write waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether the state shows the store answering, with why not.
fn reaches(state: &LeaderState) -> Result<(), String> {
    match &state.change {
        Change::Starting => Err("the store has not answered since the sidecar started".into()),
        Change::StoreError(error) => Err(error.clone()),
        Change::DeadlineMissed => Err("no renewal succeeded within the renew deadline".into()),
        _ => Ok(()),
    }
}

/// Publishes each flip of the verdict until the elector is gone.
pub(crate) async fn publish(client: kube::Client, pod: PodRef, mut states: watch::Receiver<LeaderState>) {
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
    let mut written: Option<bool> = None;
    loop {
        let verdict = reaches(&states.borrow_and_update());
        if written != Some(verdict.is_ok()) {
            match set_condition(&pods, &pod.name, &verdict).await {
                Ok(_) => written = Some(verdict.is_ok()),
                Err(e) => {
                    warn!(error = %e, "cannot set the {STORE_CONDITION} condition; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY_AFTER) => continue,
                        changed = states.changed() => if changed.is_err() { return } else { continue },
                    }
                }
            }
        }
        if states.changed().await.is_err() {
            return;
        }
    }
}

/// The verdict as the condition on our own pod.
async fn set_condition(pods: &Api<Pod>, name: &str, verdict: &Result<(), String>) -> Result<Pod, kube::Error> {
    let (status, reason, message) = match verdict {
        Ok(()) => (
            "True",
            "StoreAnswers",
            "the sidecar's last store call answered".to_string(),
        ),
        Err(why) => (
            "False",
            "StoreUnreachable",
            leasehold_kubernetes::api::errors::bounded(why),
        ),
    };
    let condition = OwnCondition {
        kind: STORE_CONDITION,
        status,
        reason,
        message,
    };
    set_own_condition(pods, name, condition).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use leasehold_testkit::api::{ApiServer, pods};

    fn state(change: Change) -> LeaderState {
        LeaderState {
            change,
            ..LeaderState::default()
        }
    }

    fn condition(api: &ApiServer) -> Option<(String, String)> {
        let pod = api.get(&pods::collection("prod"), "web-0")?;
        let conditions = pod["status"]["conditions"].as_array()?.clone();
        let found = conditions.into_iter().find(|c| c["type"] == STORE_CONDITION)?;
        Some((
            found["status"].as_str()?.to_string(),
            found["message"].as_str()?.to_string(),
        ))
    }

    /// Before the store answers the pod says False; once it answers, True;
    /// a store error flips it back with the error; renewals that keep
    /// answering write nothing more.
    #[tokio::test(start_paused = true)]
    async fn the_pod_says_whether_its_sidecar_reaches_the_store() {
        let api = ApiServer::new(Some(crate::rbac::allows_request));
        api.insert(
            &pods::collection("prod"),
            pods::pod("web-0", "prod", json!({"app": "web"}), None),
        );
        let (states, watched) = watch::channel(LeaderState::default());
        let pod = PodRef {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: None,
        };
        tokio::spawn(publish(api.client("prod"), pod, watched));
        let seen = |want: &'static str| {
            let api = &api;
            async move {
                tokio::time::timeout(Duration::from_secs(5), async {
                    loop {
                        if let Some((status, message)) = condition(api)
                            && status == want
                        {
                            return message;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("the condition never became {want}: {:?}", condition(api)))
            }
        };
        assert!(seen("False").await.contains("has not answered"));
        states.send_replace(state(Change::Observed));
        seen("True").await;
        let writes = || api.requests().iter().filter(|r| r.method == "PATCH").count();
        let before = writes();
        for change in [Change::Renewed, Change::Acquired, Change::Renewed] {
            states.send_replace(state(change));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(writes(), before, "no write while it keeps answering");
        states.send_replace(state(Change::StoreError(
            "store unavailable: connection refused".into(),
        )));
        assert!(seen("False").await.contains("connection refused"));
    }
}
