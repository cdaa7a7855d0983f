//! One cancellation token owns shutdown: the first SIGTERM or SIGINT cancels
//! it, a second one exits at once.

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
pub fn exit_on_signals(shutdown: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM: shutting down (a second signal exits at once)"),
            _ = interrupt.recv() => info!("SIGINT: shutting down (a second signal exits at once)"),
        }
        shutdown.cancel();
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        error!("second signal: exiting without finishing the shutdown");
        std::process::exit(130);
    });
    Ok(())
}
