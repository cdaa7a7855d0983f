//! One cancellation token owns shutdown: the first SIGTERM or SIGINT cancels
//! it, a second one exits at once.

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
pub fn exit_on_signals(shutdown: CancellationToken) -> std::io::Result<()> {
    exit_on_signals_noting(shutdown, |_| {})
}

/// As [`exit_on_signals`], telling `first` which signal (its number) started
/// the shutdown before the token is cancelled, so it can be passed on.
pub fn exit_on_signals_noting(
    shutdown: CancellationToken,
    first: impl FnOnce(i32) + Send + 'static,
) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let received = tokio::select! {
            _ = terminate.recv() => { info!("SIGTERM: shutting down (a second signal exits at once)"); SignalKind::terminate() }
            _ = interrupt.recv() => { info!("SIGINT: shutting down (a second signal exits at once)"); SignalKind::interrupt() }
        };
        first(received.as_raw_value());
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
