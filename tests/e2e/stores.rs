//! Stores the candidate pods reach on this machine's address, and the
//! DistributedLease of manifests/examples/lease.yaml pointed at them.

use leasehold::testing::servers::PostgresServer;
use serde_json::{Value, json};

use crate::cluster::{Scenario, yaml_objects, repo};

/// The Secret key holding the store URL, as the README's PostgreSQL example names it.
pub const URL_SECRET: &str = "leases-db";

/// A private PostgreSQL the pods reach, and the example lease on it with
/// its Secret.
pub fn postgres_lease(scenario: &Scenario, name: &str, spec: Value) -> (PostgresServer, Vec<Value>) {
    let server = PostgresServer::start_on(scenario.env.host_ip);
    let url = server.url_at((scenario.env.host_ip, server.port).into());
    let store = json!({"postgres": {"urlSecretRef": {"name": URL_SECRET, "key": "url"}}});
    let objects = vec![secret(scenario, &url), lease(scenario, name, store, spec)];
    (server, objects)
}

pub fn secret(scenario: &Scenario, url: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": URL_SECRET, "namespace": scenario.ns},
        "stringData": {"url": url},
    })
}

/// manifests/examples/lease.yaml with this store, named `name`, and `spec`
/// merged over its spec (e.g. timing or publishing).
pub fn lease(scenario: &Scenario, name: &str, store: Value, spec: Value) -> Value {
    let text = std::fs::read_to_string(repo().join("manifests/examples/lease.yaml")).expect("lease.yaml");
    let mut lease = yaml_objects(&text).remove(0);
    lease["metadata"]["name"] = json!(name);
    lease["metadata"]["namespace"] = json!(scenario.ns);
    lease["spec"]["store"] = store;
    if let (Some(target), Some(extra)) = (lease["spec"].as_object_mut(), spec.as_object()) {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    lease
}
