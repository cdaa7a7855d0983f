//! The drain acknowledgement (issue 35): `POST /drained?token=T` on the local
//! API tells the sidecar that the app has stopped the leader work it did
//! under token `T`, so a stand-aside (a transfer, a terminating pod, an
//! unhealthy app) releases at once instead of after the whole drain window.
//!
//! Accepted (202) only
//! * from a loopback peer: the caller's own address, not the listener's,
//!   since the local API may be bound to every address (`--http-addr`);
//! * for the term being stood aside from: this candidate stopped claiming
//!   it on purpose and has not released it yet, and `T` is its token. A
//!   late acknowledgement never ends the drain of a newer term, and one
//!   sent while still leading is refused, not remembered.
//!
//! Served on the local API only, never on the metrics port, which listens
//! on every address for the kubelet's probes.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde::Deserialize;
use tokio::sync::watch;

use leasehold_core::lease::{Change, FencingToken, LeaderState};

/// The path of the acknowledgement.
pub(crate) const PATH: &str = "/drained";

/// What the route reads and writes.
#[derive(Clone)]
pub(crate) struct Acks {
    pub leader: watch::Receiver<LeaderState>,
    /// The token of the last accepted acknowledgement.
    pub drained: watch::Sender<Option<FencingToken>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Ack {
    /// The fencing token the app stopped working under, as `/leader` and
    /// the token file give it.
    token: String,
}

/// The route, to merge into the local API's router (never the metrics one).
pub(crate) fn router(acks: Acks) -> Router {
    Router::new().route(PATH, post(acknowledge)).with_state(acks)
}

async fn acknowledge(
    State(acks): State<Acks>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(ack): Query<Ack>,
) -> (StatusCode, String) {
    match judge(&acks.leader.borrow(), peer, &ack.token) {
        Ok(token) => {
            acks.drained.send_replace(Some(token));
            (
                StatusCode::ACCEPTED,
                format!("drained under token {token}: releasing\n"),
            )
        }
        Err(refusal) => refusal,
    }
}

/// Whether an acknowledgement from `peer` naming `token` ends the drain.
fn judge(state: &LeaderState, peer: SocketAddr, token: &str) -> Result<FencingToken, (StatusCode, String)> {
    if !peer.ip().to_canonical().is_loopback() {
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "only the pod's own app may acknowledge a drain; {} is not a loopback address\n",
                peer.ip()
            ),
        ));
    }
    let token = token.parse::<i64>().map(FencingToken).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            format!("token {token:?} is not a fencing token (a decimal integer, as /leader gives it)\n"),
        )
    })?;
    let draining = !state.leader && state.change == Change::SteppingDown;
    match (draining, state.token) {
        (true, Some(current)) if current == token => Ok(token),
        (true, current) => Err((
            StatusCode::CONFLICT,
            format!(
                "token {token} is not the term being stood aside from (token {})\n",
                current.map_or("none".into(), |t| t.to_string())
            ),
        )),
        (false, _) => Err((
            StatusCode::CONFLICT,
            "not standing aside from a term: nothing to acknowledge\n".into(),
        )),
    }
}

/// Waits until the app acknowledged the drain of the term with `token`.
pub(crate) async fn acknowledged(mut drained: watch::Receiver<Option<FencingToken>>, token: FencingToken) {
    if drained.wait_for(|t| *t == Some(token)).await.is_err() {
        // No acknowledgements any more: the drain runs its course.
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    const LOCAL: &str = "127.0.0.1:50000";

    fn stepping_down(token: i64) -> LeaderState {
        LeaderState {
            leader: false,
            token: Some(FencingToken(token)),
            change: Change::SteppingDown,
            ..LeaderState::default()
        }
    }

    /// POSTs an acknowledgement from `peer`; the status and what the
    /// channel holds after.
    async fn post(state: LeaderState, peer: &str, token: &str) -> (StatusCode, Option<FencingToken>) {
        let (drained, acked) = watch::channel(None);
        let acks = Acks {
            leader: watch::channel(state).1,
            drained,
        };
        let peer: SocketAddr = peer.parse().unwrap();
        let mut request = http::Request::post(format!("{PATH}?token={token}"))
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = router(acks).oneshot(request).await.unwrap();
        (response.status(), *acked.borrow())
    }

    #[tokio::test]
    async fn the_term_being_stood_aside_from_is_acknowledged() {
        assert_eq!(
            post(stepping_down(42), LOCAL, "42").await,
            (StatusCode::ACCEPTED, Some(FencingToken(42)))
        );
        // IPv6 loopback, and IPv4 loopback mapped into IPv6 (a dual-stack listener).
        for peer in ["[::1]:50000", "[::ffff:127.0.0.1]:50000"] {
            assert_eq!(
                post(stepping_down(42), peer, "42").await.0,
                StatusCode::ACCEPTED,
                "{peer}"
            );
        }
    }

    #[tokio::test]
    async fn another_terms_token_is_refused() {
        // A late acknowledgement of an earlier term.
        assert_eq!(post(stepping_down(43), LOCAL, "42").await, (StatusCode::CONFLICT, None));
    }

    #[tokio::test]
    async fn nothing_is_acknowledged_while_leading_or_following() {
        let leading = LeaderState {
            leader: true,
            change: Change::Renewed,
            ..stepping_down(42)
        };
        assert_eq!(post(leading, LOCAL, "42").await, (StatusCode::CONFLICT, None));
        let released = LeaderState {
            change: Change::Released,
            ..stepping_down(42)
        };
        assert_eq!(post(released, LOCAL, "42").await, (StatusCode::CONFLICT, None));
    }

    #[tokio::test]
    async fn only_a_loopback_peer_may_acknowledge() {
        for peer in ["10.0.0.7:50000", "[fd00::7]:50000", "[::ffff:10.0.0.7]:50000"] {
            assert_eq!(
                post(stepping_down(42), peer, "42").await,
                (StatusCode::FORBIDDEN, None),
                "{peer}"
            );
        }
    }

    #[tokio::test]
    async fn a_malformed_token_is_named() {
        assert_eq!(
            post(stepping_down(42), LOCAL, "x42").await,
            (StatusCode::BAD_REQUEST, None)
        );
    }

    #[tokio::test]
    async fn an_acknowledgement_ends_only_its_own_terms_drain() {
        let (tx, rx) = watch::channel(Some(FencingToken(41)));
        let waiting = tokio::spawn(acknowledged(rx, FencingToken(42)));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an earlier term's acknowledgement");
        tx.send_replace(Some(FencingToken(42)));
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the drain ends on its own term's acknowledgement")
            .unwrap();
    }
}
