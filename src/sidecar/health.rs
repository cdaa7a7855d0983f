//! Leadership follows the app: the sidecar campaigns only while the main
//! container is healthy. Two sources, either or both: the main container's
//! readiness in our own pod's status (from the pod watch), and an app
//! health URL on localhost polled at an interval with a timeout.
//!
//! Unhealthy (not ready, or the URL failing N times in a row): a leader
//! stops claiming, drains and releases; a follower stops trying. Healthy
//! again: campaigning resumes. A sidecar that cannot tell (no source
//! answers) keeps its current behaviour and says why, rather than flapping.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// What one source says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Unhealthy(String),
    /// The source cannot tell (API server unreachable, container not listed).
    Unknown(String),
}

/// The app's health as the sidecar acts on it, shown on `/leader`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AppHealth {
    /// `None` when no source is configured or none can tell.
    pub healthy: Option<bool>,
    /// Why, in words (which source said what).
    pub reason: String,
}

impl AppHealth {
    /// Any source unhealthy → unhealthy; else any healthy → healthy; else unknown.
    pub fn combine(verdicts: &[(&str, &Verdict)]) -> AppHealth {
        let said = |wanted: fn(&Verdict) -> Option<&str>| {
            verdicts
                .iter()
                .filter_map(|(source, v)| wanted(v).map(|why| format!("{source}: {why}")))
                .collect::<Vec<_>>()
        };
        let unhealthy = said(|v| {
            if let Verdict::Unhealthy(why) = v {
                Some(why)
            } else {
                None
            }
        });
        if !unhealthy.is_empty() {
            return AppHealth {
                healthy: Some(false),
                reason: unhealthy.join("; "),
            };
        }
        let healthy = said(|v| {
            if matches!(v, Verdict::Healthy) {
                Some("healthy")
            } else {
                None
            }
        });
        if !healthy.is_empty() {
            return AppHealth {
                healthy: Some(true),
                reason: healthy.join("; "),
            };
        }
        let unknown = said(|v| if let Verdict::Unknown(why) = v { Some(why) } else { None });
        AppHealth {
            healthy: None,
            reason: unknown.join("; "),
        }
    }
}

/// Polls `url` (http://127.0.0.1:port/path) every `interval`; `failures`
/// failed polls in a row make it unhealthy, one success healthy again.
pub async fn poll_url(
    url: String,
    interval: Duration,
    timeout: Duration,
    failures: u32,
    verdict: watch::Sender<Verdict>,
) {
    let mut failed = 0u32;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let result = tokio::time::timeout(timeout, get_status(&url)).await;
        let problem = match result {
            Ok(Ok(status)) if (200..300).contains(&status) => None,
            Ok(Ok(status)) => Some(format!("{url} answered {status}")),
            Ok(Err(e)) => Some(format!("{url}: {e}")),
            Err(_) => Some(format!("{url}: no answer within {timeout:?}")),
        };
        let next = match problem {
            None => {
                failed = 0;
                Verdict::Healthy
            }
            Some(why) => {
                failed += 1;
                debug!(failed, %why, "app health check failed");
                if failed < failures {
                    continue;
                }
                Verdict::Unhealthy(format!("{why} (at least {failures} times in a row)"))
            }
        };
        verdict.send_if_modified(|v| std::mem::replace(v, next.clone()) != next);
    }
}

/// One HTTP/1.1 GET to a plain-HTTP URL on the pod's own network; the status code.
async fn get_status(url: &str) -> std::io::Result<u16> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("the app health URL must start with http://"))?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(authority).await?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: leasehold\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut head = [0u8; 32];
    let n = stream.read(&mut head).await?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {line:?}")))
}

/// The named container's readiness in our own pod.
pub fn container_verdict(pod: &Pod, container: &str) -> Verdict {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == container));
    match status {
        None => Verdict::Unknown(format!("container {container} is not in the pod's status yet")),
        Some(c) if c.ready => Verdict::Healthy,
        Some(c) => Verdict::Unhealthy(format!(
            "container {container} is not ready (restarts: {})",
            c.restart_count
        )),
    }
}

/// Combines the sources' verdicts into the app's health, for the campaign
/// ([`super::own_pod::steer_campaign`]), `/leader`, metrics and Events.
pub async fn follow(sources: Vec<(&'static str, watch::Receiver<Verdict>)>, health: watch::Sender<AppHealth>) {
    let mut sources = sources;
    loop {
        let verdicts: Vec<(&str, Verdict)> = sources
            .iter_mut()
            .map(|(n, rx)| (*n, rx.borrow_and_update().clone()))
            .collect();
        let refs: Vec<(&str, &Verdict)> = verdicts.iter().map(|(n, v)| (*n, v)).collect();
        let combined = AppHealth::combine(&refs);
        let changed = health.send_if_modified(|h| std::mem::replace(h, combined.clone()) != combined);
        if changed {
            match combined.healthy {
                Some(true) => info!(reason = %combined.reason, "the app is healthy: campaigning"),
                Some(false) => warn!(reason = %combined.reason, "the app is unhealthy: not campaigning"),
                None => {
                    warn!(reason = %combined.reason, "cannot tell whether the app is healthy; keeping the current behaviour")
                }
            }
        }
        let changes = sources.iter_mut().map(|(_, rx)| Box::pin(rx.changed()));
        if futures::future::select_all(changes).await.0.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_unhealthy_source_wins_and_unknown_changes_nothing() {
        let (healthy, sick, unknown) = (
            Verdict::Healthy,
            Verdict::Unhealthy("500".into()),
            Verdict::Unknown("API down".into()),
        );
        assert_eq!(
            AppHealth::combine(&[("url", &healthy), ("container", &sick)]).healthy,
            Some(false)
        );
        assert_eq!(
            AppHealth::combine(&[("url", &healthy), ("container", &unknown)]).healthy,
            Some(true)
        );
        let neither = AppHealth::combine(&[("container", &unknown)]);
        assert_eq!(neither.healthy, None);
        assert_eq!(neither.reason, "container: API down");
        assert_eq!(AppHealth::combine(&[("url", &sick)]).reason, "url: 500");
    }

    #[test]
    fn the_main_containers_readiness_is_read_from_container_statuses() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0"},
            "status": {"containerStatuses": [
                {"name": "app", "ready": false, "restartCount": 2, "image": "app", "imageID": ""},
                {"name": "leasehold", "ready": true, "restartCount": 0, "image": "lh", "imageID": ""},
            ]}
        }))
        .unwrap();
        assert_eq!(
            container_verdict(&pod, "app"),
            Verdict::Unhealthy("container app is not ready (restarts: 2)".into())
        );
        assert_eq!(container_verdict(&pod, "leasehold"), Verdict::Healthy);
        assert!(matches!(container_verdict(&pod, "other"), Verdict::Unknown(_)));
    }
}
