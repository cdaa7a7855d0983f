//! The sidecar's local HTTP API, for the main container: who leads, as JSON
//! (200 only while this pod leads, so it doubles as a probe), the classic
//! contrib leader-elector `{"name": …}`, a server-sent event stream of
//! changes and renewals, and health.

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

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

use crate::health::AppHealth;
use leasehold_core::lease::{Assigned, LeaderState};
use leasehold_kubernetes::api::contract::{GATE_PROBE_HOLD, GATE_PROBE_PATH};

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
    /// Leader only: RFC 3339 wall-clock time after which this view must not
    /// be acted on, whatever the sidecar does meanwhile (it may be stalled).
    /// The deadline (send time of the last renewal + R) minus a margin.
    pub valid_until: Option<String>,
    /// The monotonic deadline behind `valid_until`, while there is one.
    #[serde(skip)]
    claim_deadline: Option<Instant>,
    pub identity: String,
    pub campaigning: bool,
    /// Whether the main container is healthy (`null`: no health source, or
    /// none can tell), and why; the sidecar campaigns only while it is.
    pub app_healthy: Option<bool>,
    pub app_health: Option<String>,
    /// The last store error while following (e.g. unreachable since start),
    /// with what to fix.
    pub store_error: Option<String>,
    /// This candidate's version (`<name> (revision <n>)`), when it has one.
    pub version: Option<String>,
    /// The version the store records for the holder (or the last holder).
    pub holder_version: Option<String>,
    /// Why this candidate does not campaign for another version's sake, or
    /// why the version fence keeps it a follower.
    pub version_hold: Option<String>,
}

impl LeaderView {
    pub fn of(state: &LeaderState, now: Instant) -> Self {
        let leader = state.is_leader_at(now);
        let valid_until = valid_until(state, now);
        LeaderView {
            leader,
            holder: state.holder.clone(),
            term: state.term,
            token: state.token.map(|t| t.to_string()),
            since: state
                .since
                .map(|t: SystemTime| humantime::format_rfc3339_millis(t).to_string()),
            expires_in: state.expires_in(now).filter(|_| leader).map(|d| d.as_secs_f64()),
            claim_deadline: state.deadline.filter(|_| valid_until.is_some()),
            valid_until: valid_until.map(|t| humantime::format_rfc3339_millis(t).to_string()),
            identity: state.identity.clone(),
            campaigning: state.campaigning,
            app_healthy: None,
            app_health: None,
            store_error: match &state.change {
                leasehold_core::lease::Change::StoreError(e) => Some(e.clone()),
                _ => None,
            },
            version: state.version.as_ref().map(ToString::to_string),
            holder_version: state.holder_version.as_ref().map(ToString::to_string),
            version_hold: match &state.change {
                leasehold_core::lease::Change::Fenced(why) => Some(why.clone()),
                _ => state.standing_aside.clone(),
            },
        }
    }

    pub(crate) fn with_health(self, health: &AppHealth) -> Self {
        let reason = (!health.reason.is_empty()).then(|| health.reason.clone());
        LeaderView {
            app_healthy: health.healthy,
            app_health: reason,
            ..self
        }
    }

    /// What a watcher is told about: a new leader, holder, term or token,
    /// and each renewal (it extends `validUntil`). A renewal is known by its
    /// monotonic deadline: the rendered `validUntil` also moves with the
    /// instant it is rendered at, and would announce unchanged states.
    pub(crate) fn key(&self) -> (bool, Option<String>, u64, Option<String>, Option<Instant>) {
        (
            self.leader,
            self.holder.clone(),
            self.term,
            self.token.clone(),
            self.claim_deadline,
        )
    }
}

/// The share of R kept back from `validUntil`: it covers delivering the view
/// (file, event) and the wall clock stepping against the monotonic one.
const VALID_UNTIL_MARGIN: f64 = 0.1;

