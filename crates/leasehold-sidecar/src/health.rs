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

use bytes::Bytes;
use http::Uri;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
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
    pub(crate) fn combine(verdicts: &[(&str, &Verdict)]) -> AppHealth {
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

/// Reads `--app-health-url`: a plain-HTTP URL with a host (the app's own
/// endpoint on the pod's network; TLS is not offered there).
pub(crate) fn parse_health_url(text: &str) -> Result<Uri, String> {
    let url: Uri = text.trim().parse().map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if url.scheme_str() != Some("http") {
        return Err(format!(
            "{text:?}: the app health URL must start with http:// (the app's own endpoint, e.g. http://127.0.0.1:8080/healthz)"
        ));
    }
    if url.authority().is_none() {
        return Err(format!("{text:?}: the app health URL names no host"));
    }
    Ok(url)
}

/// Polls `url` (http://127.0.0.1:port/path) every `interval`; `failures`
/// failed polls in a row make it unhealthy, one success healthy again.
pub(crate) async fn poll_url(
    url: Uri,
    interval: Duration,
    timeout: Duration,
    failures: u32,
    verdict: watch::Sender<Verdict>,
) {
    // A new connection per poll: an app that stopped accepting must fail
    // the check, not pass on a kept-alive connection.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<Bytes>>();
    let mut failed = 0u32;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let result = tokio::time::timeout(timeout, client.get(url.clone())).await;
        let problem = match result {
            Ok(Ok(response)) if response.status().is_success() => None,
            Ok(Ok(response)) => Some(format!("{url} answered {}", response.status())),
            Ok(Err(e)) => Some(format!("{url}: {}", leasehold_kubernetes::api::errors::chain(&e))),
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

/// The named container's readiness in our own pod.
pub(crate) fn container_verdict(pod: &Pod, container: &str) -> Verdict {
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
    fn the_health_url_must_be_plain_http_with_a_host() {
        assert!(parse_health_url("http://127.0.0.1:8080/healthz").is_ok());
        assert!(parse_health_url("http://[::1]:8080/").is_ok());
        let https = parse_health_url("https://127.0.0.1/healthz").unwrap_err();
        assert!(https.contains("must start with http://"), "{https}");
        let bare = parse_health_url("/healthz").unwrap_err();
        assert!(bare.contains("must start with http://"), "{bare}");
        assert!(
            parse_health_url("http://exa mple/")
                .unwrap_err()
                .contains("is not a URL")
        );
    }

    /// A server on `addr` that answers each connection with `status`; returns its URL.
    async fn answering(addr: &str, status: &'static str) -> Uri {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let url = match listener.local_addr().unwrap() {
            std::net::SocketAddr::V6(a) => format!("http://[{}]:{}/healthz", a.ip(), a.port()),
            a => format!("http://{a}/healthz"),
        };
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 1024];
                let _ = conn.read(&mut request).await;
                let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        url.parse().unwrap()
    }

    async fn verdict_of(url: Uri, failures: u32) -> Verdict {
        let (tx, mut rx) = watch::channel(Verdict::Unknown("not polled".into()));
        let poller = tokio::spawn(poll_url(
            url,
            Duration::from_millis(10),
            Duration::from_secs(5),
            failures,
            tx,
        ));
        rx.changed().await.unwrap();
        poller.abort();
        rx.borrow().clone()
    }

    #[tokio::test]
    async fn the_url_is_healthy_on_2xx_also_over_ipv6_and_unhealthy_otherwise() {
        assert_eq!(
            verdict_of(answering("127.0.0.1:0", "204 No Content").await, 1).await,
            Verdict::Healthy
        );
        assert_eq!(
            verdict_of(answering("[::1]:0", "200 OK").await, 1).await,
            Verdict::Healthy
        );
        let Verdict::Unhealthy(why) = verdict_of(answering("127.0.0.1:0", "503 Service Unavailable").await, 2).await
        else {
            panic!("a 503 is unhealthy");
        };
        assert!(
            why.contains("answered 503") && why.contains("2 times in a row"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn an_app_that_refuses_the_connection_is_unhealthy_with_the_cause() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}/healthz", closed.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(closed);
        let Verdict::Unhealthy(why) = verdict_of(url, 1).await else {
            panic!("a refused connection is unhealthy");
        };
        assert!(why.to_lowercase().contains("refused"), "{why}");
    }

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
        let pod: Pod = leasehold_kubernetes::api::client::object_from_value(&serde_json::json!({
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
