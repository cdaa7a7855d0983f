//! Stores the candidate pods reach on this machine's address, and the
//! DistributedLease of manifests/examples/lease.yaml pointed at them.

use leasehold::store::spanner::SpannerConfig;
use leasehold::testing::Emulator;
use leasehold::testing::servers::PostgresServer;
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, install_chart_with, repo, yaml_objects};

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

/// A Cloud Spanner emulator the pods reach, as a development cluster runs
/// one: the operator gets its address through the chart (`helm upgrade
/// --set operator.env.SPANNER_EMULATOR_HOST=...`), each candidate's sidecar
/// through the pod annotation `leasehold.dev/sidecar-env`.
pub struct SpannerForPods {
    pub emulator: Emulator,
    /// The database the lease names (its table is the default one).
    pub config: SpannerConfig,
    /// The DistributedLease's `spec.store`.
    pub store: Value,
}

impl SpannerForPods {
    /// The emulator and a database, and the chart installed with the
    /// operator pointed at it.
    pub async fn start(s: &Scenario) -> SpannerForPods {
        let spanner = Self::start_without_chart(s).await;
        install_chart_with(&s.env, &s.client, &spanner.chart_values()).await;
        spanner
    }

    /// The emulator and a database; the caller installs the chart with
    /// [`SpannerForPods::chart_values`] among its own values.
    pub async fn start_without_chart(s: &Scenario) -> SpannerForPods {
        let emulator = Emulator::start_on(s.env.host_ip).unwrap_or_else(|e| panic!("{e}"));
        let config = emulator.create_database("leasehold_leases").await;
        SpannerForPods {
            store: json!({"spanner": {"database": config.database}}),
            config,
            emulator,
        }
    }

    /// The chart values that point the operator at the emulator.
    pub fn chart_values(&self) -> Vec<String> {
        self.env().map(|(k, v)| format!("operator.env.{k}={v}")).collect()
    }

    /// The emulator's address as a process's environment names it.
    pub fn env(&self) -> impl Iterator<Item = (&'static str, String)> {
        [
            ("SPANNER_EMULATOR_HOST", self.emulator.host.clone()),
            ("SPANNER_EMULATOR_REST", self.emulator.rest.clone()),
        ]
        .into_iter()
    }

    /// The candidates' pod annotations that point their sidecars at it.
    pub fn pod_annotations(&self) -> Value {
        let lines: Vec<String> = self.env().map(|(k, v)| format!("{k}={v}")).collect();
        json!({"leasehold.dev/sidecar-env": lines.join("\n")})
    }

    /// Back to the suite's install (the operator without the emulator).
    pub async fn stop(self, s: &Scenario) {
        install_chart_with(&s.env, &s.client, &[]).await;
    }
}