/// The wall-clock time until which a leader's view may be acted on.
fn valid_until(state: &LeaderState, now: Instant) -> Option<SystemTime> {
    let (deadline, renewed) = state.deadline.zip(state.renewed).filter(|_| state.is_leader_at(now))?;
    valid_until_of(deadline, deadline - renewed, now)
}

/// The wall-clock time until which what a renewal proved may be acted on:
/// its `deadline` (send time + `window`, which is R) less the margin.
fn valid_until_of(deadline: Instant, window: Duration, now: Instant) -> Option<SystemTime> {
    let margin = window.mul_f64(VALID_UNTIL_MARGIN);
    let left = deadline.saturating_duration_since(now).saturating_sub(margin);
    Some(SystemTime::now() + left).filter(|_| left > Duration::ZERO)
}

/// What the handlers read.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub leader: watch::Receiver<LeaderState>,
    pub app: watch::Receiver<AppHealth>,
    /// Why the sidecar cannot work yet (the store not reached since start), if so.
    pub starting: watch::Receiver<Option<String>>,
}

pub(crate) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/", get(name))
        .route("/watch", get(watch_changes))
        .route("/healthz", get(healthz))
        .route(GATE_PROBE_PATH, get(gate))
        .with_state(state)
}

/// The readiness probe of a readiness-gated pod's sidecar: 200 only while
/// this candidate leads with more than [`GATE_PROBE_HOLD`] before its
/// deadline, so the kubelet, which may keep the container ready that long
/// after a success, has it unready by the deadline (and the lease's D − R
/// covers its status write) even when this process stalls or its condition
/// cannot be cleared. Followers fail it too: their gate keeps them unready
/// anyway, and a resumed old leader whose condition is still True must not
/// turn Ready again.
pub(crate) async fn gate(State(state): State<ApiState>) -> (StatusCode, &'static str) {
    let now = Instant::now();
    let leader = state.leader.borrow();
    if leader.is_leader_at(now + GATE_PROBE_HOLD) {
        (StatusCode::OK, "leading")
    } else if leader.leader {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the claim lapses within the probe's hold",
        )
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not leading")
    }
}

/// 200 `ok`, or 503 saying why the sidecar cannot do its job: its elector
/// has stopped, or the store has not been reached since start.
pub(crate) async fn healthz(State(state): State<ApiState>) -> (StatusCode, String) {
    // The elector owns the state's sender: closed means it has ended.
    if state.leader.has_changed().is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "the elector has stopped".into());
    }
    match state.starting.borrow().clone() {
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
        None => (StatusCode::OK, "ok".into()),
    }
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

/// The classic contrib leader-elector's answer: the leader's pod name, which
/// its clients compare with `$HOSTNAME` (the full identity is in `/leader`).
async fn name(State(state): State<ApiState>) -> Json<serde_json::Value> {
    let holder = state.leader.borrow().holder.clone().unwrap_or_default();
    // A holder that is not an identity (another tool's row) is shown as is.
    let name = crate::publish::holder_pod(&holder).unwrap_or(holder);
    Json(serde_json::json!({ "name": name }))
}

async fn watch_changes(State(state): State<ApiState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(changes(state.leader)).keep_alive(KeepAlive::default())
}

/// One event per change of (leader, holder, term, token) and per renewal,
/// starting with the current state.
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

/// One held partition in the `/partitions` document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HeldPartition {
    pub index: u32,
    /// Its fencing token, as a decimal string (it exceeds 2^53).
    pub token: String,
}

/// What a partitioned sidecar's views are made of besides its assignment.
#[derive(Debug, Clone)]
pub(crate) struct PartitionsSetup {
    /// N, the lock's partitions.
    pub count: u32,
    pub identity: String,
    /// R: a renewal proves the session until its send time + R.
    pub renew_deadline: Duration,
}

