//! The sidecar's local HTTP API, for the main container: who leads, as JSON
//! (200 only while this pod leads, so it doubles as a probe), the classic
//! contrib leader-elector `{"name": …}`, a server-sent event stream of
//! changes, and health.

use std::convert::Infallible;
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;

use crate::lease::LeaderState;
use crate::sidecar::health::AppHealth;

/// The `/leader` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderView {
    /// This pod leads now (within its deadline).
    pub leader: bool,
    pub holder: Option<String>,
    pub term: u64,
    /// The fencing token, as a decimal string (it exceeds 2^53).
    pub token: Option<String>,
    /// RFC 3339, when the current holder was first seen or we acquired.
    pub since: Option<String>,
    /// Seconds until this leader stops claiming unless it renews.
    pub expires_in: Option<f64>,
    pub identity: String,
    pub campaigning: bool,
    /// Whether the main container is healthy (`null`: no health source, or
    /// none can tell), and why; the sidecar campaigns only while it is.
    pub app_healthy: Option<bool>,
    pub app_health: Option<String>,
}

impl LeaderView {
    pub fn of(state: &LeaderState, now: Instant) -> Self {
        let leader = state.is_leader_at(now);
        LeaderView {
            leader,
            holder: state.holder.clone(),
            term: state.term,
            token: state.token.map(|t| t.to_string()),
            since: state
                .since
                .map(|t: SystemTime| humantime::format_rfc3339_millis(t).to_string()),
            expires_in: state.expires_in(now).filter(|_| leader).map(|d| d.as_secs_f64()),
            identity: state.identity.clone(),
            campaigning: state.campaigning,
            app_healthy: None,
            app_health: None,
        }
    }

    pub fn with_health(self, health: &AppHealth) -> Self {
        let reason = (!health.reason.is_empty()).then(|| health.reason.clone());
        LeaderView {
            app_healthy: health.healthy,
            app_health: reason,
            ..self
        }
    }

    /// What a watcher is told about; renewals are not news.
    fn key(&self) -> (bool, Option<String>, u64, Option<String>) {
        (self.leader, self.holder.clone(), self.term, self.token.clone())
    }
}

/// What the handlers read.
#[derive(Clone)]
pub struct ApiState {
    pub leader: watch::Receiver<LeaderState>,
    pub app: watch::Receiver<AppHealth>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/", get(name))
        .route("/watch", get(watch_changes))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

async fn leader(State(state): State<ApiState>) -> impl IntoResponse {
    let view = LeaderView::of(&state.leader.borrow(), Instant::now()).with_health(&state.app.borrow());
    let status = if view.leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(view))
}

async fn name(State(state): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "name": state.leader.borrow().holder.clone().unwrap_or_default() }))
}

async fn watch_changes(State(state): State<ApiState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(changes(state.leader)).keep_alive(KeepAlive::default())
}

/// One event per change of (leader, holder, term, token), starting with the current state.
pub fn changes(state: watch::Receiver<LeaderState>) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut last = None;
    WatchStream::new(state).filter_map(move |s| {
        let view = LeaderView::of(&s, Instant::now());
        let news = last.as_ref() != Some(&view.key());
        last = Some(view.key());
        async move {
            news.then(|| {
                Ok(Event::default()
                    .event("leader")
                    .json_data(&view)
                    .unwrap_or_else(|_| Event::default()))
            })
        }
    })
}

/// Serves `app` on `listener` until `shutdown`, then drains.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
