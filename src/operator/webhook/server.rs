//! The TLS accept loop.

use std::net::SocketAddr;
use std::sync::Arc;

use super::certs::CertificateBundle;
use super::{Error, Result};
use axum::Router;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Serves the webhook over TLS until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    bundle: &CertificateBundle,
    app: Router,
    shutdown: CancellationToken,
) -> Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(bundle.server_config()?));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    info!(%addr, "webhook listening");
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => { warn!(error = %e, "webhook accept failed"); continue }
            },
        };
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        connections.spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(e) => return warn!(%peer, error = %e, "webhook TLS handshake failed"),
            };
            let builder = Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}
