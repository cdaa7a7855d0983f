//! The HTTPS server: TLS handshakes and request headers under timeouts,
//! graceful shutdown that lets admission requests in flight complete.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::certs::server_config;
use super::{Error, Result};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::server::ResolvesServerCert;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a client may take before it has sent something useful. The API
/// server's own webhook timeout is at most 30 s, so anything slower is not
/// the API server; without these a client that connects and stays silent
/// holds a task and a socket forever.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub handshake: Duration,
    pub header_read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown`; then stops accepting,
/// lets requests in flight finish and closes idle connections.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    certificates: Arc<dyn ResolvesServerCert>,
    app: Router,
    timeouts: Timeouts,
    shutdown: CancellationToken,
) -> Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(certificates)?));
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    let graceful = GracefulShutdown::new();
    let handshakes = tokio_util::task::TaskTracker::new();
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "webhook listening");
    }
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => { warn!(error = %e, "webhook accept failed"); continue }
            },
        };
        let (acceptor, app, builder, watcher) = (acceptor.clone(), app.clone(), builder.clone(), graceful.watcher());
        let shutdown = shutdown.clone();
        handshakes.spawn(async move {
            let tls = tokio::select! {
                _ = shutdown.cancelled() => return,
                tls = tokio::time::timeout(timeouts.handshake, acceptor.accept(stream)) => match tls {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return warn!(%peer, error = %e, "webhook TLS handshake failed"),
                    Err(_) => return warn!(%peer, "webhook TLS handshake timed out"),
                },
            };
            let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            if let Err(e) = watcher.watch(connection.into_owned()).await {
                debug!(%peer, error = %e, "webhook connection ended");
            }
        });
    }
    drop(listener);
    // Connections still in the handshake end at once (see above); the served
    // ones finish the request they are on.
    graceful.shutdown().await;
    handshakes.close();
    handshakes.wait().await;
    Ok(())
}

/// Binds `addr` for [`serve`].
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })
}
