//! Creating an instance and a database on the Cloud Spanner emulator, for
//! `leasehold demo --store spanner` and the tests (`testing::Emulator`);
//! production databases are made by their owners.

use std::time::Duration;

use google_cloud_gax::error::rpc::Code;
use google_cloud_lro::Poller;

use super::{DEFAULT_CALL_TIMEOUT, Endpoints, client};
use crate::lease::StoreError;
use crate::lease::store::Result;

/// Creates (when missing) an instance and a database on the Cloud Spanner
/// emulator, for the demo and the tests; production databases are made by
/// their owners. Returns the database path.
pub async fn create_emulator_database(
    endpoints: &Endpoints,
    project: &str,
    instance: &str,
    database: &str,
) -> Result<String> {
    const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
    tokio::time::timeout(
        ADMIN_TIMEOUT,
        create_on_emulator(endpoints, project, instance, database),
    )
    .await
    .map_err(|_| {
        StoreError::unavailable(format!(
            "no answer from the Spanner emulator's admin API within {ADMIN_TIMEOUT:?}"
        ))
    })?
}

async fn create_on_emulator(endpoints: &Endpoints, project: &str, instance: &str, database: &str) -> Result<String> {
    let spanner = client(endpoints, DEFAULT_CALL_TIMEOUT).await?;
    let mut instances = spanner.instance_admin_builder();
    let mut databases = spanner.database_admin_builder();
    if let Some(endpoint) = &endpoints.admin {
        instances = instances.with_endpoint(endpoint.clone());
        databases = databases.with_endpoint(endpoint.clone());
    }
    let instances = instances
        .build()
        .await
        .map_err(|e| StoreError::unavailable("emulator instance admin").caused_by(e))?;
    let instance_path = format!("projects/{project}/instances/{instance}");
    let created = instances
        .create_instance()
        .set_parent(format!("projects/{project}"))
        .set_instance_id(instance)
        .set_instance(
            google_cloud_spanner_admin_instance_v1::model::Instance::new()
                .set_name(instance_path.clone())
                .set_config(format!("projects/{project}/instanceConfigs/emulator-config"))
                .set_display_name(instance)
                .set_node_count(1),
        )
        .poller()
        .until_done()
        .await;
    created_or_there(created, || format!("creating emulator instance {instance_path}"))?;
    let databases = databases
        .build()
        .await
        .map_err(|e| StoreError::unavailable("emulator database admin").caused_by(e))?;
    let created = databases
        .create_database()
        .set_parent(instance_path.clone())
        .set_create_statement(format!("CREATE DATABASE `{database}`"))
        .poller()
        .until_done()
        .await;
    created_or_there(created, || format!("creating emulator database {database}"))?;
    Ok(format!("{instance_path}/databases/{database}"))
}

/// A create that succeeded or found the thing already there.
fn created_or_there<T>(
    created: std::result::Result<T, google_cloud_spanner::Error>,
    what: impl FnOnce() -> String,
) -> Result<()> {
    match created {
        Err(e)
            if !e.to_string().contains("already exists") && e.status().map(|s| s.code) != Some(Code::AlreadyExists) =>
        {
            Err(StoreError::unavailable(what()).caused_by(e))
        }
        _ => Ok(()),
    }
}
