//! The `DistributedLease` custom resource (owner: operator work).

pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    Ok(String::new())
}
