//! The operator's own endpoints: `/metrics` (Prometheus text), `/healthz`
//! (the process serves) and `/readyz` (the replica runs: active or standby).
//!
//! Standbys report ready on purpose: a Deployment counts unready pods as
//! unavailable, and a rollout of the operator must not stall on them.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What this replica is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Starting,
    /// Reconciling.
    Active,
    /// Following the election, ready to take over.
    Standby,
    Stopping,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Active => "active",
            Role::Standby => "standby",
            Role::Stopping => "stopping",
        }
    }
}

struct Shared {
    registry: Registry,
    role: watch::Receiver<Role>,
}

pub(crate) fn router(registry: Registry, role: watch::Receiver<Role>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Arc::new(Shared { registry, role }))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &shared.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
            .into_response(),
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let role = *shared.role.borrow();
    let status = match role {
        Role::Active | Role::Standby => StatusCode::OK,
        Role::Starting | Role::Stopping => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, role.as_str())
}

/// Serves until `shutdown`, then finishes the requests in flight.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::metrics::{Metrics, Outcome};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn endpoints_report_role_health_and_metrics_and_stop_on_shutdown() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics.reconciled(Outcome::Invalid, std::time::Duration::from_millis(3));
        let (role, role_rx) = watch::channel(Role::Starting);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, router(registry, role_rx), shutdown.clone()));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let starting = get(addr, "/readyz").await;
        assert!(
            starting.starts_with("HTTP/1.1 503") && starting.ends_with("starting"),
            "{starting}"
        );
        role.send_replace(Role::Standby);
        let standby = get(addr, "/readyz").await;
        assert!(
            standby.starts_with("HTTP/1.1 200") && standby.ends_with("standby"),
            "{standby}"
        );

        let text = get(addr, "/metrics").await;
        assert!(
            text.contains("leasehold_operator_reconciles_total{outcome=\"invalid\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("leasehold_operator_is_leader 0"), "{text}");

        shutdown.cancel();
        server.await.unwrap().unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed after shutdown"
        );
    }
}
