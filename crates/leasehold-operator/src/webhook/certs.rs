//! The webhook's certificate: self-signed and shared through a Secret, or
//! issued elsewhere and read from disk; the caBundle patch.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::{Error, Result};
use json_patch::Patch;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, Patch as KubePatch, PatchParams};
use kube::core::DynamicObject;
use leasehold_kubernetes::api::contract::NAME_LABEL;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use serde_json::json;
use tracing::{info, warn};

#[derive(Debug, Clone)]
pub(crate) struct CertificateBundle {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertificateBundle {
    /// A fresh self-signed CA and a certificate it signs for `service.namespace.svc`.
    pub(crate) fn self_signed(service: &str, namespace: &str) -> Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "leasehold webhook CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params.self_signed(&ca_key)?;
        let names = vec![
            service.to_string(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(CertificateBundle {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn from_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| data.get(key).and_then(|b| String::from_utf8(b.0.clone()).ok());
        Some(CertificateBundle {
            ca_pem: text("ca.crt")?,
            cert_pem: text("tls.crt")?,
            key_pem: text("tls.key")?,
        })
    }

    /// The certificate chain and key as rustls serves them.
    pub(crate) fn certified_key(&self) -> Result<Arc<CertifiedKey>> {
        certified_key(self.cert_pem.as_bytes(), self.key_pem.as_bytes())
    }
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            what: "certificate",
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| Error::Pem { what: "key", source })?;
    // Checks that the key belongs to the certificate: a rotation read between
    // the two files' updates must not pair a new certificate with an old key.
    let key = CertifiedKey::from_der(certs, key, &rustls::crypto::ring::default_provider())?;
    Ok(Arc::new(key))
}

/// The server's TLS settings around a certificate source.
pub(super) fn server_config(certificates: Arc<dyn ResolvesServerCert>) -> Result<rustls::ServerConfig> {
    // Name the provider rather than rely on a process-wide default.
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// One certificate for the server's lifetime (the self-signed one).
pub(crate) fn fixed(bundle: &CertificateBundle) -> Result<Arc<dyn ResolvesServerCert>> {
    Ok(Arc::new(rustls::sign::SingleCertAndKey::from(bundle.certified_key()?)))
}

/// `tls.crt` and `tls.key` in a folder (a Secret cert-manager renews),
/// re-read on the first handshake after either file changes, so a rotated
/// certificate is served without a restart. The kubelet updates a mounted
/// Secret by swapping a symlink to a new folder, so the files' identity
/// (inode and mtime, following the link) changes with every update.
#[derive(Debug)]
pub(crate) struct CertDir {
    dir: PathBuf,
    current: Mutex<(FileStamps, Arc<CertifiedKey>)>,
}

type FileStamps = [(u64, Option<SystemTime>); 2];

impl CertDir {
    const FILES: [&str; 2] = ["tls.crt", "tls.key"];

    /// Reads the certificate now; a folder without a usable one is an error.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let stamps = Self::stamps(dir)?;
        let key = Self::load(dir)?;
        Ok(CertDir {
            dir: dir.to_path_buf(),
            current: Mutex::new((stamps, key)),
        })
    }

    fn stamps(dir: &Path) -> Result<FileStamps> {
        use std::os::unix::fs::MetadataExt;
        let stamp = |file: &str| {
            let path = dir.join(file);
            std::fs::metadata(&path)
                .map(|m| (m.ino(), m.modified().ok()))
                .map_err(|source| Error::Read {
                    path: path.display().to_string(),
                    source,
                })
        };
        Ok([stamp(Self::FILES[0])?, stamp(Self::FILES[1])?])
    }

    fn load(dir: &Path) -> Result<Arc<CertifiedKey>> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| Error::Read {
                path: path.display().to_string(),
                source,
            })
        };
        certified_key(&read(Self::FILES[0])?, &read(Self::FILES[1])?)
    }

    /// The certificate to serve: re-read when the files changed; on a
    /// failed read (a rotation half done) the previous one, tried again next time.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match Self::stamps(&self.dir) {
            Ok(stamps) if stamps != current.0 => match Self::load(&self.dir) {
                Ok(key) => {
                    info!(dir = %self.dir.display(), "reloaded the webhook certificate");
                    *current = (stamps, key);
                }
                Err(e) => {
                    warn!(error = %leasehold_kubernetes::api::errors::chain(&e), "the webhook certificate changed but cannot be read; serving the previous one")
                }
            },
            Ok(_) => {}
            Err(e) => {
                warn!(error = %leasehold_kubernetes::api::errors::chain(&e), "cannot check the webhook certificate; serving the previous one")
            }
        }
        current.1.clone()
    }
}

impl ResolvesServerCert for CertDir {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The self-signed bundle every operator replica serves: the first replica
/// to start creates it in a Secret, the others read it (a replica that loses
/// the creation race reads the winner's), so all present one CA.
pub(crate) async fn shared_self_signed(
    client: kube::Client,
    namespace: &str,
    secret: &str,
    service: &str,
) -> Result<CertificateBundle> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let wrap = |source| Error::Secret {
        name: format!("{namespace}/{secret}"),
        source,
    };
    if let Some(existing) = api.get_opt(secret).await.map_err(wrap)? {
        return CertificateBundle::from_secret(&existing)
            .ok_or_else(|| Error::IncompleteSecret(format!("{namespace}/{secret}")));
    }
    let bundle = CertificateBundle::self_signed(service, namespace)?;
    let created = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(secret.into()),
            namespace: Some(namespace.into()),
            labels: Some([(NAME_LABEL.0.into(), NAME_LABEL.1.into())].into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        string_data: Some(
            [
                ("ca.crt".into(), bundle.ca_pem.clone()),
                ("tls.crt".into(), bundle.cert_pem.clone()),
                ("tls.key".into(), bundle.key_pem.clone()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match api
        .create(
            &PostParams {
                field_manager: Some(crate::reconcile::FIELD_MANAGER.into()),
                ..Default::default()
            },
            &created,
        )
        .await
    {
        Ok(_) => {
            info!(secret = %format!("{namespace}/{secret}"), "created the webhook certificate");
            Ok(bundle)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let winner = api.get(secret).await.map_err(wrap)?;
            CertificateBundle::from_secret(&winner)
                .ok_or_else(|| Error::IncompleteSecret(format!("{namespace}/{secret}")))
        }
        Err(e) => Err(wrap(e)),
    }
}

/// Gives every webhook of the configuration our CA bundle: a GET, then a
/// JSON patch whose `test` ops make it fail if the list changed in between.
pub(crate) async fn patch_ca_bundle(client: kube::Client, name: &str, ca_pem: &str) -> Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let wrap = |source| Error::Configuration {
        name: name.to_string(),
        source,
    };
    let current = api.get(name).await.map_err(wrap)?;
    let webhooks = current.webhooks.unwrap_or_default();
    if webhooks.is_empty() {
        return Err(Error::NoWebhooks(name.to_string()));
    }
    let bundle = base64_encode(ca_pem.as_bytes());
    let ops: Vec<serde_json::Value> = webhooks
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            [
                json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": w.name}),
                json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}),
            ]
        })
        .collect();
    let patch: Patch = serde_json::from_value(json!(ops)).expect("well-formed JSON patch");
    api.patch(name, &PatchParams::default(), &KubePatch::<DynamicObject>::Json(patch))
        .await
        .map_err(wrap)?;
    info!(
        configuration = name,
        webhooks = webhooks.len(),
        "patched the webhook CA bundle"
    );
    Ok(())
}

/// Standard base64 (with padding), the form `caBundle` and a JSON patch's
/// bytes take.
pub(super) fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
