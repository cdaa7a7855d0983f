//! What a candidate campaigns on: the app's health sources (an app health
//! URL, the app container's readiness) and our own pod's deletion, for
//! either mode of the sidecar.

use tokio::sync::watch;
use tracing::warn;

use leasehold_core::lease::EndReason;

use super::health::{self, AppHealth, Verdict};
use super::metrics::Metrics;
use super::own_pod;

/// Starts the configured app health sources and the campaign that follows
/// them and the pod's deletion; with no source, the app counts as healthy.
/// With sources, the elector stops campaigning at once until one says the
/// app is healthy.
pub(super) fn start(
    args: &super::Args,
    own: Option<watch::Receiver<own_pod::OwnPod>>,
    metrics: Metrics,
    campaign_unless: impl Fn(Option<EndReason>) + Send + 'static,
) -> watch::Receiver<AppHealth> {
    let mut sources = Vec::new();
    if let Some(url) = args.app_health_url.clone() {
        let (tx, rx) = watch::channel(Verdict::Unknown(format!("{url} not polled yet")));
        let (interval, timeout, failures) = (
            args.app_health_interval,
            args.app_health_timeout,
            args.app_health_failures,
        );
        tokio::spawn(health::poll_url(url, interval, timeout, failures, tx));
        sources.push(("url", rx));
    }
    if let Some(container) = args.app_container.clone() {
        match own.clone() {
            Some(own) => {
                let (tx, rx) = watch::channel(Verdict::Unknown("pod not read yet".into()));
                tokio::spawn(own_pod::follow_app_verdict(own, tx));
                sources.push(("container", rx));
            }
            None => warn!(%container, "--app-container needs the Kubernetes API; ignoring it"),
        }
    }
    let (health_tx, health_rx) = watch::channel(AppHealth::default());
    if !sources.is_empty() {
        // Campaign only once a source says the app is healthy.
        campaign_unless(Some(EndReason::AppUnhealthy));
        tokio::spawn(health::follow(sources, health_tx));
        tokio::spawn(metrics.follow_app_health(health_rx.clone()));
    }
    tokio::spawn(own_pod::steer_campaign(health_rx.clone(), own, campaign_unless));
    health_rx
}