/// The `/partitions` document (also the token file and each `/watch`
/// event of a partitioned sidecar).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartitionsView {
    /// This candidate holds at least one partition now (within its deadline).
    pub holds: bool,
    /// The partitions it may work on now, by index, each with its token;
    /// empty past the session's deadline and without those being handed over.
    pub partitions: Vec<HeldPartition>,
    /// N, how many partitions the lock has.
    pub count: u32,
    /// Candidates sharing them, in the last read of the member slots.
    pub members: usize,
    /// The session the partitions are held through.
    pub session: Option<String>,
    /// RFC 3339 wall-clock time after which these partitions must not be
    /// worked on, whatever the sidecar does meanwhile: the session's
    /// deadline (send time of its last renewal + R) minus a margin.
    pub valid_until: Option<String>,
    /// The monotonic deadline behind `valid_until`, while there is one.
    #[serde(skip)]
    claim_deadline: Option<Instant>,
    pub identity: String,
    pub app_healthy: Option<bool>,
    pub app_health: Option<String>,
    /// The store's start-up problem, with what to fix.
    pub store_error: Option<String>,
}

impl PartitionsView {
    pub(crate) fn of(assigned: &Assigned, setup: &PartitionsSetup, now: Instant) -> Self {
        // The deadline is checked here too: a stalled publisher must not
        // let a view outlive it.
        let live = assigned.deadline.filter(|d| now < *d);
        let partitions: Vec<HeldPartition> = assigned
            .partitions
            .iter()
            .filter(|_| live.is_some())
            .map(|(index, token)| HeldPartition {
                index: *index,
                token: token.to_string(),
            })
            .collect();
        let valid_until = live
            .filter(|_| !partitions.is_empty())
            .and_then(|d| valid_until_of(d, setup.renew_deadline, now));
        PartitionsView {
            holds: !partitions.is_empty(),
            partitions,
            count: setup.count,
            members: assigned.members,
            session: (!assigned.session.is_empty()).then(|| assigned.session.clone()),
            claim_deadline: live.filter(|_| valid_until.is_some()),
            valid_until: valid_until.map(|t| humantime::format_rfc3339_millis(t).to_string()),
            identity: setup.identity.clone(),
            app_healthy: None,
            app_health: None,
            store_error: None,
        }
    }

    pub(crate) fn with_health(self, health: &AppHealth) -> Self {
        PartitionsView {
            app_healthy: health.healthy,
            app_health: (!health.reason.is_empty()).then(|| health.reason.clone()),
            ..self
        }
    }

    /// What a watcher is told about: a partition gained or lost, a new
    /// token, member count or session, and each renewal (it extends
    /// `validUntil`; known by its monotonic deadline, as the leader's).
    pub(crate) fn key(&self) -> (Vec<HeldPartition>, usize, Option<String>, Option<Instant>) {
        (
            self.partitions.clone(),
            self.members,
            self.session.clone(),
            self.claim_deadline,
        )
    }
}

/// What the handlers of a partitioned sidecar read.
#[derive(Clone)]
pub(crate) struct PartitionsApi {
    pub assigned: watch::Receiver<Assigned>,
    pub setup: PartitionsSetup,
    pub app: watch::Receiver<AppHealth>,
    pub starting: watch::Receiver<Option<String>>,
}

impl PartitionsApi {
    fn view(&self) -> PartitionsView {
        PartitionsView {
            store_error: self.starting.borrow().clone(),
            ..PartitionsView::of(&self.assigned.borrow(), &self.setup, Instant::now()).with_health(&self.app.borrow())
        }
    }
}

/// The API of a partitioned lock: `/partitions` instead of `/leader`, which
/// (like `/`) answers 409 saying so rather than name a leader there is not.
pub(crate) fn partitions_router(state: PartitionsApi) -> Router {
    Router::new()
        .route("/partitions", get(partitions))
        .route("/leader", get(not_elected))
        .route("/", get(not_elected))
        .route("/watch", get(watch_partitions))
        .route("/healthz", get(partitions_healthz))
        .with_state(state)
}

/// 200 while this candidate holds at least one partition, else 503; the
/// document either way.
async fn partitions(State(state): State<PartitionsApi>) -> impl IntoResponse {
    let view = state.view();
    let status = if view.holds {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(view))
}

