//! The Kubernetes client of the operator and `leasehold check`: from the
//! kubeconfig or the pod's account, saying which certificate was refused
//! when the TLS stack refuses one.

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

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
    #[error("no kubeconfig: {looked} and this is not a pod; pass --kubeconfig <file> or set KUBECONFIG")]
    NoKubeconfig {
        looked: String,
        #[source]
        source: KubeconfigError,
    },
    /// Missing or not a kubeconfig: the cause, printed after, says which.
    #[error("cannot read the kubeconfig {paths}: pass --kubeconfig <file> or set KUBECONFIG to a readable kubeconfig")]
    UnreadableKubeconfig {
        paths: String,
        #[source]
        source: KubeconfigError,
    },
    #[error("the kubeconfig has no context {context:?} (it has: {known}); pass --context with one of them")]
    NoContext { context: String, known: String },
    #[error("cannot configure the Kubernetes client")]
    Config(#[source] kube::Error),
}

/// The client of the cluster a command names: the kubeconfig at
/// `kubeconfig` (a `KUBECONFIG`-style list of files; the flag
/// `--kubeconfig` or the variable `KUBECONFIG`), else `~/.kube/config`,
/// else the pod's ServiceAccount, as `kubectl` takes them; `context`
/// picks a kubeconfig context other than the current one.
pub async fn client(kubeconfig: Option<&str>, context: Option<&str>) -> Result<Client, ClientError> {
    Ok(connect(kubeconfig, context).await?.0)
}

/// [`client`], and the URL of the API server it talks to, for messages
/// that must say which server did not answer.
pub async fn connect(kubeconfig: Option<&str>, context: Option<&str>) -> Result<(Client, String), ClientError> {
    let read = match kubeconfig {
        Some(paths) => std::env::split_paths(paths)
            .filter(|p| !p.as_os_str().is_empty())
            .try_fold(Kubeconfig::default(), |merged, path| {
                Kubeconfig::read_from(path).and_then(|next| merged.merge(next))
            })
            .map_err(|source| ClientError::UnreadableKubeconfig {
                paths: paths.to_string(),
                source,
            })?,
        None => match Kubeconfig::read() {
            Ok(kubeconfig) => kubeconfig,
            // kube's `Config::incluster` reads KUBERNETES_SERVICE_HOST/PORT,
            // which the kubelet sets in every container.
            Err(source) => {
                return match kube::Config::incluster() {
                    Ok(config) => {
                        let server = config.cluster_url.to_string();
                        Ok((Client::try_from(config).map_err(ClientError::Config)?, server))
                    }
                    Err(_) => Err(ClientError::NoKubeconfig {
                        looked: "KUBECONFIG is unset, ~/.kube/config cannot be read".into(),
                        source,
                    }),
                };
            }
        },
    };
    connect_to(read, context).await
}

/// The client of one kubeconfig's current context, or of `context`.
#[cfg(test)]
pub(crate) async fn client_for(kubeconfig: Kubeconfig, context: Option<&str>) -> Result<Client, ClientError> {
    Ok(connect_to(kubeconfig, context).await?.0)
}

/// The client of one kubeconfig's current context (or of `context`), and the URL of its API server.
async fn connect_to(kubeconfig: Kubeconfig, context: Option<&str>) -> Result<(Client, String), ClientError> {
    if let Some(context) = context
        && !kubeconfig.contexts.iter().any(|c| c.name == context)
    {
        let known: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(ClientError::NoContext {
            context: context.to_string(),
            known: match known.is_empty() {
                true => "none".to_string(),
                false => known.join(", "),
            },
        });
    }
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .map_err(|e| ClientError::Config(e.into()))?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| explain(e, &kubeconfig, context))?;
    Ok((client, server))
}

fn explain(error: kube::Error, kubeconfig: &Kubeconfig, context: Option<&str>) -> ClientError {
    if !format!("{error:?}").contains("UnsupportedCertVersion") {
        return ClientError::Config(error);
    }
    let (user, certificate) = current_certificate(kubeconfig, context);
    ClientError::CertificateVersion {
        user,
        certificate,
        source: error,
    }
}

/// The chosen (else current) context's user and where its client certificate comes from.
fn current_certificate(kubeconfig: &Kubeconfig, context: Option<&str>) -> (String, String) {
    let user = context
        .or(kubeconfig.current_context.as_deref())
        .and_then(|name| kubeconfig.contexts.iter().find(|c| c.name == name))
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

/// Reads a Kubernetes object from JSON text as kube-client reads every
/// response (`serde_json::from_str`), so each type's deserializer is
/// compiled once for the crate. Another entry (axum's `Json` extractor,
/// `from_slice`, `from_value`) compiles the type's whole tree again, a few
/// thousand functions for a pod (docs/design.md, "The house, measured").
pub fn read_object<T: serde::de::DeserializeOwned>(json: &str) -> serde_json::Result<T> {
    serde_json::from_str(json)
}

/// An object from an already parsed document, through [`read_object`]. The
/// error names what is wrong, without a position in the re-rendered text,
/// which is not the user's.
pub fn object_from_value<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> serde_json::Result<T> {
    read_object(&value.to_string()).map_err(|e| {
        let message = e.to_string();
        let at = format!(" at line {} column {}", e.line(), e.column());
        serde::de::Error::custom(message.strip_suffix(&at).unwrap_or(&message))
    })
}
