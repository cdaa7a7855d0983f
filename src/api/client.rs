//! The Kubernetes client of the operator and `leasehold check`: from the
//! kubeconfig or the pod's account, saying which certificate was refused
//! when the TLS stack refuses one.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// rustls (webpki) accepts X.509 version 3 only; some hand-made test
    /// clusters issue version 1 client certificates (`openssl x509 -req`
    /// without extensions), and the error says only `UnsupportedCertVersion`.
    #[error(
        "the client certificate of kubeconfig user {user} ({certificate}) is X.509 version 1, which the TLS \
         stack refuses (UnsupportedCertVersion): issue a version 3 certificate (with extensions, as kubeadm, \
         kind and cert-manager do)"
    )]
    CertificateVersion {
        user: String,
        certificate: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot configure the Kubernetes client")]
    Config(#[source] kube::Error),
}

/// The client from `KUBECONFIG` (or `~/.kube/config`), else the pod's
/// ServiceAccount, in the order `Client::try_default` takes them.
pub async fn client() -> Result<Client, ClientError> {
    match Kubeconfig::read() {
        Ok(kubeconfig) => client_for(kubeconfig).await,
        Err(_) => Client::try_default().await.map_err(ClientError::Config),
    }
}

/// The client of one kubeconfig's current context.
pub async fn client_for(kubeconfig: Kubeconfig) -> Result<Client, ClientError> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| ClientError::Config(e.into()))?;
    Client::try_from(config).map_err(|e| explain(e, &kubeconfig))
}

fn explain(error: kube::Error, kubeconfig: &Kubeconfig) -> ClientError {
    if !format!("{error:?}").contains("UnsupportedCertVersion") {
        return ClientError::Config(error);
    }
    let (user, certificate) = current_certificate(kubeconfig);
    ClientError::CertificateVersion {
        user,
        certificate,
        source: error,
    }
}

/// The current context's user and where its client certificate comes from.
fn current_certificate(kubeconfig: &Kubeconfig) -> (String, String) {
    let user = kubeconfig
        .current_context
        .as_ref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref()?.user.clone())
        .unwrap_or_default();
    let certificate = kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.as_ref())
        .map(|auth| match (&auth.client_certificate, &auth.client_certificate_data) {
            (Some(path), _) => format!("file {path}"),
            (None, Some(_)) => "client-certificate-data".to_string(),
            (None, None) => "no client certificate".to_string(),
        })
        .unwrap_or_else(|| "not in the kubeconfig".to_string());
    (user, certificate)
}