async fn not_elected(State(state): State<PartitionsApi>) -> impl IntoResponse {
    let error = format!(
        "this lock is shared as {} partitions, not led by one candidate: GET /partitions for the ones this \
         candidate holds, with their tokens",
        state.setup.count
    );
    (StatusCode::CONFLICT, Json(serde_json::json!({ "error": error })))
}

/// 200 `ok`, or 503 saying why not: the partitioned run has ended, or the
/// store has not been reached since start.
pub(crate) async fn partitions_healthz(State(state): State<PartitionsApi>) -> (StatusCode, String) {
    if state.assigned.has_changed().is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the partitioned run has stopped".into(),
        );
    }
    match state.starting.borrow().clone() {
        Some(problem) => (StatusCode::SERVICE_UNAVAILABLE, problem),
        None => (StatusCode::OK, "ok".into()),
    }
}

async fn watch_partitions(State(state): State<PartitionsApi>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(partition_changes(state.assigned, state.setup)).keep_alive(KeepAlive::default())
}

/// One `partitions` event per change of the held set, members or session
/// and per renewal, starting with the current state.
pub(crate) fn partition_changes(
    assigned: watch::Receiver<Assigned>,
    setup: PartitionsSetup,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut last = None;
    WatchStream::new(assigned).filter_map(move |a| {
        let view = PartitionsView::of(&a, &setup, Instant::now());
        let news = last.as_ref() != Some(&view.key());
        last = Some(view.key());
        async move {
            news.then(|| {
                Ok(Event::default()
                    .event("partitions")
                    .json_data(&view)
                    .unwrap_or_else(|_| Event::default()))
            })
        }
    })
}

