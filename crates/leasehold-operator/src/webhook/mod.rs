//! Sidecar injection: a mutating admission webhook served by the operator.
//!
//! A pod annotated `leasehold.dev/lease: <name>` gets the sidecar container
//! (downward-API identity, resources, a locked-down security context), a
//! shared emptyDir for the token file mounted read-only into the app
//! containers, and the `leasehold.dev/leader` readiness gate when the lease
//! asks for one. Other pods pass unchanged. A pod naming a lease that cannot
//! be found is admitted with a warning (the sidecar waits for the lease), never
//! rejected: leader election must not block scheduling. With
//! `leasehold.dev/run: <container>` that container's command is wrapped with
//! `leasehold run` instead of adding a sidecar; a pod asking for it that
//! cannot be wrapped is denied, since admitted it would run everywhere.

mod admission;
mod certs;
mod patch;
mod server;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub(crate) use admission::{KubeLeaseLookup, router};
pub(crate) use certs::{CertDir, fixed, patch_ca_bundle, shared_self_signed};
pub use patch::{InjectionConfig, SidecarArgs};
pub use patch::{LeaseInjection, NotInjected, injection_patch};
pub(crate) use server::{Timeouts, bind, serve};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("certificate generation failed")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS setup failed")]
    Tls(#[from] rustls::Error),
    #[error("the webhook {what} is not PEM")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the webhook certificate file holds no certificate")]
    NoCertificate,
    #[error("Secret {0} lacks ca.crt, tls.crt or tls.key")]
    IncompleteSecret(String),
    #[error("cannot read {path}")]
    Read { path: String, source: std::io::Error },
    #[error("cannot listen for the webhook on {addr}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot update MutatingWebhookConfiguration {name}")]
    Configuration { name: String, source: kube::Error },
    #[error("cannot read or write Secret {name}")]
    Secret { name: String, source: kube::Error },
    #[error("MutatingWebhookConfiguration {0} has no webhooks to give the CA bundle to")]
    NoWebhooks(String),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// The webhook's flags, part of `leasehold operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the sidecar-injection webhook (HTTPS) on this address; off when unset.
    #[arg(long = "webhook-listen", env = "LEASEHOLD_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// Folder holding tls.crt and tls.key issued by cert-manager (which also
    /// fills the caBundle); without it the operator makes a self-signed CA.
    #[arg(long = "webhook-cert-dir", env = "LEASEHOLD_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,
    /// The Service in front of the webhook (names in the certificate).
    #[arg(
        long = "webhook-service",
        env = "LEASEHOLD_WEBHOOK_SERVICE",
        default_value = "leasehold-webhook"
    )]
    pub webhook_service: String,
    /// Secret, in the operator's namespace, holding the self-signed certificate.
    #[arg(
        long = "webhook-secret",
        env = "LEASEHOLD_WEBHOOK_SECRET",
        default_value = "leasehold-webhook-tls"
    )]
    pub webhook_secret: String,
    /// MutatingWebhookConfiguration whose caBundle gets the self-signed CA.
    #[arg(
        long = "webhook-configuration",
        env = "LEASEHOLD_WEBHOOK_CONFIGURATION",
        default_value = "leasehold-sidecar-injector"
    )]
    pub webhook_configuration: String,
    /// The injected sidecar (--sidecar-image is required with --webhook-listen).
    #[command(flatten)]
    pub sidecar: SidecarArgs,
}

impl WebhookArgs {
    /// The injected container's settings; checked before anything starts.
    /// `cluster` is the operator's `--cluster-name`, which every injected
    /// sidecar gets.
    pub fn injection(&self, cluster: Option<String>) -> Result<Option<InjectionConfig>> {
        if self.webhook_listen.is_none() {
            return Ok(None);
        }
        let image = self.sidecar.sidecar_image.clone().ok_or_else(|| {
            Error::Config("--sidecar-image (LEASEHOLD_SIDECAR_IMAGE) is required with --webhook-listen".into())
        })?;
        Ok(Some(self.sidecar.injection(image, cluster)))
    }
}

/// Prepares the certificate and serves the webhook until `shutdown`.
pub(crate) async fn run(
    args: &WebhookArgs,
    injection: InjectionConfig,
    namespace: &str,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<()> {
    let Some(addr) = args.webhook_listen else { return Ok(()) };
    let certificates: Arc<dyn rustls::server::ResolvesServerCert> = match &args.webhook_cert_dir {
        Some(dir) => Arc::new(CertDir::open(dir)?),
        None => {
            let bundle =
                shared_self_signed(client.clone(), namespace, &args.webhook_secret, &args.webhook_service).await?;
            patch_ca_bundle(client.clone(), &args.webhook_configuration, &bundle.ca_pem).await?;
            fixed(&bundle)?
        }
    };
    let app = router(Arc::new(KubeLeaseLookup(client)), Arc::new(injection));
    serve(bind(addr).await?, certificates, app, Timeouts::default(), shutdown).await
}
