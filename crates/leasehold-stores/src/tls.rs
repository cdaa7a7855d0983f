//! TLS for the PostgreSQL and Redis stores, on rustls with the ring provider
//! (the one provider the tree links). The server's certificate is always
//! checked, chain and host name: against the CA certificates of the PEM file
//! the URL names with `sslrootcert=`, or else the system's roots (which
//! honour `SSL_CERT_FILE` and `SSL_CERT_DIR`). A lease store reached through
//! an unchecked certificate could be anyone, and could hand out leases.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::{Result, StoreError, StoreUrl};

/// The URL query parameter naming the CA file (libpq's name; the Redis store
/// takes it too).
pub const CA_FILE_PARAM: &str = "sslrootcert";

/// A store URL split into what the driver reads and the parameters leasehold
/// reads itself, which the drivers would refuse.
#[derive(Debug)]
pub struct UrlParams {
    /// The URL without the taken parameters.
    pub url: String,
    /// The taken parameters' values, in the order asked for.
    pub taken: Vec<Option<String>>,
}

/// Takes the query parameters `names` out of `url` (a `scheme://` URL; other
/// forms are passed through untouched).
pub fn take_params(url: &StoreUrl, names: &[&str]) -> Result<UrlParams> {
    let untouched = || UrlParams {
        url: url.expose().to_string(),
        taken: vec![None; names.len()],
    };
    if !url.expose().contains("://") {
        return Ok(untouched());
    }
    let mut parsed = url::Url::parse(url.expose())
        .map_err(|e| StoreError::invalid(format!("store URL {url:?} is not a URL")).caused_by(e))?;
    if parsed.query().is_none() {
        return Ok(untouched());
    }
    let mut taken = vec![None; names.len()];
    let mut kept = Vec::new();
    for (key, value) in parsed.query_pairs() {
        match names.iter().position(|name| *name == key) {
            Some(i) => taken[i] = Some(value.into_owned()),
            None => kept.push((key.into_owned(), value.into_owned())),
        }
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok(UrlParams {
        url: parsed.into(),
        taken,
    })
}

/// Where the server's certificate is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub enum Roots {
    /// The system's CA certificates.
    System,
    /// The CA certificates of this PEM file.
    File(PathBuf),
}

impl Roots {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fn from_param(ca_file: Option<String>) -> Roots {
        ca_file.map_or(Roots::System, |path| Roots::File(path.into()))
    }
}

/// The certificates of a PEM file; a file without any is refused.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let shown = path.display();
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| {
            StoreError::invalid(format!("{CA_FILE_PARAM} {shown}: cannot read CA certificates")).caused_by(e)
        })?;
    if certificates.is_empty() {
        return Err(StoreError::invalid(format!(
            "{CA_FILE_PARAM} {shown}: no PEM certificate in the file"
        )));
    }
    Ok(certificates)
}

/// A client configuration that checks the server's certificate against `roots`.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub fn client_config(roots: &Roots) -> Result<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            for certificate in ca_certificates(path)? {
                store.add(certificate).map_err(|e| {
                    StoreError::invalid(format!("{CA_FILE_PARAM} {}: not a CA certificate", path.display()))
                        .caused_by(e)
                })?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _unusable) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let context = format!(
                    "no system CA certificates found (install ca-certificates, set SSL_CERT_FILE, \
                     or name a CA file with {CA_FILE_PARAM}= in the store URL)"
                );
                return Err(match found.errors.into_iter().next() {
                    Some(error) => StoreError::invalid(context).caused_by(error),
                    None => StoreError::invalid(context),
                });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::invalid("TLS protocol versions").caused_by(e))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_parameters_leave_the_rest_of_the_url() {
        let url = StoreUrl::new("postgres://app:pw@db/x?sslmode=verify-full&application_name=a&sslrootcert=%2Fca.pem");
        let split = take_params(&url, &["sslmode", CA_FILE_PARAM]).unwrap();
        assert_eq!(split.url, "postgres://app:pw@db/x?application_name=a");
        assert_eq!(split.taken, [Some("verify-full".into()), Some("/ca.pem".into())]);
        let split = take_params(&StoreUrl::new("redis://h:1/0?sslrootcert=/c"), &[CA_FILE_PARAM]).unwrap();
        assert_eq!(split.url, "redis://h:1/0");
        let plain = "host=db sslmode=require";
        let split = take_params(&StoreUrl::new(plain), &["sslmode"]).unwrap();
        assert_eq!((split.url.as_str(), split.taken), (plain, vec![None]));
    }

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = std::env::temp_dir().join(format!("leasehold-tls-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config(&Roots::File(empty.clone())).unwrap_err().to_string();
        assert!(err.contains("no PEM certificate") && err.contains("empty.pem"), "{err}");
        let err = client_config(&Roots::File(dir.join("missing.pem")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot read CA certificates") && err.contains("missing.pem"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
