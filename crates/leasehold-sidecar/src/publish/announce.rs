//! Events on the pod: acquisitions, losses, releases and the app's health.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::{broadcast, watch};
use tracing::warn;

use crate::health::AppHealth;
use leasehold_core::lease::{Change, LeaderState};

/// Events on the pod: acquisitions, losses, releases and the app's health;
/// a task of its own, so an Event never delays a label or condition.
#[derive(Clone)]
pub(super) struct Announcer {
    pub(super) recorder: Recorder,
    pub(super) pod: ObjectReference,
}

impl Announcer {
    pub(super) async fn run(
        self,
        mut transitions: broadcast::Receiver<LeaderState>,
        mut app: watch::Receiver<AppHealth>,
    ) {
        let mut app_open = true;
        loop {
            tokio::select! {
                transition = transitions.recv() => match transition {
                    Ok(transition) => self.announce(&transition).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => warn!(missed, "Events fell behind"),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                changed = app.changed(), if app_open => match changed {
                    Ok(()) => {
                        let health = app.borrow_and_update().clone();
                        self.announce_app_health(&health).await;
                    }
                    Err(_) => app_open = false,
                },
            }
        }
    }

    pub(super) async fn announce(&self, transition: &LeaderState) {
        let (type_, reason, note) = match &transition.change {
            Change::Acquired => (
                EventType::Normal,
                "Acquired",
                format!("leads term {} with token {}", transition.term, token(transition)),
            ),
            Change::Lost(why) => (
                EventType::Warning,
                "Lost",
                format!("lost term {}: {why}", transition.term),
            ),
            Change::DeadlineMissed => (
                EventType::Warning,
                "Lost",
                format!(
                    "no renewal within the renew deadline; stopped claiming term {}",
                    transition.term
                ),
            ),
            Change::Released => (
                EventType::Normal,
                "Released",
                format!("released term {}", transition.term),
            ),
            Change::ReleaseFailed(e) => (
                EventType::Warning,
                "ReleaseFailed",
                format!("term {}: {e}; the lease will expire", transition.term),
            ),
            _ => return,
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Elect".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.pod).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }
}

impl Announcer {
    /// An Event on each change of the app's health.
    async fn announce_app_health(&self, health: &AppHealth) {
        let (type_, reason) = match health.healthy {
            Some(true) => (EventType::Normal, "AppHealthy"),
            Some(false) => (EventType::Warning, "AppUnhealthy"),
            None => (EventType::Warning, "AppHealthUnknown"),
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(health.reason.clone()),
            action: "Campaign".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.pod).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }
}

fn token(state: &LeaderState) -> String {
    state.token.map(|t| t.to_string()).unwrap_or_default()
}