/// Serves `app` on `listener` until `shutdown`, then drains. Handlers can
/// read the peer's address (`ConnectInfo`): the drain acknowledgement
/// accepts loopback peers only.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    fn api(state: LeaderState) -> (ApiState, watch::Sender<LeaderState>, watch::Sender<Option<String>>) {
        let (leader_tx, leader) = watch::channel(state);
        let (starting_tx, starting) = watch::channel(None);
        let app = watch::channel(AppHealth::default()).1;
        (ApiState { leader, app, starting }, leader_tx, starting_tx)
    }

    async fn get(state: &ApiState, path: &str) -> (StatusCode, String) {
        let request = http::Request::get(path).body(Body::empty()).unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn root_answers_the_leaders_pod_name_like_the_contrib_leader_elector() {
        let (state, _tx, _s) = api(LeaderState {
            holder: Some("eu/prod/web-1#1f2e3d4c".into()),
            ..Default::default()
        });
        let (status, body) = get(&state, "/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"name": "web-1"})
        );
        let (_, leader) = get(&state, "/leader").await;
        let leader: serde_json::Value = serde_json::from_str(&leader).unwrap();
        assert_eq!(
            leader["holder"], "eu/prod/web-1#1f2e3d4c",
            "the full identity stays in /leader"
        );
    }

    #[tokio::test]
    async fn healthz_tells_when_the_elector_has_ended_or_the_store_was_never_reached() {
        let (state, leader_tx, starting_tx) = api(LeaderState::default());
        assert_eq!(get(&state, "/healthz").await, (StatusCode::OK, "ok".into()));
        starting_tx.send_replace(Some("cannot reach the store: down; fix: check --database".into()));
        assert_eq!(
            get(&state, "/healthz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot reach the store: down; fix: check --database".into()
            )
        );
        starting_tx.send_replace(None);
        drop(leader_tx);
        assert_eq!(
            get(&state, "/healthz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "the elector has stopped".into())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_probe_passes_only_while_the_claim_outlasts_the_kubelets_hold() {
        let (state, leader_tx, _s) = api(LeaderState::default());
        let not_leading = (StatusCode::SERVICE_UNAVAILABLE, "not leading".to_string());
        assert_eq!(get(&state, GATE_PROBE_PATH).await, not_leading);
        let deadline = Instant::now() + GATE_PROBE_HOLD + Duration::from_secs(3);
        leader_tx.send_replace(LeaderState {
            leader: true,
            deadline: Some(deadline),
            ..Default::default()
        });
        assert_eq!(get(&state, GATE_PROBE_PATH).await, (StatusCode::OK, "leading".into()));
        // A stalled elector still says leader: true; the deadline decides.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            get(&state, GATE_PROBE_PATH).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the claim lapses within the probe's hold".into()
            )
        );
        leader_tx.send_replace(LeaderState::default());
        assert_eq!(get(&state, GATE_PROBE_PATH).await, not_leading);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaders_view_is_valid_until_its_deadline_less_a_margin_and_each_renewal_extends_it() {
        let renewed = Instant::now();
        let r = Duration::from_secs(10);
        let leading = LeaderState {
            leader: true,
            holder: Some("a#1".into()),
            term: 1,
            token: Some(leasehold_core::lease::FencingToken(7)),
            deadline: Some(renewed + r),
            renewed: Some(renewed),
            ..Default::default()
        };
        let wall = SystemTime::now();
        let view = LeaderView::of(&leading, Instant::now());
        let until = humantime::parse_rfc3339(view.valid_until.as_deref().unwrap()).unwrap();
        // R = 10 s less the 10 % margin, to the millisecond of the rendering.
        let expected = wall + Duration::from_secs(9);
        assert!(
            until.duration_since(expected).unwrap_or_else(|e| e.duration()) < Duration::from_millis(50),
            "{view:?}"
        );
        // Past deadline − margin the view is no longer valid, and a follower's never is.
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(LeaderView::of(&leading, Instant::now()).valid_until, None);
        assert_eq!(
            LeaderView::of(&LeaderState::default(), Instant::now()).valid_until,
            None
        );

        // /watch: an event per renewal, carrying the extended bound.
        let (tx, rx) = watch::channel(leading.clone());
        let mut events = std::pin::pin!(changes(rx));
        assert!(events.next().await.is_some());
        tx.send_modify(|s| {
            s.renewed = Some(Instant::now());
            s.deadline = Some(Instant::now() + r);
        });
        let renewal = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        assert!(renewal.is_ok_and(|e| e.is_some()), "no event for the renewal");
        // The same state sent again, later: its `validUntil` renders
        // differently, but no renewal happened, so no event.
        tokio::time::advance(Duration::from_micros(2500)).await;
        tx.send_modify(|_| {});
        let resent = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        assert!(resent.is_err(), "an event for an unchanged state: {resent:?}");
    }
}

#[cfg(test)]
mod partition_tests {
    use super::*;
    use axum::body::Body;
    use leasehold_core::lease::FencingToken;
    use tower::ServiceExt;

    fn setup() -> PartitionsSetup {
        PartitionsSetup {
            count: 8,
            identity: "pod-0#1".into(),
            renew_deadline: Duration::from_secs(10),
        }
    }

    fn holding(partitions: &[(u32, i64)]) -> Assigned {
        Assigned {
            session: "pod-0#1~00".into(),
            partitions: partitions.iter().map(|(i, t)| (*i, FencingToken(*t))).collect(),
            deadline: Some(Instant::now() + Duration::from_secs(10)),
            members: 3,
        }
    }

    fn api(assigned: Assigned) -> (PartitionsApi, watch::Sender<Assigned>) {
        let (tx, rx) = watch::channel(assigned);
        let api = PartitionsApi {
            assigned: rx,
            setup: setup(),
            app: watch::channel(AppHealth::default()).1,
            starting: watch::channel(None).1,
        };
        (api, tx)
    }

    async fn get(state: &PartitionsApi, path: &str) -> (StatusCode, serde_json::Value) {
        let request = http::Request::get(path).body(Body::empty()).unwrap();
        let response = partitions_router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    /// 200 with every held partition and its token (a decimal string, as
    /// `/leader`'s) while it holds any; 503 with the same document otherwise.
    #[tokio::test]
    async fn partitions_lists_the_held_ones_with_their_tokens_and_answers_200_only_while_holding_any() {
        let (state, tx) = api(holding(&[(1, 1 << 60), (6, 7)]));
        let (status, view) = get(&state, "/partitions").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            view["partitions"],
            serde_json::json!([{"index": 1, "token": "1152921504606846976"}, {"index": 6, "token": "7"}])
        );
        assert_eq!((view["holds"].as_bool(), view["count"].as_u64()), (Some(true), Some(8)));
        assert_eq!(
            (view["members"].as_u64(), view["session"].as_str()),
            (Some(3), Some("pod-0#1~00"))
        );
        assert!(view["validUntil"].is_string(), "{view}");
        tx.send_replace(holding(&[]));
        let (status, view) = get(&state, "/partitions").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            (view["holds"].as_bool(), view["validUntil"].is_null()),
            (Some(false), true)
        );
    }

    /// A view is never served past the session's deadline, even when
    /// nothing has published since (a stalled sidecar).
    #[tokio::test(start_paused = true)]
    async fn nothing_is_served_past_the_sessions_deadline() {
        let (state, _tx) = api(holding(&[(2, 5)]));
        assert_eq!(get(&state, "/partitions").await.0, StatusCode::OK);
        tokio::time::advance(Duration::from_secs(10)).await;
        let (status, view) = get(&state, "/partitions").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(view["partitions"], serde_json::json!([]));
    }

    #[tokio::test]
    async fn leader_and_root_point_to_partitions_instead_of_naming_a_leader() {
        let (state, _tx) = api(holding(&[(0, 1)]));
        for path in ["/leader", "/"] {
            let (status, body) = get(&state, path).await;
            assert_eq!(status, StatusCode::CONFLICT, "{path}");
            assert!(body["error"].as_str().unwrap().contains("GET /partitions"), "{body}");
        }
    }

    #[tokio::test]
    async fn healthz_tells_when_the_run_has_ended_or_the_store_was_never_reached() {
        let (tx, assigned) = watch::channel(Assigned::default());
        let (starting_tx, starting) = watch::channel(Some("the store has not answered since start: x".into()));
        let state = PartitionsApi {
            assigned,
            setup: setup(),
            app: watch::channel(AppHealth::default()).1,
            starting,
        };
        let answer = partitions_healthz(State(state.clone())).await;
        assert_eq!(answer.0, StatusCode::SERVICE_UNAVAILABLE);
        assert!(answer.1.contains("has not answered"));
        starting_tx.send_replace(None);
        assert_eq!(partitions_healthz(State(state.clone())).await.0, StatusCode::OK);
        drop(tx);
        assert_eq!(
            partitions_healthz(State(state)).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the partitioned run has stopped".into()
            )
        );
    }

    /// `/watch`: the current set first, then an event per change of the
    /// set and per renewal, none for an unchanged state, however much later
    /// it is rendered (the clock is paused, so "none" is judged exactly).
    #[tokio::test(start_paused = true)]
    async fn watch_emits_the_partition_set_on_each_change() {
        let (tx, rx) = watch::channel(holding(&[(0, 1)]));
        let mut events = std::pin::pin!(partition_changes(rx, setup()));
        let within = Duration::from_millis(100);
        let mut event = async || {
            tokio::time::timeout(within, events.next())
                .await
                .is_ok_and(|e| e.is_some())
        };
        assert!(event().await, "the current set");
        tx.send_modify(|a| {
            a.partitions.insert(3, FencingToken(9));
        });
        assert!(event().await, "a partition gained");
        // The same state, rendered 2.5 ms later: its wall-clock `validUntil`
        // reads differently, yet nothing happened.
        tokio::time::advance(Duration::from_micros(2500)).await;
        tx.send_modify(|a| a.members = 3);
        assert!(!event().await, "nothing new, no event");
        tx.send_modify(|a| a.deadline = Some(Instant::now() + Duration::from_secs(20)));
        assert!(event().await, "a renewal");
    }
}
